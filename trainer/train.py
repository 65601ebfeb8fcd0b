"""The trainer: a text classifier from the preprocessing job's TFRecords.

    python -m trainer.train --data_dir=PREPROCESS_OUTPUT --model_dir=DIR
        [--epochs=N] [--batch_size=32] [--learning_rate=1e-3] [--[no-]decay]
        [--embed_dim=32] [--num_heads=2] [--key_dim=0] [--ff_dim=32]
        [--num_layers=1] [--dropout=0.1] [--pooling=mean|max]
        [--positions=learned|sinusoidal] [--model=transformer|nbsvm|hybrid]
        [--seed=42] ... [@configs/NAME/train.args]

Vocabulary size, number of classes and sequence length come from the
preprocessing output. The defaults are the hybrid: an NBSVM n-gram branch
beside the keras.io transformer. Trains with Adam(W) and sparse categorical
cross-entropy (the hybrid's two branches one after the other) on the train
split; everything chosen is chosen on the validation split: the epoch
(early stopping, best weights restored), the n-gram branch's minimum
document count, the temperature and the hybrid's branch weights; the most
epochs from the size of the train split. Saves a raw-text SavedModel, staged, evaluates that export
on validation and, once, on test, and only then publishes it as a version,
with metrics.json and a report with plots. One trainer at a time in a
model folder (``trainer.lock``); a run that fails or is killed leaves the
previous one's files as they were (``trainer.runs``).
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from cli import quiet  # pylint: disable=unused-import,g-bad-import-order
import argparse
import dataclasses
import logging
import math
import posixpath
import sys
import time
import warnings

import keras
import numpy as np
import tensorflow as tf

import cli
from cli import flags
from schemas import folders
from schemas import raw
from serving import exports
from trainer import calibration
from trainer import data as data_lib
from trainer import evaluate
from trainer import export
from trainer import lock
from trainer import model as model_lib
from trainer import ngrams
from trainer import runs

# Without --epochs (--ngram_epochs), a branch trains for as many epochs as
# make about TARGET_STEPS steps (2 on IMDB's 22,700 training reviews at batch
# 32, where the keras.io model peaks), MIN_EPOCHS to MAX_EPOCHS: a small
# corpus needs more passes for as many updates, and early stopping on
# validation keeps the best epoch.
TARGET_STEPS = 1400
MIN_EPOCHS, MAX_EPOCHS = 2, 20
# Without --ngram_min_count, the n-gram branch is trained with each of these
# minimum document counts in turn, largest first, until one is no better on
# validation than the best before it: too low a count lets the branch
# memorise its training documents by their rare n-grams, too high a one
# drops useful n-grams, and where between depends on the corpus.
MIN_COUNTS = (32, 16, 8, 4, 2)
# The largest learning rate the optimizer's float32 variables hold; a large
# one below it diverges, which the trainer reports as such.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def build_parser() -> flags.Parser:
  """The trainer's flags, each typed and range-checked; @FILE reads flags
  from a file, one a line (configs/<name>/)."""
  parser = flags.Parser(__doc__.split('\n\n')[0],
                        module='trainer.train')
  parser.add_argument('--data_dir', required=True, type=flags.folder,
                      help='Output folder of pipeline.preprocess.')
  parser.add_argument('--model_dir', required=True, type=flags.folder,
                      help='Model folder: each run adds a version under '
                      'export/, with metrics.json and report.md beside.')
  parser.add_argument('--epochs', type=flags.integer(1), default=None,
                      help='Most epochs of the transformer (stopped early '
                      'on validation); default: enough for about '
                      f'{TARGET_STEPS} steps, {MIN_EPOCHS} to {MAX_EPOCHS}.')
  parser.add_argument('--batch_size', type=flags.integer(1), default=32,
                      help='Training examples a step; at most the train '
                      'split\'s size.')
  parser.add_argument('--learning_rate',
                      type=flags.number(0, FLOAT32_MAX, low_open=True),
                      default=1e-3,
                      help='Adam\'s learning rate for the transformer.')
  parser.add_argument('--warmup_fraction',
                      type=flags.number(0, 1, high_open=True), default=0.0,
                      help='Share of the steps with a linear warm-up; with '
                      '--decay, the rate then follows a cosine to zero.')
  parser.add_argument('--decay', action=argparse.BooleanOptionalAction,
                      default=True,
                      help='Cosine decay of the learning rate to zero.')
  parser.add_argument('--weight_decay', type=flags.number(0), default=0.0,
                      help='Decoupled weight decay (AdamW) when > 0.')
  parser.add_argument('--clipnorm', type=flags.number(0, low_open=True),
                      default=None, help='Clip each gradient to this norm.')
  parser.add_argument('--patience', type=flags.integer(0), default=3,
                      help='Epochs without improvement of --monitor before '
                      'stopping; the best weights are restored.')
  parser.add_argument('--monitor', choices=('val_loss', 'val_accuracy'),
                      default='val_accuracy',
                      help='The validation metric that picks the best '
                      'epoch.')
  parser.add_argument('--bucket_width', type=flags.integer(0), default=128,
                      help='Batch documents of similar length, cut to a '
                      'multiple of this many tokens; 0 pads every batch to '
                      'max_len.')
  parser.add_argument('--seed', type=flags.integer(0, 2**32 - 1),
                      default=42,
                      help='Seed of the weights, the shuffling and dropout.')
  parser.add_argument('--cache', choices=data_lib.CACHE_POLICIES,
                      default='auto',
                      help='Keep the train and validation splits parsed in '
                      'memory (memory), read them from their files every '
                      'epoch (none), or memory when a split, as stats.json '
                      'sizes it, fits --cache_memory_share (auto).')
  parser.add_argument('--cache_memory_share',
                      type=flags.number(0, 1, low_open=True),
                      default=data_lib.CACHE_MEMORY_SHARE,
                      help='With --cache=auto: the share of the available '
                      'memory a split may take cached; it also bounds the '
                      'shuffle buffer.')
  add_branch_args(parser)
  add_model_args(parser)
  return parser


def parse_args(argv):
  return flags.parse(build_parser(), argv)[0]


def add_branch_args(parser) -> None:
  """The flags of the model kind and the n-gram branch's training."""
  parser.add_argument('--model', choices=model_lib.MODELS,
                      default=model_lib.ModelParams().model,
                      help='transformer; nbsvm (binarized n-grams scaled '
                      'by Naive Bayes ratios); hybrid (both, each trained '
                      'alone, their logits weighted on validation).')
  parser.add_argument('--ngram_epochs', type=flags.integer(1), default=None,
                      help='Most epochs of the n-gram branch (nbsvm, '
                      'hybrid); default: as --epochs.')
  parser.add_argument('--ngram_learning_rate',
                      type=flags.number(0, FLOAT32_MAX, low_open=True),
                      default=1e-3,
                      help='Adam\'s learning rate for the n-gram branch.')


