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
from typing import Optional
import warnings

import keras
import numpy as np
import tensorflow as tf

import cli
from cli import flags
from outputs import ownership
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
from trainer import selection

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
MAX_FOLDS = 100
# The folds' files, under the run's scratch and log folders.
CROSS_VALIDATION_DIR = 'cross_validation'


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
  parser.add_argument('--folds', type=folds, default=None,
                      help='Grouped k-fold cross-validation over the train '
                      'split chooses the n-gram minimum count and each '
                      'branch\'s epochs (0: the validation split chooses); '
                      f'auto: {selection.FOLDS} where the train split has at '
                      f'most {selection.AUTO_MAX_EXAMPLES:,} examples and one '
                      f'training reads at most {selection.AUTO_MAX_TOKENS:,} '
                      'tokens (epochs times examples times their median '
                      'length), else 0. Needs the train split in memory.')
  parser.add_argument('--refit', action=argparse.BooleanOptionalAction,
                      default=None,
                      help='After cross-validation, train the final model on '
                      'train + validation, calibrated on the folds\' '
                      'held-out predictions; default: with --folds.')
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


def folds(text: str):
  """--folds: auto (None), 0, or a number of folds from 2."""
  if text == 'auto':
    return None
  value = flags.integer(0, MAX_FOLDS)(text)
  if value == 1:
    raise argparse.ArgumentTypeError(
        f'must be auto, 0 or 2 to {MAX_FOLDS}, not 1: one fold holds out '
        'every example at once')
  return value


folds.values = f'auto, 0, or integer in [2, {MAX_FOLDS}]'


def parse_args(argv):
  return flags.parse(build_parser(), argv)[0]


def add_branch_args(parser) -> None:
  """The flags of the model kind and the n-gram branch's training."""
  parser.add_argument('--model', choices=model_lib.MODELS,
                      default=model_lib.ModelParams().model,
                      help='transformer; nbsvm (binarized n-grams scaled '
                      'by Naive Bayes ratios); hybrid (both, each trained '
                      'alone, their logits weighted on held-out predictions: '
                      'the cross-validation folds\' or the validation '
                      'split\'s, as --folds chooses).')
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


