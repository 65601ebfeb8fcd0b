"""The scoring job's steps around the model: checking what was read and
batching it, and turning what the model answered into Parquet rows."""
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


def rejection(record: Dict, max_text_bytes: int,
              kept_types) -> Optional[Tuple[str, Dict]]:
  """Why the job cannot score a record read, and the record its dead letter
  is made of (for a kept value its column would not hold as it is, a
  snippet naming the field, the value and why); None when it can."""
  reason = records.check_record(record, max_text_bytes, require_label=False)
  if reason:
    return reason, record
  if kept_types:
    misfit = kept_fields.misfit(record[raw.KEPT], kept_types)
    if misfit:
      return rejected.WRONG_TYPE, {**record, raw.SNIPPET: misfit}
  return None


def reason_of(record: Dict, max_text_bytes: int, kept_types) -> Optional[str]:
  """The reason of ``rejection`` alone: the launcher's check of the first
  records before the pipeline starts (``rejections.preflight``)."""
  found = rejection(record, max_text_bytes, kept_types)
  return found[0] if found else None


class _Grouping(records.CountingDoFn):
  """Gathers a bundle's items into groups of at least ``size`` units, one
  output element a group, and the rest at the bundle's end: one Beam
  element a group, not a document, between the steps that follow."""

  def __init__(self, size: int):
    super().__init__(NAMESPACE)
    self._size = size

  def start_bundle(self):
    super().start_bundle()
    self._items, self._units = [], 0

  def _add(self, item, units: int = 1):
    """The group ``item`` completes, if it completes one; else None."""
    self._items.append(item)
    self._units += units
    return self._take() if self._units >= self._size else None

  def _take(self):
    items, self._items, self._units = self._items, [], 0
    return self._group(items)

  def _group(self, items: list):
    return items

  def finish_bundle(self):
    yield from super().finish_bundle()
    if self._items:
      yield GlobalWindows.windowed_value(self._take())


class Validate(_Grouping):
  """Chunks of records read (``ReadRecords(chunked=True)``) -> every
  record counted, bad ones to the dead letters, good ones on in batches
  (lists) of ``batch_size``, which the model step takes whole
  (``inference.RawTextModelHandler``)."""

  def __init__(self, max_text_bytes: int, kept_types, batch_size: int):
    super().__init__(batch_size)
    self._max_text_bytes = max_text_bytes
    self._kept_types = kept_types  # (input field, Arrow type) pairs

  def process(self, chunk):
    self.count_read(chunk)
    for record in chunk:
      found = rejection(record, self._max_text_bytes, self._kept_types)
      if found:
        reason, letter = found
        yield self.reject(letter, reason)
        continue
      batch = self._add(record)
      if batch:
        yield batch


class ToArrow(_Grouping):
  """Prediction results (a batch each) -> tables of the Parquet schema,
  each of at least ``rows_per_table`` documents but the bundle's last (each
  a row group of the output); a document the model failed on -> a dead
  letter.

  Columns, not a row dict a document: Beam's row-wise Parquet sink would
  build a dict a document only to take it apart again into columns.
  """

  def __init__(self, schema: pa.Schema, label_names: Sequence[str],
               model_version: int, kept: Tuple[Tuple[str, str], ...],
               confidence_edges: Sequence[float], rows_per_table: int):
    super().__init__(rows_per_table)
    self._schema = schema
    self._probability_columns = scored.probability_columns(label_names)
    self._model_version = model_version
    self._kept = kept
    self._edges = confidence_edges

  def process(self, result: PredictionResult):
    batch, answers = result.example, result.inference
    for index in answers.failed:
      yield self.reject(batch[index], rejected.INFERENCE_FAILED)
    documents = answers.scored(batch)
    if not documents:
      return
    self._count(answers)
    table = self._add(self._table(documents, answers), len(documents))
    if table:
      yield table

  def _count(self, answers: inference.Answers) -> None:
    self.count_written(len(answers.labels))
    for label, count in collections.Counter(answers.labels.tolist()).items():
      self.count_label(SCORED, label.decode('utf-8'), count)
    bins = np.bincount(drift.confidence_bins(answers.confidences, self._edges))
    for index, count in enumerate(bins.tolist()):
      if count:
        self.count_bin(CONFIDENCE, index, count)

  def _table(self, documents: Sequence[Dict],
             answers: inference.Answers) -> pa.Table:
    count = len(documents)
    columns = {
        scored.ID: [record[raw.ID] for record in documents],
        scored.LABEL: answers.labels,
        scored.CONFIDENCE: answers.confidences,
        scored.MODEL_VERSION: np.full(count, self._model_version, np.int64),
        # One time a batch: when the model answered it.
        scored.SCORED_AT: np.full(count, np.datetime64(
            answers.scored_at.replace(tzinfo=None), 'us')),
        **dict(zip(self._probability_columns, answers.probabilities.T)),
    }
    arrays = {name: pa.array(values, type=self._schema.field(name).type)
              for name, values in columns.items()}
    for field, column in self._kept:
      # The conversion Validate checked each value with: a value it would
      # change never reaches this, and would stop the job if it did.
      arrays[column] = kept_fields.column(
          [record[raw.KEPT][field] for record in documents],
          self._schema.field(column).type)
    return pa.Table.from_arrays([arrays[field.name] for field in self._schema],
                                schema=self._schema)

  def _group(self, items: list) -> pa.Table:
    # A chunk a batch: the Parquet writer still makes one row group of it.
    return pa.concat_tables(items)
