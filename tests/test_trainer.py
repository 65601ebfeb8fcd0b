"""The trainer: layers, masking, save/load, a short real training run, the
raw-text export contract, trainer.predict, the training flags and the
trainer's guards."""
import dataclasses
import glob
import json
import logging
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import cli
from pipeline import preprocess
from schemas import raw
from schemas import serving
from schemas import transformed
from tests.conftest import assert_float32_close
from tests.conftest import float32_approx
from tests.conftest import REPO
from tests.conftest import run_module
from tests.conftest import synthetic_reviews
from tests.conftest import TRAIN_FLAGS
from tests.conftest import write_jsonl
from trainer import data as data_lib
from trainer import evaluate
from serving import exports
from serving import predictions
from trainer import model as model_lib
from trainer import predict
from trainer import branch_fit
from trainer import ngram_fit
from trainer import selection
from trainer import settings as settings_lib
from trainer import train

# Flags of a small, fast training run.
TINY_MODEL = ['--model=transformer', '--batch_size=16', '--embed_dim=8',
              '--ff_dim=8', '--epochs=2', '--folds=0']


def preprocess_rows(folder, rows, *flags):
  """A preprocessing output of ``rows``, split by their split field."""
  write_jsonl(folder / 'rows.jsonl', rows)
  data_dir = folder / 'preprocessed'
  preprocess.run([f'--input={folder}/rows.jsonl', f'--output_dir={data_dir}',
                  '--split_field=split', '--max_len=16', *flags])
  return data_dir


def test_short_training_beats_chance_clearly(trained):
  model_dir, _, metrics = trained
  assert metrics['test']['examples'] == 200
  assert metrics['test']['accuracy'] > 0.9
  assert metrics['test']['roc_auc'] > 0.95
  for name in (evaluate.METRICS_FILE, evaluate.REPORT_FILE,
               evaluate.HISTORY_FILE, evaluate.HISTORY_PLOT,
               evaluate.confusion_plot(raw.VALIDATION),
               evaluate.confusion_plot(raw.TEST)):
    assert (model_dir / name).exists(), name
  assert (model_dir / evaluate.HISTORY_PLOT).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert list((model_dir / 'logs').rglob('events.out.tfevents*'))
  assert (model_dir / 'checkpoints' / 'best.weights.h5').exists()


def test_metrics_report_validation_and_test_and_the_selecting_split(trained):
  model_dir, _, metrics = trained
  on_disk = json.loads((model_dir / evaluate.METRICS_FILE).read_text())
  assert on_disk == metrics
  assert metrics['selected_on'] == raw.VALIDATION
  _, metadata = exports.load(str(model_dir))
  written = metadata.document['data_stats']['records']['written']
  for split in raw.HELD_OUT:
    section = metrics[split]
    assert section['examples'] == written[split] > 0
    assert set(section) >= {'accuracy', 'per_class', 'macro_f1', 'roc_auc',
                            'confusion_matrix', 'calibration'}
    assert sum(map(sum, section['confusion_matrix'][
        'rows_true_columns_predicted'])) == section['examples']
    for stage in ('before', 'after'):
      assert 0 <= section['calibration'][stage]['ece'] <= 1
    assert section['calibration']['temperature'] == (
        metadata.document['calibration']['temperature'])
  # The temperature was fitted on validation: no worse there than T = 1.
  fitted = metrics['validation']['calibration']
  assert fitted['after']['nll'] <= fitted['before']['nll'] + 1e-4
  report = (model_dir / evaluate.REPORT_FILE).read_text()
  assert '| | validation | test |' in report
  assert f'{metrics["test"]["accuracy"]:.4f}' in report
  assert f'{metrics["validation"]["accuracy"]:.4f}' in report
  # Which split chose what, and how the preprocessing job made it: the data
  # named the test records; validation was carved from train by text hash.
  assert ('The validation split chose the epoch (early stopping), the '
          'temperature and any branch weights. Its records: '
          f'{written[raw.VALIDATION]} by a hash of their text.') in report
  assert ('The test split chose nothing and is reported once, here. Its '
          f'records: {written[raw.TEST]} named by the data.') in report


def test_export_takes_raw_text_without_the_preprocessing_output(trained):
  model_dir, export_dir, _ = trained
  assert exports.resolve(str(model_dir)) == export_dir
  assert export_dir.split('/')[-1].isdigit()
  signature, metadata = exports.load(str(model_dir))
  outputs = signature(text=np.array([b'superb wonderful film', b'dull waste',
                                     b'', 'caf\u00e9 \u2014'.encode()]))
  labels = [label.decode() for label in outputs[serving.LABEL].numpy()]
  assert labels[:2] == ['pos', 'neg']
  probabilities = outputs[serving.PROBABILITIES].numpy()
  assert probabilities.shape == (4, 2)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(outputs[serving.CONFIDENCE].numpy(),
                             probabilities.max(axis=1))
  assert sorted(metadata.label_names) == ['neg', 'pos']
  assert [metadata.label_names[i] for i in outputs[
      serving.LABEL_ID].numpy()] == labels
  assert metadata.document['preprocessing']['transform']['max_len'] == 24
  assert metadata.document['training']['epochs'] == 4


