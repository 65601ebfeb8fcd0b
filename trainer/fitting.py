"""The whole model fitted: cross-validation's choices first where --folds
asks, then the n-gram branch at its minimum count, each other branch, and
the calibration; with what was chosen, on what, and what each part took."""
import dataclasses
import logging
import posixpath
import time
from typing import Dict, Optional

import keras

from schemas import raw
from trainer import branch_fit
from trainer import calibration
from trainer import data as data_lib
from trainer import folds as folds_lib
from trainer import inputs as inputs_lib
from trainer import model as model_lib
from trainer import ngram_fit
from trainer import runs
from trainer import selection
from trainer import settings as settings_lib


@dataclasses.dataclass
class Trained:
  """The fitted model, and what the export's metadata and the run's
  summary say of its fitting."""
  model: keras.Model
  histories: Dict[str, dict]  # by branch
  seconds: float              # the whole fit's
  calibration: Dict           # calibration.calibrate's
  choices: Dict               # what was chosen and on what; each part's time

  @property
  def epochs_run(self) -> Dict[str, int]:
    return {branch: len(history['loss'])
            for branch, history in self.histories.items()}


@dataclasses.dataclass
class Start:
  """What the final fit starts from: its inputs, the model's fields (with
  the n-gram count cross-validation chose), and cross-validation's choice
  with the n-gram counts its folds took (None when validation chooses)."""
  inputs: inputs_lib.Inputs
  params: model_lib.ModelParams
  choice: Optional[selection.Choice] = None
  table: Optional[ngram_fit.FoldTable] = None

  def epochs(self, branch: str) -> Optional[int]:
    """``branch``'s most epochs as cross-validation chose them; None: its
    flag's."""
    return self.choice.epochs[branch] if self.choice else None


def fit(settings: settings_lib.Settings, data: data_lib.PreprocessedData,
        run: runs.Run, planned: Optional[folds_lib.Folds] = None) -> Trained:
  """Fits the model, its files in ``run``'s folders, cross-validated in the
  folds ``planned`` (``folds.plan``) where --folds asks."""
  keras.utils.set_random_seed(settings.seed)
  started = time.time()
  seconds = {}  # what each part of the training took
  if settings.folds:
    planned = planned or folds_lib.plan(settings, data)
    # The n-gram counts, found once: each fold's vocabulary is taken from
    # them, and the final one.
    table = (ngram_fit.fold_table(settings, data, planned.splits)
             if model_lib.NGRAM_LOGITS in settings.params.branches else None)
    choice = folds_lib.cross_validate(settings, settings.params, data,
                                      planned, table, run)
    seconds[selection.CROSS_VALIDATION] = time.time() - started
    start = after_cross_validation(settings, data, planned, choice, table)
  else:
    start = Start(inputs_lib.from_files(settings, data), settings.params)
  ngram_branch = None
  if model_lib.NGRAM_LOGITS in start.params.branches:
    fitted_from = time.time()
    ngram_branch = fit_ngram_branch(settings, data, run, start)
    seconds[model_lib.NGRAM_LOGITS] = time.time() - fitted_from
  model = model_lib.build_model(
      data.vocab_size, data.max_len, len(data.label_names), start.params,
      ngram_branch and ngram_branch.vocabulary)
  model.summary(print_fn=logging.debug)
  histories = fit_branches(settings, model, run, start, ngram_branch, seconds)
  fitted = calibrate(settings, model, start)
  return Trained(model, histories, time.time() - started, fitted,
                 choices(settings, start, ngram_branch, seconds))


def after_cross_validation(settings: settings_lib.Settings,
                           data: data_lib.PreprocessedData,
                           planned: folds_lib.Folds, choice: selection.Choice,
                           table: Optional[ngram_fit.FoldTable]) -> Start:
  """The final fit on the train split (with --refit, validation's records
  too), at the n-gram count cross-validation chose."""
  params = settings.params
  if choice.ngram_min_count:
    params = dataclasses.replace(params,
                                 ngram_min_count=choice.ngram_min_count)
  validation = None if settings.refit else inputs_lib.validation_batches(
      settings, data, inputs_lib.cache_budget(settings))
  if table is not None and settings.refit:
    table = ngram_fit.with_validation(table, data, params.ngram_order)
  return Start(inputs_lib.of_rows(settings, data, planned.splits, None,
                                  planned.cached, validation),
               params, choice, table)


