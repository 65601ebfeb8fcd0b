"""One branch of the model fitted alone: its optimizer on its schedule,
early stopping and the run's checkpoint, history and TensorBoard logs, and
a loss that is not finite failing the run."""
import logging
import posixpath
import sys
import time
from typing import Optional
import warnings

import keras
import numpy as np
import tensorflow as tf

import cli
from trainer import evaluate
from trainer import inputs as inputs_lib
from trainer import model as model_lib
from trainer import runs
from trainer import selection
from trainer import settings as settings_lib


def learning_rate(schedule: settings_lib.Schedule, steps: int):
  if not schedule.decay and not schedule.warmup_fraction:
    return schedule.learning_rate
  warmup = int(steps * schedule.warmup_fraction)
  return keras.optimizers.schedules.CosineDecay(
      initial_learning_rate=0.0 if warmup else schedule.learning_rate,
      decay_steps=max(steps - warmup, 1) if schedule.decay else 10**12,
      warmup_target=schedule.learning_rate if warmup else None,
      warmup_steps=warmup)


def optimizer(schedule: settings_lib.Schedule, steps: int):
  options = dict(learning_rate=learning_rate(schedule, steps),
                 clipnorm=schedule.clipnorm)
  if schedule.weight_decay > 0:
    return keras.optimizers.AdamW(weight_decay=schedule.weight_decay,
                                  **options)
  return keras.optimizers.Adam(**options)


def callbacks(monitor: str, patience: int, scratch: str, logs: str,
              stop_early: bool = True, verbose: bool = False):
  """Early stopping on ``monitor`` (unless the epochs are chosen already),
  and the run's checkpoint and history in ``scratch`` and TensorBoard logs
  in ``logs``."""
  tf.io.gfile.makedirs(scratch)  # CSVLogger does not make its folder
  # Keras formats the path with the epoch's figures ({epoch}): a brace of
  # the folder's name is a literal one.
  checkpoint = posixpath.join(scratch, runs.CHECKPOINTS_DIR,
                              runs.CHECKPOINT_FILE).replace('{', '{{').replace(
                                  '}', '}}')
  return [
      *([keras.callbacks.EarlyStopping(monitor=monitor, patience=patience,
                                       restore_best_weights=True,
                                       verbose=int(verbose))]
        if stop_early else []),
      keras.callbacks.ModelCheckpoint(
          checkpoint, monitor=monitor, save_best_only=stop_early,
          save_weights_only=True),
      keras.callbacks.TensorBoard(logs),
      keras.callbacks.CSVLogger(posixpath.join(scratch,
                                               evaluate.HISTORY_FILE)),
  ]


class Progress(keras.callbacks.Callback):
  """What a person reads of a fit, in place of Keras' own lines: one line
  an epoch where ``each_epoch`` (a final fit, whose epochs can take
  minutes), and one at the end with the epochs run and the last figures."""

  def __init__(self, label: str, epochs: int, each_epoch: bool,
               monitor: str):
    super().__init__()
    self.label, self.epochs, self.each_epoch = label, epochs, each_epoch
    self.monitor = monitor
    self.started = self.logs = None
    self.run = 0
    self.measured = []  # --monitor after each epoch

  def on_train_begin(self, logs=None):
    self.started = time.time()

  def on_epoch_end(self, epoch, logs=None):
    self.run, self.logs = epoch + 1, dict(logs or {})
    if self.monitor in self.logs:
      self.measured.append(self.logs[self.monitor])
    if self.each_epoch:
      logging.info('%s: epoch %d of at most %d, %s (%.0f s)', self.label,
                   self.run, self.epochs, _figures(self.logs),
                   time.time() - self.started)

  def on_train_end(self, logs=None):
    best = ''
    if self.measured:
      epoch = selection.best_index(self.monitor, self.measured)
      best = (f'; best {self.monitor} {self.measured[epoch]:.4f} after epoch '
              f'{epoch + 1}')
    logging.info('%s: %d epochs in %.1f s, last %s%s', self.label, self.run,
                 time.time() - self.started, _figures(self.logs or {}), best)


def _figures(logs: dict) -> str:
  return ', '.join(f'{name} {value:.4f}' for name, value in logs.items()
                   if name.endswith(('loss', 'accuracy')))


class StopOnNaN(keras.callbacks.Callback):
  """Stops training after the first epoch with a loss that is not finite.

  Keras' TerminateOnNaN stops too, but the run then carries on as a success
  and exports a model of nans; this one keeps what went wrong for the
  trainer to fail on. Checked once an epoch: one nan batch makes the epoch's
  mean loss nan, and a check every batch would wait for the device every
  step.
  """

  def __init__(self):
    super().__init__()
    self.failure = None  # (epoch, the non-finite losses)

  def on_epoch_end(self, epoch, logs=None):
    losses = {name: value for name, value in (logs or {}).items()
              if name.endswith('loss') and not np.isfinite(value)}
    if losses and self.failure is None:
      self.failure = (epoch + 1, losses)
      self.model.stop_training = True


def fit_branch(settings: settings_lib.Settings, model, branch: str,
               data: inputs_lib.Inputs, folders,
               epochs: Optional[int] = None,
               held_out: Optional[selection.HeldOutFold] = None,
               label: Optional[str] = None):
  """Trains one branch of ``model`` alone, for at most ``epochs`` (chosen
  by cross-validation; else its flag's), with its scratch and log
  ``folders``; returns its history. With ``held_out`` (a fold of
  cross-validation), that callback measures every epoch and stops the
  fold; without, ``data.validation`` measures it, and stops training early
  unless the epochs were chosen by cross-validation. Logged as ``label``
  (else the branch's name): a line a fold, a line an epoch of a final fit;
  Keras' own lines with --verbose."""
  schedule = settings.schedule(branch, epochs)
  trained = model_lib.branch_model(model, branch)
  steps = -(-data.train_examples // settings.batch_size) * schedule.epochs
  trained.compile(optimizer=optimizer(schedule, steps),
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=['accuracy'],
                  jit_compile=steps >= settings_lib.XLA_MIN_STEPS)
  nan_guard = StopOnNaN()
  with warnings.catch_warnings():
    if settings.bucket_width:
      # Length buckets leave the batches of a pass uncounted until one has
      # run, so Keras finds the end of the first epoch by running out of
      # data and warns that it did: that end is where every epoch ends.
      warnings.filterwarnings('ignore', message='Your input ran out of data')
    stop_early = held_out is None and not settings.folds
    history = trained.fit(
        data.train, validation_data=None if held_out else data.validation,
        epochs=schedule.epochs,
        callbacks=[nan_guard, *([held_out] if held_out else []),
                   *callbacks(settings.monitor, settings.patience, *folders,
                              stop_early, settings.verbose),
                   Progress(label or branch, schedule.epochs,
                            each_epoch=held_out is None,
                            monitor=settings.monitor)],
        # The dataset reshuffles itself every epoch.
        shuffle=False,
        # With --verbose, Keras' progress bar on a terminal, its line an
        # epoch in logs; else Progress's lines alone.
        verbose=(1 if sys.stdout.isatty() else 2) if settings.verbose else 0)
  if nan_guard.failure:
    epoch, losses = nan_guard.failure
    found = ', '.join(f'{name} {value}' for name, value in losses.items())
    raise cli.JobError(
        f'training diverged in epoch {epoch} ({found}); nothing was exported: '
        'try a lower --learning_rate, --clipnorm or --warmup_fraction')
  return history.history
