"""What the benchmarks share: flags, timing whole processes, and the
runners the jobs are timed on."""
import argparse
import contextlib
import importlib
import os
import pathlib
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The checkout's clusters package, which no install holds.
sys.path.append(_REPO)


def run_process(command, env=None):
  """Runs a command to completion; returns (wall seconds, peak RSS in MiB).

  The peak is that of the largest process in the tree (Linux wait4 reports
  the maximum over the child and the descendants it waited for).
  """
  started = time.perf_counter()
  process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
  # Read while it runs: a child whose log outgrows the pipe's buffer would
  # otherwise block on its next write, and wait4 with it.
  chunks = []
  reader = threading.Thread(target=lambda: chunks.extend(
      iter(lambda: process.stderr.read(65536), b'')))
  reader.start()
  _, status, usage = os.wait4(process.pid, 0)
  wall = time.perf_counter() - started
  reader.join()
  stderr = b''.join(chunks).decode('utf-8', 'replace')
  process.stderr.close()
  if os.waitstatus_to_exitcode(status) != 0:
    sys.exit(f'{" ".join(command)} failed:\n{stderr[-3000:]}')
  return wall, usage.ru_maxrss / 1024


def machine():
  return (f'{platform.machine()}, {os.cpu_count()} cores, '
          f'{os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30:.0f}'
          f' GiB, Python {platform.python_version()}')


def split_arrays(data, splits, names):
  """The features ``names`` of every record of ``splits`` of a preprocessing
  output (``trainer.data.PreprocessedData``), in file order, as whole
  arrays: what a benchmark (or a test) that holds a split in memory
  reads."""
  from trainer import data as data_lib  # pylint: disable=import-outside-toplevel
  batches = [[batch[name].numpy() for name in names]
             for batch in data_lib.in_file_order(data, splits, names)]
  return [np.concatenate(parts) for parts in zip(*batches)]


