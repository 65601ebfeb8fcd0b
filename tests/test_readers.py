"""The reading layer: every format, ids, labels, splits, bad rows,
splitting."""
import argparse
import gzip
import json
import os

from apache_beam.io import source_test_utils
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from pipeline import readers
from pipeline.readers import matching
from pipeline.readers import ranges
from pipeline.readers import sources
from schemas import raw
from schemas import rejected
from tests.conftest import assert_splits_read_as_whole
from tests.conftest import assert_writable
from tests.conftest import letters
from tests.conftest import read
from tests.conftest import summary
from tests.conftest import write_jsonl


def test_jsonl_good_and_bad_rows(tmp_path):
  path = tmp_path / 'data.jsonl'
  path.write_bytes(b'\n'.join([
      json.dumps({'id': 'a', 'text': 'good one', 'label': 'pos'}).encode(),
      json.dumps({'text': 'no id', 'label': 1}).encode(),  # int label is fine
      b'{"id": "c", "text": "unterminated',
      json.dumps(['not', 'an', 'object']).encode(),
      json.dumps({'id': 'e', 'label': 'pos'}).encode(),
      json.dumps({'id': 'f', 'text': 42, 'label': 'pos'}).encode(),
      json.dumps({'id': 'g', 'text': 'x', 'label': {'a': 1}}).encode(),
      b'{"id": "h", "text": "caf\xe9"}',  # latin-1 byte, invalid UTF-8
      b'',  # blank lines are not records
  ]) + b'\n')
  records = read(path)
  by_id = {r[raw.ID].rsplit(':', 1)[-1] if ':' in r[raw.ID] else r[raw.ID]: r
           for r in records}
  assert by_id['a'][raw.TEXT] == 'good one' and by_id['a'][raw.LABEL] == 'pos'
  unnamed = [r for r in records if r[raw.ID].startswith(str(path))]
  reasons = sorted(r.get(raw.REASON) or 'ok' for r in unnamed)
  # The row without an id and the unparseable rows get file:offset ids.
  assert reasons == [rejected.MALFORMED_RECORD, rejected.MALFORMED_RECORD,
                     'ok', rejected.UNDECODABLE_TEXT]
  no_id = [r for r in unnamed if not r.get(raw.REASON)][0]
  assert no_id[raw.LABEL] == '1'
  offset = int(no_id[raw.ID].rsplit(':', 1)[1])
  assert path.read_bytes()[offset:].startswith(b'{"text": "no id"')
  assert by_id['e'][raw.REASON] == rejected.MISSING_TEXT
  assert by_id['f'][raw.REASON] == rejected.WRONG_TYPE
  assert by_id['g'][raw.REASON] == rejected.WRONG_TYPE
  undecodable = [r for r in unnamed
                 if r.get(raw.REASON) == rejected.UNDECODABLE_TEXT][0]
  assert undecodable[raw.SNIPPET] == '{"id": "h", "text": "caf\ufffd"}'
  assert len(records) == 8


def test_gzipped_jsonl_and_custom_fields(tmp_path):
  path = tmp_path / 'data.jsonl.gz'
  with gzip.open(path, 'wt') as handle:
    for i in range(3):
      handle.write(json.dumps({'key': i, 'body': f'doc {i}', 'y': 'l'}) + '\n')
  records = read(path, text_field='body', label_field='y', id_field='key')
  assert summary(records) == [('0', 'doc 0', 'l'), ('1', 'doc 1', 'l'),
                              ('2', 'doc 2', 'l')]


def test_csv_header_quoted_newlines_and_bad_rows(tmp_path):
  path = tmp_path / 'data.csv'
  path.write_bytes(
      b'label,text\n'
      b'ham,"plain"\n'
      b'spam,"two\nlines, and ""quotes"""\n'
      b'ham,too,"many, and ""more"""\r\n'
      b'ham,"caf\xe9"\n'
      b'spam,"a ""stray"" quote" here\n'
      b'spam,last\n')
  records = sorted(read(path, id_field=None),
                   key=lambda r: int(r[raw.ID].rsplit(':', 1)[1]))
  assert [(r.get(raw.REASON) or r[raw.TEXT], r[raw.LABEL] if not r.get(
      raw.REASON) else None) for r in records] == [
          ('plain', 'ham'),
          ('two\nlines, and "quotes"', 'spam'),
          (rejected.MALFORMED_RECORD, None),
          (rejected.UNDECODABLE_TEXT, None),
          (rejected.MALFORMED_RECORD, None),
          ('last', 'spam'),
      ]
  # A dead letter shows the record as the file has it, quotes and all.
  assert [r[raw.SNIPPET] for r in records if r.get(raw.REASON)] == [
      'ham,too,"many, and ""more"""', 'ham,"caf\ufffd"',
      '\',\' expected after \'"\': spam,"a ""stray"" quote" here']


