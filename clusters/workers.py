"""Beam's Python SDK workers beside a cluster: an EXTERNAL worker pool.

A cluster runs Python steps in SDK worker processes that it asks a worker
pool for; the pool beside each TaskManager (Flink) or Worker (Spark) is what
a cluster operator runs on machines that have the package installed, and
what Beam's Kubernetes deployments run as a sidecar. (PROCESS would need
Beam's Go boot binary on every machine, DOCKER an SDK container registry.)
"""
import contextlib
import os
import pathlib
import sys
from typing import Iterator, List, NamedTuple

from clusters import processes


class Pool(NamedTuple):
  # The pipeline options that send work to the pool.
  flags: List[str]
  # The pool's process; the SDK workers are its children.
  pid: int


@contextlib.contextmanager
def worker_pool(logs: pathlib.Path,
                python: str = sys.executable) -> Iterator[Pool]:
  """A pool on 127.0.0.1 that starts SDK workers with ``python``'s
  environment."""
  port = processes.free_port()
  # The pool starts each worker as a bare `python` from its PATH.
  bin_dir = os.path.dirname(python)
  env = dict(os.environ, PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}')
  env.pop('PYTHONPATH', None)
  log = logs / 'worker-pool.log'
  with processes.started(
      [python, '-m', 'apache_beam.runners.worker.worker_pool_main',
       f'--service_port={port}'], log, env=env) as pool:
    processes.wait_until(lambda: processes.listens(port), [(pool, log)],
                         'the SDK worker pool')
    # A cluster runner asks the pool for a worker a stage unless it may keep
    # one between stages: the job's many stages would each wait for one.
    yield Pool(['--environment_type=EXTERNAL',
                f'--environment_config=localhost:{port}',
                '--environment_cache_millis=60000'], pool.pid)
