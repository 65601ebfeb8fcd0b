"""Benchmark: the scoring job against a plain loop over the same model.

For each corpus size, a JSONL corpus drawn from the 50,000 IMDB reviews
(cycled, each copy with its own id) is scored by each arm in a process of
its own, so that peak memory is measured apart:

- model alone: the job's model (``serving.length_groups``, its threads and
  XLA flags) on the corpus's texts held in memory, in the job's batches,
  warm: no reading, no writing, no start-up; timed on at most the first
  100,000 texts (--model_alone_docs), a rate. The job's ceiling;
- baseline: the exported ``serving_default`` signature called in a Python
  loop over the same texts, in batches of 256 (--baseline_batch_size), in
  one process, writing the same Parquet rows;
- ours: ``python -m pipeline.score`` with its default flags (batches of
  ``pipeline.score.BATCH_SIZE`` documents grouped by length) and runner
  (FnApiRunner), in memory and, with --modes, in multi_processing mode
  with a worker per core, on a dask.distributed cluster on 127.0.0.1
  (a scheduler and a single-threaded worker process per core, or
  --dask_workers, started and with our modules imported before the
  timing), on a Flink session cluster of a slot per core, a Spark
  standalone cluster of a core per core (``clusters``: started before the
  timing, SDK workers in an EXTERNAL worker pool) or on Prism; the peak
  memory of Dask's worker processes and of the clusters' SDK workers is
  reported apart from the launcher's,
  writing partitioned Parquet, dead letters and the manifest.

    python bench/score.py [--model_dir=DIR] [--docs=100000[,1000000]]
        [--repeats=N]
        [--modes=in_memory,multi_processing,dask,flink,spark,prism]
        [--dask_workers=N] [--dask_npartitions=N]

Without --model_dir, the seed-configuration model is trained first, as
``bench/train.py --only imdb_seed`` trains it.
"""
import argparse
import collections
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
from common import runner_flags  # pylint: disable=wrong-import-position
from common import run_process  # pylint: disable=wrong-import-position
from train import config_arguments  # pylint: disable=wrong-import-position
from train import corpus_flags  # pylint: disable=wrong-import-position

from schemas import raw  # pylint: disable=wrong-import-position
from schemas import scored  # pylint: disable=wrong-import-position
from schemas import serving  # pylint: disable=wrong-import-position

_DOCS_PER_FILE = 100_000


def write_corpus(reviews_dir: str, folder: str, size: int) -> str:
  """``size`` documents in JSONL files of 100,000; returns the file pattern."""
  paths = sorted(glob.glob(os.path.join(reviews_dir, '*', '*', '*.txt')))
  texts = []
  for path in paths:
    with open(path, encoding='utf-8') as handle:
      texts.append(handle.read())
  os.makedirs(folder, exist_ok=True)
  for start in range(0, size, _DOCS_PER_FILE):
    name = os.path.join(folder, f'docs-{start // _DOCS_PER_FILE:03d}.jsonl')
    with open(name, 'w', encoding='utf-8') as out:
      for index in range(start, min(start + _DOCS_PER_FILE, size)):
        out.write(json.dumps({'id': f'doc-{index}',
                              'text': texts[index % len(texts)]}) + '\n')
  return os.path.join(folder, '*.jsonl')


def baseline(pattern: str, model_dir: str, batch_size: int,
             output: str) -> None:
  """The in-process loop: read, batch, call the signature, write the rows
  the job writes (``schemas.scored``) to one zstd Parquet file."""
  # Imported here: only the baseline's own process loads TensorFlow.
  import datetime  # pylint: disable=import-outside-toplevel
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  from serving import exports  # pylint: disable=import-outside-toplevel
  signature, metadata = exports.load(model_dir)
  names = list(metadata.label_names)
  schema = scored.arrow_schema(names, pa.schema([]))
  writer = pq.ParquetWriter(output, schema, compression='zstd')
  batch, documents = [], 0

  def score(records):
    outputs = signature(**{serving.TEXT: [r[raw.TEXT].encode('utf-8')
                                          for r in records]})
    probabilities = outputs[serving.PROBABILITIES].numpy()
    now = datetime.datetime.now(datetime.timezone.utc)
    writer.write_table(pa.table({
        scored.ID: [r[raw.ID] for r in records],
        scored.LABEL: [label.decode()
                       for label in outputs[serving.LABEL].numpy()],
        scored.CONFIDENCE: outputs[serving.CONFIDENCE].numpy(),
        **{column: probabilities[:, i] for i, column in enumerate(
            scored.probability_columns(names))},
        scored.MODEL_VERSION: [metadata.version] * len(records),
        scored.SCORED_AT: [now] * len(records),
    }, schema=schema))
    return len(records)

  for path in sorted(glob.glob(pattern)):
    with open(path, encoding='utf-8') as handle:
      for line in handle:
        batch.append(json.loads(line))
        if len(batch) == batch_size:
          documents += score(batch)
          batch = []
  if batch:
    documents += score(batch)
  writer.close()
  print(json.dumps({'documents': documents}))


