"""N-grams of token ids: the fingerprints that name them wherever they are
counted or looked up, and the n-gram statistics as the preprocessing job
wrote them.

The preprocessing job counts the train split's n-grams by these
fingerprints (``pipeline.preprocessing.ngram_counts``) and the trainer's
n-gram branch looks them up by the same ones, inside the model and so
inside the export (``trainer.ngrams``): one definition, here, in plain
TensorFlow ops, which XLA compiles and Beam's workers run without the
trainer.

Each n-gram (unigrams included) is named by a 62-bit fingerprint of its
order and ids: two polynomial hashes modulo the Mersenne prime 2**31 - 1,
with different bases, side by side; no step can overflow int64. Padding
takes no part: an n-gram that runs into it is no n-gram.
"""
import json
import posixpath
import typing

import numpy as np
import tensorflow as tf

from schemas import transformed

_MODULUS = 2**31 - 1
_BASES = (1_000_003, 998_244_353)
# A polynomial hash of a short n-gram of small ids is itself small;
# multiplying by a large constant modulo the prime (a bijection) spreads
# the fingerprints evenly, which the branch's search index relies on.
_SPREAD = 1_597_334_677
FINGERPRINT_BITS = 62
# What stands where there is no n-gram.
NO_NGRAM = -1
_COLUMNS = (transformed.NGRAM_FINGERPRINT, transformed.NGRAM_ORDER,
            transformed.NGRAM_LABEL_ID, transformed.NGRAM_DOCUMENTS)


def ngram_fingerprints(token_ids, order: int) -> tf.Tensor:
  """[batch, length] int64: the fingerprint of the n-gram of ``order``
  tokens that starts at each position, NO_NGRAM where it runs into
  padding."""
  token_ids = tf.cast(token_ids, tf.int64)
  length = tf.shape(token_ids)[1]
  padded = tf.pad(token_ids, [[0, 0], [0, order - 1]],
                  constant_values=transformed.PAD_ID)
  # The order is the hash's first term: a bigram and a trigram differ.
  hashes = [tf.fill(tf.shape(token_ids), tf.constant(order, tf.int64))
            for _ in _BASES]
  complete = tf.ones_like(token_ids, dtype=tf.bool)
  for offset in range(order):
    ids = padded[:, offset:offset + length]
    complete = tf.logical_and(complete,
                              tf.not_equal(ids, transformed.PAD_ID))
    hashes = [tf.math.floormod(h * base + ids, _MODULUS)
              for h, base in zip(hashes, _BASES)]
  hashes = [tf.math.floormod(h * _SPREAD, _MODULUS) for h in hashes]
  return tf.where(complete, hashes[0] * 2**31 + hashes[1],
                  tf.constant(NO_NGRAM, tf.int64))


def fingerprints(token_ids, max_order: int):
  """Each document's distinct n-gram fingerprints of orders 1 to
  ``max_order``, sorted, and which entries are real.

  Returns (fingerprints, present), both [batch, length * max_order]; an
  n-gram that occurs several times is present once (binarized features);
  an entry that is not present is NO_NGRAM.
  """
  values = tf.sort(tf.concat(
      [ngram_fingerprints(token_ids, order)
       for order in range(1, max_order + 1)], axis=1), axis=-1)
  previous = tf.pad(values[:, :-1], [[0, 0], [1, 0]],
                    constant_values=NO_NGRAM)
  present = tf.logical_and(tf.not_equal(values, NO_NGRAM),
                           tf.not_equal(values, previous))
  return tf.where(present, values, tf.constant(NO_NGRAM, tf.int64)), present


class NgramStatistics(typing.NamedTuple):
  """The n-grams in at least transformed.NGRAM_MIN_DOCUMENTS train
  documents."""
  keys: np.ndarray    # int64 [n-grams], sorted fingerprints
  counts: np.ndarray  # int64 [n-grams, classes]: train documents holding it


def read_statistics(data_dir: str, max_order: int,
                    num_classes: int) -> NgramStatistics:
  """The n-gram statistics the preprocessing job wrote in ``data_dir``, of
  the n-grams of up to ``max_order`` tokens; ValueError when it wrote none
  of that order, or their files do not hold what stats.json counts."""
  with tf.io.gfile.GFile(posixpath.join(data_dir, transformed.STATS_FILE),
                         'r') as stats_file:
    section = json.load(stats_file).get(transformed.NGRAMS_STATS)
  if not section:
    raise ValueError(f'{data_dir} holds no n-gram statistics: it was '
                     'preprocessed by a version that did not count them')
  if max_order > section['max_order']:
    raise ValueError(
        f'{data_dir} counts n-grams of up to {section["max_order"]} tokens, '
        f'not of {max_order}')
  files = sorted(tf.io.gfile.glob(posixpath.join(
      data_dir, transformed.ngram_file_pattern())))
  columns = {name: [np.zeros(0, np.int64)] for name in _COLUMNS}
  for record in tf.data.TFRecordDataset(files, compression_type='GZIP'):
    features = tf.train.Example.FromString(record.numpy()).features.feature
    run = [np.array(features[name].int64_list.value, np.int64)
           for name in _COLUMNS]
    if len({len(values) for values in run}) != 1:
      raise ValueError(f'{data_dir}\'s n-gram statistics hold a record whose '
                       f'{", ".join(_COLUMNS)} differ in length')
    for name, values in zip(_COLUMNS, run):
      columns[name].append(values)
  keys, orders, labels, documents = (np.concatenate(columns[name])
                                     for name in _COLUMNS)
  kept = orders <= max_order
  keys, rows = np.unique(keys[kept], return_inverse=True)
  expected = sum(count for order, count in section['kept_by_order'].items()
                 if int(order) <= max_order)
  if len(keys) != expected or labels.max(initial=0) >= num_classes:
    raise ValueError(
        f'{data_dir}\'s n-gram statistics are not whole: {len(keys)} n-grams '
        f'of up to {max_order} tokens in its files, {expected} in '
        f'{transformed.STATS_FILE}, label ids up to {labels.max(initial=0)} '
        f'of {num_classes} classes')
  # Each (n-gram, label) is one row: the sum only places it.
  counts = np.bincount(rows.reshape(-1) * num_classes + labels[kept],
                       weights=documents[kept],
                       minlength=len(keys) * num_classes)
  return NgramStatistics(keys, counts.astype(np.int64).reshape(
      len(keys), num_classes))
