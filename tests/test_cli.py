"""cli.main: faults of a job or of its machine reach the user as one line."""
import errno

from apache_beam.io.filesystem import BeamIOError
import pytest

import cli
from tests.conftest import main_in_process


def disk_full():
  return OSError(errno.ENOSPC, 'No space left on device', '/out/part-0')


def raised_while_handling(cause):
  """What Beam re-raises for a worker's error: a RuntimeError naming the
  step, raised while handling the original."""
  wrapper = RuntimeError(f'OSError: {cause} [while running \'Write\']')
  wrapper.__context__ = cause
  return wrapper


def run_main(monkeypatch, capsys, error):
  def run(argv):
    del argv
    raise error
  return main_in_process(monkeypatch, capsys, run)


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


def test_other_os_errors_keep_their_traceback(monkeypatch, capsys):
  with pytest.raises(FileNotFoundError):
    run_main(monkeypatch, capsys,
             FileNotFoundError(errno.ENOENT, 'No such file'))
