"""Calibration: temperature scaling (and the hybrid's branch weights) fitted
on the validation split, expected calibration error, reliability diagrams.

Temperature scaling (Guo et al., 2017) divides the logits by one T > 0
that minimises the validation negative log-likelihood: the predicted class
never changes, only how sure the model says it is. The hybrid model has one
scale a branch instead (stacking: each branch's logits weighted by what
they are worth on held-out data); its scales s are fitted the same way and
stored as weights s / sum(s) in the model's ``BranchMix`` and one
temperature 1 / sum(s), so "before calibration" is the weighted model at
temperature 1 for every model kind. The model's ``Temperature`` layer holds
T, so the export serves calibrated probabilities through the same
signature.
"""
from typing import Dict, List

import keras
import matplotlib
matplotlib.use('Agg')  # files only, no display
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
import tensorflow as tf  # pylint: disable=wrong-import-position

from schemas import raw  # pylint: disable=wrong-import-position
from trainer import model as model_lib  # pylint: disable=wrong-import-position
from trainer import selection  # pylint: disable=wrong-import-position

ECE_BINS = 15
# How the report names what the temperature was fitted on.
_FITTED_ON = {
    raw.VALIDATION: 'the validation split',
    selection.CROSS_VALIDATION: 'the held-out predictions of the cross-validation '
                        'folds (the train split)',
}
RELIABILITY_PLOT = 'reliability.png'
# The smallest scale a fit may return: a branch that does not help is
# weighted (almost) out, never turned against its own predictions.
_MIN_SCALE = 1e-4


def softmax(logits: np.ndarray) -> np.ndarray:
  shifted = logits - logits.max(axis=-1, keepdims=True)
  exp = np.exp(shifted)
  return exp / exp.sum(axis=-1, keepdims=True)


def negative_log_likelihood(probabilities: np.ndarray,
                            labels: np.ndarray) -> float:
  picked = probabilities[np.arange(len(labels)), labels]
  return float(-np.mean(np.log(np.maximum(picked, 1e-12))))


def expected_calibration_error(probabilities: np.ndarray, labels: np.ndarray,
                               bins: int = ECE_BINS) -> float:
  """Sum over equal-width confidence bins of |accuracy - confidence| times
  the bin's share of the examples."""
  confidence, correct = _confidence_and_correct(probabilities, labels)
  edges = np.linspace(0.0, 1.0, bins + 1)
  # Bins are (low, high]: a confidence of exactly 1 lands in the last one.
  index = np.clip(np.searchsorted(edges, confidence, side='left') - 1, 0,
                  bins - 1)
  error = 0.0
  for b in range(bins):
    inside = index == b
    if inside.any():
      error += inside.mean() * abs(correct[inside].mean() -
                                   confidence[inside].mean())
  return float(error)


def _confidence_and_correct(probabilities, labels):
  return probabilities.max(axis=1), probabilities.argmax(axis=1) == labels


def fit_scales(branch_logits: np.ndarray, labels: np.ndarray,
               iterations: int = 50) -> np.ndarray:
  """Scales s >= 0 minimising the NLL of softmax(sum_b s[b] * logits[:, b]).

  ``branch_logits`` is [examples, branches, classes]. The NLL is convex in
  s, so damped Newton steps reach the minimum in a few iterations; with one
  branch, 1 / s is the temperature. Where the mix then classifies no
  example wrong, the NLL has no minimum (it falls without end as the
  scales grow, and only the iterations would stop them): the scales are
  fitted again against Platt's targets (1999), which never ask for more
  than the labels warrant (``platt_targets``).
  """
  logits = branch_logits.astype(np.float64)
  scales = _minimise_cross_entropy(logits, np.eye(logits.shape[-1])[labels],
                                   iterations)
  mixed = np.einsum('nbk,b->nk', logits, scales)
  # None wrong (a tie too only gains as the scales grow).
  if np.all(mixed[np.arange(len(labels)), labels] >= mixed.max(axis=1)):
    scales = _minimise_cross_entropy(
        logits, platt_targets(labels, logits.shape[-1]), iterations)
  return scales


def platt_targets(labels: np.ndarray, classes: int) -> np.ndarray:
  """[examples, classes]: each example's labelled class (n + 1) / (n + 2),
  n the examples of that class, and the rest shared by the other classes:
  n right answers out of n, by Laplace's rule of succession, warrant no
  more (Platt, 1999, for two classes)."""
  examples = np.bincount(labels, minlength=classes)[labels]
  labelled = (examples + 1) / (examples + 2)
  targets = np.repeat(((1 - labelled) / (classes - 1))[:, None], classes,
                      axis=1)
  targets[np.arange(len(labels)), labels] = labelled
  return targets


