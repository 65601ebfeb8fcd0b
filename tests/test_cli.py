"""cli.main: faults of a job or of its machine reach the user as one line."""
import errno
import signal
import subprocess
import sys

from apache_beam.io.filesystem import BeamIOError
import pytest

import cli
from tests.conftest import REPO
from tests.conftest import main_in_process


def disk_full():
  return OSError(errno.ENOSPC, 'No space left on device', '/out/part-0')


def raised_while_handling(cause):
  """What Beam re-raises for a worker's error: a RuntimeError naming the
  step, raised while handling the original."""
  wrapper = RuntimeError(f'OSError: {cause} [while running \'Write\']')
  wrapper.__context__ = cause
  return wrapper


def run_main(monkeypatch, capsys, error, *argv):
  def run(argv):
    del argv
    raise error
  return main_in_process(monkeypatch, capsys, run, *argv)


@pytest.mark.parametrize('error, message', [
    (disk_full(), 'No space left on device'),
    (OSError(errno.EDQUOT, 'Disk quota exceeded'), 'Disk quota exceeded'),
    (OSError(errno.EROFS, 'Read-only file system'), 'Read-only file system'),
    (BeamIOError('Rename failed', {'/out/a': disk_full()}),
     'No space left on device'),
    (raised_while_handling(disk_full()), 'No space left on device'),
    (RuntimeError('OSError: [Errno 28] No space left on device: \'/out/b\' '
                  '[while running \'Write\']'), 'No space left on device'),
], ids=['enospc', 'edquot', 'erofs', 'beam_io_error', 'beam_reraised',
        'worker_text'])
def test_a_full_or_read_only_disk_is_one_error_line(monkeypatch, capsys,
                                                    error, message):
  status, stderr = run_main(monkeypatch, capsys, error)
  assert status == cli.EXIT_JOB_ERROR
  lines = stderr.strip().splitlines()
  assert len(lines) == 1
  assert lines[0].startswith('error: ') and message in lines[0]


def test_any_other_failure_is_one_line_of_its_own_status(monkeypatch, capsys):
  status, stderr = run_main(monkeypatch, capsys,
                            FileNotFoundError(errno.ENOENT, 'No such file'))
  assert status == cli.EXIT_FAILED
  assert stderr.strip().splitlines() == [
      'error: FileNotFoundError: [Errno 2] No such file (run with --verbose '
      'for the traceback)']


def test_verbose_shows_the_traceback(monkeypatch, capsys):
  status, stderr = run_main(monkeypatch, capsys, KeyError('lost'),
                            '--verbose')
  assert status == cli.EXIT_FAILED
  assert stderr.startswith('Traceback (most recent call last)')
  assert stderr.strip().splitlines()[-1].startswith('error: KeyError:')


@pytest.mark.parametrize('signum, status', [
    (signal.SIGTERM, cli.EXIT_TERMINATED), (signal.SIGINT,
                                            cli.EXIT_INTERRUPTED)])
def test_a_signal_ends_the_run_with_its_status_whatever_wraps_it(
    monkeypatch, capsys, signum, status):
  def run(argv):
    del argv
    try:
      cli._stop(signum, None, silence=False)  # pylint: disable=protected-access
    except cli.Stopped as stopped:
      # What a runner makes of it: another exception, raised while
      # handling the first.
      raise RuntimeError('SystemExit [while running Score]') from stopped
  monkeypatch.setattr(cli, '_STOPPED_BY', [])
  code, stderr = main_in_process(monkeypatch, capsys, run)
  assert code == status
  assert stderr.strip().splitlines() == [
      f'error: stopped by {signal.Signals(signum).name}; nothing was '
      'published']


# A job stopped while a library's C code had called back into Python: the
# library prints the traceback it got back, straight to file descriptor 2,
# as Python code unwinding may print too.
_STOPPED_WHILE_A_LIBRARY_PRINTS = """
import os, signal, sys, time
import cli

def run(argv):
  try:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):  # until the handler raises
      time.sleep(0.01)
    raise AssertionError('SIGTERM never arrived')
  finally:
    os.write(2, b'Traceback (most recent call last): a library unwinding\\n')
    print('Traceback (most recent call last): Python unwinding',
          file=sys.stderr)

cli.main(run)
"""


def run_code(code: str, verbose: bool) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-c', code] + ([cli.VERBOSE_FLAG] if verbose else []),
      cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize('verbose', [False, True], ids=['quiet', 'verbose'])
def test_after_a_stop_only_the_error_line_reaches_stderr(verbose):
  result = run_code(_STOPPED_WHILE_A_LIBRARY_PRINTS, verbose)
  assert result.returncode == cli.EXIT_TERMINATED
  lines = result.stderr.strip().splitlines()
  assert lines[-1] == 'error: stopped by SIGTERM; nothing was published'
  # --verbose shows everything; by default the one line is all there is.
  assert (len(lines) > 1) == verbose


_FAILING_WHILE_THREADS_FAIL = """
import threading
import cli

def fail():
  raise RuntimeError('a runner thread failed')

def run(argv):
  for _ in range(50):
    threading.Thread(target=fail, name='data_plane').start()
  raise ValueError('the job failed')

cli.main(run)
"""


@pytest.mark.parametrize('verbose', [False, True], ids=['quiet', 'verbose'])
def test_threads_failing_beside_a_failing_run_cut_no_error_line(verbose):
  """A runner's threads fail by the dozen as a failed job is torn down:
  each is one log line (its traceback only with --verbose), never lines
  of a traceback cutting into the error line, which comes last."""
  result = run_code(_FAILING_WHILE_THREADS_FAIL, verbose)
  assert result.returncode == cli.EXIT_FAILED
  lines = result.stderr.strip().splitlines()
  error = ('error: ValueError: the job failed (run with --verbose for the '
           'traceback)')
  assert [line for line in lines if 'error: ' in line] == [error]
  # With --verbose the threads failing after it are logged after it.
  assert lines[-1] == error or verbose
  failures = [line for line in lines if 'data_plane ended by RuntimeError: '
              'a runner thread failed' in line]
  assert failures
  assert ('Traceback' in result.stderr) == verbose
