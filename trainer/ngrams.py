"""The n-gram branch: NBSVM as a Keras layer over the token ids.

NBSVM (Wang & Manning, 2012) is a linear classifier over a document's
binarized n-grams whose features are scaled by Naive Bayes log-count ratios
computed on the training split. As a layer (the "neural NBSVM" of A. Maiya
and fast.ai's NBSVM++): each n-gram j has fixed ratios r[j, k], one a class,
and one trainable weight w[j], and class k's logit is the sum of
r[j, k] * w[j] over the distinct n-grams of the document. The ratios make
the weights of discriminative n-grams move fastest, and starting every w at
one small value starts the model as a scaled-down Naive Bayes classifier.
One weight an n-gram rather than one a class and n-gram: for two classes
(r[j, 1] = -r[j, 0]) it is the same model, and the optimizer's cost, which
grows with the table, is halved.

The n-grams come from the token ids inside the graph, so the raw-text
export needs nothing else; the preprocessing job counts the same
fingerprints (``serving.ngrams``) on its runner, which the trainer reads
instead of counting (``trainer.ngram_fit.counted_ngrams``). Each n-gram
(unigrams included) is named by a 62-bit fingerprint of its ids; the
vocabulary is the fingerprints seen in at least ``min_count`` training
documents, so that n-grams seen once, which only let the model memorise its
training reviews, take no table rows (with hashing into a fixed table they
would share rows with the useful ones). A fingerprint is found in the
sorted vocabulary by a binary search in plain tensor ops, which XLA
compiles; an n-gram outside it adds nothing. Padding takes no part, so a
document's n-grams do not depend on how much padding follows it.
"""
import dataclasses
import functools
import math

import keras
from keras import layers
from keras import ops
import numpy as np
import tensorflow as tf

from serving.ngrams import FINGERPRINT_BITS
from serving.ngrams import fingerprints

_PACKAGE = 'beam_text_classifier'
# The binary search first jumps to the vocabulary's entries that share the
# fingerprint's top bits (about 8 of them), then takes this many steps:
# enough for 127 entries, which random fingerprints never come near.
_SEARCH_STEPS = 7


def log_count_ratios(counts: np.ndarray, alpha: float = 1.0) -> np.ndarray:
  """Naive Bayes log-count ratios, one column a class against the others.

  ``counts`` is [n-grams, classes], training documents holding each
  n-gram. r[j, k] = log(p[j] / |p|) - log(q[j] / |q|), with p = alpha + the
  documents of class k holding n-gram j, q = alpha + those of the other
  classes, |.| the sum over all n-grams (Wang & Manning, 2012).
  """
  counts = counts.astype(np.float64)
  p = alpha + counts
  q = alpha + counts.sum(axis=1, keepdims=True) - counts
  return (np.log(p / p.sum(axis=0)) - np.log(q / q.sum(axis=0))).astype(
      np.float32)


@dataclasses.dataclass
class Vocabulary:
  """The n-grams the branch knows: sorted fingerprints and their ratios."""
  keys: np.ndarray      # int64 [n-grams], sorted
  counts: np.ndarray    # int64 [n-grams, classes], training documents
  ratios: np.ndarray    # float32 [n-grams, classes]

  @classmethod
  def fit(cls, batches, max_order: int, num_classes: int, min_count: int = 2,
          alpha: float = 1.0) -> 'Vocabulary':
    """From batches of (token_ids, label_id) of the training split."""
    return DocumentNgrams.fit(batches, max_order).vocabulary(
        num_classes, min_count=min_count, alpha=alpha)

  def vocabulary(self, num_classes: int, min_count: int = 2,
                 alpha: float = 1.0) -> 'Vocabulary':
    """Those in at least ``min_count`` training documents, as
    ``DocumentNgrams.vocabulary`` of all its documents (``num_classes``:
    the counts' columns already)."""
    del num_classes
    return self.at_least(max(min_count, 1), alpha)

  def at_least(self, min_count: int, alpha: float = 1.0) -> 'Vocabulary':
    """The n-grams in at least ``min_count`` training documents, their
    ratios computed among them; ValueError when there is none."""
    kept = self.counts.sum(axis=1) >= min_count
    if not kept.any():
      raise ValueError(f'no n-gram is in {min_count} training documents')
    return Vocabulary(self.keys[kept], self.counts[kept],
                      log_count_ratios(self.counts[kept], alpha))


