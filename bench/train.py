"""Benchmark: the trainer on IMDB, SpamAssassin and SMS, against TF-IDF.

For each corpus: fetch it (from the dataset cache), run the preprocessing
job, train with the trainer, and read the metrics the trainer computed by
serving its export over the eval split. In the same run, the anchor: a
TF-IDF bag-of-bigrams logistic regression (Keras TextVectorization
``tf_idf`` + one Dense layer) on exactly the same train/eval split.

    python bench/train.py [--only imdb_seed,imdb_best,spamassassin,sms]
"""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import argument_parser  # pylint: disable=wrong-import-position
from common import machine  # pylint: disable=wrong-import-position
from common import run_process  # pylint: disable=wrong-import-position

# name: (corpus, input below the corpus folder, preprocess flags, train flags)
RUNS = {
    'imdb_seed': ('imdb', '', ['--vocab_size=20000', '--max_len=200',
                               '--drop_punctuation'],
                  ['--epochs=2', '--decay']),
    'imdb_best': ('imdb', '', ['--vocab_size=30000', '--max_len=512',
                               '--drop_punctuation'], [
        '--epochs=4', '--decay', '--bigram_buckets=100000',
        '--token_dropout=0.5', '--bucket_width=64', '--monitor=val_accuracy',
        '--patience=4']),
    'spamassassin': ('spamassassin', '*/*', [
        '--format=email', '--eval_fraction=0.2', '--max_len=400'], [
            '--epochs=10', '--decay', '--learning_rate=2e-3',
            '--bigram_buckets=100000', '--token_dropout=0.25',
            '--bucket_width=64', '--monitor=val_accuracy', '--patience=4']),
    'sms': ('sms', 'sms.csv', ['--eval_fraction=0.2', '--max_len=100'], [
        '--epochs=10', '--decay', '--learning_rate=2e-3',
        '--bigram_buckets=50000', '--token_dropout=0.5', '--bucket_width=32',
        '--monitor=val_accuracy', '--patience=4']),
}


def tfidf_baseline(corpus_dir: str, corpus: str, input_pattern: str) -> dict:
  """TF-IDF bigram logistic regression on our train/eval split of a corpus."""
  # Imported here: the parent process stays light while the jobs run.
  import glob  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import keras  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from pipeline import readers  # pylint: disable=import-outside-toplevel
  from pipeline.preprocess import hash_split  # pylint: disable=import-outside-toplevel
  from schemas import raw  # pylint: disable=import-outside-toplevel

  if corpus == 'sms':
    import csv  # pylint: disable=import-outside-toplevel
    with open(os.path.join(corpus_dir, input_pattern), encoding='utf-8') as f:
      rows = [(r['text'], r['label'], None) for r in csv.DictReader(f)]
  else:
    config = readers.ReadConfig(format='email' if corpus == 'spamassassin'
                                else 'files')
    paths = glob.glob(os.path.join(corpus_dir, input_pattern or '*/*/*'))
    rows = []
    for path in paths:
      record = readers.read_document(path, config, corpus == 'spamassassin')
      rows.append((record[raw.TEXT], record[raw.LABEL], record[raw.SPLIT]))
  splits = {raw.TRAIN: ([], []), raw.EVAL: ([], [])}
  names = sorted({label for _, label, _ in rows})
  for text, label, split in rows:
    if not text.strip():
      continue
    split = raw.SPLIT_ALIASES[split] if split else hash_split(text, 0.2)
    splits[split][0].append(text)
    splits[split][1].append(names.index(label))
  started = time.time()
  vectorizer = keras.layers.TextVectorization(
      max_tokens=100000, ngrams=2, output_mode='tf_idf')
  train_texts, train_labels = splits[raw.TRAIN]
  vectorizer.adapt(tf.data.Dataset.from_tensor_slices(train_texts).batch(512))
  inputs = keras.Input(shape=(vectorizer.vocabulary_size(),))
  classifier = keras.Model(inputs, keras.layers.Dense(
      len(names), activation='softmax')(inputs))
  classifier.compile(optimizer=keras.optimizers.Adam(1e-2),
                     loss='sparse_categorical_crossentropy')
  train_ds = tf.data.Dataset.from_tensor_slices(
      (train_texts, train_labels)).shuffle(len(train_texts), seed=1).batch(
          64).map(lambda texts, labels: (vectorizer(texts), labels))
  classifier.fit(train_ds, epochs=10, verbose=0)
  eval_texts, eval_labels = splits[raw.EVAL]
  probabilities = classifier.predict(
      tf.data.Dataset.from_tensor_slices(eval_texts).batch(64).map(
          vectorizer), verbose=0)
  predictions = probabilities.argmax(axis=1)
  eval_labels = np.array(eval_labels)
  result = {'accuracy': float((predictions == eval_labels).mean()),
            'seconds': round(time.time() - started, 1),
            'train': len(train_texts), 'eval': len(eval_texts)}
  if 'spam' in names:
    spam = names.index('spam')
    tp = int(((predictions == spam) & (eval_labels == spam)).sum())
    precision = tp / max(int((predictions == spam).sum()), 1)
    recall = tp / max(int((eval_labels == spam).sum()), 1)
    result['spam_f1'] = 2 * precision * recall / max(precision + recall, 1e-9)
  return result


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--only', default=','.join(RUNS))
  args = parser.parse_args()
  work = args.work or tempfile.mkdtemp(prefix='bench-train-')
  python = sys.executable
  print(f'machine: {machine()}', flush=True)
  results = {}
  for name in args.only.split(','):
    corpus, pattern, preprocess_flags, train_flags = RUNS[name]
    run_process([python, '-m', 'pipeline.datasets', 'fetch', corpus, '--dest',
                 work, '--cache', args.cache])
    corpus_dir = os.path.join(work, {'imdb': 'aclImdb'}.get(corpus, corpus))
    data_dir = os.path.join(work, 'runs', name, 'preprocessed')
    model_dir = os.path.join(work, 'runs', name, 'model')
    run_process([python, '-m', 'pipeline.preprocess',
                 f'--input={os.path.join(corpus_dir, pattern)}'.rstrip('/'),
                 f'--output_dir={data_dir}'] + preprocess_flags)
    wall, peak = run_process([python, '-m', 'trainer.train',
                              f'--data_dir={data_dir}',
                              f'--model_dir={model_dir}'] + train_flags)
    with open(os.path.join(model_dir, 'metrics.json')) as handle:
      metrics = json.load(handle)
    exported = os.path.join(model_dir, 'export')
    with open(os.path.join(exported, sorted(os.listdir(exported))[-1],
                           'assets.extra', 'metadata.json')) as handle:
      training = json.load(handle)['training']
    ours = {'accuracy': metrics['accuracy'], 'macro_f1': metrics['macro_f1'],
            'epochs_run': training['epochs_run'],
            'training_s': training['training_seconds'],
            'job_wall_s': round(wall, 1), 'peak_mib': round(peak)}
    if 'spam' in metrics['per_class']:
      ours['spam_f1'] = metrics['per_class']['spam']['f1']
    results[name] = {'preprocess': preprocess_flags, 'train': train_flags,
                     'ours': ours,
                     'tfidf_bigram_lr': tfidf_baseline(corpus_dir, corpus,
                                                       pattern)}
    print(name, json.dumps(results[name]), flush=True)
  print(json.dumps(results, indent=2))


if __name__ == '__main__':
  main()
