"""What a pattern matches: every regular file once, by its literal path;
anything else matched (a link, a FIFO, a folder, an unreadable file) is a
dead letter."""
import errno
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
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
from tests.conftest import letters
from tests.conftest import main_in_process
from tests.conftest import read
from tests.conftest import write_jsonl


def test_files_with_glob_characters_in_their_names_are_read_once(tmp_path):
  names = ['part[1].jsonl', 'part1.jsonl', 'plain.jsonl', 'a*b?.jsonl',
           '[!x] sp ace é.jsonl', 'q?.jsonl', 'qq.jsonl']
  for name in names:
    write_jsonl(tmp_path / name, [{'id': name, 'text': 'x'}])
  assert sorted(r[raw.ID] for r in read(tmp_path / '*.jsonl')) == sorted(
      names)
  for folder in ('st*r', 'star'):
    (tmp_path / folder).mkdir()
    write_jsonl(tmp_path / folder / 'a.jsonl', [{'id': folder, 'text': 'x'}])
  assert [r[raw.ID] for r in read(f'{tmp_path}/st*r/')] == ['st*r', 'star']
  # A pattern names files as globs do: [[] is a literal [.
  assert [r[raw.ID] for r in read(tmp_path / 'part[[]1].jsonl')] == [
      'part[1].jsonl']


def test_double_star_is_zero_or_more_folders(tmp_path):
  data = tmp_path / 'data'
  for relative in ('x.jsonl', 'a/y.jsonl', 'a/b/z.jsonl', 'a/b/c/w.jsonl'):
    (data / relative).parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(data / relative, [{'id': relative, 'text': 'x'}])
  (data / 'a' / 'notes.txt').write_text('not matched')
  assert [r[raw.ID] for r in read(f'{data}/**/*.jsonl')] == [
      'a/b/c/w.jsonl', 'a/b/z.jsonl', 'a/y.jsonl', 'x.jsonl']
  assert [r[raw.ID] for r in read(f'{data}/a/**/b/*.jsonl')] == [
      'a/b/z.jsonl']
  matched = readers.resolve_input(f'{data}/**/x.jsonl', 'auto')
  assert (matched.pattern, matched.format) == (f'{data}/**/x.jsonl', 'jsonl')
  # Elsewhere ** is any characters, / included, as in Beam; ? and [...]
  # never cross a /.
  assert readers.matched_files(f'{data}/a**.jsonl') == [
      f'{data}/a/b/c/w.jsonl', f'{data}/a/b/z.jsonl', f'{data}/a/y.jsonl']
  assert readers.matched_files(f'{data}/a?y.jsonl') == []
  assert readers.matched_files(f'{data}/a[!x]y.jsonl') == []


def test_links_fifos_and_folders_matched_are_unreadable_file_letters(
    tmp_path):
  write_jsonl(tmp_path / 'good.jsonl', [{'id': 'good', 'text': 'x'}])
  os.symlink(tmp_path / 'nowhere', tmp_path / 'dangling.jsonl')
  os.mkfifo(tmp_path / 'pipe.jsonl')
  (tmp_path / 'folder.jsonl').mkdir()
  os.symlink(tmp_path / 'folder.jsonl', tmp_path / 'linked.jsonl')
  os.symlink(tmp_path / 'good.jsonl', tmp_path / 'alias.jsonl')
  records = read(tmp_path / '*.jsonl')
  assert letters(records) == [
      (str(tmp_path / name), rejected.UNREADABLE_FILE)
      for name in ('dangling.jsonl', 'folder.jsonl', 'linked.jsonl',
                   'pipe.jsonl')]
  snippets = {os.path.basename(r[raw.SOURCE]): r[raw.SNIPPET]
              for r in records if r.get(raw.REASON)}
  assert 'dangling symbolic link' in snippets['dangling.jsonl']
  assert 'FIFO' in snippets['pipe.jsonl']
  assert 'a folder' in snippets['folder.jsonl']
  assert 'link to a folder' in snippets['linked.jsonl']
  # A link to a file is read as the file.
  assert [r[raw.ID] for r in records if not r.get(raw.REASON)] == [
      'good', 'good']
  # A folder given as the input means every file below it: its folders
  # are no letters.
  (tmp_path / 'folder.jsonl' / 'doc.txt').write_text('a document')
  assert [r[raw.TEXT] for r in read(tmp_path / 'folder.jsonl')] == [
      'a document']


