"""The scoring job's per-document steps around the model: checking what
was read, and turning what the model answered into Parquet rows."""
import collections
from typing import Dict, Optional, Sequence, Tuple

from apache_beam.ml.inference.base import PredictionResult
from apache_beam.transforms.window import GlobalWindows
import numpy as np
import pyarrow as pa

from pipeline import records
from pipeline.scoring import inference
from pipeline.scoring import kept_fields
from schemas import raw
from schemas import rejected
from schemas import scored
from serving import drift

NAMESPACE = 'score'
# The Tally names of the partition's predicted labels and confidence bins.
SCORED = 'scored'
CONFIDENCE = 'confidence'
# ToArrow's column of each document's probabilities, before it becomes a
# column a label.
_PROBABILITIES = 'probabilities'


def reason_of(record: Dict, max_text_bytes: int, kept_types) -> Optional[str]:
  """Why the job cannot score a record read, or None when it can:
  ``Validate``'s check, and the launcher's before the pipeline starts."""
  reason = records.check_record(record, max_text_bytes, require_label=False)
  if not reason and not all(
      kept_fields.conforms(record[raw.KEPT][name], arrow_type)
      for name, arrow_type in kept_types):
    reason = rejected.WRONG_TYPE
  return reason


class Validate(records.CountingDoFn):
  """Counts every record read; bad ones go to the dead letters."""

  def __init__(self, max_text_bytes: int, kept_types):
    super().__init__(NAMESPACE)
    self._max_text_bytes = max_text_bytes
    self._kept_types = kept_types  # (input field, Arrow type) pairs

  def process(self, record):
    self.count_read(record)
    reason = reason_of(record, self._max_text_bytes, self._kept_types)
    if reason:
      yield self.reject(record, reason)
    else:
      yield record


class ToArrow(records.CountingDoFn):
  """Prediction results -> tables of the Parquet schema, one every
  ``rows_per_table`` documents and one at the bundle's end (each a row group
  of the output); a document the model failed on -> a dead letter.

  Columns, not a row dict a document: Beam's row-wise Parquet sink would
  build a dict a document only to take it apart again into columns.
  """

  def __init__(self, schema: pa.Schema, label_names: Sequence[str],
               model_version: int, kept: Tuple[Tuple[str, str], ...],
               confidence_edges: Sequence[float], rows_per_table: int):
    super().__init__(NAMESPACE)
    self._schema = schema
    self._probability_columns = scored.probability_columns(label_names)
    self._model_version = model_version
    self._kept = kept
    self._edges = confidence_edges
    self._rows_per_table = rows_per_table

  def start_bundle(self):
    super().start_bundle()
    self._columns = collections.defaultdict(list)

  def process(self, result: PredictionResult):
    record, scores = result.example, result.inference
    if isinstance(scores, inference.InferenceFailed):
      yield self.reject(record, rejected.INFERENCE_FAILED)
      return
    self.count_written()
    self.count_label(SCORED, scores.label)
    self.count_bin(CONFIDENCE, drift.confidence_bin(scores.confidence,
                                                    self._edges))
    columns = self._columns
    columns[scored.ID].append(record[raw.ID])
    columns[scored.LABEL].append(scores.label)
    columns[scored.CONFIDENCE].append(scores.confidence)
    columns[_PROBABILITIES].append(scores.probabilities)
    columns[scored.SCORED_AT].append(scores.scored_at)
    for field, column in self._kept:
      columns[column].append(record[raw.KEPT][field])
    if len(columns[scored.ID]) >= self._rows_per_table:
      yield self._table()

  def finish_bundle(self):
    yield from super().finish_bundle()
    if self._columns[scored.ID]:
      yield GlobalWindows.windowed_value(self._table())

  def _table(self) -> pa.Table:
    columns, self._columns = self._columns, collections.defaultdict(list)
    count = len(columns[scored.ID])
    probabilities = np.array(columns.pop(_PROBABILITIES), np.float32).reshape(
        count, len(self._probability_columns))
    columns[scored.MODEL_VERSION] = np.full(count, self._model_version,
                                            np.int64)
    by_name = dict(zip(self._probability_columns, probabilities.T))
    arrays = [pa.array(by_name[field.name] if field.name in by_name
                       else columns[field.name], type=field.type)
              for field in self._schema]
    return pa.Table.from_arrays(arrays, schema=self._schema)
