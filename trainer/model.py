"""The transformer classifier, built from small named Keras layers.

The family of the keras.io "Text classification with Transformer" example:
token + position embedding, transformer blocks (multi-head self-attention and
a feed-forward network, each with dropout, a residual connection and layer
normalization), pooling, Dense(20, relu) with dropout, softmax. Unlike the
example, padding is masked: attention never looks at padded positions and
pooling ignores them, so a document's prediction does not depend on how much
padding follows it.

Keras 3 (``import keras``) throughout: tensorflow-transform switches
``tf.keras`` to Keras 2 in any process that imports it.
"""
import dataclasses

import keras
from keras import layers
from keras import ops
import numpy as np

from schemas import transformed

_PACKAGE = 'beam_text_classifier'


@dataclasses.dataclass(frozen=True)
class ModelParams:
  """Hyperparameters; the defaults reproduce the keras.io model."""
  embed_dim: int = 32
  num_heads: int = 2
  key_dim: int = 0                # per-head query/key size; 0: embed_dim
  ff_dim: int = 32
  num_layers: int = 1
  dropout: float = 0.1
  pooling: str = 'mean'           # mean | max
  positions: str = 'learned'      # learned | sinusoidal
  bigram_buckets: int = 0         # 0: no bigram embedding
  token_dropout: float = 0.0      # share of tokens hidden while training
  head_units: int = 20

  def __post_init__(self):
    if self.pooling not in ('mean', 'max'):
      raise ValueError(f'pooling must be mean or max, not {self.pooling!r}')
    if self.positions not in ('learned', 'sinusoidal'):
      raise ValueError(
          f'positions must be learned or sinusoidal, not {self.positions!r}')
    if self.key_dim < 0:
      raise ValueError(f'key_dim must be >= 0, not {self.key_dim}')

  @property
  def attention_key_dim(self) -> int:
    # keras.io gives every head the whole embedding width.
    return self.key_dim or self.embed_dim


