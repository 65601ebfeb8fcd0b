"""What every entry point shares, Beam-free so that the trainer needs no Beam.

A job's ``run(argv)`` raises ``JobError`` for a fault of the whole job (a
bad flag, a missing model, an input it cannot list): ``main`` prints it as
one ``error:`` line and exits with the error's status, so a scheduler sees a
clear reason and never a traceback for a fault the user can fix. A full or
read-only disk is reported the same way.
"""
import errno
import logging
import re
import signal
import sys
from typing import Callable, Iterator, List, Optional

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


# A full disk, an exhausted quota, a read-only file system: faults of the
# machine that the user fixes, not of the code.
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
# How an OSError reads once a runner passed it on as text from another
# process.
_ERRNO_TEXT = re.compile(r'\[Errno (\d+)\][^\n]*')


def _causes(error: BaseException) -> Iterator[BaseException]:
  """``error`` and every exception behind it: Beam re-raises a worker's
  error as another one raised while handling it, and a BeamIOError keeps an
  error per file in ``exception_details``."""
  pending, seen = [error], set()
  while pending:
    current = pending.pop()
    if current is None or id(current) in seen:
      continue
    seen.add(id(current))
    yield current
    details = getattr(current, 'exception_details', None)
    if isinstance(details, dict):
      pending.extend(value for value in details.values()
                     if isinstance(value, BaseException))
    pending.extend((current.__cause__, current.__context__))


def _disk_fault(error: BaseException) -> Optional[str]:
  """What a full or read-only disk behind ``error`` said; None if none is."""
  for cause in _causes(error):
    if isinstance(cause, OSError) and cause.errno in _DISK_ERRNOS:
      return str(cause)
    match = _ERRNO_TEXT.search(str(cause))
    if match and int(match.group(1)) in _DISK_ERRNOS:
      return match.group(0)
  return None


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
  except Exception as error:  # pylint: disable=broad-except
    fault = _disk_fault(error)
    if fault is None:
      raise
    print(f'error: cannot write: {fault}', file=sys.stderr)
    sys.exit(EXIT_JOB_ERROR)
