"""The preprocessing job's output, as the trainer needs it."""
import dataclasses
import gzip
import hashlib
import json
import logging
import os
import posixpath
import struct
import zlib
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

import cli
from schemas import raw
from schemas import transformed


def fingerprint_of(data_dir: str) -> str:
  """A digest of every file's path, size and modification time in
  ``data_dir``: a republished output has new files, so another digest."""
  digest = hashlib.sha256()
  for folder, _, names in sorted(tf.io.gfile.walk(data_dir)):
    for name in sorted(names):
      path = posixpath.join(folder, name)
      stat = tf.io.gfile.stat(path)
      digest.update(json.dumps([posixpath.relpath(path, data_dir), stat.length,
                                stat.mtime_nsec]).encode())
  return digest.hexdigest()


@dataclasses.dataclass
class PreprocessedData:
  """Everything the trainer learns from a preprocessing output folder."""
  data_dir: str
  tft_output: tft.TFTransformOutput
  params: Dict
  stats: Dict
  label_names: List[str]
  vocab_size: int
  max_len: int
  # What the folder held when the trainer began to read it.
  fingerprint: str = ''
  # The records of each split file, as ``load`` counted them.
  file_records: Dict[str, int] = dataclasses.field(default_factory=dict)

  @classmethod
  def load(cls, data_dir: str) -> 'PreprocessedData':
    """The output in ``data_dir``, checked whole before any training: a
    JobError naming what is missing or unreadable otherwise."""
    # First, so that whatever is read after is checked against it.
    fingerprint = fingerprint_of(data_dir)
    _check_parts(data_dir)
    params = _read_json(data_dir, transformed.PARAMS_FILE)
    stats = _read_json(data_dir, transformed.STATS_FILE)
    _check_counts(data_dir, stats)
    max_len = _field(params, 'transform', 'max_len')
    if not (isinstance(max_len, int) and max_len > 0):
      raise _incomplete(data_dir, f'{transformed.PARAMS_FILE} has no '
                        'transform.max_len')
    tft_output = tft.TFTransformOutput(data_dir)
    try:
      tft_output.transformed_feature_spec()
      label_names = [name.decode('utf-8') for name in tft_output
                     .vocabulary_by_name(transformed.LABEL_VOCABULARY)]
      vocab_size = (tft_output.vocabulary_size_by_name(
          transformed.TOKEN_VOCABULARY) + transformed.NUM_RESERVED_IDS)
    except (OSError, ValueError, tf.errors.OpError) as error:
      raise _incomplete(data_dir, str(error)) from error
    _check_graph_matches(data_dir, stats, label_names, vocab_size)
    data = cls(data_dir=data_dir, tft_output=tft_output, params=params,
               stats=stats, label_names=label_names, vocab_size=vocab_size,
               max_len=max_len, fingerprint=fingerprint)
    data._check_split_files()
    data._check_records()
    return data

  def check_unchanged(self) -> None:
    """A JobError if the folder changed since ``load``: a preprocessing run
    published into it, so the model may have been trained on one output and
    evaluated, or exported with the transform graph, of another."""
    if fingerprint_of(self.data_dir) != self.fingerprint:
      raise cli.JobError(
          f'{self.data_dir} changed while the trainer read it (a '
          'preprocessing run published into it?): what was trained, '
          'exported and evaluated may come from different outputs, so '
          'nothing was published; train again')

  def _check_split_files(self) -> None:
    """A JobError for a split that stats.json counts but no file holds."""
    missing = [
        f'no {transformed.split_file_pattern(split)} for the '
        f'{self.num_examples(split)} {split} records stats.json counts'
        for split in raw.SPLITS
        if self.num_examples(split) and not self.files(split)]
    if missing:
      raise _incomplete(self.data_dir, '; '.join(missing))

  def _check_records(self) -> None:
    """A JobError for a split file that cannot be read whole (cut short,
    corrupt), or a split whose files hold another number of records than
    stats.json counts: the trainer sizes its folds, schedule and shuffle
    on that count, and reads the files many times over. Counting is one
    pass without parsing (a few seconds for IMDB's 50,000 reviews)."""
    for split in raw.SPLITS:
      held = 0
      for path in self.files(split):
        try:
          self.file_records[path] = count_records(path)
          held += self.file_records[path]
        except (ValueError, OSError, EOFError, zlib.error,
                tf.errors.OpError) as error:
          raise _incomplete(self.data_dir, f'{path} cannot be read whole '
                            f'({error})') from error
      if held != self.num_examples(split):
        raise _incomplete(
            self.data_dir, f'its {split} files hold {held} records, but '
            f'{transformed.STATS_FILE} counts {self.num_examples(split)}')

  def files(self, split: str) -> List[str]:
    return sorted(tf.io.gfile.glob(posixpath.join(
        self.data_dir, transformed.split_file_pattern(split))))

  def feature_spec(self, split: str, names=None) -> Dict:
    spec = self.tft_output.transformed_feature_spec()
    if split == raw.TRAIN:
      for name in transformed.HELD_OUT_ONLY:
        spec.pop(name, None)
    if names is not None:
      spec = {name: spec[name] for name in names}
    return spec

  def num_examples(self, split: str) -> int:
    return self.stats['records']['written'][split]


