"""Evaluation of the exported raw-text model on the validation and test
splits, and a report.

What is reported is what is served: each split's raw text goes through the
export's signature, not through the Keras model in memory. The export is
evaluated while still staged, and its metadata completed, before it is
published; the report goes into the model folder after that. Validation chose
the model (epoch, temperature, branch weights); test chose nothing, and is
the figure to quote.
"""
import csv
import dataclasses
import json
import posixpath
import re
from typing import Dict, List, Optional

import matplotlib
matplotlib.use('Agg')  # files only, no display
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position
from matplotlib import ticker  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
import tensorflow as tf  # pylint: disable=wrong-import-position

from serving import drift  # pylint: disable=wrong-import-position
from outputs import ownership  # pylint: disable=wrong-import-position
from schemas import raw  # pylint: disable=wrong-import-position
from schemas import serving  # pylint: disable=wrong-import-position
from schemas import transformed  # pylint: disable=wrong-import-position
from schemas.metadata import BLESSED  # pylint: disable=wrong-import-position
from schemas.metadata import BLESSING  # pylint: disable=wrong-import-position
from trainer import calibration  # pylint: disable=wrong-import-position
from trainer import data as data_lib  # pylint: disable=wrong-import-position
from trainer import model as model_lib  # pylint: disable=wrong-import-position
from trainer import selection  # pylint: disable=wrong-import-position
from serving import exports  # pylint: disable=wrong-import-position
from serving import predictions  # pylint: disable=wrong-import-position

METRICS_FILE = ownership.MODEL_METRICS
REPORT_FILE = ownership.MODEL_REPORT
HISTORY_FILE = 'history.csv'
HISTORY_PLOT = 'training_curves.png'
# The export's metadata section with the headline figures of its evaluation.
EVALUATION = 'evaluation'
# The label vocabulary is ordered by train frequency: id 0 is the train
# split's most frequent class, what a model that learned nothing predicts.
MAJORITY_ID = 0
# The headline figures: (name in the report, key, format).
HEADLINE = (('examples', 'examples', '{}'),
            ('accuracy', 'accuracy', '{:.4f}'),
            ('macro F1', 'macro_f1', '{:.4f}'),
            ('ROC AUC', 'roc_auc', '{:.4f}'),
            ('accuracy of the majority class', 'majority_baseline',
             '{:.4f}'))


# The test split's mistakes the report lists, the most confident first, and
# how much of each text its table shows.
MISTAKES_SHOWN = 10
MISTAKE_TEXT_CHARS = 200
# What Markdown would read as formatting, a link, HTML, an entity or a
# table's column, in a cell: escaped with a backslash (CommonMark's
# escapes; GitHub's tables read \| as the character).
_MARKDOWN_SPECIAL = re.compile(r'([\\`*_\[\]<>|&~])')


def confusion_plot(split: str) -> str:
  return f'confusion_matrix_{split}.png'


# The report's pictures.
PLOTS = (HISTORY_PLOT, calibration.RELIABILITY_PLOT,
         *(confusion_plot(split) for split in raw.HELD_OUT))


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> Optional[float]:
  """Area under the ROC curve: P(score of a positive > score of a negative);
  None (JSON's null, not a bare NaN) where a class is absent."""
  order = np.argsort(scores, kind='mergesort')
  ranks = np.empty(len(scores))
  sorted_scores = scores[order]
  # Average ranks over ties.
  _, first, counts = np.unique(sorted_scores, return_index=True,
                               return_counts=True)
  average = first + (counts - 1) / 2.0 + 1
  ranks[order] = np.repeat(average, counts)
  positives = labels.astype(bool)
  n_pos, n_neg = positives.sum(), (~positives).sum()
  if not n_pos or not n_neg:
    return None
  return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) /
               (n_pos * n_neg))


