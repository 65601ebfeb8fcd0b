"""Cross-validation as the trainer runs it: the train split dealt into
--folds folds by its groups, and every branch (the n-gram branch at each
minimum count to try) fitted in each fold and read on the fold it did not
see; ``trainer.selection`` scores and chooses."""
import dataclasses
import logging
import posixpath
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

import cli
from schemas import raw
from schemas import transformed
from trainer import branch_fit
from trainer import data as data_lib
from trainer import inputs as inputs_lib
from trainer import model as model_lib
from trainer import ngram_fit
from trainer import ngram_solver
from trainer import ngrams
from trainer import runs
from trainer import selection
from trainer import settings as settings_lib

# The folds' files, under the run's scratch and log folders.
CROSS_VALIDATION_DIR = 'cross_validation'


@dataclasses.dataclass
class Folds:
  """Cross-validation's plan: the fold and label of each train record (in
  ``data.in_file_order``'s order), and the splits the final fit reads
  (train, then validation with --refit). The records themselves stay in
  their files: a fold reads them from there (``data.of_rows``)."""
  fold_of: np.ndarray  # int8 [train records]
  labels: np.ndarray   # int64 [train records]
  groups: int
  splits: Tuple[str, ...]
  cached: bool         # whether a fold keeps what it reads in memory

  def rows(self, fold: int, held_out: bool) -> np.ndarray:
    """The train rows ``fold`` holds out, or those it trains on."""
    return np.flatnonzero((self.fold_of == fold) == held_out)


class Undealable(ValueError):
  """The train split cannot be dealt into the folds asked for."""


def plan(settings: settings_lib.Settings,
         data: data_lib.PreprocessedData) -> Folds:
  """Deals the train split into --folds folds by its groups, in one pass
  over its files that keeps a few bytes a record (its group's digest, its
  label, its fold); a JobError, before anything is written, where that
  cannot be done."""
  try:
    return _deal(settings, data)
  except Undealable as error:
    raise cli.JobError(f'--folds={settings.folds}: {error}') from error


def plan_or_validation(settings: settings_lib.Settings,
                       data: data_lib.PreprocessedData, auto: bool
                       ) -> Tuple[settings_lib.Settings, Optional[Folds]]:
  """The settings a run goes on with and its folds (``plan``; None without
  folds). Where --folds=auto (``auto``, --refit not given either) chose
  folds that the train split's groups cannot fill, the validation split
  chooses instead, as it does where auto chooses no folds: the user asked
  for no folds, so none that cannot be dealt is an error of theirs."""
  if not settings.folds:
    return settings, None
  if not auto:
    return settings, plan(settings, data)
  try:
    return settings, _deal(settings, data)
  except Undealable as error:
    logging.info('--folds: 0, not the %d of auto (%s): the validation split '
                 'chooses', settings.folds, error)
    return dataclasses.replace(settings, folds=0, refit=False), None


def _deal(settings: settings_lib.Settings,
          data: data_lib.PreprocessedData) -> Folds:
  """``plan``'s folds; Undealable where the groups are too few, or a fold
  leaves less than a batch to a branch Keras fits."""
  digests, labels = [], []
  for batch in data_lib.in_file_order(
      data, (raw.TRAIN,), (transformed.ID, transformed.TOKEN_IDS,
                           transformed.LABEL_ID)):
    try:
      keys = selection.fold_keys(batch[transformed.ID].numpy(),
                                 batch[transformed.TOKEN_IDS].numpy(),
                                 data.params)
    except ValueError as error:
      raise Undealable(f'{error}; use --folds=0') from error
    digests.append(selection.fold_digests(keys, settings.seed))
    labels.append(batch[transformed.LABEL_ID].numpy())
  digests = np.concatenate(digests)
  try:
    fold_of = selection.assign_folds(digests, settings.folds)
  except ValueError as error:
    raise Undealable(f'{error} in the train split of {data.data_dir}; use '
                     'fewer') from error
  if settings.branches_fitted_by_epochs:
    try:
      selection.check_training_parts(fold_of, settings.folds,
                                     settings.batch_size)
    except ValueError as error:
      raise Undealable(f'{error}; use fewer folds or a smaller '
                       '--batch_size') from error
  splits = (raw.TRAIN, *([raw.VALIDATION] if settings.refit else []))
  return Folds(fold_of, np.concatenate(labels), len(np.unique(digests)),
               splits, data_lib.cache_in_memory(
                   settings.cache, data, splits,
                   inputs_lib.cache_budget(settings)))


