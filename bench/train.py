"""Benchmark: the trainer on IMDB, SpamAssassin, SMS and short or small
corpora derived from IMDB, against TF-IDF.

For each run (a configuration on a corpus): fetch the corpus (from the
dataset cache), run the preprocessing job, train with the trainer, and read
the metrics the trainer computed by serving its export over the validation
and test splits. In the same run,
the anchor: a TF-IDF bag-of-bigrams logistic regression (scikit-learn,
``bench/tfidf.py``, the ``bench`` extra) fitted on exactly the same train
split, its C chosen as the trainer chose (on the same validation split, or
by as many folds of cross-validation over train, then refitted on train +
validation where the trainer was), measured on the same test split.

The flags of each run are those of ``configs/<name>/preprocess.args`` and
``configs/<name>/train.args``, passed to the jobs as argument files;
``defaults`` is no flags at all, the jobs' own defaults. A run is named
``configuration:corpus``; a configuration alone runs on its own corpus.
Corpora derived from IMDB, written as JSONL beside it: ``imdb_sentences``,
the first sentence of each review (about 20 words; the official split and
the movie groups kept), and ``imdb_2k``, 2,000 reviews of the official train
split with the whole official test split; ``tickets`` is the benchmarks'
own 500 support tickets (``bench/tickets.py``), or with --tickets_seed
another draw of them. Both models trained on the tickets are also judged on
30,000 fresh ones of the same make (none a text of the 500's), where a
difference of a point is no longer one ticket's.

    python bench/train.py [--only imdb_seed,defaults:imdb_sentences,...]
        [--tickets_seed=N]
"""
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import argument_parser  # pylint: disable=wrong-import-position
from common import machine  # pylint: disable=wrong-import-position
from common import run_process  # pylint: disable=wrong-import-position

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'configs')
# The configuration of the jobs' defaults: no flags.
DEFAULTS = 'defaults'
# name: (dataset fetched, input below its folder); a derived corpus's input
# is the JSONL file ``derive_corpus`` writes.
CORPORA = {
    'imdb': ('imdb', ''),
    'imdb_sentences': ('imdb', 'imdb_sentences.jsonl'),
    'imdb_2k': ('imdb', 'imdb_2k.jsonl'),
    'spamassassin': ('spamassassin', '*/*'),
    'sms': ('sms', 'sms.csv'),
    # The benchmarks' own 500 support tickets (bench/tickets.py), not
    # fetched.
    'tickets': (None, 'tickets.csv'),
}
# Each configuration of configs/ on its own corpus, then the defaults on
# every corpus.
OWN_CORPUS = {'imdb_seed': 'imdb', 'imdb_best': 'imdb',
              'spamassassin': 'spamassassin', 'sms': 'sms'}
RUNS = ([f'{name}:{corpus}' for name, corpus in OWN_CORPUS.items()] +
        [f'{DEFAULTS}:{corpus}' for corpus in CORPORA])
# Reviews of the official train split in imdb_2k, every n-th of them.
SMALL_TRAIN = 2000
# A sentence ends at . ! or ? and a space, once it holds 20 characters (not
# at "Mr." or "D.").
_SENTENCE = re.compile(r'\s*(.{20,}?[.!?])(?=\s|$)', re.DOTALL)
_LINE_BREAK = re.compile(r'<br\s*/?>', re.IGNORECASE)


def parse_run(run: str) -> tuple:
  """(configuration, corpus) of ``configuration[:corpus]``."""
  name, _, corpus = run.partition(':')
  corpus = corpus or OWN_CORPUS.get(name)
  if corpus not in CORPORA or (name != DEFAULTS and name not in OWN_CORPUS):
    sys.exit(f'unknown run {run!r}: configuration:corpus, a configuration '
             f'of {sorted(OWN_CORPUS) + [DEFAULTS]}, a corpus of '
             f'{sorted(CORPORA)}')
  return name, corpus


def corpus_flags(corpus: str) -> list:
  """The preprocessing flags a corpus needs whatever the configuration:
  SpamAssassin's files are emails; IMDB's validation is held out by blocks
  of movies (docs/splits-and-evaluation.md); the derived corpora name each record's
  split."""
  from pipeline import datasets  # pylint: disable=import-outside-toplevel
  if CORPORA[corpus][0] != 'imdb':
    return ['--format=email'] if corpus == 'spamassassin' else []
  named_split = ['--split_field=split'] if corpus != 'imdb' else []
  return [f'--group_pattern={datasets.IMDB_GROUP_PATTERN}', *named_split]


def config_file(name: str, job: str) -> str:
  return os.path.join(CONFIGS, name, f'{job}.args')


