"""One Beam ``FileBasedSource`` a file format, yielding raw records.

Large files are split into byte ranges read in parallel where the format
allows it; nothing is loaded whole into memory, and no record is held past
``ReadConfig.max_record_bytes``. A file that breaks off (a truncated or
corrupt compressed stream, an unreadable Parquet footer) keeps the records
read before the fault, and the rest of it is one corrupt_file dead letter.
"""
import codecs
import contextlib
import csv
import json
import math
import os
from typing import Dict, Iterator, List, Optional

from apache_beam.io import filebasedsource
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
import orjson
import pyarrow as pa

from pipeline.readers import config as config_lib
from pipeline.readers import csv_records
from pipeline.readers import lines
from pipeline.readers import rows
from pipeline.readers import streams
from pipeline.readers import tfrecord_frames
from schemas import raw
from schemas import rejected

# ASCII whitespace, what bytes.strip() strips: a line of only these is blank
# and no record; a line of other whitespace is a record that the job rejects
# as empty_text.
_BLANK = ' \t\n\r\x0b\x0c'


class _RecordSource(filebasedsource.FileBasedSource):
  """A FileBasedSource that yields raw-record dicts for one ReadConfig."""

  def __init__(self, file_pattern, config: config_lib.ReadConfig,
               splittable: bool, compression_type=CompressionTypes.AUTO):
    super().__init__(file_pattern, compression_type=compression_type,
                     splittable=splittable, validate=False)
    self._config = config
    # The file's size when it was matched, where known (``source_factory``).
    self._listed_size: Optional[int] = None

  def read_records(self, file_name, range_tracker):
    """The records of one byte range of a file, and one dead letter for
    whatever ends its reading early: the per-file choke point.

    A file that cannot be opened fails every range of it alike, so a range
    past byte 0 that fails before its first record reports only a fault of
    its own; the range at byte 0 reports the file, once however split.
    """
    yielded = 0
    try:
      for record in self._read(file_name, range_tracker):
        yielded += 1
        yield record
    except streams.CorruptFile as error:
      yield rows.rejection(f'{file_name}:{error.position}', file_name,
                           rejected.CORRUPT_FILE, error.detail)
    except Exception as error:  # pylint: disable=broad-except
      start = range_tracker.start_position() or 0
      if yielded or not start or _opens(file_name):
        yield rows.rejection(file_name, file_name, rejected.UNREADABLE_FILE,
                             _failure(error, range_tracker, yielded))

  def _read(self, file_name, range_tracker) -> Iterator[Dict]:
    raise NotImplementedError

  def _chunks(self, file_name: str, start: int = 0) -> Iterator[bytes]:
    return streams.chunks(file_name, self._compression_type, start,
                          self._listed_size)

  def _text_encoding(self, file_name: str) -> lines.TextEncoding:
    def head() -> bytes:
      with contextlib.closing(self._chunks(file_name)) as chunks:
        return next(chunks, b'')
    return lines.TextEncoding.of(self._config.encoding, head)

  def _lines(self, file_name, range_tracker,
             encoding: lines.TextEncoding) -> Iterator[lines.Piece]:
    return lines.in_range(lambda start: self._chunks(file_name, start),
                          range_tracker, encoding,
                          self._config.max_record_bytes)


def _opens(file_name: str) -> bool:
  try:
    FileSystems.open(file_name).close()
  except Exception:  # pylint: disable=broad-except
    return False
  return True


def _failure(error: Exception, range_tracker, yielded: int) -> str:
  """What stopped a range, and where, for its dead letter's snippet."""
  start, stop = range_tracker.start_position() or 0, (
      range_tracker.stop_position())
  where = '' if not (start or yielded) else (
      f' (after {yielded} records of bytes {start}-'
      f'{"the end" if math.isinf(stop) else stop})')
  return f'{type(error).__name__}: {error}{where}'


