"""The n-gram branch fitted alone at each minimum document count to try,
largest first, until one is no better on validation than the best before
it; the best kept."""
import dataclasses
import logging
import posixpath
from typing import Optional

import cli
from trainer import branch_fit
from trainer import data as data_lib
from trainer import inputs as inputs_lib
from trainer import model as model_lib
from trainer import ngrams
from trainer import settings as settings_lib

# Without --ngram_min_count, the n-gram branch is trained with each of these
# minimum document counts in turn, largest first, until one is no better on
# validation than the best before it: too low a count lets the branch
# memorise its training documents by their rare n-grams, too high a one
# drops useful n-grams, and where between depends on the corpus.
MIN_COUNTS = (32, 16, 8, 4, 2)


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


def fit_ngram_branch(settings: settings_lib.Settings,
                     params: model_lib.ModelParams,
                     data: data_lib.PreprocessedData,
                     fitting: inputs_lib.Inputs, base: tuple,
                     every: Optional[ngrams.DocumentNgrams],
                     epochs: Optional[int] = None) -> NgramBranch:
  """Trains the n-gram branch alone with each minimum count to try, for at
  most ``epochs`` (else --ngram_epochs), its files in ``base`` folders (a
  sub-folder a count when there are several); keeps the best on
  validation. ``every``: the n-grams of ``fitting``'s training documents
  when already found."""
  every = every or ngrams.DocumentNgrams.fit(fitting.train_once,
                                             params.ngram_order)
  counts = min_counts(params)
  monitor = settings.monitor
  better = max if monitor == 'val_accuracy' else min
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
    history = branch_fit.fit_branch(settings, trial, model_lib.NGRAM_LOGITS,
                                    fitting, folders, epochs)
    scores[min_count] = (better(history[monitor])
                         if monitor in history else None)
    logging.info('n-grams in at least %d training documents: %d, validation '
                 '%s %s', min_count, len(vocabulary.keys), monitor,
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
