"""One Beam ``FileBasedSource`` a file format, yielding raw records.

Large files are split into byte ranges read in parallel where the format
allows it; nothing is loaded whole into memory.
"""
import codecs
import csv
import json
import struct
from typing import Dict, Iterator, Optional, Tuple

from apache_beam.io import filebasedsource
from apache_beam.io.filesystem import CompressionTypes

from pipeline.readers import config as config_lib
from pipeline.readers import rows
from schemas import raw
from schemas import rejected


class _RecordSource(filebasedsource.FileBasedSource):
  """A FileBasedSource that yields raw-record dicts for one ReadConfig."""

  def __init__(self, file_pattern, config: config_lib.ReadConfig,
               splittable: bool, compression_type=CompressionTypes.AUTO):
    super().__init__(file_pattern, compression_type=compression_type,
                     splittable=splittable, validate=False)
    self._config = config


class LineSource(_RecordSource):
  """Text and JSONL: one record a line, split at line boundaries."""

  def __init__(self, file_pattern, config: config_lib.ReadConfig, parse=None,
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


def parse_text_line(line: bytes, default_id, source, config) -> Dict:
  try:
    text = line.decode(config.encoding)
  except UnicodeDecodeError:
    return rows.rejection(default_id, source, rejected.UNDECODABLE_TEXT, line)
  return {raw.ID: default_id, raw.SOURCE: source, raw.TEXT: text,
          raw.LABEL: None, raw.SPLIT: None}


def parse_json_line(line: bytes, default_id, source, config) -> Dict:
  try:
    fields = json.loads(line.decode(config.encoding))
  except UnicodeDecodeError:
    return rows.rejection(default_id, source, rejected.UNDECODABLE_TEXT, line)
  except ValueError:
    return rows.rejection(default_id, source, rejected.MALFORMED_RECORD, line)
  if not isinstance(fields, dict):
    return rows.rejection(default_id, source, rejected.MALFORMED_RECORD, line)
  return rows.record_from_fields(fields, config, default_id, source, line)


class CsvSource(LineSource):
  """CSV/TSV with the standard csv module; quoted newlines allowed unless split."""

  def __init__(self, file_pattern, config: config_lib.ReadConfig,
               delimiter: str):
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
        yield rows.rejection(f'{file_name}:{offset}', file_name,
                             rejected.MALFORMED_RECORD, str(error))
        continue
      offset = row_start[mark]
      if offset == header_offset or not row:
        continue
      default_id = f'{file_name}:{offset}'
      payload = self._delimiter.join(row)
      if len(row) != len(columns):
        yield rows.rejection(default_id, file_name, rejected.MALFORMED_RECORD,
                             payload.encode(config.encoding, 'surrogateescape'))
        continue
      if any(rows.has_surrogates(value) for value in row):
        yield rows.rejection(default_id, file_name, rejected.UNDECODABLE_TEXT,
                             payload.encode(config.encoding, 'surrogateescape'))
        continue
      yield rows.record_from_fields(dict(zip(columns, row)), config,
                                    default_id, file_name, payload)


class ParquetSource(_RecordSource):
  """Parquet, split by row group; the position of a row is its row number."""

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
        row_count = metadata.row_group(index).num_rows
        offset = self._row_group_offset(metadata, index)
        if offset < (range_tracker.start_position() or 0):
          first_row += row_count
          continue
        if not range_tracker.try_claim(offset):
          return
        columns = [c for c in wanted if c in parquet.schema_arrow.names]
        table = parquet.read_row_group(index, columns=columns)
        for row_number, fields in enumerate(table.to_pylist(), first_row):
          yield rows.record_from_fields(fields, config,
                                        f'{file_name}:{row_number}',
                                        file_name, fields)
        first_row += row_count


class TFRecordSource(_RecordSource):
  """TFRecord files of tf.Example; the position of a record is its index."""

  def __init__(self, file_pattern, config: config_lib.ReadConfig):
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
          yield rows.rejection(default_id, file_name,
                               rejected.MALFORMED_RECORD, b'')
          continue
        fields = {}
        for name, feature in example.features.feature.items():
          kind = feature.WhichOneof('kind')
          values = list(getattr(feature, kind).value) if kind else []
          fields[name] = values[0] if len(values) == 1 else (values or None)
        yield rows.record_from_fields(fields, config, default_id, file_name,
                                      serialized)


def source_factory(fmt: str, config: config_lib.ReadConfig):
  """A function from a file path to the source that reads it as ``fmt``."""
  if fmt == 'jsonl':
    return lambda path: LineSource(path, config, parse_json_line)
  if fmt == 'text':
    return lambda path: LineSource(path, config, parse_text_line)
  if fmt in ('csv', 'tsv'):
    delimiter = config.csv_delimiter or (',' if fmt == 'csv' else '\t')
    return lambda path: CsvSource(path, config, codecs.decode(
        delimiter, 'unicode_escape'))
  if fmt == 'parquet':
    return lambda path: ParquetSource(path, config)
  if fmt == 'tfrecord':
    return lambda path: TFRecordSource(path, config)
  raise config_lib.ReaderError(f'unknown format {fmt!r}')