class LineSource(_RecordSource):
  """Text and JSONL: one record a line, split at line boundaries."""

  def __init__(self, file_pattern, config: config_lib.ReadConfig, parse=None,
               splittable=True):
    super().__init__(file_pattern, config, splittable=splittable)
    self._parse = parse

  def _read(self, file_name, range_tracker):
    encoding = self._text_encoding(file_name)
    for offset, line, too_long in lines.whole_lines(
        self._lines(file_name, range_tracker, encoding)):
      default_id = f'{file_name}:{offset}'
      try:
        text, undecodable = encoding.decode(line, offset), False
      except UnicodeDecodeError:
        text, undecodable = encoding.decode(line, offset, 'replace'), True
      text = text.rstrip('\r\n')
      if too_long or undecodable:
        yield rows.rejection(
            default_id, file_name,
            rejected.TEXT_TOO_LONG if too_long else rejected.UNDECODABLE_TEXT,
            text)
      elif text.strip(_BLANK):  # blank lines separate records
        yield rows.guarded(default_id, file_name, text, self._parse, text,
                           default_id, file_name, self._config)


def parse_text_line(text: str, default_id, source, config) -> Dict:
  del config  # every line is all text
  if raw.is_undecodable(text):
    return rows.rejection(default_id, source, rejected.UNDECODABLE_TEXT, text)
  return {raw.ID: default_id, raw.SOURCE: source, raw.TEXT: text,
          raw.LABEL: None, raw.SPLIT: None}


def json_value(text: str):
  """What ``json.loads`` reads in a line, at orjson's speed (BENCHMARKS.md,
  issue 21). Where orjson reads otherwise (it refuses lone surrogate
  escapes, NaN and numbers past a double's range, and reads integers past
  64 bits as floats), json reads the line again: wherever json reads a
  line, the value is json's. A line nested deeper than json's recursion
  allows (about 1,000 levels), which json refuses, orjson reads up to its
  limit of 1,024."""
  try:
    value = orjson.loads(text)
  except orjson.JSONDecodeError:
    return json.loads(text)
  return json.loads(text) if _may_be_wide_integer(value) else value


# orjson holds integers of 64 bits, signed or not, and reads a float past
# them: a whole float this large may have been an integer literal.
_PAST_64_BITS = 2.0 ** 63
# Values that hold no float: a record of only these needs no closer look.
_FLOATLESS_TYPES = frozenset((str, int, bool, type(None)))


def _may_be_wide_integer(value) -> bool:
  # A loop, not recursion: orjson reads values nested up to 1,024 deep,
  # past Python's recursion limit.
  pending = [value]
  while pending:
    value = pending.pop()
    if type(value) is dict:  # pylint: disable=unidiomatic-typecheck
      values = value.values()
    elif type(value) is list:  # pylint: disable=unidiomatic-typecheck
      values = value
    elif (type(value) is float and  # pylint: disable=unidiomatic-typecheck
          abs(value) >= _PAST_64_BITS and value.is_integer()):
      return True
    else:
      continue
    if not _FLOATLESS_TYPES.issuperset(map(type, values)):
      pending.extend(values)
  return False


def parse_json_line(text: str, default_id, source, config) -> Dict:
  try:
    fields = json_value(text)
  except ValueError:
    return rows.rejection(default_id, source, rejected.MALFORMED_RECORD, text)
  if not isinstance(fields, dict):
    return rows.rejection(default_id, source, rejected.MALFORMED_RECORD, text)
  return rows.record_from_fields(fields, config, default_id, source, text)


class CsvSource(_RecordSource):
  """CSV/TSV with the standard csv module; quoted newlines allowed unless split."""

  def __init__(self, file_pattern, config: config_lib.ReadConfig,
               delimiter: str):
    super().__init__(file_pattern, config, splittable=config.csv_splittable)
    self._delimiter = delimiter

  def _header(self, file_name, encoding):
    with contextlib.closing(lines.pieces(
        self._chunks(file_name), 0, encoding,
        self._config.max_record_bytes)) as line_pieces:
      first = next(line_pieces, None)
    if first is None:
      return []
    return next(csv.reader([encoding.decode(first.data, 0, 'replace')],
                           delimiter=self._delimiter), [])

  def _read(self, file_name, range_tracker):
    config = self._config
    encoding = self._text_encoding(file_name)
    columns = config.csv_columns
    header_offset = None
    if columns is None:
      columns = self._header(file_name, encoding)
      header_offset = 0
      if _named_twice(columns, config, range_tracker, 'header'):
        return
    for record in csv_records.records(
        self._lines(file_name, range_tracker, encoding), encoding,
        self._delimiter, config.max_record_bytes):
      default_id = f'{file_name}:{record.offset}'
      if record.reason:
        yield rows.rejection(default_id, file_name, record.reason,
                             record.detail)
      elif record.offset != header_offset and record.row:
        yield rows.guarded(default_id, file_name, record.text, self._record,
                           record.row, record.text, columns, default_id,
                           file_name)

  def _record(self, row, payload, columns, default_id, file_name) -> Dict:
    if len(row) != len(columns):
      return rows.rejection(default_id, file_name, rejected.MALFORMED_RECORD,
                            payload)
    if any(raw.has_surrogates(value) for value in row):
      # Bytes invalid in the encoding, in any column.
      return rows.rejection(default_id, file_name, rejected.UNDECODABLE_TEXT,
                            payload)
    return rows.record_from_fields(dict(zip(columns, row)), self._config,
                                   default_id, file_name, payload)


