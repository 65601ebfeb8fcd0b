"""Benchmark: the preprocessing job on all 50,000 IMDB reviews.

Runs, as whole processes in one go, our job on DirectRunner's engine in
in-memory and in multi-process mode, and the one-process TensorFlow-only
baseline (bench/tf_only_preprocess.py) doing the same normalization,
train-only vocabulary, indexing, padding and gzip TFRecord writing. Reports
documents/s, wall time, peak memory and the ratio to the baseline.

    python bench/preprocess.py [--cache ../shared/datasets] [--work DIR]
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import argument_parser  # pylint: disable=wrong-import-position
from common import machine  # pylint: disable=wrong-import-position
from common import run_process  # pylint: disable=wrong-import-position

DOCUMENTS = 50000


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--repeats', type=int, default=1)
  args = parser.parse_args()
  work = args.work or tempfile.mkdtemp(prefix='bench-preprocess-')
  python = sys.executable
  run_process([python, '-m', 'pipeline.datasets', 'fetch', 'imdb', '--dest',
               work, '--cache', args.cache])
  corpus = os.path.join(work, 'aclImdb')
  job = [python, '-m', 'pipeline.preprocess', f'--input={corpus}',
         '--vocab_size=20000', '--max_len=200']
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
                     'docs_per_s': round(DOCUMENTS / wall)}
  baseline = results['baseline (TF only, one process)']['wall_s']
  print(f'machine: {machine()}')
  print(f'{"run":34} {"wall s":>7} {"docs/s":>7} {"peak MiB":>9} '
        f'{"x baseline":>10}')
  for name, result in results.items():
    result['ratio'] = round(result['wall_s'] / baseline, 2)
    print(f'{name:34} {result["wall_s"]:7.1f} {result["docs_per_s"]:7d} '
          f'{result["peak_mib"]:9d} {result["ratio"]:10.2f}')
  print(json.dumps(results))


if __name__ == '__main__':
  main()