@dataclasses.dataclass
class DocumentNgrams:
  """The distinct n-grams of each training document, found once: the
  vocabulary of any subset of the documents (a cross-validation fold's) is
  then a count, not another pass over the text."""
  keys: np.ndarray       # int64 [n-grams], sorted fingerprints
  key_rows: np.ndarray   # int64 [pairs]: the n-gram of each (document,
  documents: np.ndarray  # int64 [pairs]: n-gram) pair, and its document
  labels: np.ndarray     # int64 [documents]: each document's label id

  @classmethod
  def fit(cls, batches, max_order: int) -> 'DocumentNgrams':
    """From batches of (token_ids, label_id), in the order given."""
    flat = _flat_fingerprints_of(max_order)
    keys, documents, labels = [], [], []
    seen = 0
    for token_ids, label_ids in batches:
      batch_keys, rows = flat(token_ids)
      keys.append(batch_keys.numpy())
      documents.append(rows.numpy() + seen)
      labels.append(np.asarray(label_ids))
      seen += len(labels[-1])
    keys, key_rows = np.unique(np.concatenate(keys), return_inverse=True)
    return cls(keys, key_rows.reshape(-1), np.concatenate(documents),
               np.concatenate(labels))

  def vocabulary(self, num_classes: int, documents: np.ndarray = None,
                 min_count: int = 2, alpha: float = 1.0) -> 'Vocabulary':
    """The vocabulary of the documents at rows ``documents`` (all when
    None); ValueError when no n-gram is in ``min_count`` of them."""
    pairs = slice(None)
    if documents is not None:
      chosen = np.zeros(len(self.labels), bool)
      chosen[documents] = True
      pairs = chosen[self.documents]
    counts = np.bincount(
        self.key_rows[pairs] * num_classes +
        self.labels[self.documents[pairs]],
        minlength=len(self.keys) * num_classes).reshape(len(self.keys),
                                                        num_classes)
    return Vocabulary(self.keys, counts,
                      np.zeros(counts.shape, np.float32)).at_least(
                          max(min_count, 1), alpha)


def counted_among(keys: np.ndarray, batches, max_order: int,
                  num_classes: int) -> np.ndarray:
  """[n-grams, classes]: the documents of ``batches`` (token ids, label id)
  holding each n-gram of ``keys`` (sorted fingerprints) in a class; other
  n-grams are not counted. One batch's n-grams in memory at a time."""
  flat = _flat_fingerprints_of(max_order)
  counts = np.zeros(len(keys) * num_classes, np.int64)
  for token_ids, label_ids in batches:
    values, rows = (found.numpy() for found in flat(token_ids))
    at = np.minimum(np.searchsorted(keys, values), max(len(keys) - 1, 0))
    known = keys[at] == values if len(keys) else np.zeros(len(values), bool)
    np.add.at(counts, at[known] * num_classes +
              np.asarray(label_ids)[rows[known]], 1)
  return counts.reshape(len(keys), num_classes)


@functools.lru_cache(maxsize=None)
def _flat_fingerprints_of(max_order: int):
  """_flat_fingerprints as one graph per n-gram order, traced once for
  batches of any shape (a function made anew for each pass was traced again
  for each pass and each batch shape, and TensorFlow warned of it)."""
  return tf.function(
      lambda token_ids: _flat_fingerprints(token_ids, max_order),
      input_signature=[tf.TensorSpec([None, None], tf.int64)])


def _flat_fingerprints(token_ids, max_order):
  """The (fingerprint, row in the batch) pairs of a batch: one a
  document's distinct n-gram."""
  values, present = fingerprints(token_ids, max_order)
  rows = tf.broadcast_to(tf.range(tf.shape(values, out_type=tf.int64)[0])[
      :, None], tf.shape(values, out_type=tf.int64))
  return tf.boolean_mask(values, present), tf.boolean_mask(rows, present)