def add_model_args(parser) -> None:
  """A flag for each field of ``ModelParams``, of the field's values."""
  defaults = model_lib.ModelParams()
  for field in dataclasses.fields(model_lib.ModelParams):
    if field.name == 'model':
      continue  # add_branch_args has it
    check = model_lib.FIELD_FLAGS[field.name]
    kind = {'choices': check} if isinstance(check, tuple) else {'type': check}
    parser.add_argument(f'--{field.name}',
                        default=getattr(defaults, field.name),
                        help=model_lib.FIELD_HELP[field.name], **kind)


def model_params(args) -> model_lib.ModelParams:
  return model_lib.ModelParams(**{
      field.name: getattr(args, field.name)
      for field in dataclasses.fields(model_lib.ModelParams)})


def learning_rate(args, steps: int):
  if not args.decay and not args.warmup_fraction:
    return args.learning_rate
  warmup = int(steps * args.warmup_fraction)
  return keras.optimizers.schedules.CosineDecay(
      initial_learning_rate=0.0 if warmup else args.learning_rate,
      decay_steps=max(steps - warmup, 1) if args.decay else 10**12,
      warmup_target=args.learning_rate if warmup else None,
      warmup_steps=warmup)


def optimizer(args, steps: int):
  options = dict(learning_rate=learning_rate(args, steps),
                 clipnorm=args.clipnorm)
  if args.weight_decay > 0:
    return keras.optimizers.AdamW(weight_decay=args.weight_decay, **options)
  return keras.optimizers.Adam(**options)