def argument_parser(description: str) -> argparse.ArgumentParser:
  """--cache (the dataset cache) and --work (where corpora and outputs go)."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument('--cache', default=os.environ.get(
      'DATASET_CACHE', os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    '..', '..', 'shared', 'datasets')))
  parser.add_argument('--work', default=None,
                      help='Working folder; a new temporary one by default.')
  return parser


@contextlib.contextmanager
def dask_cluster(workers: int, job_module: str):
  """A scheduler and ``workers`` single-threaded worker processes on
  127.0.0.1, all connected, that have imported ``job_module``; yields the
  runner's flags and a function that returns each worker process's peak
  memory in MiB (the launcher's peak, which run_process measures, leaves
  out the workers: they are no processes of its)."""
  import distributed  # pylint: disable=import-outside-toplevel
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    address = f'127.0.0.1:{probe.getsockname()[1]}'
  commands = [['distributed.cli.dask_scheduler', '--host=127.0.0.1',
               f'--port={address.split(":")[1]}']] + [
                   ['distributed.cli.dask_worker', f'tcp://{address}',
                    '--nworkers=1', '--nthreads=1']] * workers
  processes = [subprocess.Popen(
      [sys.executable, '-m', *command, '--no-dashboard'], cwd=_REPO,
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for command in commands]

  def worker_peaks():
    with distributed.Client(address, timeout=120) as client:
      # A function of the standard library: the workers cannot import this
      # module to unpickle one of its own.
      usages = client.run(resource.getrusage, resource.RUSAGE_SELF)
      return sorted(usage.ru_maxrss / 1024 for usage in usages.values())

  try:
    with distributed.Client(address, timeout=120) as client:
      client.wait_for_workers(workers, timeout=120)
      # A cluster outlives its jobs: its workers, and its scheduler (which
      # unpickles the job's graph), have imported our modules and so
      # TensorFlow before a job comes.
      client.run(importlib.import_module, job_module)
      client.run_on_scheduler(importlib.import_module, job_module)
    yield ['--runner=pipeline.dask_runner.DaskRunner',
           f'--dask_client_address={address}'], worker_peaks
  finally:
    for process in reversed(processes):
      process.terminate()
      process.wait()


def _descendant_peaks(pid: int) -> dict:
  """{process: its peak memory (VmHWM) in MiB} of each process below
  ``pid``."""
  parents = {}
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      with contextlib.suppress(OSError):
        with open(f'/proc/{entry}/stat', encoding='utf-8') as stat:
          parents[int(entry)] = int(stat.read().rsplit(')', 1)[1].split()[1])
  below, frontier = set(), {pid}
  while frontier:
    frontier = {child for child, parent in parents.items()
                if parent in frontier} - below
    below |= frontier
  peaks = {}
  for child in below:
    with contextlib.suppress(OSError):
      with open(f'/proc/{child}/status', encoding='utf-8') as status:
        for line in status:
          if line.startswith('VmHWM:'):
            peaks[child] = int(line.split()[1]) / 1024
  return peaks


@contextlib.contextmanager
def _sampled_peaks(pid: int):
  """Samples the peak memory of the processes below ``pid`` (a worker
  pool's SDK workers, which end with each job) every 0.2 s while the
  context lasts; yields a function that returns each one's peak in MiB."""
  peaks, done = {}, threading.Event()

  def sample():
    while not done.wait(0.2):
      peaks.update(_descendant_peaks(pid))

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  try:
    yield lambda: sorted(peaks.values()) or [0]
  finally:
    done.set()
    sampler.join()


def add_runner_arguments(parser: argparse.ArgumentParser,
                         modes: str) -> None:
  """--modes (the runners a job is timed on, ``modes`` by default) and the
  Dask cluster's --dask_workers and --dask_npartitions."""
  parser.add_argument('--modes', default=modes,
                      help='Comma-separated runners for our job: in_memory, '
                      'multi_processing (DirectRunner), dask, flink (a '
                      'session cluster of a slot per core), spark (a '
                      'standalone cluster of a core per core), prism.')
  parser.add_argument('--dask_workers', type=int, default=os.cpu_count(),
                      help='Single-threaded worker processes of the Dask '
                      'cluster.')
  parser.add_argument('--dask_npartitions', type=int, default=None,
                      help='The Dask runner\'s --dask_npartitions (default: '
                      'its own).')


def runner_flags(args, mode: str, stack: contextlib.ExitStack,
                 job_module: str):
  """The flags that run ``job_module`` in ``mode`` (in_memory,
  multi_processing with a worker per core, or dask), and a function that
  returns the peak memory of worker processes the launcher's own peak
  leaves out (None where every worker is one of the launcher's processes).
  A Dask cluster lives as long as ``stack``."""
  if mode == 'dask':
    flags, worker_peaks = stack.enter_context(dask_cluster(
        args.dask_workers, job_module))
    if args.dask_npartitions:
      flags.append(f'--dask_npartitions={args.dask_npartitions}')
    return flags, worker_peaks
  if mode in ('flink', 'spark'):
    # pylint: disable=import-outside-toplevel
    from clusters import flink
    from clusters import spark
    run_dir = pathlib.Path(stack.enter_context(
        tempfile.TemporaryDirectory(prefix=f'{mode}-')))
    cluster = stack.enter_context(
        flink.session_cluster(run_dir, slots=os.cpu_count())
        if mode == 'flink' else
        spark.standalone_cluster(run_dir, cores=os.cpu_count()))
    return cluster.runner_flags, stack.enter_context(
        _sampled_peaks(cluster.worker_pool.pid))
  if mode == 'prism':
    from clusters import artifacts  # pylint: disable=import-outside-toplevel
    artifacts.prism_binary()
    return ['--runner=PrismRunner'], None
  workers = os.cpu_count() if mode == 'multi_processing' else 1
  return [f'--direct_running_mode={mode}',
          f'--direct_num_workers={workers}'], None
