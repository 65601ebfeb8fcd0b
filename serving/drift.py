"""Score drift: how a partition's predictions differ from the test split's.

The trainer stores a reference in the export's metadata: the label shares
and the confidence histogram of the export's predictions on the test split.
The scoring job counts the same for each partition and compares the two with
the population stability index,

    PSI = sum over bins of (share - reference) * ln(share / reference),

over the label shares and over the confidence histogram. A PSI over 0.2 (the
usual threshold for a significant shift) raises the manifest's alert where
it is judged: where the partition and the reference hold enough documents
that two samples of one distribution would seldom differ by that much.
Their PSI is about (B - 1)(1/n + 1/m) for n and m documents over B bins (a
symmetric Kullback-Leibler divergence: chi-square with B - 1 degrees of
freedom once divided by 1/n + 1/m), and more where a small bin is empty in
a small sample. A PSI is judged where B (1/n + 1/m) is at most a quarter of
the threshold: against a large reference, 20 documents a bin, 200 over the
ten confidence bins (docs/scoring.md has the simulation).

Plain Python and numpy: the trainer and the scoring job's launcher import it.
"""
import collections
import io
import logging
import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from schemas import metadata

# The section of the export's metadata with the test split's distribution.
REFERENCE = metadata.REFERENCE
# Ten bins of confidence over [0, 1]; a reference carries its own edges, so
# that a partition is always binned as its reference was.
CONFIDENCE_EDGES = tuple(round(i / 10, 1) for i in range(11))
PSI_ALERT = 0.2
# A PSI is judged where bins * (1/n + 1/m), a bin more than its expected
# value between two samples of one distribution, is at most this share of
# PSI_ALERT (above).
_NOISE_SHARE = 0.25
# The share an empty bin counts for, so that the PSI stays finite: about one
# document in ten thousand.
_EMPTY_SHARE = 1e-4


def confidence_bins(confidences: np.ndarray,
                    edges: Sequence[float]) -> np.ndarray:
  """The bin of each confidence (bins closed on the left); 1.0 falls in
  the last one. Compared as float64, as Python compares a float32 to an
  edge."""
  found = np.searchsorted(np.asarray(edges, np.float64),
                          np.asarray(confidences, np.float64), side='right')
  return np.clip(found - 1, 0, len(edges) - 2)


def distribution(label_names: List[str], labels: Dict[str, int],
                 bins: Dict[int, int], edges: Sequence[float]) -> Dict:
  """Label shares and confidence histogram from counts of documents by
  predicted label and by confidence bin."""
  documents = sum(labels.values())

  def share(count):
    return count / documents if documents else 0.0

  return {
      'documents': documents,
      'label_shares': {name: share(labels.get(name, 0))
                       for name in label_names},
      'confidence_histogram': {
          'edges': list(edges),
          'shares': [share(bins.get(index, 0))
                     for index in range(len(edges) - 1)],
      },
  }


def reference(label_names: List[str], probabilities: np.ndarray,
              edges: Sequence[float] = CONFIDENCE_EDGES) -> Dict:
  """The distribution of a model's predictions (rows of class
  probabilities), for the export's metadata."""
  labels = collections.Counter(
      label_names[index] for index in probabilities.argmax(axis=1))
  bins = collections.Counter(
      confidence_bins(probabilities.max(axis=1), edges).tolist())
  return distribution(label_names, labels, bins, edges)