def callbacks(args, scratch: str, logs: str):
  """Early stopping, and the run's checkpoint and history in ``scratch``
  and TensorBoard logs in ``logs``."""
  tf.io.gfile.makedirs(scratch)  # CSVLogger does not make its folder
  return [
      keras.callbacks.EarlyStopping(monitor=args.monitor,
                                    patience=args.patience,
                                    restore_best_weights=True, verbose=1),
      keras.callbacks.ModelCheckpoint(
          # Keras formats the path with the epoch's figures ({epoch}): a
          # brace of the folder's name is a literal one.
          posixpath.join(scratch, runs.CHECKPOINTS_DIR, 'best.weights.h5')
          .replace('{', '{{').replace('}', '}}'),
          monitor=args.monitor, save_best_only=True, save_weights_only=True),
      keras.callbacks.TensorBoard(logs),
      keras.callbacks.CSVLogger(posixpath.join(scratch,
                                               evaluate.HISTORY_FILE)),
  ]


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


@dataclasses.dataclass
class Inputs:
  """What the model is fitted and validated on."""
  train: tf.data.Dataset
  validation: tf.data.Dataset
  train_examples: int
  # Train in its own order, unaltered: for the Naive Bayes counts.
  train_once: tf.data.Dataset


def inputs(args, data: data_lib.PreprocessedData) -> Inputs:
  """Train and validation batches; the test split is left for the final
  evaluation of the export alone."""
  budget = int(args.cache_memory_share * data_lib.available_memory())
  # Equal-sized batches: a short last batch would make XLA compile the step
  # again; reshuffling drops different examples every epoch.
  train_data = data_lib.dataset(
      data, raw.TRAIN, args.batch_size, shuffle=True, seed=args.seed,
      drop_remainder=True, bucket_width=args.bucket_width,
      cache=data_lib.cache_in_memory(args.cache, data, raw.TRAIN, budget),
      buffer_size=data_lib.shuffle_buffer(data, raw.TRAIN, budget))
  # Evaluation needs no small batches; large ones make it several times
  # cheaper per example.
  validation = data_lib.dataset(
      data, raw.VALIDATION, max(args.batch_size, 256),
      bucket_width=args.bucket_width,
      cache=data_lib.cache_in_memory(args.cache, data, raw.VALIDATION,
                                     budget))
  train_once = data_lib.dataset(data, raw.TRAIN, 1024, cache=False)
  return Inputs(train_data, validation, data.num_examples(raw.TRAIN),
                train_once)


def branch_args(args, branch: str):
  """The training flags of one branch: the n-gram branch has its own
  epochs and learning rate, and no warm-up or weight decay."""
  if branch != model_lib.NGRAM_LOGITS:
    return args
  return argparse.Namespace(**{
      **vars(args), 'epochs': args.ngram_epochs,
      'learning_rate': args.ngram_learning_rate, 'warmup_fraction': 0.0,
      'weight_decay': 0.0})


