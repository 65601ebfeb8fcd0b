"""The n-gram statistics: how many train documents of each class hold each
n-gram, counted on the workers and written beside the TFRecords
(``schemas.transformed``'s NGRAM_ names). The trainer's n-gram branch reads
them instead of counting, and each minimum document count it tries is a
threshold over the same counts.

They are counted from the transformed train batches in the pass that writes
them, by the fingerprints the branch looks up (``serving.ngrams``): the
n-grams of exactly the token ids the trainer reads, truncation and
out-of-vocabulary ids included. Not by a tensorflow-transform analyzer:
the token ids exist only once the token vocabulary is known, so an
analyzer of them would be a second analysis phase over the train records,
which a local runner holds in memory between phases.

Each batch's documents by n-gram and label are summed on its worker, split
by the fingerprints' top bits into shards, which a Beam combiner sums
apart: a distributed runner spreads them, and a worker holds a shard's
sums, not the corpus's. Each shard then writes its n-grams in
transformed.NGRAM_MIN_DOCUMENTS documents or more, sorted by fingerprint.
"""
import typing
from typing import Iterable, List

import apache_beam as beam
import numpy as np
import pyarrow as pa
import tensorflow as tf
from tfx_bsl.coders import example_coder

from pipeline import records
from pipeline import tfrecords
from pipeline.preprocessing.splits import NAMESPACE
from schemas import transformed
from serving import ngrams

# Shards of the fingerprints' range (their top bits), summed apart.
_SHARD_BITS = 8
# Rows a record of the statistics holds at most.
_RUN = 16_384
# The histogram (``records.Tally.bins``) of the n-grams kept by order.
KEPT_BY_ORDER = 'ngrams_kept'


class Counted(typing.NamedTuple):
  """Distinct n-grams, sorted, with the documents of each label holding
  each and its order."""
  keys: np.ndarray       # int64 [n-grams] fingerprints
  documents: np.ndarray  # int32 [n-grams, labels]: by label id
  orders: np.ndarray     # int8 [n-grams]

  def __len__(self):
    return len(self.keys)


def summed(parts: List[Counted]) -> Counted:
  """One row a distinct n-gram of ``parts``, their documents added."""
  width = max(part.documents.shape[1] for part in parts)
  keys = np.concatenate([part.keys for part in parts])
  # Sorted runs, one a part: a stable sort merges them.
  order = np.argsort(keys, kind='stable')
  keys = keys[order]
  starts = np.flatnonzero(_firsts(keys))
  documents = np.concatenate([
      np.pad(part.documents, [(0, 0), (0, width - part.documents.shape[1])])
      for part in parts])[order]
  return Counted(keys[starts],
                 np.add.reduceat(documents, starts, axis=0) if len(starts)
                 else documents,
                 np.concatenate([part.orders for part in parts])[order][starts])


def _firsts(keys: np.ndarray) -> np.ndarray:
  """Which values of the sorted ``keys`` start a run of equal ones."""
  first = np.ones(len(keys), bool)
  first[1:] = keys[1:] != keys[:-1]
  return first


def document_ngrams(token_ids: np.ndarray, fingerprints):
  """The distinct n-grams of each document (row) of ``token_ids``: their
  fingerprints, the row each is in, and its order. ``fingerprints(ids)``:
  ``ngrams.ngram_fingerprints`` of each order, compiled."""
  keys, rows, orders = [], [], []
  for order, found in enumerate(fingerprints(token_ids), start=1):
    values = np.sort(found.numpy(), axis=1)
    present = values != ngrams.NO_NGRAM
    present[:, 1:] &= values[:, 1:] != values[:, :-1]
    row, _ = np.nonzero(present)
    keys.append(values[present])
    rows.append(row)
    orders.append(np.full(len(row), order, np.int8))
  return np.concatenate(keys), np.concatenate(rows), np.concatenate(orders)


def counted_documents(keys: np.ndarray, labels: np.ndarray,
                      orders: np.ndarray) -> Counted:
  """(n-gram, label of a document holding it) pairs, with each n-gram's
  order -> their Counted."""
  order = np.argsort(keys)
  keys = keys[order]
  first = _firsts(keys)
  starts = np.flatnonzero(first)
  ngram_of_pair = np.cumsum(first) - 1
  width = int(labels.max(initial=0)) + 1
  documents = np.bincount(ngram_of_pair * width + labels[order],
                          minlength=len(starts) * width)
  return Counted(keys[starts],
                 documents.astype(np.int32).reshape(len(starts), width),
                 orders[order][starts])


