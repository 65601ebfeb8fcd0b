"""What the trainer's flags resolve to on the preprocessing output, once,
before the model folder is touched: the frozen ``Settings`` every step of a
run reads (the folders their links lead to, each branch's most epochs,
--folds=auto, --refit's default, the model's fields)."""
import dataclasses
import logging
import math
from typing import Dict, Optional, Tuple

import cli
from outputs import ownership
from schemas import raw
from trainer import data as data_lib
from trainer import model as model_lib
from trainer import selection

# Without --epochs (--ngram_epochs), a branch trains for as many epochs as
# make about TARGET_STEPS steps (2 on IMDB's 22,700 training reviews at batch
# 32, where the keras.io model peaks), MIN_EPOCHS to MAX_EPOCHS: a small
# corpus needs more passes for as many updates, and early stopping on
# validation keeps the best epoch.
TARGET_STEPS = 1400
MIN_EPOCHS, MAX_EPOCHS = 2, 20
# --ngram_fit=auto: the convex solver (trainer.ngram_solver) where the train
# split has at most this many examples, Keras epochs above. The solver
# holds the split's (document, n-gram) pairs in memory; below this size
# that is a few megabytes and its fit a fraction of a second, where
# epochs take a compiled graph a fit and tens of passes.
CONVEX_MAX_EXAMPLES = 5_000
# --model=hybrid on a train split of fewer examples than
# --transformer_min_examples (default this) is its n-gram branch alone: a
# transformer learnt from scratch on a few hundred documents adds nothing
# the folds can tell from noise (500 support tickets: its held-out accuracy
# 0.924 against the n-gram branch's 0.930), and costs nearly all of the
# training time. At 1,809 IMDB reviews it takes a quarter to a half of the
# hybrid's weight; at SMS's 3,508 messages it is the stronger branch.
TRANSFORMER_MIN_EXAMPLES = 1_000
# A Keras fit is compiled with XLA where it plans at least this many steps
# (batches times epochs). On a 2-core Intel Xeon, XLA took about 5 s more
# than TensorFlow's own graph to compile a fit of the default transformer
# (two length buckets) and saved nothing on its 35 ms step; were it to halve
# the step, it would pay for itself after about 300 steps. A few hundred
# documents' fits plan fewer, and were mostly compilation.
XLA_MIN_STEPS = 300
# What --ngram_fit resolves to.
NGRAM_FITS = ('convex', 'epochs')


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How one branch trains: its most epochs, and its optimizer's rate,
  warm-up, decay and clipping."""
  epochs: int
  learning_rate: float
  warmup_fraction: float
  decay: bool
  weight_decay: float
  clipnorm: Optional[float]


@dataclasses.dataclass(frozen=True)
class Settings:
  """The trainer's flags as a run reads them, each resolved once; the
  model's own (``ModelParams``) in ``params``."""
  data_dir: str            # where its link led when the run started
  model_dir: str           # as data_dir
  epochs: int              # the transformer's most epochs
  batch_size: int
  learning_rate: float
  warmup_fraction: float
  decay: bool
  weight_decay: float
  clipnorm: Optional[float]
  patience: int
  monitor: str
  bucket_width: int
  seed: int
  folds: int               # 0: the validation split chooses
  refit: bool
  cache: str
  cache_memory_share: float
  ngram_epochs: int        # the n-gram branch's most epochs
  ngram_learning_rate: float
  ngram_fit: str           # convex or epochs
  transformer_min_examples: int
  model: str               # as --model asked; params.model is what is fitted
  bless_min_gain_over_majority: float
  bless_tolerance: float
  verbose: bool
  params: model_lib.ModelParams

  def __post_init__(self):
    unresolved = [name for name in ('epochs', 'ngram_epochs', 'folds',
                                    'refit') if getattr(self, name) is None]
    if self.ngram_fit not in NGRAM_FITS:
      unresolved.append('ngram_fit')
    if unresolved:
      raise ValueError(f'settings left unresolved: {", ".join(unresolved)}')

  @classmethod
  def of(cls, args, model: Optional[str] = None, **resolved) -> 'Settings':
    """The parsed flags ``args`` as given, but for the ``resolved`` ones
    and the ``model`` fitted; a ValueError for values the model refuses."""
    given = {field.name: getattr(args, field.name)
             for field in dataclasses.fields(cls) if field.name != 'params'}
    params = model_params(args)
    if model:
      params = dataclasses.replace(params, model=model)
    return cls(**{**given, **resolved}, params=params)

  @property
  def branches_fitted_by_epochs(self) -> Tuple[str, ...]:
    """The branches Keras fits in batches (``fitted_by_epochs``)."""
    return fitted_by_epochs(self.params.model, self.ngram_fit)

  @property
  def transformer_skipped(self) -> bool:
    """Whether --model=hybrid is fitted as its n-gram branch alone, the
    train split being smaller than --transformer_min_examples."""
    return self.params.model != self.model

  def schedule(self, branch: str, epochs: Optional[int] = None) -> Schedule:
    """How ``branch`` trains, for at most ``epochs`` where cross-validation
    chose them, else its flag's: the n-gram branch has its own epochs and
    learning rate, and no warm-up or weight decay."""
    if branch == model_lib.NGRAM_LOGITS:
      return Schedule(self.ngram_epochs if epochs is None else epochs,
                      self.ngram_learning_rate, warmup_fraction=0.0,
                      decay=self.decay, weight_decay=0.0,
                      clipnorm=self.clipnorm)
    return Schedule(self.epochs if epochs is None else epochs,
                    self.learning_rate, self.warmup_fraction, self.decay,
                    self.weight_decay, self.clipnorm)

  def record(self) -> Dict:
    """Every flag as this run resolved it, by name, for the export's
    metadata."""
    flags = {field.name: getattr(self, field.name)
             for field in dataclasses.fields(self) if field.name != 'params'}
    return {**flags, **dataclasses.asdict(self.params)}