def test_predict_cli_matches_the_signature(trained):
  model_dir, _, _ = trained
  texts = ['superb wonderful film', 'dull waste of a plot']
  signature, metadata = exports.load(str(model_dir))
  direct = predict.predict(signature, metadata.label_names, texts)
  result = run_module('trainer.predict', f'--model_dir={model_dir}', '--json',
                      *texts)
  assert result.returncode == 0, result.stderr[-2000:]
  printed = [json.loads(line) for line in result.stdout.splitlines()]
  assert [p['label'] for p in printed] == [d['label'] for d in direct]
  for printed_row, direct_row in zip(printed, direct):
    for label, probability in direct_row['probabilities'].items():
      assert printed_row['probabilities'][label] == float32_approx(
          probability)


# What Keras warned in every training run while it had to find the end of
# an epoch by running out of data, and was offered to shuffle a dataset.
KERAS_INPUT_WARNINGS = ('Your input ran out of data',
                        '`shuffle=True` was passed')


def keras_input_warnings(recorded):
  return [str(warning.message) for warning in recorded
          if str(warning.message).startswith(KERAS_INPUT_WARNINGS)]


def test_a_split_over_the_cache_budget_streams_to_the_same_accuracy(
    synthetic_preprocessed, trained, tmp_path, caplog, recwarn):
  caplog.set_level(logging.INFO)
  metrics, _ = train.run([
      f'--data_dir={synthetic_preprocessed}', f'--model_dir={tmp_path}',
      *TRAIN_FLAGS, '--cache=auto', '--cache_memory_share=1e-9'])
  assert not keras_input_warnings(recwarn)
  assert 'train split takes' in caplog.text
  assert 'read from its files every epoch' in caplog.text
  assert 'cached in memory' not in caplog.text
  cached_accuracy = trained[2][raw.TEST]['accuracy']
  assert metrics[raw.TEST]['accuracy'] >= 0.9
  assert abs(metrics[raw.TEST]['accuracy'] - cached_accuracy) <= 0.05


def split_of(examples, max_len):
  """Preprocessed data as the cache policy sees it: counts and max_len."""
  return data_lib.PreprocessedData(
      data_dir='', tft_output=None, params={},
      stats={'records': {'written': {raw.TRAIN: examples}}},
      label_names=['neg', 'pos'], vocab_size=10, max_len=max_len)


def test_auto_caches_a_split_only_within_the_budget():
  data = split_of(1000, 100)
  size = data_lib.parsed_bytes(data, raw.TRAIN)
  assert size >= 1000 * 100 * 8
  assert data_lib.cache_in_memory('auto', data, raw.TRAIN, size)
  assert not data_lib.cache_in_memory('auto', data, raw.TRAIN, size - 1)
  assert data_lib.cache_in_memory('memory', data, raw.TRAIN, 0)
  assert not data_lib.cache_in_memory('none', data, raw.TRAIN, 10 * size)
  with pytest.raises(ValueError, match='cache must be one of'):
    data_lib.cache_in_memory('disk', data, raw.TRAIN, size)
  assert data_lib.available_memory() > 0


def test_the_shuffle_buffer_is_bounded_by_the_budget():
  data = split_of(100000, 100)
  per_example = data_lib.parsed_bytes(data, raw.TRAIN) // 100000
  assert data_lib.shuffle_buffer(data, raw.TRAIN, 10**12) == 50000
  assert data_lib.shuffle_buffer(data, raw.TRAIN, 2000 * per_example) == 2000
  assert data_lib.shuffle_buffer(data, raw.TRAIN, 0) == 1024
  assert data_lib.shuffle_buffer(split_of(500, 100), raw.TRAIN, 0) == 500


def test_trainer_job_error_on_a_missing_data_dir(tmp_path):
  result = run_module('trainer.train', f'--data_dir={tmp_path}/missing',
                      f'--model_dir={tmp_path}/model')
  assert result.returncode == 2
  assert 'is not a preprocessing output' in result.stderr.strip().splitlines()[-1]


