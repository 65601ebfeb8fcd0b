"""Staged outputs: publishing replaces a folder whole, even without the swap."""
import os

import pytest

from pipeline import outputs


def tree(folder):
  """Every file under ``folder`` with its content, by relative path."""
  found = {}
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      with open(path, encoding='utf-8') as handle:
        found[os.path.relpath(path, folder)] = handle.read()
  return found


def publish(final_dir, files):
  """Stages ``files`` for ``final_dir`` and publishes them."""
  with outputs.StagedOutput(str(final_dir)) as output:
    for name, content in files.items():
      path = os.path.join(output.staging_dir, name)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w', encoding='utf-8') as handle:
        handle.write(content)
    output.publish()


@pytest.fixture
def no_exchange(monkeypatch):
  """A file system without the atomic swap of folders; returns the calls the
  publishing made to it, to show the fallback was taken."""
  calls = []

  def cannot_swap(first, second):
    calls.append((first, second))
    return False
  monkeypatch.setattr(outputs, '_exchange', cannot_swap)
  return calls


@pytest.mark.usefixtures('no_exchange')
def test_first_publish_without_the_swap_moves_the_staging_into_place(
    tmp_path):
  final = tmp_path / 'scores' / 'dt=1'
  new = {'part-0.parquet': 'new rows', 'rejected/rejected-0.jsonl': '{}'}
  publish(final, new)
  assert tree(final) == new
  assert os.listdir(tmp_path / 'scores') == ['dt=1']


def test_publish_without_the_swap_replaces_the_output_whole(tmp_path,
                                                            no_exchange):
  final = tmp_path / 'scores' / 'dt=1'
  publish(final, {'part-0.parquet': 'old rows', 'part-1.parquet': 'old rows',
                  'rejected/rejected-0.jsonl': 'old',
                  outputs.SUCCESS_MARKER: ''})
  new = {'part-0.parquet': 'new rows', outputs.SUCCESS_MARKER: ''}
  publish(final, new)
  assert len(no_exchange) == 1
  # The old output's files are gone, not merged with the new ones.
  assert tree(final) == new
  # The staging root is removed once empty: neither the staging folder nor
  # the old output moved aside for the renames is left in it.
  assert os.listdir(tmp_path / 'scores') == ['dt=1']


def test_leaving_without_publishing_removes_the_staging(tmp_path):
  final = tmp_path / 'scores' / 'dt=1'
  with pytest.raises(RuntimeError):
    with outputs.StagedOutput(str(final)) as output:
      (tmp_path / 'scores').joinpath(
          os.path.relpath(output.staging_dir, tmp_path / 'scores'),
          'part-0.parquet').write_text('half')
      raise RuntimeError('the pipeline failed')
  assert not final.exists()
  assert os.listdir(tmp_path / 'scores') == []