def callbacks(args, scratch: str, logs: str, stop_early: bool = True):
  """Early stopping (unless the epochs are chosen already), and the run's
  checkpoint and history in ``scratch`` and TensorBoard logs in ``logs``."""
  tf.io.gfile.makedirs(scratch)  # CSVLogger does not make its folder
  # Keras formats the path with the epoch's figures ({epoch}): a brace of
  # the folder's name is a literal one.
  checkpoint = posixpath.join(scratch, runs.CHECKPOINTS_DIR,
                              runs.CHECKPOINT_FILE).replace('{', '{{').replace(
                                  '}', '}}')
  return [
      *([keras.callbacks.EarlyStopping(monitor=args.monitor,
                                       patience=args.patience,
                                       restore_best_weights=True, verbose=1)]
        if stop_early else []),
      keras.callbacks.ModelCheckpoint(
          checkpoint, monitor=args.monitor, save_best_only=stop_early,
          save_weights_only=True),
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
  """What the model is fitted (and, when it is held out, validated) on."""
  train: tf.data.Dataset
  validation: Optional[tf.data.Dataset]
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
  train_once = data_lib.dataset(data, raw.TRAIN, 1024, cache=False)
  return Inputs(train_data, validation_batches(args, data, budget),
                data.num_examples(raw.TRAIN), train_once)


def validation_batches(args, data: data_lib.PreprocessedData,
                       budget: int) -> tf.data.Dataset:
  # Evaluation needs no small batches; large ones make it several times
  # cheaper per example.
  return data_lib.dataset(
      data, raw.VALIDATION, max(args.batch_size, 256),
      bucket_width=args.bucket_width,
      cache=data_lib.cache_in_memory(args.cache, data, raw.VALIDATION,
                                     budget))


def in_memory_inputs(args, examples: data_lib.Examples,
                     validation: Optional[tf.data.Dataset]) -> Inputs:
  """``inputs`` of examples held in memory."""
  return Inputs(
      examples.dataset(args.batch_size, shuffle=True, seed=args.seed,
                       drop_remainder=True, bucket_width=args.bucket_width),
      validation, len(examples), examples.dataset(1024))


def branch_args(args, branch: str):
  """The training flags of one branch: the n-gram branch has its own
  epochs and learning rate, and no warm-up or weight decay."""
  if branch != model_lib.NGRAM_LOGITS:
    return args
  return argparse.Namespace(**{
      **vars(args), 'epochs': args.ngram_epochs,
      'learning_rate': args.ngram_learning_rate, 'warmup_fraction': 0.0,
      'weight_decay': 0.0})


def fit_branch(args, model, branch: str, data: Inputs, folders,
               held_out: Optional[selection.HeldOutFold] = None):
  """Trains one branch of ``model`` alone, with its scratch and log
  ``folders``; returns its history. With ``held_out`` (a fold of
  cross-validation), that callback measures every epoch and stops the
  fold; without, ``data.validation`` measures it, and stops training early
  unless the epochs were chosen by cross-validation."""
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
    stop_early = held_out is None and not args.folds
    history = trained.fit(data.train,
                          validation_data=None if held_out else
                          data.validation,
                          epochs=args.epochs,
                          callbacks=[nan_guard, *([held_out] if held_out
                                                  else []),
                                     *callbacks(args, *folders, stop_early)],
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


def min_counts(params: model_lib.ModelParams):
  """The n-gram minimum counts to try: the flag's, else MIN_COUNTS."""
  return (params.ngram_min_count,) if params.ngram_min_count else MIN_COUNTS


def fit_ngram_branch(args, params: model_lib.ModelParams,
                     data: data_lib.PreprocessedData, fitting: Inputs,
                     base: tuple, every: Optional[ngrams.DocumentNgrams]
                     ) -> NgramBranch:
  """Trains the n-gram branch alone with each minimum count to try, its
  files in ``base`` folders (a sub-folder a count when there are several);
  keeps the best on validation. ``every``: the n-grams of ``fitting``'s
  training documents when already found."""
  every = every or ngrams.DocumentNgrams.fit(fitting.train_once,
                                             params.ngram_order)
  counts = min_counts(params)
  better = max if args.monitor == 'val_accuracy' else min
  chosen, best = None, None
  scores = {}
  for min_count in counts:
    try:
      vocabulary = every.vocabulary(len(data.label_names),
                                    min_count=min_count)
    except ValueError:
      continue  # a count above every n-gram's of a small corpus
    trial = model_lib.build_model(
        data.vocab_size, data.max_len, len(data.label_names),
        dataclasses.replace(params, model='nbsvm'), vocabulary)
    folders = base if len(counts) == 1 else tuple(
        posixpath.join(folder, f'min_count_{min_count}') for folder in base)
    history = fit_branch(args, trial, model_lib.NGRAM_LOGITS, fitting, folders)
    scores[min_count] = (better(history[args.monitor])
                         if args.monitor in history else None)
    logging.info('n-grams in at least %d training documents: %d, validation '
                 '%s %s', min_count, len(vocabulary.keys), args.monitor,
                 scores[min_count])
    if chosen and better(scores[min_count], best) == best:
      break  # no better than a larger count: lower ones memorise more
    best = scores[min_count]
    chosen = NgramBranch(vocabulary, trial.get_layer(
        model_lib.NGRAM_LOGITS).get_weights(), history, min_count, scores)
  if chosen is None:
    raise no_ngram(counts)
  return chosen


def no_ngram(counts, fewest: Optional[int] = None) -> cli.JobError:
  """The error for no n-gram in as many training documents as the lowest
  count tried; ``fewest``: the examples of the smallest training part of
  cross-validation's folds, where that was so."""
  where = (f' of every fold\'s training part (the smallest: {fewest} '
           'examples)' if fewest is not None else '')
  return cli.JobError(f'no n-gram is in {counts[-1]} training documents'
                      f'{where}: try --model=transformer or '
                      '--ngram_min_count=1' + (' or --folds=0' if where
                                               else ''))


@dataclasses.dataclass
class Folds:
  """Cross-validation's plan: the examples in memory (train, then
  validation with --refit), the train split's alone, and the fold of each
  of those."""
  examples: data_lib.Examples
  train: data_lib.Examples
  fold_of: np.ndarray
  groups: int


def plan_folds(args, data: data_lib.PreprocessedData) -> Folds:
  """Deals the train split into --folds folds by its groups; a JobError,
  before anything is written, where that cannot be done."""
  examples = data_lib.Examples.load(
      data, raw.TRAIN, *([raw.VALIDATION] if args.refit else []))
  train_examples = examples.take(np.arange(data.num_examples(raw.TRAIN)))
  keys = selection.fold_keys(train_examples, data.params)
  try:
    fold_of = selection.assign_folds(keys, args.folds, args.seed)
  except ValueError as error:
    raise cli.JobError(f'--folds={args.folds}: {error} in the train split '
                       f'of {data.data_dir}; use fewer') from error
  try:
    selection.check_training_parts(fold_of, args.folds, args.batch_size)
  except ValueError as error:
    raise cli.JobError(f'--folds={args.folds}: {error}; use fewer folds or '
                       'a smaller --batch_size') from error
  return Folds(examples, train_examples, fold_of, len(set(keys)))


def cross_validate(args, params: model_lib.ModelParams,
                   data: data_lib.PreprocessedData, examples:
                   data_lib.Examples, fold_of: np.ndarray, groups: int,
                   table: Optional[ngrams.DocumentNgrams], run: runs.Run
                   ) -> selection.Choice:
  """Grouped k-fold cross-validation of every branch over ``examples`` (the
  train split, dealt into folds by ``fold_of``, from ``groups`` groups):
  the n-gram branch at each minimum count to try (largest first, until one
  is no better), each branch for its epochs, a fold stopped after
  --patience epochs without a better held-out figure. ``table`` holds the
  n-grams of ``examples`` in its first rows."""
  num_classes = len(data.label_names)
  better = max if args.monitor == 'val_accuracy' else min
  candidates = {}
  for branch in params.branches:
    is_ngram = branch == model_lib.NGRAM_LOGITS
    kind = 'nbsvm' if is_ngram else 'transformer'
    tried = []
    for min_count in (min_counts(params) if is_ngram else (None,)):
      candidate = selection.Candidate(
          branch, {'ngram_min_count': min_count} if is_ngram else {})
      for fold in range(args.folds):
        fitted_rows = np.flatnonzero(fold_of != fold)
        vocabulary = None
        if is_ngram:
          try:
            vocabulary = table.vocabulary(num_classes, fitted_rows, min_count)
          except ValueError:
            break  # a count above every n-gram's in this fold
        model = model_lib.build_model(
            data.vocab_size, data.max_len, num_classes,
            dataclasses.replace(params, model=kind), vocabulary)
        held_out = selection.HeldOutFold(
            model, branch, examples.take(fold_of == fold), args.bucket_width,
            args.monitor, args.patience)
        name = (f'{branch}-min_count_{min_count}-fold_{fold + 1}' if is_ngram
                else f'{branch}-fold_{fold + 1}')
        fit_branch(args, model, branch,
                   in_memory_inputs(args, examples.take(fitted_rows), None),
                   tuple(posixpath.join(folder, CROSS_VALIDATION_DIR, name)
                         for folder in (run.scratch, run.logs)), held_out)
        candidate.add_fold(np.flatnonzero(fold_of == fold), held_out.logits)
      if len(candidate.rows) < args.folds:
        continue
      selection.log_candidate(candidate, examples.labels, args.monitor)
      score = candidate.summary(examples.labels, args.monitor)['mean']
      if tried and better(score, tried[-1][1]) == tried[-1][1]:
        tried.append((candidate, score))
        break  # no better than a larger count: lower ones memorise more
      tried.append((candidate, score))
    if not tried:
      raise no_ngram(min_counts(params), int(min(
          np.sum(fold_of != fold) for fold in range(args.folds))))
    candidates[branch] = [candidate for candidate, _ in tried]
  return selection.choose(candidates, params.branches, examples.labels,
                          args.monitor, args.folds, groups)


def train(args, params: model_lib.ModelParams,
          data: data_lib.PreprocessedData, run: runs.Run,
          folds: Optional[Folds] = None):
  """Fits the model, its files in ``run``'s folders, cross-validated by
  ``folds`` (``plan_folds``) where --folds asks; returns (model, histories
  by branch, training seconds, calibration, what was chosen and on
  what)."""
  keras.utils.set_random_seed(args.seed)
  started = time.time()
  seconds = {}  # what each part of the training took
  choice, table = None, None
  if args.folds:
    folds = folds or plan_folds(args, data)
    examples = folds.examples
    # The n-grams of every document, found once: the folds' vocabularies
    # count its train rows, the final one all of them.
    table = (ngrams.DocumentNgrams.fit(examples.dataset(1024),
                                       params.ngram_order)
             if model_lib.NGRAM_LOGITS in params.branches else None)
    choice = cross_validate(args, params, data, folds.train, folds.fold_of,
                            folds.groups, table, run)
    seconds[selection.CROSS_VALIDATION] = time.time() - started
    args = argparse.Namespace(**{
        **vars(args),
        'epochs': choice.epochs.get(model_lib.TRANSFORMER_LOGITS,
                                    args.epochs),
        'ngram_epochs': choice.epochs.get(model_lib.NGRAM_LOGITS,
                                          args.ngram_epochs)})
    if choice.ngram_min_count:
      params = dataclasses.replace(params,
                                   ngram_min_count=choice.ngram_min_count)
    fitting = in_memory_inputs(
        args, examples, None if args.refit else validation_batches(
            args, data, int(args.cache_memory_share *
                            data_lib.available_memory())))
  else:
    fitting = inputs(args, data)
  ngram_branch = None
  if model_lib.NGRAM_LOGITS in params.branches:
    # The hybrid's n-gram branch, and each count a search tries, write
    # beside, not over, the run's own files.
    base = ((run.scratch, run.logs) if params.model == 'nbsvm' and
            params.ngram_min_count else
            tuple(posixpath.join(folder, model_lib.NGRAM_LOGITS)
                  for folder in (run.scratch, run.logs)))
    fitted_from = time.time()
    ngram_branch = fit_ngram_branch(args, params, data, fitting, base, table)
    seconds[model_lib.NGRAM_LOGITS] = time.time() - fitted_from
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
      fitted_from = time.time()
      histories[branch] = fit_branch(args, model, branch, fitting,
                                     (run.scratch, run.logs))
      seconds[branch] = time.time() - fitted_from
  if choice and args.refit:
    fitted = calibration.calibrate_logits(
        model, choice.logits, choice.labels, selection.CROSS_VALIDATION,
        weights_by_accuracy=True)
  else:
    fitted = calibration.calibrate(model, fitting.validation)
  chosen = {'on': selection.CROSS_VALIDATION if choice else raw.VALIDATION,
            'refit': bool(choice and args.refit),
            'seconds': {part: round(value, 1)
                        for part, value in seconds.items()}}
  if choice:
    chosen['cross_validation'] = choice.describe()
  if ngram_branch:
    chosen['ngram_min_count'] = ngram_branch.min_count
    if not choice:
      # In the order tried: JSON objects lose it.
      chosen['tried'] = [[count, score]
                         for count, score in ngram_branch.scores.items()]
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


def resolve_selection(args, data: data_lib.PreprocessedData) -> None:
  """--folds=auto and --refit's default, from the train split's size; a
  JobError for --refit without cross-validation."""
  train_examples = data.num_examples(raw.TRAIN)
  group_field = selection.unkept_group_field(data.params)
  if args.folds is None and group_field:
    args.folds = 0
    logging.info('--folds: 0 (the output was split by --group_field=%s, '
                 'which its records do not keep: folds could not follow '
                 'it)', group_field)
  elif args.folds is None:
    median = data.stats.get('token_length', {}).get('p50')
    median = min(data.max_len if median is None else median, data.max_len)
    epochs = max(args.epochs, args.ngram_epochs)
    args.folds = selection.auto_folds(train_examples, median, epochs,
                                      args.batch_size)
    logging.info('--folds: %d (the train split has %d examples of %d tokens '
                 'at the median, trained for at most %d epochs in batches of '
                 '%d)', args.folds, train_examples, median, epochs,
                 args.batch_size)
  if args.folds and group_field:
    raise cli.JobError(
        f'--folds={args.folds}: {data.data_dir} was split by '
        f'--group_field={group_field}, which its records do not keep, so '
        'folds could not keep a group on one side: use --folds=0 (the '
        'validation split, held out by group), or preprocess with '
        '--group_pattern over the ids')
  if args.refit is None:
    args.refit = bool(args.folds)
  elif args.refit and not args.folds:
    raise cli.JobError('--refit calibrates on the held-out predictions of '
                       'cross-validation: it needs --folds of 2 or more')


def run(argv=None):
  args = parse_args(argv)
  started = time.time()
  # The folders links lead to when the run starts: a link switched while it
  # trains (to a newer preprocessing output, say) changes nothing it reads
  # or writes.
  args.data_dir = ownership.resolved(args.data_dir)
  args.model_dir = ownership.resolved(args.model_dir)
  data = data_lib.PreprocessedData.load(args.data_dir)
  check_trainable(data, args.batch_size)
  for flag in ('epochs', 'ngram_epochs'):
    if getattr(args, flag) is None:
      setattr(args, flag, default_epochs(data.num_examples(raw.TRAIN),
                                         args.batch_size))
      logging.info('--%s: at most %d, for about %d steps', flag,
                   getattr(args, flag), TARGET_STEPS)
  resolve_selection(args, data)
  try:
    params = model_params(args)
  except ValueError as error:
    raise cli.JobError(str(error)) from error
  # Before the model folder is touched: a plan that cannot be carried out
  # leaves nothing behind.
  folds = plan_folds(args, data) if args.folds else None
  runs.check_own(args.model_dir)
  tf.io.gfile.makedirs(args.model_dir)
  with lock.exclusive(args.model_dir):
    runs.sweep(args.model_dir)
    runs.copy_report(args.model_dir)
    run_folders = runs.Run(args.model_dir)
    try:
      return train_and_publish(args, params, data, run_folders, started,
                               folds)
    except BaseException as error:
      run_folders.discard()
      if isinstance(error, Exception) and not isinstance(error, cli.JobError):
        # A republished data folder fails the export or its evaluation in
        # many ways (labels that no longer match, say): say that, not them.
        data.check_unchanged()
      raise


def train_and_publish(args, params: model_lib.ModelParams,
                      data: data_lib.PreprocessedData, run_folders: runs.Run,
                      started: float, folds: Optional[Folds] = None):
  """Trains, saves the export staged, evaluates it, and only then publishes
  it and the run's files; returns (metrics, export folder)."""
  model, histories, seconds, fitted, choices = train(args, params, data,
                                                     run_folders, folds)
  epochs_run = {branch: len(history['loss'])
                for branch, history in histories.items()}
  export.save(model, data.tft_output, data.label_names, run_folders.export, {
      'training': {
          **vars(args),
          'epochs_run': sum(epochs_run.values()),
          'epochs_run_by_branch': epochs_run,
          'training_seconds': round(seconds, 1),
          'run_id': run_folders.run_id,
          'choices': choices,
      },
      'preprocessing': data.params,
      'data_stats': data.stats,
      'calibration': fitted,
  })
  evaluation = evaluate.evaluate(run_folders.export, data)
  data.check_unchanged()
  version = run_folders.next_version()
  exports.add_metadata(run_folders.export, {
      'version': version,
      'preprocessing_fingerprint': data.fingerprint})
  # The report goes with the version, so that a version never lacks its
  # report, nor the report its version.
  evaluate.write_report(
      runs.report_dir(run_folders.export), evaluation,
      exports.read_metadata(run_folders.export),
      posixpath.join(run_folders.scratch, evaluate.HISTORY_FILE))
  export_dir = run_folders.publish(version)
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