def test_nan_loss_is_a_job_error_and_nothing_is_exported(preprocessed,
                                                         tmp_path):
  with pytest.raises(cli.JobError, match='nan'):
    # A learning rate this large makes the weights overflow at once.
    train.run([f'--data_dir={preprocessed}', f'--model_dir={tmp_path}/model',
               '--learning_rate=1e30', *TINY_MODEL])
  assert not (tmp_path / 'model' / serving.EXPORT_DIR).exists()


def test_a_corpus_without_a_shared_ngram_fails_the_default_model(tmp_path):
  # Every document's words are its own: the search on validation finds no
  # n-gram in two training documents, and says what would train.
  rows = [{'id': str(i), 'text': f'w{i} x{i}', 'label': 'ab'[i % 2],
           'split': 'train' if i < 40 else ('validation' if i < 50 else 'test')}
          for i in range(60)]
  preprocessed = preprocess_rows(tmp_path, rows)
  with pytest.raises(cli.JobError, match=(
      'no n-gram is in 2 training documents: try --model=transformer or '
      '--ngram_min_count=1')):
    train.run([f'--data_dir={preprocessed}', f'--model_dir={tmp_path}/model'])
  assert not (tmp_path / 'model' / serving.EXPORT_DIR).exists()


@pytest.mark.parametrize('make_rows, validation_fraction, message', [
    (lambda: [row for row in synthetic_reviews(20, 0) + synthetic_reviews(
        8, 1) if row['label'] == 'pos'], 0.5, 'at least two classes'),
    (lambda: synthetic_reviews(20, 0), 0.5, 'the test split is empty'),
    (lambda: synthetic_reviews(20, 0) + synthetic_reviews(8, 1), 0,
     'the validation split is empty'),
])
def test_untrainable_data_is_a_job_error_before_training(
    tmp_path, make_rows, validation_fraction, message):
  data_dir = preprocess_rows(tmp_path, make_rows(),
                             f'--validation_fraction={validation_fraction}')
  with pytest.raises(cli.JobError, match=message):
    train.run([f'--data_dir={data_dir}', f'--model_dir={tmp_path}/model',
               *TINY_MODEL])
  assert not (tmp_path / 'model').exists()


class ConstantClassifier(tf.Module):
  """The export's serving signature, answering ``label`` (the second class)
  at 0.75 to any text."""

  def __init__(self, label='pos'):
    super().__init__()
    self.label = label

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.string, name=serving.TEXT)])
  def classify(self, text):
    count = tf.shape(text)[0]
    return {
        serving.LABEL: tf.fill([count], self.label),
        serving.LABEL_ID: tf.fill([count], tf.constant(1, tf.int64)),
        serving.CONFIDENCE: tf.fill([count], 0.75),
        serving.PROBABILITIES: tf.tile([[0.25, 0.75]], [count, 1]),
    }


def tiny_export(folder, metadata, label='pos'):
  """An export folder as the trainer lays it out, without training."""
  module = ConstantClassifier(label)
  tf.saved_model.save(module, str(folder),
                      signatures={serving.SIGNATURE: module.classify})
  (folder / 'assets.extra').mkdir()
  (folder / serving.METADATA_FILE).write_text(json.dumps(metadata))
  return folder


def fake_version(model_dir, version, saved_model=True, metadata=True):
  folder = model_dir / serving.EXPORT_DIR / str(version)
  folder.mkdir(parents=True)
  if saved_model:
    (folder / 'saved_model.pb').write_bytes(b'')
  if metadata:
    (folder / 'assets.extra').mkdir()
    (folder / serving.METADATA_FILE).write_text('{}')
  return folder


def test_resolve_skips_incomplete_newer_versions_with_a_warning(tmp_path,
                                                                caplog):
  fake_version(tmp_path, 50)
  complete = fake_version(tmp_path, 100)
  incomplete = [fake_version(tmp_path, 200, saved_model=False, metadata=False),
                fake_version(tmp_path, 300, metadata=False),
                fake_version(tmp_path, 400, saved_model=False)]
  with caplog.at_level(logging.WARNING):
    assert exports.resolve(str(tmp_path)) == str(complete)
  for folder in incomplete:
    assert str(folder) in caplog.text
  shutil.rmtree(tmp_path / serving.EXPORT_DIR / '50')
  shutil.rmtree(complete)
  with pytest.raises(exports.ExportError, match='no exported model'):
    exports.resolve(str(tmp_path))


def test_metadata_without_label_names_is_an_export_error(tmp_path):
  tiny_export(tmp_path / serving.EXPORT_DIR / '1', {'version': 1})
  with pytest.raises(exports.ExportError, match='label_names'):
    exports.load(str(tmp_path))
  with pytest.raises(cli.JobError, match='label_names'):
    predict.run([f'--model_dir={tmp_path}', 'some text'])