@pytest.mark.parametrize('splittable', [False, True])
def test_a_csv_header_naming_a_read_column_twice_is_an_unreadable_file(
    tmp_path, splittable):
  """A dict of the row would keep the last 'label' silently; a column the
  job does not read may be named twice."""
  path = tmp_path / 'twice.csv'
  path.write_text('id,text,label,note,label,note\n' + ''.join(
      f'{i},text {i},pos,n,other,n\n' for i in range(300)))
  (entry,) = matching.entries(str(path))
  parts = list(ranges.split(entry, splittable, 'auto', 1000))
  assert len(parts) > 3 if splittable else len(parts) == 1
  source_from_file = sources.source_factory('csv', readers.ReadConfig(
      format='csv', csv_splittable=splittable))
  read_parts = [record for part in parts
                for record in ranges.read(part, source_from_file)]
  # One letter, from the range at byte 0, however the file is split.
  assert letters(read_parts) == [(str(path), rejected.UNREADABLE_FILE)]
  assert "names the column 'label' twice" in read_parts[0][raw.SNIPPET]
  path.write_text('id,text,label,note,note\n1,a text,pos,n,n\n')
  assert summary(read(path)) == [('1', 'a text', 'pos')]


def test_a_parquet_file_gives_every_field_read_and_each_column_once(tmp_path):
  path = tmp_path / 'grouped.parquet'
  pq.write_table(pa.table({'text': ['a text', 'another'],
                           'label': ['pos', 'neg'], 'movie': ['m1', 'm2']}),
                 path)
  assert [r[raw.GROUP] for r in read(path, group_field='movie')] == [
      'm1', 'm2']
  twice = tmp_path / 'twice.parquet'
  pq.write_table(pa.Table.from_arrays(
      [pa.array(['a text']), pa.array(['pos']), pa.array(['other'])],
      names=['text', 'label', 'label']), twice)
  (letter,) = read(twice)
  assert letter[raw.REASON] == rejected.UNREADABLE_FILE
  assert "schema names the column 'label' twice" in letter[raw.SNIPPET]


def test_tsv_without_header_and_splittable_csv(tmp_path):
  tsv = tmp_path / 'data.tsv'
  tsv.write_text('1\tpos\thello there\n2\tneg\tgo away\n')
  records = read(tsv, csv_columns=('id', 'label', 'text'))
  assert summary(records) == [('1', 'hello there', 'pos'),
                              ('2', 'go away', 'neg')]
  csv_path = tmp_path / 'big.csv'
  csv_path.write_text('id,text,label\n' + ''.join(
      f'{i},text {i},l\n' for i in range(2000)))
  source = sources.CsvSource(str(csv_path), readers.ReadConfig(
      format='csv', csv_splittable=True), ',')
  assert_splits_read_as_whole(source, 1000, more_than=10)
  assert len(source_test_utils.read_from_source(source)) == 2000


def test_text_lines_split_anywhere_read_each_line_once(tmp_path):
  path = tmp_path / 'lines.txt'
  lines = [f'line number {i} ' + 'x' * (i % 37) for i in range(500)]
  path.write_text('\n'.join(lines) + '\n')
  source = sources.LineSource(str(path), readers.ReadConfig(format='text'),
                              sources.parse_text_line)
  assert_splits_read_as_whole(source, 333)
  records = read(path)
  assert sorted(r[raw.TEXT] for r in records) == sorted(lines)
  assert all(r[raw.LABEL] is None for r in records)


