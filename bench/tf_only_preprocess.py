"""Baseline for bench/preprocess.py: the job's work in TensorFlow alone, as
fast as one process does it.

Reads an aclImdb tree or a JSONL file (``id``, ``text``, ``label`` and
``split`` fields), sends each record to train, validation or test as the
job does (``splits.assign_split``), learns the token and label vocabularies
on train alone with the job's tokenizer and in TFT's order (most frequent
first, ties by the larger token), and writes each split as gzip TFRecords
of the tf.Examples the job writes: ``token_ids`` (looked up, truncated and
padded by the job's own functions), ``length``, ``label_id``, ``id``, and
the raw ``text`` in the held-out splits. Tokenizing, counting, looking up
and truncating are TF ops on large batches in tf.data pipelines, JSON is
parsed by Arrow, the Examples are encoded a batch at a time by tfx_bsl (as
the job encodes them), and the files are compressed on threads of their
own. What it leaves out of the job's work: record checks, dead letters,
stats and the transform graph.

    python bench/tf_only_preprocess.py --input=PATH --output_dir=DIR
        [--vocab_size=20000] [--max_len=200] [--validation_fraction=0.1]
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from cli import quiet  # pylint: disable=unused-import,g-bad-import-order
import argparse
import collections
import concurrent.futures
import posixpath

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import tensorflow as tf
from tfx_bsl.coders import example_coder

from pipeline import transform
from pipeline.preprocessing import splits as split_lib
from schemas import raw
from schemas import transformed

# Documents a TF batch: large enough that TF's per-call cost vanishes.
_BATCH = 8192
# Batches encoded and waiting for the writer thread at most.
_QUEUED = 4
# Tokens TFT leaves out of a text vocabulary file: '' and line breaks.
_UNWRITABLE_TOKEN = r'|\C*[\n\r]\C*'


def read_jsonl(path: str) -> dict:
  """The file's columns as Python lists, parsed by Arrow's JSON reader."""
  table = pa_json.read_json(path)
  return {name: table.column(name).to_pylist()
          for name in (raw.ID, raw.TEXT, raw.LABEL, raw.SPLIT)}


def read_tree(root: str) -> dict:
  """An aclImdb-style tree, <split>/<label>/<file>, as the job reads it: the
  id is the file's path."""
  columns = {raw.ID: [], raw.TEXT: [], raw.LABEL: [], raw.SPLIT: []}
  for path in sorted(tf.io.gfile.glob(posixpath.join(root, '*', '*', '*'))):
    with tf.io.gfile.GFile(path, 'rb') as handle:
      text = handle.read().decode('utf-8').removeprefix('\ufeff')
    label_dir = posixpath.dirname(path)
    columns[raw.ID].append(path)
    columns[raw.TEXT].append(text)
    columns[raw.LABEL].append(posixpath.basename(label_dir))
    columns[raw.SPLIT].append(posixpath.basename(posixpath.dirname(label_dir)))
  return columns


def route(columns: dict, validation_fraction: float) -> dict:
  """Split name -> (ids, texts, labels), as numpy arrays."""
  chosen = np.array([
      split_lib.assign_split(text, named, 0.0, validation_fraction)
      for text, named in zip(columns[raw.TEXT], columns[raw.SPLIT])])
  arrays = [np.array(columns[name], dtype=object)
            for name in (raw.ID, raw.TEXT, raw.LABEL)]
  return {split: tuple(array[chosen == split] for array in arrays)
          for split in raw.SPLITS}


def in_tft_order(values: np.ndarray, counts: np.ndarray, top_k=None) -> list:
  """The ``top_k`` most frequent values, as TFT orders a vocabulary: by
  count, then by value, both descending."""
  if top_k is not None and len(counts) > top_k:
    # Only the values as frequent as the k-th can be in the top k.
    candidates = counts >= np.partition(counts, -top_k)[-top_k]
    values, counts = values[candidates], counts[candidates]
  ranked = sorted(zip(counts.tolist(), values.tolist()), reverse=True)
  return [value for _, value in ranked[:top_k]]


def token_vocabulary(texts: np.ndarray, params: transform.TransformParams):
  """The train tokens in TFT's order, counted a batch at a time in TF."""
  @tf.function
  def count(batch):
    tokens = transform.tokenize(batch, params.max_token_chars,
                                params.keep_punctuation).flat_values
    tokens = tokens[~tf.strings.regex_full_match(tokens, _UNWRITABLE_TOKEN)]
    unique, _, counts = tf.unique_with_counts(tokens, out_idx=tf.int64)
    return unique, counts

  batches = list(tf.data.Dataset.from_tensor_slices(texts).batch(_BATCH).map(
      count, num_parallel_calls=tf.data.AUTOTUNE))
  unique, where, _ = tf.unique_with_counts(tf.concat([u for u, _ in batches],
                                                     0), out_idx=tf.int64)
  counts = tf.math.unsorted_segment_sum(tf.concat([c for _, c in batches], 0),
                                        where, tf.size(unique, tf.int64))
  return in_tft_order(unique.numpy(), counts.numpy(),
                      params.vocab_size - transformed.NUM_RESERVED_IDS)


