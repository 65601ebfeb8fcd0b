"""A Spark standalone cluster on 127.0.0.1: a Master and a Worker, two JVMs
started by the ``spark-class`` script of PyPI's pyspark (whose jars/ are a
Spark distribution's)."""
import contextlib
import os
import pathlib
import subprocess
from typing import Dict, Iterator, List, NamedTuple

from clusters import artifacts
from clusters import processes
from clusters import workers


class Cluster(NamedTuple):
  master_url: str
  ui_url: str
  # The jobs' flags that submit to it, SDK workers in its worker pool.
  runner_flags: List[str]
  worker_pool: workers.Pool
  # Its JVMs (through spark-class, which execs them) by role: master,
  # worker.
  processes: Dict[str, subprocess.Popen]


@contextlib.contextmanager
def standalone_cluster(run_dir: pathlib.Path, cores: int = 2,
                       memory: str = '4g') -> Iterator[Cluster]:
  """A Master, a Worker of ``cores`` cores and a worker pool, all stopped on
  the way out; logs in ``run_dir``."""
  processes.java()  # the one spark-class runs
  home = artifacts.home('spark')
  master_port, master_ui, worker_ui = (processes.free_port()
                                       for _ in range(3))
  env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP='127.0.0.1',
             SPARK_LOG_DIR=str(run_dir), SPARK_WORKER_DIR=str(run_dir / 'work'),
             SPARK_LOCAL_DIRS=str(run_dir / 'tmp'), SPARK_NO_DAEMONIZE='1')
  master_url = f'spark://127.0.0.1:{master_port}'
  ui_url = f'http://127.0.0.1:{master_ui}'
  spark_class = home / 'bin' / 'spark-class'
  spark_class.chmod(0o755)
  with contextlib.ExitStack() as stack:
    started, roles = [], {}
    for name, command in (
        ('master', ['org.apache.spark.deploy.master.Master', '--host',
                    '127.0.0.1', '--port', master_port, '--webui-port',
                    master_ui]),
        ('worker', ['org.apache.spark.deploy.worker.Worker', master_url,
                    '--host', '127.0.0.1', '--cores', cores, '--memory',
                    memory, '--webui-port', worker_ui])):
      log = run_dir / f'{name}.log'
      started.append((stack.enter_context(processes.started(
          ['bash', spark_class, *command], log, env=env)), log))
      roles[name] = started[-1][0]
      if name == 'master':
        processes.wait_until(lambda: processes.listens(master_port), started,
                             'the Spark master')
    processes.wait_until(
        lambda: processes.get_json(f'{ui_url}/json/')['aliveworkers'] == 1,
        started, 'the Spark worker')
    pool = stack.enter_context(workers.worker_pool(run_dir))
    yield Cluster(master_url, ui_url, [
        '--runner=SparkRunner', f'--spark_master_url={master_url}',
        f'--spark_job_server_jar={artifacts.job_server_jar("spark")}',
        *pool.flags], pool, roles)


def applications(ui_url: str) -> dict:
  """The master's active and completed applications, each with its state."""
  status = processes.get_json(f'{ui_url}/json/')
  return {'active': status['activeapps'], 'completed': status['completedapps']}
