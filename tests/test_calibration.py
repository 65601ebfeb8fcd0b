"""Temperature scaling, branch weights, expected calibration error."""
import numpy as np
import pytest

from trainer import calibration


def test_expected_calibration_error_of_known_bins():
  # Two examples at confidence 0.9 (one right), two at 0.6 (both right).
  probabilities = np.array([[0.9, 0.1], [0.1, 0.9], [0.6, 0.4], [0.4, 0.6]])
  labels = np.array([0, 0, 0, 1])
  assert calibration.expected_calibration_error(
      probabilities, labels) == pytest.approx(0.5 * 0.4 + 0.5 * 0.4)
  perfect = np.array([[1.0, 0.0], [0.0, 1.0]])
  assert calibration.expected_calibration_error(
      perfect, np.array([0, 1])) == pytest.approx(0.0)


def over_confident(examples=20000, seed=0):
  """Logits five times too large for the labels they were drawn from."""
  rng = np.random.RandomState(seed)
  true_logits = rng.normal(scale=2.0, size=(examples, 3))
  labels = np.array([rng.choice(3, p=p)
                     for p in calibration.softmax(true_logits)])
  return 5.0 * true_logits, labels


def test_temperature_scaling_fixes_an_over_confident_model():
  logits, labels = over_confident()
  (scale,) = calibration.fit_scales(logits[:, None, :], labels)
  assert 1.0 / scale == pytest.approx(5.0, rel=0.05)
  # Fitted on one sample, judged on another.
  test_logits, test_labels = over_confident(seed=1)
  before = calibration.softmax(test_logits)
  after = calibration.softmax(test_logits * scale)
  ece_before = calibration.expected_calibration_error(before, test_labels)
  ece_after = calibration.expected_calibration_error(after, test_labels)
  assert ece_before > 0.15
  assert ece_after < 0.02
  np.testing.assert_array_equal(before.argmax(axis=1), after.argmax(axis=1))
  # What the report computes back from served probabilities.
  np.testing.assert_allclose(calibration.uncalibrated(after, 1.0 / scale),
                             before, atol=1e-6)


def test_branch_scales_weight_the_informative_branch():
  logits, labels = over_confident()
  noise = np.random.RandomState(2).normal(scale=3.0, size=logits.shape)
  scales = calibration.fit_scales(np.stack([noise, logits], axis=1), labels)
  assert scales[0] < 0.01
  assert scales[1] == pytest.approx(0.2, rel=0.05)


def test_held_out_examples_all_right_warrant_platts_confidence_not_more():
  # 30 and 10 examples, each right by the same margin: at any temperature
  # the NLL of one-hot labels falls as it shrinks, without a minimum.
  labels = np.repeat([0, 1], [30, 10])
  logits = np.where(np.eye(2, dtype=bool)[labels], 1.0, -1.0)[:, None, :]
  (scale,) = calibration.fit_scales(logits, labels)
  assert calibration.fit_scales(logits, labels, iterations=500)[0] == (
      pytest.approx(scale))
  sure = calibration.softmax(logits[:, 0] * scale)[np.arange(40), labels]
  # Between the targets of the two classes, 31/32 and 11/12.
  assert 11 / 12 < sure.mean() < 31 / 32
  # One wrong answer: the labels' own minimum, as before.
  labels[0] = 1
  (wrong,) = calibration.fit_scales(logits, labels)
  expected = np.log(39 / 1) / 2  # p(right) = 39/40 at the minimum
  assert wrong == pytest.approx(expected, rel=1e-4)


def test_platt_targets_sum_to_one_and_follow_each_class_size():
  targets = calibration.platt_targets(np.array([0, 0, 2]), 3)
  np.testing.assert_allclose(targets.sum(axis=1), 1.0)
  np.testing.assert_allclose(targets[0], [3 / 4, 1 / 8, 1 / 8])
  np.testing.assert_allclose(targets[2], [1 / 6, 1 / 6, 2 / 3])
