"""The classifiers, built from small named Keras layers.

The transformer is of the family of the keras.io "Text classification with
Transformer" example: token + position embedding, transformer blocks
(multi-head self-attention and a feed-forward network, each with dropout, a
residual connection and layer normalization), pooling, Dense(20, relu) with
dropout, class logits. Unlike the example, padding is masked: attention
never looks at padded positions and pooling ignores them, so a document's
prediction does not depend on how much padding follows it.

``--model=nbsvm`` replaces it by the n-gram branch of ``trainer.ngrams``;
``--model=hybrid`` has both branches side by side on the same token ids,
their logits weighted and summed (``BranchMix``). Every model ends in a
``Temperature`` layer and a softmax, so calibration is part of the model.

Keras 3 (``import keras``) throughout: tensorflow-transform switches
``tf.keras`` to Keras 2 in any process that imports it.
"""
import argparse
import dataclasses
from typing import List, Tuple

import keras
from keras import layers
from keras import ops
import numpy as np

from cli import flags
from schemas import transformed
from trainer import ngrams

_PACKAGE = 'beam_text_classifier'
MODELS = ('transformer', 'nbsvm', 'hybrid')
# Layer names the trainer and the calibration look up.
TRANSFORMER_LOGITS = 'transformer_logits'
NGRAM_LOGITS = 'ngram_logits'
MIXED_LOGITS = 'logits'
TEMPERATURE = 'temperature'


@dataclasses.dataclass(frozen=True)
class ModelParams:
  """Hyperparameters. The defaults are the hybrid (docs/training.md, "The model"): the
  keras.io transformer, on the 20,000 most frequent ids and 256 tokens, beside
  the n-gram branch; ``configs/imdb_seed`` spells out the keras.io model
  alone."""
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
  model: str = 'hybrid'           # transformer | nbsvm | hybrid (both)
  # The transformer's own view of the ids: the most frequent
  # transformer_vocab ids (the rest as OOV) and at most transformer_len
  # tokens (head and tail); 0: all of them. The n-gram branch sees them all.
  transformer_vocab: int = 20000
  transformer_len: int = 256
  ngram_order: int = 3            # unigrams up to this order
  # Training documents an n-gram needs; 0: one of trainer.ngram_fit.MIN_COUNTS,
  # chosen by cross-validation or on validation, as --folds says.
  ngram_min_count: int = 0
  ngram_init: float = 0.05        # every NBSVM weight's first value
  ngram_dropout: float = 0.0      # share of n-grams hidden while training

  def __post_init__(self):
    for name, check in FIELD_FLAGS.items():
      value = getattr(self, name)
      if isinstance(check, tuple):
        if value not in check:
          raise ValueError(f'{name} must be one of {check}, not {value!r}')
        continue
      try:
        check(str(value))
      except argparse.ArgumentTypeError as error:
        raise ValueError(f'{name}: {error}') from None

  @property
  def branches(self) -> Tuple[str, ...]:
    """Names of the logits layers whose sum is the model's logits."""
    return {'transformer': (TRANSFORMER_LOGITS,), 'nbsvm': (NGRAM_LOGITS,),
            'hybrid': (TRANSFORMER_LOGITS, NGRAM_LOGITS)}[self.model]

  @property
  def attention_key_dim(self) -> int:
    # keras.io gives every head the whole embedding width.
    return self.key_dim or self.embed_dim


# Each field's values: a flag type (cli.flags) or the choices; the trainer's
# flags and ModelParams's own check both read them.
FIELD_FLAGS = {
    'embed_dim': flags.integer(1),
    'num_heads': flags.integer(1),
    'key_dim': flags.integer(0),
    'ff_dim': flags.integer(1),
    'num_layers': flags.integer(1),
    'dropout': flags.number(0, 1, high_open=True),
    'pooling': ('mean', 'max'),
    'positions': ('learned', 'sinusoidal'),
    'bigram_buckets': flags.integer(0),
    'token_dropout': flags.number(0, 1, high_open=True),
    'head_units': flags.integer(1),
    'model': MODELS,
    'transformer_vocab': flags.integer(0),
    'transformer_len': flags.integer(0),
    'ngram_order': flags.integer(1),
    'ngram_min_count': flags.integer(0),
    'ngram_init': flags.number(),
    'ngram_dropout': flags.number(0, 1, high_open=True),
}


