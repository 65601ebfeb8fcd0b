"""The gate between a run's export and the jobs that name the model folder
(TFX's Evaluator blessing a model for its Pusher): a version is blessed when
it beats always answering the majority class by more than
``--bless_min_gain_over_majority`` and is at most ``--bless_tolerance`` less
accurate than the newest blessed version before it, on the same evaluation.

Both are judged on what chose the model, never on the test split, which
chooses nothing: the validation split's accuracy, or, where ``--refit``
trained on validation, that of the cross-validation folds' held-out
predictions. The version before is measured on the same figures: served on
this run's validation split, its classes read by name (other classes, or a
version refitted on this very split, make it incomparable), or, after a refit, its recorded figure where it was trained
on the same preprocessing output and measured the same way; a version that
cannot be compared is said to be so, and the gate judges against the
majority class alone.

Every version is published, blessed or not, so that it can be inspected
and served by naming its folder; ``serving.exports.resolve`` gives jobs
that name the model folder its newest blessed version. A run whose version
is not blessed ends with ``NotBlessed``: one error line and exit status 7.
"""
import logging
from typing import Dict, Optional, Tuple

import cli
from schemas import metadata as metadata_lib
from schemas import raw
from serving import exports
from trainer import data as data_lib
from trainer import evaluate
from trainer import settings as settings_lib

# How a figure was measured, when it was not on the validation split.
_FOLDS_HELD_OUT = '{}\'s held-out predictions'


class NotBlessed(cli.JobError):
  """A version published but not blessed: jobs naming the model folder go
  on serving the newest blessed version."""
  exit_status = cli.EXIT_NOT_BLESSED


def held_out_figure(metrics: Dict, refitted_on: Optional[Dict] = None
                    ) -> Tuple[float, float, str]:
  """(accuracy, the majority class's accuracy, what they were measured on)
  on data the model did not learn from: the validation split, or, for a
  model refitted on it, the cross-validation folds' held-out predictions
  (``refitted_on``, the calibration's ``fitted_on``)."""
  if refitted_on:
    return (refitted_on['after']['accuracy'],
            refitted_on['majority_baseline'],
            _FOLDS_HELD_OUT.format(refitted_on['what']))
  validation = metrics[raw.VALIDATION]
  return (validation['accuracy'], validation['majority_baseline'],
          f'the {raw.VALIDATION} split')


def _previous_accuracy(previous: exports.ExportMetadata, folder: str,
                       measured_on: str, refitted: bool,
                       data: data_lib.PreprocessedData
                       ) -> Tuple[Optional[float], str]:
  """(the previous version's accuracy measured as this run's is, or None,
  and why not)."""
  if refitted:
    # A refitted model's figure comes from its own folds: only the same
    # data measured the same way compares.
    recorded = previous.blessing or {}
    if (previous.document.get('preprocessing_fingerprint') ==
        data.fingerprint and recorded.get('measured_on') == measured_on):
      return recorded['accuracy'], ''
    return None, (f'its accuracy on {measured_on} of this run\'s data is '
                  'not recorded')
  if previous.document.get('training', {}).get('refit') and (
      previous.document.get('preprocessing_fingerprint') == data.fingerprint):
    return None, (f'it was refitted on this run\'s {raw.VALIDATION} split, '
                  'so its accuracy there says nothing')
  if sorted(previous.label_names) != sorted(data.label_names):
    return None, (f'its labels {list(previous.label_names)} are not this '
                  f'run\'s {list(data.label_names)}')
  try:
    signature, _ = exports.load(folder, previous)
  except exports.ExportError as error:
    return None, str(error)
  try:
    labels, probabilities, _ = evaluate.predict_split(signature, data,
                                                      raw.VALIDATION)
  except Exception as error:  # pylint: disable=broad-except
    # The version before failing is no fault of this run's model.
    return None, f'it fails on this run\'s {raw.VALIDATION} split: {error}'
  return accuracy(labels, probabilities, previous.label_names,
                  data.label_names), ''


def accuracy(label_ids, probabilities, their_names, our_names) -> float:
  """The accuracy of ``probabilities`` whose columns are ``their_names``
  against ``label_ids`` of ``our_names``: the same classes, perhaps in
  another order (the vocabulary is ordered by frequency, which a retrain on
  new data can swap)."""
  columns = [list(their_names).index(name) for name in our_names]
  return float((probabilities[:, columns].argmax(axis=1) == label_ids).mean())