@pytest.mark.parametrize('edit, message', [
    (lambda m: {**m, 'label_names': m['label_names'][::-1]},
     'label vocabulary is'),
    # Its drift reference, with no share for the extra label, says so
    # first.
    (lambda m: {**m, 'label_names': m['label_names'] + ['meh']},
     'label vocabulary is|label_shares'),
    (lambda m: {**m, 'label_names': [m['label_names'][0]] * 2},
     'names a label twice'),
    (lambda m: {**m, 'version': str(m['version'])}, 'no version'),
    (lambda m: {**m, 'version': 2**63}, 'no version'),
    (lambda m: {**m, 'version': True}, 'no version'),
])
def test_metadata_that_does_not_describe_its_graph_is_refused(
    trained, tmp_path, edit, message):
  """Every job that loads an export checks its metadata against the graph:
  one error line and exit 2, not labels flipped or a traceback later."""
  _, export_dir, _ = trained
  copy = pathlib.Path(shutil.copytree(export_dir, tmp_path / 'export'))
  metadata = json.loads((copy / serving.METADATA_FILE).read_text())
  (copy / serving.METADATA_FILE).write_text(json.dumps(edit(metadata)))
  with pytest.raises(exports.ExportError, match=message):
    exports.load(str(copy))
  result = run_module('trainer.predict', f'--model_dir={copy}', 'superb')
  assert result.returncode == cli.EXIT_JOB_ERROR
  assert result.stderr.splitlines()[-1].startswith('error: ') and (
      re.search(message, result.stderr)), result.stderr[-2000:]
  assert not result.stdout


def test_a_version_folder_whose_metadata_names_another_version_is_refused(
    tmp_path):
  # Every score would name a model that did not make it.
  tiny_export(tmp_path / serving.EXPORT_DIR / '1',
              {'version': 7, 'label_names': ['neg', 'pos']})
  with pytest.raises(exports.ExportError,
                     match='says version 7, but it is the metadata of '
                     'version folder 1'):
    exports.load(str(tmp_path))


def test_a_graph_whose_labels_contradict_the_metadata_is_refused(tmp_path):
  """No vocabulary file to compare with: the graph's own answers are."""
  tiny_export(tmp_path / serving.EXPORT_DIR / '1',
              {'version': 1, 'label_names': ['pos', 'neg']})
  with pytest.raises(exports.ExportError, match='most probable'):
    exports.load(str(tmp_path))