def _number(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def reference_problem(found, label_names: List[str]) -> Optional[str]:
  """What is wrong with a reference as read from an export's metadata;
  None if nothing is (or there is none: an export from before it). A
  reference edited by hand would bin every partition wrongly and raise
  false alerts."""
  if found is None:
    return None
  if not isinstance(found, dict):
    return 'it is not an object'
  documents = found.get('documents')
  if not (isinstance(documents, int) and not isinstance(documents, bool)
          and documents > 0):
    return 'its documents are not a count above 0'
  shares = found.get('label_shares')
  if not (isinstance(shares, dict) and sorted(shares) == sorted(label_names)
          and all(_number(v) and 0 <= v <= 1 for v in shares.values())
          and _sums_to_one(shares.values())):
    return ('its label_shares are not a share in [0, 1] for each of '
            f'{label_names}, summing to 1')
  histogram = found.get('confidence_histogram')
  edges = histogram.get('edges') if isinstance(histogram, dict) else None
  bins = histogram.get('shares') if isinstance(histogram, dict) else None
  if not (isinstance(edges, list) and len(edges) >= 2 and
          all(_number(e) and 0 <= e <= 1 for e in edges) and
          all(a < b for a, b in zip(edges, edges[1:]))):
    return ('its confidence_histogram edges are not at least two rising '
            'numbers in [0, 1]')
  if not (isinstance(bins, list) and len(bins) == len(edges) - 1 and
          all(_number(v) and 0 <= v <= 1 for v in bins) and
          _sums_to_one(bins)):
    return ('its confidence_histogram shares are not a share in [0, 1] for '
            'each bin between its edges, summing to 1')
  return None


def _sums_to_one(shares) -> bool:
  # Shares of one whole, written as floats: they sum to 1 within rounding;
  # a hand-edited reference need not.
  return abs(math.fsum(shares) - 1.0) <= 1e-3


def psi_terms(shares: Sequence[float],
              reference_shares: Sequence[float]) -> List[float]:
  """Each bin's part of the population stability index."""
  terms = []
  for actual, expected in zip(shares, reference_shares):
    actual, expected = max(actual, _EMPTY_SHARE), max(expected, _EMPTY_SHARE)
    terms.append((actual - expected) * math.log(actual / expected))
  return terms


def min_documents(bins: int, reference_documents: int) -> Optional[int]:
  """The fewest documents a partition needs for a PSI over ``bins`` bins
  against a reference of ``reference_documents`` to be judged; None where
  the reference is too small for any partition to be."""
  room = _NOISE_SHARE * PSI_ALERT / bins - 1 / reference_documents
  # Rounded first: 0.25 * 0.2 / 10 is a hair over 0.005 in floats.
  return math.ceil(round(1 / room, 6)) if room > 0 else None


def _not_judged(bins: int, documents: int, reference_documents: int,
                needed: Optional[int]) -> str:
  noise = (bins - 1) * (1 / documents + 1 / reference_documents)
  return (f'{documents} documents against a reference of '
          f'{reference_documents}: two samples of one distribution this size '
          f'differ by a PSI of about {noise:.3f} over {bins} bins, too near '
          f'the threshold of {PSI_ALERT} to tell drift from chance; ' + (
              f'judged from {needed} documents' if needed else
              'the reference is too small to judge any partition'))


def compare(current: Dict, reference_distribution: Optional[Dict]) -> Dict:
  """The manifest's drift section: both distributions, their PSIs, which of
  them were judged (enough documents for sampling noise to stay well under
  PSI_ALERT) and why not, and whether a judged one is over PSI_ALERT.
  Without a reference (an export older than the reference, or an empty
  partition) there is nothing to compare."""
  drift = {'partition': current, 'reference': reference_distribution,
           'psi': None, 'judged': None, 'min_documents': None,
           'not_judged': {}, 'alert': False, 'alert_threshold': PSI_ALERT}
  if not reference_distribution or not current['documents']:
    return drift
  names = list(current['label_shares'])
  by_label = psi_terms(
      [current['label_shares'][name] for name in names],
      [reference_distribution['label_shares'].get(name, 0.0)
       for name in names])
  confidence = psi_terms(
      current['confidence_histogram']['shares'],
      reference_distribution['confidence_histogram']['shares'])
  drift['psi'] = {
      'labels': sum(by_label),
      'by_label': dict(zip(names, by_label)),
      'confidence': sum(confidence),
  }
  drift['min_documents'] = {}
  drift['judged'] = {}
  for name, bins in (('labels', len(by_label)),
                     ('confidence', len(confidence))):
    needed = min_documents(bins, reference_distribution['documents'])
    drift['min_documents'][name] = needed
    drift['judged'][name] = bool(needed) and current['documents'] >= needed
    if not drift['judged'][name]:
      drift['not_judged'][name] = _not_judged(
          bins, current['documents'], reference_distribution['documents'],
          needed)
  drift['alert'] = any(drift['psi'][name] > PSI_ALERT
                       for name, judged in drift['judged'].items() if judged)
  return drift


def plot(drift: Dict) -> Optional[bytes]:
  """A PNG of the partition's distributions beside the reference's; None,
  with a logged note, where matplotlib (the trainer extra) is missing."""
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')  # files only, no display
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
  except ImportError:
    logging.info('drift: no matplotlib here (the trainer extra), so no '
                 'report image; the manifest has the figures')
    return None
  figure, axes = pyplot.subplots(1, 2, figsize=(10, 4))
  _draw(drift, *axes)
  figure.tight_layout()
  buffer = io.BytesIO()
  figure.savefig(buffer, format='png', dpi=100)
  pyplot.close(figure)
  return buffer.getvalue()


def _draw(drift: Dict, label_axes, confidence_axes) -> None:
  """Bars of label shares and of confidence bins, a colour for each side;
  each side's share of a label drawn at that label, whatever order the
  side lists its labels in."""
  sides = [('partition', drift['partition'])]
  if drift['reference']:
    sides.append(('test split', drift['reference']))
  names = list(drift['partition']['label_shares'])
  width = 0.8 / len(sides)
  for offset, (name, side) in enumerate(sides):
    shares = [side['label_shares'].get(label, 0.0) for label in names]
    label_axes.bar(np.arange(len(shares)) + offset * width, shares, width,
                   label=name)
    shares = side['confidence_histogram']['shares']
    confidence_axes.bar(np.arange(len(shares)) + offset * width, shares,
                        width, label=name)
  label_axes.set_xticks(np.arange(len(names)) + width / 2, names)
  edges = drift['partition']['confidence_histogram']['edges']
  confidence_axes.set_xticks(np.arange(len(edges) - 1) + width / 2,
                             [f'{low:.1f}' for low in edges[:-1]])
  psi = drift['psi'] or {}
  for axes, title, key in ((label_axes, 'predicted label', 'labels'),
                           (confidence_axes, 'confidence', 'confidence')):
    if key not in psi:
      axes.set_title(title)
    elif key in drift['not_judged']:
      axes.set_title(f'{title} (PSI {psi[key]:.3f}, too few documents to '
                     'judge)')
    else:
      axes.set_title(f'{title} (PSI {psi[key]:.3f})')
    axes.set_ylabel('share of documents')
    axes.legend()
  confidence_axes.set_xlabel('bins from')
