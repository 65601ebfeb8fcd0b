"""The trainer: layers, masking, save/load, a short real training run, the
raw-text export contract and trainer.predict."""
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from schemas import serving
from schemas import transformed
from tests.conftest import run_module
from trainer import data as data_lib
from trainer import evaluate
from trainer import export
from trainer import model as model_lib
from trainer import predict

def test_short_training_beats_chance_clearly(trained):
  model_dir, _, metrics = trained
  assert metrics['examples'] == 200
  assert metrics['accuracy'] > 0.9
  assert metrics['roc_auc'] > 0.95
  for name in (evaluate.METRICS_FILE, evaluate.REPORT_FILE,
               evaluate.HISTORY_FILE, evaluate.HISTORY_PLOT,
               evaluate.CONFUSION_PLOT):
    assert (model_dir / name).exists(), name
  assert (model_dir / evaluate.HISTORY_PLOT).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert list((model_dir / 'logs').rglob('events.out.tfevents*'))
  assert (model_dir / 'checkpoints' / 'best.weights.h5').exists()


def test_export_takes_raw_text_without_the_preprocessing_output(trained):
  model_dir, export_dir, _ = trained
  assert export.resolve(str(model_dir)) == export_dir
  assert export_dir.split('/')[-1].isdigit()
  signature, metadata = export.load(str(model_dir))
  outputs = signature(text=np.array([b'superb wonderful film', b'dull waste',
                                     b'', 'caf\u00e9 \u2014'.encode()]))
  labels = [label.decode() for label in outputs[serving.LABEL].numpy()]
  assert labels[:2] == ['pos', 'neg']
  probabilities = outputs[serving.PROBABILITIES].numpy()
  assert probabilities.shape == (4, 2)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(outputs[serving.CONFIDENCE].numpy(),
                             probabilities.max(axis=1))
  assert sorted(metadata['label_names']) == ['neg', 'pos']
  assert [metadata['label_names'][i] for i in outputs[
      serving.LABEL_ID].numpy()] == labels
  assert metadata['preprocessing']['transform']['max_len'] == 24
  assert metadata['training']['epochs'] == 4


def test_predict_cli_matches_the_signature(trained):
  model_dir, _, _ = trained
  texts = ['superb wonderful film', 'dull waste of a plot']
  signature, metadata = export.load(str(model_dir))
  direct = predict.predict(signature, metadata['label_names'], texts)
  result = run_module('trainer.predict', f'--model_dir={model_dir}', '--json',
                      *texts)
  assert result.returncode == 0, result.stderr[-2000:]
  printed = [json.loads(line) for line in result.stdout.splitlines()]
  assert [p['label'] for p in printed] == [d['label'] for d in direct]
  for printed_row, direct_row in zip(printed, direct):
    for label, probability in direct_row['probabilities'].items():
      assert printed_row['probabilities'][label] == pytest.approx(probability,
                                                                  abs=1e-6)


def test_trainer_job_error_on_a_missing_data_dir(tmp_path):
  result = run_module('trainer.train', f'--data_dir={tmp_path}/missing',
                      f'--model_dir={tmp_path}/model')
  assert result.returncode == 2
  assert 'is not a preprocessing output' in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize('mode', ['mean', 'max'])
def test_padding_does_not_change_attention_or_pooling(mode):
  keras.utils.set_random_seed(1)
  block = model_lib.TransformerBlock(8, 2, 8, dropout=0.0)
  pooling = model_lib.MaskedPooling(mode)
  inputs = np.random.normal(size=(2, 6, 8)).astype('float32')
  mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=bool)
  noisy = inputs.copy()
  noisy[~mask] = np.random.normal(size=(int((~mask).sum()), 8)) * 100
  clean_out = pooling(block(inputs, mask=mask), mask=mask)
  noisy_out = pooling(block(noisy, mask=mask), mask=mask)
  np.testing.assert_allclose(clean_out, noisy_out, atol=1e-5)
  unmasked = pooling(block(noisy))
  assert not np.allclose(clean_out, unmasked, atol=1e-3)


def test_prediction_does_not_depend_on_padded_length():
  params = model_lib.ModelParams(embed_dim=8, num_heads=2, ff_dim=8,
                                 positions='sinusoidal', dropout=0.0,
                                 bigram_buckets=13)
  short = model_lib.build_model(50, 10, 3, params)
  long = model_lib.build_model(50, 30, 3, params)
  long.set_weights(short.get_weights())
  document = [5, 9, 3, 7]
  padded = lambda n: np.array([document + [transformed.PAD_ID] * (n - 4)])
  np.testing.assert_allclose(short.predict(padded(10), verbose=0),
                             long.predict(padded(30), verbose=0), atol=1e-6)


def test_embedding_shapes_mask_and_positions():
  for positions in ('learned', 'sinusoidal'):
    layer = model_lib.TokenAndPositionEmbedding(12, 40, 6, positions)
    ids = np.array([[4, 5, 0, 0], [1, 2, 3, 0]])
    assert tuple(layer(ids).shape) == (2, 4, 6)
    np.testing.assert_array_equal(layer.compute_mask(ids), ids != 0)
  table = model_lib.sinusoidal_positions(4, 6)
  np.testing.assert_allclose(table[0], [0, 1, 0, 1, 0, 1])