def fit_branch(args, model, branch: str, data: Inputs, folders):
  """Trains one branch of ``model`` alone, with its scratch and log
  ``folders``; returns its history."""
  args = branch_args(args, branch)
  trained = model_lib.branch_model(model, branch)
  steps = -(-data.train_examples // args.batch_size) * args.epochs
  trained.compile(optimizer=optimizer(args, steps),
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=['accuracy'],
                  # XLA halves the step time of this small model on CPU.
                  jit_compile=True)
  nan_guard = StopOnNaN()
  with warnings.catch_warnings():
    if args.bucket_width:
      # Length buckets leave the batches of a pass uncounted until one has
      # run, so Keras finds the end of the first epoch by running out of
      # data and warns that it did: that end is where every epoch ends.
      warnings.filterwarnings('ignore', message='Your input ran out of data')
    history = trained.fit(data.train, validation_data=data.validation,
                          epochs=args.epochs,
                          callbacks=[nan_guard, *callbacks(args, *folders)],
                          # The dataset reshuffles itself every epoch.
                          shuffle=False,
                          # A progress bar on a terminal, a line an epoch in
                          # logs.
                          verbose=1 if sys.stdout.isatty() else 2)
  if nan_guard.failure:
    epoch, losses = nan_guard.failure
    found = ', '.join(f'{name} {value}' for name, value in losses.items())
    raise cli.JobError(
        f'training diverged in epoch {epoch} ({found}); nothing was exported: '
        'try a lower --learning_rate, --clipnorm or --warmup_fraction')
  return history.history


def default_epochs(train_examples: int, batch_size: int) -> int:
  steps = max(train_examples // batch_size, 1)
  return min(max(math.ceil(TARGET_STEPS / steps), MIN_EPOCHS), MAX_EPOCHS)


@dataclasses.dataclass
class NgramBranch:
  """The n-gram branch as trained: its layer's weights, its history, and
  the minimum count chosen with the validation figure that chose it."""
  vocabulary: ngrams.Vocabulary
  weights: list
  history: dict
  min_count: int
  scores: dict  # min count tried: best validation --monitor


def fit_ngram_branch(args, params: model_lib.ModelParams,
                     data: data_lib.PreprocessedData, fitting: Inputs,
                     base: tuple) -> NgramBranch:
  """Trains the n-gram branch alone with each minimum count to try (the
  flag's, else MIN_COUNTS), its files in ``base`` folders (a sub-folder a
  count when there are several); keeps the best on validation."""
  every = ngrams.Vocabulary.fit(fitting.train_once, params.ngram_order,
                                len(data.label_names), 1)
  counts = (params.ngram_min_count,) if params.ngram_min_count else MIN_COUNTS
  better = max if args.monitor == 'val_accuracy' else min
  chosen, best = None, None
  scores = {}
  for min_count in counts:
    try:
      vocabulary = every.at_least(min_count)
    except ValueError:
      continue  # a count above every n-gram's of a small corpus
    trial = model_lib.build_model(
        data.vocab_size, data.max_len, len(data.label_names),
        dataclasses.replace(params, model='nbsvm'), vocabulary)
    folders = base if len(counts) == 1 else tuple(
        posixpath.join(folder, f'min_count_{min_count}') for folder in base)
    history = fit_branch(args, trial, model_lib.NGRAM_LOGITS, fitting, folders)
    scores[min_count] = better(history[args.monitor])
    logging.info('n-grams in at least %d training documents: %d, validation '
                 '%s %.4f', min_count, len(vocabulary.keys), args.monitor,
                 scores[min_count])
    if chosen and better(scores[min_count], best) == best:
      break  # no better than a larger count: lower ones memorise more
    best = scores[min_count]
    chosen = NgramBranch(vocabulary, trial.get_layer(
        model_lib.NGRAM_LOGITS).get_weights(), history, min_count, scores)
  if chosen is None:
    raise cli.JobError(f'no n-gram is in {counts[-1]} training documents: '
                       'try --model=transformer or --ngram_min_count=1')
  return chosen


def train(args, params: model_lib.ModelParams,
          data: data_lib.PreprocessedData, run: runs.Run):
  """Fits the model, its files in ``run``'s folders; returns (model,
  histories by branch, training seconds, calibration, the n-gram branch's
  minimum count and the validation figures that chose it)."""
  keras.utils.set_random_seed(args.seed)
  fitting = inputs(args, data)
  started = time.time()
  ngram_branch = None
  if model_lib.NGRAM_LOGITS in params.branches:
    # The hybrid's n-gram branch, and each count a search tries, write
    # beside, not over, the run's own files.
    base = ((run.scratch, run.logs) if params.model == 'nbsvm' and
            params.ngram_min_count else
            tuple(posixpath.join(folder, model_lib.NGRAM_LOGITS)
                  for folder in (run.scratch, run.logs)))
    ngram_branch = fit_ngram_branch(args, params, data, fitting, base)
  model = model_lib.build_model(
      data.vocab_size, data.max_len, len(data.label_names), params,
      ngram_branch and ngram_branch.vocabulary)
  model.summary(print_fn=logging.info)
  histories = {}
  for branch in params.branches:
    if branch == model_lib.NGRAM_LOGITS:
      model.get_layer(branch).set_weights(ngram_branch.weights)
      histories[branch] = ngram_branch.history
    else:
      histories[branch] = fit_branch(args, model, branch, fitting,
                                     (run.scratch, run.logs))
  fitted = calibration.calibrate(model, fitting.validation)
  chosen = ngram_branch and {
      'ngram_min_count': ngram_branch.min_count,
      # In the order tried: JSON objects lose it.
      'tried': [[count, score] for count, score in ngram_branch.scores.items()]}
  return model, histories, time.time() - started, fitted, chosen


def check_trainable(data: data_lib.PreprocessedData,
                    batch_size: int) -> None:
  """A JobError for data no classifier can be trained and evaluated on,
  before any time goes into training."""
  if len(data.label_names) < 2:
    raise cli.JobError(
        f'{data.data_dir} has the classes {data.label_names}: a classifier '
        'needs at least two classes in the train split')
  needs = {raw.VALIDATION: ('to choose the epoch and the calibration',
                            '--validation_fraction'),
           raw.TEST: ('to measure the model on', '--test_fraction')}
  for split, (purpose, flag) in needs.items():
    if not data.num_examples(split):
      raise cli.JobError(
          f'{data.data_dir}: the {split} split is empty, and the trainer '
          f'needs it {purpose}; preprocess with {flag} > 0 or with {split} '
          'records in the data')
  if data.num_examples(raw.TRAIN) < batch_size:
    # Training batches are all full (drop_remainder): not one would run.
    raise cli.JobError(
        f'--batch_size={batch_size} is more than the '
        f'{data.num_examples(raw.TRAIN)} examples of the train split of '
        f'{data.data_dir}, and every training batch is full: use a '
        '--batch_size at most that')


def run(argv=None):
  args = parse_args(argv)
  started = time.time()
  # The folders links lead to when the run starts: a link switched while it
  # trains (to a newer preprocessing output, say) changes nothing it reads
  # or writes.
  args.data_dir = folders.resolved(args.data_dir)
  args.model_dir = folders.resolved(args.model_dir)
  data = data_lib.PreprocessedData.load(args.data_dir)
  check_trainable(data, args.batch_size)
  for flag in ('epochs', 'ngram_epochs'):
    if getattr(args, flag) is None:
      setattr(args, flag, default_epochs(data.num_examples(raw.TRAIN),
                                         args.batch_size))
      logging.info('--%s: at most %d, for about %d steps', flag,
                   getattr(args, flag), TARGET_STEPS)
  try:
    params = model_params(args)
  except ValueError as error:
    raise cli.JobError(str(error)) from error
  runs.check_own(args.model_dir)
  tf.io.gfile.makedirs(args.model_dir)
  with lock.exclusive(args.model_dir):
    runs.sweep(args.model_dir)
    runs.copy_report(args.model_dir)
    run_folders = runs.Run(args.model_dir)
    try:
      return train_and_publish(args, params, data, run_folders, started)
    except BaseException as error:
      run_folders.discard()
      if isinstance(error, Exception) and not isinstance(error, cli.JobError):
        # A republished data folder fails the export or its evaluation in
        # many ways (labels that no longer match, say): say that, not them.
        data.check_unchanged()
      raise


def train_and_publish(args, params: model_lib.ModelParams,
                      data: data_lib.PreprocessedData, run_folders: runs.Run,
                      started: float):
  """Trains, saves the export staged, evaluates it, and only then publishes
  it and the run's files; returns (metrics, export folder)."""
  model, histories, seconds, fitted, ngram_choice = train(args, params, data,
                                                          run_folders)
  epochs_run = {branch: len(history['loss'])
                for branch, history in histories.items()}
  export.save(model, data.tft_output, data.label_names, run_folders.export, {
      'training': {
          **vars(args),
          'epochs_run': sum(epochs_run.values()),
          'epochs_run_by_branch': epochs_run,
          'training_seconds': round(seconds, 1),
          'run_id': run_folders.run_id,
          'ngram_choice': ngram_choice,
      },
      'preprocessing': data.params,
      'data_stats': data.stats,
      'calibration': fitted,
  })
  evaluation = evaluate.evaluate(run_folders.export, data)
  data.check_unchanged()
  version = export.next_version(args.model_dir)
  exports.add_metadata(run_folders.export, {
      'version': version,
      'preprocessing_fingerprint': data.fingerprint})
  # The report goes with the version, so that a version never lacks its
  # report, nor the report its version.
  evaluate.write_report(
      runs.report_dir(run_folders.export), evaluation,
      exports.read_metadata(run_folders.export),
      posixpath.join(run_folders.scratch, evaluate.HISTORY_FILE))
  export_dir = export.publish(run_folders.export, args.model_dir, version)
  run_folders.publish_scratch()
  runs.copy_report(args.model_dir)
  validation = evaluation.metrics[raw.VALIDATION]
  test = evaluation.metrics[raw.TEST]
  logging.info(
      'train: %d epochs in %.0f s (total %.0f s); validation accuracy %.4f; '
      'test accuracy %.4f, macro F1 %.4f on %d examples; export %s; report %s',
      sum(epochs_run.values()), seconds, time.time() - started,
      validation['accuracy'], test['accuracy'], test['macro_f1'],
      test['examples'], export_dir,
      posixpath.join(args.model_dir, evaluate.REPORT_FILE))
  return evaluation.metrics, export_dir


def main():
  """The console script's entry point."""
  cli.main(run)


if __name__ == '__main__':
  main()