@pytest.fixture()
def make_unreadable(monkeypatch):
  """Makes a file unreadable: mode 000 and, for root, whom no mode stops,
  Beam's local open of it failing as it would for anyone else."""
  blocked = set()
  real_open = io.open

  def checked_open(file, mode='r', *args, **kwargs):
    if 'r' in mode and os.fspath(file) in blocked:
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), file)
    return real_open(file, mode, *args, **kwargs)

  if os.geteuid() == 0:
    monkeypatch.setattr(io, 'open', checked_open)

  def make(path):
    os.chmod(path, 0)
    blocked.add(str(path))
  return make


def test_an_unreadable_file_is_one_unreadable_file_letter(
    tmp_path, make_unreadable):
  rows = [{'id': f'r{i}', 'text': f'row {i}'} for i in range(200)]
  write_jsonl(tmp_path / 'a_good.jsonl', rows[:3])
  locked = write_jsonl(tmp_path / 'b_locked.jsonl', rows)
  pq.write_table(pa.table({'text': ['x'] * 50}), tmp_path / 'c.parquet',
                 row_group_size=5)
  (tmp_path / 'docs' / 'pos').mkdir(parents=True)
  (tmp_path / 'docs' / 'pos' / 'locked.txt').write_text('a document')
  for path in (locked, tmp_path / 'c.parquet',
               tmp_path / 'docs' / 'pos' / 'locked.txt'):
    make_unreadable(path)
  records = read(tmp_path / '*.jsonl')
  assert [r[raw.ID] for r in records if not r.get(raw.REASON)] == [
      'r0', 'r1', 'r2']
  assert letters(records) == [(str(locked), rejected.UNREADABLE_FILE)]
  assert 'Permission denied' in [r for r in records if r.get(raw.REASON)][0][
      raw.SNIPPET]
  assert letters(read(tmp_path / 'docs')) == [
      (str(tmp_path / 'docs' / 'pos' / 'locked.txt'),
       rejected.UNREADABLE_FILE)]
  # However split, the file is one letter: the range at byte 0 reports it.
  for path, fmt in ((locked, 'jsonl'), (tmp_path / 'c.parquet', 'parquet')):
    entry = matching.entries(str(path))[0]
    parts = list(ranges.split(entry, True, 'auto', 100))
    assert len(parts) > 3
    read_parts = [record for part in parts for record in ranges.read(
        part, sources.source_factory(fmt, readers.ReadConfig(format=fmt)))]
    assert letters(read_parts) == [(str(path), rejected.UNREADABLE_FILE)]


def labelled(prefix, count):
  return [{'id': f'{prefix}{i}', 'label': 'pos' if i % 2 else 'neg',
           'text': f'{"great fun" if i % 2 else "dull waste"} number {i}'}
          for i in range(count)]


def test_preprocess_reads_each_matched_file_once_and_reports_the_rest(
    tmp_path, make_unreadable, monkeypatch, capsys):
  data = tmp_path / 'data'
  for relative in ('part[1].jsonl', 'plain.jsonl', 'st*r/a.jsonl',
                   'star/a.jsonl', 'sub/deep/x.jsonl'):
    (data / relative).parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(data / relative, labelled(relative, 60))
  write_jsonl(data / 'nulls.jsonl', [{**row, 'id': None}
                                     for row in labelled('n', 4)])
  stats = preprocess.run([f'--input={data}/**/*.jsonl',
                          f'--output_dir={tmp_path}/out'])
  counts = stats['records']
  assert (counts['read'], sum(counts['written'].values()), counts['rejected'],
          counts['ids_replaced']) == (304, 304, 0, 4)
  # An unreadable file and a dangling link: published, exit status 3.
  make_unreadable(data / 'plain.jsonl')
  os.symlink(data / 'gone.jsonl', data / 'sub' / 'dangling.jsonl')
  status, stderr = main_in_process(
      monkeypatch, capsys, preprocess.run, f'--input={data}/**/*.jsonl',
      f'--output_dir={tmp_path}/out')
  assert status == cli.EXIT_INCOMPLETE_INPUT
  assert '2 unreadable_file' in stderr.strip().splitlines()[-1]
  stats = json.loads((tmp_path / 'out' / 'stats.json').read_text())
  assert stats['records']['read'] == 246
  assert sorted(letter['source'] for letter in dead_letters(
      tmp_path / 'out')) == [str(data / 'plain.jsonl'),
                             str(data / 'sub' / 'dangling.jsonl')]