def index_bits(size: int) -> int:
  """Top fingerprint bits that pick a range of about 8 vocabulary entries."""
  return max(1, math.ceil(math.log2(max(size, 1) / 8)))


@keras.saving.register_keras_serializable(package=_PACKAGE)
class NgramLogits(layers.Layer):
  """NBSVM: token ids [batch, length] -> class logits [batch, num_classes].

  The vocabulary (fingerprints, ratios, the search index) is made of
  non-trainable weights set by ``set_vocabulary``, so it is saved with the
  model and the export needs nothing else. ``dropout`` hides that share of
  a document's n-grams while training.
  """

  def __init__(self, size, num_classes, max_order=3, initial_weight=0.05,
               dropout=0.0, seed=None, **kwargs):
    super().__init__(**kwargs)
    self.size = size
    self.num_classes = num_classes
    self.max_order = max_order
    self.initial_weight = initial_weight
    self.dropout = dropout
    self.seed = seed
    self.seed_generator = keras.random.SeedGenerator(seed)
    self.shift = FINGERPRINT_BITS - index_bits(size)

  def build(self, input_shape):
    self.keys = self.add_weight(shape=(self.size,), dtype='int64',
                                initializer='zeros', trainable=False,
                                name='keys')
    self.starts = self.add_weight(
        shape=(2**(FINGERPRINT_BITS - self.shift) + 1,), dtype='int64',
        initializer='zeros', trainable=False, name='starts')
    self.ratios = self.add_weight(shape=(self.size, self.num_classes),
                                  initializer='zeros', trainable=False,
                                  name='nb_ratios')
    self.kernel = self.add_weight(
        shape=(self.size, 1), initializer=keras.initializers.Constant(
            self.initial_weight), name='kernel')
    self.bias = self.add_weight(shape=(self.num_classes,),
                                initializer='zeros', name='bias')
    super().build(input_shape)

  def set_vocabulary(self, vocabulary: Vocabulary) -> None:
    keys = vocabulary.keys.astype(np.int64)
    if len(keys) != self.size:
      raise ValueError(f'{len(keys)} n-grams for a layer of {self.size}')
    top = keys >> self.shift
    starts = np.searchsorted(top, np.arange(len(self.starts.numpy())))
    if np.diff(starts).max(initial=0) >= 2**_SEARCH_STEPS:
      raise ValueError('too many n-grams share a search range')
    self.keys.assign(keys)
    self.starts.assign(starts.astype(np.int64))
    self.ratios.assign(vocabulary.ratios)

  def lookup(self, values):
    """Row of each fingerprint in the vocabulary, and whether it is there."""
    top = ops.maximum(values, 0) // 2**self.shift
    low, high = ops.take(self.starts, top), ops.take(self.starts, top + 1)
    for _ in range(_SEARCH_STEPS):
      middle = (low + high) // 2
      below = ops.logical_and(
          low < high,
          ops.take(self.keys, ops.minimum(middle, self.size - 1)) < values)
      low, high = ops.where(below, middle + 1, low), ops.where(below, high,
                                                                middle)
    row = ops.minimum(low, self.size - 1)
    return row, ops.equal(ops.take(self.keys, row), values)

  def call(self, token_ids, training=False):
    values, present = fingerprints(token_ids, self.max_order)
    rows, known = self.lookup(values)
    weights = ops.cast(ops.logical_and(present, known), self.compute_dtype)
    if training and self.dropout:
      kept = keras.random.uniform(ops.shape(weights),
                                  seed=self.seed_generator) >= self.dropout
      weights = weights * ops.cast(kept, self.compute_dtype) / (
          1.0 - self.dropout)
    scaled = ops.take(self.ratios, rows, axis=0) * ops.take(self.kernel, rows,
                                                            axis=0)
    return ops.sum(scaled * weights[:, :, None], axis=1) + self.bias

  def compute_output_shape(self, input_shape):
    return (input_shape[0], self.num_classes)

  def get_config(self):
    return {**super().get_config(), 'size': self.size,
            'num_classes': self.num_classes, 'max_order': self.max_order,
            'initial_weight': self.initial_weight, 'dropout': self.dropout,
            'seed': self.seed}