def config_flags(name: str, job: str) -> list:
  """The flags of an argument file, one a line, as the job reads them."""
  if name == DEFAULTS:
    return []
  with open(config_file(name, job), encoding='utf-8') as handle:
    return handle.read().splitlines()


def config_arguments(name: str, job: str) -> list:
  """What a job's command line names of the configuration."""
  return [] if name == DEFAULTS else [f'@{config_file(name, job)}']


def first_sentence(text: str) -> str:
  text = _LINE_BREAK.sub(' ', text)
  match = _SENTENCE.match(text)
  return ' '.join((match.group(1) if match else text).split())


def derive_corpus(corpus: str, imdb_dir: str, path: str) -> None:
  """Writes a corpus derived from IMDB as JSONL (id, text, label, split),
  the id the review's path, so that IMDB's movie groups still apply."""
  import glob  # pylint: disable=import-outside-toplevel
  from pipeline import readers  # pylint: disable=import-outside-toplevel
  from schemas import raw  # pylint: disable=import-outside-toplevel
  config = readers.ReadConfig(format='files')
  paths = sorted(glob.glob(os.path.join(imdb_dir, '*', '*', '*.txt')))
  if corpus == 'imdb_2k':
    train = [p for p in paths if f'{os.sep}train{os.sep}' in p]
    step = len(train) // SMALL_TRAIN
    paths = train[::step][:SMALL_TRAIN] + [
        p for p in paths if f'{os.sep}test{os.sep}' in p]
  with open(path + '.partial', 'w', encoding='utf-8') as out:
    for review in paths:
      record = readers.read_document(review, config, False)
      text = record[raw.TEXT]
      if corpus == 'imdb_sentences':
        text = first_sentence(text)
      out.write(json.dumps({'id': review, 'text': text,
                            'label': record[raw.LABEL],
                            'split': record[raw.SPLIT]}) + '\n')
  os.replace(path + '.partial', path)


def split_policy(preprocess_flags: list) -> tuple:
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

  grouping = splits_lib.Grouping(pattern=policy[2])
  if input_pattern.endswith('.csv'):
    import csv  # pylint: disable=import-outside-toplevel
    with open(os.path.join(corpus_dir, input_pattern), encoding='utf-8') as f:
      rows = [(r['text'], r['label'], None, None) for r in csv.DictReader(f)]
  elif input_pattern.endswith('.jsonl'):
    with open(os.path.join(corpus_dir, input_pattern), encoding='utf-8') as f:
      records = [json.loads(line) for line in f]
    rows = [(r['text'], r['label'], r['split'],
             grouping.group_of({raw.ID: r['id']})) for r in records]
  else:
    config = readers.ReadConfig(format='email' if corpus == 'spamassassin'
                                else 'files')
    paths = glob.glob(os.path.join(corpus_dir, input_pattern or '*/*/*'))
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


def tfidf_baseline(splits: dict, folds: int = 0, refit: bool = False,
                   also_predict=()) -> dict:
  """The TF-IDF bag-of-bigrams logistic regression (bench/tfidf.py) on the
  job's own splits, chosen as the trainer chose: C on validation, or by
  ``folds``-fold cross-validation over train (refitted on train +
  validation with ``refit``); reported on test, and ``also_predict``
  labelled."""
  import tfidf  # pylint: disable=import-outside-toplevel
  from schemas import raw  # pylint: disable=import-outside-toplevel
  return tfidf.baseline(splits[raw.TRAIN], splits[raw.VALIDATION],
                        splits[raw.TEST], folds=folds, refit=refit,
                        also_predict=also_predict)


def fresh_tickets(corpus_dir: str, pattern: str) -> tuple:
  """(texts, labels) of the fresh tickets (``bench/tickets.fresh``):
  none of them a text of the corpus's."""
  import csv  # pylint: disable=import-outside-toplevel
  import tickets  # pylint: disable=import-outside-toplevel
  with open(os.path.join(corpus_dir, pattern), encoding='utf-8') as handle:
    return tickets.fresh(row['text'] for row in csv.DictReader(handle))


