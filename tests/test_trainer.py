"""The trainer: layers, masking, save/load, a short real training run, the
raw-text export contract, the cache budget, the default epochs, the
metrics."""
import json
import logging
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import cli
from schemas import raw
from schemas import serving
from schemas import transformed
from serving import exports
from serving import predictions
from tests.conftest import assert_float32_close
from tests.conftest import keras_input_warnings
from tests.conftest import synthetic_reviews
from tests.conftest import TINY_MODEL
from tests.conftest import TRAIN_FLAGS
from trainer import data as data_lib
from trainer import evaluate
from trainer import model as model_lib
from trainer import ngram_fit
from trainer import settings as settings_lib
from trainer import train


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
  size = data_lib.parsed_bytes(data, (raw.TRAIN,))
  assert size >= 1000 * 100 * 8
  assert data_lib.cache_in_memory('auto', data, (raw.TRAIN,), size)
  assert not data_lib.cache_in_memory('auto', data, (raw.TRAIN,), size - 1)
  assert data_lib.cache_in_memory('memory', data, (raw.TRAIN,), 0)
  assert not data_lib.cache_in_memory('none', data, (raw.TRAIN,), 10 * size)
  with pytest.raises(ValueError, match='cache must be one of'):
    data_lib.cache_in_memory('disk', data, (raw.TRAIN,), size)
  assert data_lib.available_memory() > 0


def test_auto_streams_a_split_past_a_gibibyte_whatever_the_machine():
  budget = data_lib.cache_budget(1.0)
  assert 0 < data_lib.cache_budget(1e-9) < budget <= data_lib.CACHE_MAX_BYTES
  # A million IMDB-derived documents' train split, and a tenth of it.
  million, tenth = split_of(449040, 1024), split_of(44904, 1024)
  assert not data_lib.cache_in_memory('auto', million, (raw.TRAIN,),
                                      data_lib.CACHE_MAX_BYTES)
  assert data_lib.cache_in_memory('auto', tenth, (raw.TRAIN,),
                                  data_lib.CACHE_MAX_BYTES)


def test_the_shuffle_buffer_is_bounded_by_the_budget():
  data = split_of(100000, 100)
  per_example = data_lib.parsed_bytes(data, (raw.TRAIN,)) // 100000
  assert data_lib.shuffle_buffer(data, 100000, 10**12) == 50000
  assert data_lib.shuffle_buffer(data, 100000, 2000 * per_example) == 2000
  assert data_lib.shuffle_buffer(data, 100000, 0) == 1024
  assert data_lib.shuffle_buffer(split_of(500, 100), 500, 0) == 500


def test_nan_loss_is_a_job_error_and_nothing_is_exported(preprocessed,
                                                         tmp_path):
  with pytest.raises(cli.JobError, match='nan'):
    # A step of about the learning rate takes the weights to the edge of
    # float32 at once, and the next products past it: inf, then nan. (At
    # 1e30 the loss stayed finite, if huge, unless XLA fused the step.)
    train.run([f'--data_dir={preprocessed}', f'--model_dir={tmp_path}/model',
               '--learning_rate=3e38', *TINY_MODEL])
  assert not (tmp_path / 'model' / serving.EXPORT_DIR).exists()


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
    synthetic_preprocessed, tmp_path, capfd, caplog):
  caplog.set_level(logging.INFO)
  metrics, export_dir = train.run([
      f'--data_dir={synthetic_preprocessed}', f'--model_dir={tmp_path}',
      '--batch_size=16', '--embed_dim=8', '--ff_dim=8', '--folds=0',
      '--transformer_min_examples=0', '--ngram_fit=epochs', '--epochs=3',
      '--ngram_epochs=3'])
  # A line an epoch of each fit, with its figures; not Keras' blocks
  # (those only with --verbose).
  assert 'Epoch 1/' not in capfd.readouterr().out
  assert re.search(r' transformer_logits: epoch 1 of at most \d+, accuracy '
                   r'[0-9.]+, loss [0-9.]+, val_accuracy', caplog.text)
  assert re.search(r' ngram_logits \(in at least \d+ documents\): \d+ epochs '
                   r'in [0-9.]+ s, last .*; best val_accuracy [0-9.]+ after '
                   r'epoch \d+', caplog.text)
  training = exports.read_metadata(export_dir)['training']
  assert training['model'] == 'hybrid'
  assert training['epochs'] == training['ngram_epochs'] == 3
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
