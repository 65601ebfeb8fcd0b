"""Benchmark: the preprocessing job on the 50,000 IMDB reviews.

Reads the aclImdb tree as shipped or, with --format=jsonl, one JSONL file
of the same reviews (``id``, ``text``, ``label``, ``split``); with --docs, a
JSONL corpus of that many: an even subset of the reviews, or the reviews
repeated with new ids (the split kept). Runs, as whole processes in one
go, the one-process TensorFlow-only baseline (bench/tf_only_preprocess.py:
the same splits, normalization, train-only vocabularies, truncation,
padding and gzip TFRecords of the same tf.Examples, batched) and our job
on DirectRunner's engine in in-memory and in multi-process mode, or, with
--modes, on a dask.distributed cluster on 127.0.0.1 (a scheduler and a
single-threaded worker process per core, started and with our modules
imported before the timing; its workers' peak memory is reported apart),
on a Flink session cluster or a Spark standalone cluster (``clusters``,
the same way), or on Prism.
Checks that every run of the job wrote the baseline's vocabularies and
every one of its examples, then reports documents/s, wall time, peak
memory and the ratio to the baseline.

    python bench/preprocess.py [--cache ../shared/datasets] [--work DIR]
        [--format=tree|jsonl] [--docs=N]
        [--modes=in_memory,multi_processing,dask,flink,spark,prism]
        [--dask_workers=N]
        [--dask_npartitions=N]
"""
import contextlib
import glob
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_runner_arguments  # pylint: disable=wrong-import-position
from common import argument_parser  # pylint: disable=wrong-import-position
from common import machine  # pylint: disable=wrong-import-position
from common import run_process  # pylint: disable=wrong-import-position
from common import runner_flags  # pylint: disable=wrong-import-position

REVIEWS = 50000
BASELINE = 'baseline (TF only, one process)'


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


def _read(path: str) -> bytes:
  with open(path, 'rb') as handle:
    return handle.read()


def _examples_by_id(output_dir: str, split: str, spec: dict) -> dict:
  """A split's examples as feature name -> numpy array, rows in id order."""
  # pylint: disable=import-outside-toplevel
  import numpy as np
  import tensorflow as tf
  from schemas import transformed
  files = tf.io.gfile.glob(os.path.join(
      output_dir, transformed.split_file_pattern(split)))
  parts = [tf.io.parse_example(batch, spec) for batch in tf.data.TFRecordDataset(
      files, compression_type='GZIP').batch(10000)]
  features = {name: np.concatenate([part[name].numpy() for part in parts])
              for name in spec}
  order = np.argsort(features[transformed.ID], kind='stable')
  return {name: values[order] for name, values in features.items()}


def check_same_outputs(baseline_dir: str, job_dir: str) -> int:
  """Fails unless the baseline wrote the job's vocabularies and, in every
  split, the job's examples (every feature of every record, by id); returns
  the number of examples compared."""
  # pylint: disable=import-outside-toplevel
  import numpy as np
  import tensorflow_transform as tft
  from schemas import raw
  from schemas import transformed
  job = tft.TFTransformOutput(job_dir)
  for name in (transformed.TOKEN_VOCABULARY, transformed.LABEL_VOCABULARY):
    assert _read(os.path.join(baseline_dir, name)) == _read(
        job.vocabulary_file_by_name(name)), f'the {name} vocabularies differ'
  compared = 0
  for split in raw.SPLITS:
    spec = job.transformed_feature_spec()
    if split == raw.TRAIN:
      for name in transformed.HELD_OUT_ONLY:
        spec.pop(name)
    ours, theirs = (_examples_by_id(folder, split, spec)
                    for folder in (job_dir, baseline_dir))
    for name in spec:
      assert np.array_equal(ours[name], theirs[name]), (split, name)
    compared += len(ours[transformed.ID])
  return compared


def prepare_corpus(args, work: str):
  """The input the arms read: (path, documents, the job's flags for it)."""
  run_process([sys.executable, '-m', 'pipeline.datasets', 'fetch', 'imdb',
               '--dest', work, '--cache', args.cache])
  tree = os.path.join(work, 'aclImdb')
  if not (args.docs or args.format == 'jsonl'):
    return tree, REVIEWS, []
  documents = args.docs or REVIEWS
  corpus = os.path.join(work, f'corpus-{documents}.jsonl')
  write_jsonl(tree, corpus, documents)
  return corpus, documents, ['--split_field=split']


def time_arm(args, command, documents: int, mode=None) -> dict:
  """Runs ``command`` (with ``mode``'s runner flags) ``--repeats`` times:
  its best wall time, its highest peak memory, and a Dask worker process's
  highest peak."""
  walls, peaks, worker_peaks = [], [], []
  for _ in range(args.repeats):
    with contextlib.ExitStack() as stack:
      flags, workers = ([], None) if mode is None else runner_flags(
          args, mode, stack, 'pipeline.preprocess')
      wall, peak = run_process(command + flags)
      walls.append(wall)
      peaks.append(peak)
      if workers:
        worker_peaks.append(max(workers()))
  result = {'wall_s': round(min(walls), 1), 'peak_mib': round(max(peaks)),
            'docs_per_s': round(documents / min(walls))}
  if worker_peaks:
    result['worker_peak_mib'] = round(max(worker_peaks))
  return result


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--repeats', type=int, default=1)
  parser.add_argument('--format', choices=('tree', 'jsonl'), default='tree')
  parser.add_argument('--docs', type=int, default=None,
                      help='JSONL corpus size (implies --format=jsonl).')
  add_runner_arguments(parser, 'in_memory,multi_processing')
  args = parser.parse_args()
  work = args.work or tempfile.mkdtemp(prefix='bench-preprocess-')
  corpus, documents, job_flags = prepare_corpus(args, work)
  results = {BASELINE: time_arm(args, [
      sys.executable, os.path.join(os.path.dirname(__file__),
                                   'tf_only_preprocess.py'),
      f'--input={corpus}', f'--output_dir={work}/baseline'], documents)}
  modes = args.modes.split(',')
  for mode in modes:
    results[f'ours, {mode}'] = time_arm(args, [
        sys.executable, '-m', 'pipeline.preprocess', f'--input={corpus}',
        f'--output_dir={work}/{mode}', '--vocab_size=20000', '--max_len=200',
        *job_flags], documents, mode)
  compared = [check_same_outputs(f'{work}/baseline', f'{work}/{mode}')
              for mode in modes]
  print(f'machine: {machine()}; {documents} documents from {corpus}; '
        f'each run wrote the baseline\'s vocabularies and its {compared[0]} '
        'examples')
  print_table(results)


def print_table(results: dict) -> None:
  baseline = results[BASELINE]['wall_s']
  print(f'{"run":34} {"wall s":>7} {"docs/s":>7} {"peak MiB":>9} '
        f'{"worker MiB":>10} {"x baseline":>10}')
  for name, result in results.items():
    result['ratio'] = round(result['wall_s'] / baseline, 2)
    print(f'{name:34} {result["wall_s"]:7.1f} {result["docs_per_s"]:7d} '
          f'{result["peak_mib"]:9d} {result.get("worker_peak_mib", ""):>10} '
          f'{result["ratio"]:10.2f}')
  print(json.dumps(results))


if __name__ == '__main__':
  main()
