"""A corrupt input file: the readable rest is published, the exit status
says the corpus was incomplete."""
import gzip
import json

import pytest

import cli
from pipeline import preprocess
from schemas import rejected
from tests.conftest import dead_letters
from tests.conftest import main_in_process
from tests.conftest import write_jsonl


def reviews(count, prefix):
  return [{'id': f'{prefix}{i}', 'label': 'pos' if i % 2 else 'neg',
           'text': f'{"great fun" if i % 2 else "dull waste"} number {i}'}
          for i in range(count)]


@pytest.fixture()
def corpus(tmp_path):
  write_jsonl(tmp_path / 'good.jsonl', reviews(40, 'good'))
  whole = gzip.compress(b''.join(json.dumps(row).encode() + b'\n'
                                 for row in reviews(400, 'cut')))
  (tmp_path / 'cut.jsonl.gz').write_bytes(whole[:len(whole) // 2])
  return tmp_path


def test_a_truncated_file_publishes_the_rest_and_exits_3(corpus, monkeypatch,
                                                         capsys):
  status, stderr = main_in_process(
      monkeypatch, capsys, preprocess.run, f'--input={corpus}/*.jsonl*',
      f'--output_dir={corpus}/out')
  assert status == cli.EXIT_INCOMPLETE_INPUT, stderr
  errors = [line for line in stderr.splitlines()
            if line.startswith('error:')]
  assert len(errors) == 1 and 'could not be read to the end' in errors[0]
  stats = json.loads((corpus / 'out' / 'stats.json').read_text())
  assert stats['rejected_by_reason'][rejected.CORRUPT_FILE] == 1
  letters = [letter for letter in dead_letters(corpus / 'out')
             if letter['reason'] == rejected.CORRUPT_FILE]
  assert [letter['source'] for letter in letters] == [
      str(corpus / 'cut.jsonl.gz')]
  records = stats['records']
  assert records['read'] == sum(records['written'].values()) + records[
      'rejected']
  # Every good row and the rows before the cut are there.
  assert sum(records['written'].values()) > 40


def test_allow_corrupt_files_accepts_an_incomplete_corpus(corpus):
  stats = preprocess.run([f'--input={corpus}/*.jsonl*',
                          f'--output_dir={corpus}/out',
                          '--allow_corrupt_files'])
  assert stats['rejected_by_reason'][rejected.CORRUPT_FILE] == 1
