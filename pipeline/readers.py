"""One reading layer for every Beam job: any supported corpus -> raw records.

Each format is a Beam ``FileBasedSource``, read through ``ReadAllFiles`` so
that large files are split into byte ranges read in parallel and many small
files spread over the workers; nothing is loaded whole into memory. Every
record is a dict keyed by ``schemas.raw`` names. A record the reader cannot
parse is still yielded, with ``reason`` set, so that the job can count it and
send it to the dead letters: readers never drop and never raise on bad rows.
"""
import argparse
import codecs
import csv
import dataclasses
import json
import os
import posixpath
import struct
from typing import Any, Dict, Iterator, Optional, Tuple

import apache_beam as beam
from apache_beam.io import filebasedsource
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem
import pyarrow as pa

from pipeline import email_text
from schemas import raw
from schemas import rejected

FORMATS = ('jsonl', 'csv', 'tsv', 'parquet', 'tfrecord', 'text', 'files',
           'email')
_EXTENSION_FORMATS = {
    '.jsonl': 'jsonl', '.ndjson': 'jsonl', '.json': 'jsonl',
    '.csv': 'csv', '.tsv': 'tsv',
    '.parquet': 'parquet', '.pq': 'parquet',
    '.tfrecord': 'tfrecord', '.tfrecords': 'tfrecord',
    '.eml': 'email',
    '.txt': 'text',
}
_COMPRESSION_EXTENSIONS = ('.gz', '.bz2', '.zst', '.deflate', '.lzma', '.xz')
_DESIRED_SPLIT_BYTES = 64 << 20
_FILES_PER_READ = 100


class ReaderError(ValueError):
  """A job-level problem with the input: no files, unknown format."""


@dataclasses.dataclass(frozen=True)
class ReadConfig:
  """How to read records: the format and where text, label, id and split are."""
  format: str = 'auto'
  text_field: str = 'text'
  label_field: Optional[str] = 'label'
  id_field: Optional[str] = 'id'
  split_field: Optional[str] = None
  csv_columns: Optional[Tuple[str, ...]] = None  # None: the first row names them
  csv_delimiter: Optional[str] = None  # None: ',' for csv, tab for tsv
  csv_splittable: bool = False
  encoding: str = 'utf-8'
  max_text_bytes: int = 1 << 20
  keep_fields: Tuple[str, ...] = ()  # passed through as raw.KEPT

  def __post_init__(self):
    if self.csv_delimiter is not None:
      _check_csv_delimiter(self.csv_delimiter)


def _check_csv_delimiter(delimiter: str) -> None:
  """ReaderError unless ``delimiter`` is one character the csv module takes,
  given as itself or as an escape (``\\t``): the csv module would raise
  only once the pipeline reads, as a traceback."""
  try:
    character = codecs.decode(delimiter, 'unicode_escape')
    csv.reader([], delimiter=character)
  except (TypeError, ValueError) as error:  # UnicodeDecodeError is one
    raise ReaderError(f'--csv_delimiter={delimiter!r} is not one character '
                      f'(or an escape such as \\t): {error}') from error
  if character in '\r\n':
    raise ReaderError('--csv_delimiter cannot be a line break')


def add_reader_arguments(parser: argparse.ArgumentParser):
  """The reading flags every job shares."""
  group = parser.add_argument_group('input')
  group.add_argument('--input', required=True,
                     help='File pattern (glob, ** allowed) or folder to read.')
  group.add_argument('--format', default='auto', choices=('auto',) + FORMATS,
                     help='Input format; auto picks it from the extension, '
                     'and a folder is read as one document per file.')
  group.add_argument('--text_field', default='text')
  group.add_argument('--id_field', default='id',
                     help='Field with a record id; records without one get '
                     'source file + position.')
  group.add_argument('--csv_columns', default=None,
                     help='Comma-separated column names for CSV/TSV files '
                     'without a header row.')
  group.add_argument('--csv_delimiter', default=None)
  group.add_argument('--csv_splittable', action='store_true',
                     help='Split CSV files at line boundaries for parallel '
                     'reads; only safe when no quoted field holds a newline.')
  group.add_argument('--encoding', default='utf-8',
                     help='Text encoding of the input; records with bytes '
                     'invalid in it are rejected (emails replace them).')
  group.add_argument('--max_text_bytes', type=int, default=1 << 20,
                     help='Records with more text than this are rejected.')
  return group


