"""Grouped k-fold cross-validation: the trainer's choices made on every
training example, not on the validation split alone.

A validation split of a few thousand examples reads an accuracy within
about one standard error of 0.6 points (2,300 IMDB reviews), more than the
choices it is asked to make are worth. Cross-validation trains the model k
times, each time on all of the train split but one fold, and reads every
training example once, held out. The folds follow the groups the
preprocessing job split by (``--group_pattern`` over the record ids): the
reviews of one movie, or the copies of one text, never sit on both sides of
a fold, as they never sit on both sides of the split.

What it chooses: the n-gram branch's minimum document count (the same
search as on validation, largest count first) and each branch's epochs
(the epoch whose mean held-out accuracy over the folds is best). The
held-out logits at the chosen epochs, one set for every training example,
are what a model refitted on train + validation is calibrated on: data it
never saw.
"""
import dataclasses
import hashlib
import logging
import re
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from schemas import raw
from trainer import model as model_lib

# What the report names the choices' evidence.
CROSS_VALIDATION = 'cross-validation'
# --folds=auto: this many folds where the train split has at most
# AUTO_MAX_EXAMPLES examples and one training reads at most AUTO_MAX_TOKENS
# tokens (its most epochs times the examples times their median length, as
# stats.json has it). Cross-validation trains k times a candidate and
# scores every held-out fold after every epoch, and a small corpus trains
# for many epochs: beyond either bound it costs more than the noise of the
# validation split it replaces is worth by default (SMS: 3,508 examples, 0.7
# million tokens, 3 times the training time; IMDB's first sentences: 22,700
# examples, 6 times; 2,000 IMDB reviews: 7.5 million tokens, 4 times; IMDB,
# SpamAssassin; configs/imdb_best asks for it).
FOLDS = 5
AUTO_MAX_EXAMPLES = 10_000
AUTO_MAX_TOKENS = 2_000_000
# Held-out documents scored at once, in length buckets (``data.of_rows``).
SCORING_BATCH = 256


