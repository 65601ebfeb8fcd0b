"""python -m clusters fetch {flink,spark,prism,all}
python -m clusters {flink,spark} [--run_dir=DIR]

``fetch`` gets and caches what a runner needs; ``flink`` and ``spark`` run a
cluster on 127.0.0.1 until Ctrl-C (or SIGTERM, or SIGHUP: a closed
terminal), after printing the flags that send either job to it. Killed
outright, its watchdog stops the cluster's processes (``cli.lifetime``)."""
import argparse
import pathlib
import shlex
import signal
import sys
import tempfile
import threading

import cli
from cli import lifetime
from clusters import artifacts
from clusters import flink
from clusters import processes
from clusters import spark

CLUSTERS = {
    'flink': lambda run_dir: flink.session_cluster(run_dir),
    'spark': lambda run_dir: spark.standalone_cluster(run_dir),
}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m clusters', description=__doc__.split('\n\n')[1])
  commands = parser.add_subparsers(dest='command', required=True)
  fetch = commands.add_parser('fetch', help='Fetch and cache the jars and '
                              'binaries of a runner.')
  fetch.add_argument('what', choices=('flink', 'spark', 'prism', 'all'))
  for name in CLUSTERS:
    cluster = commands.add_parser(name, help=f'Run a {name} cluster on '
                                  '127.0.0.1 until stopped.')
    cluster.add_argument('--run_dir', type=pathlib.Path, default=None,
                         help='Folder for its configuration and logs '
                         '(default: a temporary one).')
  args = parser.parse_args(argv)
  for signum in cli.STOP_SIGNALS:
    # One the process was started ignoring (nohup) stays ignored.
    if signal.getsignal(signum) is not signal.SIG_IGN:
      signal.signal(signum, _stop)
  try:
    if args.command == 'fetch':
      artifacts.fetch(args.what)
      return 0
    run_dir = args.run_dir or pathlib.Path(
        tempfile.mkdtemp(prefix=f'{args.command}-'))
    lifetime.start()
    return _serve(args.command, run_dir)
  except _Stopped as stopped:
    print(f'error: stopped by {signal.Signals(stopped.signum).name} while '
          'starting; nothing is left running', file=sys.stderr)
    return 128 + stopped.signum
  except (artifacts.FetchError, processes.ClusterError, OSError) as error:
    print(f'error: {error}', file=sys.stderr)
    return 2


class _Stopped(BaseException):
  """Raised by SIGTERM, SIGINT or SIGHUP: the cluster unwinds (its
  processes stopped) from wherever it was."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def _stop(signum, frame):
  """Unwinds from the first stop signal; the later ones would cut the
  unwinding short (what it misses, the watchdog stops)."""
  del frame
  for other in cli.STOP_SIGNALS:
    signal.signal(other, signal.SIG_IGN)
  raise _Stopped(signum)


def _serve(command: str, run_dir: pathlib.Path) -> int:
  """Runs the cluster until a stop signal: its normal end, status 0."""
  with CLUSTERS[command](run_dir.resolve()) as running:
    print(f'{command} is up (logs in {run_dir}); run either job with:',
          flush=True)
    print('  ' + shlex.join(running.runner_flags), flush=True)
    try:
      threading.Event().wait()
    except _Stopped:
      pass
  return 0


if __name__ == '__main__':
  sys.exit(main())