def read_config_from_args(args, **overrides) -> ReadConfig:
  values = dict(
      format=args.format,
      text_field=args.text_field,
      id_field=args.id_field or None,
      csv_columns=(tuple(c.strip() for c in args.csv_columns.split(','))
                   if args.csv_columns else None),
      csv_delimiter=args.csv_delimiter,
      csv_splittable=args.csv_splittable,
      encoding=args.encoding,
      max_text_bytes=args.max_text_bytes,
  )
  values.update(overrides)
  return ReadConfig(**values)


def _strip_compression(path: str) -> str:
  for extension in _COMPRESSION_EXTENSIONS:
    if path.endswith(extension):
      return path[:-len(extension)]
  return path


def _is_directory(path: str) -> bool:
  if any(c in path for c in '*?['):
    return False
  if isinstance(FileSystems.get_filesystem(path), LocalFileSystem):
    return os.path.isdir(path)
  # Object stores have no folders, only prefixes that objects share.
  return path.endswith('/') or (not FileSystems.exists(path) and bool(
      FileSystems.match([path.rstrip('/') + '/**'], [1])[0].metadata_list))


def resolve_input(pattern: str, fmt: str) -> Tuple[str, str]:
  """The file pattern and format to read; a folder means every file below it.

  Raises ReaderError when the format is unknown or no file matches, so that
  the job can stop with one clear line before it starts a pipeline.
  """
  if fmt != 'auto' and fmt not in FORMATS:
    raise ReaderError(f'unknown format {fmt!r}; choose one of {FORMATS}')
  if _is_directory(pattern):
    pattern = pattern.rstrip('/') + '/**'
    if fmt == 'auto':
      fmt = 'files'
  try:
    matched = FileSystems.match([pattern])[0].metadata_list
  except Exception as error:  # pylint: disable=broad-except
    raise ReaderError(f'cannot list {pattern}: {error}') from error
  if not matched:
    raise ReaderError(f'no input file matches {pattern}')
  if fmt == 'auto':
    extension = posixpath.splitext(_strip_compression(matched[0].path))[1]
    fmt = _EXTENSION_FORMATS.get(extension.lower())
    if fmt is None:
      raise ReaderError(
          f'cannot tell the format of {matched[0].path} from its extension; '
          f'pass --format (one of {", ".join(FORMATS)})')
  return pattern, fmt


# --------------------------------------------------------------------------
# Record construction


def _snippet(value: Any) -> str:
  if isinstance(value, bytes):
    value = value.decode('utf-8', 'replace')
  elif not isinstance(value, str):
    value = repr(value)
  return value[:rejected.SNIPPET_CHARS]


def _rejection(record_id: str, source: str, reason: str, payload: Any) -> Dict:
  return {raw.ID: record_id, raw.SOURCE: source, raw.REASON: reason,
          raw.SNIPPET: _snippet(payload)}


def _optional_str(value: Any) -> Optional[str]:
  """A label, id or split value as text; None when absent or not a scalar."""
  if value is None or isinstance(value, (bool, float, list, dict)):
    return None
  if isinstance(value, bytes):
    return value.decode('utf-8', 'replace')
  return str(value)


def _record_from_fields(fields: Dict[str, Any], config: ReadConfig,
                        default_id: str, source: str, payload: Any) -> Dict:
  """A record from a row of named fields (JSON object, CSV row, Parquet row)."""
  record_id = _optional_str(fields.get(config.id_field)) if config.id_field else None
  record_id = record_id or default_id
  text = fields.get(config.text_field)
  if text is None:
    return _rejection(record_id, source, rejected.MISSING_TEXT, payload)
  if isinstance(text, bytes):
    try:
      text = text.decode(config.encoding)
    except UnicodeDecodeError:
      return _rejection(record_id, source, rejected.UNDECODABLE_TEXT, payload)
  if not isinstance(text, str):
    return _rejection(record_id, source, rejected.WRONG_TYPE, payload)
  label = fields.get(config.label_field) if config.label_field else None
  if label is not None and _optional_str(label) is None:
    return _rejection(record_id, source, rejected.WRONG_TYPE, payload)
  split = fields.get(config.split_field) if config.split_field else None
  record = {raw.ID: record_id, raw.SOURCE: source, raw.TEXT: text,
            raw.LABEL: _optional_str(label), raw.SPLIT: _optional_str(split)}
  if config.keep_fields:
    record[raw.KEPT] = {name: fields.get(name) for name in config.keep_fields}
  return record


def _split_from_path(path: str) -> Optional[str]:
  """aclImdb layout: <split>/<label>/<file>; the split folder, when named so."""
  grandparent = posixpath.basename(posixpath.dirname(posixpath.dirname(path)))
  return grandparent if grandparent.lower() in raw.SPLIT_ALIASES else None


