"""What every entry point shares, Beam-free so that the trainer needs no Beam.

``main`` runs a job's ``run(argv)`` and is its one choke point: whatever
ends the run reaches the user as one ``error: …`` line and a documented
exit status, never a traceback (``--verbose`` shows them). A job raises
``JobError`` for a fault of the whole job (a bad flag, a missing model, an
input it cannot list); a full or read-only disk, SIGTERM, SIGINT and SIGHUP
are recognised whatever a runner made of them; anything else is a failure
of its own status, 1. Every process the run starts ends with it, however it
ends (``lifetime``).
"""
import atexit
import contextlib
import errno
import functools
import logging
import os
import re
import signal
import sys
import threading
import traceback
from typing import Callable, Iterator, List, Optional

from cli import lifetime

# Exit statuses a scheduler can act on.
EXIT_FAILED = 1  # an unexpected failure; --verbose shows its traceback
EXIT_JOB_ERROR = 2
# The output was published, but part of the input could not be read.
EXIT_INCOMPLETE_INPUT = 3
# More records were rejected than --max_rejected_fraction allows: nothing
# was published, the dead letters were kept.
EXIT_TOO_MANY_REJECTED = 4
# The model failed on whole batches: nothing was published.
EXIT_MODEL_FAILED = 5
# A cluster runner showed no progress for --stall_seconds (a lost worker, a
# stopped master): the job was cancelled and nothing was published.
EXIT_NO_PROGRESS = 6
# The trainer published a version that its gate did not bless: jobs naming
# the model folder go on serving the newest blessed version.
EXIT_NOT_BLESSED = 7
# Stopped by a signal: 128 + its number.
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM
# A closed terminal or a dropped ssh session.
EXIT_HUNG_UP = 128 + signal.SIGHUP
# What stops a run: a scheduler's SIGTERM, Ctrl-C, a closed terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Standard output's reader went away.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
VERBOSE_FLAG = '--verbose'


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


def causes(error: BaseException) -> Iterator[BaseException]:
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
  for cause in causes(error):
    if isinstance(cause, OSError) and cause.errno in _DISK_ERRNOS:
      return str(cause)
    match = _ERRNO_TEXT.search(str(cause))
    if match and int(match.group(1)) in _DISK_ERRNOS:
      return match.group(0)
  return None