def model_params(args) -> model_lib.ModelParams:
  return model_lib.ModelParams(**{
      field.name: getattr(args, field.name)
      for field in dataclasses.fields(model_lib.ModelParams)})


def settings_from_args(args) -> Tuple[Settings, data_lib.PreprocessedData]:
  """The flags resolved on the preprocessing output, which this loads and
  checks; a JobError, before anything is written, names what cannot be
  trained or chosen."""
  # The folders links lead to when the run starts: a link switched while it
  # trains (to a newer preprocessing output, say) changes nothing it reads
  # or writes.
  data_dir = ownership.resolved(args.data_dir)
  model_dir = ownership.resolved(args.model_dir)
  data = data_lib.PreprocessedData.load(data_dir)
  check_trainable(data, args.batch_size)
  train_examples = data.num_examples(raw.TRAIN)
  model = resolve_model(args.model, train_examples,
                        args.transformer_min_examples)
  ngram_fit = resolve_ngram_fit(args.ngram_fit, train_examples, model)
  epochs = {flag: most_epochs(flag, getattr(args, flag), data,
                              args.batch_size)
            for flag in ('epochs', 'ngram_epochs')}
  # What a fold costs: the epochs of the branches Keras fits (a convex
  # n-gram branch costs next to nothing).
  fitted_epochs = [
      epochs['epochs' if branch == model_lib.TRANSFORMER_LOGITS else
             'ngram_epochs']
      for branch in fitted_by_epochs(model, ngram_fit)]
  folds = resolve_folds(args.folds, data, max(fitted_epochs, default=0),
                        args.batch_size)
  refit = resolve_refit(args.refit, folds)
  try:
    settings = Settings.of(
        args, model=model, data_dir=data_dir, model_dir=model_dir,
        folds=folds, refit=refit, ngram_fit=ngram_fit, **epochs)
  except ValueError as error:
    raise cli.JobError(str(error)) from error
  return settings, data


def fitted_by_epochs(model: str, ngram_fit: str) -> Tuple[str, ...]:
  """The branches of the ``model`` fitted that Keras fits in batches, for
  epochs: the transformer, and the n-gram branch unless the convex solver
  fits it."""
  return tuple(branch for branch in model_lib.ModelParams(model=model).branches
               if branch == model_lib.TRANSFORMER_LOGITS or
               ngram_fit == 'epochs')


def check_trainable(data: data_lib.PreprocessedData,
                    batch_size: int) -> None:
  """A JobError for data no classifier can be trained and evaluated on,
  before any time goes into training."""
  if len(data.label_names) < 2:
    raise cli.JobError(
        f'{data.data_dir} has the classes {data.label_names}: a classifier '
        'needs at least two classes in the train split')
  needs = {raw.VALIDATION: 'to choose the epoch and the calibration',
           raw.TEST: 'to measure the model on'}
  for split, purpose in needs.items():
    if not data.num_examples(split):
      raise cli.JobError(
          f'{data.data_dir}: the {split} split is empty, and the trainer '
          f'needs it {purpose}; {_how_to_fill(data, split)}')
  if data.num_examples(raw.TRAIN) < batch_size:
    # Training batches are all full (drop_remainder): not one would run.
    raise cli.JobError(
        f'--batch_size={batch_size} is more than the '
        f'{data.num_examples(raw.TRAIN)} examples of the train split of '
        f'{data.data_dir}, and every training batch is full: use a '
        '--batch_size at most that')


