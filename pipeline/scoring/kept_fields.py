"""The types of the fields the scoring job passes through (--keep_fields).

The output's Parquet schema must be fixed before the job runs, so the types
are read from the input here, once, on the launcher.
"""
from typing import Any, List

from apache_beam.io.filesystems import FileSystems
import pyarrow as pa

from pipeline import readers
from schemas import raw

_FIELDLESS_FORMATS = ('text', 'files', 'email')
_TYPE_SAMPLE_RECORDS = 1000


def schema(pattern: str, config: readers.ReadConfig) -> pa.Schema:
  """The Arrow types of ``config.keep_fields``, decided before the job runs.

  Parquet files declare them (files that declare different types of one
  field get the type both fit, or an error); for the other formats they are
  inferred from the input's first records (files in sorted order), as
  pyarrow infers them from Python values (JSON numbers as int64 or double,
  CSV fields as strings). Raises ReaderError when the format has no fields
  or a field has no value there.
  """
  if not config.keep_fields:
    return pa.schema([])
  if config.format in _FIELDLESS_FORMATS:
    raise readers.ReaderError(f'--keep_fields needs named fields; '
                              f'{config.format} input has none')
  paths = readers.matched_files(pattern)
  if config.format == 'parquet':
    return _declared_schema(paths, config)
  sample = [record[raw.KEPT] for record in readers.sample(
      pattern, config, _TYPE_SAMPLE_RECORDS) if raw.KEPT in record]
  fields = []
  for name in config.keep_fields:
    values = [row[name] for row in sample if row[name] is not None]
    if not values:
      raise readers.ReaderError(
          f'--keep_fields: no value of {name!r} in the first '
          f'{_TYPE_SAMPLE_RECORDS} records of {pattern} to tell its type '
          'from')
    try:
      arrow_type = pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
      # Mixed types: the first value's type wins, and the job rejects the
      # records whose value does not fit it.
      arrow_type = pa.array(values[:1]).type
    fields.append(pa.field(name, arrow_type))
  return pa.schema(fields)


def _declared_schema(paths: List[str],
                     config: readers.ReadConfig) -> pa.Schema:
  """The kept fields' types as the Parquet files declare them: the type
  every file's declaration fits."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  declared = []
  for path in paths:
    try:
      with FileSystems.open(path) as handle:
        file_schema = pq.ParquetFile(handle).schema_arrow
    except Exception as error:  # pylint: disable=broad-except
      raise readers.ReaderError(
          f'--keep_fields: cannot read the schema of {path}: {error}'
      ) from error
    missing = [n for n in config.keep_fields if n not in file_schema.names]
    if missing:
      raise readers.ReaderError(
          f'--keep_fields: {path} has no field {missing[0]!r}')
    declared.append(pa.schema([file_schema.field(n).with_nullable(True)
                               for n in config.keep_fields]))
  try:
    return pa.unify_schemas(declared, promote_options='permissive')
  except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
    raise readers.ReaderError(
        f'--keep_fields: the Parquet files declare different types of a '
        f'kept field that no one type fits: {error}') from error


def conforms(value: Any, arrow_type: pa.DataType) -> bool:
  """Whether a kept value fits the column type decided for it."""
  try:
    pa.array([value], type=arrow_type)
    return True
  except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError,
          OverflowError):
    return False
