"""The TF side: normalization, tokenization and the preprocessing_fn."""
import tempfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata
from tensorflow_transform.tf_metadata import schema_utils

from pipeline import transform
from schemas import raw
from schemas import transformed


def tokens(text, max_token_chars=50):
  return [t.decode() for t in transform.tokenize(
      tf.constant([text]), max_token_chars).to_list()[0]]


def test_normalize_lowercases_strips_tags_splits_punctuation():
  assert tokens('A <br /><br />GREAT film, really!') == [
      'a', 'great', 'film', ',', 'really', '!']
  assert tokens("Don't ÉCOUTE—now.") == [
      'don', "'", 't', 'écoute', '—', 'now', '.']


def test_punctuation_can_be_dropped():
  dropped = [t.decode() for t in transform.tokenize(
      tf.constant(["Don't ÉCOUTE—now. 5$!"]), 50,
      keep_punctuation=False).to_list()[0]]
  assert dropped == ['don', 't', 'écoute', 'now', '5']


def test_stray_angle_bracket_does_not_swallow_text():
  assert tokens('3 < 4 and it is fine') == ['3', '<', '4', 'and', 'it', 'is',
                                            'fine']


def test_giant_tokens_are_cut():
  assert tokens('x' * 200000 + ' ok', max_token_chars=50) == ['x' * 50, 'ok']


@pytest.mark.parametrize('truncation, expected', [
    ('head', [[1, 2, 3, 4, 5], [1, 2], []]),
    ('tail', [[5, 6, 7, 8, 9], [1, 2], []]),
    ('head_tail', [[1, 2, 7, 8, 9], [1, 2], []]),
])
def test_truncation_keeps_the_head_the_tail_or_both(truncation, expected):
  tokens = tf.ragged.constant([[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2], []],
                              dtype=tf.int64)
  assert transform.truncate(tokens, 5, truncation).to_list() == expected


@pytest.mark.parametrize('truncation', transform.TRUNCATIONS)
def test_truncation_keeps_what_slicing_each_row_keeps(truncation):
  rng = np.random.default_rng(0)
  rows = [list(range(length)) for length in rng.integers(0, 12, 200)]
  for max_len in (1, 2, 5, 11, 12):
    head = {'head': max_len, 'tail': 0,
            'head_tail': max_len // 2}[truncation]
    expected = [row if len(row) <= max_len else
                row[:head] + row[len(row) - (max_len - head):] for row in rows]
    kept = transform.truncate(tf.ragged.constant(rows, dtype=tf.int64),
                              max_len, truncation)
    assert kept.to_list() == expected


def test_params_are_validated():
  with pytest.raises(ValueError):
    transform.TransformParams(vocab_size=2)
  with pytest.raises(ValueError):
    transform.TransformParams(max_len=0)
  with pytest.raises(ValueError):
    transform.TransformParams(truncation='middle')


def analyze_and_transform(train, evaluation, params):
  """Runs the preprocessing_fn with TFT's Beam implementation, in memory."""
  metadata = dataset_metadata.DatasetMetadata(
      schema_utils.schema_from_feature_spec(raw.RAW_FEATURE_SPEC))
  with tempfile.TemporaryDirectory() as temp, tft_beam.Context(temp_dir=temp):
    transform_fn = ((train, metadata) | tft_beam.AnalyzeDataset(
        transform.make_preprocessing_fn(params)))
    (result, _) = ((evaluation, metadata), transform_fn) | (
        tft_beam.TransformDataset())
  return result


def row(text, label, record_id='x'):
  return {raw.TEXT: text.encode(), raw.LABEL: label.encode(),
          raw.ID: record_id.encode()}


def test_preprocessing_fn_vocabulary_padding_oov_and_labels():
  train = [row('good good good film', 'pos'), row('bad bad film', 'neg'),
           row('good plot', 'pos'), row('rare', 'other')]
  evaluation = [row('good unseen film bad bad film', 'neg', 'e1'),
                row('', 'pos', 'e2')]
  params = transform.TransformParams(vocab_size=5, max_len=4)
  result = analyze_and_transform(train, evaluation, params)
  first, second = result
  # The top 3 (5 minus the 2 reserved) by train frequency: good 4, then film
  # and bad 2 each. TFT documents its order as decreasing frequency, then
  # reverse lexicographical order of the tokens' bytes, so film comes before
  # bad. Ids start after PAD_ID=0 and OOV_ID=1.
  good, film, bad = 2, 3, 4
  # head_tail keeps the first 2 and the last 2 of the 6 tokens.
  assert list(first[transformed.TOKEN_IDS]) == [
      good, transformed.OOV_ID, bad, film]
  assert first[transformed.LENGTH] == 6  # the true length, before truncation
  assert list(second[transformed.TOKEN_IDS]) == [transformed.PAD_ID] * 4
  assert second[transformed.LENGTH] == 0
  # Labels by train frequency: pos (2) first.
  assert second[transformed.LABEL_ID] == 0
  assert first[transformed.ID] == b'e1'
  assert first[transformed.TEXT] == b'good unseen film bad bad film'


def test_vocabulary_is_learned_from_train_only():
  train = [row('alpha beta', 'a'), row('alpha', 'b')]
  evaluation = [row('gamma gamma gamma gamma alpha', 'a')]
  result = analyze_and_transform(
      train, evaluation, transform.TransformParams(vocab_size=10, max_len=6))
  ids = np.array(result[0][transformed.TOKEN_IDS])
  assert list(ids[:5]) == [transformed.OOV_ID] * 4 + [2]
  assert list(ids[5:]) == [transformed.PAD_ID]


def test_min_frequency_sends_rare_tokens_to_oov():
  train = [row('common common rare', 'a')]
  result = analyze_and_transform(train, train, transform.TransformParams(
      vocab_size=10, max_len=3, min_frequency=2))
  assert list(result[0][transformed.TOKEN_IDS]) == [2, 2, transformed.OOV_ID]