def classification_metrics(labels: np.ndarray, probabilities: np.ndarray,
                           label_names: List[str]) -> Dict:
  """Accuracy, per-class P/R/F1, macro F1, confusion matrix (and AUC if 2)."""
  num_classes = len(label_names)
  predictions = probabilities.argmax(axis=1)
  confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
  np.add.at(confusion, (labels, predictions), 1)
  per_class = {}
  for index, name in enumerate(label_names):
    true_positive = confusion[index, index]
    predicted = confusion[:, index].sum()
    actual = confusion[index, :].sum()
    precision = true_positive / predicted if predicted else 0.0
    recall = true_positive / actual if actual else 0.0
    f1 = (2 * precision * recall / (precision + recall)
          if precision + recall else 0.0)
    per_class[name] = {'precision': float(precision), 'recall': float(recall),
                       'f1': float(f1), 'support': int(actual)}
  present = [c for c in per_class.values() if c['support']]
  metrics = {
      'examples': int(len(labels)),
      'accuracy': float((predictions == labels).mean()) if len(labels) else 0.0,
      # Over the classes the split has examples of: a class it lacks has
      # no recall to measure, and its F1 of 0 would say nothing of the
      # model.
      'macro_f1': float(np.mean([c['f1'] for c in present] or [0.0])),
      'classes_without_examples': [name for name, c in per_class.items()
                                   if not c['support']],
      'per_class': per_class,
      'confusion_matrix': {'labels': label_names,
                           'rows_true_columns_predicted': confusion.tolist()},
  }
  if num_classes == 2:
    # The second label is the "positive" one for the AUC.
    metrics['roc_auc'] = roc_auc(labels == 1, probabilities[:, 1])
  return metrics


def predict_split(signature, data: data_lib.PreprocessedData, split: str,
                  batch_size: int = 256, mistakes: int = 0):
  """(true label ids, probabilities, the ``mistakes`` most confident
  mistakes) of a serving signature on a held-out split."""
  labels, probabilities, worst = [], [], []
  for text, label in data_lib.dataset(
      data, split, batch_size, feature=transformed.TEXT, cache=False):
    probabilities.append(signature(text=text)[serving.PROBABILITIES].numpy())
    labels.append(label.numpy())
    if mistakes:
      worst = predictions.worst_mistakes(
          [*worst, *_examples(text.numpy(), labels[-1], probabilities[-1],
                              data.label_names)], mistakes)
  return np.concatenate(labels), np.concatenate(probabilities), worst


def _examples(texts: np.ndarray, label_ids: np.ndarray,
              probabilities: np.ndarray, label_names: List[str]):
  """(text, label, prediction, confidence) of each served example."""
  predicted = probabilities.argmax(axis=1)
  for text, label_id, prediction, row in zip(texts, label_ids, predicted,
                                             probabilities):
    yield (text.decode('utf-8', 'replace'), label_names[label_id],
           label_names[prediction], float(row[prediction]))


def _plot_history(history_path: str, out_path: str) -> bool:
  if not tf.io.gfile.exists(history_path):
    return False
  with tf.io.gfile.GFile(history_path) as handle:
    rows = list(csv.DictReader(handle))
  if not rows:
    return False
  epochs = [int(r['epoch']) + 1 for r in rows]
  figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(10, 4))
  for axes, metric in ((loss_axes, 'loss'), (accuracy_axes, 'accuracy')):
    axes.plot(epochs, [float(r[metric]) for r in rows], 'o-', label='train')
    # Keras's CSVLogger writes NA where nothing was held out (a refit).
    if rows[0].get(f'val_{metric}', 'NA') != 'NA':
      axes.plot(epochs, [float(r[f'val_{metric}']) for r in rows], 'o-',
                label=raw.VALIDATION)
    axes.set_xlabel('epoch')
    axes.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    axes.set_title(metric)
    axes.grid(alpha=0.3)
    axes.legend()
  figure.tight_layout()
  _save(figure, out_path)
  return True


def _plot_confusion(metrics: Dict, split: str, out_path: str) -> None:
  names = metrics['confusion_matrix']['labels']
  matrix = np.array(metrics['confusion_matrix']['rows_true_columns_predicted'])
  size = max(3.5, 0.6 * len(names) + 2)
  figure, axes = plt.subplots(figsize=(size, size))
  axes.imshow(matrix, cmap='Blues')
  axes.set_xticks(range(len(names)), names, rotation=45, ha='right')
  axes.set_yticks(range(len(names)), names)
  axes.set_xlabel('predicted')
  axes.set_ylabel('true')
  for (row, column), count in np.ndenumerate(matrix):
    axes.text(column, row, str(count), ha='center', va='center',
              color='white' if count > matrix.max() / 2 else 'black')
  axes.set_title(f'{split}: accuracy {metrics["accuracy"]:.2%}')
  figure.tight_layout()
  _save(figure, out_path)


