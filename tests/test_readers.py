"""The reading layer: every format, ids, labels, splits, bad rows, splitting."""
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
from pipeline.readers import sources
from schemas import raw
from schemas import rejected
from tests.conftest import run_and_collect


def read(pattern, fmt='auto', **config):
  """Every record a pattern yields, read through a real Beam pipeline."""
  pattern, fmt = readers.resolve_input(str(pattern), fmt)
  transform = readers.ReadRecords(pattern,
                                  readers.ReadConfig(format=fmt, **config))
  return sorted(run_and_collect(lambda p: p | transform),
                key=lambda r: r[raw.ID])


def summary(records):
  """(id, text or reason, label) per record, for compact assertions."""
  return [(r[raw.ID], r.get(raw.REASON) or r[raw.TEXT], r.get(raw.LABEL))
          for r in records]


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
      b'ham,too,many\n'
      b'ham,"caf\xe9"\n'
      b'spam,last\n')
  records = read(path, id_field=None)
  assert [(r.get(raw.REASON) or r[raw.TEXT], r[raw.LABEL] if not r.get(
      raw.REASON) else None) for r in sorted(
          records, key=lambda r: int(r[raw.ID].rsplit(':', 1)[1]))] == [
              ('plain', 'ham'),
              ('two\nlines, and "quotes"', 'spam'),
              (rejected.MALFORMED_RECORD, None),
              (rejected.UNDECODABLE_TEXT, None),
              ('last', 'spam'),
          ]


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
  splits = [(s.source, s.start_position, s.stop_position)
            for s in source.split(desired_bundle_size=1000)]
  assert len(splits) > 10
  source_test_utils.assert_sources_equal_reference_source(
      (source, None, None), splits)
  assert len(source_test_utils.read_from_source(source)) == 2000


def test_text_lines_split_anywhere_read_each_line_once(tmp_path):
  path = tmp_path / 'lines.txt'
  lines = [f'line number {i} ' + 'x' * (i % 37) for i in range(500)]
  path.write_text('\n'.join(lines) + '\n')
  source = sources.LineSource(str(path), readers.ReadConfig(format='text'),
                              sources.parse_text_line)
  splits = [(s.source, s.start_position, s.stop_position)
            for s in source.split(desired_bundle_size=333)]
  source_test_utils.assert_sources_equal_reference_source(
      (source, None, None), splits)
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
  splits = [(s.source, s.start_position, s.stop_position)
            for s in source.split(desired_bundle_size=300)]
  assert len(splits) > 1
  source_test_utils.assert_sources_equal_reference_source(
      (source, None, None), splits)
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
  assert readers.resolve_input(str(tmp_path), 'auto') == (
      str(tmp_path) + '/**', 'files')
  (tmp_path / 'b.csv.gz').write_bytes(gzip.compress(b'text\nx\n'))
  assert readers.resolve_input(str(tmp_path / '*.csv.gz'), 'auto')[1] == 'csv'


def test_unknown_encoding_is_a_reader_error():
  with pytest.raises(readers.ReaderError, match='encoding'):
    readers.ReadConfig(encoding='no-such-codec')


def test_allow_corrupt_files_flag():
  parser = argparse.ArgumentParser()
  readers.add_reader_arguments(parser)
  default = readers.read_config_from_args(parser.parse_args(['--input=x']))
  allowed = readers.read_config_from_args(parser.parse_args(
      ['--input=x', '--allow_corrupt_files']))
  assert (default.allow_corrupt_files, allowed.allow_corrupt_files) == (
      False, True)
