"""The n-gram branch fitted alone, as --ngram_fit says: by Keras epochs at
each minimum document count to try, largest first, until one is no better
on validation than the best before it; or by the convex solver
(``trainer.ngram_solver``) at every count and penalty, all of them cheap.
The best on validation kept."""
import dataclasses
import itertools
import logging
import posixpath
from typing import Optional, Union

from google.protobuf import message
import numpy as np
import tensorflow as tf

import cli
from schemas import raw
from schemas import transformed
from serving import ngrams as serving_ngrams
from trainer import branch_fit
from trainer import data as data_lib
from trainer import inputs as inputs_lib
from trainer import model as model_lib
from trainer import ngram_solver
from trainer import ngrams
from trainer import selection
from trainer import settings as settings_lib

# Without --ngram_min_count, the n-gram branch is trained with each of these
# minimum document counts in turn, largest first, until one is no better on
# validation than the best before it: too low a count lets the branch
# memorise its training documents by their rare n-grams, too high a one
# drops useful n-grams, and where between depends on the corpus.
MIN_COUNTS = (32, 16, 8, 4, 2)
# What cross-validation's folds take their n-gram counts from (``fold_table``):
# each document's n-grams, or the statistics' counts.
FoldTable = Union[ngrams.DocumentNgrams, ngrams.Vocabulary]


