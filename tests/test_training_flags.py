"""The training flags: resolved once into frozen settings, the learning-rate
schedule and optimizer they make, the epoch they keep, length buckets, and
every flag reaching the run and its export."""
import dataclasses
import math
import os

import keras
import numpy as np
import pytest

from schemas import raw
from schemas import transformed
from serving import exports
from tests.conftest import keras_input_warnings
from trainer import branch_fit
from trainer import data as data_lib
from trainer import model as model_lib
from trainer import selection
from trainer import settings as settings_lib
from trainer import train


def train_args(*flags):
  return train.parse_args(['--data_dir=unused', '--model_dir=unused', *flags])


def transformer_schedule(*flags):
  """The transformer's schedule as ``flags`` set it."""
  settings = settings_lib.Settings.of(train_args(*flags), epochs=1,
                                      ngram_epochs=1, folds=0, refit=False,
                                      ngram_fit='epochs')
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
  # Too few examples for the hybrid's transformer, few enough for the
  # convex solver.
  assert data.num_examples(raw.TRAIN) < settings_lib.TRANSFORMER_MIN_EXAMPLES
  assert (settings.model, settings.params.model) == ('hybrid', 'nbsvm')
  assert settings.ngram_fit == 'convex'
  # Every flag in the export's metadata, as resolved (the model as fitted);
  # the folders as their links lead.
  assert settings.record() == {
      **parsed, 'data_dir': os.path.realpath(synthetic_preprocessed),
      'model_dir': os.path.realpath(tmp_path), 'epochs': epochs,
      'ngram_epochs': epochs, 'folds': selection.FOLDS, 'refit': True,
      'model': 'nbsvm', 'ngram_fit': 'convex'}
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


@pytest.mark.parametrize('ngram_fit, folds', [('convex', selection.FOLDS),
                                               ('epochs', 0)])
def test_auto_folds_count_only_the_epochs_keras_would_run(
    synthetic_preprocessed, tmp_path, ngram_fit, folds):
  # So many n-gram epochs that folds of Keras fits would cost too much; the
  # convex solver runs none.
  settings, _ = settings_lib.settings_from_args(train.parse_args([
      f'--data_dir={synthetic_preprocessed}', f'--model_dir={tmp_path}',
      '--model=nbsvm', '--ngram_epochs=1000', f'--ngram_fit={ngram_fit}']))
  assert settings.folds == folds
