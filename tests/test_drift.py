"""Drift measures: bins, the population stability index, the report image."""
import sys

import numpy as np
import pytest

from serving import drift
from serving import exports


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
  reference = distribution(500, 500, {9: 800, 8: 200})
  same = drift.compare(distribution(500, 500, {9: 800, 8: 200}), reference)
  assert same['psi']['labels'] == pytest.approx(0.0)
  assert same['psi']['confidence'] == pytest.approx(0.0)
  assert same['judged'] == {'labels': True, 'confidence': True}
  assert not same['alert'] and not same['not_judged']
  # 80 % of one class against 50 %: PSI 0.3 * ln(1.6) + 0.3 * ln(2.5).
  shifted = drift.compare(distribution(40, 160, {9: 160, 8: 40}), reference)
  assert shifted['psi']['labels'] == pytest.approx(
      0.3 * np.log(1.6) + 0.3 * np.log(2.5))
  assert shifted['psi']['by_label']['pos'] == pytest.approx(
      0.3 * np.log(1.6))
  assert shifted['alert']
  # Less sure, same labels: the confidence histogram raises it.
  unsure = drift.compare(distribution(150, 150, {5: 180, 9: 120}),
                         reference)
  assert unsure['psi']['confidence'] > drift.PSI_ALERT and unsure['alert']


def test_enough_documents_to_judge_a_psi_grow_with_its_bins():
  # B (1/n + 1/m) <= PSI_ALERT / 4: 20 documents a bin against a reference
  # large enough to count for nothing, more against a small one, and none
  # against one too small.
  assert drift.min_documents(10, 10**12) == 200
  assert drift.min_documents(2, 10**12) == 40
  assert drift.min_documents(10, 1000) == 250
  assert drift.min_documents(10, 200) is None


def test_too_few_documents_to_judge_are_no_alert_and_say_why():
  reference = distribution(5000, 5000, {9: 8000, 8: 1500, 7: 500})
  # Less sure: over the alert threshold, but on 100 documents, where two
  # samples of the same distribution often differ by as much.
  unsure = drift.compare(distribution(50, 50, {5: 60, 9: 40}), reference)
  assert unsure['psi']['confidence'] > drift.PSI_ALERT
  assert unsure['judged'] == {'labels': True, 'confidence': False}
  assert not unsure['alert']
  assert unsure['min_documents']['confidence'] == 205
  assert list(unsure['not_judged']) == ['confidence']
  assert unsure['not_judged']['confidence'].startswith(
      '100 documents against a reference of 10000: two samples of one '
      'distribution this size differ by a PSI of about 0.091 over 10 bins')
  assert unsure['not_judged']['confidence'].endswith(
      'judged from 205 documents')
  # A judged PSI still raises it beside one that is not.
  shifted = drift.compare(distribution(10, 90, {9: 100}), reference)
  assert shifted['judged'] == {'labels': True, 'confidence': False}
  assert shifted['alert']


def test_same_distribution_below_the_judged_size_raises_no_alert():
  """80 documents of the reference's own distribution: their confidence PSI
  is often over the threshold by chance alone, and never an alert."""
  rng = np.random.default_rng(0)
  shares = np.array([0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2,
                     0.22])
  reference = drift.distribution(
      ['neg', 'pos'], {'neg': 500, 'pos': 500},
      dict(enumerate(rng.multinomial(1000, shares).tolist())),
      drift.CONFIDENCE_EDGES)
  over = 0
  for _ in range(200):
    sample = drift.distribution(
        ['neg', 'pos'], {'neg': 40, 'pos': 40},
        dict(enumerate(rng.multinomial(80, shares).tolist())),
        drift.CONFIDENCE_EDGES)
    compared = drift.compare(sample, reference)
    over += compared['psi']['confidence'] > drift.PSI_ALERT
    assert not compared['alert']
  assert over > 20


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


def drawn_shares(drift_section):
  """What the report draws: each side's bar heights, by the label under
  each bar, read back from the figure's axes."""
  from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
  figure, axes = pyplot.subplots(1, 2)
  drift._draw(drift_section, *axes)  # pylint: disable=protected-access
  label_axes = axes[0]
  ticks = list(zip(label_axes.get_xticks(),
                   [text.get_text() for text in label_axes.get_xticklabels()]))
  drawn = {}
  for bars in label_axes.containers:
    drawn[bars.get_label()] = {
        min(ticks, key=lambda tick, bar=bar: abs(
            tick[0] - bar.get_x() - bar.get_width() / 2))[1]: bar.get_height()
        for bar in bars}
  pyplot.close(figure)
  return drawn


def test_the_report_draws_each_label_share_at_its_label():
  names = ['billing', 'outage', 'spam']
  current = drift.distribution(names, {'billing': 10, 'outage': 30,
                                       'spam': 60}, {9: 100},
                               drift.CONFIDENCE_EDGES)
  # The reference lists its labels in another order.
  reference = drift.distribution(['spam', 'billing', 'outage'], {
      'spam': 20, 'billing': 50, 'outage': 30}, {9: 100},
                                 drift.CONFIDENCE_EDGES)
  drawn = drawn_shares(drift.compare(current, reference))
  assert drawn == {
      'partition': {'billing': 0.1, 'outage': 0.3, 'spam': 0.6},
      'test split': {'billing': 0.5, 'outage': 0.3, 'spam': 0.2}}


@pytest.mark.parametrize('edit', [
    lambda r: r['confidence_histogram'].update(edges=[1.0, 0.5, 0.0],
                                               shares=[0.5, 0.5]),
    lambda r: r['confidence_histogram'].update(edges='abc'),
    lambda r: r['confidence_histogram'].update(shares=[0.5]),
    lambda r: r['confidence_histogram']['edges'].__setitem__(0, float('nan')),
    lambda r: r['label_shares'].pop('pos'),
    lambda r: r['label_shares'].update(pos='half'),
    lambda r: r.update(label_shares=None),
    lambda r: r.update(documents=0),
    lambda r: r.pop('documents'),
    # Shares of no whole: a false drift alert on every partition.
    lambda r: r['label_shares'].update(neg=1.0, pos=1.0),
    lambda r: r['confidence_histogram']['shares'].__setitem__(0, 0.5),
])
def test_an_edited_reference_is_no_reference(edit):
  found = drift.reference(['neg', 'pos'], np.array([[0.9, 0.1], [0.2, 0.8]]))
  assert drift.reference_problem(found, ['neg', 'pos']) is None
  edit(found)
  assert drift.reference_problem(found, ['neg', 'pos'])


def test_export_carries_the_test_split_reference(trained):
  _, metadata = exports.load(str(trained[0]))
  reference = metadata.reference
  assert reference['documents'] == 200  # the test split
  assert sorted(reference['label_shares']) == ['neg', 'pos']
  assert sum(reference['label_shares'].values()) == pytest.approx(1.0)
  histogram = reference['confidence_histogram']
  assert histogram['edges'] == list(drift.CONFIDENCE_EDGES)
  assert sum(histogram['shares']) == pytest.approx(1.0)
