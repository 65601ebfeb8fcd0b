"""Transformed features: what the preprocessing job writes and the trainer reads.

The authoritative feature spec is the one TFT saves in
``transformed_metadata/``; these names are how code on either side refers to
its entries.
"""
from schemas import raw

TOKEN_IDS = 'token_ids'    # int64 [max_len], padded with PAD_ID
LENGTH = 'length'          # int64, token count before truncation
LABEL_ID = 'label_id'      # int64, index into the label vocabulary
# Passed through unchanged from the raw record.
ID = raw.ID
TEXT = raw.TEXT
# Written to the held-out (validation and test) files only: the trainer
# evaluates the exported raw-text model on them, and train files stay a third
# of the size without them.
HELD_OUT_ONLY = [TEXT]

PAD_ID = 0
OOV_ID = 1
NUM_RESERVED_IDS = 2  # token ids below this are not vocabulary entries

# Vocabulary file names under transform_fn/assets/.
TOKEN_VOCABULARY = 'tokens'
LABEL_VOCABULARY = 'labels'

# Files the preprocessing job writes next to transform_fn/: per split,
# <split>-<shard>-of-<shards>.tfrecord.gz.
TFRECORD_SUFFIX = '.tfrecord.gz'


def split_file_pattern(split: str) -> str:
  return f'{split}-*{TFRECORD_SUFFIX}'


PARAMS_FILE = 'preprocess_params.json'
STATS_FILE = 'stats.json'
# stats.json's section on how the splits were made, and what chose a
# record's split there: the data, a hash of the record's group, of its text.
SPLITS_STATS = 'splits'
CHOSEN_BY_DATA, CHOSEN_BY_GROUP, CHOSEN_BY_TEXT = 'data', 'group', 'text'

# The n-gram statistics of the train split, for the trainer's n-gram branch:
# every n-gram of 1 to NGRAM_MAX_ORDER token ids (named by its fingerprint,
# ``serving.ngrams``) that NGRAM_MIN_DOCUMENTS or more train documents hold,
# and how many documents of each class hold it. Gzip TFRecord files
# <NGRAM_FILE_PREFIX>-<shard>-of-<shards>.tfrecord.gz of tf.Examples, each a
# run of rows in four int64 lists of one length: the n-gram's fingerprint,
# its order, a label id and the documents of that label holding it, one row
# for each label with any; a record's rows are sorted by fingerprint, the
# records in no order a reader may rely on. The branch's minimum document
# counts are thresholds over these counts, so the smallest it tries is
# NGRAM_MIN_DOCUMENTS.
NGRAM_FILE_PREFIX = 'ngrams'
NGRAM_FINGERPRINT = 'fingerprint'
NGRAM_ORDER = 'order'
NGRAM_LABEL_ID = LABEL_ID
NGRAM_DOCUMENTS = 'documents'
NGRAM_MAX_ORDER = 3
NGRAM_MIN_DOCUMENTS = 2
# stats.json's section on them: NGRAM_MAX_ORDER, NGRAM_MIN_DOCUMENTS and the
# n-grams kept of each order.
NGRAMS_STATS = 'ngrams'


def ngram_file_pattern() -> str:
  return f'{NGRAM_FILE_PREFIX}-*{TFRECORD_SUFFIX}'
