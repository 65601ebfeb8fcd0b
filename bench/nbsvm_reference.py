"""The published NBSVM recipe on our IMDB splits: the anchor that
``configs/imdb_best`` is measured against.

A. Maiya's "neural NBSVM" in Keras reports 92.5 % on IMDB's official test
split, trained on the 25,000 official training reviews: scikit-learn's
``CountVectorizer(ngram_range=(1, 3), binary=True, token_pattern=r'\\w+',
max_features=800000)``, Naive Bayes ratios r from document counts, class
logit sum_j r[j] * w[j] over a review's n-grams, w started near zero, Adam
at 1e-3, batches of 32, three epochs. This runs that recipe (the model in
TensorFlow over sparse rows, not Keras) and the variant closest to the
trainer's n-gram branch (n-grams in at least 16 training reviews, punctuation
kept as tokens), each fitted twice: on the train split of
``configs/imdb_best`` (22,700 reviews, validation held out by movie blocks)
and on train + validation (the official 25,000). Accuracy is reported after
every epoch on validation and test: the published recipe fixes its epochs,
so nothing here is chosen on test; no figure of it chose anything for the
trainer.

    python bench/nbsvm_reference.py [--cache DIR] [--work DIR] [--seed N]
    python bench/nbsvm_reference.py --folds=3 --data_dir=PREPROCESSED --seed=42

The second runs each recipe in the trainer's grouped cross-validation over
the train split instead (its folds, seed 42 those of ``configs/imdb_best``),
on the raw reviews and on the preprocessing output's tokens: what
cross-validation, which never sees test, says of each.
"""
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import argument_parser  # pylint: disable=wrong-import-position
from common import machine  # pylint: disable=wrong-import-position
from common import split_arrays  # pylint: disable=wrong-import-position
import train as train_bench  # pylint: disable=wrong-import-position

# name: CountVectorizer's arguments beyond (1, 3)-grams, binary.
RECIPES = {
    'published': {'token_pattern': r'\w+', 'max_features': 800000},
    'min_count_16': {'token_pattern': r'\w+|[^\w\s]', 'min_df': 16},
}
EPOCHS, BATCH_SIZE, LEARNING_RATE = 3, 32, 1e-3


def imdb_splits(cache: str, work: str) -> dict:
  """(texts, 0/1 labels) of each split, as imdb_best's preprocessing
  assigns them."""
  from schemas import raw  # pylint: disable=import-outside-toplevel
  corpus_dir, pattern = train_bench.prepare_corpus('imdb', work, cache)
  flags = (train_bench.config_flags('imdb_best', 'preprocess') +
           train_bench.corpus_flags('imdb'))
  splits = train_bench.corpus_splits(corpus_dir, 'imdb', pattern,
                                     train_bench.split_policy(flags))
  return {split: (texts, np.array([label == 'pos' for label in labels],
                                  np.float32))
          for split, (texts, labels) in splits.items()
          if split in (raw.TRAIN, raw.VALIDATION, raw.TEST)}


