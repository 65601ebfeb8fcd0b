"""A Flink session cluster on 127.0.0.1: a JobManager and a TaskManager, two
JVMs started as Flink's own scripts start them, from the distribution PyPI's
apache-flink-libraries ships (which has the jars, not the scripts)."""
import contextlib
import json
import pathlib
import re
import subprocess
import zipfile
from typing import Dict, Iterator, List, NamedTuple

from clusters import artifacts
from clusters import processes
from clusters import workers

FLINK_VERSION = '1.19'
# Memory for a 2-core, 24 GB machine. Beam's batch jobs (a TFT pipeline has
# dozens of shuffles) give Flink many blocking result partitions at once,
# each of which asks for 512 network buffers by default: fewer a partition,
# and more network memory than a small TaskManager's default share.
# Beam's gRPC channels to the SDK workers buffer in direct memory, outside
# what Flink manages: a 50,000-review preprocessing job ran the default
# task off-heap (none) out of it. And Beam's elements are whole batches of
# TFT's records on the heap: the IMDB reviews in their folders ran a 1 GB
# task heap out, so the TaskManager has 6 GB, little of it managed memory
# (Beam's batch jobs use little).
MEMORY = {
    'jobmanager.memory.process.size': '1600m',
    'taskmanager.memory.process.size': '6144m',
    'taskmanager.memory.task.off-heap.size': '768m',
    'taskmanager.memory.framework.off-heap.size': '256m',
    'taskmanager.memory.network.min': '512m',
    'taskmanager.memory.network.max': '512m',
    'taskmanager.network.sort-shuffle.min-buffers': '64',
    'taskmanager.memory.managed.fraction': '0.1',
}
# How long the JobManager waits on a TaskManager's answer to one call
# (deploying a task, offering a slot). A task of Beam's carries its whole
# stage (a TFT stage's graph too), which the TaskManager reads on the
# thread that answers; with its SDK workers and another job's JVMs on the
# same 2 cores it answered past Flink's default 10 s, and the job failed
# with an AskTimeoutException though nothing was wrong. Flink's docs give
# this remedy for slow machines; a TaskManager that is really gone is still
# found by its missed heartbeats (heartbeat.timeout, 50 s), and a run with
# no progress ends at the jobs' --stall_seconds.
RPC = {'pekko.ask.timeout': '60 s'}
_JOBMANAGER = 'org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint'
_TASKMANAGER = 'org.apache.flink.runtime.taskexecutor.TaskManagerRunner'
_LOG4J = """rootLogger.level = INFO
rootLogger.appenderRef.file.ref = File
appender.file.name = File
appender.file.type = File
appender.file.fileName = ${sys:log.file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{HH:mm:ss,SSS} %-5p %c - %m%n
"""


class Cluster(NamedTuple):
  rest_url: str
  # The jobs' flags that submit to it, SDK workers in its worker pool.
  runner_flags: List[str]
  worker_pool: workers.Pool
  # Its JVMs by role: jobmanager, taskmanager.
  processes: Dict[str, subprocess.Popen]


def _java_options(dist_jar: pathlib.Path) -> str:
  """The --add-opens Flink needs on Java 17, from the defaults its
  distribution jar holds."""
  with zipfile.ZipFile(dist_jar) as dist:
    defaults = dist.read('config.yaml').decode()
  return re.search(r'^\s+all: (.*)$', defaults, re.MULTILINE).group(1)


def _configuration(run_dir: pathlib.Path, ports: Dict[str, int],
                   slots: int) -> Dict[str, str]:
  return {
      'jobmanager.rpc.address': '127.0.0.1',
      'jobmanager.bind-host': '127.0.0.1',
      'jobmanager.rpc.port': ports['rpc'],
      'taskmanager.host': '127.0.0.1',
      'taskmanager.bind-host': '127.0.0.1',
      'taskmanager.rpc.port': ports['taskmanager'],
      'taskmanager.data.port': ports['data'],
      'taskmanager.numberOfTaskSlots': slots,
      'blob.server.port': ports['blob'],
      'rest.address': '127.0.0.1',
      'rest.bind-address': '127.0.0.1',
      'rest.port': ports['rest'],
      'parallelism.default': slots,
      'io.tmp.dirs': run_dir / 'tmp',
      'web.tmpdir': run_dir / 'tmp' / 'web',
      **MEMORY,
      **RPC,
  }