def test_parquet_row_groups_split_with_row_number_ids(tmp_path):
  path = tmp_path / 'data.parquet'
  table = pa.table({'text': [f'doc {i}' for i in range(100)] + [None, None],
                    'label': ['a', 'b'] * 51, 'number': list(range(102))})
  pq.write_table(table, path, row_group_size=10)
  source = sources.ParquetSource(str(path),
                                 readers.ReadConfig(format='parquet'))
  assert_splits_read_as_whole(source, 300, more_than=1)
  records = {r[raw.ID]: r for r in read(path)}
  assert records[f'{path}:42'][raw.TEXT] == 'doc 42'
  assert records[f'{path}:100'][raw.REASON] == rejected.MISSING_TEXT
  assert len(records) == 102
  assert {r.get(raw.REASON) for r in read(path, text_field='number')} == {
      rejected.WRONG_TYPE}


def test_tfrecord_examples_and_a_truncated_tail(tmp_path):
  path = tmp_path / 'data.tfrecord'
  with tf.io.TFRecordWriter(str(path)) as writer:
    for i in range(3):
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          'text': tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[f'doc {i}'.encode()])),
          'label': tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[b'pos'])),
      })).SerializeToString())
  with open(path, 'ab') as handle:
    handle.write(b'\x05\x00\x00')  # a torn write
  records = read(path)
  assert summary(records) == [
      (f'{path}:0', 'doc 0', 'pos'), (f'{path}:1', 'doc 1', 'pos'),
      (f'{path}:2', 'doc 2', 'pos'),
      (f'{path}:3', rejected.MALFORMED_RECORD, None)]


def test_document_tree_labels_and_splits_from_folders(tmp_path):
  for split, label, name, text in (('train', 'pos', '1_9.txt', 'great'),
                                   ('test', 'neg', '2_1.txt', 'awful'),
                                   ('other', 'neg', '3_2.txt', 'meh')):
    folder = tmp_path / split / label
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
  (tmp_path / 'train' / 'pos' / 'bad.txt').write_bytes(b'\xff\xfe')
  (tmp_path / 'train' / 'pos' / 'huge.txt').write_text('y' * 5000)
  records = {os.path.relpath(r[raw.ID], tmp_path): r
             for r in read(tmp_path, max_text_bytes=4096)}
  assert (records['train/pos/1_9.txt'][raw.TEXT],
          records['train/pos/1_9.txt'][raw.LABEL],
          records['train/pos/1_9.txt'][raw.SPLIT]) == ('great', 'pos', 'train')
  assert records['test/neg/2_1.txt'][raw.SPLIT] == 'test'
  assert records['other/neg/3_2.txt'][raw.SPLIT] is None
  assert records['train/pos/bad.txt'][raw.REASON] == rejected.UNDECODABLE_TEXT
  assert records['train/pos/huge.txt'][raw.REASON] == rejected.TEXT_TOO_LONG
  assert len(records[
      'train/pos/huge.txt'][raw.SNIPPET]) == rejected.SNIPPET_CHARS


@pytest.mark.parametrize('fmt', ['jsonl', 'files'])
def test_chunked_reading_yields_the_records_read_one_by_one(tmp_path, fmt):
  if fmt == 'jsonl':  # more than a chunk, and a malformed line
    pattern = write_jsonl(
        tmp_path / 'docs.jsonl',
        [{'id': str(i), 'text': f'doc {i}'} for i in range(2500)] +
        [b'{"id": "broken'])
  else:  # more than a group of paths, and an undecodable document
    pattern = tmp_path
    for index in range(250):
      (tmp_path / f'{index}.txt').write_text(f'doc {index}')
    (tmp_path / 'bad.txt').write_bytes(b'\xff\xfe')
  one_by_one = read(pattern, fmt)
  assert len(one_by_one) == {'jsonl': 2501, 'files': 251}[fmt]
  assert read(pattern, fmt, chunked=True) == one_by_one


def test_email_folders(tmp_path):
  (tmp_path / 'spam').mkdir()
  (tmp_path / 'spam' / '001.eml').write_bytes(
      b'Subject: WIN\nContent-Type: text/html\n\n<b>Free</b> money\n')
  records = read(tmp_path / 'spam' / '*.eml')
  assert summary(records) == [(str(tmp_path / 'spam' / '001.eml'),
                               'WIN\nFree money', 'spam')]


