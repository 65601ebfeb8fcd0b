"""python -m clusters fetch {flink,spark,prism,all}
python -m clusters {flink,spark} [--run_dir=DIR]

``fetch`` gets and caches what a runner needs; ``flink`` and ``spark`` run a
cluster on 127.0.0.1 until Ctrl-C (or SIGTERM, or SIGHUP: a closed
terminal), after printing the flags that send either job to it. Killed
outright, its watchdog stops the cluster's processes (``cli.lifetime``)."""
import argparse
import pathlib
import signal
import sys
import tempfile
import threading

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
  try:
    if args.command == 'fetch':
      artifacts.fetch(args.what)
      return 0
    run_dir = args.run_dir or pathlib.Path(
        tempfile.mkdtemp(prefix=f'{args.command}-'))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGHUP):
      signal.signal(signum, lambda *_: stop.set())
    lifetime.start()
    with CLUSTERS[args.command](run_dir.resolve()) as running:
      print(f'{args.command} is up (logs in {run_dir}); run either job with:',
            flush=True)
      print('  ' + ' '.join(running.runner_flags), flush=True)
      try:
        stop.wait()
      except KeyboardInterrupt:
        pass
    return 0
  except (artifacts.FetchError, processes.ClusterError, OSError) as error:
    print(f'error: {error}', file=sys.stderr)
    return 2


if __name__ == '__main__':
  sys.exit(main())
