"""The line formats' text: UTF-16 and UTF-32, a BOM, line ends of every
kind across any chunking or split, NUL bytes."""
import json
import os

from apache_beam.io import source_test_utils
import pytest

from pipeline import readers
from pipeline.readers import lines
from pipeline.readers import sources
from schemas import raw
from schemas import rejected
from tests.conftest import assert_splits_read_as_whole
from tests.conftest import assert_writable
from tests.conftest import read
from tests.conftest import summary


@pytest.mark.parametrize('encoding', ['utf-16', 'utf-16-be', 'utf-32-le'])
def test_utf16_and_utf32_files(tmp_path, encoding):
  texts = ['héllo wörld', 'snow \u2603 man', 'smile \U0001F600']
  (tmp_path / 'data.jsonl').write_bytes('\n'.join(
      json.dumps({'id': str(i), 'text': t}, ensure_ascii=False)
      for i, t in enumerate(texts)).encode(encoding))
  (tmp_path / 'data.csv').write_bytes(('id,text\r\n' + ''.join(
      f'{i},"{t}\nmore"\r\n' for i, t in enumerate(texts))).encode(encoding))
  (tmp_path / 'data.txt').write_bytes('\n'.join(texts).encode(encoding))
  assert [r[raw.TEXT] for r in read(tmp_path / 'data.jsonl',
                                    encoding=encoding)] == texts
  assert [r[raw.TEXT] for r in read(tmp_path / 'data.csv', label_field=None,
                                    encoding=encoding)] == [
                                        t + '\nmore' for t in texts]
  assert sorted(r[raw.TEXT] for r in read(
      tmp_path / 'data.txt', encoding=encoding)) == sorted(texts)


def test_utf16_lines_split_anywhere_read_each_line_once(tmp_path):
  path = tmp_path / 'lines.txt'
  lines = [f'line \u0a0d {i} ' + 'x' * (i % 37) for i in range(300)]
  path.write_bytes('\r\n'.join(lines).encode('utf-16'))
  source = sources.LineSource(str(path), readers.ReadConfig(
      format='text', encoding='utf-16'), sources.parse_text_line)
  assert_splits_read_as_whole(source, 333)
  assert sorted(r[raw.TEXT] for r in source_test_utils.read_from_source(
      source)) == sorted(lines)


def test_unknown_encoding_is_a_reader_error():
  with pytest.raises(readers.ReaderError, match='encoding'):
    readers.ReadConfig(encoding='no-such-codec')


def test_utf8_bom_is_stripped(tmp_path):
  bom = b'\xef\xbb\xbf'
  (tmp_path / 'data.jsonl').write_bytes(bom + b'{"id": "a", "text": "x"}\n')
  (tmp_path / 'data.csv').write_bytes(bom + b'text,label\nhello,pos\n')
  (tmp_path / 'docs' / 'pos').mkdir(parents=True)
  (tmp_path / 'docs' / 'pos' / '1.txt').write_bytes(bom + b'great')
  assert summary(read(tmp_path / 'data.jsonl')) == [('a', 'x', None)]
  assert [(r.get(raw.REASON) or r[raw.TEXT], r[raw.LABEL]) for r in read(
      tmp_path / 'data.csv', id_field=None)] == [('hello', 'pos')]
  assert [r[raw.TEXT] for r in read(tmp_path / 'docs')] == ['great']


def test_cr_only_line_endings_split_lines(tmp_path):
  text = tmp_path / 'mac.txt'
  lines = [f'line {i}' for i in range(100)]
  text.write_bytes('\r'.join(lines).encode() + b'\r')
  assert sorted(r[raw.TEXT] for r in read(text)) == sorted(lines)
  source = sources.LineSource(str(text), readers.ReadConfig(format='text'),
                              sources.parse_text_line)
  assert_splits_read_as_whole(source, 50)
  mixed = tmp_path / 'mixed.jsonl'
  mixed.write_bytes(b'{"text": "a"}\r{"text": "b"}\r\n{"text": "c"}\n\r'
                    b'{"text": "d"}')
  assert sorted(r[raw.TEXT] for r in read(mixed)) == ['a', 'b', 'c', 'd']
  csv_path = tmp_path / 'mac.csv'
  csv_path.write_bytes(b'text,label\r"two\rlines",a\rplain,b\r')
  assert [(r[raw.TEXT], r[raw.LABEL]) for r in sorted(
      read(csv_path, id_field=None), key=lambda r: r[raw.LABEL])] == [
          ('two\rlines', 'a'), ('plain', 'b')]


@pytest.mark.parametrize('encoding', ['utf-8', 'utf-16-le', 'utf-32-be'])
def test_line_ends_found_across_any_chunking(encoding):
  # Every line end (\n, \r\n, lone \r) at every chunk boundary, and a
  # character whose code units hold a \r or \n byte (U+0A0D).
  text = 'a\nbb\r\nc\u0a0dc\r\rd\r\n\ne'
  expected = ['a\n', 'bb\r\n', 'c\u0a0dc\r', '\r', 'd\r\n', '\n', 'e']
  data = text.encode(encoding)
  line_encoding = lines.TextEncoding.of(encoding, lambda: data)
  for size in range(1, len(data) + 1):
    chunks = iter([data[i:i + size] for i in range(0, len(data), size)])
    found = [line_encoding.decode(piece.data, 1) for piece in lines.pieces(
        chunks, 0, line_encoding, max_bytes=1000)]
    assert found == expected, size


def test_nul_bytes_are_not_text(tmp_path):
  folder = tmp_path / 'docs' / 'pos'
  folder.mkdir(parents=True)
  (folder / 'zeros.txt').write_bytes(b'\x00' * 4096)
  (folder / 'fine.txt').write_text('fine')
  records = {os.path.basename(r[raw.ID]): r for r in read(tmp_path / 'docs')}
  assert records['zeros.txt'][raw.REASON] == rejected.UNDECODABLE_TEXT
  assert records['fine.txt'][raw.TEXT] == 'fine'
  lines = tmp_path / 'lines.txt'
  lines.write_bytes(b'ok\n' + b'\x00' * 100 + b'\n')
  assert [r.get(raw.REASON) for r in read(lines)] == [
      None, rejected.UNDECODABLE_TEXT]
  assert_writable(read(lines))