class Stopped(BaseException):
  """Raised in the main thread by SIGTERM, SIGINT or SIGHUP: a BaseException, so
  that no ``except Exception`` on the way swallows it, and the job unwinds
  (its staged output discarded) like any failure."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


# The signal that stopped this process, once one did: whatever a runner
# makes of the exception, the run ends with its status.
_STOPPED_BY = []
# Where main's error line goes: standard error, or, once a stop silenced
# it, a copy of it.
_ERROR_STREAM = []


def check_not_stopped() -> None:
  """Raises Stopped where a signal stopped this process, though a library
  on the way swallowed the exception it raised (one landing in Python code
  that C code called comes back as a SystemError, which an ``except
  Exception`` takes): called before anything is published, so that a
  stopped run never publishes."""
  if _STOPPED_BY:
    raise Stopped(_STOPPED_BY[0])


def _silence_stderr() -> None:
  """Sends what this process writes to standard error from now on nowhere,
  and keeps a copy of it for main's one line. The stop exception lands
  wherever the main thread is, also in Python code that a library's C
  code called, which may print the traceback it gets back itself (TF's
  does); what any library prints while it unwinds is no news to the
  operator."""
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  os.close(devnull)
  _ERROR_STREAM.append(os.fdopen(saved, 'w', encoding=sys.stderr.encoding,
                                 errors='backslashreplace'))


# How long a stopped run may take to unwind (cancel its job, remove its
# staging folder) before it exits regardless: a library that waits without
# a bound (FnApiRunner joining an SDK worker process still starting) would
# keep it for ever. Its watchdog stops what it leaves running.
STOP_SECONDS = 60


def _stop(signum, frame, silence: bool):
  del frame
  if not _STOPPED_BY:
    _STOPPED_BY.append(signum)
    # First, before anything that may block (a write to a standard error
    # whose reader stopped reading).
    deadline = threading.Timer(STOP_SECONDS, _exit_unwound_or_not,
                               args=(not silence,))
    deadline.daemon = True
    deadline.start()
    lifetime.end_children()
    if silence:
      _silence_stderr()
    raise Stopped(signum)


def _exit_unwound_or_not(verbose: bool) -> None:
  """Ends a stopped run that is still unwinding, with its status and, where
  standard error takes it now, its error line: the main thread may hold
  the locks of a write that blocks. What the run staged is removed
  (``at_forced_exit``)."""
  status, message = _outcome(Stopped(_STOPPED_BY[0]))
  for cleanup in list(_FORCED_EXIT_CLEANUPS):
    try:
      cleanup()
    except Exception:  # pylint: disable=broad-except
      pass
  if _LAST_WORDS.acquire(timeout=1):
    if not _SAID:
      _SAID.append(message)
      fd = _ERROR_STREAM[0].fileno() if _ERROR_STREAM else 2
      try:
        os.set_blocking(fd, False)
        os.write(fd, f'error: {message}\n'.encode('utf-8', 'replace'))
      except OSError:
        pass
  lifetime.exiting()
  os._exit(status)  # pylint: disable=protected-access


# What a stopped run that is exited regardless must still undo.
_FORCED_EXIT_CLEANUPS: List[Callable[[], None]] = []


@contextlib.contextmanager
def at_forced_exit(cleanup: Callable[[], None]) -> Iterator[None]:
  """Runs ``cleanup`` if a stopped run is exited regardless while the block
  runs (``STOP_SECONDS``): removing the run's staging folder."""
  _FORCED_EXIT_CLEANUPS.append(cleanup)
  try:
    yield
  finally:
    _FORCED_EXIT_CLEANUPS.remove(cleanup)


# Libraries that log every stage at INFO, and a traceback with each error.
_LIBRARIES = ('apache_beam', 'tensorflow', 'absl', 'tensorflow_transform',
              # The job servers a runner starts, whose every log line Beam
              # passes on under a logger of the server's class name.
              'FlinkJarJobServer', 'SparkJarJobServer', 'PrismJobServer')


class _WithoutTracebacks(logging.Filter):
  """Keeps the libraries' error lines, drops their tracebacks: ``main``
  says what ended the run in one line."""

  def filter(self, record):
    if record.name.split('.')[0] in _LIBRARIES:
      record.exc_info = record.exc_text = record.stack_info = None
    return True


def _thread_failure_logger(verbose: bool):
  """A ``threading.excepthook`` that logs a thread's uncaught exception as
  one record, its traceback only with --verbose. Python's own hook prints
  the traceback a line at a time, and a runner's threads fail by the
  dozen as a failed job is torn down: their lines cut into the error line
  that follows."""
  def log(args):
    if args.exc_type is SystemExit:
      return
    name = args.thread.name if args.thread else 'a thread'
    first_line = (str(args.exc_value).strip().splitlines() or [''])[0]
    logging.getLogger(__name__).warning(
        '%s ended by %s: %s', name, args.exc_type.__name__, first_line,
        exc_info=((args.exc_type, args.exc_value, args.exc_traceback)
                  if verbose else None))
  return log


def _configure_logging(verbose: bool) -> None:
  logging.basicConfig(
      level=logging.DEBUG if verbose else logging.INFO,
      format='%(asctime)s %(levelname)s %(message)s')
  threading.excepthook = _thread_failure_logger(verbose)
  if verbose:
    return
  # Keep the job's own lines readable.
  for library in _LIBRARIES:
    logging.getLogger(library).setLevel(logging.WARNING)
  for handler in logging.getLogger().handlers:
    handler.addFilter(_WithoutTracebacks())


# What TensorFlow wraps an op's message in, for its own debugging: the
# function that ran it and the op's name. An error line quotes the message.
_TF_DECORATION = re.compile(
    r'\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\](?: name: *[^\s)]*)?')


def _outcome(error: BaseException):
  """(exit status, the error line's message) of what ended a run."""
  status, message = _status_and_message(error)
  return status, _TF_DECORATION.sub('', message)