def _save(figure, path: str) -> None:
  with tf.io.gfile.GFile(path, 'wb') as handle:
    figure.savefig(handle, format='png', dpi=100)
  plt.close(figure)


def _summary_lines(metrics: Dict) -> List[str]:
  """The headline figures, one column a split."""
  splits = raw.HELD_OUT
  lines = ['| | ' + ' | '.join(splits) + ' |',
           '| --- |' + ' ---: |' * len(splits)]
  for name, key, form in HEADLINE:
    if key in metrics[splits[0]]:
      lines.append(f'| {name} | ' + ' | '.join(
          '–' if metrics[split][key] is None else
          form.format(metrics[split][key]) for split in splits) + ' |')
  return lines


def _chosen_by(splits: Dict, split: str) -> str:
  """How the preprocessing job chose a split's records, in words."""
  chosen = splits['chosen_by'].get(split, {})
  ways = []
  if chosen.get(transformed.CHOSEN_BY_DATA):
    ways.append(f'{chosen[transformed.CHOSEN_BY_DATA]:,} named by the data')
  if chosen.get(transformed.CHOSEN_BY_GROUP):
    ways.append(f'{chosen[transformed.CHOSEN_BY_GROUP]:,} by a hash of their '
                f'group ({splits["grouped_by"]}: '
                f'{splits["groups"].get(split, 0):,} groups)')
  if chosen.get(transformed.CHOSEN_BY_TEXT):
    ways.append(f'{chosen[transformed.CHOSEN_BY_TEXT]:,} by a hash of their '
                'text' + (', having no group' if splits['grouped_by'] else ''))
  return '; '.join(ways) or 'none'


def choice_lines(choices: Dict, data_stats: Dict) -> List[str]:
  """What chose what (``choices``, as the trainer records them), and how
  the preprocessing job made each split (its stats.json); an output of a
  job that did not say, the split names alone."""
  splits = data_stats.get(transformed.SPLITS_STATS)
  on = choices.get('on', raw.VALIDATION)
  if on == selection.CROSS_VALIDATION:
    lines = cross_validation_lines(choices)
  else:
    lines = [f'The {on} split chose the epoch (early stopping), the '
             'temperature and any branch weights.' +
             (f' Its records: {_chosen_by(splits, on)}.' if splits else '')]
    lines += ngram_choice_lines(choices)
  return lines + fitting_lines(choices) + [
      '', 'The test split chose nothing and is reported once, here.' +
      (f' Its records: {_chosen_by(splits, raw.TEST)}.' if splits else '')]


def fitting_lines(choices: Dict) -> List[str]:
  """How the model was fitted, where the training split's size chose it:
  the hybrid reduced to its n-gram branch, the branch's solver."""
  lines = []
  if choices.get('transformer_skipped'):
    lines.append(choices['transformer_skipped'] + '.')
  if choices.get('ngram_fit') == 'convex':
    lines.append('The n-gram branch was fitted by a convex solver on the '
                 'whole of its training documents at once, with the penalty '
                 f'chosen with its minimum count ({choices["ngram_penalty"]:g}'
                 ').')
  return ['', ' '.join(lines)] if lines else []


