"""The scoring job's per-document steps around the model: checking what
was read, and turning what the model answered into Parquet rows."""
from typing import Dict, Optional, Sequence, Tuple

from apache_beam.ml.inference.base import PredictionResult

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


class ToRows(records.CountingDoFn):
  """Prediction results -> rows of the Parquet schema; a document the model
  failed on -> a dead letter."""

  def __init__(self, label_names: Sequence[str], model_version: int,
               kept: Tuple[Tuple[str, str], ...],
               confidence_edges: Sequence[float]):
    super().__init__(NAMESPACE)
    self._columns = scored.probability_columns(label_names)
    self._model_version = model_version
    self._kept = kept
    self._edges = confidence_edges

  def process(self, result: PredictionResult):
    record, scores = result.example, result.inference
    if isinstance(scores, inference.InferenceFailed):
      yield self.reject(record, rejected.INFERENCE_FAILED)
      return
    self.count_written()
    self.count_label(SCORED, scores.label)
    self.count_bin(CONFIDENCE, drift.confidence_bin(scores.confidence,
                                                    self._edges))
    row: Dict = {
        scored.ID: record[raw.ID],
        scored.LABEL: scores.label,
        scored.CONFIDENCE: scores.confidence,
        scored.MODEL_VERSION: self._model_version,
        scored.SCORED_AT: scores.scored_at,
    }
    row.update(zip(self._columns, scores.probabilities))
    for field, column in self._kept:
      row[column] = record[raw.KEPT][field]
    yield row