def test_predict_prints_no_cuda_lines_on_a_machine_without_a_gpu(tmp_path):
  if glob.glob('/dev/nvidia[0-9]*'):
    pytest.skip('a GPU is present, and lines about CUDA may matter')
  tiny_export(tmp_path / serving.EXPORT_DIR / '1',
              {'version': 1, 'label_names': ['neg', 'pos']})
  env = {name: value for name, value in os.environ.items()
         if name != 'TF_CPP_MIN_LOG_LEVEL'}
  result = subprocess.run(
      [sys.executable, '-m', 'trainer.predict', f'--model_dir={tmp_path}',
       'some text'], capture_output=True, text=True, env=env, cwd=REPO,
      timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.startswith('pos\t0.7500\t')
  lines = (result.stdout + result.stderr).splitlines()
  assert not [line for line in lines
              if re.search(r'cuda|absl::InitializeLog', line, re.IGNORECASE)]


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
  params = model_lib.ModelParams(model='transformer', embed_dim=8,
                                 num_heads=2, ff_dim=8,
                                 positions='sinusoidal', dropout=0.0,
                                 bigram_buckets=13)
  short = model_lib.build_model(50, 10, 3, params)
  long = model_lib.build_model(50, 30, 3, params)
  long.set_weights(short.get_weights())
  document = [5, 9, 3, 7]
  padded = lambda n: np.array([document + [transformed.PAD_ID] * (n - 4)])
  assert_float32_close(short.predict(padded(10), verbose=0),
                       long.predict(padded(30), verbose=0))


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
  assert_float32_close(embedded[0, :2], unigrams[0, :2] + pairs)
  # The last word's pair and the padding's reach padding: unigrams only.
  assert_float32_close(embedded[0, 2:], unigrams[0, 2:])
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
  params = model_lib.ModelParams(model='transformer', embed_dim=8,
                                 num_heads=2, ff_dim=8,
                                 num_layers=2, pooling='max',
                                 bigram_buckets=11, token_dropout=0.2)
  model = model_lib.build_model(30, 7, 4, params)
  ids = np.random.randint(0, 30, size=(3, 7))
  model.save(tmp_path / 'model.keras')
  reloaded = keras.models.load_model(tmp_path / 'model.keras')
  assert_float32_close(model.predict(ids, verbose=0),
                       reloaded.predict(ids, verbose=0))
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


@pytest.mark.parametrize('train_examples, epochs', [
    (22_700, 2),    # IMDB's train split less validation
    (3_400, 14),    # SMS's
    (1_800, 20),    # 2,000 documents: at most MAX_EPOCHS
    (10**7, 2),     # a large corpus: at least MIN_EPOCHS
])
def test_default_epochs_make_about_the_target_steps(train_examples, epochs):
  assert settings_lib.default_epochs(train_examples, 32) == epochs


def test_without_folds_validation_chooses_the_ngram_minimum_count(
    synthetic_preprocessed, tmp_path):
  metrics, export_dir = train.run([
      f'--data_dir={synthetic_preprocessed}', f'--model_dir={tmp_path}',
      '--batch_size=16', '--embed_dim=8', '--ff_dim=8', '--folds=0'])
  training = exports.read_metadata(export_dir)['training']
  assert training['model'] == 'hybrid'
  data = data_lib.PreprocessedData.load(str(synthetic_preprocessed))
  assert training['epochs'] == training['ngram_epochs'] == (
      settings_lib.default_epochs(data.num_examples(raw.TRAIN), 16))
  choice = training['choices']
  assert choice['on'] == raw.VALIDATION and not choice['refit']
  tried = [count for count, _ in choice['tried']]
  assert len(tried) >= 2
  assert tried == [count for count in ngram_fit.MIN_COUNTS
                   if count >= tried[-1]]
  # Largest count first; each next one tried while the one before improved
  # on validation; the last one tried is kept only if it improved too.
  in_order = [score for _, score in choice['tried']]
  assert all(later > earlier
             for earlier, later in zip(in_order[:-2], in_order[1:-1]))
  improved = in_order[-1] > in_order[-2]
  if improved:  # then only because no lower count was left
    assert tried[-1] == ngram_fit.MIN_COUNTS[-1]
  assert choice['ngram_min_count'] == (tried[-1] if improved else tried[-2])
  report = (tmp_path / evaluate.REPORT_FILE).read_text()
  assert ("The validation split chose the n-gram branch's minimum document "
          f"count, {choice['ngram_min_count']} ") in report
  assert metrics[raw.TEST]['accuracy'] > 0.9


def test_model_params_are_validated():
  with pytest.raises(ValueError):
    model_lib.ModelParams(pooling='sum')
  with pytest.raises(ValueError):
    model_lib.ModelParams(key_dim=-1)


def test_seed_model_attention_is_the_keras_io_one():
  model = model_lib.build_model(100, 12, 2, model_lib.ModelParams(
      model='transformer'))
  attention = model.get_layer('transformer_0').attention
  # keras.io: MultiHeadAttention(num_heads=2, key_dim=embed_dim).
  assert (attention.num_heads, attention.key_dim) == (2, 32)
  assert tuple(attention.output_dense.kernel.shape) == (2, 32, 32)
  narrow = model_lib.build_model(100, 12, 2, model_lib.ModelParams(
      model='transformer', embed_dim=10, num_heads=3, key_dim=4))
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
  # Undefined with one class: JSON's null, not a bare NaN.
  assert evaluate.roc_auc(np.array([1, 1]), np.array([0.5, 0.7])) is None


# --------------------------------------------------------------------------
# The training flags


def train_args(*flags):
  return train.parse_args(['--data_dir=unused', '--model_dir=unused', *flags])


def transformer_schedule(*flags):
  """The transformer's schedule as ``flags`` set it."""
  settings = settings_lib.Settings.of(train_args(*flags), epochs=1,
                                      ngram_epochs=1, folds=0, refit=False)
  return settings.schedule(model_lib.TRANSFORMER_LOGITS)


def test_the_flags_resolve_once_into_frozen_settings(synthetic_preprocessed,
                                                     tmp_path):
  args = train.parse_args([
      f'--data_dir={synthetic_preprocessed}', f'--model_dir={tmp_path}',
      '--warmup_fraction=0.1', '--weight_decay=0.1',
      '--ngram_learning_rate=0.01'])
  parsed = dict(vars(args))
  settings, data = settings_lib.settings_from_args(args)
  assert vars(args) == parsed  # resolved into the settings, not the flags
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.epochs = 1
  # A few hundred short reviews: the most epochs, and cross-validation in
  # selection.FOLDS folds then a refit, from the data.
  epochs = settings_lib.default_epochs(data.num_examples(raw.TRAIN), 32)
  assert (settings.epochs, settings.ngram_epochs) == (epochs, epochs)
  assert (settings.folds, settings.refit) == (selection.FOLDS, True)
  # Every flag in the export's metadata, as resolved; the folders as their
  # links lead.
  assert settings.record() == {
      **parsed, 'data_dir': os.path.realpath(synthetic_preprocessed),
      'model_dir': os.path.realpath(tmp_path), 'epochs': epochs,
      'ngram_epochs': epochs, 'folds': selection.FOLDS, 'refit': True}
  # The n-gram branch: its own epochs (as cross-validation chose them, when
  # it did) and learning rate, no warm-up or weight decay.
  assert settings.schedule(model_lib.NGRAM_LOGITS, 7) == settings_lib.Schedule(
      epochs=7, learning_rate=0.01, warmup_fraction=0.0, decay=True,
      weight_decay=0.0, clipnorm=None)
  assert settings.schedule(model_lib.TRANSFORMER_LOGITS) == (
      settings_lib.Schedule(epochs=epochs, learning_rate=1e-3,
                            warmup_fraction=0.1, decay=True,
                            weight_decay=0.1, clipnorm=None))


def rates(schedule, steps):
  return [float(schedule(step)) for step in steps]


def test_learning_rate_warms_up_then_follows_a_cosine_to_zero():
  schedule = branch_fit.learning_rate(transformer_schedule(
      '--learning_rate=0.01', '--warmup_fraction=0.2', '--decay'), 100)
  # 20 steps rise linearly from 0 to the rate, a cosine takes the other 80
  # down to 0: at their middle, step 60, it is half the rate.
  assert rates(schedule, [0, 10, 20, 60, 100]) == pytest.approx(
      [0, 0.005, 0.01, 0.005, 0], abs=1e-9)


def test_warmup_alone_then_holds_the_rate_and_decay_alone_starts_at_it():
  # Decay is on by default.
  warmup = branch_fit.learning_rate(transformer_schedule(
      '--learning_rate=0.01', '--warmup_fraction=0.1', '--no-decay'), 100)
  assert rates(warmup, [0, 5, 10, 100]) == pytest.approx(
      [0, 0.005, 0.01, 0.01], abs=1e-9)
  decay = branch_fit.learning_rate(
      transformer_schedule('--learning_rate=0.01'), 100)
  assert rates(decay, [0, 50, 100]) == pytest.approx([0.01, 0.005, 0],
                                                     abs=1e-9)
  assert branch_fit.learning_rate(transformer_schedule(
      '--learning_rate=0.01', '--no-decay'), 100) == 0.01


def test_the_optimizer_follows_the_schedule():
  optimizer = branch_fit.optimizer(transformer_schedule(
      '--learning_rate=0.01', '--warmup_fraction=0.5'), 10)
  variable = keras.Variable([1.0])
  rates_seen = []
  for _ in range(6):
    rates_seen.append(float(optimizer.learning_rate))
    optimizer.apply_gradients([(np.array([1.0], 'float32'), variable)])
  assert rates_seen == pytest.approx(
      [0, 0.002, 0.004, 0.006, 0.008, 0.01], abs=1e-9)


def apply(optimizer, gradients):
  """The value of a variable, from 1, after the optimizer applied
  ``gradients`` to it one by one."""
  variable = keras.Variable([1.0, 1.0])
  for gradient in gradients:
    optimizer.apply_gradients([(np.array(gradient, 'float32'), variable)])
  return variable.numpy()


def test_weight_decay_shrinks_weights_the_gradient_leaves_alone():
  flags = ('--learning_rate=0.1', '--weight_decay=0.5')
  optimizer = branch_fit.optimizer(transformer_schedule(*flags), 100)
  assert isinstance(optimizer, keras.optimizers.AdamW)
  # A zero gradient makes Adam's step zero; AdamW's decoupled decay still
  # multiplies the weights by 1 - learning rate * weight decay.
  np.testing.assert_allclose(apply(optimizer, [[0, 0]]), [0.95, 0.95])
  plain = branch_fit.optimizer(transformer_schedule('--learning_rate=0.1'),
                               100)
  assert not isinstance(plain, keras.optimizers.AdamW)
  np.testing.assert_allclose(apply(plain, [[0, 0]]), [1, 1])


def test_clipnorm_makes_a_huge_gradient_count_as_a_unit_one():
  # Adam divides by the gradients' running scale, so a gradient 100 times
  # larger than the next one changes the next steps; clipped to norm 1, the
  # two are the same gradient and the steps are those of a constant one.
  huge_then_unit, unit_twice = [[100, 0], [1, 0]], [[1, 0], [1, 0]]
  clipped = transformer_schedule('--learning_rate=0.1', '--clipnorm=1')
  np.testing.assert_allclose(
      apply(branch_fit.optimizer(clipped, 100), huge_then_unit),
      apply(branch_fit.optimizer(clipped, 100), unit_twice))
  unclipped = transformer_schedule('--learning_rate=0.1')
  assert not np.allclose(
      apply(branch_fit.optimizer(unclipped, 100), huge_then_unit),
      apply(branch_fit.optimizer(unclipped, 100), unit_twice))


@pytest.mark.parametrize('monitor, best_epoch', [('val_loss', 2),
                                                 ('val_accuracy', 1)])
def test_monitor_picks_the_epoch_whose_weights_are_kept(tmp_path, monitor,
                                                        best_epoch):
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
  model.compile(loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True), metrics=['accuracy'])
  # Builds the compiled metrics, whose direction the callbacks look up.
  model.evaluate(np.zeros((2, 1)), np.zeros(2), verbose=0)
  args = train_args(f'--monitor={monitor}', '--patience=2')
  picking = [c for c in branch_fit.callbacks(args.monitor, args.patience,
                                             str(tmp_path),
                                             str(tmp_path / 'logs'))
             if isinstance(c, (keras.callbacks.EarlyStopping,
                               keras.callbacks.ModelCheckpoint))]
  assert len(picking) == 2
  for callback in picking:
    callback.set_model(model)
    callback.on_train_begin()
  # The best loss is epoch 2's, the best accuracy epoch 1's; each epoch's
  # weights are filled with its number.
  history = [(1.0, 0.5), (0.9, 0.9), (0.4, 0.8), (0.5, 0.7)]
  for epoch, (loss, accuracy) in enumerate(history):
    model.set_weights([np.full_like(w, epoch) for w in model.get_weights()])
    for callback in picking:
      callback.on_epoch_end(epoch, {'val_loss': loss,
                                    'val_accuracy': accuracy})
  for callback in picking:
    callback.on_train_end()
  assert model.get_weights()[0][0, 0] == best_epoch
  model.set_weights([np.full_like(w, -1) for w in model.get_weights()])
  model.load_weights(tmp_path / 'checkpoints' / 'best.weights.h5')
  assert model.get_weights()[0][0, 0] == best_epoch


