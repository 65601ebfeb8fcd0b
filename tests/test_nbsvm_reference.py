"""The benchmarks' published-NBSVM anchor: the recipe fitted on the splits
named, reported on the others after every epoch."""
import numpy as np
import pytest

from bench import nbsvm_reference

pytest.importorskip('sklearn')


def corpus(count, seed):
  """Reviews whose label a bigram decides ('not good' against 'very
  good'), among words that say nothing."""
  rng = np.random.default_rng(seed)
  texts, labels = [], []
  for _ in range(count):
    negative = rng.random() < 0.5
    filler = ' '.join(f'w{i}' for i in rng.integers(0, 50, 6))
    texts.append(f"{filler} the film was {'not' if negative else 'very'} "
                 f'good {filler}')
    labels.append(0.0 if negative else 1.0)
  return texts, np.array(labels, np.float32)


@pytest.fixture(name='splits')
def splits_fixture():
  return {'train': corpus(1500, 0), 'validation': corpus(200, 1),
          'test': corpus(300, 2)}


def test_fitted_on_train_it_reports_validation_and_test_every_epoch(splits):
  run = nbsvm_reference.recipe_run(nbsvm_reference.RECIPES['published'],
                                   splits, ('train',), seed=0)
  assert run['train_reviews'] == 1500
  assert len(run['accuracy_by_epoch']) == nbsvm_reference.EPOCHS
  assert all(set(epoch) == {'validation', 'test'}
             for epoch in run['accuracy_by_epoch'])
  assert run['accuracy_by_epoch'][-1] == {'validation': 1.0, 'test': 1.0}


def test_fitted_on_train_and_validation_it_reports_test_alone(splits):
  run = nbsvm_reference.recipe_run(nbsvm_reference.RECIPES['min_count_16'],
                                   splits, ('train', 'validation'), seed=0)
  assert run['train_reviews'] == 1700
  assert all(set(epoch) == {'test'} for epoch in run['accuracy_by_epoch'])
  assert run['accuracy_by_epoch'][-1]['test'] == 1.0


def test_cross_validated_reads_each_held_out_fold_after_every_epoch(
    synthetic_preprocessed):
  run = nbsvm_reference.cross_validated(
      {'min_df': 2}, str(synthetic_preprocessed), 3, 0, 'token_ids')
  assert run['folds'] == 3
  assert len(run['held_out_by_epoch']) == nbsvm_reference.EPOCHS
  # The synthetic reviews' cue words give the label away.
  assert run['held_out_by_epoch'][-1] > 0.9