def count_records(path: str) -> int:
  """The records of a gzip TFRecord file, by their length prefixes (a
  record is its length, 8 bytes little-endian, a 4-byte checksum, the data
  and another checksum); ValueError where the file ends inside one."""
  count = 0
  with tf.io.gfile.GFile(path, 'rb') as stored, gzip.GzipFile(
      fileobj=stored) as records:
    while True:
      header = records.read(12)
      if not header:
        return count
      length = struct.unpack('<Q', header[:8])[0] if len(header) == 12 else 0
      if len(header) < 12 or len(records.read(length + 4)) < length + 4:
        raise ValueError(f'it ends inside record {count + 1}')
      count += 1


# What a preprocessing output holds beside its TFRecords, and what each is.
_PARTS = {
    'transform_fn/': 'the TFT transform graph',
    'transformed_metadata/': 'the schema of the TFRecords',
    transformed.STATS_FILE: 'the record counts',
    transformed.PARAMS_FILE: 'the transform parameters',
}


def _incomplete(data_dir: str, what: str) -> cli.JobError:
  return cli.JobError(f'{data_dir} is not a complete preprocessing output: '
                      f'{what}; run pipeline.preprocess into it again')


def _check_parts(data_dir: str) -> None:
  if not tf.io.gfile.isdir(data_dir):
    raise cli.JobError(f'{data_dir} is not a preprocessing output: no such '
                       'folder')
  missing = [f'{name} ({what})' for name, what in _PARTS.items()
             if not tf.io.gfile.exists(posixpath.join(data_dir,
                                                      name.rstrip('/')))]
  if missing:
    raise _incomplete(data_dir, 'no ' + ', no '.join(missing))


def _read_json(data_dir: str, name: str):
  try:
    with tf.io.gfile.GFile(posixpath.join(data_dir, name)) as handle:
      return json.load(handle)
  except (ValueError, tf.errors.OpError) as error:
    raise _incomplete(data_dir, f'{name} is not readable JSON '
                      f'({error})') from error


def _field(document, *keys):
  """``document[key][key]…`` of a parsed JSON file; None where a level is
  missing or not an object."""
  for key in keys:
    document = document.get(key) if isinstance(document, dict) else None
  return document


def _check_counts(data_dir: str, stats) -> None:
  """stats.json must count every split's records: the trainer sizes its
  cache, shuffle and schedule on them."""
  written = _field(stats, 'records', 'written')
  if not (isinstance(written, dict) and all(
      isinstance(written.get(split), int) and written[split] >= 0
      for split in raw.SPLITS)):
    raise _incomplete(data_dir, f'{transformed.STATS_FILE} has no '
                      'records.written count for each of '
                      f'{", ".join(raw.SPLITS)}')


