"""A corrupt input file: the readable rest is published, the exit status
says the corpus was incomplete."""
import gzip
import json

import pytest

import cli
from pipeline import preprocess
from pipeline import readers
from pipeline.readers import matching
from pipeline.readers import ranges
from pipeline.readers import sources
from schemas import raw
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


@pytest.mark.parametrize('fmt, splittable, suffix', [
    ('jsonl', True, '.jsonl'), ('csv', False, '.csv'),
    ('jsonl', False, '.jsonl.gz')])
def test_a_file_that_shrinks_once_matched_is_a_corrupt_file(
    tmp_path, fmt, splittable, suffix):
  """Matched, planned into ranges, then cut short before it is read (a log
  rotated, a file rewritten in place): what it lost is one corrupt_file
  letter, not records that vanish with a clean run."""
  rows = reviews(2000, 'r')
  if fmt == 'csv':
    data = 'id,label,text\n' + ''.join(
        f'{row["id"]},{row["label"]},{row["text"]}\n' for row in rows)
  else:
    data = ''.join(json.dumps(row) + '\n' for row in rows)
  path = tmp_path / f'shrinking{suffix}'
  if suffix.endswith('.gz'):
    # Two gzip members (gzip -c a b): cut after the first, the stream left
    # whole, so that only the size can tell.
    first = gzip.compress(data[:len(data) // 3].encode())
    path.write_bytes(first + gzip.compress(data[len(data) // 3:].encode()))
    cut = len(first)
  else:
    path.write_bytes(data.encode())
    cut = len(data) // 3
  (entry,) = matching.entries(str(path))
  parts = list(ranges.split(entry, splittable, 'auto', 10_000))
  assert len(parts) > 3 if splittable else len(parts) == 1
  path.write_bytes(path.read_bytes()[:cut])
  source_from_file = sources.source_factory(
      fmt, readers.ReadConfig(format=fmt, id_field=None))
  read = [record for part in parts
          for record in ranges.read(part, source_from_file)]
  corrupt = [record for record in read
             if record.get(raw.REASON) == rejected.CORRUPT_FILE]
  assert corrupt and all('shrank while it was read' in letter[raw.SNIPPET]
                         for letter in corrupt), corrupt
  good = [record for record in read if not record.get(raw.REASON)]
  assert 0 < len(good) < len(rows)
  assert len(read) == len(good) + len(corrupt)