# --------------------------------------------------------------------------
# Sources


class _RecordSource(filebasedsource.FileBasedSource):
  """A FileBasedSource that yields raw-record dicts for one ReadConfig."""

  def __init__(self, file_pattern, config: ReadConfig, splittable: bool,
               compression_type=CompressionTypes.AUTO):
    super().__init__(file_pattern, compression_type=compression_type,
                     splittable=splittable, validate=False)
    self._config = config


class _LineSource(_RecordSource):
  """Text and JSONL: one record a line, split at line boundaries."""

  def __init__(self, file_pattern, config: ReadConfig, parse=None,
               splittable=True):
    super().__init__(file_pattern, config, splittable=splittable)
    self._parse = parse

  def _lines(self, file_name, range_tracker) -> Iterator[Tuple[int, bytes]]:
    """(offset, line) for each line that starts inside the tracker's range."""
    start = range_tracker.start_position() or 0
    with self.open_file(file_name) as handle:
      if start > 0:
        # A line belongs to the range its first byte is in: skip the partial
        # line the previous range owns.
        handle.seek(start - 1)
        start += len(handle.readline()) - 1
      position = start
      while True:
        line = handle.readline()
        if not line or not range_tracker.try_claim(position):
          return
        yield position, line
        position += len(line)

  def read_records(self, file_name, range_tracker):
    for offset, line in self._lines(file_name, range_tracker):
      line = line.rstrip(b'\r\n')
      if line.strip():  # blank lines separate records; they are not records
        yield self._parse(line, f'{file_name}:{offset}', file_name,
                          self._config)


def _parse_text_line(line: bytes, default_id, source, config) -> Dict:
  try:
    text = line.decode(config.encoding)
  except UnicodeDecodeError:
    return _rejection(default_id, source, rejected.UNDECODABLE_TEXT, line)
  return {raw.ID: default_id, raw.SOURCE: source, raw.TEXT: text,
          raw.LABEL: None, raw.SPLIT: None}


def _parse_json_line(line: bytes, default_id, source, config) -> Dict:
  try:
    fields = json.loads(line.decode(config.encoding))
  except UnicodeDecodeError:
    return _rejection(default_id, source, rejected.UNDECODABLE_TEXT, line)
  except ValueError:
    return _rejection(default_id, source, rejected.MALFORMED_RECORD, line)
  if not isinstance(fields, dict):
    return _rejection(default_id, source, rejected.MALFORMED_RECORD, line)
  return _record_from_fields(fields, config, default_id, source, line)


class _CsvSource(_LineSource):
  """CSV/TSV with the standard csv module; quoted newlines allowed unless split."""

  def __init__(self, file_pattern, config: ReadConfig, delimiter: str):
    super().__init__(file_pattern, config, splittable=config.csv_splittable)
    self._delimiter = delimiter
    # The csv module refuses fields over 128 kB; let giant documents through
    # to be rejected as too long, with their id, rather than as malformed.
    csv.field_size_limit(max(csv.field_size_limit(),
                             4 * config.max_text_bytes + 1))

  def _header(self, file_name):
    with self.open_file(file_name) as handle:
      first = handle.readline()
    return next(csv.reader([first.decode(self._config.encoding, 'replace')],
                           delimiter=self._delimiter), [])

  def read_records(self, file_name, range_tracker):
    config = self._config
    columns = config.csv_columns
    header_offset = None
    if columns is None:
      columns = self._header(file_name)
      header_offset = 0
    lines = self._lines(file_name, range_tracker)
    row_start = [0]

    def decoded_lines():
      for offset, line in lines:
        row_start.append(offset)
        # surrogateescape keeps bad bytes visible so one row is rejected
        # rather than the whole file failing to decode.
        yield line.decode(config.encoding, 'surrogateescape')

    reader = csv.reader(decoded_lines(), delimiter=self._delimiter, strict=True)
    while True:
      mark = len(row_start)
      try:
        row = next(reader)
      except StopIteration:
        return
      except csv.Error as error:
        offset = row_start[mark] if mark < len(row_start) else row_start[-1]
        yield _rejection(f'{file_name}:{offset}', file_name,
                         rejected.MALFORMED_RECORD, str(error))
        continue
      offset = row_start[mark]
      if offset == header_offset or not row:
        continue
      default_id = f'{file_name}:{offset}'
      payload = self._delimiter.join(row)
      if len(row) != len(columns):
        yield _rejection(default_id, file_name, rejected.MALFORMED_RECORD,
                         payload.encode(config.encoding, 'surrogateescape'))
        continue
      if any(_has_surrogates(value) for value in row):
        yield _rejection(default_id, file_name, rejected.UNDECODABLE_TEXT,
                         payload.encode(config.encoding, 'surrogateescape'))
        continue
      yield _record_from_fields(dict(zip(columns, row)), config, default_id,
                                file_name, payload)