def vectorizer(vocabulary: list, params: transform.TransformParams):
  """texts -> (token_ids [batch, max_len], lengths), as the job's graph."""
  table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
      tf.constant(vocabulary, tf.string),
      tf.range(transformed.NUM_RESERVED_IDS,
               transformed.NUM_RESERVED_IDS + len(vocabulary),
               dtype=tf.int64)), default_value=transformed.OOV_ID)

  @tf.function
  def vectorize(batch):
    tokens = transform.tokenize(batch, params.max_token_chars,
                                params.keep_punctuation)
    ids = transform.truncate(tf.ragged.map_flat_values(table.lookup, tokens),
                             params.max_len, params.truncation)
    return (ids.to_tensor(default_value=transformed.PAD_ID,
                          shape=[None, params.max_len]),
            tokens.row_lengths())
  return vectorize


def one_per_row(values: pa.Array) -> pa.LargeListArray:
  """A scalar feature as the Arrow list column tfx_bsl encodes."""
  return pa.LargeListArray.from_arrays(
      pa.array(np.arange(len(values) + 1, dtype=np.int64)), values)


def example_batch(token_ids, lengths, label_ids, ids, texts) -> pa.RecordBatch:
  """One batch of the job's features; ``texts`` None in train."""
  width = token_ids.shape[1]
  columns = {
      transformed.TOKEN_IDS: pa.LargeListArray.from_arrays(
          pa.array(np.arange(0, (len(token_ids) + 1) * width, width,
                             dtype=np.int64)), pa.array(token_ids.ravel())),
      transformed.LENGTH: one_per_row(pa.array(lengths)),
      transformed.LABEL_ID: one_per_row(pa.array(label_ids)),
      transformed.ID: one_per_row(pa.array(ids, pa.large_string()).cast(
          pa.large_binary())),
  }
  if texts is not None:
    columns[transformed.TEXT] = one_per_row(pa.array(
        texts, pa.large_string()).cast(pa.large_binary()))
  return pa.RecordBatch.from_pydict(columns)


def write_records(file, records) -> None:
  for record in records:
    file.write(record)


def write_split(path: str, split_rows: tuple, label_ids: np.ndarray,
                vectorize, with_text: bool) -> int:
  """Vectorizes, encodes and writes one split; returns its record count.

  tf.data vectorizes the next batches on TF's threads while this thread
  encodes one, and a thread of its own compresses and writes the last.
  """
  ids, texts, _ = split_rows
  vectorized = tf.data.Dataset.from_tensor_slices(texts).batch(
      _BATCH).map(vectorize, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
  encoder = example_coder.RecordBatchToExamplesEncoder()
  options = tf.io.TFRecordOptions(compression_type='GZIP')
  with tf.io.TFRecordWriter(path, options) as file, (
      concurrent.futures.ThreadPoolExecutor(1)) as writer:
    pending = collections.deque()
    for start, (token_ids, lengths) in zip(range(0, len(ids), _BATCH),
                                           vectorized):
      end = start + _BATCH
      records = encoder.encode(example_batch(
          token_ids.numpy(), lengths.numpy(), label_ids[start:end],
          ids[start:end], texts[start:end] if with_text else None))
      if len(pending) == _QUEUED:
        pending.popleft().result()  # bounds the batches held in memory
      pending.append(writer.submit(write_records, file, records))
    for future in pending:
      future.result()
  return len(ids)


def label_ids_of(labels: np.ndarray, vocabulary: list) -> np.ndarray:
  index = {label: position for position, label in enumerate(vocabulary)}
  return np.array([index[label] for label in labels], dtype=np.int64)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--input', required=True)
  parser.add_argument('--output_dir', required=True)
  parser.add_argument('--vocab_size', type=int, default=20000)
  parser.add_argument('--max_len', type=int, default=200)
  parser.add_argument('--validation_fraction', type=float, default=0.1)
  args = parser.parse_args()
  params = transform.TransformParams(vocab_size=args.vocab_size,
                                     max_len=args.max_len)
  columns = (read_jsonl(args.input) if args.input.endswith('.jsonl')
             else read_tree(args.input))
  by_split = route(columns, args.validation_fraction)
  _, train_texts, train_labels = by_split[raw.TRAIN]
  tokens = token_vocabulary(train_texts, params)
  labels = in_tft_order(*np.unique(train_labels,
                                   return_counts=True))
  tf.io.gfile.makedirs(args.output_dir)
  # Vocabulary files as TFT writes them, for bench/preprocess.py to compare.
  for name, entries in ((transformed.TOKEN_VOCABULARY, tokens),
                        (transformed.LABEL_VOCABULARY,
                         [label.encode('utf-8') for label in labels])):
    with tf.io.gfile.GFile(posixpath.join(args.output_dir, name), 'wb') as out:
      out.write(b''.join(entry + b'\n' for entry in entries))
  vectorize = vectorizer(tokens, params)
  for split, split_rows in by_split.items():
    written = write_split(
        posixpath.join(args.output_dir,
                       f'{split}-00000-of-00001{transformed.TFRECORD_SUFFIX}'),
        split_rows, label_ids_of(split_rows[2], labels), vectorize,
        with_text=split != raw.TRAIN)
    print(f'{split}: {written} examples')
  print(f'vocabulary {len(tokens) + transformed.NUM_RESERVED_IDS}, '
        f'labels {labels}, wrote {args.output_dir}')


if __name__ == '__main__':
  main()