def _status_and_message(error: BaseException):
  """``_outcome``, with the message as it was raised."""
  if _STOPPED_BY or isinstance(error, Stopped):
    signum = _STOPPED_BY[0] if _STOPPED_BY else error.signum
    return 128 + signum, (f'stopped by {signal.Signals(signum).name}; '
                          'nothing was published')
  if isinstance(error, JobError):
    # One line, also where the message quotes a library's lines.
    return error.exit_status, ' '.join(
        line.strip() for line in str(error).splitlines() if line.strip())
  fault = _disk_fault(error)
  if fault is not None:
    return EXIT_JOB_ERROR, f'cannot write: {fault}'
  first_line = (str(error).strip().splitlines() or [''])[0]
  return EXIT_FAILED, (f'{type(error).__name__}: {first_line} (run with '
                       f'{VERBOSE_FLAG} for the traceback)')


def _exit_at_once(status: int) -> None:
  """Ends a stopped run, which has unwound already, without the
  interpreter's exit: that joins every thread, and one the stop left
  waiting (on a lock, on a queue) would keep the process forever. The
  exit handlers still run: a runner stops the job server it started there
  (Flink's and Spark's are JVMs that would outlive the launcher)."""
  sys.stdout.flush()
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  os._exit(status)  # pylint: disable=protected-access


def _drop_stdout() -> None:
  """Points standard output at /dev/null, so that the interpreter's last
  flush of what is still buffered for a closed pipe raises nothing."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stdout.fileno())
  os.close(devnull)


def _is_fd2(stream) -> bool:
  """Whether ``stream`` writes to this process's standard error file (not
  to a test's capture of it)."""
  try:
    return stream.fileno() == 2
  except (AttributeError, OSError, ValueError):
    return False


# Held while the run's last words are written, once.
_LAST_WORDS = threading.Lock()
_SAID = []


def _say_last(line: str, verbose: bool) -> None:
  """Writes ``line`` to standard error in one write, where no log record is
  half written, as the run's last words (once): without --verbose, what
  libraries print while the process unwinds after it (a runner's threads,
  its job server's shutdown) goes nowhere."""
  handlers = logging.getLogger().handlers
  with _LAST_WORDS:
    if _SAID:
      return
    _SAID.append(line)
    _write_last(line, verbose, handlers)


def _write_last(line: str, verbose: bool, handlers) -> None:
  for handler in handlers:
    handler.acquire()
  try:
    if not verbose and not _ERROR_STREAM and _is_fd2(sys.stderr):
      _silence_stderr()
    stream = _ERROR_STREAM[0] if _ERROR_STREAM else sys.stderr
    stream.write(line + '\n')
    stream.flush()
  finally:
    for handler in handlers:
      handler.release()


def main(run: Callable[[Optional[List[str]]], object]) -> None:
  """Runs a job's ``run(argv)`` as a command-line program."""
  argv = sys.argv[1:]
  verbose = VERBOSE_FLAG in argv
  _SAID.clear()
  _configure_logging(verbose)
  # Schedulers stop a job with SIGTERM first, a closed terminal with
  # SIGHUP; Python would die on them, or on SIGINT in a runner's thread,
  # without unwinding.
  stop = functools.partial(_stop, silence=not verbose)
  for signum in STOP_SIGNALS:
    # One the process was started ignoring (nohup) stays ignored.
    if signal.getsignal(signum) is not signal.SIG_IGN:
      signal.signal(signum, stop)
  lifetime.start()
  try:
    run(argv)
  except SystemExit:
    raise  # the flags' own one-line errors
  except BrokenPipeError:
    # Whoever read standard output stopped (`| head -1`): end quietly, with
    # the status of a Unix tool that SIGPIPE ended.
    _drop_stdout()
    sys.exit(EXIT_BROKEN_PIPE)
  except BaseException as error:  # pylint: disable=broad-except
    status, message = _outcome(error)
    if verbose:
      traceback.print_exc()
    _say_last(f'error: {message}', verbose)
    if _STOPPED_BY:
      _exit_at_once(status)
    sys.exit(status)