def _minimise_cross_entropy(logits: np.ndarray, targets: np.ndarray,
                            iterations: int) -> np.ndarray:
  """``fit_scales``' scales against ``targets`` [examples, classes] (one-hot
  labels, or ``platt_targets``)."""
  scales = np.ones(logits.shape[1])
  examples = len(targets)

  def loss(s):
    z = np.einsum('nbk,b->nk', logits, s)
    z -= z.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(axis=1)) -
                         (z * targets).sum(axis=1)))

  for _ in range(iterations):
    p = softmax(np.einsum('nbk,b->nk', logits, scales))
    gradient = np.einsum('nk,nbk->b', p - targets, logits) / examples
    expected = np.einsum('nk,nbk->nb', p, logits)
    hessian = (np.einsum('nk,nbk,nck->bc', p, logits, logits) -
               np.einsum('nb,nc->bc', expected, expected)) / examples
    step = np.linalg.solve(hessian + 1e-9 * np.eye(len(scales)), gradient)
    current, rate = loss(scales), 1.0
    # Halve the step until the loss does not rise (backtracking).
    while rate > 1e-6:
      candidate = np.maximum(scales - rate * step, _MIN_SCALE)
      if loss(candidate) <= current:
        break
      rate /= 2
    else:
      break
    if np.abs(candidate - scales).max() < 1e-7:
      scales = candidate
      break
    scales = candidate
  return scales


def _branch_logits(model, batches):
  """[examples, branches, classes] logits of each branch, and the labels."""
  names = model_lib.branch_names(model)
  probe = keras.Model(model.inputs,
                      [model.get_layer(name).output for name in names])
  logits, labels = [], []
  for token_ids, label in batches:
    outputs = probe(token_ids, training=False)
    if len(names) == 1:
      outputs = [outputs]
    logits.append(np.stack([np.asarray(o) for o in outputs], axis=1))
    labels.append(label.numpy())
  return np.concatenate(logits), np.concatenate(labels)


def calibrate(model, batches) -> Dict:
  """Fits the branch weights and the temperature of ``model`` on
  ``batches`` of (token ids, label ids) of the validation split."""
  logits, labels = _branch_logits(model, batches)
  return calibrate_logits(model, logits, labels, raw.VALIDATION)


def calibrate_logits(model, logits: np.ndarray, labels: np.ndarray,
                     fitted_on: str, weights_by_accuracy: bool = False
                     ) -> Dict:
  """Fits the branch weights and the temperature of ``model`` on its
  branches' ``logits`` [examples, branches, classes] of held-out examples
  (``fitted_on`` names them), sets them in the model, and returns them with
  the figures there before and after. With ``weights_by_accuracy``, the
  branch weights are those of the most accurate mix instead
  (``accurate_weights``), and the temperature is fitted to them."""
  scales = fit_scales(logits, labels)
  weights, temperature = scales / scales.sum(), 1.0 / scales.sum()
  if weights_by_accuracy and len(scales) > 1:
    weights = accurate_weights(logits, labels, weights)
    temperature = 1.0 / fit_scales(
        np.einsum('nbk,b->nk', logits, weights)[:, None, :], labels)[0]
  if len(scales) > 1:
    model.get_layer(model_lib.MIXED_LOGITS).scales.assign(weights)
  model.get_layer(model_lib.TEMPERATURE).temperature.assign(temperature)
  mixed = np.einsum('nbk,b->nk', logits, weights)
  before, after = softmax(mixed), softmax(mixed / temperature)
  result = {'temperature': float(temperature),
            'fitted_on': {'examples': int(len(labels)), 'what': fitted_on,
                          'before': summary(before, labels),
                          'after': summary(after, labels),
                          # Always answering their most frequent class.
                          'majority_baseline': float(
                              np.bincount(labels).max() / len(labels))}}
  if len(scales) > 1:
    result['branch_weights'] = dict(zip(model_lib.branch_names(model),
                                        map(float, weights)))
    result['fitted_on']['branch_accuracy'] = {
        name: float((logits[:, b].argmax(axis=1) == labels).mean())
        for b, name in enumerate(model_lib.branch_names(model))}
  return result


# The branch weights ``accurate_weights`` tries: the first branch's share
# in steps of 5 %.
_WEIGHT_GRID = np.linspace(0.0, 1.0, 21)