def test_bigram_embedding_adds_each_real_pair_and_nothing_at_padding():
  layer = model_lib.TokenAndPositionEmbedding(4, 40, 6, 'sinusoidal',
                                              bigram_buckets=7)
  ids = np.array([[4, 5, 6, 0]])
  embedded = np.asarray(layer(ids))
  unigrams = (np.asarray(layer.token_embedding(ids)) +
              model_lib.sinusoidal_positions(4, 6))
  pairs = np.asarray(layer.bigram_embedding(
      np.array([(4 * 40 + 5) % 7, (5 * 40 + 6) % 7])))
  np.testing.assert_allclose(embedded[0, :2], unigrams[0, :2] + pairs,
                             atol=1e-6)
  # The last word's pair and the padding's reach padding: unigrams only.
  np.testing.assert_allclose(embedded[0, 2:], unigrams[0, 2:], atol=1e-6)
  # The same words in another order are another set of pairs.
  swapped = np.asarray(layer(np.array([[5, 4, 6, 0]])))
  assert not np.allclose(swapped.sum(axis=1), embedded.sum(axis=1), atol=1e-4)


def test_token_dropout_hides_real_tokens_only_while_training():
  layer = model_lib.TokenDropout(0.3, seed=3)
  ids = np.random.RandomState(0).randint(2, 50, size=(64, 40))
  ids[:, 30:] = transformed.PAD_ID
  dropped = np.asarray(layer(ids, training=True))
  changed = dropped != ids
  assert (dropped[changed] == transformed.OOV_ID).all()
  assert not changed[:, 30:].any()
  assert 0.25 < changed[:, :30].mean() < 0.35
  np.testing.assert_array_equal(layer(ids, training=False), ids)


def test_model_saves_and_reloads_with_its_custom_layers(tmp_path):
  params = model_lib.ModelParams(embed_dim=8, num_heads=2, ff_dim=8,
                                 num_layers=2, pooling='max',
                                 bigram_buckets=11, token_dropout=0.2)
  model = model_lib.build_model(30, 7, 4, params)
  ids = np.random.randint(0, 30, size=(3, 7))
  model.save(tmp_path / 'model.keras')
  reloaded = keras.models.load_model(tmp_path / 'model.keras')
  np.testing.assert_allclose(model.predict(ids, verbose=0),
                             reloaded.predict(ids, verbose=0), atol=1e-6)
  assert [l.name for l in reloaded.layers] == [l.name for l in model.layers]
  assert reloaded.get_layer('embedding').bigram_buckets == 11
  assert reloaded.get_layer('token_dropout').rate == 0.2


def test_length_buckets_cut_padding_only_and_keep_every_example():
  lengths = np.arange(50) % 20 + 1
  token_ids = np.zeros((50, 20), dtype=np.int64)
  for row, length in enumerate(lengths):
    token_ids[row, :length] = np.arange(length) + 2
  examples = tf.data.Dataset.from_tensor_slices((token_ids, np.arange(50)))
  seen = []
  for batch_ids, batch_rows in data_lib.length_buckets(examples, 4, 8, False):
    width = batch_ids.shape[1]
    assert width in (8, 16, 20)
    for ids, row in zip(batch_ids.numpy(), batch_rows.numpy()):
      np.testing.assert_array_equal(ids[:lengths[row]], token_ids[row, :lengths[row]])
      assert lengths[row] <= width and (width == 8 or lengths[row] > width - 8)
      seen.append(row)
  assert sorted(seen) == list(range(50))


def test_model_params_are_validated():
  with pytest.raises(ValueError):
    model_lib.ModelParams(pooling='sum')
  with pytest.raises(ValueError):
    model_lib.ModelParams(key_dim=-1)


def test_seed_model_attention_is_the_keras_io_one():
  model = model_lib.build_model(100, 12, 2, model_lib.ModelParams())
  attention = model.get_layer('transformer_0').attention
  # keras.io: MultiHeadAttention(num_heads=2, key_dim=embed_dim).
  assert (attention.num_heads, attention.key_dim) == (2, 32)
  assert tuple(attention.output_dense.kernel.shape) == (2, 32, 32)
  narrow = model_lib.build_model(100, 12, 2, model_lib.ModelParams(
      embed_dim=10, num_heads=3, key_dim=4))
  assert narrow.get_layer('transformer_0').attention.key_dim == 4
  assert tuple(narrow.output.shape) == (None, 2)


def test_classification_metrics_and_auc():
  labels = np.array([0, 0, 1, 1, 1])
  probabilities = np.array([[.9, .1], [.4, .6], [.3, .7], [.8, .2], [.1, .9]])
  metrics = evaluate.classification_metrics(labels, probabilities, ['a', 'b'])
  assert metrics['accuracy'] == pytest.approx(3 / 5)
  assert metrics['confusion_matrix']['rows_true_columns_predicted'] == [
      [1, 1], [1, 2]]
  assert metrics['per_class']['b']['precision'] == pytest.approx(2 / 3)
  assert metrics['per_class']['b']['recall'] == pytest.approx(2 / 3)
  assert metrics['per_class']['a']['f1'] == pytest.approx(0.5)
  # Positives' scores .7, .2, .9 against negatives' .1, .6: 5 of 6 pairs.
  assert metrics['roc_auc'] == pytest.approx(5 / 6)
  assert evaluate.roc_auc(np.array([1, 0]), np.array([0.5, 0.5])) == 0.5