def cross_validate(settings: settings_lib.Settings,
                   params: model_lib.ModelParams,
                   data: data_lib.PreprocessedData, planned: Folds,
                   table: Optional[ngram_fit.FoldTable], run: runs.Run
                   ) -> selection.Choice:
  """Grouped k-fold cross-validation of every branch over the train split
  as ``planned``: the n-gram branch at each minimum count to try (largest
  first, until one is no better), each branch for its epochs, a fold
  stopped after --patience epochs without a better held-out figure.
  ``table``: ``ngram_fit.fold_table``'s."""
  labels, monitor = planned.labels, settings.monitor
  better = selection.better(monitor)
  candidates = {}
  for branch in params.branches:
    is_ngram = branch == model_lib.NGRAM_LOGITS
    if is_ngram and settings.ngram_fit == 'convex':
      candidates[branch] = convex_candidates(settings, params, data, planned,
                                             table)
      continue
    tried = []
    for min_count in (ngram_fit.min_counts(params) if is_ngram else (None,)):
      candidate = held_out_candidate(settings, params, data, planned, table,
                                     run, branch, min_count)
      if candidate is None:
        continue
      selection.log_candidate(candidate, labels, monitor)
      score = candidate.summary(labels, monitor)['mean']
      if tried and better(score, tried[-1][1]) == tried[-1][1]:
        tried.append((candidate, score))
        break  # no better than a larger count: lower ones memorise more
      tried.append((candidate, score))
    if not tried:
      raise ngram_fit.no_ngram(ngram_fit.min_counts(params), int(min(
          np.sum(planned.fold_of != fold) for fold in range(settings.folds))))
    candidates[branch] = [candidate for candidate, _ in tried]
  return selection.choose(candidates, params.branches, labels, monitor,
                          settings.folds, planned.groups)


def held_out_candidate(settings: settings_lib.Settings,
                       params: model_lib.ModelParams,
                       data: data_lib.PreprocessedData, planned: Folds,
                       table: Optional[ngram_fit.FoldTable], run: runs.Run,
                       branch: str, min_count: Optional[int]
                       ) -> Optional[selection.Candidate]:
  """``branch`` (the n-gram branch at ``min_count``) fitted in each fold
  and read after every epoch on the fold it did not see; None where a
  fold has no n-gram in ``min_count`` of its training documents.

  Each fold's readers (and cache) and, from the statistics, its held-out
  n-gram counts are made again for each count tried: kept across the
  counts, every fold's would be held at once, the folds' times what one
  fold's cache and counts may take."""
  is_ngram = branch == model_lib.NGRAM_LOGITS
  candidate = selection.Candidate(
      branch, {'ngram_min_count': min_count} if is_ngram else {})
  for fold in range(settings.folds):
    fitted_rows = planned.rows(fold, held_out=False)
    held_out_rows = planned.rows(fold, held_out=True)
    vocabulary = None
    if is_ngram:
      try:
        vocabulary = ngram_fit.fold_vocabulary(
            table, data, params.ngram_order, fitted_rows, held_out_rows,
            min_count)
      except ValueError:
        return None  # a count above every n-gram's in this fold
    model = model_lib.build_model(
        data.vocab_size, data.max_len, len(data.label_names),
        dataclasses.replace(params,
                            model='nbsvm' if is_ngram else 'transformer'),
        vocabulary)
    held_out = selection.HeldOutFold(
        model, branch, data_lib.of_rows(
            data, (raw.TRAIN,), held_out_rows, selection.SCORING_BATCH,
            cache=planned.cached, bucket_width=settings.bucket_width,
            numbered=True),
        held_out_rows, planned.labels[held_out_rows], settings.monitor,
        settings.patience)
    name = (f'{branch}-min_count_{min_count}-fold_{fold + 1}' if is_ngram
            else f'{branch}-fold_{fold + 1}')
    try:
      branch_fit.fit_branch(
          settings, model, branch,
          inputs_lib.of_rows(settings, data, (raw.TRAIN,), fitted_rows,
                             planned.cached),
          tuple(posixpath.join(folder, CROSS_VALIDATION_DIR, name)
                for folder in (run.scratch, run.logs)), held_out=held_out,
          label=f'cross-validation: {name} of {settings.folds}')
    except selection.ShortRead as error:
      data.check_unchanged()  # the likely cause, named where it is so
      raise cli.JobError(f'{data.data_dir}: {error} in {name}, yet the folder '
                         'is unchanged since the trainer began; nothing was '
                         'published') from error
    candidate.add_fold(held_out_rows, held_out.logits)
  return candidate