def accurate_weights(logits: np.ndarray, labels: np.ndarray,
                     likely: np.ndarray) -> np.ndarray:
  """The weights of two branches (summing to 1, on a grid) whose mix is the
  most accurate on ``logits``; of equally accurate ones, the nearest to
  ``likely`` (the weights of the most likely mix).

  The weights that minimise the NLL need not classify best: on IMDB they
  gave the transformer a tenth of the say and lost 0.2 points to the n-gram
  branch alone over 22,700 held-out reviews. Accuracy is what the trainer
  chooses everything else by; fitted on the cross-validation folds'
  held-out predictions of the whole train split, not on a validation
  split's few thousand, a 5 % step is not chosen on noise.
  """
  def key(share):
    mixed = share * logits[:, 0] + (1 - share) * logits[:, 1]
    return (np.mean(mixed.argmax(axis=1) == labels), -abs(share - likely[0]))
  share = max(_WEIGHT_GRID, key=key)
  return np.array([share, 1.0 - share])


def summary(probabilities: np.ndarray, labels: np.ndarray) -> Dict:
  return {
      'accuracy': float((probabilities.argmax(axis=1) == labels).mean()),
      'ece': expected_calibration_error(probabilities, labels),
      'nll': negative_log_likelihood(probabilities, labels),
  }


def uncalibrated(probabilities: np.ndarray, temperature: float) -> np.ndarray:
  """The model's probabilities at temperature 1, from its calibrated ones.

  log p = z / T + c, so softmax(T log p) = softmax(z); classes with
  probability 0 in float32 stay at 0.
  """
  with np.errstate(divide='ignore'):
    return softmax(temperature * np.log(probabilities.astype(np.float64)))


def evaluate(labels: np.ndarray, probabilities: np.ndarray,
             temperature: float) -> Dict:
  """Calibration figures of a split the export served: the served
  (calibrated) probabilities against the same model at temperature 1."""
  return {'temperature': temperature,
          'bins': ECE_BINS,
          'before': summary(uncalibrated(probabilities, temperature), labels),
          'after': summary(probabilities, labels)}


def plot_served(labels: np.ndarray, probabilities: np.ndarray,
                temperature: float, path: str) -> None:
  """The reliability diagram of a split the export served, at temperature 1
  and at the fitted one."""
  plot_reliability({'temperature 1': uncalibrated(probabilities, temperature),
                    f'temperature {temperature:.3f}': probabilities},
                   labels, path)


def plot_reliability(curves: Dict[str, np.ndarray], labels: np.ndarray,
                     path: str) -> None:
  """Accuracy against mean confidence per bin, one line a named set of
  probabilities, beside the diagonal of perfect calibration."""
  figure, axes = plt.subplots(figsize=(5, 5))
  axes.plot([0, 1], [0, 1], '--', color='grey', label='perfect')
  edges = np.linspace(0.0, 1.0, ECE_BINS + 1)
  for name, probabilities in curves.items():
    confidence, correct = _confidence_and_correct(probabilities, labels)
    index = np.clip(np.searchsorted(edges, confidence) - 1, 0, ECE_BINS - 1)
    used = [b for b in range(ECE_BINS) if (index == b).any()]
    axes.plot([confidence[index == b].mean() for b in used],
              [correct[index == b].mean() for b in used], 'o-',
              label=f'{name}: ECE '
              f'{expected_calibration_error(probabilities, labels):.4f}')
  axes.set_xlabel('confidence')
  axes.set_ylabel('accuracy')
  axes.set_title(f'reliability ({ECE_BINS} bins)')
  axes.grid(alpha=0.3)
  axes.legend()
  figure.tight_layout()
  with tf.io.gfile.GFile(path, 'wb') as handle:
    figure.savefig(handle, format='png', dpi=100)
  plt.close(figure)


def report_lines(metrics: Dict, fitted_on: str) -> List[str]:
  """The report's calibration section: each held-out split at temperature 1
  and at the fitted temperature."""
  splits = [split for split in raw.HELD_OUT
            if 'calibration' in metrics.get(split, {})]
  if not splits:
    return []
  temperature = metrics[splits[0]]['calibration']['temperature']
  lines = ['', '## Calibration', '',
           f'Temperature fitted on {_FITTED_ON.get(fitted_on, fitted_on)}: '
           f'{temperature:.4f}; '
           f'expected calibration error over {ECE_BINS} equal-width '
           'confidence bins.', '',
           '| split, probabilities | accuracy | ECE | NLL |',
           '| --- | ---: | ---: | ---: |']
  for split in splits:
    for name, key in (('temperature 1', 'before'),
                      (f'temperature {temperature:.3f}', 'after')):
      row = metrics[split]['calibration'][key]
      lines.append(f'| {split}, {name} | {row["accuracy"]:.4f} | '
                   f'{row["ece"]:.4f} | {row["nll"]:.4f} |')
  return lines + ['', f'![reliability diagram, test]({RELIABILITY_PLOT})']
