"""Benchmark: the trainer's peak memory as the corpus grows, with the n-gram
counts read from the preprocessing job's statistics and counted in the
trainer's memory.

For each --docs size, the corpus ``bench/preprocess.py`` makes (IMDB's
reviews repeated with new ids, the official split kept) is preprocessed
once; then, as whole processes, the trainer fits the n-gram branch by
Keras epochs, streaming its splits from their files (``--cache=none``),
once reading the statistics and once on a copy of the output without
them, where it counts every train document's n-grams in memory first, as
it did before the job counted them. The branch and its flags are the same
in both arms, so the exports are too (the benchmark checks their test
accuracy agrees to 0.1 point); the arms differ in where the counts come
from.

``--arms=folds`` adds the same branch chosen by 3-fold cross-validation
and refitted on train + validation (one count, one epoch a fold): each
fold reads its part from the files and takes its counts from the
statistics less what it holds out, so its peak should follow the ``read``
arm's, not the corpus.

``--arms=defaults`` adds the trainer as a user first runs it, with no
flag: both branches, each chosen on validation, the corpus cached as its
memory budget allows; ``--arms=streamed`` the same with ``--cache=none``,
every epoch read from the files, what a corpus past that budget gets.

Beside them, the TF-IDF + logistic regression baseline (``bench/tfidf.py``,
C chosen on validation) on the same splits, also as a whole process.

    python bench/train_memory.py [--docs=50000,200000]
        [--arms=read,counted,folds,defaults,streamed,tfidf] [--cache DIR]
        [--work DIR]

``--arms=read`` leaves out counting in memory and the baseline, which at a
million documents need more memory than the benchmark's machine may have.
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import argument_parser  # pylint: disable=wrong-import-position
from common import machine  # pylint: disable=wrong-import-position
from common import run_process  # pylint: disable=wrong-import-position
from preprocess import write_jsonl  # pylint: disable=wrong-import-position

# One epoch of the n-gram branch alone, streamed: the cost that follows the
# corpus is the counting, which is what the arms differ in.
TRAIN_FLAGS = ['--model=nbsvm', '--ngram_fit=epochs', '--folds=0',
               '--ngram_epochs=1', '--cache=none']
ACCURACY_TOLERANCE = 0.001
# The folds arm: cross-validation at one count, one epoch a fold, and the
# refit on train + validation.
FOLD_FLAGS = ['--model=nbsvm', '--ngram_fit=epochs', '--folds=3', '--refit',
              '--ngram_min_count=8', '--ngram_epochs=1', '--cache=none']
ARMS = ('read', 'counted', 'folds', 'defaults', 'streamed', 'tfidf')


def without_statistics(data_dir: str, copy: str) -> str:
  """A copy of the preprocessing output as a job that did not count n-grams
  wrote it."""
  from schemas import transformed  # pylint: disable=import-outside-toplevel
  shutil.rmtree(copy, ignore_errors=True)
  shutil.copytree(data_dir, copy, ignore=shutil.ignore_patterns(
      f'{transformed.NGRAM_FILE_PREFIX}-*'))
  stats_path = os.path.join(copy, transformed.STATS_FILE)
  with open(stats_path, encoding='utf-8') as handle:
    stats = json.load(handle)
  del stats[transformed.NGRAMS_STATS]
  with open(stats_path, 'w', encoding='utf-8') as handle:
    json.dump(stats, handle)
  return copy


def train_arm(data_dir: str, model_dir: str, flags=tuple(TRAIN_FLAGS)
              ) -> dict:
  shutil.rmtree(model_dir, ignore_errors=True)
  wall, peak = run_process([sys.executable, '-m', 'trainer.train',
                            f'--data_dir={data_dir}',
                            f'--model_dir={model_dir}', *flags])
  with open(os.path.join(model_dir, 'metrics.json'),
            encoding='utf-8') as handle:
    accuracy = json.load(handle)['test']['accuracy']
  return {'wall_s': round(wall, 1), 'peak_mib': round(peak),
          'test_accuracy': accuracy}


def tfidf_arm(corpus: str) -> dict:
  """The baseline on the corpus's splits, assigned as the preprocessing job
  assigns them, as a process of its own (its peak apart from ours)."""
  result = corpus + '.tfidf.json'
  bench = os.path.dirname(os.path.abspath(__file__))
  wall, peak = run_process([sys.executable, '-c', (
      'import json, sys\n'
      f'sys.path.insert(0, {bench!r})\n'
      'import train\n'
      'policy = train.split_policy(["--split_field=split"])\n'
      f'splits = train.corpus_splits({os.path.dirname(corpus)!r}, "imdb", '
      f'{os.path.basename(corpus)!r}, policy)\n'
      f'json.dump(train.tfidf_baseline(splits), open({result!r}, "w"))\n')])
  with open(result, encoding='utf-8') as handle:
    figures = json.load(handle)
  return {'wall_s': round(wall, 1), 'peak_mib': round(peak),
          'test_accuracy': round(figures['test_accuracy'], 4),
          'c': figures['c']}


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--docs', default='50000,200000',
                      help='Corpus sizes, comma-separated.')
  parser.add_argument('--arms', default='read,counted,tfidf',
                      help='Comma-separated: the trainer with the n-gram '
                      'counts read from the statistics (read) or counted '
                      'in its memory (counted), chosen by cross-validation '
                      '(folds), with no flag (defaults), with no flag but '
                      '--cache=none (streamed), the baseline (tfidf).')
  args = parser.parse_args()
  chosen = set(args.arms.split(','))
  if not chosen or chosen - set(ARMS):
    parser.error(f'--arms: some of {", ".join(ARMS)}, not {args.arms}')
  work = args.work or tempfile.mkdtemp(prefix='bench-train-memory-')
  print(f'machine: {machine()}', flush=True)
  run_process([sys.executable, '-m', 'pipeline.datasets', 'fetch', 'imdb',
               '--dest', work, '--cache', args.cache])
  results = {}
  for documents in (int(size) for size in args.docs.split(',')):
    corpus = os.path.join(work, f'corpus-{documents}.jsonl')
    write_jsonl(os.path.join(work, 'aclImdb'), corpus, documents)
    data_dir = os.path.join(work, f'preprocessed-{documents}')
    run_process([sys.executable, '-m', 'pipeline.preprocess',
                 f'--input={corpus}', f'--output_dir={data_dir}',
                 '--split_field=split', '--overwrite'])
    arms = {}
    if 'read' in chosen:
      arms['statistics read'] = train_arm(
          data_dir, os.path.join(work, f'model-read-{documents}'))
    if 'counted' in chosen:
      arms['counted in memory'] = train_arm(
          without_statistics(data_dir,
                             os.path.join(work, f'counted-{documents}')),
          os.path.join(work, f'model-counted-{documents}'))
    accuracies = [arm['test_accuracy'] for arm in arms.values()]
    if 'folds' in chosen:  # another model: its accuracy is its own
      arms['cross-validated'] = train_arm(
          data_dir, os.path.join(work, f'model-folds-{documents}'),
          FOLD_FLAGS)
    if 'defaults' in chosen:
      arms['defaults'] = train_arm(
          data_dir, os.path.join(work, f'model-defaults-{documents}'), ())
    if 'streamed' in chosen:
      arms['defaults, streamed'] = train_arm(
          data_dir, os.path.join(work, f'model-streamed-{documents}'),
          ('--cache=none',))
    if 'tfidf' in chosen:
      arms['tf-idf + logistic regression'] = tfidf_arm(corpus)
    # The same model either way, up to the order of float32 sums.
    if accuracies and max(accuracies) - min(accuracies) > ACCURACY_TOLERANCE:
      sys.exit(f'{documents} documents: the arms\' exports differ on test: '
               f'{arms}')
    results[documents] = arms
    print(documents, json.dumps(arms), flush=True)
  print(json.dumps(results, indent=2))


if __name__ == '__main__':
  main()
