"""The fields the scoring job passes through (--keep_fields): their types,
and the one conversion of a kept value into its column.

The output's Parquet schema must be fixed before the job runs, so the types
are read from the input here, once, on the launcher. Each value is then
converted by ``column``, both where records are checked before the model
and where the Parquet rows are made after it.
"""
import io
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from apache_beam.io.filesystems import FileSystems
import pyarrow as pa

from pipeline import readers
from schemas import raw
from schemas import rejected

_FIELDLESS_FORMATS = ('text', 'files', 'email')
_TYPE_SAMPLE_RECORDS = 1000
# What pyarrow raises on a Python value that it cannot convert.
_CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError,
                      OverflowError)


def schema(matched: readers.Input, config: readers.ReadConfig,
           sampled: int = _TYPE_SAMPLE_RECORDS) -> pa.Schema:
  """The Arrow types of ``config.keep_fields``, decided before the job runs.

  Parquet files declare them (files that declare different types of one
  field get the type both fit, or an error); for the other formats they are
  inferred from the input's first ``sampled`` records (files in sorted
  order), as pyarrow infers them from Python values (JSON numbers as int64
  or double, CSV fields as strings). Raises ReaderError when the format has
  no fields or a field has no value there of a type Parquet can hold.
  """
  if not config.keep_fields:
    return pa.schema([])
  if config.format in _FIELDLESS_FORMATS:
    raise readers.ReaderError(f'--keep_fields needs named fields; '
                              f'{config.format} input has none')
  if config.format == 'parquet':
    return _declared_schema(matched.files, config)
  sample = [record[raw.KEPT] for record in readers.sample(
      matched, config, sampled) if raw.KEPT in record]
  fields = []
  for name in config.keep_fields:
    values = [row[name] for row in sample if row[name] is not None]
    if not values:
      raise readers.ReaderError(
          f'--keep_fields: no value of {name!r} in the first '
          f'{sampled} records of {matched.pattern} to tell its type from')
    arrow_type = _inferred_type(values)
    if arrow_type is None:
      raise readers.ReaderError(
          f'--keep_fields: no value of {name!r} in the first '
          f'{sampled} records of {matched.pattern} has a type that Parquet '
          f'can hold (such as {values[0]!r:.200})')
    fields.append(pa.field(name, arrow_type))
  return pa.schema(fields)


def _inferred_type(values: List[Any]) -> Optional[pa.DataType]:
  """The type pyarrow infers for all ``values``; when they have none that
  Parquet can hold (mixed types, an integer beyond 64 bits, objects with
  no member), the first value's that has one, and the job rejects the
  records whose value does not fit it; None when no value has one."""
  for candidates in [values] + [[value] for value in values]:
    try:
      arrow_type = pa.array(candidates).type
    except _CONVERSION_ERRORS:
      continue
    if _parquet_holds(arrow_type):
      return arrow_type
  return None


def _parquet_holds(arrow_type: pa.DataType) -> bool:
  """Whether Parquet has a column for ``arrow_type`` (none for an object
  with no members)."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  try:
    pq.write_table(pa.schema([('kept', arrow_type)]).empty_table(),
                   io.BytesIO())
    return True
  except pa.ArrowException:
    return False


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


class Misfit(ValueError):
  """A kept value that its column would not hold as it is."""


def column(values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array:
  """Kept values as a column of ``arrow_type``: the one conversion of kept
  values, for the check before the model (``misfit``) and the Parquet rows
  after it, so that the two cannot disagree.

  pyarrow converts Python values unsafely (-2.5 into an int64 column is -2,
  an object's key that its struct has no field for is dropped), so every
  value is read back from the column and compared with the one given; a
  Misfit names the first that pyarrow refuses or would change. Two things
  are the same value, not a change: a whole number as the column's kind of
  number (2.0 in an int64 column is 2: JSON has one kind of number), and an
  object's absent key as null (Parquet cannot tell them apart).
  """
  try:
    array = pa.array(values, type=arrow_type)
    stored = array.to_pylist()
  except _CONVERSION_ERRORS as error:
    raise Misfit(f'does not fit {arrow_type}: {error}') from error
  for given, kept in zip(values, stored):
    if not _same(given, kept):
      raise Misfit(f'would be stored as {kept!r} in its {arrow_type} '
                   'column')
  return array


def misfit(kept: Dict[str, Any],
           kept_types: Sequence[Tuple[str, pa.DataType]]) -> Optional[str]:
  """What is wrong with the first kept value that its column would not hold
  as it is (the field, the value, why), for its dead letter; None when
  every one fits."""
  for name, arrow_type in kept_types:
    try:
      column([kept[name]], arrow_type)
    except Misfit as error:
      return f'--keep_fields {name}={kept[name]!r}: {error}'[
          :rejected.SNIPPET_CHARS]
  return None


def _same(given: Any, stored: Any) -> bool:
  """Whether ``stored``, read back from a column, is the value ``given``."""
  if given is None or stored is None:
    return given is stored
  if isinstance(given, dict):
    return isinstance(stored, dict) and all(
        _same(given.get(key), stored.get(key))
        for key in given.keys() | stored.keys())
  if isinstance(given, (list, tuple)):
    return (isinstance(stored, (list, tuple)) and len(given) == len(stored)
            and all(map(_same, given, stored)))
  if isinstance(given, bool) or isinstance(stored, bool):
    return type(given) is type(stored) and given == stored
  if isinstance(given, float) and math.isnan(given):
    return isinstance(stored, float) and math.isnan(stored)
  return given == stored
