"""Benchmark: the trainer on IMDB, SpamAssassin and SMS, against TF-IDF.

For each corpus: fetch it (from the dataset cache), run the preprocessing
job, train with the trainer, and read the metrics the trainer computed by
serving its export over the validation and test splits. In the same run,
the anchor: a TF-IDF bag-of-bigrams logistic regression (scikit-learn,
``bench/tfidf.py``, the ``bench`` extra) fitted on exactly the same train
split, its C chosen on the same validation split, measured on the same test
split.

The flags of each run are those of ``configs/<name>/preprocess.args`` and
``configs/<name>/train.args``, passed to the jobs as argument files.

    python bench/train.py [--only imdb_seed,imdb_best,spamassassin,sms]
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import argument_parser  # pylint: disable=wrong-import-position
from common import machine  # pylint: disable=wrong-import-position
from common import run_process  # pylint: disable=wrong-import-position

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'configs')
# name (a folder of configs/): (corpus, input below the corpus folder)
RUNS = {
    'imdb_seed': ('imdb', ''),
    'imdb_best': ('imdb', ''),
    'spamassassin': ('spamassassin', '*/*'),
    'sms': ('sms', 'sms.csv'),
}


def corpus_flags(corpus: str) -> list:
  """The preprocessing flags a corpus needs whatever the configuration:
  IMDB's validation is held out by blocks of movies (README, Splits)."""
  from pipeline import datasets  # pylint: disable=import-outside-toplevel
  return ([f'--group_pattern={datasets.IMDB_GROUP_PATTERN}']
          if corpus == 'imdb' else [])


def config_file(name: str, job: str) -> str:
  return os.path.join(CONFIGS, name, f'{job}.args')


def config_flags(name: str, job: str) -> list:
  """The flags of an argument file, one a line, as the job reads them."""
  with open(config_file(name, job), encoding='utf-8') as handle:
    return handle.read().splitlines()


def _split_policy(preprocess_flags: list) -> tuple:
  """--test_fraction, --validation_fraction and --group_pattern as the
  preprocessing job takes them from ``preprocess_flags``."""
  from pipeline import preprocess  # pylint: disable=import-outside-toplevel
  args, _ = preprocess.parse_args(['--input=-', '--output_dir=-',
                                   *preprocess_flags])
  return args.test_fraction, args.validation_fraction, args.group_pattern


def corpus_splits(corpus_dir: str, corpus: str, input_pattern: str,
                  policy: tuple) -> dict:
  """(texts, labels) of each split of a corpus, assigned as the
  preprocessing job assigns them (``policy``: the test and validation
  fractions, the group pattern)."""
  # Imported here: the parent process stays light while the jobs run.
  import glob  # pylint: disable=import-outside-toplevel
  from pipeline import readers  # pylint: disable=import-outside-toplevel
  from pipeline.preprocessing import splits as splits_lib  # pylint: disable=import-outside-toplevel
  from schemas import raw  # pylint: disable=import-outside-toplevel

  if corpus == 'sms':
    import csv  # pylint: disable=import-outside-toplevel
    with open(os.path.join(corpus_dir, input_pattern), encoding='utf-8') as f:
      rows = [(r['text'], r['label'], None, None) for r in csv.DictReader(f)]
  else:
    config = readers.ReadConfig(format='email' if corpus == 'spamassassin'
                                else 'files')
    paths = glob.glob(os.path.join(corpus_dir, input_pattern or '*/*/*'))
    grouping = splits_lib.Grouping(pattern=policy[2])
    rows = []
    for path in paths:
      record = readers.read_document(path, config, corpus == 'spamassassin')
      if raw.TEXT in record:  # else a dead letter, as in the job
        rows.append((record[raw.TEXT], record[raw.LABEL], record[raw.SPLIT],
                     grouping.group_of(record)))
  splits = {split: ([], []) for split in raw.SPLITS}
  for text, label, split, group in rows:
    if text.strip():
      split = splits_lib.assign_split(text, split, *policy[:2], group)
      splits[split][0].append(text)
      splits[split][1].append(label)
  return splits


def tfidf_baseline(splits: dict) -> dict:
  """The TF-IDF bag-of-bigrams logistic regression (bench/tfidf.py) on the
  job's own splits: C chosen on validation, reported on test."""
  import tfidf  # pylint: disable=import-outside-toplevel
  from schemas import raw  # pylint: disable=import-outside-toplevel
  return tfidf.baseline(splits[raw.TRAIN], splits[raw.VALIDATION],
                        splits[raw.TEST])


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--only', default=','.join(RUNS))
  args = parser.parse_args()
  work = args.work or tempfile.mkdtemp(prefix='bench-train-')
  python = sys.executable
  print(f'machine: {machine()}', flush=True)
  results, baselines = {}, {}
  for name in args.only.split(','):
    corpus, pattern = RUNS[name]
    run_process([python, '-m', 'pipeline.datasets', 'fetch', corpus, '--dest',
                 work, '--cache', args.cache])
    corpus_dir = os.path.join(work, {'imdb': 'aclImdb'}.get(corpus, corpus))
    data_dir = os.path.join(work, 'runs', name, 'preprocessed')
    model_dir = os.path.join(work, 'runs', name, 'model')
    run_process([python, '-m', 'pipeline.preprocess',
                 f'--input={os.path.join(corpus_dir, pattern)}'.rstrip('/'),
                 f'--output_dir={data_dir}',
                 f'@{config_file(name, "preprocess")}',
                 *corpus_flags(corpus)])
    wall, peak = run_process([python, '-m', 'trainer.train',
                              f'--data_dir={data_dir}',
                              f'--model_dir={model_dir}',
                              f'@{config_file(name, "train")}'])
    with open(os.path.join(model_dir, 'metrics.json')) as handle:
      metrics = json.load(handle)
    exported = os.path.join(model_dir, 'export')
    with open(os.path.join(exported, sorted(os.listdir(exported))[-1],
                           'assets.extra', 'metadata.json')) as handle:
      training = json.load(handle)['training']
    test = metrics['test']
    ours = {'selected_on': metrics['selected_on'],
            'validation_accuracy': metrics['validation']['accuracy'],
            'accuracy': test['accuracy'], 'macro_f1': test['macro_f1'],
            'epochs_run': training['epochs_run'],
            'training_s': training['training_seconds'],
            'job_wall_s': round(wall, 1), 'peak_mib': round(peak)}
    if 'spam' in test['per_class']:
      ours['spam_f1'] = test['per_class']['spam']['f1']
    preprocess_flags = config_flags(name, 'preprocess') + corpus_flags(corpus)
    # Configurations of one corpus with the same split policy share their
    # splits, and so the baseline: fitted once.
    split_key = (corpus, pattern, _split_policy(preprocess_flags))
    if split_key not in baselines:
      baselines[split_key] = tfidf_baseline(
          corpus_splits(corpus_dir, *split_key))
    results[name] = {'preprocess': preprocess_flags,
                     'train': config_flags(name, 'train'), 'ours': ours,
                     'tfidf_bigram_lr': baselines[split_key]}
    print(name, json.dumps(results[name]), flush=True)
  print(json.dumps(results, indent=2))


if __name__ == '__main__':
  main()
