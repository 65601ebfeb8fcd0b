"""Benchmark: the preprocessing job on the 50,000 IMDB reviews.

Reads the aclImdb tree as shipped or, with --format=jsonl, one JSONL file
of the same reviews (``id``, ``text``, ``label``, ``split``); with --docs, a
JSONL corpus of that many: an even subset of the reviews, or the reviews
repeated with new ids (the split kept). Runs, as whole processes in one go, our job on DirectRunner's engine in
in-memory and in multi-process mode, and the one-process TensorFlow-only
baseline (bench/tf_only_preprocess.py) doing the same normalization,
train-only vocabulary, indexing, padding and gzip TFRecord writing. Reports
documents/s, wall time, peak memory and the ratio to the baseline.

    python bench/preprocess.py [--cache ../shared/datasets] [--work DIR]
        [--format=tree|jsonl] [--docs=N]
"""
import glob
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import argument_parser  # pylint: disable=wrong-import-position
from common import machine  # pylint: disable=wrong-import-position
from common import run_process  # pylint: disable=wrong-import-position

REVIEWS = 50000


def write_jsonl(tree: str, path: str, size: int) -> None:
  """``size`` records from the reviews of an aclImdb tree, in one file."""
  reviews = sorted(glob.glob(os.path.join(tree, '*', '*', '*.txt')))
  step = max(len(reviews) // size, 1)
  chosen = reviews[::step][:size] if size < len(reviews) else reviews
  with open(path, 'w', encoding='utf-8') as out:
    for index in range(size):
      review = chosen[index % len(chosen)]
      label_dir, _ = os.path.split(review)
      split_dir, label = os.path.split(label_dir)
      with open(review, encoding='utf-8') as handle:
        out.write(json.dumps({
            'id': f'review-{index}', 'text': handle.read(), 'label': label,
            'split': os.path.basename(split_dir)}) + '\n')


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--repeats', type=int, default=1)
  parser.add_argument('--format', choices=('tree', 'jsonl'), default='tree')
  parser.add_argument('--docs', type=int, default=None,
                      help='JSONL corpus size (implies --format=jsonl).')
  args = parser.parse_args()
  work = args.work or tempfile.mkdtemp(prefix='bench-preprocess-')
  python = sys.executable
  run_process([python, '-m', 'pipeline.datasets', 'fetch', 'imdb', '--dest',
               work, '--cache', args.cache])
  corpus = os.path.join(work, 'aclImdb')
  documents = REVIEWS
  job_flags = []
  if args.docs or args.format == 'jsonl':
    documents = args.docs or REVIEWS
    tree, corpus = corpus, os.path.join(work, f'corpus-{documents}.jsonl')
    write_jsonl(tree, corpus, documents)
    job_flags = ['--split_field=split']
  job = [python, '-m', 'pipeline.preprocess', f'--input={corpus}',
         '--vocab_size=20000', '--max_len=200'] + job_flags
  runs = {
      'baseline (TF only, one process)': [
          python, os.path.join(os.path.dirname(__file__),
                               'tf_only_preprocess.py'),
          f'--input={corpus}', f'--output_dir={work}/baseline'],
      'ours, in_memory': job + [f'--output_dir={work}/in_memory',
                                '--direct_running_mode=in_memory'],
      'ours, multi_processing x2': job + [
          f'--output_dir={work}/multi', '--direct_running_mode=multi_processing',
          '--direct_num_workers=2'],
  }
  results = {}
  for name, command in runs.items():
    timings = [run_process(command) for _ in range(args.repeats)]
    wall = min(t[0] for t in timings)
    peak = max(t[1] for t in timings)
    results[name] = {'wall_s': round(wall, 1), 'peak_mib': round(peak),
                     'docs_per_s': round(documents / wall)}
  baseline = results['baseline (TF only, one process)']['wall_s']
  print(f'machine: {machine()}; {documents} documents from {corpus}')
  print(f'{"run":34} {"wall s":>7} {"docs/s":>7} {"peak MiB":>9} '
        f'{"x baseline":>10}')
  for name, result in results.items():
    result['ratio'] = round(result['wall_s'] / baseline, 2)
    print(f'{name:34} {result["wall_s"]:7.1f} {result["docs_per_s"]:7d} '
          f'{result["peak_mib"]:9d} {result["ratio"]:10.2f}')
  print(json.dumps(results))


if __name__ == '__main__':
  main()