def nbsvm_accuracies(train_x, train_y, evaluated: dict, seed: int) -> list:
  """Trains the neural NBSVM on sparse binary rows; after each epoch, the
  accuracy on each of ``evaluated`` ({name: (rows, labels)})."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  def sparse(rows):
    rows = rows.tocoo()
    return tf.SparseTensor(np.stack([rows.row, rows.col], 1).astype(np.int64),
                           rows.data, rows.shape)

  def document_rates(label):
    return (np.asarray(train_x[train_y == label].sum(0)).ravel() + 1) / (
        (train_y == label).sum() + 1)

  ratios = tf.constant(np.log(document_rates(1) / document_rates(0)),
                       tf.float32)
  size = train_x.shape[1]
  rng = np.random.default_rng(seed)
  weights = tf.Variable(rng.normal(0, np.sqrt(2 / (size + 2)), size),
                        dtype=tf.float32)
  optimizer = tf.keras.optimizers.Adam(LEARNING_RATE)

  def logits(rows):
    return tf.sparse.sparse_dense_matmul(rows, (ratios * weights)[:, None])[
        :, 0]

  @tf.function
  def step(rows, labels):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
          labels, logits(rows)))
    optimizer.apply_gradients([(tape.gradient(loss, weights), weights)])

  accuracies = []
  for _ in range(EPOCHS):
    order = rng.permutation(train_x.shape[0])
    for start in range(0, len(order), BATCH_SIZE):
      batch = order[start:start + BATCH_SIZE]
      step(sparse(train_x[batch]), tf.constant(train_y[batch]))
    accuracies.append({
        name: round(float(np.mean((logits(sparse(rows)).numpy() > 0) ==
                                  (labels == 1))), 4)
        for name, (rows, labels) in evaluated.items()})
  return accuracies


def recipe_run(recipe: dict, splits: dict, fitted_on: tuple,
               seed: int) -> dict:
  """One recipe fitted on the splits ``fitted_on``: its vocabulary size,
  seconds, and accuracy after each epoch on the splits it did not see."""
  from sklearn.feature_extraction import text  # pylint: disable=import-outside-toplevel
  started = time.time()
  vectorizer = text.CountVectorizer(ngram_range=(1, 3), binary=True,
                                    dtype=np.float32, **recipe)
  train_x = vectorizer.fit_transform(
      [doc for split in fitted_on for doc in splits[split][0]]).tocsr()
  train_y = np.concatenate([splits[split][1] for split in fitted_on])
  evaluated = {split: (vectorizer.transform(texts), labels)
               for split, (texts, labels) in splits.items()
               if split not in fitted_on}
  return {'n_grams': train_x.shape[1], 'train_reviews': train_x.shape[0],
          'accuracy_by_epoch': nbsvm_accuracies(train_x, train_y, evaluated,
                                                seed),
          'seconds': round(time.time() - started, 1)}


def cross_validated(recipe: dict, data_dir: str, folds: int, seed: int,
                    texts: str) -> dict:
  """One recipe in the trainer's grouped cross-validation over the train
  split of the preprocessing output ``data_dir`` (its folds, by movie
  block): the mean held-out accuracy after each epoch. ``texts`` is 'raw'
  (each review's file, which its id names) or 'token_ids' (the output's
  own tokens, as the trainer's n-gram branch sees them)."""
  from sklearn.feature_extraction import text  # pylint: disable=import-outside-toplevel
  from schemas import raw  # pylint: disable=import-outside-toplevel
  from trainer import data as data_lib  # pylint: disable=import-outside-toplevel
  from trainer import selection  # pylint: disable=import-outside-toplevel
  data = data_lib.PreprocessedData.load(data_dir)
  from schemas import transformed  # pylint: disable=import-outside-toplevel
  ids, token_ids, label_ids = split_arrays(
      data, (raw.TRAIN,), (transformed.ID, transformed.TOKEN_IDS,
                           transformed.LABEL_ID))
  if texts == 'raw':
    documents = [open(path.decode(), encoding='utf-8').read()
                 for path in ids]
  else:
    documents = [' '.join(map(str, row[row > 0])) for row in token_ids]
    recipe = {**recipe, 'token_pattern': r'\S+'}
  labels = (np.array(data.label_names)[label_ids] == 'pos').astype(
      np.float32)
  fold_of = selection.assign_folds(selection.fold_digests(
      selection.fold_keys(ids, token_ids, data.params), seed), folds)
  by_fold = []
  for fold in range(folds):
    fitted = fold_of != fold
    vectorizer = text.CountVectorizer(ngram_range=(1, 3), binary=True,
                                      dtype=np.float32, **recipe)
    train_x = vectorizer.fit_transform(
        [doc for doc, keep in zip(documents, fitted) if keep]).tocsr()
    held_out = vectorizer.transform(
        [doc for doc, keep in zip(documents, ~fitted) if keep])
    by_fold.append([epoch['held_out'] for epoch in nbsvm_accuracies(
        train_x, labels[fitted], {'held_out': (held_out, labels[~fitted])},
        seed)])
  return {'texts': texts, 'folds': folds,
          'held_out_by_epoch': np.round(np.mean(by_fold, axis=0), 4).tolist()}


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--folds', type=int, default=0,
                      help='With --data_dir: each recipe in the trainer\'s '
                      'grouped cross-validation over that output\'s train '
                      'split instead, on the raw reviews and on its tokens.')
  parser.add_argument('--data_dir', default=None,
                      help='An imdb_best preprocessing output (--folds).')
  args = parser.parse_args()
  from schemas import raw  # pylint: disable=import-outside-toplevel
  if args.folds:
    print(f'machine: {machine()}', flush=True)
    for name, recipe in RECIPES.items():
      for texts in ('raw', 'token_ids'):
        print(name, json.dumps(cross_validated(recipe, args.data_dir,
                                               args.folds, args.seed, texts)),
              flush=True)
    return
  splits = imdb_splits(args.cache,
                       args.work or tempfile.mkdtemp(prefix='bench-nbsvm-'))
  print(f'machine: {machine()}', flush=True)
  print('reviews', {split: len(texts) for split, (texts, _) in splits.items()})
  for name, recipe in RECIPES.items():
    for fitted_on in ((raw.TRAIN,), (raw.TRAIN, raw.VALIDATION)):
      print(name, '+'.join(fitted_on),
            json.dumps(recipe_run(recipe, splits, fitted_on, args.seed)),
            flush=True)


if __name__ == '__main__':
  main()