def _memory_flags(classpath: str, home: pathlib.Path, conf: pathlib.Path,
                  process: str) -> List[List[str]]:
  """What Flink's scripts ask BashJavaUtils for: the JVM's heap flags and
  the memory settings they were derived from."""
  output = processes.run_java(
      ['-cp', f'{home / "bin" / "bash-java-utils.jar"}:{classpath}',
       'org.apache.flink.runtime.util.bash.BashJavaUtils',
       f'GET_{process}_RESOURCE_PARAMS', '--configDir', conf])
  lines = [line.split(':', 1)[1] for line in output.splitlines()
           if line.startswith('BASH_JAVA_UTILS_EXEC_RESULT:')]
  return [lines[0].split(), lines[1].split()]


@contextlib.contextmanager
def session_cluster(run_dir: pathlib.Path, slots: int = 2) -> Iterator[Cluster]:
  """A JobManager, a TaskManager of ``slots`` slots and a worker pool, all
  stopped on the way out; logs in ``run_dir``."""
  java = processes.java()
  home = artifacts.home('flink')
  jars = sorted((home / 'lib').glob('*.jar'))
  (dist_jar,) = [jar for jar in jars if jar.name.startswith('flink-dist')]
  # Flink's scripts put flink-dist last.
  classpath = ':'.join(str(jar) for jar in jars if jar != dist_jar)
  classpath += f':{dist_jar}'
  conf = run_dir / 'conf'
  conf.mkdir(parents=True, exist_ok=True)
  ports = {name: processes.free_port()
           for name in ('rpc', 'taskmanager', 'data', 'blob', 'rest')}
  # Each value a JSON string, which YAML reads as written: a folder's name
  # may hold ' #', YAML's comment.
  (conf / 'config.yaml').write_text(''.join(
      f'{key}: {json.dumps(str(value))}\n'
      for key, value in _configuration(run_dir, ports, slots).items()))
  (conf / 'log4j.properties').write_text(_LOG4J)
  java_options = _java_options(dist_jar).split()
  rest_url = f'http://127.0.0.1:{ports["rest"]}'
  started, roles = [], {}
  with contextlib.ExitStack() as stack:
    for name, main, process in (('jobmanager', _JOBMANAGER, 'JM'),
                                ('taskmanager', _TASKMANAGER, 'TM')):
      jvm, settings = _memory_flags(classpath, home, conf, process)
      log = run_dir / f'{name}.log'
      started.append((stack.enter_context(processes.started(
          [java, *jvm, *java_options, f'-Dlog.file={log}',
           '-Dlog4j.configurationFile='
           f'{(conf / "log4j.properties").as_uri()}',
           '-classpath', classpath, main, '--configDir', conf, *settings],
          run_dir / f'{name}.out')), log))
      roles[name] = started[-1][0]
    processes.wait_until(
        lambda: processes.get_json(f'{rest_url}/overview')[
            'slots-available'] == slots, started, 'the Flink cluster')
    pool = stack.enter_context(workers.worker_pool(run_dir))
    yield Cluster(rest_url, [
        '--runner=FlinkRunner', f'--flink_master=127.0.0.1:{ports["rest"]}',
        f'--flink_version={FLINK_VERSION}',
        f'--flink_job_server_jar={artifacts.job_server_jar("flink")}',
        f'--parallelism={slots}', *pool.flags], pool, roles)


def local_flags() -> List[str]:
  """The laptop path: Flink's embedded mini-cluster inside the job server,
  SDK workers in the launcher's own process."""
  return ['--runner=FlinkRunner', '--flink_master=[local]',
          f'--flink_version={FLINK_VERSION}',
          f'--flink_job_server_jar={artifacts.job_server_jar("flink")}',
          '--environment_type=LOOPBACK']


def jobs(rest_url: str) -> List[Dict]:
  """The cluster's jobs: each with its jid, name and state."""
  return processes.get_json(f'{rest_url}/jobs/overview')['jobs']