def test_resolve_input_errors_and_defaults(tmp_path):
  with pytest.raises(readers.ReaderError, match='no input file matches'):
    readers.resolve_input(str(tmp_path / 'nothing-*.jsonl'), 'auto')
  with pytest.raises(readers.ReaderError, match='unknown format'):
    readers.resolve_input(str(tmp_path), 'xml')
  (tmp_path / 'a.weird').write_text('x')
  with pytest.raises(readers.ReaderError, match='pass --format'):
    readers.resolve_input(str(tmp_path / '*.weird'), 'auto')
  matched = readers.resolve_input(str(tmp_path), 'auto')
  assert (matched.pattern, matched.format) == (str(tmp_path) + '/**', 'files')
  assert matched.files == [str(tmp_path / 'a.weird')]
  (tmp_path / 'b.csv.gz').write_bytes(gzip.compress(b'text\nx\n'))
  assert readers.resolve_input(str(tmp_path / '*.csv.gz'),
                               'auto').format == 'csv'


# --------------------------------------------------------------------------
# Faults: a bad file or record is a dead letter, never a crash or a loss.


def write_examples(path, texts):
  """A TFRecord file of tf.Examples; the byte offset of each record."""
  offsets, position = [], 0
  with tf.io.TFRecordWriter(str(path)) as writer:
    for text in texts:
      serialized = tf.train.Example(features=tf.train.Features(feature={
          'text': tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[text.encode()])),
      })).SerializeToString()
      offsets.append(position)
      position += 16 + len(serialized)  # length, its CRC, data, its CRC
      writer.write(serialized)
  return offsets


def test_lone_surrogates_are_undecodable_text(tmp_path):
  jsonl = tmp_path / 'data.jsonl'
  jsonl.write_bytes(b'\n'.join([
      b'{"id":"sur","text":"abc \\ud800 def"}',
      b'{"id":"lab","text":"fine","label":"\\udfff"}',
      b'{"id":"kept","text":"fine","tag":["\\ud83d"]}',
      b'{"id":"\\udc00","text":"fine"}',
      b'{"id":"pair","text":"smile \\ud83d\\ude00"}',  # a valid pair is text
  ]) + b'\n')
  records = read(jsonl, keep_fields=('tag',))
  assert_writable(records)
  reasons = {r[raw.ID]: r.get(raw.REASON) for r in records}
  # An id that cannot be written is replaced by the record's position.
  bad_id = [i for i in reasons if i.startswith(str(jsonl))]
  assert len(bad_id) == 1
  assert reasons == {'sur': rejected.UNDECODABLE_TEXT,
                     'lab': rejected.UNDECODABLE_TEXT,
                     'kept': rejected.UNDECODABLE_TEXT,
                     bad_id[0]: rejected.UNDECODABLE_TEXT, 'pair': None}
  assert [r[raw.TEXT] for r in records if r[raw.ID] == 'pair'] == [
      'smile \U0001F600']
  parquet = tmp_path / 'data.parquet'
  strings = pa.array([b'ok', b'bad \xff', b'\xed\xa0\x80'], pa.binary())
  pq.write_table(pa.table({'text': strings.view(pa.string()),
                           'label': ['a', 'b', 'c']}), parquet)
  records = read(parquet)
  assert_writable(records)
  assert [(r[raw.ID], r.get(raw.REASON)) for r in records] == [
      (f'{parquet}:0', None), (f'{parquet}:1', rejected.UNDECODABLE_TEXT),
      (f'{parquet}:2', rejected.UNDECODABLE_TEXT)]


def test_binary_ids_that_are_no_utf8_are_replaced_not_joined(tmp_path):
  """Decoded with replacement characters, b'\\xff' and b'\\xfe' would both
  be the id '\ufffd': two records of one id."""
  parquet = tmp_path / 'data.parquet'
  pq.write_table(pa.table({
      'id': pa.array([b'\xff', b'\xfe', 'caf\u00e9'.encode()], pa.binary()),
      'text': ['one', 'two', 'three'], 'label': ['a', 'b', 'c']}), parquet)
  records = read(parquet)
  assert [(r[raw.ID], r.get(raw.ID_REPLACED)) for r in records] == [
      (f'{parquet}:0', True), (f'{parquet}:1', True), ('caf\u00e9', None)]