# Each field's help, for the trainer's flags.
FIELD_HELP = {
    'embed_dim': 'Width of the token and position embeddings.',
    'num_heads': 'Attention heads of each transformer block.',
    'key_dim': 'Query and key width of each head; 0: --embed_dim '
               '(keras.io\'s choice).',
    'ff_dim': 'Hidden width of each block\'s feed-forward layer.',
    'num_layers': 'Transformer blocks.',
    'dropout': 'Dropout rate in the blocks and the head.',
    'pooling': 'How the token vectors become one: their mean or max.',
    'positions': 'Position embeddings: learned, or fixed sinusoids.',
    'bigram_buckets': 'Hash buckets of a bigram embedding added to the '
                      'tokens\'; 0: none.',
    'token_dropout': 'Share of tokens hidden while training.',
    'head_units': 'Units of the dense layer before the classes.',
    'model': 'transformer, nbsvm, or hybrid (both).',
    'transformer_vocab': 'The transformer sees the most frequent ids up to '
                         'this one (the rest as OOV); 0: all.',
    'transformer_len': 'The transformer sees at most this many tokens '
                       '(head and tail); 0: all.',
    'ngram_order': 'The n-gram branch counts n-grams up to this order.',
    'ngram_min_count': 'Training documents an n-gram needs; 0: chosen from '
                       'the data, as --folds chooses (cross-validation over '
                       'the train split, or the validation split).',
    'ngram_init': 'Every NBSVM weight\'s first value (--ngram_fit=epochs).',
    'ngram_dropout': 'Share of n-grams hidden while training '
                     '(--ngram_fit=epochs).',
}


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


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TokenClip(layers.Layer):
  """Rare ids as OOV and long documents cut to their head and tail.

  Ids are ordered by training frequency, so ``ids >= vocab_size`` are the
  rarest words: the transformer keeps a small embedding table while the
  n-gram branch beside it sees the whole vocabulary. A document of more
  than ``max_len`` real tokens keeps its first max_len / 2 and its last
  ones, as the preprocessing job's head_tail truncation does.
  """

  def __init__(self, vocab_size=0, max_len=0, **kwargs):
    super().__init__(**kwargs)
    self.vocab_size = vocab_size
    self.max_len = max_len

  def call(self, token_ids):
    if self.vocab_size:
      token_ids = ops.where(token_ids >= self.vocab_size,
                            ops.cast(transformed.OOV_ID, token_ids.dtype),
                            token_ids)
    if not self.max_len:
      return token_ids
    lengths = ops.sum(ops.cast(ops.not_equal(token_ids, transformed.PAD_ID),
                               'int32'), axis=1, keepdims=True)
    positions = ops.arange(ops.minimum(ops.shape(token_ids)[1],
                                       self.max_len), dtype='int32')[None, :]
    # Past the head, a long document reads from its last tokens.
    source = ops.where(
        ops.logical_and(lengths > self.max_len,
                        positions >= self.max_len // 2),
        positions + lengths - self.max_len, positions)
    return ops.take_along_axis(token_ids, source, axis=1)

  def get_config(self):
    return {**super().get_config(), 'vocab_size': self.vocab_size,
            'max_len': self.max_len}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class BranchMix(layers.Layer):
  """The sum of the branches' logits, each times a scale.

  The scales are 1 until the trainer fits them on the validation split
  (stacking: each branch is trained alone, then weighted by how much its
  logits are worth), so they are not trained with the branches.
  """

  def __init__(self, num_branches, **kwargs):
    super().__init__(**kwargs)
    self.num_branches = num_branches

  def build(self, input_shape):
    self.scales = self.add_weight(shape=(self.num_branches,),
                                  initializer='ones', trainable=False,
                                  name='scales')
    super().build(input_shape)

  def call(self, branch_logits):
    return sum(self.scales[index] * logits
               for index, logits in enumerate(branch_logits))

  def compute_output_shape(self, input_shape):
    return input_shape[0]

  def get_config(self):
    return {**super().get_config(), 'num_branches': self.num_branches}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class Temperature(layers.Layer):
  """Logits divided by a temperature that calibration sets (1 until then).

  It is part of the model, so the export serves calibrated probabilities
  with no change to its signature.
  """

  def build(self, input_shape):
    self.temperature = self.add_weight(shape=(), initializer='ones',
                                       trainable=False, name='temperature')
    super().build(input_shape)

  def call(self, logits):
    return logits / self.temperature


def transformer_logits(token_ids, vocab_size: int, max_len: int,
                       num_classes: int, params: ModelParams):
  """The transformer branch: token ids -> class logits."""
  vocab_size = min(vocab_size, params.transformer_vocab or vocab_size)
  max_len = min(max_len, params.transformer_len or max_len)
  hidden = token_ids
  if params.transformer_vocab or params.transformer_len:
    hidden = TokenClip(params.transformer_vocab, params.transformer_len,
                       name='token_clip')(hidden)
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
  return layers.Dense(num_classes, name=TRANSFORMER_LOGITS)(head)


def build_model(vocab_size: int, max_len: int, num_classes: int,
                params: ModelParams,
                ngram_vocabulary: ngrams.Vocabulary = None) -> keras.Model:
  """The classifier: token ids [batch, max_len] -> class probabilities.

  The n-gram branch (nbsvm, hybrid) needs its vocabulary, fitted on the
  training split (``ngrams.Vocabulary.fit``).
  """
  # Any length up to max_len: training may cut batches short (length
  # buckets); the export always feeds max_len.
  token_ids = keras.Input(shape=(None,), dtype='int64',
                          name=transformed.TOKEN_IDS)
  branches = []
  if TRANSFORMER_LOGITS in params.branches:
    branches.append(transformer_logits(token_ids, vocab_size, max_len,
                                       num_classes, params))
  if NGRAM_LOGITS in params.branches:
    ngram_layer = ngrams.NgramLogits(
        len(ngram_vocabulary.keys), num_classes, params.ngram_order,
        params.ngram_init, params.ngram_dropout, name=NGRAM_LOGITS)
    branches.append(ngram_layer(token_ids))
    ngram_layer.set_vocabulary(ngram_vocabulary)
  logits = branches[0]
  if len(branches) > 1:
    logits = BranchMix(len(branches), name=MIXED_LOGITS)(branches)
  logits = Temperature(name=TEMPERATURE)(logits)
  probabilities = layers.Activation('softmax', name='probabilities')(logits)
  return keras.Model(token_ids, probabilities, name=f'{params.model}_classifier')


def branch_model(model: keras.Model, branch: str) -> keras.Model:
  """One branch of ``model`` alone (its layers shared): ids -> probabilities.

  Training it trains those layers of ``model``.
  """
  probabilities = layers.Activation('softmax', name=f'{branch}_probabilities')(
      model.get_layer(branch).output)
  return keras.Model(model.inputs, probabilities, name=branch)


def branch_names(model: keras.Model) -> List[str]:
  """The logits layers of ``model``'s branches, in ``BranchMix`` order."""
  names = {layer.name for layer in model.layers}
  return [name for name in (TRANSFORMER_LOGITS, NGRAM_LOGITS) if name in names]