def auto_folds(train_examples: int, median_length: int, epochs: int,
               batch_size: int) -> int:
  """--folds=auto for a train split of this many examples whose median
  length is ``median_length`` tokens, trained for at most ``epochs`` in
  batches of ``batch_size`` (0: fitted by the convex solver alone, without
  batches): 0 also where a fold's training part would hold less than a
  batch."""
  cheap = (train_examples <= AUTO_MAX_EXAMPLES and
           epochs * train_examples * median_length <= AUTO_MAX_TOKENS)
  trainable = (not epochs or
               train_examples - -(-train_examples // FOLDS) >= batch_size)
  return FOLDS if cheap and trainable else 0


def unkept_group_field(params: Dict) -> Optional[str]:
  """The ``--group_field`` an output was split by: its records do not keep
  the field, so no fold can follow its groups (None when it was not)."""
  return (params.get('read_config') or {}).get('group_field') or None


def fold_keys(ids: np.ndarray, token_ids: np.ndarray,
              params: Dict) -> List[bytes]:
  """What keeps records together, for the records of ``ids`` (bytes) and
  ``token_ids``: the group the preprocessing job took from each id with its
  ``--group_pattern``, else the text itself (its token ids), as the split's
  hash of the text does. ValueError for an output split by
  ``--group_field`` (``unkept_group_field``): by text, its folds would deal
  one group's records to both sides."""
  field = unkept_group_field(params)
  if field:
    raise ValueError(f'its splits follow --group_field={field}, which its '
                     'records do not keep, so folds could not keep a group '
                     'on one side')
  pattern = params.get('group_pattern')
  pattern = re.compile(pattern) if pattern else None
  keys = []
  for record_id, record_token_ids in zip(ids, token_ids):
    group = pattern and raw.group_from(
        record_id.decode('utf-8', 'replace'), pattern)
    keys.append(b'group:' + group.encode() if group else
                b'text:' + np.trim_zeros(record_token_ids, 'b').tobytes())
  return keys


def fold_digests(keys: Iterable[bytes], seed: int) -> np.ndarray:
  """Each key's seeded hash, as uint64: eight bytes a record are what the
  folds are dealt from, however large the train split."""
  return np.array([int.from_bytes(hashlib.sha256(
      seed.to_bytes(8, 'big') + key).digest()[:8], 'big') for key in keys],
                  np.uint64)


def assign_folds(digests: np.ndarray, folds: int) -> np.ndarray:
  """Each record's fold, 0..folds-1, from its key's ``fold_digests``: the
  distinct keys in the order of their hash, dealt to the folds in turn, so
  that every fold holds as many groups (give or take one) and a key's
  records share one fold."""
  distinct, rank = np.unique(digests, return_inverse=True)
  if len(distinct) < folds:
    raise ValueError(f'{folds} folds need as many groups; there '
                     f'{"is" if len(distinct) == 1 else "are"} only '
                     f'{len(distinct)}')
  return (rank.reshape(-1) % folds).astype(np.int8)


def check_training_parts(fold_of: np.ndarray, folds: int,
                         batch_size: int) -> None:
  """ValueError when a fold leaves fewer than ``batch_size`` examples to
  train on: training batches are all full, so not one step would run, and
  its held-out figures would be those of an untrained model."""
  for fold in range(folds):
    training = int(np.sum(fold_of != fold))
    if training < batch_size:
      raise ValueError(
          f'fold {fold + 1} leaves {training} examples to train on (its '
          f'groups hold the other {int(np.sum(fold_of == fold))}), fewer '
          f'than a batch of {batch_size}, so not one training step would run')


def held_out_logits(model: keras.Model, branch: str,
                    batches: tf.data.Dataset, rows: np.ndarray) -> np.ndarray:
  """``branch``'s logits [rows, classes] for the records at ``rows``
  (sorted), in their order; ``batches``: theirs, as ``data.of_rows`` reads
  them numbered, in any order."""
  probe = keras.Model(model.inputs, model.get_layer(branch).output)
  logits = np.zeros((len(rows), probe.output_shape[-1]), np.float32)
  seen = np.zeros(len(rows), bool)
  for token_ids, (_, batch_rows) in batches:
    at = np.searchsorted(rows, batch_rows.numpy())
    logits[at] = np.asarray(probe([token_ids], training=False))
    seen[at] = True
  if not seen.all():
    raise ShortRead(f'{int(seen.sum())} of the {len(rows)} held-out records '
                    'were read')
  return logits


class ShortRead(ValueError):
  """A held-out fold's files gave fewer records than the fold holds: the
  caller, which knows the folder, finds out why."""


class HeldOutFold(keras.callbacks.Callback):
  """After every epoch, the branch's logits on the held-out fold (the
  records at ``rows``, labelled ``labels``, read as ``batches``), and its
  accuracy and loss there as ``val_accuracy`` and ``val_loss`` (for the
  callbacks after it: the history, the logs). Stops the fold after
  ``patience`` epochs without a better ``monitor``: its later epochs count
  as its last (``Candidate.scores``)."""

  def __init__(self, model: keras.Model, branch: str,
               batches: tf.data.Dataset, rows: np.ndarray,
               labels: np.ndarray, monitor: str, patience: int):
    super().__init__()
    self.whole, self.branch, self.batches = model, branch, batches
    self.rows, self.labels = rows, labels
    self.monitor, self.patience = monitor, patience
    self.logits = []  # one [examples, classes] a epoch
    self.scores = []

  def on_epoch_end(self, epoch, logs=None):
    logits = held_out_logits(self.whole, self.branch, self.batches,
                             self.rows)
    self.logits.append(logits)
    figures = {name: measure(logits, self.labels)
               for name, measure in MEASURES.items()}
    if logs is not None:
      logs.update(figures)
    self.scores.append(figures[self.monitor])
    if len(self.scores) - 1 - best_index(self.monitor, self.scores) >= max(
        self.patience, 1):
      self.model.stop_training = True


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
  return float(np.mean(logits.argmax(axis=1) == labels))


def loss(logits: np.ndarray, labels: np.ndarray) -> float:
  shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
  log_sum = np.log(np.exp(shifted).sum(axis=1))
  return float(np.mean(log_sum - shifted[np.arange(len(labels)), labels]))


# What each --monitor measures on held-out logits, and whether more of it is
# better: every choice on held-out figures reads them here.
MEASURES = {'val_accuracy': accuracy, 'val_loss': loss}
_HIGHER_IS_BETTER = {'val_accuracy': True, 'val_loss': False}


def better(monitor: str) -> Callable:
  """``max`` or ``min``: the better of figures ``monitor`` names (the first
  of equals)."""
  return max if _HIGHER_IS_BETTER[monitor] else min


def best_index(monitor: str, figures: Sequence[float]) -> int:
  """Where the best of ``figures`` is (the first of equals)."""
  pick = np.argmax if _HIGHER_IS_BETTER[monitor] else np.argmin
  return int(pick(figures))


def until_no_better(items: Iterable, figure_of: Callable, monitor: str,
                    patience: int) -> Iterator:
  """``items`` in turn, stopping after ``patience`` in a row whose figure is
  no better than the best before them (a penalty path, strongest first)."""
  best, since_best = None, 0
  for item in items:
    yield item
    figure = figure_of(item)
    if best is None or better(monitor)(figure, best) != best:
      best, since_best = figure, 0
    else:
      since_best += 1
      if since_best >= patience:
        return


@dataclasses.dataclass
class Candidate:
  """One setting of a branch, cross-validated: each fold's held-out logits
  after every epoch."""
  branch: str
  setting: Dict                 # e.g. {'ngram_min_count': 16}
  logits: List[List[np.ndarray]] = dataclasses.field(default_factory=list)
  rows: List[np.ndarray] = dataclasses.field(default_factory=list)

  def add_fold(self, rows: np.ndarray, logits: List[np.ndarray]) -> None:
    self.rows.append(rows)
    self.logits.append(logits)

  def weights(self) -> np.ndarray:
    """Each fold's share of the examples: a mean over the folds weighted by
    it is the figure over every held-out example, which a few small folds
    (of uneven groups) cannot sway."""
    sizes = np.array([len(rows) for rows in self.rows], np.float64)
    return sizes / sizes.sum()

  def scores(self, labels: np.ndarray, monitor: str) -> np.ndarray:
    """[folds, epochs]: the held-out ``monitor`` of each fold after each
    epoch (a fold that stopped early repeats its last)."""
    measure = MEASURES[monitor]
    epochs = max(map(len, self.logits))
    return np.array([[measure(fold[min(epoch, len(fold) - 1)], labels[rows])
                      for epoch in range(epochs)]
                     for rows, fold in zip(self.rows, self.logits)])

  def best_epoch(self, labels: np.ndarray, monitor: str) -> int:
    """The epoch (from 1) of the best mean over the folds."""
    means = self.weights() @ self.scores(labels, monitor)
    return best_index(monitor, means) + 1

  def summary(self, labels: np.ndarray, monitor: str) -> Dict:
    """Mean (over every held-out example: weighted by the folds' sizes) and
    spread (the SD of the folds' figures), at the best epoch and by epoch."""
    scores = self.scores(labels, monitor)
    means = self.weights() @ scores
    epoch = self.best_epoch(labels, monitor)
    return {'setting': self.setting, 'epochs': epoch,
            'mean': round(float(means[epoch - 1]), 4),
            'std': round(float(scores[:, epoch - 1].std(ddof=1))
                         if len(scores) > 1 else 0.0, 4),
            'by_epoch': [round(float(m), 4) for m in means]}

  def out_of_fold(self, labels: np.ndarray, monitor: str,
                  size: int) -> np.ndarray:
    """Every example's held-out logits at the best epoch."""
    epoch = self.best_epoch(labels, monitor) - 1
    logits = np.zeros((size, self.logits[0][0].shape[1]), np.float32)
    for rows, fold in zip(self.rows, self.logits):
      logits[rows] = fold[min(epoch, len(fold) - 1)]
    return logits


@dataclasses.dataclass
class Choice:
  """What cross-validation chose, and the held-out logits at the choice."""
  folds: int
  epochs: Dict[str, int]              # by branch
  ngram_min_count: Optional[int]
  ngram_penalty: Optional[float]      # the convex solver's, where it fitted
  settings: Dict[str, Dict]           # by branch: the chosen candidate's
  tried: Dict[str, List[Dict]]        # by branch: each candidate's summary
  logits: np.ndarray                  # [examples, branches, classes]
  labels: np.ndarray
  groups: int
  monitor: str                        # what chose: --monitor

  def describe(self) -> Dict:
    return {'folds': self.folds, 'groups': self.groups,
            'monitor': self.monitor,
            'examples': int(len(self.labels)), 'epochs': self.epochs,
            'ngram_min_count': self.ngram_min_count,
            'settings': self.settings, 'tried': self.tried}


def choose(candidates: Dict[str, List[Candidate]], branches: List[str],
           labels: np.ndarray, monitor: str, folds: int,
           groups: int) -> Choice:
  """The best candidate of each branch (``candidates`` by branch, in the
  order tried), and the held-out logits of the choice in ``branches``'
  order."""
  chosen = {}
  for branch, tried in candidates.items():
    chosen[branch] = better(monitor)(
        tried, key=lambda c: c.summary(labels, monitor)['mean'])
  logits = np.stack([chosen[b].out_of_fold(labels, monitor, len(labels))
                     for b in branches], axis=1)
  ngram = chosen.get(model_lib.NGRAM_LOGITS)
  return Choice(
      folds=folds,
      epochs={b: c.best_epoch(labels, monitor) for b, c in chosen.items()},
      ngram_min_count=ngram and ngram.setting['ngram_min_count'],
      ngram_penalty=ngram and ngram.setting.get('ngram_penalty'),
      settings={b: c.setting for b, c in chosen.items()},
      tried={b: [c.summary(labels, monitor) for c in tried]
             for b, tried in candidates.items()},
      logits=logits, labels=labels, groups=groups, monitor=monitor)


def log_candidate(candidate: Candidate, labels: np.ndarray,
                  monitor: str) -> None:
  summary = candidate.summary(labels, monitor)
  logging.info('cross-validation: %s %s: held-out %s %.4f ± %.4f after %d '
               'epochs (by epoch: %s)', candidate.branch, candidate.setting,
               monitor, summary['mean'], summary['std'], summary['epochs'],
               summary['by_epoch'])