class CountBatch(beam.DoFn):
  """Transformed record batches of train -> (shard, Counted): each
  n-gram's documents by label, summed over the batch."""

  def setup(self):
    self._fingerprints = tf.function(
        lambda token_ids: [ngrams.ngram_fingerprints(token_ids, order)
                           for order in range(
                               1, transformed.NGRAM_MAX_ORDER + 1)],
        input_signature=[tf.TensorSpec([None, None], tf.int64)])

  def process(self, batch_and_passthrough):
    batch, _ = batch_and_passthrough
    if not batch.num_rows:
      return
    token_ids = batch.column(transformed.TOKEN_IDS).flatten().to_numpy(
    ).reshape(batch.num_rows, -1)
    # Padding only ever follows the tokens: the columns no row uses go.
    longest = max(int((token_ids != transformed.PAD_ID).sum(axis=1).max()), 1)
    labels = batch.column(transformed.LABEL_ID).flatten().to_numpy()
    keys, rows, orders = document_ngrams(
        tf.constant(token_ids[:, :longest], tf.int64), self._fingerprints)
    if not len(keys):  # no document of the batch has a token
      return
    counted = counted_documents(keys, labels[rows], orders)
    shards = counted.keys >> (ngrams.FINGERPRINT_BITS - _SHARD_BITS)
    bounds = np.flatnonzero(np.diff(shards)) + 1
    for start, end in zip(np.concatenate([[0], bounds]),
                          np.concatenate([bounds, [len(shards)]])):
      yield int(shards[start]), Counted(*(column[start:end]
                                          for column in counted))


class SumCounted(beam.CombineFn):
  """A shard's Counted batches (one or more) -> their sum. Batches wait in
  a list and are summed once the others hold as many rows as the largest:
  each row is merged a few times, not once a batch."""

  def create_accumulator(self):
    return []

  def add_input(self, accumulator, counted):
    accumulator.append(counted)
    return self._settled(accumulator)

  def merge_accumulators(self, accumulators):
    return self._settled([counted for accumulator in accumulators
                          for counted in accumulator])

  def compact(self, accumulator):
    return [summed(accumulator)] if len(accumulator) > 1 else accumulator

  def extract_output(self, accumulator):
    return summed(accumulator)

  @staticmethod
  def _settled(accumulator):
    if len(accumulator) < 2:
      return accumulator
    largest = max(map(len, accumulator))
    if sum(map(len, accumulator)) - largest >= largest:
      return [summed(accumulator)]
    return accumulator


def _list_column(runs: Iterable[np.ndarray]) -> pa.Array:
  runs = list(runs)
  offsets = np.concatenate([[0], np.cumsum([len(run) for run in runs])])
  return pa.LargeListArray.from_arrays(
      pa.array(offsets, pa.int64()),
      pa.array(np.concatenate(runs).astype(np.int64), pa.int64()))


class EncodeFrequent(records.CountingDoFn):
  """(shard, Counted) -> the serialized tf.Examples of its n-grams in
  transformed.NGRAM_MIN_DOCUMENTS documents or more, a run of rows each;
  the n-grams kept by order to the STATS output."""

  def __init__(self):
    super().__init__(NAMESPACE)

  def setup(self):
    self._encoder = example_coder.RecordBatchToExamplesEncoder()

  def process(self, shard_counted):
    _, counted = shard_counted
    frequent = (counted.documents.sum(axis=1) >=
                transformed.NGRAM_MIN_DOCUMENTS)
    for order, count in zip(*np.unique(counted.orders[frequent],
                                       return_counts=True)):
      self.count_bin(KEPT_BY_ORDER, int(order), int(count))
    if not frequent.any():
      return
    # One row a (kept n-gram, label of documents holding it), in order.
    ngram, label = np.nonzero(counted.documents[frequent])
    columns = {
        transformed.NGRAM_FINGERPRINT: counted.keys[frequent][ngram],
        transformed.NGRAM_ORDER: counted.orders[frequent][ngram],
        transformed.NGRAM_LABEL_ID: label,
        transformed.NGRAM_DOCUMENTS: counted.documents[frequent][ngram, label],
    }
    run_starts = range(0, len(ngram), _RUN)
    batch = pa.RecordBatch.from_arrays(
        [_list_column(values[start:start + _RUN] for start in run_starts)
         for values in columns.values()], names=list(columns))
    yield self._encoder.encode(batch)


class CountNgrams(beam.PTransform):
  """The transformed batches of train -> the n-gram statistics' files under
  ``prefix``; returns the count dicts (the n-grams kept by order) for
  WriteCounts."""

  def __init__(self, prefix: str):
    super().__init__()
    self._prefix = prefix

  def expand(self, train_batches):
    encoded = (train_batches
               | 'CountNgrams' >> beam.ParDo(CountBatch())
               | 'SumNgramCounts' >> beam.CombinePerKey(SumCounted())
               | 'EncodeFrequentNgrams' >> beam.ParDo(
                   EncodeFrequent()).with_outputs(records.STATS,
                                                  main='examples'))
    _ = encoded.examples | 'WriteNgrams' >> tfrecords.WriteTFRecordBatches(
        self._prefix, file_name_suffix=transformed.TFRECORD_SUFFIX)
    return encoded[records.STATS]
