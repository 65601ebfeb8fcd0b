"""What the benchmarks share: flags, and timing whole processes."""
import argparse
import os
import platform
import subprocess
import sys
import time


def run_process(command, env=None):
  """Runs a command to completion; returns (wall seconds, peak RSS in MiB).

  The peak is that of the largest process in the tree (Linux wait4 reports
  the maximum over the child and the descendants it waited for).
  """
  started = time.perf_counter()
  process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
  _, status, usage = os.wait4(process.pid, 0)
  wall = time.perf_counter() - started
  stderr = process.stderr.read().decode('utf-8', 'replace')
  process.stderr.close()
  if os.waitstatus_to_exitcode(status) != 0:
    sys.exit(f'{" ".join(command)} failed:\n{stderr[-3000:]}')
  return wall, usage.ru_maxrss / 1024


def machine():
  return (f'{platform.machine()}, {os.cpu_count()} cores, '
          f'{os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30:.0f}'
          f' GiB, Python {platform.python_version()}')


def argument_parser(description: str) -> argparse.ArgumentParser:
  """--cache (the dataset cache) and --work (where corpora and outputs go)."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument('--cache', default=os.environ.get(
      'DATASET_CACHE', os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    '..', '..', 'shared', 'datasets')))
  parser.add_argument('--work', default=None,
                      help='Working folder; a new temporary one by default.')
  return parser