def _has_surrogates(value: str) -> bool:
  try:
    value.encode('utf-8')
    return False
  except UnicodeEncodeError:
    return True


class _ParquetSource(_RecordSource):
  """Parquet, split by row group; the position of a row is its row number."""

  def __init__(self, file_pattern, config: ReadConfig):
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

  def read_records(self, file_name, range_tracker):
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    config = self._config
    wanted = list(dict.fromkeys(
        name for name in (config.text_field, config.label_field,
                          config.id_field, config.split_field,
                          *config.keep_fields) if name))
    with self.open_file(file_name) as handle:
      parquet = pq.ParquetFile(handle)
      metadata = parquet.metadata
      first_row = 0
      for index in range(metadata.num_row_groups):
        rows = metadata.row_group(index).num_rows
        offset = self._row_group_offset(metadata, index)
        if offset < (range_tracker.start_position() or 0):
          first_row += rows
          continue
        if not range_tracker.try_claim(offset):
          return
        columns = [c for c in wanted if c in parquet.schema_arrow.names]
        table = parquet.read_row_group(index, columns=columns)
        for row_number, fields in enumerate(table.to_pylist(), first_row):
          yield _record_from_fields(fields, config, f'{file_name}:{row_number}',
                                    file_name, fields)
        first_row += rows


class _TFRecordSource(_RecordSource):
  """TFRecord files of tf.Example; the position of a record is its index."""

  def __init__(self, file_pattern, config: ReadConfig):
    super().__init__(file_pattern, config, splittable=False)

  @staticmethod
  def _records(handle) -> Iterator[Optional[bytes]]:
    """Serialized records; None for a truncated last record."""
    # TFRecord framing: length, crc of length, data, crc of data.
    while True:
      header = handle.read(12)
      if not header:
        return
      if len(header) < 12:
        yield None
        return
      (length,) = struct.unpack('<Q', header[:8])
      data = handle.read(length)
      if len(data) < length or len(handle.read(4)) < 4:
        yield None
        return
      yield data

  def read_records(self, file_name, range_tracker):
    from tensorflow.core.example import example_pb2  # pylint: disable=import-outside-toplevel
    if not range_tracker.try_claim(0):
      return
    config = self._config
    with self.open_file(file_name) as handle:
      for index, serialized in enumerate(self._records(handle)):
        default_id = f'{file_name}:{index}'
        try:
          example = example_pb2.Example.FromString(serialized or b'')
        except Exception:  # pylint: disable=broad-except
          serialized = None
        if serialized is None:
          yield _rejection(default_id, file_name, rejected.MALFORMED_RECORD,
                           b'')
          continue
        fields = {}
        for name, feature in example.features.feature.items():
          kind = feature.WhichOneof('kind')
          values = list(getattr(feature, kind).value) if kind else []
          fields[name] = values[0] if len(values) == 1 else (values or None)
        yield _record_from_fields(fields, config, default_id, file_name,
                                  serialized)


def read_document(path: str, config: ReadConfig, is_email: bool) -> Dict:
  """One document a file (aclImdb, email folders); label = parent folder."""
  with FileSystems.open(path) as handle:
    # One byte past the limit is enough to know the document is too long.
    content = handle.read(config.max_text_bytes + 1)
  if len(content) > config.max_text_bytes:
    return _rejection(path, path, rejected.TEXT_TOO_LONG, content)
  if is_email:
    text = email_text.email_to_text(content)
  else:
    try:
      text = content.decode(config.encoding)
    except UnicodeDecodeError:
      return _rejection(path, path, rejected.UNDECODABLE_TEXT, content)
  return {raw.ID: path, raw.SOURCE: path, raw.TEXT: text,
          raw.LABEL: posixpath.basename(posixpath.dirname(path)) or None,
          raw.SPLIT: _split_from_path(path)}


