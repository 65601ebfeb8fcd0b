"""The runners' jars and binaries, once fetched (make test-runners fetches
them first), come from the cache: a second fetch runs no registry client;
what is damaged there is refused on use, naming the file and the command
that mends it, and fetched again by that command."""
import json
import shutil
import os
import subprocess
import sys
import zipfile

import pytest

from clusters import artifacts
from tests.conftest import REPO


def an_artifact(folder):
  """A folder as fetch leaves an artifact: files and their manifest."""
  (folder / 'lib').mkdir(parents=True)
  (folder / 'lib' / 'runner.jar').write_bytes(b'jar bytes ' * 1000)
  (folder / 'bin').mkdir()
  (folder / 'bin' / 'start').write_text('#!/bin/sh\n')
  artifacts._record(folder)  # pylint: disable=protected-access
  return folder


def test_a_whole_artifact_is_used(tmp_path):
  folder = an_artifact(tmp_path / 'flink')
  assert artifacts._whole(folder, 'flink', repair=False)  # pylint: disable=protected-access


def test_a_touched_file_is_hashed_again_and_then_trusted(tmp_path):
  folder = an_artifact(tmp_path / 'flink')
  jar = folder / 'lib' / 'runner.jar'
  os.utime(jar, ns=(1, 1))
  assert artifacts._whole(folder, 'flink', repair=False)  # pylint: disable=protected-access
  manifest = json.loads((folder / artifacts.MANIFEST).read_text())
  assert manifest['lib/runner.jar'][1] == 1


@pytest.mark.parametrize('damage, said', [
    (lambda jar: jar.write_bytes(jar.read_bytes()[:-10]),
     r'runner.jar has 9,990 bytes, not 10,000'),
    (lambda jar: jar.write_bytes(jar.read_bytes().replace(b'jar', b'JAR')),
     r'runner.jar is not the file fetched \(its sha256 differs\)'),
    (lambda jar: jar.unlink(), r'runner.jar is missing'),
], ids=['cut short', 'changed', 'missing'])
def test_a_damaged_artifact_is_refused_on_use_and_fetched_again(
    tmp_path, damage, said):
  folder = an_artifact(tmp_path / 'flink')
  damage(folder / 'lib' / 'runner.jar')
  with pytest.raises(artifacts.FetchError,
                     match=said + r'; run `python -m clusters fetch flink` '
                     'to fetch it again'):
    artifacts._whole(folder, 'flink', repair=False)  # pylint: disable=protected-access
  assert not artifacts._whole(folder, 'flink', repair=True)  # pylint: disable=protected-access
  assert not folder.exists()


def test_a_cut_job_server_jar_is_one_error_line(tmp_path):
  """A job server jar cut short, named to a job: one error line naming it,
  before Beam would start it and say only "Service failed to start"."""
  jar = tmp_path / 'job-server.jar'
  with zipfile.ZipFile(jar, 'w') as written:
    written.writestr('META-INF/MANIFEST.MF', 'Main-Class: x\n' * 1000)
  jar.write_bytes(jar.read_bytes()[:-100])
  result = subprocess.run(
      [sys.executable, '-m', 'pipeline.score', '--input=x.jsonl',
       '--model_dir=m', f'--output_dir={tmp_path / "out"}',
       '--runner=FlinkRunner', '--flink_master=[local]',
       f'--flink_job_server_jar={jar}'], cwd=REPO, capture_output=True,
      text=True, timeout=300, check=False)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].startswith(
      f'error: --flink_job_server_jar={jar}: not a whole jar (')


def test_a_java_that_does_not_run_is_one_error_line(tmp_path):
  jar = tmp_path / 'job-server.jar'
  with zipfile.ZipFile(jar, 'w') as written:
    written.writestr('META-INF/MANIFEST.MF', 'Main-Class: x\n')
  result = subprocess.run(
      [sys.executable, '-m', 'pipeline.score', '--input=x.jsonl',
       '--model_dir=m', f'--output_dir={tmp_path / "out"}',
       '--runner=SparkRunner', f'--spark_job_server_jar={jar}',
       '--job_server_java_launcher=/bin/false'], cwd=REPO,
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      'error: /bin/false, which runs the runner\'s job server, does not run '
      '(exit status 1); install a JDK 17 or name one with '
      '--job_server_java_launcher')


@pytest.mark.runners
def test_a_second_fetch_downloads_nothing(monkeypatch):
  def no_client(command, **kwargs):
    raise AssertionError(f'ran {command}')

  monkeypatch.setattr(artifacts, '_run', no_client)
  artifacts.fetch('all')


@pytest.mark.runners
def test_every_artifact_is_pinned():
  """Each job server's runner jar, each distribution and Prism's module
  have a checksum the fetch verifies."""
  assert set(artifacts.JOB_SERVERS) == set(artifacts.DISTRIBUTIONS) == {
      'flink', 'spark'}
  for package in artifacts.DISTRIBUTIONS.values():
    assert '--hash=sha256:' in artifacts._requirement(package)  # pylint: disable=protected-access
  assert artifacts.apache_beam.__version__ in artifacts.PRISM_MODULE_HASHES


@pytest.mark.parametrize('edit, said', [
    (lambda folder: (folder / artifacts.MANIFEST).write_text('[]'),
     'has no readable manifest'),
    (lambda folder: (folder / artifacts.MANIFEST).write_text('{}'),
     'lists no file'),
    (lambda folder: (folder / 'lib' / 'second.jar').write_bytes(b'x'),
     r'second.jar is no file fetched \(not in the manifest\)'),
], ids=['not a mapping', 'emptied', 'a file more'])
def test_an_edited_artifact_is_refused(tmp_path, edit, said):
  """An edited manifest cannot switch the check off, nor a file put
  beside the ones fetched pass for one of them."""
  folder = an_artifact(tmp_path / 'flink')
  edit(folder)
  with pytest.raises(artifacts.FetchError, match=said):
    artifacts._whole(folder, 'flink', repair=False)  # pylint: disable=protected-access


def test_a_read_only_cache_is_checked_by_hash(tmp_path):
  """A cache whose manifest cannot be written (a read-only disk, an image
  whose copy reset the files' times) is checked by hash and used."""
  if not shutil.which('chattr'):
    pytest.skip('chattr is not installed')
  folder = an_artifact(tmp_path / 'flink')
  os.utime(folder / 'lib' / 'runner.jar', ns=(1, 1))
  manifest = folder / artifacts.MANIFEST
  if subprocess.run(['chattr', '+i', str(manifest)], check=False,
                    capture_output=True).returncode:
    pytest.skip('this file system cannot make a file immutable')
  try:
    assert artifacts._whole(folder, 'flink', repair=False)  # pylint: disable=protected-access
  finally:
    subprocess.run(['chattr', '-i', str(manifest)], check=True)
