"""The fault matrix: each Beam job stopped by SIGTERM, SIGINT or SIGKILL at
several moments, or meeting a full or read-only disk. Whatever happens,
the exit status says so, the earlier output stays byte for byte, and
nothing half-written is where a reader looks."""
import errno
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

import cli
import outputs
from pipeline import filesystems
from pipeline import preprocess
from pipeline import score
from tests.conftest import REPO
from tests.conftest import main_in_process
from tests.conftest import synthetic_reviews
from tests.conftest import write_jsonl
from tests.conftest import tree


def job_args(job, folder, corpus, model_dir):
  if job == 'score':
    return [f'--input={corpus}', f'--model_dir={model_dir}',
            f'--output_dir={folder / "out"}', '--partition=dt=1']
  return [f'--input={corpus}', f'--output_dir={folder / "out"}',
          '--split_field=split', '--max_len=24']


@pytest.fixture(scope='module', params=['score', 'preprocess'])
def published_once(request, trained, tmp_path_factory):
  """(job, a large corpus, the output folder of a first run): that run
  published from a small corpus; the large one keeps a rerun's pipeline
  busy for seconds. Made once per job: each test reruns on a copy."""
  job, model_dir = request.param, trained[0]
  folder = tmp_path_factory.mktemp(f'earlier-{job}')
  small = write_jsonl(folder / 'small.jsonl', synthetic_reviews(60, 0) +
                      synthetic_reviews(20, 1))
  large = write_jsonl(folder / 'large.jsonl',
                      synthetic_reviews(15000, 0) + synthetic_reviews(3000, 1))
  module = score if job == 'score' else preprocess
  module.run(job_args(job, folder, small, model_dir))
  return job, large, folder / 'out'


@pytest.fixture
def earlier(published_once, trained, tmp_path):
  """(job, its args over the large corpus, the output folder's files): the
  first run's output, copied into this test's folder."""
  job, large, output = published_once
  shutil.copytree(output, tmp_path / 'out')
  return job, job_args(job, tmp_path, large, trained[0]), tree(tmp_path / 'out')


def staging_holds_a_folder(output):
  """Whether a run's staging folder holds a folder: the sinks' temporary
  folders are the first thing the running pipeline writes there."""
  root = pathlib.Path(outputs.staging_root(str(output)))
  runs = [run for run in root.iterdir() if run.is_dir()] if root.is_dir() \
      else []
  return any(entry.is_dir() for run in runs for entry in run.iterdir())


def started(process):
  return process.poll() is None


MOMENTS = {
    # The process runs: the launcher imports, checks, reads its sample.
    'starting': lambda process, output: True,
    # The pipeline writes into the staging folder.
    'writing': lambda process, output: staging_holds_a_folder(output),
}


@pytest.mark.parametrize('signum, moment', [
    (signal.SIGTERM, 'starting'), (signal.SIGTERM, 'writing'),
    (signal.SIGINT, 'writing'), (signal.SIGKILL, 'writing')],
                         ids=['term-starting', 'term-writing', 'int-writing',
                              'kill-writing'])
def test_a_stopped_run_leaves_the_earlier_output_as_it_was(
    earlier, tmp_path, signum, moment):
  job, args, before = earlier
  output = tmp_path / 'out'
  process = subprocess.Popen(
      [sys.executable, '-m', f'pipeline.{job}', *args], cwd=REPO,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 300
  while not MOMENTS[moment](process, output):
    assert process.poll() is None, process.stderr.read()
    assert time.monotonic() < deadline, f'never reached {moment}'
    time.sleep(0.02)
  process.send_signal(signum)
  stderr = process.communicate(timeout=120)[1]
  if signum == signal.SIGKILL:
    assert process.returncode == -signal.SIGKILL
  elif moment == 'starting' and process.returncode == -signum:
    pass  # still importing, before cli.main took the signal over
  else:
    assert process.returncode == 128 + signum, stderr
    errors = [line for line in stderr.splitlines()
              if line.startswith('error:')]
    assert errors == [f'error: stopped by {signal.Signals(signum).name}; '
                      'nothing was published']
    assert 'Traceback' not in stderr
    # Unwound: its staging folder is gone (a killed run's waits in the
    # hidden staging root for the next run to sweep it).
    assert not staging_holds_a_folder(output)
  assert tree(output) == before


@pytest.mark.parametrize('error', [
    OSError(errno.ENOSPC, 'No space left on device'),
    OSError(errno.EROFS, 'Read-only file system')], ids=['full', 'read-only'])
def test_a_disk_that_refuses_writes_is_one_line_and_changes_nothing(
    earlier, tmp_path, monkeypatch, capsys, error):
  job, args, before = earlier
  # The output's own writes fail; the pipeline's temporary files are where
  # a full disk is met first.
  real_create = filesystems.FileSystems.create

  def create(path, *rest, **kwargs):
    if '.out.staging' in path and 'beam-temp' in path:
      raise error
    return real_create(path, *rest, **kwargs)
  monkeypatch.setattr(filesystems.FileSystems, 'create', create)
  module = score if job == 'score' else preprocess
  status, stderr = main_in_process(monkeypatch, capsys, module.run, *args)
  assert status == cli.EXIT_JOB_ERROR
  errors = [line for line in stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and error.strerror in errors[0]
  assert 'Traceback' not in stderr
  assert tree(tmp_path / 'out') == before
  assert not staging_holds_a_folder(tmp_path / 'out')