def _penalty_path(min_count: int, paths, labels: np.ndarray, monitor: str
                  ) -> Iterator[Tuple[selection.Candidate, Dict]]:
  """A candidate each penalty, strongest first, with its summary: the
  folds' solutions at that penalty, read on the documents each did not
  see. ``paths``: each fold's held-out rows and solver path."""
  for strength in ngram_solver.STRENGTHS:
    candidate = selection.Candidate(
        model_lib.NGRAM_LOGITS, {'ngram_min_count': min_count,
                                 'ngram_penalty': strength})
    for held_out_rows, path in paths:
      _, logits = next(path)
      candidate.add_fold(held_out_rows, [logits.astype(np.float32)])
    yield candidate, candidate.summary(labels, monitor)


def convex_candidates(settings: settings_lib.Settings,
                      params: model_lib.ModelParams,
                      data: data_lib.PreprocessedData, planned: Folds,
                      table: ngrams.DocumentNgrams
                      ) -> List[selection.Candidate]:
  """The n-gram branch fitted by the convex solver in each fold at every
  minimum count and, strongest first, each penalty until
  ``ngram_solver.PATIENCE`` are no better: a candidate each pair, read on
  the fold it did not see; a JobError where no count leaves an n-gram in
  every fold."""
  labels, monitor = planned.labels, settings.monitor
  found = []
  for min_count in ngram_fit.min_counts(params):
    paths = []  # each fold's held-out rows and solutions, in step
    for fold in range(settings.folds):
      fitted_rows = planned.rows(fold, held_out=False)
      held_out_rows = planned.rows(fold, held_out=True)
      try:
        vocabulary = table.vocabulary(len(data.label_names), fitted_rows,
                                      min_count)
      except ValueError:
        break  # a count above every n-gram's in this fold
      paths.append((held_out_rows, ngram_solver.held_out_path(
          table, fitted_rows, held_out_rows, vocabulary)))
    if len(paths) < settings.folds:
      continue
    tried = []
    for candidate, summary in selection.until_no_better(
        _penalty_path(min_count, paths, labels, monitor),
        lambda pair: pair[1]['mean'], monitor, ngram_solver.PATIENCE):
      found.append(candidate)
      tried.append(summary)
    logging.info('cross-validation: %s in at least %d documents, fitted by '
                 'the convex solver: held-out %s by penalty %s',
                 model_lib.NGRAM_LOGITS, min_count, monitor,
                 ', '.join(f'{summary["setting"]["ngram_penalty"]:g}: '
                           f'{summary["mean"]:.4f} ± {summary["std"]:.4f}'
                           for summary in tried))
  if not found:
    raise ngram_fit.no_ngram(ngram_fit.min_counts(params), int(min(
        np.sum(planned.fold_of != fold) for fold in range(settings.folds))))
  return found