def _check_graph_matches(data_dir: str, stats, label_names: List[str],
                         vocab_size: int) -> None:
  """The transform graph's vocabularies must be those stats.json was
  written from: a graph of another run (copied in, or one run's files over
  another's) numbers the labels or the tokens otherwise than the records,
  and a model trained on them answers wrong labels."""
  counted = _field(stats, 'labels', 'names')
  if counted != label_names:
    raise _incomplete(data_dir, f'its transform graph\'s labels, '
                      f'{label_names}, are not the {counted} '
                      f'{transformed.STATS_FILE} counts: they are of '
                      'different runs')
  if _field(stats, 'vocabulary_size') != vocab_size:
    raise _incomplete(data_dir, f'its transform graph\'s token vocabulary, '
                      f'{vocab_size} ids, is not the '
                      f'{_field(stats, "vocabulary_size")} '
                      f'{transformed.STATS_FILE} counts: they are of '
                      'different runs')


# --cache: 'memory' keeps a split parsed in memory after the first epoch,
# 'none' reads its TFRecords again every epoch, 'auto' is memory when the
# split fits the budget.
CACHE_POLICIES = ('auto', 'memory', 'none')
# The default budget: this share of the memory available when training
# starts, leaving the rest to the model, TensorFlow and the shuffle buffer.
CACHE_MEMORY_SHARE = 0.25
# And at most this, whatever the machine. Within it the cache spares every
# epoch after the first its parse (36 s of 124 in two epochs on IMDB); a
# million documents' train split (3.6 GB parsed) cached saved no time and
# more than doubled the trainer's peak, so a split past it streams and the
# peak stops growing with the corpus (BENCHMARKS.md, "Memory").
CACHE_MAX_BYTES = 2**30
# Bytes per example beside the token ids: the label id and tf.data's
# per-element overhead.
_EXAMPLE_OVERHEAD_BYTES = 256
_MAX_SHUFFLE_BUFFER = 50000
_MIN_SHUFFLE_BUFFER = 1024


def available_memory() -> int:
  """Bytes of memory available to this process now, as the system says."""
  try:
    import psutil  # pylint: disable=import-outside-toplevel
    return psutil.virtual_memory().available
  except ImportError:  # not a dependency: the plain count then
    pages = (os.sysconf('SC_AVPHYS_PAGES') if 'SC_AVPHYS_PAGES' in
             os.sysconf_names else os.sysconf('SC_PHYS_PAGES'))
    return pages * os.sysconf('SC_PAGE_SIZE')


def cache_budget(share: float) -> int:
  """The bytes a split may take cached: ``share`` of the memory available
  now, at most CACHE_MAX_BYTES."""
  return int(min(share * available_memory(), CACHE_MAX_BYTES))


def parsed_bytes(data: PreprocessedData, splits: Sequence[str]) -> int:
  """What ``splits`` take parsed in memory, from ``stats.json``'s counts:
  each example's max_len int64 token ids and a little more."""
  return sum(data.num_examples(split) for split in splits) * _example_bytes(
      data)


def _example_bytes(data: PreprocessedData) -> int:
  return data.max_len * tf.int64.size + _EXAMPLE_OVERHEAD_BYTES


def cache_in_memory(policy: str, data: PreprocessedData,
                    splits: Sequence[str], budget: int) -> bool:
  """Whether to cache ``splits`` in memory under ``policy`` (one of
  CACHE_POLICIES) and a budget of ``budget`` bytes."""
  if policy not in CACHE_POLICIES:
    raise ValueError(f'cache must be one of {CACHE_POLICIES}, not {policy!r}')
  if policy != 'auto':
    return policy == 'memory'
  size = parsed_bytes(data, splits)
  cached = size <= budget
  logging.info('train: the %s split%s ~%.0f MB parsed, %s the cache budget '
               'of %.0f MB: %s', ' + '.join(splits), ' takes' if len(splits)
               == 1 else 's take', size / 2**20, 'within' if cached else
               'over', budget / 2**20, 'cached in memory' if cached else
               'read from its files every epoch')
  return cached


