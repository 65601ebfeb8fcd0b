"""Raw records as TFT reads them, and transformed batches as tf.Examples."""
from typing import Dict, List

import apache_beam as beam
import numpy as np
import pyarrow as pa
from tensorflow_transform.tf_metadata import schema_utils
from tfx_bsl.coders import example_coder
from tfx_bsl.tfxio import tensor_adapter
from tfx_bsl.tfxio import tensor_representation_util

from pipeline import records
from pipeline.preprocessing.splits import NAMESPACE
from schemas import raw
from schemas import transformed

# Records a batch of the transform.
_BATCH_SIZE = 4000


def to_record_batch(rows: List[Dict]) -> pa.RecordBatch:
  """Raw records as the Arrow batch TFT's tensor adapter reads."""
  offsets = pa.array(np.arange(len(rows) + 1, dtype=np.int64))
  columns = []
  for name in raw.RAW_FEATURE_SPEC:
    values = pa.array([r[name].encode('utf-8', 'replace') for r in rows],
                      type=pa.large_binary())
    columns.append(pa.LargeListArray.from_arrays(offsets, values))
  return pa.RecordBatch.from_arrays(columns, schema=raw.RAW_ARROW_SCHEMA)


def raw_tensor_adapter_config() -> tensor_adapter.TensorAdapterConfig:
  schema = schema_utils.schema_from_feature_spec(raw.RAW_FEATURE_SPEC)
  return tensor_adapter.TensorAdapterConfig(
      raw.RAW_ARROW_SCHEMA,
      tensor_representation_util.InferTensorRepresentationsFromSchema(schema))


class EncodeExamples(records.CountingDoFn):
  """Transformed record batches -> lists of serialized tf.Examples + stats."""

  def __init__(self, split: str):
    super().__init__(NAMESPACE)
    self._split = split
    self._dropped = transformed.HELD_OUT_ONLY if split == raw.TRAIN else []

  def setup(self):
    self._encoder = example_coder.RecordBatchToExamplesEncoder()

  def process(self, batch_and_passthrough):
    batch, _ = batch_and_passthrough
    batch = batch.drop_columns(self._dropped)
    self.count_written(batch.num_rows, self._split)
    lengths = batch.column(transformed.LENGTH).flatten().to_numpy()
    self.count_lengths({int(length): int(count) for length, count in zip(
        *np.unique(lengths, return_counts=True))})
    yield self._encoder.encode(batch)


def to_arrow_batches(split_records, split: str):
  return (split_records
          | f'Batch{split}' >> beam.BatchElements(
              min_batch_size=_BATCH_SIZE, max_batch_size=_BATCH_SIZE)
          | f'ToArrow{split}' >> beam.Map(to_record_batch))