def _against_previous(model_dir: str, accuracy: float, measured_on: str,
                      refitted: bool, tolerance: float,
                      data: data_lib.PreprocessedData
                      ) -> Tuple[Optional[str], Optional[str], Optional[Dict]]:
  """(what is wrong, else None; a note, else None; the version compared
  with and its accuracy, else None) of this run's ``accuracy`` against the
  newest blessed version in ``model_dir``."""
  try:
    previous_dir = exports.resolve(model_dir)
  except exports.ExportError:
    return None, None, None  # the first version: nothing to compare with
  try:
    previous = exports.load_metadata(previous_dir)
  except exports.ExportError as error:
    previous_accuracy, why_not = None, str(error)
  else:
    previous_accuracy, why_not = _previous_accuracy(
        previous, previous_dir, measured_on, refitted, data)
  if previous_accuracy is None:
    return None, f'not compared with {previous_dir}: {why_not}', None
  compared_with = {'version': previous.version, 'accuracy': previous_accuracy}
  if accuracy < previous_accuracy - tolerance:
    return (f'its accuracy on {measured_on}, {accuracy:.4f}, is more than '
            f'--bless_tolerance={tolerance:g} below {previous_accuracy:.4f}, '
            f'that of version {previous.version}, the newest blessed one, '
            'there'), None, compared_with
  return None, (f'version {previous.version}, the newest blessed one, has '
                f'{previous_accuracy:.4f} there'), compared_with


def judge(export_dir: str, evaluation: evaluate.Evaluation,
          settings: settings_lib.Settings,
          data: data_lib.PreprocessedData) -> Dict:
  """Whether the staged export is blessed, and why, against the majority
  class and the newest blessed version of the model folder; added to its
  metadata and returned."""
  metadata = exports.read_metadata(export_dir)
  refitted_on = (metadata['calibration']['fitted_on']
                 if evaluation.metrics['refit'] else None)
  accuracy, majority, measured_on = held_out_figure(evaluation.metrics,
                                                    refitted_on)
  gain = settings.bless_min_gain_over_majority
  problems = []
  if accuracy <= majority + gain:
    problems.append(
        f'its accuracy on {measured_on}, {accuracy:.4f}, is no better than '
        f'{majority:.4f}, that of always answering '
        f'{data.label_names[evaluate.MAJORITY_ID]!r}, the most frequent '
        f'train class' + (f', by more than {gain:g}' if gain else '') +
        ': the model has learned nothing that holds there (too few epochs, '
        'too high or low a --learning_rate, or labels the text does not '
        'predict)')
  problem, note, compared_with = _against_previous(
      settings.model_dir, accuracy, measured_on, bool(refitted_on),
      settings.bless_tolerance, data)
  problems += [problem] if problem else []
  blessed = not problems
  reason = '; '.join((problems or [
      f'its accuracy on {measured_on}, {accuracy:.4f}, beats {majority:.4f}, '
      'that of always answering the most frequent train class']) +
                     ([note] if note else []))
  blessing = {
      metadata_lib.BLESSED: blessed, 'reason': reason,
      'measured_on': measured_on, 'accuracy': accuracy,
      'majority_baseline': majority, 'min_gain_over_majority': gain,
      'tolerance': settings.bless_tolerance, 'compared_with': compared_with}
  exports.add_metadata(export_dir, {metadata_lib.BLESSING: blessing})
  # Blessed without the comparison asked for: a scheduler's log shows it.
  uncompared = bool(note) and note.startswith('not compared')
  logging.log(logging.WARNING if uncompared or not blessed else logging.INFO,
              'train: the export is %sblessed: %s', '' if blessed else 'not ',
              reason)
  return blessing


def check(blessing: Dict, export_dir: str, model_dir: str) -> None:
  """``NotBlessed`` for a published version the gate did not bless, naming
  the version that jobs naming the model folder serve instead."""
  if blessing[metadata_lib.BLESSED]:
    return
  try:
    served = f'they serve {exports.resolve(model_dir)}'
  except exports.ExportError:
    served = 'none is blessed'
  raise NotBlessed(
      f'{export_dir} is published but not blessed: {blessing["reason"]}. '
      f'Jobs that name --model_dir={model_dir} do not serve it ({served}); '
      'name its folder to serve it anyway')
