"""Raw records: what every reader yields and what the transform graph takes.

A reader turns any input format into dicts keyed by the names below. The TFT
transform graph sees only the features in ``RAW_FEATURE_SPEC``; the others
(source, split, reason, snippet) steer the Beam jobs around it.
"""
import re
from typing import Optional

import pyarrow as pa
import tensorflow as tf

ID = 'id'
TEXT = 'text'
LABEL = 'label'  # in Unicode NFC, as every reader gives it
SPLIT = 'split'
SOURCE = 'source'
# Set by a reader when a record could not be parsed; the job routes such a
# record to the dead letters instead of processing it.
REASON = 'reason'
SNIPPET = 'snippet'
# The field names of a row, in the records the launcher samples
# (ReadConfig.list_fields): what a job names when a field its flags name is
# missing (never written).
FIELDS = 'fields'
# Set (True) by a reader on a record whose id field holds a value no id can
# be (null, "", an object...), or that lacks the field --id_field named: its
# id is then its file and position, and the jobs count such records (never
# written).
ID_REPLACED = 'id_replaced'
# The record's group (--group_field: a movie, a thread, a sender), read by
# the readers for the preprocessing job: every record of a group goes to the
# same split (never written).
GROUP = 'group'
# Input fields a job passes through to its output untouched (--keep_fields),
# as a dict of field name to value.
KEPT = 'kept'

# Markup in raw text: tags such as <br /> and <p>, which the transform
# removes and a record must hold more than. Bounded so that a stray '<'
# cannot swallow a review; the same pattern in RE2 (TF) and Python's re.
HTML_TAG = r'<[^<>]{0,200}>'


def has_surrogates(value: str) -> bool:
  """Whether a string holds a lone surrogate, which no output can encode."""
  # Most text is ASCII, which Python knows without a look at it; in the
  # rest, the UTF-8 codec finds one faster than a regex search does
  # (BENCHMARKS.md).
  if value.isascii():
    return False
  try:
    value.encode('utf-8')
  except UnicodeEncodeError:
    return True
  return False


def is_undecodable(text: str) -> bool:
  """Whether a text holds what no real text does, whatever it decoded from:
  a lone surrogate (a JSON \\ud800 escape, a byte invalid in the encoding)
  or a NUL (binary data, or UTF-16 read as UTF-8). The readers reject such
  a record (undecodable_text); the Python API and ``trainer.predict``
  refuse such a text: every way in classifies the same texts."""
  return '\x00' in text or has_surrogates(text)


# Inputs of the transform graph. The id and the text also pass through it so
# that the trainer can evaluate the exported raw-text model on the held-out
# splits.
RAW_FEATURE_SPEC = {
    ID: tf.io.FixedLenFeature([], tf.string),
    TEXT: tf.io.FixedLenFeature([], tf.string),
    LABEL: tf.io.FixedLenFeature([], tf.string),
}

# The Arrow layout TFT's tensor adapter reads a dense scalar feature from: one
# value per row, held in a list column.
RAW_ARROW_SCHEMA = pa.schema(
    [(name, pa.large_list(pa.large_binary())) for name in RAW_FEATURE_SPEC])

TRAIN = 'train'
# Picks everything the trainer chooses: the epoch, the temperature, the
# hybrid's branch weights.
VALIDATION = 'validation'
# Measured once, at the end, by nothing that was chosen on it.
TEST = 'test'
SPLITS = (TRAIN, VALIDATION, TEST)
# The splits the trainer never fits on; labels they hold must occur in train.
HELD_OUT = (VALIDATION, TEST)
# Split names found in data (a split column, an aclImdb folder) and the split
# of ours each one means.
SPLIT_ALIASES = {
    'train': TRAIN,
    'training': TRAIN,
    'validation': VALIDATION,
    'valid': VALIDATION,
    'dev': VALIDATION,
    'test': TEST,
    'eval': TEST,
}


def group_from(value: str, pattern: re.Pattern) -> Optional[str]:
  """The group ``pattern`` finds in ``value``: the non-empty capture groups
  joined, or the whole match when the pattern captures nothing; None when it
  does not match or finds only ''."""
  match = pattern.search(value)
  if not match:
    return None
  captured = match.groups()
  return (''.join(part for part in captured if part) if captured
          else match.group(0)) or None