@pytest.fixture(scope='module')
def preprocessed(tmp_path_factory):
  """Synthetic reviews of 10 to 32 words through the preprocessing job,
  padded to 40 tokens."""
  folder = tmp_path_factory.mktemp('preprocessed')
  write_jsonl(folder / 'reviews.jsonl',
              synthetic_reviews(200, 0) + synthetic_reviews(100, 1))
  preprocess.run([f'--input={folder}/reviews.jsonl',
                  f'--output_dir={folder}/out', '--split_field=split',
                  '--max_len=40'])
  return folder / 'out'


def test_bucket_width_batches_documents_of_one_length_bucket(preprocessed):
  data = data_lib.PreprocessedData.load(str(preprocessed))
  seen, widths = 0, set()
  for token_ids, labels in data_lib.dataset(data, raw.TRAIN, 16,
                                            bucket_width=8):
    width = token_ids.shape[1]
    lengths = np.sum(token_ids.numpy() != transformed.PAD_ID, axis=1)
    # Each document's bucket: its length rounded up to a multiple of 8, at
    # most max_len; a batch holds one bucket and is cut to it.
    assert {min(math.ceil(n / 8) * 8, 40) for n in lengths} == {width}
    assert len(labels) == len(lengths) <= 16
    seen += len(lengths)
    widths.add(width)
  assert seen == data.num_examples(raw.TRAIN) > 150
  # The buckets of 10 to 32 tokens; none is padded to max_len.
  assert widths == {16, 24, 32}