def cross_validation_lines(choices: Dict) -> List[str]:
  """What cross-validation chose, with each candidate's held-out mean and
  spread over the folds."""
  folds = choices['cross_validation']
  calibrated = (
      'The final model was then trained on train + validation, and its '
      'temperature and any branch weights fitted on the folds\' held-out '
      'predictions: its validation figures below are of data it trained on.'
      if choices.get('refit') else
      'The validation split chose the temperature and any branch weights.')
  # Runs from before the choice recorded its measure chose by accuracy.
  measure = ('loss' if folds.get('monitor') == 'val_loss' else 'accuracy')
  ngram_settings = [candidate['setting'] for candidate
                    in folds['tried'].get(model_lib.NGRAM_LOGITS, [])]
  chose = [what for what, key in (('the n-gram minimum count',
                                   'ngram_min_count'),
                                  ('the n-gram branch\'s penalty',
                                   'ngram_penalty'))
           if len({setting.get(key) for setting in ngram_settings}) > 1]
  lines = [f'Grouped {folds["folds"]}-fold cross-validation over the train '
           f'split ({folds["examples"]:,} examples in {folds["groups"]:,} '
           'groups: a record\'s group, else its text) chose each branch\'s '
           'epochs' + ''.join(f' and {what}' for what in chose) +
           f', by the held-out {measure} over every training example. '
           f'{calibrated}', '',
           f'| branch | setting | epochs | held-out {measure} | spread (SD '
           'over folds) | chosen |',
           '| --- | --- | ---: | ---: | ---: | --- |']
  for branch, tried in folds['tried'].items():
    for candidate in tried:
      setting = ', '.join(f'{key} {value}' for key, value
                          in candidate['setting'].items()) or '–'
      # Runs from before the choice recorded each branch's setting had
      # one candidate a minimum count.
      chosen_setting = folds.get('settings', {}).get(branch)
      chosen = (candidate['epochs'] == folds['epochs'][branch] and (
          candidate['setting'] == chosen_setting
          if chosen_setting is not None else
          candidate['setting'].get('ngram_min_count') in (
              None, folds.get('ngram_min_count'))))
      lines.append(f'| {branch} | {setting} | {candidate["epochs"]} | '
                   f'{candidate["mean"]:.4f} | {candidate["std"]:.4f} | '
                   f'{"yes" if chosen else ""} |')
  return lines


def ngram_choice_lines(choices: Dict) -> List[str]:
  """What the validation split chose of the n-gram branch, when it chose."""
  tried = choices.get('tried') or []
  if len(tried) < 2:
    return []
  scores = ', '.join(f'{count}: {score:.4f}' for count, score in tried)
  return ['', 'The validation split chose the n-gram branch\'s minimum '
          f'document count, {choices["ngram_min_count"]} (best validation '
          f'figure of the branch alone, by count tried: {scores}).']


def _split_lines(section: Dict, split: str) -> List[str]:
  lines = ['', f'## {split.capitalize()}', '',
           '| class | precision | recall | F1 | support |',
           '| --- | ---: | ---: | ---: | ---: |']
  for name, row in section['per_class'].items():
    lines.append(f'| {name} | {row["precision"]:.4f} | {row["recall"]:.4f} | '
                 f'{row["f1"]:.4f} | {row["support"]} |')
  return lines + ['', f'![{split} confusion matrix]({confusion_plot(split)})']


def markdown_cell(text: str, most: Optional[int] = None) -> str:
  """``text`` as a Markdown table cell shows it: on one line (every run of
  whitespace, line ends included, one space), cut to ``most`` characters,
  nothing in it read as Markdown."""
  text = ' '.join(text.split())
  if most is not None and len(text) > most:
    text = text[:most - 1] + '…'
  return _MARKDOWN_SPECIAL.sub(r'\\\1', text)


def mistake_lines(mistakes: List[predictions.Mistake],
                  split: str) -> List[str]:
  """The ``mistakes`` the model was surest of on ``split``, as a table."""
  lines = ['', f'## The most confident mistakes on {split}', '']
  if not mistakes:
    return lines + [f'The model labelled every {split} example right.']
  lines += [f'The {split} examples the model got wrong with the highest '
            f'confidence, at most {MISTAKES_SHOWN}, the start of an error '
            f'analysis (texts cut to {MISTAKE_TEXT_CHARS} characters):', '',
            '| text | label | predicted | confidence |',
            '| --- | --- | --- | ---: |']
  return lines + [
      f'| {markdown_cell(mistake.text, MISTAKE_TEXT_CHARS)} | '
      f'{markdown_cell(mistake.label)} | {markdown_cell(mistake.prediction)} '
      f'| {mistake.confidence:.4f} |' for mistake in mistakes]


def blessing_lines(metadata: Dict) -> List[str]:
  """Whether the trainer's gate blessed the version, and why
  (``trainer.blessing``)."""
  blessing = metadata.get(BLESSING)
  if blessing is None:
    return []
  verdict = ('Blessed' if blessing[BLESSED] else
             'Not blessed, so not served by jobs that name the model folder')
  return [f'{verdict}: {blessing["reason"]}.', '']