def _source_factory(fmt: str, config: ReadConfig):
  if fmt == 'jsonl':
    return lambda path: _LineSource(path, config, _parse_json_line)
  if fmt == 'text':
    return lambda path: _LineSource(path, config, _parse_text_line)
  if fmt in ('csv', 'tsv'):
    delimiter = config.csv_delimiter or (',' if fmt == 'csv' else '\t')
    return lambda path: _CsvSource(path, config, codecs.decode(delimiter,
                                                               'unicode_escape'))
  if fmt == 'parquet':
    return lambda path: _ParquetSource(path, config)
  if fmt == 'tfrecord':
    return lambda path: _TFRecordSource(path, config)
  raise ReaderError(f'unknown format {fmt!r}')


_FIELDLESS_FORMATS = ('text', 'files', 'email')
_TYPE_SAMPLE_RECORDS = 1000


def kept_fields_schema(pattern: str, config: ReadConfig) -> pa.Schema:
  """The Arrow types of ``config.keep_fields``, decided before the job runs.

  Parquet files declare them; for the other formats they are inferred from
  the first records of the first file, as pyarrow infers them from Python
  values (JSON numbers as int64 or double, CSV fields as strings). Raises
  ReaderError when the format has no fields or a field has no value there.
  """
  if not config.keep_fields:
    return pa.schema([])
  if config.format in _FIELDLESS_FORMATS:
    raise ReaderError(f'--keep_fields needs named fields; {config.format} '
                      'input has none')
  first = FileSystems.match([pattern])[0].metadata_list[0].path
  if config.format == 'parquet':
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    with FileSystems.open(first) as handle:
      declared = pq.ParquetFile(handle).schema_arrow
    missing = [n for n in config.keep_fields if n not in declared.names]
    if missing:
      raise ReaderError(f'--keep_fields: {first} has no field {missing[0]!r}')
    return pa.schema([declared.field(n) for n in config.keep_fields])
  source = _source_factory(config.format, config)(first)
  sample = []
  for record in source.read(source.get_range_tracker(None, None)):
    if raw.KEPT in record:
      sample.append(record[raw.KEPT])
    if len(sample) == _TYPE_SAMPLE_RECORDS:
      break
  fields = []
  for name in config.keep_fields:
    values = [row[name] for row in sample if row[name] is not None]
    if not values:
      raise ReaderError(f'--keep_fields: no value of {name!r} in the first '
                        f'{_TYPE_SAMPLE_RECORDS} records of {first} to tell '
                        'its type from')
    try:
      arrow_type = pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
      # Mixed types: the first value's type wins, and the job rejects the
      # records whose value does not fit it.
      arrow_type = pa.array(values[:1]).type
    fields.append(pa.field(name, arrow_type))
  return pa.schema(fields)


def conforms(value: Any, arrow_type: pa.DataType) -> bool:
  """Whether a kept value fits the column type decided for it."""
  try:
    pa.array([value], type=arrow_type)
    return True
  except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError,
          OverflowError):
    return False


class ReadRecords(beam.PTransform):
  """Reads raw-record dicts from every file matching a pattern.

  ``pattern`` and ``config.format`` should come from ``resolve_input``.
  """

  def __init__(self, pattern: str, config: ReadConfig):
    super().__init__()
    if config.format not in FORMATS:
      raise ReaderError(f'resolve the format first, not {config.format!r}')
    self._pattern = pattern
    self._fmt = config.format
    self._config = config

  def expand(self, pbegin):
    if self._fmt in ('files', 'email'):
      # A source per file costs a match and a split per file; for many small
      # documents, spreading groups of paths over the workers costs less.
      return (pbegin
              | 'Pattern' >> beam.Create([self._pattern])
              | 'Match' >> fileio.MatchAll()
              | 'Paths' >> beam.Map(lambda metadata: metadata.path)
              | 'Group' >> beam.BatchElements(
                  min_batch_size=_FILES_PER_READ, max_batch_size=_FILES_PER_READ)
              | 'Spread' >> beam.Reshuffle()
              | 'ReadDocuments' >> beam.FlatMap(
                  lambda paths, config, is_email: [
                      read_document(path, config, is_email) for path in paths],
                  self._config, self._fmt == 'email'))
    splittable = self._fmt in ('jsonl', 'text', 'parquet') or (
        self._fmt in ('csv', 'tsv') and self._config.csv_splittable)
    compression = (CompressionTypes.UNCOMPRESSED if self._fmt == 'parquet'
                   else CompressionTypes.AUTO)
    return (pbegin
            | 'Pattern' >> beam.Create([self._pattern])
            | 'ReadFiles' >> filebasedsource.ReadAllFiles(
                splittable=splittable,
                compression_type=compression,
                desired_bundle_size=_DESIRED_SPLIT_BYTES,
                min_bundle_size=0,
                source_from_file=_source_factory(self._fmt, self._config)))
