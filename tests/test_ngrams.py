"""The n-gram (NBSVM) branch, the hybrid model, and its raw-text export."""
import json
import shutil

import keras
import numpy as np
import pytest

from schemas import serving
from schemas import transformed
from tests.conftest import assert_float32_close
from tests.conftest import synthetic_reviews
from trainer import calibration
from trainer import export
from trainer import fitting
from serving import exports
from trainer import model as model_lib
from trainer import ngrams
from trainer import runs
from trainer import settings as settings_lib
from trainer import train


def distinct(ids, max_order):
  values, present = ngrams.fingerprints(np.array([ids]), max_order)
  values, present = np.asarray(values)[0], np.asarray(present)[0]
  assert (values[~present] == -1).all()
  return values[present].tolist()


def test_each_distinct_ngram_of_the_real_tokens_once():
  assert len(distinct([5, 6, 5, 6, 0, 0], max_order=1)) == 2
  trigrams = distinct([5, 6, 5, 6, 0, 0], max_order=3)
  # 5, 6 | 5 6, 6 5 (5 6 again) | 5 6 5, 6 5 6: padding makes no n-gram.
  assert len(trigrams) == 2 + 2 + 2
  assert trigrams == sorted(trigrams) and min(trigrams) >= 0
  assert distinct([6, 5, 6, 5], max_order=3) == trigrams
  assert distinct([5, 6, 7], max_order=2) != distinct([7, 6, 5], max_order=2)
  # The same ids as a bigram and as two unigrams are different n-grams.
  assert set(distinct([5, 6], max_order=2)) > set(distinct([5, 6], 1))


# Unigrams 2..5. Class 0: [2 2 3], [2 4]; class 1: [3 5], [5 5 5].
TINY_IDS = np.array([[2, 2, 3], [2, 4, 0], [3, 5, 0], [5, 5, 5]])
TINY_LABELS = np.array([0, 0, 1, 1])


def test_naive_bayes_ratios_of_a_tiny_corpus():
  vocabulary = ngrams.Vocabulary.fit([(TINY_IDS, TINY_LABELS)], max_order=1,
                                     num_classes=2, min_count=1)
  rows = [distinct([token], 1)[0] for token in (2, 3, 4, 5)]
  order = np.searchsorted(vocabulary.keys, rows)
  np.testing.assert_array_equal(vocabulary.keys[order], rows)
  # Documents holding each id, binarized: "2" twice in one review counts 1.
  np.testing.assert_array_equal(vocabulary.counts[order],
                                [[2, 0], [1, 1], [1, 0], [0, 2]])
  # p = 1 + class 0 counts = [3, 2, 2, 1] (sum 8), q = [1, 2, 1, 3] (sum 7).
  expected = np.log(np.array([3, 2, 2, 1]) / 8) - np.log(
      np.array([1, 2, 1, 3]) / 7)
  np.testing.assert_allclose(vocabulary.ratios[order, 0], expected,
                             rtol=1e-6)
  np.testing.assert_allclose(vocabulary.ratios[order, 1], -expected,
                             rtol=1e-6)
  # With min_count 2, "4" (one document) is left out of the vocabulary.
  common = ngrams.Vocabulary.fit([(TINY_IDS, TINY_LABELS)], max_order=1,
                                 num_classes=2, min_count=2)
  assert sorted(common.keys.tolist()) == sorted([rows[0], rows[1], rows[3]])


def test_ngram_layer_sums_the_ratios_of_the_known_ngrams_once():
  vocabulary = ngrams.Vocabulary.fit([(TINY_IDS, TINY_LABELS)], max_order=2,
                                     num_classes=2, min_count=1)
  layer = ngrams.NgramLogits(len(vocabulary.keys), 2, max_order=2,
                             initial_weight=1.0)
  layer.build((None, None))
  layer.set_vocabulary(vocabulary)
  # 2, 3 and the bigram "2 3" are known, 9 and "3 9" are not; "2" twice.
  logits = np.asarray(layer(np.array([[2, 3, 2, 9, 0]])))
  known = [distinct([2], 1)[0], distinct([3], 1)[0],
           max(distinct([2, 3], 2))]
  rows = np.searchsorted(vocabulary.keys, known)
  assert (vocabulary.keys[rows] == known).all()
  np.testing.assert_allclose(logits[0], vocabulary.ratios[rows].sum(axis=0),
                             rtol=1e-5)


