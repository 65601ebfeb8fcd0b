"""Scored documents: the Parquet files and the manifest the scoring job writes.

One row a scored document. The probability of each class has a column of its
own, so that a SQL user reads any class's probability without a join or a
second file: ``probability_<label>``. Fields passed through with
``--keep_fields`` follow, with the types they had in the input, under their
own names or those ``--keep_fields=field:column`` gives them.
"""
import re
from typing import List

import pyarrow as pa

from schemas import raw
from schemas import serving

ID = raw.ID
LABEL = serving.LABEL
CONFIDENCE = serving.CONFIDENCE
MODEL_VERSION = 'model_version'
SCORED_AT = 'scored_at'
PROBABILITY_PREFIX = 'probability_'

# Beside the data, every name starts with ``_`` (the manifest, the
# ``_SUCCESS`` marker, the dead letters' folder) so that dataset readers
# (pyarrow, pandas, Spark, Hive) skip it and see only Parquet rows.
MANIFEST_FILE = '_manifest.json'
# The partition's score distributions beside the model's, as a picture.
REPORT_FILE = '_report.png'
# The data files: part-SSSSS-of-NNNNN.parquet.
FILE_SUFFIX = '.parquet'
FILE_PREFIX = 'part'
FILE_PATTERN = f'{FILE_PREFIX}-*{FILE_SUFFIX}'


def probability_column(label_name: str) -> str:
  """A label's probability column, named so that SQL needs no quoting:
  lower case, letters and digits of any script kept, runs of anything else
  as ``_``; a label of none of those (emoji) by its code points."""
  name = re.sub(r'[\W_]+', '_', label_name.lower()).strip('_')
  return PROBABILITY_PREFIX + (
      name or '_'.join(f'u{ord(char):x}' for char in label_name) or 'blank')


def probability_columns(label_names: List[str]) -> List[str]:
  columns = [probability_column(name) for name in label_names]
  if len(set(columns)) != len(columns):
    raise ValueError(f'labels {label_names} give clashing column names '
                     f'{columns}')
  return columns


def _output_fields(label_names: List[str]) -> List[pa.Field]:
  return [
      pa.field(ID, pa.string(), nullable=False),
      pa.field(LABEL, pa.string(), nullable=False),
      pa.field(CONFIDENCE, pa.float32(), nullable=False),
      *(pa.field(column, pa.float32(), nullable=False)
        for column in probability_columns(label_names)),
      pa.field(MODEL_VERSION, pa.int64(), nullable=False),
      pa.field(SCORED_AT, pa.timestamp('us', tz='UTC'), nullable=False),
  ]


def output_columns(label_names: List[str]) -> List[str]:
  """The columns the job writes for a model's labels, before kept fields."""
  return [field.name for field in _output_fields(label_names)]


def arrow_schema(label_names: List[str], kept: pa.Schema) -> pa.Schema:
  """The Parquet schema for a model's labels and the kept input fields.

  Raises ValueError when labels give clashing column names or a kept field
  has the name of an output column.
  """
  fields = _output_fields(label_names)
  taken = {field.name for field in fields}
  clashes = [name for name in kept.names if name in taken]
  if clashes:
    raise ValueError(f'kept field {clashes[0]!r} has the name of an output '
                     'column')
  return pa.schema(fields + list(kept))