def _how_to_fill(data: data_lib.PreprocessedData, split: str) -> str:
  """What would have put records into an empty ``split``: a share where it
  was 0; where it was not, more distinct texts, since the share is dealt by
  a hash of each text (or group), so that many copies of a few texts may
  all land elsewhere."""
  flag = f'--{split}_fraction'
  fraction = data.params.get(f'{split}_fraction') or 0
  if not fraction:
    return f'preprocess with {flag} > 0 or with {split} records in the data'
  dealt_from = ('records whose split the data does not name' if
                split == raw.TEST else 'records the data names train or '
                'does not name')
  return (f'preprocessing gave it {flag}={fraction} of the {dealt_from}, '
          'dealt by a hash of each text (or group), and they held too few '
          'distinct texts (or groups) for any to land there: preprocess more '
          f'distinct records, or {split} records the data names')


def default_epochs(train_examples: int, batch_size: int) -> int:
  steps = max(train_examples // batch_size, 1)
  return min(max(math.ceil(TARGET_STEPS / steps), MIN_EPOCHS), MAX_EPOCHS)


def most_epochs(flag: str, given: Optional[int],
                data: data_lib.PreprocessedData, batch_size: int) -> int:
  """--epochs or --ngram_epochs (``flag``): as ``given``, else enough for
  about TARGET_STEPS steps over the train split."""
  if given is not None:
    return given
  epochs = default_epochs(data.num_examples(raw.TRAIN), batch_size)
  logging.info('--%s: at most %d, for about %d steps', flag, epochs,
               TARGET_STEPS)
  return epochs


def resolve_folds(given: Optional[int], data: data_lib.PreprocessedData,
                  epochs: int, batch_size: int) -> int:
  """--folds as ``given``, else auto's, from the train split's size and
  ``epochs`` (the most of any branch Keras fits; 0: none); a JobError for
  folds that cannot follow the groups the output was split by."""
  group_field = selection.unkept_group_field(data.params)
  folds = given
  if folds is None and group_field:
    folds = 0
    logging.info('--folds: 0 (the output was split by --group_field=%s, '
                 'which its records do not keep: folds could not follow '
                 'it)', group_field)
  elif folds is None:
    train_examples = data.num_examples(raw.TRAIN)
    median = data.stats.get('token_length', {}).get('p50')
    median = min(data.max_len if median is None else median, data.max_len)
    folds = selection.auto_folds(train_examples, median, epochs, batch_size)
    logging.info('--folds: %d (the train split has %d examples of %d tokens '
                 'at the median, %s)', folds, train_examples, median,
                 f'trained for at most {epochs} epochs in batches of '
                 f'{batch_size}' if epochs else 'fitted by the convex solver '
                 'alone')
  if folds and group_field:
    raise cli.JobError(
        f'--folds={folds}: {data.data_dir} was split by '
        f'--group_field={group_field}, which its records do not keep, so '
        'folds could not keep a group on one side: use --folds=0 (the '
        'validation split, held out by group), or preprocess with '
        '--group_pattern over the ids')
  return folds


def resolve_model(given: str, train_examples: int, min_examples: int) -> str:
  """The model fitted for --model ``given``: the hybrid's n-gram branch
  alone on a train split of fewer than ``min_examples``
  (--transformer_min_examples)."""
  if given == 'hybrid' and train_examples < min_examples:
    logging.info('--model=hybrid: fitted as its n-gram branch alone (nbsvm): '
                 'the train split has %d examples, fewer than '
                 '--transformer_min_examples=%d', train_examples,
                 min_examples)
    return 'nbsvm'
  return given


def resolve_ngram_fit(given: str, train_examples: int, model: str) -> str:
  """--ngram_fit as ``given``, auto's from the train split's size (said
  where ``model`` has an n-gram branch)."""
  if given != 'auto':
    return given
  chosen = 'convex' if train_examples <= CONVEX_MAX_EXAMPLES else 'epochs'
  if model_lib.NGRAM_LOGITS in model_lib.ModelParams(model=model).branches:
    logging.info('--ngram_fit: %s (the train split has %d examples; the '
                 'convex solver up to %d)', chosen, train_examples,
                 CONVEX_MAX_EXAMPLES)
  return chosen


def resolve_refit(given: Optional[bool], folds: int) -> bool:
  """--refit as ``given``, else with cross-validation; a JobError for
  --refit without it."""
  if given is None:
    return bool(folds)
  if given and not folds:
    raise cli.JobError('--refit calibrates on the held-out predictions of '
                       'cross-validation: it needs --folds of 2 or more')
  return given
