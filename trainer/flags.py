"""The trainer's flags, each typed and range-checked, in the order --help
and the flag reference list them. What they resolve to on the data (the
epochs, --folds=auto, --refit) is ``trainer.settings``'s."""
import argparse
import dataclasses

import numpy as np

from cli import flags as cli_flags
from trainer import data as data_lib
from trainer import model as model_lib
from trainer import selection
from trainer import settings as settings_lib

# The largest learning rate the optimizer's float32 variables hold; a large
# one below it diverges, which the trainer reports as such.
FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_FOLDS = 100
_CACHE_MAX = f'{data_lib.CACHE_MAX_BYTES / 2**30:g} GiB'


def add_flags(parser: cli_flags.Parser) -> None:
  """Every flag of the trainer, on the entry point's ``parser``."""
  parser.add_argument('--data_dir', required=True, type=cli_flags.folder,
                      help='Output folder of pipeline.preprocess.')
  parser.add_argument('--model_dir', required=True, type=cli_flags.folder,
                      help='Model folder: each run adds a version under '
                      'export/, with metrics.json and report.md beside.')
  add_training_args(parser)
  add_choice_args(parser)
  add_blessing_args(parser)
  add_cache_args(parser)
  add_branch_args(parser)
  add_model_args(parser)


def add_training_args(parser) -> None:
  """The flags of the transformer's training, its batches and the seed."""
  parser.add_argument('--epochs', type=cli_flags.integer(1), default=None,
                      help='Most epochs of the transformer (stopped early '
                      'on validation); default: enough for about '
                      f'{settings_lib.TARGET_STEPS} steps, '
                      f'{settings_lib.MIN_EPOCHS} to '
                      f'{settings_lib.MAX_EPOCHS}.')
  parser.add_argument('--batch_size', type=cli_flags.integer(1), default=32,
                      help='Training examples a step; at most the train '
                      'split\'s size.')
  add_learning_rate(parser, '--learning_rate', 'the transformer')
  parser.add_argument('--warmup_fraction',
                      type=cli_flags.number(0, 1, high_open=True), default=0.0,
                      help='Share of the steps with a linear warm-up; with '
                      '--decay, the rate then follows a cosine to zero.')
  parser.add_argument('--decay', action=argparse.BooleanOptionalAction,
                      default=True,
                      help='Cosine decay of the learning rate to zero.')
  parser.add_argument('--weight_decay', type=cli_flags.number(0), default=0.0,
                      help='Decoupled weight decay (AdamW) when > 0.')
  parser.add_argument('--clipnorm', type=cli_flags.number(0, low_open=True),
                      default=None, help='Clip each gradient to this norm.')
  parser.add_argument('--patience', type=cli_flags.integer(0), default=3,
                      help='Epochs without improvement of --monitor before '
                      'stopping; the best weights are restored.')
  parser.add_argument('--monitor', choices=('val_loss', 'val_accuracy'),
                      default='val_accuracy',
                      help='The validation metric that picks the best '
                      'epoch.')
  parser.add_argument('--bucket_width', type=cli_flags.integer(0), default=128,
                      help='Batch documents of similar length, cut to a '
                      'multiple of this many tokens; 0 pads every batch to '
                      'max_len.')
  parser.add_argument('--seed', type=cli_flags.integer(0, 2**32 - 1),
                      default=42,
                      help='Seed of the weights, the shuffling and dropout.')


def add_choice_args(parser) -> None:
  """The flags of what chooses: cross-validation or the validation split."""
  parser.add_argument('--folds', type=folds, default=None,
                      help='Grouped k-fold cross-validation over the train '
                      'split chooses the n-gram minimum count and each '
                      'branch\'s epochs (0: the validation split chooses); '
                      f'auto: {selection.FOLDS} where the train split has at '
                      f'most {selection.AUTO_MAX_EXAMPLES:,} examples and one '
                      f'training reads at most {selection.AUTO_MAX_TOKENS:,} '
                      'tokens (epochs times examples times their median '
                      'length), else 0, as where the train split\'s groups '
                      'cannot fill the folds.')
  parser.add_argument('--refit', action=argparse.BooleanOptionalAction,
                      default=None,
                      help='After cross-validation, train the final model on '
                      'train + validation, calibrated on the folds\' '
                      'held-out predictions; default: with --folds.')