def sinusoidal_positions(length: int, dim: int) -> np.ndarray:
  """The fixed position encodings of "Attention is all you need"."""
  positions = np.arange(length)[:, None]
  rates = 1.0 / np.power(10000.0, (2 * (np.arange(dim) // 2)) / dim)
  angles = positions * rates[None, :]
  angles[:, 0::2] = np.sin(angles[:, 0::2])
  angles[:, 1::2] = np.cos(angles[:, 1::2])
  return angles.astype('float32')


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TokenAndPositionEmbedding(layers.Layer):
  """Token embedding plus a learned or sinusoidal position embedding.

  With ``bigram_buckets``, each position also adds the embedding of the
  (token, next token) pair, hashed into that many buckets: word order that
  one block of attention over single words learns slowly ("not good") the
  embedding states directly. A pair that reaches padding adds nothing.
  """

  def __init__(self, max_len, vocab_size, embed_dim, positions='learned',
               bigram_buckets=0, **kwargs):
    super().__init__(**kwargs)
    self.max_len = max_len
    self.vocab_size = vocab_size
    self.embed_dim = embed_dim
    self.positions = positions
    self.bigram_buckets = bigram_buckets
    self.token_embedding = layers.Embedding(vocab_size, embed_dim,
                                            name='tokens')
    if bigram_buckets:
      self.bigram_embedding = layers.Embedding(bigram_buckets, embed_dim,
                                               name='bigrams')
    if positions == 'learned':
      self.position_embedding = layers.Embedding(max_len, embed_dim,
                                                 name='positions')
    else:
      self.position_table = sinusoidal_positions(max_len, embed_dim)

  def build(self, input_shape):
    self.token_embedding.build(input_shape)
    if self.bigram_buckets:
      self.bigram_embedding.build(input_shape)
    if self.positions == 'learned':
      self.position_embedding.build((self.max_len,))
    super().build(input_shape)

  def call(self, token_ids):
    length = ops.shape(token_ids)[-1]
    if self.positions == 'learned':
      position_vectors = self.position_embedding(ops.arange(length))
    else:
      position_vectors = ops.convert_to_tensor(self.position_table)[:length]
    embedded = self.token_embedding(token_ids) + position_vectors
    if self.bigram_buckets:
      embedded += self._bigrams(token_ids)
    return embedded

  def _bigrams(self, token_ids):
    token_ids = ops.cast(token_ids, 'int64')
    following = ops.pad(token_ids[:, 1:], [[0, 0], [0, 1]],
                        constant_values=transformed.PAD_ID)
    buckets = ops.mod(token_ids * self.vocab_size + following,
                      self.bigram_buckets)
    real = ops.logical_and(ops.not_equal(token_ids, transformed.PAD_ID),
                           ops.not_equal(following, transformed.PAD_ID))
    return self.bigram_embedding(buckets) * ops.cast(real, self.compute_dtype)[
        :, :, None]

  def compute_mask(self, token_ids, mask=None):
    return ops.not_equal(token_ids, transformed.PAD_ID)

  def get_config(self):
    return {**super().get_config(), 'max_len': self.max_len,
            'vocab_size': self.vocab_size, 'embed_dim': self.embed_dim,
            'positions': self.positions,
            'bigram_buckets': self.bigram_buckets}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TokenDropout(layers.Layer):
  """While training, replaces a random share of the real tokens by OOV.

  Each epoch then shows the model a different view of every document, so it
  has to rely on many words rather than memorise a few (the "word dropout"
  of Iyyer et al., 2015). Padding stays padding, so the mask is unchanged.
  """

  def __init__(self, rate, seed=None, **kwargs):
    super().__init__(**kwargs)
    self.rate = rate
    self.seed = seed
    self.seed_generator = keras.random.SeedGenerator(seed)

  def call(self, token_ids, training=False):
    if not training or not self.rate:
      return token_ids
    hidden = keras.random.uniform(ops.shape(token_ids),
                                  seed=self.seed_generator) < self.rate
    hidden = ops.logical_and(hidden,
                             ops.not_equal(token_ids, transformed.PAD_ID))
    return ops.where(hidden, ops.cast(transformed.OOV_ID, token_ids.dtype),
                     token_ids)

  def get_config(self):
    return {**super().get_config(), 'rate': self.rate, 'seed': self.seed}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerBlock(layers.Layer):
  """Self-attention and feed-forward sublayers, each residual + layer norm.

  ``key_dim`` is each head's query/key size, embed_dim when not given (as in
  the keras.io example); the attention's output projection brings the heads
  back to embed_dim whatever it is.
  """

  def __init__(self, embed_dim, num_heads, ff_dim, dropout=0.1, key_dim=None,
               **kwargs):
    super().__init__(**kwargs)
    self.embed_dim = embed_dim
    self.num_heads = num_heads
    self.ff_dim = ff_dim
    self.dropout = dropout
    self.key_dim = key_dim or embed_dim
    self.attention = layers.MultiHeadAttention(
        num_heads=num_heads, key_dim=self.key_dim, name='attention')
    self.feed_forward = keras.Sequential(
        [layers.Dense(ff_dim, activation='relu'), layers.Dense(embed_dim)],
        name='feed_forward')
    self.attention_norm = layers.LayerNormalization(epsilon=1e-6)
    self.feed_forward_norm = layers.LayerNormalization(epsilon=1e-6)
    self.attention_dropout = layers.Dropout(dropout)
    self.feed_forward_dropout = layers.Dropout(dropout)
    self.supports_masking = True

  def build(self, input_shape):
    self.attention.build(input_shape, input_shape)
    self.feed_forward.build(input_shape)
    self.attention_norm.build(input_shape)
    self.feed_forward_norm.build(input_shape)
    super().build(input_shape)

  def call(self, inputs, mask=None, training=False):
    attention_mask = None
    if mask is not None:
      # [batch, query, key]: every query may attend to the real tokens only.
      attention_mask = ops.logical_and(mask[:, :, None], mask[:, None, :])
    attended = self.attention(inputs, inputs, attention_mask=attention_mask,
                              training=training)
    hidden = self.attention_norm(
        inputs + self.attention_dropout(attended, training=training))
    fed = self.feed_forward(hidden, training=training)
    return self.feed_forward_norm(
        hidden + self.feed_forward_dropout(fed, training=training))

  def compute_mask(self, inputs, mask=None):
    return mask

  def get_config(self):
    return {**super().get_config(), 'embed_dim': self.embed_dim,
            'num_heads': self.num_heads, 'ff_dim': self.ff_dim,
            'dropout': self.dropout, 'key_dim': self.key_dim}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class MaskedPooling(layers.Layer):
  """Mean or max over the sequence, ignoring masked (padded) positions."""

  def __init__(self, mode='mean', **kwargs):
    super().__init__(**kwargs)
    self.mode = mode
    self.supports_masking = True

  def call(self, inputs, mask=None):
    if mask is None:
      mask = ops.ones(ops.shape(inputs)[:2], dtype='bool')
    weights = ops.cast(mask, inputs.dtype)[:, :, None]
    if self.mode == 'max':
      lowest = ops.convert_to_tensor(-1e9, inputs.dtype)
      pooled = ops.max(ops.where(weights > 0, inputs, lowest), axis=1)
      # An all-padding document pools to zeros, not to -1e9.
      return ops.where(ops.sum(weights, axis=1) > 0, pooled, 0.0)
    total = ops.sum(inputs * weights, axis=1)
    return total / ops.maximum(ops.sum(weights, axis=1), 1.0)

  def compute_mask(self, inputs, mask=None):
    return None

  def get_config(self):
    return {**super().get_config(), 'mode': self.mode}


def build_model(vocab_size: int, max_len: int, num_classes: int,
                params: ModelParams) -> keras.Model:
  """The classifier: token ids [batch, max_len] -> class probabilities."""
  # Any length up to max_len: training may cut batches short (length
  # buckets); the export always feeds max_len.
  token_ids = keras.Input(shape=(None,), dtype='int64',
                          name=transformed.TOKEN_IDS)
  hidden = token_ids
  if params.token_dropout:
    hidden = TokenDropout(params.token_dropout, name='token_dropout')(hidden)
  hidden = TokenAndPositionEmbedding(max_len, vocab_size, params.embed_dim,
                                     params.positions, params.bigram_buckets,
                                     name='embedding')(hidden)
  for index in range(params.num_layers):
    hidden = TransformerBlock(params.embed_dim, params.num_heads,
                              params.ff_dim, params.dropout,
                              params.attention_key_dim,
                              name=f'transformer_{index}')(hidden)
  pooled = MaskedPooling(params.pooling, name='pooling')(hidden)
  pooled = layers.Dropout(params.dropout, name='pooled_dropout')(pooled)
  head = layers.Dense(params.head_units, activation='relu', name='head')(pooled)
  head = layers.Dropout(params.dropout, name='head_dropout')(head)
  probabilities = layers.Dense(num_classes, activation='softmax',
                               name='probabilities')(head)
  return keras.Model(token_ids, probabilities, name='transformer_classifier')
