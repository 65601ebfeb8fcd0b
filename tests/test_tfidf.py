"""The benchmarks' TF-IDF baseline: C chosen on validation, test reported."""
import pytest

from bench import tfidf

pytest.importorskip('sklearn')


def corpus(count, flip_every=0):
  """Reviews whose label a bigram decides: 'not good' is negative although
  'good' alone is positive, so unigrams alone cannot fit it."""
  texts, labels = [], []
  for index in range(count):
    negative = index % 2 == 1
    if flip_every and index % flip_every == 0:
      negative = not negative
    words = ['film', f'w{index % 7}', 'was']
    words += ['not', 'good'] if negative else ['very', 'good']
    texts.append(' '.join(words))
    labels.append('neg' if negative else 'pos')
  return texts, labels


def test_baseline_picks_c_on_validation_and_reports_test():
  figures = tfidf.baseline(corpus(200), corpus(40, flip_every=5),
                           corpus(60), c_grid=(0.01, 1.0, 100.0))
  assert figures['c'] in (0.01, 1.0, 100.0)
  assert figures['chosen_on'] == tfidf.VALIDATION
  assert figures['fitted_on'] == 'train'
  assert figures['held_out_accuracy'] == max(
      figures['held_out_accuracy_by_c'].values())
  assert figures['test_accuracy'] == 1.0
  assert set(figures['test_f1']) == {'neg', 'pos'}
  assert figures['examples'] == {'train': 200, 'validation': 40, 'test': 60}


def test_baseline_cross_validated_picks_c_on_the_folds_and_refits():
  texts, labels = corpus(200)
  # One label in ten wrong, whatever the text says.
  noisy = [{'neg': 'pos', 'pos': 'neg'}[label] if index % 10 == 0 else label
           for index, label in enumerate(labels)]
  train, validation = (texts, noisy), corpus(40)
  figures = tfidf.baseline(train, validation, corpus(60),
                           c_grid=(0.01, 100.0), folds=4, refit=True)
  assert figures['chosen_on'] == tfidf.CROSS_VALIDATION
  assert figures['fitted_on'] == 'train+validation'
  # The folds read the wrong labels as errors, which the validation split
  # (all right) would not have.
  assert 0.85 <= figures['held_out_accuracy'] <= 0.95
  assert figures['held_out_accuracy'] == max(
      figures['held_out_accuracy_by_c'].values())
  assert figures['test_accuracy'] == 1.0
  with pytest.raises(ValueError, match='refit needs folds'):
    tfidf.baseline(train, validation, corpus(60), refit=True)


def test_baseline_labels_the_texts_it_is_also_asked_about():
  texts, labels = corpus(30)
  figures = tfidf.baseline(corpus(200), corpus(40), corpus(60),
                           c_grid=(1.0,), also_predict=texts)
  assert figures['also_predicted'] == labels
  assert 'also_predicted' not in tfidf.baseline(
      corpus(200), corpus(40), corpus(60), c_grid=(1.0,))