def test_training_flags_reach_the_run_and_its_export(preprocessed, tmp_path,
                                                      monkeypatch, recwarn):
  built, buckets = [], []
  real_optimizer, real_buckets = (branch_fit.optimizer,
                                  data_lib.length_buckets)

  def recording_optimizer(schedule, steps):
    built.append(real_optimizer(schedule, steps))
    return built[-1]

  def recording_buckets(examples, batch_size, width, drop_remainder):
    buckets.append((batch_size, width, drop_remainder))
    return real_buckets(examples, batch_size, width, drop_remainder)
  monkeypatch.setattr(branch_fit, 'optimizer', recording_optimizer)
  monkeypatch.setattr(data_lib, 'length_buckets', recording_buckets)
  # Every document of 10 to 32 tokens falls in the bucket of width 32, so
  # each batch is cut from max_len 40 to 32 without adding XLA
  # compilations: one train and one validation shape, as without buckets.
  metrics, export_dir = train.run([
      f'--data_dir={preprocessed}', f'--model_dir={tmp_path}/model',
      '--model=transformer', '--epochs=2', '--batch_size=16', '--embed_dim=8',
      '--ff_dim=8', '--learning_rate=0.005', '--seed=3', '--decay',
      '--warmup_fraction=0.25',
      '--weight_decay=0.01', '--clipnorm=1', '--monitor=val_accuracy',
      '--bucket_width=32', '--folds=0'])
  training = exports.load(export_dir)[1].document['training']
  flags = {'decay': True, 'warmup_fraction': 0.25, 'weight_decay': 0.01,
           'clipnorm': 1.0, 'monitor': 'val_accuracy', 'bucket_width': 32}
  assert {name: training[name] for name in flags} == flags
  # Early stopping needs more than --patience=2 epochs: both epochs ran.
  assert training['epochs_run'] == 2
  assert metrics['test']['examples'] == 100
  # The optimizer the model was compiled with: AdamW, clipped, on a
  # schedule that warms up over a quarter of the 2 epochs' steps and decays
  # over the others.
  steps = 2 * math.ceil(exports.read_metadata(export_dir)['data_stats'][
      'records']['written'][raw.TRAIN] / 16)
  warmup = steps // 4
  (optimizer,) = built
  assert isinstance(optimizer, keras.optimizers.AdamW)
  assert optimizer.weight_decay == 0.01 and optimizer.clipnorm == 1
  schedule = optimizer.get_config()['learning_rate']
  assert schedule['class_name'] == 'CosineDecay'
  assert {name: schedule['config'][name] for name in (
      'warmup_steps', 'decay_steps', 'warmup_target')} == {
          'warmup_steps': warmup, 'decay_steps': steps - warmup,
          'warmup_target': 0.005}
  # Train and validation batches were both bucketed.
  assert buckets == [(16, 32, True), (256, 32, False)]
  assert not keras_input_warnings(recwarn)


