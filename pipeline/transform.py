"""The TF side of preprocessing: text normalization and the preprocessing_fn.

Everything here is pure TensorFlow, so it runs inside the TFT transform graph,
inside the exported model, and in tests without Beam.
"""
import dataclasses

import tensorflow as tf
import tensorflow_transform as tft

from schemas import raw
from schemas import transformed

# Unicode punctuation and symbols become tokens of their own.
_PUNCTUATION = r'([\p{P}\p{S}])'


TRUNCATIONS = ('head', 'tail', 'head_tail')


def truncate(tokens: tf.RaggedTensor, max_len: int,
             truncation: str) -> tf.RaggedTensor:
  """At most max_len tokens a row: the first, the last, or half of each.

  Reviews and emails often conclude at the end; keeping the start and the end
  of a long document keeps both its topic and its verdict.
  """
  if truncation == 'head':
    return tokens[:, :max_len]
  # On the flat tokens, each one's row found in the row splits: ragged
  # positions and masks took 2.5 times the graph ops (216 against 87), and
  # TFT builds this graph several times a job.
  splits = tokens.row_splits
  index = tf.range(splits[-1])
  row = tf.searchsorted(splits, index, side='right') - 1
  start = tf.gather(splits, row)
  position = index - start
  length = tf.gather(splits, row + 1) - start
  head = max_len // 2 if truncation == 'head_tail' else 0
  # Short rows satisfy one side or the other at every position, so each row
  # keeps min(its length, max_len) tokens.
  keep = (position < head) | (position >= length - (max_len - head))
  return tf.RaggedTensor.from_row_lengths(
      tf.boolean_mask(tokens.values, keep),
      tf.minimum(tokens.row_lengths(), max_len), validate=False)


@dataclasses.dataclass(frozen=True)
class TransformParams:
  """Parameters of the transform graph, saved beside it for the later jobs."""
  # The defaults keep (almost) everything: the n-gram branch gains from
  # rare tokens, long documents and punctuation ("!", "?", ":)"), and the
  # trainer cuts its transformer's view itself (--transformer_vocab,
  # --transformer_len); configs/imdb_seed spells out the keras.io sizes.
  vocab_size: int = 200000      # includes the padding and OOV ids
  min_frequency: int = 1        # tokens seen fewer times in train become OOV
  max_len: int = 1024           # tokens kept per document
  max_token_chars: int = 50     # longer tokens are cut to this many characters
  truncation: str = 'head_tail'  # which tokens of a long document to keep
  # Punctuation and symbols as tokens of their own, or dropped: dropping
  # them lets max_len tokens cover more words.
  keep_punctuation: bool = True

  def __post_init__(self):
    if self.vocab_size <= transformed.NUM_RESERVED_IDS:
      raise ValueError(
          f'vocab_size must exceed {transformed.NUM_RESERVED_IDS} reserved ids')
    if self.max_len < 1 or self.min_frequency < 1 or self.max_token_chars < 1:
      raise ValueError('max_len, min_frequency and max_token_chars must be >= 1')
    if self.truncation not in TRUNCATIONS:
      raise ValueError(f'truncation must be one of {TRUNCATIONS}')


def normalize(text: tf.Tensor, keep_punctuation: bool = True) -> tf.Tensor:
  """Lower case, HTML tags removed, punctuation split off as its own tokens
  (or replaced by spaces)."""
  text = tf.strings.lower(text, encoding='utf-8')
  text = tf.strings.regex_replace(text, raw.HTML_TAG, ' ')
  return tf.strings.regex_replace(text, _PUNCTUATION,
                                  r' \1 ' if keep_punctuation else ' ')


def tokenize(text: tf.Tensor, max_token_chars: int,
             keep_punctuation: bool = True) -> tf.RaggedTensor:
  """Whitespace tokens of normalized text, each cut to max_token_chars."""
  tokens = tf.strings.split(normalize(text, keep_punctuation))
  # A 200 kB "word" (base64, a URL run) would otherwise land in the
  # vocabulary file whole.
  return tf.strings.substr(tokens, 0, max_token_chars, unit='UTF8_CHAR')


def make_preprocessing_fn(params: TransformParams):
  """The TFT preprocessing_fn for these parameters."""
  def preprocessing_fn(inputs):
    tokens = tokenize(inputs[raw.TEXT], params.max_token_chars,
                      params.keep_punctuation)
    flat_tokens = tokens.flat_values
    # Unit weights make TFT count tokens per batch inside the graph and ship
    # (token, count) pairs to Beam, rather than every occurrence; the same
    # vocabulary.
    vocabulary = tft.vocabulary(
        flat_tokens,
        top_k=params.vocab_size - transformed.NUM_RESERVED_IDS,
        # TFT treats a threshold of 1 as a no-op and warns about it.
        frequency_threshold=(params.min_frequency
                             if params.min_frequency > 1 else None),
        weights=tf.ones_like(flat_tokens, dtype=tf.float32),
        vocab_filename=transformed.TOKEN_VOCABULARY)
    # Vocabulary entries come out as 0..k-1; shifting them past the reserved
    # ids keeps PAD_ID for padding and OOV_ID for unknown tokens.
    token_ids = tft.apply_vocabulary(
        tokens, vocabulary,
        default_value=transformed.OOV_ID - transformed.NUM_RESERVED_IDS)
    token_ids += transformed.NUM_RESERVED_IDS
    token_ids = truncate(token_ids, params.max_len, params.truncation)
    label_ids = tft.compute_and_apply_vocabulary(
        inputs[raw.LABEL], vocab_filename=transformed.LABEL_VOCABULARY)
    return {
        transformed.TOKEN_IDS: token_ids.to_tensor(
            default_value=transformed.PAD_ID, shape=[None, params.max_len]),
        transformed.LENGTH: tokens.row_lengths(),
        transformed.LABEL_ID: label_ids,
        transformed.ID: inputs[raw.ID],
        transformed.TEXT: inputs[raw.TEXT],
    }
  return preprocessing_fn