def random_vocabulary(num_classes, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(2, 50, size=(64, 12))
  return ngrams.Vocabulary.fit([(ids, rng.randint(num_classes, size=64))],
                               max_order=3, num_classes=num_classes,
                               min_count=1)


@pytest.mark.parametrize('kind', ['nbsvm', 'hybrid'])
def test_prediction_does_not_depend_on_padded_length(kind):
  params = model_lib.ModelParams(
      model=kind, embed_dim=8, ff_dim=8, positions='sinusoidal', dropout=0.0,
      ngram_dropout=0.5, transformer_vocab=30, transformer_len=6)
  vocabulary = random_vocabulary(3)
  short = model_lib.build_model(50, 10, 3, params, vocabulary)
  long = model_lib.build_model(50, 30, 3, params, vocabulary)
  long.set_weights(short.get_weights())
  document = [5, 9, 3, 7, 9, 3, 44, 2]  # 8 tokens: longer than the clip
  padded = lambda n: np.array([document + [transformed.PAD_ID] * (n - 8)])
  assert_float32_close(short.predict(padded(10), verbose=0),
                       long.predict(padded(30), verbose=0))
  # The n-gram branch does see the tokens: another document, another output.
  other = np.array([[5, 9, 3, 7, 9, 3, 2, 44, 0, 0]])
  assert not np.allclose(short.predict(other, verbose=0),
                         short.predict(padded(10), verbose=0), atol=1e-4)


def test_nbsvm_model_saves_and_reloads_with_its_vocabulary(tmp_path):
  params = model_lib.ModelParams(model='nbsvm')
  model = model_lib.build_model(50, 12, 3, params, random_vocabulary(3))
  ids = np.random.RandomState(1).randint(0, 50, size=(4, 12))
  model.save(tmp_path / 'model.keras')
  reloaded = keras.models.load_model(tmp_path / 'model.keras')
  assert_float32_close(model.predict(ids, verbose=0),
                       reloaded.predict(ids, verbose=0))


def test_token_clip_keeps_head_and_tail_and_maps_rare_ids_to_oov():
  clip = model_lib.TokenClip(vocab_size=40, max_len=4)
  ids = np.array([[2, 3, 4, 45, 6, 7, 0], [2, 41, 4, 0, 0, 0, 0]])
  np.testing.assert_array_equal(clip(ids), [[2, 3, 6, 7], [2, 1, 4, 0]])


@pytest.fixture(scope='module')
def hybrid(tmp_path_factory):
  """A hybrid trained on synthetic reviews, calibrated on the validation
  split carved out of train, exported; then the preprocessing output is deleted. Returns
  (export_dir, texts, the Keras model's probabilities on them, calibration,
  branch logits on them)."""
  from pipeline import preprocess  # pylint: disable=import-outside-toplevel
  folder = tmp_path_factory.mktemp('hybrid')
  with open(folder / 'reviews.jsonl', 'w') as handle:
    for row in synthetic_reviews(400, 0) + synthetic_reviews(60, 1):
      handle.write(json.dumps(row) + '\n')
  data_dir = folder / 'preprocessed'
  preprocess.run([f'--input={folder}/reviews.jsonl',
                  f'--output_dir={data_dir}', '--split_field=split',
                  '--max_len=24', '--validation_fraction=0.25'])
  args = train.parse_args([
      f'--data_dir={data_dir}', f'--model_dir={folder}/model',
      '--model=hybrid', '--epochs=1',
      '--ngram_epochs=1', '--batch_size=16', '--embed_dim=8', '--ff_dim=8',
      '--ngram_min_count=1', '--transformer_vocab=20', '--seed=3',
      '--folds=0', '--transformer_min_examples=0'])
  settings, data = settings_lib.settings_from_args(args)
  run = runs.Run(settings.model_dir)
  trained = fitting.fit(settings, data, run)
  model, fitted = trained.model, trained.calibration
  export.save(model, data.tft_output, data.label_names, run.export,
              {'calibration': fitted})
  export_dir = run.export
  texts = [b'superb wonderful film', b'dull waste', b'',
           b'the plot the cast the music the ending ' * 3]
  token_ids = data.tft_output.transform_features_layer()(
      {serving.TEXT: np.array(texts)})[transformed.TOKEN_IDS]
  probe = keras.Model(model.inputs, [
      model.get_layer(name).output for name in model_lib.branch_names(model)])
  logits = np.stack([np.asarray(o) for o in probe(token_ids)], axis=1)
  probabilities = np.asarray(model(token_ids))
  shutil.rmtree(data_dir)
  return export_dir, texts, probabilities, fitted, logits


def test_hybrid_export_serves_the_calibrated_model_from_raw_text(hybrid):
  export_dir, texts, probabilities, fitted, logits = hybrid
  signature, metadata = exports.load(export_dir)
  outputs = signature(text=np.array(texts))
  np.testing.assert_allclose(outputs[serving.PROBABILITIES].numpy(),
                             probabilities, atol=1e-5)
  assert [l.decode() for l in outputs[serving.LABEL].numpy()[:2]] == [
      'pos', 'neg']
  # Inside the graph: the branch logits weighted as fitted on validation,
  # divided by the fitted temperature.
  weights = fitted['branch_weights']
  assert sorted(weights) == [model_lib.NGRAM_LOGITS,
                             model_lib.TRANSFORMER_LOGITS]
  assert sum(weights.values()) == pytest.approx(1.0)
  assert fitted['temperature'] != pytest.approx(1.0)
  mixed = (weights[model_lib.TRANSFORMER_LOGITS] * logits[:, 0] +
           weights[model_lib.NGRAM_LOGITS] * logits[:, 1])
  np.testing.assert_allclose(
      probabilities, calibration.softmax(mixed / fitted['temperature']),
      atol=1e-5)
  assert metadata.document['calibration']['fitted_on']['examples'] > 0
