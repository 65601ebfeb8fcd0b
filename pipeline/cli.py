"""What every entry point shares, Beam-free so that the trainer needs no Beam.

A job's ``run(argv)`` raises ``JobError`` for a fault of the whole job (a
bad flag, a missing model, an input it cannot list): ``main`` prints it as
one ``error:`` line and exits with the error's status, so a scheduler sees a
clear reason and never a traceback for a fault the user can fix.
"""
import logging
import signal
import sys
from typing import Callable, List, Optional

# Exit statuses a scheduler can act on.
EXIT_JOB_ERROR = 2
# The output was published, but part of the input could not be read.
EXIT_INCOMPLETE_INPUT = 3
# SIGTERM's conventional status (128 + 15).
EXIT_TERMINATED = 143


class JobError(Exception):
  """A job-level fault: reported as one line, exit status ``exit_status``."""
  exit_status = EXIT_JOB_ERROR


class IncompleteInput(JobError):
  """Some input files were corrupt: what was readable is published, and the
  exit status tells a scheduler that the corpus was incomplete."""
  exit_status = EXIT_INCOMPLETE_INPUT


def _terminate(signum, frame):
  del signum, frame
  # Unwinds the job like any failure, so that staged output is discarded.
  raise SystemExit(EXIT_TERMINATED)


def main(run: Callable[[Optional[List[str]]], object]) -> None:
  """Runs a job's ``run(argv)`` as a command-line program."""
  logging.basicConfig(
      level=logging.INFO, format='%(asctime)s %(levelname)s %(message)s')
  # Beam and TF log every stage at INFO; keep the job's own lines readable.
  for noisy in ('apache_beam', 'tensorflow', 'absl', 'tensorflow_transform'):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  # Schedulers stop a job with SIGTERM first; Python would die on it without
  # unwinding.
  signal.signal(signal.SIGTERM, _terminate)
  try:
    run(sys.argv[1:])
  except JobError as error:
    print(f'error: {error}', file=sys.stderr)
    sys.exit(error.exit_status)