def _columns_read(config: config_lib.ReadConfig) -> List[str]:
  """The fields of a record the job reads, each once: every column of a
  table it needs."""
  return list(dict.fromkeys(
      name for name in (config.text_field, config.label_field,
                        config.id_field, config.split_field,
                        config.group_field, *config.keep_fields) if name))


def _named_twice(columns, config: config_lib.ReadConfig, range_tracker,
                 where: str) -> bool:
  """Whether a file's ``columns`` name a column the job reads twice (a dict
  of the row would keep the last silently): a ValueError, the file's
  unreadable_file letter, from the range at byte 0; True in the others,
  which read nothing, so that the file is reported once."""
  read = set(_columns_read(config))
  seen, twice = set(), None
  for name in columns:
    if name in seen and name in read:
      twice = name
      break
    seen.add(name)
  if twice and not range_tracker.start_position():
    raise ValueError(f'its {where} names the column {twice!r} twice: which '
                     'one holds a record\'s value is unknown')
  return twice is not None


class ParquetSource(_RecordSource):
  """Parquet, split by row group; the position of a row is its row number.

  A row group that cannot be read is one corrupt_file dead letter, and the
  next is read; a file whose footer cannot be read is one for the file.
  """

  def __init__(self, file_pattern, config: config_lib.ReadConfig):
    super().__init__(file_pattern, config, splittable=True,
                     compression_type=CompressionTypes.UNCOMPRESSED)

  @staticmethod
  def _row_group_offset(metadata, index) -> int:
    group = metadata.row_group(index)
    starts = []
    for column in range(group.num_columns):
      chunk = group.column(column)
      starts.append(chunk.data_page_offset)
      if chunk.has_dictionary_page:
        starts.append(chunk.dictionary_page_offset)
    return min(starts)

  @staticmethod
  def _open(handle, range_tracker):
    """The ParquetFile; CorruptFile from the range that holds byte 0, so
    that a file whose footer is lost is reported once, however split."""
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    try:
      return pq.ParquetFile(handle)
    except (pa.ArrowException, OSError) as error:
      if (range_tracker.start_position() or 0) > 0 or (
          not range_tracker.try_claim(0)):
        return None
      handle.seek(0, os.SEEK_END)
      size = handle.tell()
      raise streams.CorruptFile(0, (
          f'the Parquet footer, at the end of the file (byte {size}), cannot '
          f'be read, nor any row: {error}')) from error

  def _read(self, file_name, range_tracker):
    config = self._config
    wanted = _columns_read(config)
    with self.open_file(file_name) as handle:
      parquet = self._open(handle, range_tracker)
      if parquet is None:
        return
      metadata = parquet.metadata
      names = parquet.schema_arrow.names
      if _named_twice(names, config, range_tracker, 'schema'):
        return
      columns = [c for c in wanted if c in names]
      first_row = 0
      for index in range(metadata.num_row_groups):
        row_count = metadata.row_group(index).num_rows
        offset = self._row_group_offset(metadata, index)
        if offset < (range_tracker.start_position() or 0):
          first_row += row_count
          continue
        if not range_tracker.try_claim(offset):
          return
        try:
          table = parquet.read_row_group(index, columns=columns)
        except (pa.ArrowException, OSError) as error:
          yield rows.rejection(
              f'{file_name}:{first_row}', file_name, rejected.CORRUPT_FILE,
              f'row group {index} (rows {first_row}-'
              f'{first_row + row_count - 1}, from byte {offset}) cannot be '
              f'read: {error}')
        else:
          for row_number, fields in enumerate(_table_rows(table), first_row):
            row_id = f'{file_name}:{row_number}'
            yield rows.guarded(row_id, file_name, fields,
                               rows.record_from_fields, fields, config, row_id,
                               file_name, fields, names)
        first_row += row_count


