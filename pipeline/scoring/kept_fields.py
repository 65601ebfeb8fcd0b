"""The types of the fields the scoring job passes through (--keep_fields).

The output's Parquet schema must be fixed before the job runs, so the types
are read from the input here, once, on the launcher.
"""
from typing import Any

from apache_beam.io.filesystems import FileSystems
import pyarrow as pa

from pipeline import readers
from pipeline.readers import sources
from schemas import raw

_FIELDLESS_FORMATS = ('text', 'files', 'email')
_TYPE_SAMPLE_RECORDS = 1000


def schema(pattern: str, config: readers.ReadConfig) -> pa.Schema:
  """The Arrow types of ``config.keep_fields``, decided before the job runs.

  Parquet files declare them; for the other formats they are inferred from
  the first records of the first file, as pyarrow infers them from Python
  values (JSON numbers as int64 or double, CSV fields as strings). Raises
  ReaderError when the format has no fields or a field has no value there.
  """
  if not config.keep_fields:
    return pa.schema([])
  if config.format in _FIELDLESS_FORMATS:
    raise readers.ReaderError(f'--keep_fields needs named fields; '
                              f'{config.format} input has none')
  first = FileSystems.match([pattern])[0].metadata_list[0].path
  if config.format == 'parquet':
    return _declared_schema(first, config)
  source = sources.source_factory(config.format, config)(first)
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
      raise readers.ReaderError(
          f'--keep_fields: no value of {name!r} in the first '
          f'{_TYPE_SAMPLE_RECORDS} records of {first} to tell its type from')
    try:
      arrow_type = pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
      # Mixed types: the first value's type wins, and the job rejects the
      # records whose value does not fit it.
      arrow_type = pa.array(values[:1]).type
    fields.append(pa.field(name, arrow_type))
  return pa.schema(fields)


def _declared_schema(path: str, config: readers.ReadConfig) -> pa.Schema:
  """The kept fields' types as a Parquet file declares them."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  with FileSystems.open(path) as handle:
    declared = pq.ParquetFile(handle).schema_arrow
  missing = [n for n in config.keep_fields if n not in declared.names]
  if missing:
    raise readers.ReaderError(
        f'--keep_fields: {path} has no field {missing[0]!r}')
  return pa.schema([declared.field(n) for n in config.keep_fields])


def conforms(value: Any, arrow_type: pa.DataType) -> bool:
  """Whether a kept value fits the column type decided for it."""
  try:
    pa.array([value], type=arrow_type)
    return True
  except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError,
          OverflowError):
    return False