def shuffle_buffer(data: PreprocessedData, count: int, budget: int) -> int:
  """Examples a shuffle of ``count`` holds: all of them, or what the budget
  allows, but at most 50,000 and at least 1,024 (a budget too small for
  that many would not train a model either)."""
  return min(count, _MAX_SHUFFLE_BUFFER,
             max(_MIN_SHUFFLE_BUFFER, budget // _example_bytes(data)))


def dataset(data: PreprocessedData, split: str, batch_size: int,
            shuffle: bool = False, seed: int = None,
            feature: str = transformed.TOKEN_IDS, cache: bool = True,
            drop_remainder: bool = False, bucket_width: int = 0,
            buffer_size: int = _MAX_SHUFFLE_BUFFER) -> tf.data.Dataset:
  """Batches of (feature, label_id) from one split's gzip TFRecords.

  ``cache`` keeps the parsed split in memory after the first pass; a split
  of 25,000 reviews of 200 ids is 40 MB (``cache_in_memory`` decides).
  Without it, every pass reads the files again, interleaved, in a new order
  each pass when shuffled; the shuffle holds at most ``buffer_size``
  examples either way.

  With ``bucket_width``, each batch holds documents of similar length and is
  cut to the longest of them, rounded up to a multiple of the width (see
  ``length_buckets``); the feature must then be the token ids.
  """
  files = _serialized(data, (split,))
  paths = tf.data.Dataset.from_tensor_slices(files)
  if shuffle and not cache:
    paths = paths.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
  records = _interleaved(paths, lambda path: tf.data.TFRecordDataset(
      path, compression_type='GZIP'), len(files))
  parsed = records.batch(1024).map(
      _parse(data, (feature, transformed.LABEL_ID), split),
      num_parallel_calls=tf.data.AUTOTUNE).unbatch()
  if cache:
    parsed = parsed.cache()
  if shuffle:
    parsed = parsed.shuffle(min(data.num_examples(split), buffer_size),
                            seed=seed, reshuffle_each_iteration=True)
  examples = parsed.map(lambda example: (example[feature],
                                         example[transformed.LABEL_ID]))
  if bucket_width and feature != transformed.TOKEN_IDS:
    raise ValueError('length buckets batch token ids only')
  # stats.json counts the split, so a pass's batches are known.
  return batched(examples, data.num_examples(split), batch_size,
                 drop_remainder, bucket_width)


def batched(examples: tf.data.Dataset, count: int, batch_size: int,
            drop_remainder: bool, bucket_width: int) -> tf.data.Dataset:
  """Batches of ``examples`` (token ids, label), ``count`` of them; by
  length buckets with ``bucket_width``."""
  if bucket_width:
    batches = length_buckets(examples, batch_size, bucket_width,
                             drop_remainder)
  else:
    batches = examples.batch(batch_size, drop_remainder=drop_remainder)
    # Keras, told how many batches a pass has, no longer finds where the
    # first epoch ends by running out of data, and warning that it did. A
    # split whose files hold another count fails at the end of its first
    # pass.
    batches = batches.apply(tf.data.experimental.assert_cardinality(
        count // batch_size if drop_remainder else -(-count // batch_size)))
  return batches.prefetch(tf.data.AUTOTUNE)


def _serialized(data: PreprocessedData, splits: Sequence[str]) -> List[str]:
  """The files of ``splits``, one split's after another's."""
  files = [path for split in splits for path in data.files(split)]
  if not files:
    raise FileNotFoundError(f'no {" or ".join(splits)} files in '
                            f'{data.data_dir}')
  return files


def _parse(data: PreprocessedData, names: Sequence[str],
           split: str = raw.TRAIN):
  """Batches of serialized records -> the features ``names`` of ``split``
  (by default those every split holds: the train split's)."""
  spec = data.feature_spec(split, names)
  return lambda batch: tf.io.parse_example(batch, spec)


def _interleaved(sources: tf.data.Dataset, read, files: int
                 ) -> tf.data.Dataset:
  """The records ``read`` gives of each of ``sources`` (a split's files, in
  the order a pass takes them), a few files read at once."""
  return sources.interleave(read, cycle_length=min(4, files),
                            num_parallel_calls=tf.data.AUTOTUNE,
                            deterministic=True)


def in_file_order(data: PreprocessedData, splits: Sequence[str],
                  names: Sequence[str]) -> tf.data.Dataset:
  """The records of ``splits``, one split after another, each in its files'
  order: batches of up to 1,024, parsed to the features ``names``. The
  order rows are numbered in where the trainer picks records by row (the
  folds, ``of_rows``)."""
  return tf.data.TFRecordDataset(
      _serialized(data, splits), compression_type='GZIP').batch(1024).map(
          _parse(data, names), num_parallel_calls=tf.data.AUTOTUNE,
          deterministic=True)


def _numbered(data: PreprocessedData, splits: Sequence[str],
              shuffle_files: bool, seed: int) -> tf.data.Dataset:
  """(row, serialized record) of every record of ``splits``, rows numbered
  as ``in_file_order`` reads them; with ``shuffle_files``, the files read
  in a new order each pass, interleaved, as ``dataset`` reads a split."""
  files = _serialized(data, splits)
  if not shuffle_files:
    return tf.data.TFRecordDataset(files, compression_type='GZIP').enumerate()
  starts = np.cumsum([0] + [data.file_records[path] for path in files[:-1]])
  return _interleaved(
      tf.data.Dataset.from_tensor_slices((files, starts)).shuffle(
          len(files), seed=seed, reshuffle_each_iteration=True),
      lambda path, start: tf.data.TFRecordDataset(
          path, compression_type='GZIP').enumerate(start), len(files))


def of_rows(data: PreprocessedData, splits: Sequence[str],
            rows: Optional[np.ndarray], batch_size: int,
            shuffle: bool = False, seed: int = None, cache: bool = False,
            drop_remainder: bool = False, bucket_width: int = 0,
            buffer_size: int = _MAX_SHUFFLE_BUFFER,
            numbered: bool = False) -> tf.data.Dataset:
  """Batches of (token ids, label id) of the records of ``splits`` at
  ``rows`` (sorted, numbered as ``in_file_order`` reads them; None: every
  one), read from the files and picked before they are parsed, so that
  what a fold trains on or holds out is never held in memory beyond
  ``cache``'s choice and the shuffle's ``buffer_size``. With ``numbered``,
  each label id comes with its record's row: (token ids, (label id, row)).

  A shuffle that holds every record reads the files in order: its batches
  are then those of the same records held in memory and shuffled by the
  same seed. One that cannot, uncached, reads the files in a new order
  each pass, interleaved, as ``dataset`` does.
  """
  total = sum(data.num_examples(split) for split in splits)
  count = total if rows is None else len(rows)
  buffer_size = min(count, buffer_size)
  records = _numbered(data, splits, shuffle and not cache and
                      buffer_size < count, seed)
  if rows is not None:
    kept = np.zeros(total, bool)
    kept[rows] = True
    kept = tf.constant(kept)
    records = records.filter(lambda row, _: tf.gather(kept, row))
  parse = _parse(data, [transformed.TOKEN_IDS, transformed.LABEL_ID])
  records = records.batch(1024).map(
      lambda rows, batch: (rows, parse(batch)),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
  if cache:
    records = records.cache()
  if shuffle:
    records = records.shuffle(buffer_size, seed=seed,
                              reshuffle_each_iteration=True)
  examples = records.map(
      lambda row, example: (example[transformed.TOKEN_IDS],
                            (example[transformed.LABEL_ID], row) if numbered
                            else example[transformed.LABEL_ID]))
  return batched(examples, count, batch_size, drop_remainder, bucket_width)


def length_buckets(examples: tf.data.Dataset, batch_size: int, width: int,
                   drop_remainder: bool) -> tf.data.Dataset:
  """Batches of similar-length documents, cut to a multiple of ``width``.

  Most documents are much shorter than max_len (IMDB: median 177 tokens of
  400), and the model masks padding, so cutting it away changes no
  prediction while saving most of the attention's quadratic cost. Rounding
  to a multiple of ``width`` keeps the number of distinct batch shapes, and
  so of XLA compilations, small.
  """
  def cut(token_ids, label):
    length = tf.reduce_sum(tf.cast(token_ids != transformed.PAD_ID, tf.int32))
    # Padding only ever follows the tokens, so a prefix keeps them all.
    bucket = tf.minimum((length + width - 1) // width * width,
                        tf.shape(token_ids)[0])
    return token_ids[:tf.maximum(bucket, 1)], label

  return examples.map(cut).group_by_window(
      key_func=lambda token_ids, _: tf.cast(tf.shape(token_ids)[0], tf.int64),
      reduce_func=lambda _, window: window.batch(
          batch_size, drop_remainder=drop_remainder),
      window_size=batch_size)
