"""Benchmark: the model alone, the export's ``serving_default`` against the
scoring job's length-grouped calls, by call size.

In one process, on the same IMDB reviews held in memory (no reading, no
writing): ``serving_default`` in batches of each ``--baseline_sizes``, and
``serving.length_groups.LengthGroupedModel`` on batches of the scoring job's
size (``pipeline.score.BATCH_SIZE``) in calls of each ``--call_rows``. Each
is run once untimed (XLA compiles its lengths then), then timed
``--repeats`` times; the best time counts. The ratio is against the
fastest ``serving_default`` batch size: the plain loop's strongest
setting, where ``bench/score.py`` uses the usual 256.

    python bench/score_calls.py --model_dir=DIR [--docs=8192]
"""
import glob
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import argument_parser  # pylint: disable=wrong-import-position
from common import machine  # pylint: disable=wrong-import-position
from common import run_process  # pylint: disable=wrong-import-position


def best_rate(score, texts, batch: int, repeats: int) -> float:
  """Documents a second, the best of ``repeats`` timed passes."""
  def one_pass():
    started = time.perf_counter()
    for start in range(0, len(texts), batch):
      score(texts[start:start + batch])
    return len(texts) / (time.perf_counter() - started)
  one_pass()
  return max(one_pass() for _ in range(repeats))


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--model_dir', required=True)
  parser.add_argument('--docs', type=int, default=8192)
  parser.add_argument('--baseline_sizes', default='32,64,128,256')
  parser.add_argument('--call_rows', default='16,32,64')
  parser.add_argument('--threads', type=int, default=0,
                      help='Threads of the grouped calls; 0: the job\'s '
                      'default.')
  parser.add_argument('--repeats', type=int, default=2)
  args = parser.parse_args()
  work = args.work or tempfile.mkdtemp(prefix='bench-calls-')
  print(f'machine: {machine()}', flush=True)
  run_process([sys.executable, '-m', 'pipeline.datasets', 'fetch', 'imdb',
               '--dest', work, '--cache', args.cache])
  # Imported here, after the fetch: TensorFlow loads once, in this process.
  # pylint: disable=import-outside-toplevel
  from pipeline import score
  from pipeline.scoring import inference
  from schemas import serving
  from serving import exports
  from serving import length_groups
  # The XLA flags as the scoring job's model handler sets them.
  inference.RawTextModelHandler(args.model_dir).set_environment_vars()
  paths = sorted(glob.glob(os.path.join(work, 'aclImdb', 'test', '*', '*')))
  step = max(len(paths) // args.docs, 1)
  texts = []
  for path in paths[::step][:args.docs]:
    with open(path, 'rb') as handle:
      texts.append(handle.read())
  signature, metadata = exports.load(args.model_dir)
  rates = {}
  for size in (int(s) for s in args.baseline_sizes.split(',')):
    rates[f'serving_default, batches of {size}'] = best_rate(
        lambda batch: signature(**{serving.TEXT: batch}), texts, size,
        args.repeats)
  strongest = max(rates.values())
  for rows in (int(r) for r in args.call_rows.split(',')):
    model = length_groups.LengthGroupedModel(
        signature, metadata.label_names, call_rows=rows,
        threads=args.threads)
    rates[f'grouped, calls of {rows}'] = best_rate(
        model, texts, score.BATCH_SIZE, args.repeats)
  for name, rate in rates.items():
    print(f'{name}: {rate:.0f} docs/s, {rate / strongest:.2f}x the fastest '
          'serving_default', flush=True)


if __name__ == '__main__':
  main()
