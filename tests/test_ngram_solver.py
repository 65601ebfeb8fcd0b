"""The n-gram branch fitted by the convex solver: the minimum it finds, the
layer it fills serving the logits it fitted, and the trainer's defaults on
a small corpus (the hybrid reduced to that branch, chosen by the folds)."""
import logging

import keras
import numpy as np
from scipy import optimize

from serving import exports
from tests.conftest import assert_float32_close
from trainer import evaluate
from trainer import model as model_lib
from trainer import ngram_solver
from trainer import ngrams
from trainer import selection
from trainer import settings as settings_lib
from trainer import train

CLASSES = 3


def corpus(documents=60, length=12, vocab=40, seed=0):
  """Token ids (0 pads) whose class shows in which ids they hold, and
  their labels."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, CLASSES, documents)
  token_ids = rng.integers(2, vocab, (documents, length))
  token_ids[:, :3] = (labels * 3 + 2)[:, None] + rng.integers(0, 3, (
      documents, 3))
  token_ids[rng.random((documents, length)) < 0.2] = 0  # some padding
  return token_ids.astype(np.int64), labels.astype(np.int64)


def design_of(token_ids, labels, min_count=2):
  table = ngrams.DocumentNgrams.fit([(token_ids, labels)], max_order=2)
  vocabulary = table.vocabulary(CLASSES, min_count=min_count)
  rows = np.arange(len(labels))
  return table, vocabulary, ngram_solver.Design.of(table, rows, vocabulary)


def test_the_gradient_is_the_objectives_and_zero_at_each_solution():
  _, _, design = design_of(*corpus())
  one_hot = np.eye(CLASSES)[design.labels]
  width = design.holds.shape[1]
  for strength in (1.0, 0.01):
    objective = ngram_solver._penalised_loss(design, one_hot, strength)  # pylint: disable=protected-access
    point = np.random.default_rng(1).normal(0, 0.3, 1 + width + CLASSES)
    error = optimize.check_grad(lambda x: objective(x)[0],
                                lambda x: objective(x)[1], point)
    assert error < 1e-5 * max(1.0, np.abs(objective(point)[1]).max())
    solution = ngram_solver.solve(design, strength)
    at = np.concatenate([[0.0], solution.kernel, solution.bias])
    # Any split of the kernel into common weight and offsets: the one
    # whose offsets average zero is where the penalty is least.
    common = solution.kernel.mean()
    at[0], at[1:width + 1] = common, solution.kernel - common
    assert np.abs(objective(at)[1]).max() < 1e-4


def test_the_path_fits_closer_as_the_penalty_weakens_from_naive_bayes():
  _, _, design = design_of(*corpus())
  solutions = list(ngram_solver.solve_path(design))
  assert [s.strength for s in solutions] == list(ngram_solver.STRENGTHS)
  losses = [s.loss for s in solutions]
  assert all(later <= earlier + 1e-9
             for earlier, later in zip(losses, losses[1:]))
  strongest, weakest = solutions[0].kernel, solutions[-1].kernel
  # The strongest penalty leaves every n-gram nearly the common weight:
  # Naive Bayes, scaled.
  assert strongest.std() < 0.1 * abs(strongest.mean())
  assert weakest.std() > 5 * strongest.std()


def test_the_layer_it_fills_serves_the_logits_it_fitted():
  token_ids, labels = corpus(seed=2)
  table, vocabulary, design = design_of(token_ids, labels)
  solution = ngram_solver.solve(design, 0.1)
  keras.utils.set_random_seed(0)
  model = model_lib.build_model(
      50, token_ids.shape[1], CLASSES,
      model_lib.ModelParams(model='nbsvm', ngram_order=2), vocabulary)
  layer = model.get_layer(model_lib.NGRAM_LOGITS)
  solution.set_layer_weights(layer)
  served = np.asarray(layer(token_ids))
  assert_float32_close(served, solution.logits(design))
  # Held-out documents: n-grams the vocabulary lacks count for nothing.
  unseen, unseen_labels = corpus(documents=20, seed=3)
  both = ngrams.DocumentNgrams.fit([(token_ids, labels),
                                    (unseen, unseen_labels)], max_order=2)
  held_out = ngram_solver.Design.of(both, np.arange(60, 80), vocabulary)
  assert_float32_close(np.asarray(layer(unseen)), solution.logits(held_out))
  del table


def test_a_small_corpus_trains_in_seconds_as_its_ngram_branch_alone(
    synthetic_preprocessed, tmp_path, capfd, caplog):
  caplog.set_level(logging.INFO)
  metrics, export_dir = train.run([
      f'--data_dir={synthetic_preprocessed}', f'--model_dir={tmp_path}',
      '--folds=3'])
  training = exports.read_metadata(export_dir)['training']
  assert training['model'] == 'nbsvm'
  choices = training['choices']
  assert '--transformer_min_examples=' in choices['transformer_skipped']
  assert choices['ngram_fit'] == 'convex'
  folds = choices['cross_validation']
  assert set(folds['epochs']) == {model_lib.NGRAM_LOGITS}
  chosen = folds['settings'][model_lib.NGRAM_LOGITS]
  assert chosen == {'ngram_min_count': choices['ngram_min_count'],
                    'ngram_penalty': choices['ngram_penalty']}
  tried = folds['tried'][model_lib.NGRAM_LOGITS]
  # Every count, each along the path until it stops improving.
  counts = {c['setting']['ngram_min_count'] for c in tried}
  assert len(counts) > 1
  best = max(c['mean'] for c in tried)
  assert next(c for c in tried if c['mean'] == best)['setting'] == chosen
  assert metrics['selected_on'] == selection.CROSS_VALIDATION
  assert metrics['test']['accuracy'] > 0.9
  report = (tmp_path / evaluate.REPORT_FILE).read_text()
  assert report.count('| yes |') == 1
  assert 'fitted as its n-gram branch alone' in report
  assert ("and the n-gram minimum count and the n-gram branch's penalty"
          in report)
  assert 'fitted by a convex solver' in report
  assert 'Epoch 1/' not in capfd.readouterr().out
  assert 'fitted by the convex solver' in caplog.text
  assert settings_lib.TRANSFORMER_MIN_EXAMPLES > folds['examples']