def test_macro_f1_is_over_the_classes_the_split_has():
  # Three classes, the third without a test example; the model predicts it
  # once. Over the two present: a's F1 1/2, b's 4/5.
  labels = np.array([0, 0, 1, 1, 1])
  predicted = np.array([0, 2, 1, 1, 0])
  probabilities = np.eye(3)[predicted]
  metrics = evaluate.classification_metrics(labels, probabilities,
                                            ['a', 'b', 'c'])
  assert metrics['macro_f1'] == pytest.approx((1 / 2 + 4 / 5) / 2)
  assert metrics['classes_without_examples'] == ['c']


def test_the_report_lists_the_most_confident_mistakes_on_test(trained):
  """Ranked here from the export's own answers on the test reviews, apart
  from the trainer's ranking."""
  model_dir, export_dir, metrics = trained
  signature, metadata = exports.load(export_dir)
  test = synthetic_reviews(200, 1)
  probabilities = signature(text=tf.constant(
      [review['text'].encode() for review in test]))[
          serving.PROBABILITIES].numpy()
  wrong = sorted(
      (-row.max(), review['text'], review['label'],
       metadata.label_names[row.argmax()])
      for review, row in zip(test, probabilities)
      if metadata.label_names[row.argmax()] != review['label'])
  assert len(wrong) == round(
      (1 - metrics['test']['accuracy']) * len(test)) > 0
  report = (model_dir / evaluate.REPORT_FILE).read_text()
  section = report.split('\n## The most confident mistakes on test\n')[1]
  rows = [line.strip('| ').split(' | ') for line in
          section.split('\n## ')[0].splitlines()[5:] if line.startswith('|')]
  expected = wrong[:evaluate.MISTAKES_SHOWN]
  assert len(rows) == len(expected)
  assert sorted(row[:3] for row in rows) == sorted(
      [text, label, prediction] for _, text, label, prediction in expected)
  assert [float(row[3]) for row in rows] == [
      pytest.approx(-negated, abs=2e-4) for negated, *_ in expected]


def test_a_mistake_cell_is_one_line_and_reads_as_plain_text():
  cell = evaluate.markdown_cell('a | b\r\n\tc *em* <b>&amp; [x](y) `c`\\ _u_')
  assert cell == ('a \\| b c \\*em\\* \\<b\\>\\&amp; \\[x\\](y) \\`c\\`\\\\ '
                  '\\_u\\_')
  assert evaluate.markdown_cell('word ' * 100, 20) == 'word ' * 3 + 'word…'
  lines = evaluate.mistake_lines([predictions.Mistake(
      'two\nlines | here', 'a|b', 'c', 0.98765)], 'test')
  assert lines[-1] == '| two lines \\| here | a\\|b | c | 0.9877 |'
  assert evaluate.mistake_lines([], 'test')[-1] == (
      'The model labelled every test example right.')
