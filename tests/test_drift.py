"""Drift measures: bins, the population stability index, the report image."""
import sys

import numpy as np
import pytest

from serving import drift


def test_confidence_bins_cover_zero_to_one():
  edges = drift.CONFIDENCE_EDGES
  assert len(edges) == 11
  assert drift.confidence_bins([0.0, 0.55, 0.6, 1.0], edges).tolist() == [
      0, 5, 6, 9]
  # The float32 nearest 0.7 lies below the edge 0.7, as Python compares
  # them (in float32 the two are equal).
  assert drift.confidence_bins(np.array([0.7], np.float32),
                               edges).tolist() == [6]


def test_reference_counts_predictions_of_the_eval_split():
  probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.35, 0.65],
                            [0.95, 0.05]])
  reference = drift.reference(['neg', 'pos'], probabilities)
  assert reference['documents'] == 4
  assert reference['label_shares'] == {'neg': 0.5, 'pos': 0.5}
  shares = reference['confidence_histogram']['shares']
  assert shares[6] == shares[8] == 0.25 and shares[9] == 0.5
  assert sum(shares) == pytest.approx(1.0)


def distribution(neg, pos, bins):
  return drift.distribution(['neg', 'pos'], {'neg': neg, 'pos': pos}, bins,
                            drift.CONFIDENCE_EDGES)


def test_same_distribution_is_no_drift_and_a_shift_is_an_alert():
  reference = distribution(50, 50, {9: 80, 8: 20})
  same = drift.compare(distribution(500, 500, {9: 800, 8: 200}), reference)
  assert same['psi']['labels'] == pytest.approx(0.0)
  assert same['psi']['confidence'] == pytest.approx(0.0)
  assert not same['alert']
  # 80 % of one class against 50 %: PSI 0.3 * ln(1.6) + 0.3 * ln(2.5).
  shifted = drift.compare(distribution(20, 80, {9: 80, 8: 20}), reference)
  assert shifted['psi']['labels'] == pytest.approx(
      0.3 * np.log(1.6) + 0.3 * np.log(2.5))
  assert shifted['psi']['by_label']['pos'] == pytest.approx(
      0.3 * np.log(1.6))
  assert shifted['alert']
  # Less sure, same labels: the confidence histogram raises it.
  unsure = drift.compare(distribution(50, 50, {5: 60, 9: 40}), reference)
  assert unsure['psi']['confidence'] > drift.PSI_ALERT and unsure['alert']


def test_nothing_to_compare_without_a_reference_or_documents():
  current = distribution(5, 5, {9: 10})
  assert drift.compare(current, None)['psi'] is None
  assert not drift.compare(current, None)['alert']
  assert drift.compare(distribution(0, 0, {}), current)['psi'] is None


def test_report_image_and_its_absence_without_matplotlib(monkeypatch):
  reference = distribution(50, 50, {9: 80, 8: 20})
  report = drift.compare(distribution(20, 80, {9: 80, 8: 20}), reference)
  assert drift.plot(report).startswith(b'\x89PNG')
  monkeypatch.setitem(sys.modules, 'matplotlib', None)
  assert drift.plot(report) is None


@pytest.mark.parametrize('edit', [
    lambda r: r['confidence_histogram'].update(edges=[1.0, 0.5, 0.0],
                                               shares=[0.5, 0.5]),
    lambda r: r['confidence_histogram'].update(edges='abc'),
    lambda r: r['confidence_histogram'].update(shares=[0.5]),
    lambda r: r['confidence_histogram']['edges'].__setitem__(0, float('nan')),
    lambda r: r['label_shares'].pop('pos'),
    lambda r: r['label_shares'].update(pos='half'),
    lambda r: r.update(label_shares=None),
    # Shares of no whole: a false drift alert on every partition.
    lambda r: r['label_shares'].update(neg=1.0, pos=1.0),
    lambda r: r['confidence_histogram']['shares'].__setitem__(0, 0.5),
])
def test_an_edited_reference_is_no_reference(edit):
  found = drift.reference(['neg', 'pos'], np.array([[0.9, 0.1], [0.2, 0.8]]))
  assert drift.reference_problem(found, ['neg', 'pos']) is None
  edit(found)
  assert drift.reference_problem(found, ['neg', 'pos'])