def fit_ngram_branch(settings: settings_lib.Settings,
                     data: data_lib.PreprocessedData, run: runs.Run,
                     start: Start) -> ngram_fit.NgramBranch:
  # The hybrid's n-gram branch, and each count a search tries, write
  # beside, not over, the run's own files.
  params = start.params
  if settings.ngram_fit == 'convex':
    if start.choice:
      return ngram_fit.refit_convex(data, params, start.table,
                                    start.choice.ngram_penalty)
    return ngram_fit.fit_convex(settings, params, data, start.inputs)
  base = ((run.scratch, run.logs) if params.model == 'nbsvm' and
          params.ngram_min_count else
          tuple(posixpath.join(folder, model_lib.NGRAM_LOGITS)
                for folder in (run.scratch, run.logs)))
  return ngram_fit.fit_ngram_branch(settings, params, data, start.inputs,
                                    base, start.table,
                                    start.epochs(model_lib.NGRAM_LOGITS))


def fit_branches(settings: settings_lib.Settings, model: keras.Model,
                 run: runs.Run, start: Start,
                 ngram_branch: Optional[ngram_fit.NgramBranch],
                 seconds: Dict[str, float]) -> Dict[str, dict]:
  """Each branch of ``model`` fitted in turn (the n-gram branch's weights
  as ``ngram_branch`` fitted them); their histories by branch, and the
  seconds each took added to ``seconds``."""
  histories = {}
  for branch in start.params.branches:
    if branch == model_lib.NGRAM_LOGITS:
      model.get_layer(branch).set_weights(ngram_branch.weights)
      histories[branch] = ngram_branch.history
    else:
      fitted_from = time.time()
      histories[branch] = branch_fit.fit_branch(
          settings, model, branch, start.inputs, (run.scratch, run.logs),
          start.epochs(branch))
      seconds[branch] = time.time() - fitted_from
  return histories


def calibrate(settings: settings_lib.Settings, model: keras.Model,
              start: Start) -> Dict:
  """The temperature and branch weights: fitted on the folds' held-out
  predictions after --refit, else on the validation split."""
  if start.choice and settings.refit:
    return calibration.calibrate_logits(
        model, start.choice.logits, start.choice.labels,
        selection.CROSS_VALIDATION, weights_by_accuracy=True)
  return calibration.calibrate(model, start.inputs.validation)


def choices(settings: settings_lib.Settings, start: Start,
            ngram_branch: Optional[ngram_fit.NgramBranch],
            seconds: Dict[str, float]) -> Dict:
  """What was chosen and on what, for the export's metadata and the
  report."""
  choice = start.choice
  chosen = {'on': selection.CROSS_VALIDATION if choice else raw.VALIDATION,
            'refit': bool(choice and settings.refit),
            'seconds': {part: round(value, 1)
                        for part, value in seconds.items()}}
  if choice:
    chosen['cross_validation'] = choice.describe()
  if settings.transformer_skipped:
    chosen['transformer_skipped'] = (
        f'--model={settings.model} was fitted as its n-gram branch alone: '
        f'the train split has fewer than --transformer_min_examples='
        f'{settings.transformer_min_examples} examples')
  if ngram_branch:
    chosen['ngram_min_count'] = ngram_branch.min_count
    chosen['ngram_fit'] = settings.ngram_fit
    if ngram_branch.penalty is not None:
      chosen['ngram_penalty'] = ngram_branch.penalty
    if not choice:
      # In the order tried: JSON objects lose it.
      chosen['tried'] = [[count, score]
                         for count, score in ngram_branch.scores.items()]
  return chosen
