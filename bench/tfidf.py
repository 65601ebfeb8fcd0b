"""The strong bag-of-bigrams baseline: TF-IDF + logistic regression.

scikit-learn's ``TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)``
and ``LogisticRegression``, the baseline of issue 10 (90.57 % on the
official IMDB split). The regularisation C is chosen on the validation
split from a small grid and the chosen model is reported on test once, so
the baseline follows the same protocol as the trainer. scikit-learn is in
the ``bench`` extra only: nothing at run time needs it.

    figures = tfidf.baseline((train_texts, train_labels),
                             (validation_texts, validation_labels),
                             (test_texts, test_labels))
"""
import time
from typing import Dict, Sequence, Tuple

import numpy as np

# Wide enough for IMDB (best near 10-30 with sublinear TF) and for the
# small spam corpora; each step costs one fit.
C_GRID = (1.0, 3.0, 10.0, 30.0, 100.0)

Split = Tuple[Sequence[str], Sequence]


def baseline(train: Split, validation: Split, test: Split,
             c_grid: Sequence[float] = C_GRID) -> Dict:
  """Fits on train, picks C on validation, reports on test.

  Labels may be of any hashable type; per-class F1 is keyed by their
  string form. ``seconds`` covers the vectorizer, every fit of the grid
  and the test predictions.
  """
  # Imported here: importing this module (the benchmark's parent process)
  # stays cheap, and the error names the extra when it is missing.
  try:
    from sklearn import feature_extraction  # pylint: disable=import-outside-toplevel
    from sklearn import linear_model  # pylint: disable=import-outside-toplevel
    from sklearn import metrics  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    raise ImportError('the TF-IDF baseline needs scikit-learn: pip install '
                      "'beam-text-classifier[bench]'") from error
  started = time.time()
  vectorizer = feature_extraction.text.TfidfVectorizer(ngram_range=(1, 2),
                                                       sublinear_tf=True)
  train_x = vectorizer.fit_transform(train[0])
  validation_x = vectorizer.transform(validation[0])
  scores = {}
  models = {}
  for c in c_grid:
    model = linear_model.LogisticRegression(C=c, max_iter=1000)
    model.fit(train_x, np.asarray(train[1]))
    scores[c] = float(model.score(validation_x, np.asarray(validation[1])))
    models[c] = model
  # The smallest C among equals: the most regularised of the best.
  chosen = max(c_grid, key=lambda c: (scores[c], -c))
  test_labels = np.asarray(test[1])
  predictions = models[chosen].predict(vectorizer.transform(test[0]))
  labels = models[chosen].classes_
  f1 = metrics.f1_score(test_labels, predictions, labels=labels, average=None)
  return {
      'c': chosen,
      'validation_accuracy_by_c': {str(c): scores[c] for c in c_grid},
      'validation_accuracy': scores[chosen],
      'test_accuracy': float((predictions == test_labels).mean()),
      'test_f1': {str(label): float(value) for label, value in
                  zip(labels, f1)},
      'features': len(vectorizer.vocabulary_),
      'examples': {'train': len(train[0]), 'validation': len(validation[0]),
                   'test': len(test[0])},
      'seconds': round(time.time() - started, 1),
  }