def judged_on_fresh(model_dir: str, fresh: tuple,
                    baseline_labels: list) -> dict:
  """Ours and the baseline, as trained on the 500 tickets, on the fresh
  ones: each one's accuracy, what the oracle of the ceiling expects there,
  and the tickets only one of the two gets right (the paired comparison,
  the rest being alike)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import textclf  # pylint: disable=import-outside-toplevel
  import tickets  # pylint: disable=import-outside-toplevel
  texts, labels = fresh
  labels = np.asarray(labels)
  ours = np.asarray([row['label'] for row in
                     textclf.load(model_dir).predict(texts)]) == labels
  theirs = np.asarray(baseline_labels) == labels
  return {'tickets': len(texts), 'seed': tickets.FRESH_SEED,
          'oracle_expects': round(tickets.oracle_accuracy(*fresh), 4),
          'ours': round(float(ours.mean()), 4),
          'tfidf_bigram_lr': round(float(theirs.mean()), 4),
          'only_ours_right': int((ours & ~theirs).sum()),
          'only_tfidf_right': int((theirs & ~ours).sum())}


def prepare_corpus(corpus: str, work: str, cache: str,
                   tickets_seed: int = None) -> tuple:
  """(corpus folder, input below it): fetched, and derived where the
  corpus is derived; the tickets drawn again with ``tickets_seed``."""
  dataset, pattern = CORPORA[corpus]
  if dataset is None:
    if tickets_seed is None:
      return os.path.dirname(os.path.abspath(__file__)), pattern
    import tickets  # pylint: disable=import-outside-toplevel
    drawn = os.path.join(work, f'tickets-{tickets_seed}')
    tickets.write(os.path.join(drawn, pattern), seed=tickets_seed)
    return drawn, pattern
  run_process([sys.executable, '-m', 'pipeline.datasets', 'fetch', dataset,
               '--dest', work, '--cache', cache])
  corpus_dir = os.path.join(work, {'imdb': 'aclImdb'}.get(dataset, dataset))
  if pattern.endswith('.jsonl'):
    derived = os.path.join(work, 'derived')
    os.makedirs(derived, exist_ok=True)
    if not os.path.exists(os.path.join(derived, pattern)):
      derive_corpus(corpus, corpus_dir, os.path.join(derived, pattern))
    corpus_dir = derived
  return corpus_dir, pattern


def branch_figures(choices: dict, calibration: dict) -> dict:
  """What chose, and what each branch is worth: the seconds each part of
  the training took, and, on the held-out examples the branch weights were
  fitted on (the folds' predictions, or validation), each branch's accuracy
  alone beside the weighted mix's."""
  fitted = calibration['fitted_on']
  figures = {'seconds_by_part': choices['seconds'],
             'held_out': {'on': fitted['what'], 'examples': fitted['examples'],
                          'mix': round(fitted['after']['accuracy'], 4),
                          **{branch: round(value, 4) for branch, value in
                             fitted.get('branch_accuracy', {}).items()}}}
  if 'branch_weights' in calibration:
    figures['branch_weights'] = {branch: round(weight, 3) for branch, weight
                                 in calibration['branch_weights'].items()}
  folds = choices.get('cross_validation')
  if folds:
    figures['chosen'] = {'epochs': folds['epochs'],
                         'ngram_min_count': folds['ngram_min_count']}
  return figures


def train_run(name: str, corpus: str, corpus_dir: str, pattern: str,
              run_dir: str, seed: int = None) -> dict:
  """Preprocesses the corpus and trains with configuration ``name``; the
  trainer's figures."""
  python = sys.executable
  data_dir = os.path.join(run_dir, 'preprocessed')
  model_dir = os.path.join(run_dir, 'model')
  # A model folder of the run's own: a retrain into a reused one would be
  # judged against the version before it (the trainer's blessing), which
  # costs time and can refuse a seed's model.
  shutil.rmtree(model_dir, ignore_errors=True)
  run_process([python, '-m', 'pipeline.preprocess',
               f'--input={os.path.join(corpus_dir, pattern)}'.rstrip('/'),
               f'--output_dir={data_dir}', '--overwrite',
               *config_arguments(name, 'preprocess'), *corpus_flags(corpus)])
  wall, peak = run_process([python, '-m', 'trainer.train',
                            f'--data_dir={data_dir}',
                            f'--model_dir={model_dir}',
                            *config_arguments(name, 'train'),
                            *([f'--seed={seed}'] if seed is not None else [])])
  with open(os.path.join(model_dir, 'metrics.json')) as handle:
    metrics = json.load(handle)
  exported = os.path.join(model_dir, 'export')
  with open(os.path.join(exported, sorted(os.listdir(exported))[-1],
                         'assets.extra', 'metadata.json')) as handle:
    metadata = json.load(handle)
  training, calibration = metadata['training'], metadata['calibration']
  test = metrics['test']
  folds = (training['choices'].get('cross_validation') or {}).get('folds', 0)
  ours = {'selected_on': metrics['selected_on'], 'folds': folds,
          'refit': metrics['refit'],
          'validation_accuracy': metrics['validation']['accuracy'],
          'accuracy': test['accuracy'], 'macro_f1': test['macro_f1'],
          'test_ece': round(test['calibration']['after']['ece'], 4),
          'epochs_run': training['epochs_run_by_branch'],
          'training_s': training['training_seconds'],
          'job_wall_s': round(wall, 1), 'peak_mib': round(peak),
          **branch_figures(training['choices'], calibration)}
  if 'spam' in test['per_class']:
    ours['spam_f1'] = test['per_class']['spam']['f1']
  return ours


def nbsvm_anchor(ours: dict, work: str, cache: str, seed: int) -> dict:
  """The published NBSVM-trigram recipe (``bench/nbsvm_reference.py``) in
  the same run, fitted on the reviews ``imdb_best`` was fitted on (train,
  and validation too when it was refitted), its epochs fixed by its
  publication: its test accuracy, and ours as a ratio of it."""
  import nbsvm_reference  # pylint: disable=import-outside-toplevel
  from schemas import raw  # pylint: disable=import-outside-toplevel
  fitted_on = (raw.TRAIN, raw.VALIDATION) if ours['refit'] else (raw.TRAIN,)
  run = nbsvm_reference.recipe_run(
      nbsvm_reference.RECIPES['published'],
      nbsvm_reference.imdb_splits(cache, work), fitted_on, seed)
  accuracy = run['accuracy_by_epoch'][-1][raw.TEST]
  return {'fitted_on': '+'.join(fitted_on), 'test_accuracy': accuracy,
          'seconds': run['seconds'],
          'ours_minus_reference': round(ours['accuracy'] - accuracy, 4)}


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--only', default=','.join(RUNS),
                      help='Runs, configuration[:corpus], comma-separated.')
  parser.add_argument('--seed', type=int, default=None,
                      help='The trainer\'s --seed, for a repeat of a run.')
  parser.add_argument('--tickets_seed', type=int, default=None,
                      help='The tickets drawn again by bench/tickets.py '
                      'with this seed, not the committed ones: how far a '
                      'figure on 500 tickets moves with the draw.')
  args = parser.parse_args()
  runs = [parse_run(run) for run in args.only.split(',')]
  corpora = {corpus for _, corpus in runs}
  if args.tickets_seed is not None and 'tickets' not in corpora:
    parser.error('--tickets_seed draws the tickets again: it needs a run on '
                 'them (--only defaults:tickets)')
  work = args.work or tempfile.mkdtemp(prefix='bench-train-')
  print(f'machine: {machine()}', flush=True)
  results, baselines = {}, {}
  for name, corpus in runs:
    corpus_dir, pattern = prepare_corpus(corpus, work, args.cache,
                                         args.tickets_seed)
    run_dir = os.path.join(work, 'runs', f'{name}-{corpus}')
    ours = train_run(name, corpus, corpus_dir, pattern, run_dir, args.seed)
    fresh = (fresh_tickets(corpus_dir, pattern) if corpus == 'tickets'
             else ((), ()))
    preprocess_flags = config_flags(name, 'preprocess') + corpus_flags(corpus)
    # Configurations of one corpus with the same split policy share their
    # splits, and so the baseline where they chose alike: fitted once.
    split_key = (corpus, pattern, split_policy(preprocess_flags))
    # The trainer refuses --refit without folds: the two say the protocol.
    protocol = (ours['folds'], ours['refit'])
    if (split_key, protocol) not in baselines:
      baselines[split_key, protocol] = tfidf_baseline(
          corpus_splits(corpus_dir, *split_key), *protocol,
          also_predict=fresh[0])
    baseline = dict(baselines[split_key, protocol])
    baseline_fresh_labels = baseline.pop('also_predicted', None)
    results[f'{name}:{corpus}'] = {
        'preprocess': preprocess_flags, 'train': config_flags(name, 'train'),
        'ours': ours, 'tfidf_bigram_lr': baseline}
    if corpus == 'tickets':
      import tickets  # pylint: disable=import-outside-toplevel
      results[f'{name}:{corpus}']['accuracy_ceiling'] = round(
          tickets.accuracy_ceiling(), 4)
      results[f'{name}:{corpus}']['fresh_tickets'] = judged_on_fresh(
          os.path.join(run_dir, 'model'), fresh, baseline_fresh_labels)
    if (name, corpus) == ('imdb_best', 'imdb'):
      results[f'{name}:{corpus}']['nbsvm_reference'] = nbsvm_anchor(
          ours, work, args.cache, args.seed or 0)
    print(f'{name}:{corpus}', json.dumps(results[f'{name}:{corpus}']),
          flush=True)
  print(json.dumps(results, indent=2))


if __name__ == '__main__':
  main()
