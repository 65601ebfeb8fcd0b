"""The preprocessing job on slices of the real corpora, read via the fetch code."""
import collections
import glob
import math
import os
import pathlib

import tensorflow as tf

from pipeline import email_text
from pipeline import preprocess
from pipeline.preprocessing import splits as split_lib
from pipeline import readers
from pipeline import transform
from schemas import raw
from tests.conftest import dead_letters
from tests.conftest import read_examples


def nearest_rank(values, share):
  """The smallest value with at least ``share`` of ``values`` at or below it:
  how the job defines its percentiles."""
  return sorted(values)[math.ceil(share * len(values)) - 1]


def test_imdb_slice_keeps_the_official_split(corpora, tmp_path):
  root = corpora('imdb')
  pattern = f'{root}/*/*/1??_0.txt'
  stats = preprocess.run([
      f'--input={pattern}', '--format=files',
      f'--output_dir={tmp_path}/out', '--vocab_size=2000'])
  # The test/ folder is test; validation is carved out of train/ by the
  # hash of each review's text.
  counts = {split: collections.Counter() for split in raw.SPLITS}
  for path in glob.glob(pattern):
    record = readers.read_document(path, readers.ReadConfig(format='files'),
                                   False)
    split = split_lib.assign_split(record[raw.TEXT], record[raw.SPLIT],
                                    0.2, 0.1)
    counts[split][record[raw.LABEL]] += 1
  assert counts[raw.VALIDATION] and counts[raw.TEST] == {'neg': 100,
                                                         'pos': 100}
  assert stats['records'] == {'read': 400, 'rejected': 0, 'ids_replaced': 0,
                              'written': {split: sum(counts[split].values())
                                          for split in raw.SPLITS}}
  assert stats['labels']['counts'] == {split: dict(counts[split])
                                       for split in raw.SPLITS}
  assert stats['vocabulary_size'] == 2000
  evaluation = read_examples(f'{tmp_path}/out', raw.TEST)
  assert all(b'/test/' in e['id'] for e in evaluation)
  validation = read_examples(f'{tmp_path}/out', raw.VALIDATION)
  assert all(b'/train/' in e['id'] for e in validation)
  # The lengths are those of the job's own tokenizer, with its defaults, over
  # both splits. On this slice: p50 218, p90 567, max 1161 tokens.
  texts = [pathlib.Path(path).read_bytes() for path in glob.glob(pattern)]
  defaults = transform.TransformParams()
  tokens = transform.tokenize(tf.constant(texts), defaults.max_token_chars,
                              defaults.keep_punctuation)
  lengths = tokens.row_lengths().numpy().tolist()
  assert stats['token_length']['p50'] == nearest_rank(lengths, 0.5)
  assert stats['token_length']['p90'] == nearest_rank(lengths, 0.9)
  assert stats['token_length']['max'] == max(lengths)


def test_spamassassin_slice_parses_every_email(corpora, tmp_path):
  root = corpora('spamassassin')
  pattern = f'{root}/*/*.00[0-4]??.*'
  files = glob.glob(pattern)
  stats = preprocess.run([
      f'--input={pattern}', '--format=email', f'--output_dir={tmp_path}/out',
      '--test_fraction=0.2'])
  records = stats['records']
  assert records['read'] == len(files) > 400
  # Non-UTF-8 and multipart mail is decoded, not rejected; every message of
  # the slice has a subject or a text body, and the largest file (300 kB) is
  # under the default --max_text_bytes of 1 MiB: no dead letter at all.
  assert records['rejected'] == 0 and not dead_letters(f'{tmp_path}/out')
  # The split is the hash of each message's text; 485 of the 2245 messages
  # land in test.
  texts = [email_text.email_to_text(pathlib.Path(path).read_bytes())
           for path in files]
  splits = collections.Counter(split_lib.hash_split(text, 0.2, 0.1)
                               for text in texts)
  assert records['written'] == {split: splits[split] for split in raw.SPLITS}
  assert splits[raw.VALIDATION]
  assert set(stats['labels']['names']) == {'ham', 'spam'}
  assert os.path.exists(f'{tmp_path}/out/transform_fn/saved_model.pb')