def model_alone(pattern: str, model_dir: str, docs: int,
                output: str) -> None:
  """The job's model on texts in memory, in the job's batches; writes its
  rate to ``output``."""
  # pylint: disable=import-outside-toplevel
  import time
  from pipeline import score
  from pipeline.scoring import inference
  from serving import length_groups
  texts = []
  for path in sorted(glob.glob(pattern)):
    with open(path, encoding='utf-8') as handle:
      texts.extend(json.loads(line)[raw.TEXT].encode('utf-8')
                   for line, _ in zip(handle, range(docs - len(texts))))
  # The XLA flags as the job's model handler sets them.
  inference.RawTextModelHandler(model_dir).set_environment_vars()
  model, _ = length_groups.load(model_dir)
  batches = [texts[start:start + score.BATCH_SIZE]
             for start in range(0, len(texts), score.BATCH_SIZE)]
  model(batches[0])  # warm
  started = time.perf_counter()
  for batch in batches:
    model(batch)
  seconds = time.perf_counter() - started
  with open(output, 'w', encoding='utf-8') as out:
    json.dump({'documents': len(texts), 'seconds': seconds,
               'docs_per_s': len(texts) / seconds}, out)


def check_same_outputs(baseline_file: str, partition: str) -> None:
  """Fails unless the job's rows give every document the baseline's label
  and its probabilities within 1e-5."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import pyarrow.dataset as ds  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  theirs = pq.read_table(baseline_file).sort_by(scored.ID)
  ours = ds.dataset(partition, format='parquet').to_table(
      columns=theirs.column_names).sort_by(scored.ID)
  assert ours.column(scored.ID).equals(theirs.column(scored.ID))
  assert ours.column(scored.LABEL).equals(theirs.column(scored.LABEL))
  for column in theirs.column_names:
    if column.startswith(scored.PROBABILITY_PREFIX):
      difference = np.abs(ours.column(column).to_numpy() -
                          theirs.column(column).to_numpy()).max()
      assert difference <= 1e-5, (column, difference)


def seed_model(work: str) -> str:
  data_dir = os.path.join(work, 'preprocessed')
  model_dir = os.path.join(work, 'model')
  python = sys.executable
  run_process([python, '-m', 'pipeline.preprocess',
               f'--input={os.path.join(work, "aclImdb")}',
               f'--output_dir={data_dir}',
               *config_arguments('imdb_seed', 'preprocess'),
               *corpus_flags('imdb')])
  run_process([python, '-m', 'trainer.train', f'--data_dir={data_dir}',
               f'--model_dir={model_dir}',
               *config_arguments('imdb_seed', 'train')])
  return model_dir


def score_once(args, work: str, model_dir: str, pattern: str, size: int,
               mode: str):
  """One run of the job in ``mode``, checked: every document scored once,
  as the baseline scored it. Returns its wall time, the launcher's peak
  memory and the largest peak of the Dask worker processes (None
  elsewhere), in MiB."""
  with contextlib.ExitStack() as stack:
    flags, worker_peaks = runner_flags(args, mode, stack, 'pipeline.score')
    wall, peak = run_process([
        sys.executable, '-m', 'pipeline.score', f'--input={pattern}',
        f'--model_dir={model_dir}', f'--output_dir={work}/scores',
        f'--partition=size={size}', *flags])
    worker_peak = max(worker_peaks()) if worker_peaks else None
  partition = os.path.join(work, 'scores', f'size={size}')
  with open(os.path.join(partition, scored.MANIFEST_FILE),
            encoding='utf-8') as handle:
    counts = json.load(handle)['counts']
  assert counts['scored'] == size, counts
  check_same_outputs(f'{work}/baseline-{size}.parquet', partition)
  return wall, peak, worker_peak


def bench_size(args, work: str, model_dir: str, pattern: str,
               size: int) -> dict:
  """Both arms on one corpus, ``--repeats`` times in turn: this machine's
  speed drifts by 10-20 % over minutes, and interleaving exposes both arms
  to it alike. Reports each arm's best wall time, its every wall time, and
  its highest peak memory (and a Dask worker process's)."""
  python = sys.executable
  walls, peaks = collections.defaultdict(list), collections.defaultdict(list)
  worker_peaks = collections.defaultdict(list)
  model_rates = []
  for _ in range(args.repeats):
    rate_file = os.path.join(work, 'model-alone.json')
    run_process([python, os.path.abspath(__file__), f'--model_alone={pattern}',
                 f'--model_dir={model_dir}',
                 f'--model_alone_docs={args.model_alone_docs}',
                 f'--model_alone_output={rate_file}'])
    with open(rate_file, encoding='utf-8') as handle:
      model_rates.append(json.load(handle)['docs_per_s'])
    wall, peak = run_process([
        python, os.path.abspath(__file__), f'--baseline={pattern}',
        f'--model_dir={model_dir}',
        f'--baseline_batch_size={args.baseline_batch_size}',
        f'--baseline_output={work}/baseline-{size}.parquet'])
    walls['baseline'].append(wall)
    peaks['baseline'].append(peak)
    for mode in args.modes.split(','):
      wall, peak, worker_peak = score_once(args, work, model_dir, pattern,
                                           size, mode)
      walls[mode].append(wall)
      peaks[mode].append(peak)
      if worker_peak is not None:
        worker_peaks[mode].append(worker_peak)
  base_wall = min(walls['baseline'])
  model_rate = max(model_rates)
  result = {'model_alone': {'docs_per_s': round(model_rate),
                            'docs_per_s_runs': [round(r) for r in model_rates],
                            'documents': min(size, args.model_alone_docs)}}
  for arm, arm_walls in walls.items():
    result[arm] = {
        'wall_s': round(min(arm_walls), 1),
        'walls_s': [round(wall, 1) for wall in arm_walls],
        'docs_per_s': round(size / min(arm_walls)),
        'peak_mib': round(max(peaks[arm]))}
    if worker_peaks[arm]:
      result[arm]['worker_peak_mib'] = round(max(worker_peaks[arm]))
    if arm != 'baseline':
      result[arm]['throughput_ratio'] = round(base_wall / min(arm_walls), 3)
      result[arm]['of_model_alone'] = round(
          size / min(arm_walls) / model_rate, 3)
  return result


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--model_dir', default=None)
  parser.add_argument('--docs', default='100000',
                      help='Comma-separated corpus sizes, e.g. '
                      '100000,1000000.')
  # The plain loop's batch; the job groups its own (--batch_size of
  # pipeline.score, left at its default).
  parser.add_argument('--baseline_batch_size', type=int, default=256)
  parser.add_argument('--repeats', type=int, default=1,
                      help='Runs of each arm, interleaved; the best counts.')
  add_runner_arguments(parser, 'in_memory')
  parser.add_argument('--model_alone_docs', type=int, default=100_000,
                      help='Texts the model-alone arm times (a rate).')
  # Set when this file runs itself as the baseline's or the model's process.
  parser.add_argument('--baseline', default=None, help=argparse.SUPPRESS)
  parser.add_argument('--baseline_output', default=None,
                      help=argparse.SUPPRESS)
  parser.add_argument('--model_alone', default=None, help=argparse.SUPPRESS)
  parser.add_argument('--model_alone_output', default=None,
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.model_alone:
    model_alone(args.model_alone, args.model_dir, args.model_alone_docs,
                args.model_alone_output)
    return
  if args.baseline:
    baseline(args.baseline, args.model_dir, args.baseline_batch_size,
             args.baseline_output)
    return
  work = args.work or tempfile.mkdtemp(prefix='bench-score-')
  python = sys.executable
  print(f'machine: {machine()}', flush=True)
  run_process([python, '-m', 'pipeline.datasets', 'fetch', 'imdb', '--dest',
               work, '--cache', args.cache])
  model_dir = args.model_dir or seed_model(work)
  results = {}
  for size in (int(s) for s in args.docs.split(',')):
    pattern = write_corpus(os.path.join(work, 'aclImdb'),
                           os.path.join(work, f'corpus-{size}'), size)
    results[size] = bench_size(args, work, model_dir, pattern, size)
    print(size, json.dumps(results[size]), flush=True)
    for path in glob.glob(os.path.join(work, f'corpus-{size}', '*')) + [
        f'{work}/baseline-{size}.parquet']:
      os.remove(path)
  print(json.dumps(results, indent=2))


if __name__ == '__main__':
  main()
