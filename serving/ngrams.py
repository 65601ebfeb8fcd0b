"""N-grams of token ids: the fingerprints that name them wherever they are
counted or looked up.

The trainer's n-gram branch looks n-grams up by these fingerprints, inside
the model and so inside the export (``trainer.ngrams``), and whatever
counts n-grams for it must name them alike: one definition, here, in plain
TensorFlow ops, which XLA compiles and Beam's workers run without the
trainer.

Each n-gram (unigrams included) is named by a 62-bit fingerprint of its
order and ids: two polynomial hashes modulo the Mersenne prime 2**31 - 1,
with different bases, side by side; no step can overflow int64. Padding
takes no part: an n-gram that runs into it is no n-gram.
"""
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