def add_blessing_args(parser) -> None:
  """The flags of the gate a version passes to be served by default
  (``trainer.blessing``)."""
  parser.add_argument('--bless_min_gain_over_majority',
                      type=cli_flags.number(0, 1, high_open=True),
                      default=0.0,
                      help='A version is blessed (served by jobs that name '
                      'the model folder) only if its accuracy on what chose '
                      'it (validation, or cross-validation\'s held-out '
                      'predictions; never test) beats always answering the '
                      'majority class by more than this.')
  parser.add_argument('--bless_tolerance', type=cli_flags.number(0, 1),
                      default=0.01,
                      help='A version is blessed only if it is at most this '
                      'much less accurate than the newest blessed version '
                      'before it, both measured as for '
                      '--bless_min_gain_over_majority on this run\'s data; '
                      '1: judged against the majority class alone.')


def add_cache_args(parser) -> None:
  """The flags of where the splits are read from every epoch."""
  parser.add_argument('--cache', choices=data_lib.CACHE_POLICIES,
                      default='auto',
                      help='Keep the train and validation splits parsed in '
                      'memory (memory), read them from their files every '
                      'epoch (none), or memory when a split, as stats.json '
                      'sizes it, fits --cache_memory_share of the available '
                      f'memory and {_CACHE_MAX} (auto).')
  parser.add_argument('--cache_memory_share',
                      type=cli_flags.number(0, 1, low_open=True),
                      default=data_lib.CACHE_MEMORY_SHARE,
                      help='With --cache=auto: the share of the available '
                      'memory a split may take cached (never over '
                      f'{_CACHE_MAX}); it also bounds the shuffle buffer.')


def folds(text: str):
  """--folds: auto (None), 0, or a number of folds from 2."""
  if text == 'auto':
    return None
  value = cli_flags.integer(0, MAX_FOLDS)(text)
  if value == 1:
    raise argparse.ArgumentTypeError(
        f'must be auto, 0 or 2 to {MAX_FOLDS}, not 1: one fold holds out '
        'every example at once')
  return value


folds.values = f'auto, 0, or integer in [2, {MAX_FOLDS}]'


def add_branch_args(parser) -> None:
  """The flags of the model kind and the n-gram branch's training."""
  parser.add_argument('--model', choices=model_lib.MODELS,
                      default=model_lib.ModelParams().model,
                      help='transformer; nbsvm (binarized n-grams scaled '
                      'by Naive Bayes ratios); hybrid (both, each trained '
                      'alone, their logits weighted on held-out predictions: '
                      'the cross-validation folds\' or the validation '
                      'split\'s, as --folds chooses).')
  parser.add_argument('--transformer_min_examples', type=cli_flags.integer(0),
                      default=settings_lib.TRANSFORMER_MIN_EXAMPLES,
                      help='--model=hybrid on a train split of fewer '
                      'examples is fitted as its n-gram branch alone (nbsvm), '
                      'as the report says; 0: never.')
  parser.add_argument('--ngram_fit', choices=('auto',
                                              *settings_lib.NGRAM_FITS),
                      default='auto',
                      help='How the n-gram branch is fitted: convex (a '
                      'full-batch solver over the train split\'s n-grams in '
                      'memory, its penalty chosen with the minimum count), '
                      'epochs (Keras mini-batch epochs, streamed: '
                      '--ngram_epochs, --ngram_learning_rate), or auto: '
                      'convex where the train split has at most '
                      f'{settings_lib.CONVEX_MAX_EXAMPLES:,} examples.')
  parser.add_argument('--ngram_epochs', type=cli_flags.integer(1), default=None,
                      help='Most epochs of the n-gram branch (nbsvm, '
                      'hybrid); default: as --epochs.')
  add_learning_rate(parser, '--ngram_learning_rate', 'the n-gram branch')


def add_learning_rate(parser, flag: str, trained: str) -> None:
  """A learning rate flag: any the optimizer's float32 variables hold."""
  parser.add_argument(flag,
                      type=cli_flags.number(0, FLOAT32_MAX, low_open=True),
                      default=1e-3,
                      help=f'Adam\'s learning rate for {trained}.')


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