@dataclasses.dataclass
class NgramBranch:
  """The n-gram branch as trained: its layer's weights, its history, and
  the minimum count chosen with the validation figure that chose it."""
  vocabulary: ngrams.Vocabulary
  weights: list
  history: dict
  min_count: int
  scores: dict  # min count tried: best validation --monitor
  penalty: Optional[float] = None  # the solver's, where it fitted it


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
  when already found (else ``counted_ngrams``)."""
  counted = every or counted_ngrams(params, data, fitting.train_once)
  counts = min_counts(params)
  monitor = settings.monitor
  better = selection.better(monitor)
  chosen, best = None, None
  scores = {}
  for min_count in counts:
    try:
      vocabulary = counted.vocabulary(len(data.label_names),
                                      min_count=min_count)
    except ValueError:
      continue  # a count above every n-gram's of a small corpus
    trial = model_lib.build_model(
        data.vocab_size, data.max_len, len(data.label_names),
        dataclasses.replace(params, model='nbsvm'), vocabulary)
    folders = base if len(counts) == 1 else tuple(
        posixpath.join(folder, f'min_count_{min_count}') for folder in base)
    history = branch_fit.fit_branch(
        settings, trial, model_lib.NGRAM_LOGITS, fitting, folders, epochs,
        label=f'{model_lib.NGRAM_LOGITS} (in at least {min_count} documents)')
    scores[min_count] = (better(history[monitor])
                         if monitor in history else None)
    logging.info('n-grams in at least %d training documents: %d%s',
                 min_count, len(vocabulary.keys),
                 '' if scores[min_count] is None else
                 f', best validation {monitor} {scores[min_count]:.4f}')
    if chosen and better(scores[min_count], best) == best:
      break  # no better than a larger count: lower ones memorise more
    best = scores[min_count]
    chosen = NgramBranch(vocabulary, trial.get_layer(
        model_lib.NGRAM_LOGITS).get_weights(), history, min_count, scores)
  if chosen is None:
    raise no_ngram(counts)
  return chosen


def counted_ngrams(params: model_lib.ModelParams,
                   data: data_lib.PreprocessedData, documents):
  """What the vocabulary of each minimum count is taken from (its
  ``vocabulary(num_classes, min_count=...)``): the n-gram statistics the
  preprocessing job counted on its runner over the train split, read, not
  counted again; else ``documents`` (batches of token ids and label ids:
  the train split's) counted here, where they cannot serve (an output
  preprocessed before the job counted them, longer n-grams than it counts,
  or a count below its least). A JobError where they are there but not
  whole."""
  section = data.stats.get(transformed.NGRAMS_STATS)
  lowest = min(min_counts(params))
  if (section and params.ngram_order <= section['max_order'] and
      lowest >= section['min_documents']):
    try:
      statistics = serving_ngrams.read_statistics(
          data.data_dir, params.ngram_order, len(data.label_names))
    except (ValueError, tf.errors.OpError, message.DecodeError) as error:
      raise cli.JobError(f'{data.data_dir}: its n-gram statistics cannot be '
                         f'read ({error}): preprocess it again') from error
    logging.info('n-gram counts: the preprocessing job\'s, %d n-grams of up '
                 'to %d tokens in at least %d train documents',
                 len(statistics.keys), params.ngram_order,
                 section['min_documents'])
    return ngrams.Vocabulary(statistics.keys, statistics.counts,
                             np.zeros(statistics.counts.shape, np.float32))
  logging.info('n-gram counts: counted here, over the training documents '
               '(%s)',
               'its output holds no n-gram statistics' if not section else
               f'--ngram_order={params.ngram_order} or a minimum count of '
               f'{lowest}, beyond what its statistics hold')
  return ngrams.DocumentNgrams.fit(documents, params.ngram_order)


def fold_table(settings: settings_lib.Settings,
               data: data_lib.PreprocessedData, splits) -> FoldTable:
  """What cross-validation's folds, and the fit after them, take their
  n-gram counts from: the n-grams of each document of ``splits`` (train,
  then validation with --refit) where the convex solver fits on them or
  the statistics cannot serve (``counted_ngrams``), else the statistics."""
  documents = data_lib.of_rows(data, splits, None, 1024)
  if settings.ngram_fit == 'convex':
    return ngrams.DocumentNgrams.fit(documents, settings.params.ngram_order)
  return counted_ngrams(settings.params, data, documents)


def fold_vocabulary(table: FoldTable, data: data_lib.PreprocessedData, order: int,
                    fitted_rows: np.ndarray, held_out_rows: np.ndarray,
                    min_count: int) -> ngrams.Vocabulary:
  """The vocabulary of a fold's training part (the train rows
  ``fitted_rows``) at ``min_count``, from ``fold_table``'s ``table``:
  counted over its documents' n-grams, or the statistics less the
  documents the fold holds out (``held_out_rows``, read from the files,
  counted among the statistics' n-grams: one that the statistics leave out
  is in fewer training documents than any count tried). ValueError where
  no n-gram is in ``min_count`` of them."""
  classes = len(data.label_names)
  if isinstance(table, ngrams.DocumentNgrams):
    return table.vocabulary(classes, fitted_rows, min_count)
  held_out = ngrams.counted_among(
      table.keys, data_lib.of_rows(data, (raw.TRAIN,), held_out_rows, 1024),
      order, classes)
  return ngrams.Vocabulary(table.keys, table.counts - held_out,
                           table.ratios).vocabulary(classes,
                                                    min_count=min_count)


def with_validation(table: FoldTable, data: data_lib.PreprocessedData,
                    order: int) -> FoldTable:
  """``fold_table``'s ``table`` as a fit on train + validation takes its
  counts: the statistics (the train split's) with the validation split's
  documents counted among their n-grams; the documents' own n-grams hold
  both splits already."""
  if isinstance(table, ngrams.DocumentNgrams):
    return table
  return ngrams.Vocabulary(
      table.keys, table.counts + ngrams.counted_among(
          table.keys, data_lib.of_rows(data, (raw.VALIDATION,), None, 1024),
          order, len(data.label_names)), table.ratios)


def fit_convex(settings: settings_lib.Settings,
               params: model_lib.ModelParams,
               data: data_lib.PreprocessedData,
               fitting: inputs_lib.Inputs) -> NgramBranch:
  """The n-gram branch fitted by the convex solver on the train split at
  each minimum count and penalty to try, the best on the validation split
  kept (the first of equals: the largest count, the strongest penalty)."""
  train_batches = list(fitting.train_once)
  table = ngrams.DocumentNgrams.fit(
      itertools.chain(train_batches, fitting.validation), params.ngram_order)
  train_rows = np.arange(sum(len(labels) for _, labels in train_batches))
  validation_rows = np.arange(len(train_rows), len(table.labels))
  measure = selection.MEASURES[settings.monitor]
  better = selection.better(settings.monitor)
  labels = table.labels[validation_rows]
  chosen, best, scores = None, None, {}
  for min_count in min_counts(params):
    try:
      vocabulary = table.vocabulary(len(data.label_names), train_rows,
                                    min_count)
    except ValueError:
      continue  # a count above every n-gram's of a small corpus
    path = ((solution, measure(logits, labels)) for solution, logits in
            ngram_solver.held_out_path(table, train_rows, validation_rows,
                                       vocabulary))
    figures = []
    for solution, score in selection.until_no_better(
        path, lambda pair: pair[1], settings.monitor, ngram_solver.PATIENCE):
      if chosen is None or better(score, best) != best:
        chosen, best = (vocabulary, solution, min_count), score
      figures.append(score)
    scores[min_count] = better(figures)
    logging.info('n-grams in at least %d training documents: %d, best '
                 'validation %s %.4f', min_count, len(vocabulary.keys),
                 settings.monitor, scores[min_count])
  if chosen is None:
    raise no_ngram(min_counts(params))
  vocabulary, solution, min_count = chosen
  return convex_branch(data, params, vocabulary, solution, min_count, scores,
                       {settings.monitor: [best]})


def refit_convex(data: data_lib.PreprocessedData,
                 params: model_lib.ModelParams,
                 table: ngrams.DocumentNgrams, penalty: float
                 ) -> NgramBranch:
  """The n-gram branch fitted by the convex solver on every document of
  ``table`` at the count and penalty cross-validation chose."""
  vocabulary = table.vocabulary(len(data.label_names),
                                min_count=params.ngram_min_count)
  solution = ngram_solver.solve(
      ngram_solver.Design.of(table, np.arange(len(table.labels)), vocabulary),
      penalty)
  return convex_branch(data, params, vocabulary, solution,
                       params.ngram_min_count, {}, {})


def convex_branch(data: data_lib.PreprocessedData,
                  params: model_lib.ModelParams,
                  vocabulary: ngrams.Vocabulary,
                  solution: ngram_solver.Solution, min_count: int,
                  scores: dict, held_out: dict) -> NgramBranch:
  """The ``NgramBranch`` of a solver's ``solution`` over ``vocabulary``."""
  layer = model_lib.build_model(
      data.vocab_size, data.max_len, len(data.label_names),
      dataclasses.replace(params, model='nbsvm'),
      vocabulary).get_layer(model_lib.NGRAM_LOGITS)
  solution.set_layer_weights(layer)
  logging.info('n-gram branch: %d n-grams, penalty %g, fitted in %d solver '
               'iterations, training loss %.4f', len(vocabulary.keys),
               solution.strength, solution.iterations, solution.loss)
  return NgramBranch(vocabulary, layer.get_weights(),
                     {'loss': [solution.loss], **held_out}, min_count,
                     scores, solution.strength)


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