@dataclasses.dataclass
class Evaluation:
  """What the evaluation of an export found."""
  metrics: Dict
  # The test split's true label ids and served probabilities, for the
  # reliability diagram.
  test_labels: np.ndarray
  test_probabilities: np.ndarray
  # The test split's MISTAKES_SHOWN most confident mistakes.
  test_mistakes: List[predictions.Mistake]


def write_report(folder: str, evaluation: Evaluation, metadata: Dict,
                 history_file: str) -> None:
  """metrics.json, the PNG plots and report.md in ``folder``, for the
  export of ``metadata`` (its version decided), trained with the history
  ``history_file``."""
  metrics = evaluation.metrics
  tf.io.gfile.makedirs(folder)
  with tf.io.gfile.GFile(posixpath.join(folder, METRICS_FILE), 'w') as out:
    json.dump(metrics, out, indent=2, sort_keys=True)
  has_history = _plot_history(history_file,
                              posixpath.join(folder, HISTORY_PLOT))
  calibration.plot_served(
      evaluation.test_labels, evaluation.test_probabilities,
      metadata['calibration']['temperature'],
      posixpath.join(folder, calibration.RELIABILITY_PLOT))
  lines = [
      '# Evaluation report', '',
      f'Export version {metadata["version"]}, evaluated through its raw-text '
      'signature.', '', *blessing_lines(metadata),
      *choice_lines(metadata.get('training', {}).get('choices', {}),
                    metadata.get('data_stats', {})),
      '', *_summary_lines(metrics)]
  for split in raw.HELD_OUT:
    _plot_confusion(metrics[split], split,
                    posixpath.join(folder, confusion_plot(split)))
    lines += _split_lines(metrics[split], split)
  lines += mistake_lines(evaluation.test_mistakes, raw.TEST)
  if has_history:
    lines += ['', f'![loss and accuracy per epoch]({HISTORY_PLOT})']
  lines += calibration.report_lines(
      metrics, metadata['calibration']['fitted_on']['what'])
  lines += ['', '## Training parameters', '', '```json',
            json.dumps(metadata.get('training', {}), indent=2, sort_keys=True),
            '```', '']
  with tf.io.gfile.GFile(posixpath.join(folder, REPORT_FILE), 'w') as out:
    out.write('\n'.join(lines))


def evaluate(export_dir: str, data: data_lib.PreprocessedData) -> Evaluation:
  """Serves the staged export over validation, then test, once; adds to its
  metadata what the scoring job measures drift against and the headline
  figures; returns what it found."""
  signature, loaded = exports.load(export_dir)
  metadata = loaded.document
  choices = metadata.get('training', {}).get('choices', {})
  # What chose the model's settings: the validation split, or
  # cross-validation (and then whether validation was trained on too).
  selected = {'selected_on': choices.get('on', raw.VALIDATION),
              'refit': bool(choices.get('refit'))}
  metrics = dict(selected)
  labels, served, mistakes = {}, {}, {}
  for split in raw.HELD_OUT:
    labels[split], served[split], mistakes[split] = predict_split(
        signature, data, split,
        mistakes=MISTAKES_SHOWN if split == raw.TEST else 0)
    metrics[split] = classification_metrics(labels[split], served[split],
                                            data.label_names)
    metrics[split]['majority_baseline'] = float(
        np.mean(labels[split] == MAJORITY_ID))
    metrics[split]['calibration'] = calibration.evaluate(
        labels[split], served[split], metadata['calibration']['temperature'])
  # What the scoring job measures each partition's drift against: the
  # predictions on data the model never learned from nor was chosen on.
  exports.add_metadata(export_dir, {
      drift.REFERENCE: drift.reference(data.label_names, served[raw.TEST]),
      EVALUATION: {**selected, **{
          split: {key: metrics[split][key] for _, key, _ in HEADLINE
                  if key in metrics[split]} for split in raw.HELD_OUT}}})
  return Evaluation(metrics, labels[raw.TEST], served[raw.TEST],
                    mistakes[raw.TEST])