def _table_rows(table: pa.Table) -> list:
  """The rows of a table as dicts; a string that is not UTF-8 keeps its
  bytes as lone surrogates, which the row's checks reject as
  undecodable_text, rather than failing the whole table."""
  try:
    return table.to_pylist()
  except UnicodeDecodeError:
    values = [_column_values(column) for column in table.columns]
    return [dict(zip(table.column_names, row)) for row in zip(*values)]


def _column_values(column: pa.ChunkedArray) -> list:
  if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
    return [None if value is None else value.decode('utf-8', 'surrogateescape')
            for value in column.cast(pa.large_binary()).to_pylist()]
  try:
    return column.to_pylist()
  except UnicodeDecodeError:
    # Invalid UTF-8 inside nested values: only the rows that hold it lose
    # the column's value, to a lone surrogate that gets them rejected.
    return [_scalar_value(column, row) for row in range(len(column))]


def _scalar_value(column: pa.ChunkedArray, row: int):
  try:
    return column[row].as_py()
  except UnicodeDecodeError:
    return '\udcff'


class TFRecordSource(_RecordSource):
  """TFRecord files of tf.Example; the position of a record is its index."""

  def __init__(self, file_pattern, config: config_lib.ReadConfig):
    super().__init__(file_pattern, config, splittable=False)

  def _read(self, file_name, range_tracker):
    if not range_tracker.try_claim(0):
      return
    reader = streams.ByteReader(self._chunks(file_name))
    for frame in tfrecord_frames.frames(reader, self._config.max_record_bytes):
      default_id = f'{file_name}:{frame.index}'
      if frame.reason:
        yield rows.rejection(default_id, file_name, frame.reason, frame.detail)
      else:
        yield rows.guarded(default_id, file_name, frame.data, self._record,
                           frame, default_id, file_name)

  def _record(self, frame: tfrecord_frames.Frame, default_id: str,
              file_name: str) -> Dict:
    # pylint: disable=import-outside-toplevel
    from google.protobuf import message
    from tensorflow.core.example import example_pb2
    try:
      example = example_pb2.Example.FromString(frame.data)
    except message.DecodeError as error:
      return rows.rejection(default_id, file_name, rejected.MALFORMED_RECORD,
                            f'the record at byte {frame.offset} is not a '
                            f'tf.Example: {error}')
    fields = {}
    for name, feature in example.features.feature.items():
      kind = feature.WhichOneof('kind')
      values = list(getattr(feature, kind).value) if kind else []
      fields[name] = values[0] if len(values) == 1 else (values or None)
    return rows.record_from_fields(fields, self._config, default_id,
                                   file_name, frame.data)


def source_factory(fmt: str, config: config_lib.ReadConfig):
  """A function from a file path, and its size when it was matched (None:
  unknown), to the source that reads it as ``fmt``."""
  if fmt == 'jsonl':
    make = lambda path: LineSource(path, config, parse_json_line)
  elif fmt == 'text':
    make = lambda path: LineSource(path, config, parse_text_line)
  elif fmt in ('csv', 'tsv'):
    delimiter = codecs.decode(
        config.csv_delimiter or (',' if fmt == 'csv' else '\t'),
        'unicode_escape')
    make = lambda path: CsvSource(path, config, delimiter)
  elif fmt == 'parquet':
    make = lambda path: ParquetSource(path, config)
  elif fmt == 'tfrecord':
    make = lambda path: TFRecordSource(path, config)
  else:
    raise config_lib.ReaderError(f'unknown format {fmt!r}')

  def source_from_file(path: str, listed_size: Optional[int] = None):
    source = make(path)
    source._listed_size = listed_size  # pylint: disable=protected-access
    return source
  return source_from_file