def test_truncated_or_corrupt_gzip_is_one_corrupt_file_letter(tmp_path):
  lines = [json.dumps({'id': f'r{i:04}', 'text': f'row {i} ' + 'x' * 50})
           for i in range(2000)]
  data = ('\n'.join(lines) + '\n').encode()
  whole = gzip.compress(data)
  truncated = tmp_path / 'a_truncated.jsonl.gz'
  truncated.write_bytes(whole[:len(whole) // 2])
  corrupt = tmp_path / 'b_corrupt.jsonl.gz'
  corrupt.write_bytes(whole[:3] + b'\xff' * 7 + whole[10:])
  (tmp_path / 'c_good.jsonl.gz').write_bytes(whole)
  records = read(tmp_path / '*.jsonl.gz')
  assert_writable(records)
  by_source = {}
  for record in records:
    by_source.setdefault(os.path.basename(record[raw.SOURCE]), []).append(
        record)
  assert len(by_source['c_good.jsonl.gz']) == 2000
  kept = [r for r in by_source['a_truncated.jsonl.gz'] if not r.get(raw.REASON)]
  # The rows before the cut are kept, in order; the cut line is no
  # malformed record but part of the one letter for the rest of the file.
  assert 0 < len(kept) < 2000
  assert [r[raw.ID] for r in kept] == [f'r{i:04}' for i in range(len(kept))]
  lost_at = sum(len(line) + 1 for line in lines[:len(kept)])
  assert letters(by_source['a_truncated.jsonl.gz']) == [
      (f'{truncated}:{lost_at}', rejected.CORRUPT_FILE)]
  letter = [r for r in by_source['a_truncated.jsonl.gz']
            if r.get(raw.REASON)][0]
  assert 'end of its stream' in letter[raw.SNIPPET]
  assert str(len(whole) // 2) in letter[raw.SNIPPET]
  assert letters(by_source['b_corrupt.jsonl.gz']) == [
      (f'{corrupt}:0', rejected.CORRUPT_FILE)]
  assert 'while decompressing data' in by_source['b_corrupt.jsonl.gz'][0][
      raw.SNIPPET]


def test_truncated_parquet_or_bad_row_group_is_one_corrupt_file_letter(tmp_path):
  table = pa.table({'text': [f'doc {i}' for i in range(100)]})
  good = tmp_path / 'a_good.parquet'
  pq.write_table(table, good, row_group_size=10)
  whole = good.read_bytes()
  cut = tmp_path / 'b_cut.parquet'
  cut.write_bytes(whole[:len(whole) // 2])
  # A row group whose pages are unreadable costs only its own rows.
  chunk = pq.ParquetFile(good).metadata.row_group(5).column(0)
  start = chunk.dictionary_page_offset or chunk.data_page_offset
  end = start + chunk.total_compressed_size
  bad_group = tmp_path / 'c_bad_group.parquet'
  bad_group.write_bytes(whole[:start] + b'\xff' * (end - start) + whole[end:])
  records = read(tmp_path / '*.parquet')
  assert_writable(records)
  assert len([r for r in records if not r.get(raw.REASON)]) == 100 + 90
  assert letters(records) == [(f'{cut}:0', rejected.CORRUPT_FILE),
                              (f'{bad_group}:50', rejected.CORRUPT_FILE)]
  by_source = {r[raw.SOURCE]: r for r in records if r.get(raw.REASON)}
  assert 'footer' in by_source[str(cut)][raw.SNIPPET]
  assert f'row group 5 (rows 50-59, from byte {start})' in by_source[
      str(bad_group)][raw.SNIPPET]


def test_runaway_quoted_csv_field_is_one_dead_letter(tmp_path):
  rows = [f'{i},row {i},pos' for i in range(200)]
  # Bigger than any field limit the csv module was ever given here.
  rows[100] = '100,"' + ('y' * 99 + '\n') * 46000 + '",pos'
  rows[150] = '150,"' + 'z' * 3000 + '",pos'  # too long, yet within bounds
  path = tmp_path / 'data.csv'
  header = 'id,text,label\n'
  path.write_text(header + '\n'.join(rows) + '\n')
  records = read(path, max_text_bytes=1000)
  assert_writable(records)
  assert len(records) == 200
  runaway_at = len(header) + sum(len(row) + 1 for row in rows[:100])
  assert letters(records) == [(f'{path}:{runaway_at}', rejected.TEXT_TOO_LONG)]
  by_id = {r[raw.ID]: r for r in records}
  assert (by_id['101'][raw.TEXT], by_id['101'][raw.LABEL]) == ('row 101',
                                                               'pos')
  # Under the reader's bound the record keeps its id; the job rejects it.
  assert by_id['150'][raw.TEXT] == 'z' * 3000
  # A quote never closed takes every later record into its field, past
  # the bound or within it: the file cannot be read to its end.
  for rest in ('2,x\n' * 20000, '2,x\n' * 30):
    unterminated = tmp_path / 'open.csv'
    unterminated.write_text('id,text\n0,fine\n1,"never closed\n' + rest)
    records = read(unterminated, max_text_bytes=1000)
    assert [r[raw.TEXT] for r in records if not r.get(raw.REASON)] == ['fine']
    assert letters(records) == [(f'{unterminated}:15',
                                 rejected.CORRUPT_FILE)]
    (letter,) = [r for r in records if r.get(raw.REASON)]
    assert letter[raw.SNIPPET].startswith(
        f'unterminated quoted field: the record from byte 15 runs '
        f'{len(rest) + 16} bytes to the end of the file')
    assert '1,"never closed' in letter[raw.SNIPPET]


def test_tfrecord_crc_mismatches(tmp_path):
  path = tmp_path / 'data_crc.tfrecord'
  texts = [f'doc {i}' for i in range(5)]
  offsets = write_examples(path, texts)
  damaged = bytearray(path.read_bytes())
  damaged[offsets[2] - 5] ^= 0x01  # inside the text of record 1
  path.write_bytes(bytes(damaged))
  records = read(path)
  assert_writable(records)
  assert [(r[raw.ID], r.get(raw.REASON) or r[raw.TEXT]) for r in records] == [
      (f'{path}:0', 'doc 0'), (f'{path}:1', rejected.MALFORMED_RECORD),
      (f'{path}:2', 'doc 2'), (f'{path}:3', 'doc 3'), (f'{path}:4', 'doc 4')]
  assert f'byte {offsets[1]}' in records[1][raw.SNIPPET]
  assert 'crc' in records[1][raw.SNIPPET].lower()
  lost = tmp_path / 'data_length.tfrecord'
  offsets = write_examples(lost, texts)
  damaged = bytearray(lost.read_bytes())
  damaged[offsets[2] + 5] ^= 0x40  # the length of record 2
  lost.write_bytes(bytes(damaged))
  records = read(lost)
  assert [(r[raw.ID], r.get(raw.REASON) or r[raw.TEXT]) for r in records] == [
      (f'{lost}:0', 'doc 0'), (f'{lost}:1', 'doc 1'),
      (f'{lost}:2', rejected.CORRUPT_FILE)]
  assert f'{offsets[2]}-{len(damaged)}' in records[2][raw.SNIPPET]


def test_allow_corrupt_files_flag():
  parser = argparse.ArgumentParser()
  readers.add_reader_arguments(parser)
  default = readers.read_config_from_args(parser.parse_args(['--input=x']))
  allowed = readers.read_config_from_args(parser.parse_args(
      ['--input=x', '--allow_corrupt_files']))
  assert (default.allow_corrupt_files, allowed.allow_corrupt_files) == (
      False, True)


@pytest.mark.parametrize('depth', [10_000, 100_000])
def test_deeply_nested_json_is_one_malformed_record(tmp_path, depth):
  path = tmp_path / 'deep.jsonl'
  path.write_text('\n'.join([
      '{"id": "before", "text": "fine"}',
      '[' * depth + ']' * depth,
      '{"id": "nested", "text": ' + '[' * depth + ']' * depth + '}',
      '{"id": "after", "text": "fine"}']) + '\n')
  records = read(path)
  assert [r[raw.ID] for r in records if not r.get(raw.REASON)] == [
      'after', 'before']
  assert [reason for _, reason in letters(records)] == [
      rejected.MALFORMED_RECORD] * 2


def test_ids_of_every_json_type(tmp_path):
  values = ['"s"', '12345', '12345.0', 'true', '-0.5', 'null', '""',
            '{"a": 1}', '[1]', 'NaN', '"\\udc00"']
  path = tmp_path / 'ids.jsonl'
  path.write_text(''.join(f'{{"id": {value}, "text": "x"}}\n'
                          for value in values) + '{"text": "no id"}\n')
  records = {r[raw.ID]: r for r in read(path)}
  for given in ('s', '12345', '12345.0', 'true', '-0.5'):
    assert not records[given].get(raw.ID_REPLACED)
  # No id can be made of these: file:position, said so.
  replaced = sorted((r for i, r in records.items() if i.startswith(str(path))),
                    key=lambda r: int(r[raw.ID].rsplit(':', 1)[1]))
  assert [r.get(raw.ID_REPLACED, False) for r in replaced] == [True] * 6 + [
      False]


def test_an_id_field_given_must_be_there_and_the_default_may_not_be(
    tmp_path):
  path = tmp_path / 'ids.jsonl'
  write_jsonl(path, [{'key': 'k0', 'text': 'x'}, {'text': 'no key'}])
  parser = argparse.ArgumentParser()
  readers.add_reader_arguments(parser)

  def config(*flags):
    return readers.read_config_from_args(
        parser.parse_args(['--input=x', *flags]), format='jsonl')

  assert (config().id_field, config().id_field_required) == ('id', False)
  assert (config('--id_field=key').id_field,
          config('--id_field=key').id_field_required) == ('key', True)
  assert config('--id_field=').id_field is None
  # Named, the field is one a record must have: a record without it gets
  # its position, counted as a replaced id.
  named = {r[raw.ID]: r for r in read(path, id_field='key',
                                      id_field_required=True)}
  assert not named['k0'].get(raw.ID_REPLACED)
  (no_key,) = [r for i, r in named.items() if i != 'k0']
  assert no_key[raw.ID_REPLACED]
  # The default id field: where a record has none, its position, as ever.
  assert not any(r.get(raw.ID_REPLACED) for r in read(path))


@pytest.mark.parametrize('fmt', ['jsonl', 'csv', 'parquet', 'tfrecord'])
def test_the_launchers_sample_lists_every_field_of_a_row(tmp_path, fmt):
  rows = [{'key': f'k{i}', 'body': f'text {i}', 'stars': str(i)}
          for i in range(3)]
  path = tmp_path / f'in.{fmt}'
  if fmt == 'jsonl':
    write_jsonl(path, rows)
  elif fmt == 'csv':
    path.write_text('key,body,stars\n' + ''.join(
        f'{r["key"]},{r["body"]},{r["stars"]}\n' for r in rows))
  elif fmt == 'parquet':
    pq.write_table(pa.Table.from_pylist(rows), path)
  else:
    with tf.io.TFRecordWriter(str(path)) as out:
      for row in rows:
        out.write(tf.train.Example(features=tf.train.Features(feature={
            name: tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[value.encode()])) for name, value in row.items()
        })).SerializeToString())
  config = readers.ReadConfig(format=fmt, text_field='body')
  sample = readers.sample(readers.resolve_input(str(path), fmt), config, 100)
  # Parquet's reader reads only the columns it needs: the sample names
  # the rest too.
  assert [sorted(r[raw.FIELDS]) for r in sample] == [
      ['body', 'key', 'stars']] * 3
  # The pipeline's records carry no such list.
  assert not any(raw.FIELDS in r for r in read(path, fmt, text_field='body'))


def test_files_of_two_formats_are_refused_naming_both(tmp_path):
  (tmp_path / 'a.csv').write_text('text\nx\n')
  write_jsonl(tmp_path / 'b.jsonl', [{'text': 'y'}])
  (tmp_path / 'c.jsonl.gz').write_bytes(gzip.compress(b'{"text": "z"}\n'))
  with pytest.raises(readers.ReaderError,
                     match=r'a\.csv is csv, .*b\.jsonl is jsonl'):
    readers.resolve_input(f'{tmp_path}/*', 'auto')
  assert readers.resolve_input(f'{tmp_path}/*.jsonl*',
                               'auto').format == 'jsonl'
  # --format says how to read them all.
  assert readers.resolve_input(f'{tmp_path}/*', 'jsonl').format == 'jsonl'
