"""What several test files share: the dataset cache, fetched corpora, a job
runner, JSONL input and dead-letter output, small training and
preprocessing runs, the scoring job's flags and output, and the fault
doubles (a poisoned model, a fake export). A test file imports them from
here, never from another test file."""
import contextlib
import fcntl
import glob
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import apache_beam as beam
from apache_beam.io import source_test_utils
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import cli
from cli import lifetime
from pipeline import jobs
from pipeline import readers
from pipeline.readers import read_ahead
from pipeline.scoring import inference
from schemas import raw
from schemas import rejected
from schemas import serving
from schemas import transformed

REPO = pathlib.Path(__file__).resolve().parent.parent
_SHARED_DATASETS = REPO.parent / 'shared' / 'datasets'
# The registry files, as the Makefile finds them: $DATASET_CACHE, else the
# shared copy beside the clone, else data/cache, which `make run` fills.
DATASET_CACHE = pathlib.Path(os.environ.get('DATASET_CACHE') or (
    _SHARED_DATASETS if _SHARED_DATASETS.is_dir() else REPO / 'data' / 'cache'))


def pytest_configure(config):  # pylint: disable=unused-argument
  """The commands the tests start, and signal, get SIGHUP and SIGINT as a
  terminal gives them. A test run started in the background of a script
  (which ignores SIGINT) or under nohup (SIGHUP) passes the ignoring on to
  every process it starts, and a command keeps an ignored signal ignored,
  as nohup asks."""
  if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
  if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The test files that take longest, longest first (seconds of one `make
# test` on 2 cores, three workers). Under pytest-xdist's --dist loadfile a
# file's tests run on one worker, and files are handed out in collection
# order: a long file handed out last keeps one worker busy while the others
# sit idle. xdist's own order, by the number of tests a file has, hands out
# the few long tests of test_readme.py, test_partitions.py and
# test_runners.py last. A file missing here only runs later than it might.
_LONGEST_FILES = (
    'test_trainer_faults.py',  # 266
    'test_score.py',  # 180
    'test_ownership.py',  # 176
    'test_preprocess.py',  # 120
    'test_partitions.py',  # 116
    'test_selection.py',  # 114
    'test_faults.py',  # 112
    'test_groups.py',  # 99
    'test_runners.py',  # 88
    'test_trainer.py',  # 87
    'test_fail_loud.py',  # 86
    'test_predict.py',  # 81
    'test_readme.py',  # 81
    'test_end_to_end.py',  # 70
    'test_blessing.py',  # 64
)


def pytest_collection_modifyitems(items):
  """The files of ``_LONGEST_FILES`` first, in its order; the rest after
  them by their number of tests, most first, as xdist would order them
  (the Makefile turns xdist's own reordering off)."""
  tests_in = {}
  for item in items:
    tests_in[item.path.name] = tests_in.get(item.path.name, 0) + 1

  def rank(item):
    name = item.path.name
    if name in _LONGEST_FILES:
      return (_LONGEST_FILES.index(name), 0)
    return (len(_LONGEST_FILES), -tests_in[name])
  items.sort(key=rank)


def registry_file(name: str) -> str:
  """The verified registry file of corpus ``name``: from the dataset cache,
  else downloaded into it once (kept for later runs); the test is skipped,
  with the reason, when it is in neither the cache nor the registry."""
  from pipeline import datasets
  artifact = datasets.DATASETS[name].artifact
  with contextlib.suppress(OSError):  # a read-only cache is used as it is
    DATASET_CACHE.mkdir(parents=True, exist_ok=True)
  try:
    return datasets.locate(artifact, str(DATASET_CACHE))
  except datasets.DatasetError as error:
    if (DATASET_CACHE / artifact.filename).exists():
      raise  # a corrupt cached file is an error, not a reason to skip
    pytest.skip(f'{artifact.filename} is not in the dataset cache '
                f'{DATASET_CACHE} (set DATASET_CACHE) and fetching it '
                f'failed: {error}')


@pytest.fixture(scope='session')
def corpora(tmp_path_factory):
  """Fetches a corpus once per session; returns its folder."""
  from pipeline import datasets
  dest = tmp_path_factory.mktemp('corpora')
  fetched = {}

  def get(name):
    if name not in fetched:
      cache = os.path.dirname(registry_file(name))
      fetched[name] = datasets.fetch(name, str(dest), cache)
    return fetched[name]
  return get


def run_module(module, *args, timeout=600):
  """Runs ``python -m module args`` as a user would; returns the process."""
  return subprocess.run([sys.executable, '-m', module, *map(str, args)],
                        capture_output=True, text=True, timeout=timeout,
                        cwd=REPO)


def start_scoring(args):
  """Starts ``python -m pipeline.score args``; its stderr is piped."""
  return subprocess.Popen([sys.executable, '-m', 'pipeline.score', *args],
                          cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)


def wait_for(condition, process=None, seconds=300):
  """Polls ``condition`` until it holds; fails if ``process`` (its stderr
  piped) ends first, with the end of its stderr, or after ``seconds``."""
  deadline = time.monotonic() + seconds
  while not condition():
    if process is not None:
      assert process.poll() is None, process.communicate()[1][-3000:]
    assert time.monotonic() < deadline, 'timed out'
    time.sleep(0.1)


def main_in_process(monkeypatch, capsys, run, *args):
  """Runs a job's ``run`` as ``python -m`` runs it, through ``cli.main``, in
  this process, which has TF and Beam imported already. Returns the exit
  status (0 when it returned) and what the job wrote to stderr."""
  # main installs signal handlers; the test process keeps its own. Nor
  # does it get a watchdog: its other children are not the job's.
  monkeypatch.setattr(signal, 'signal', lambda *_: None)
  monkeypatch.setattr(lifetime, 'start', lambda: None)
  # A stopped run leaves by os._exit, which would end the test process.
  monkeypatch.setattr(cli, '_exit_at_once', sys.exit)
  monkeypatch.setattr(sys, 'argv', ['job', *map(str, args)])
  try:
    cli.main(run)
    status = 0
  except SystemExit as exit_info:
    status = exit_info.code
  return status, capsys.readouterr().err


# The same float32 values computed twice, in other batches, processes or
# runners: TF picks other kernels (AVX-512 on one CPU, AVX2 on another), and
# sums in another order round otherwise, by a few dozen float32 ulps. A real
# change (another model, another document) moves them by far more.
FLOAT32_TOLERANCE = {'rtol': 1e-5, 'atol': 1e-5}


def assert_float32_close(actual, expected):
  np.testing.assert_allclose(actual, expected, **FLOAT32_TOLERANCE)


def float32_approx(expected):
  return pytest.approx(expected, rel=FLOAT32_TOLERANCE['rtol'],
                       abs=FLOAT32_TOLERANCE['atol'])


def write_jsonl(path, rows):
  """Writes one JSON object a line; a ``bytes`` row is written as it is, for
  the malformed lines a test needs. Returns the path."""
  with open(path, 'wb') as handle:
    for row in rows:
      handle.write(row if isinstance(row, bytes) else json.dumps(row).encode())
      handle.write(b'\n')
  return path


def tree(folder):
  """Every file under ``folder`` (hidden ones too) with its bytes, by
  relative path: equal trees are the same files, byte for byte."""
  found = {}
  for root, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'rb') as handle:
        found[os.path.relpath(path, folder)] = handle.read()
  return found


def dead_letters(output_dir):
  """The dead letters a job wrote into ``output_dir``, in a stable order, so
  that two outputs can be compared."""
  rows = []
  pattern = os.path.join(str(output_dir), rejected.DIR, '*.jsonl')
  for path in glob.glob(pattern):
    with open(path, encoding='utf-8') as handle:
      rows.extend(json.loads(line) for line in handle)
  return sorted(rows, key=json.dumps)


def beam_pipeline():
  """A TestPipeline on the runner our jobs default to."""
  return BeamTestPipeline(options=jobs.pipeline_options([]))


def run_and_collect(build):
  """Runs ``build(pipeline)`` and returns the elements of the PCollection it
  returns (JSON-serializable ones), as written by the pipeline itself."""
  with tempfile.TemporaryDirectory() as folder:
    with beam_pipeline() as pipeline:
      _ = (build(pipeline)
           | 'ToJson' >> beam.Map(json.dumps)
           | 'Write' >> beam.io.WriteToText(os.path.join(folder, 'out')))
    lines = []
    for name in sorted(os.listdir(folder)):
      with open(os.path.join(folder, name), encoding='utf-8') as handle:
        lines.extend(handle)
  return [json.loads(line) for line in lines]


def read(pattern, fmt='auto', chunked=False, **config):
  """Every record a pattern yields to our readers, sorted by id, read through a real Beam pipeline
  (``chunked``: in chunks, each at most ``read_ahead.CHUNK_RECORDS``)."""
  matched = readers.resolve_input(str(pattern), fmt)
  transform = readers.ReadRecords(
      matched.pattern, readers.ReadConfig(format=matched.format, **config),
      chunked=chunked)
  read_records = run_and_collect(lambda p: p | transform)
  if chunked:
    assert all(isinstance(chunk, list) and
               len(chunk) <= read_ahead.CHUNK_RECORDS
               for chunk in read_records)
    read_records = [record for chunk in read_records for record in chunk]
  return sorted(read_records, key=lambda r: r[raw.ID])


def assert_splits_read_as_whole(source, bundle_bytes, more_than=0):
  """Read in splits of about ``bundle_bytes``, ``source`` yields what it
  yields whole: every record once."""
  splits = [(s.source, s.start_position, s.stop_position)
            for s in source.split(desired_bundle_size=bundle_bytes)]
  assert len(splits) > more_than
  source_test_utils.assert_sources_equal_reference_source(
      (source, None, None), splits)


def summary(records):
  """(id, text or reason, label) per record, for compact assertions."""
  return [(r[raw.ID], r.get(raw.REASON) or r[raw.TEXT], r.get(raw.LABEL))
          for r in records]


def assert_writable(records):
  """Every record can be written as the dead-letter writer writes it."""
  for record in records:
    json.dumps(record, ensure_ascii=False).encode('utf-8')


def letters(records):
  """The records a reader rejected, as (id, reason), sorted."""
  return sorted((r[raw.ID], r[raw.REASON]) for r in records
                if r.get(raw.REASON))


POSITIVE = ['great', 'superb', 'wonderful', 'moving', 'brilliant', 'loved']
NEGATIVE = ['awful', 'boring', 'dull', 'terrible', 'waste', 'hated']
NEUTRAL = ['film', 'plot', 'actor', 'scene', 'the', 'a', 'story', 'music',
           'camera', 'ending', 'director', 'cast']


def synthetic_reviews(count, seed):
  """Short reviews whose label two cue words give away."""
  rng = random.Random(seed)
  rows = []
  for i in range(count):
    label = 'pos' if i % 2 else 'neg'
    cues = POSITIVE if label == 'pos' else NEGATIVE
    words = [rng.choice(NEUTRAL) for _ in range(rng.randint(8, 30))]
    for _ in range(2):
      words.insert(rng.randrange(len(words)), rng.choice(cues))
    rows.append({'id': f'{seed}-{i}', 'text': ' '.join(words),
                 'label': label, 'split': 'train' if seed == 0 else 'test'})
  return rows


# The scoring tests' --max_text_bytes.
MAX_TEXT_BYTES = 2000


def corpus_rows(count, seed):
  """Unlabelled reviews to score, each with a ``stars`` field to keep."""
  rows = synthetic_reviews(count, seed)
  for index, row in enumerate(rows):
    row['stars'] = index % 5
    del row['label']
  return rows


def score_args(corpus, model_dir, output_dir, *extra):
  """The job's flags; ``extra`` may set its own --batch_size (a flag is
  given once)."""
  batch = [] if any(flag.startswith('--batch_size') for flag in extra) else [
      '--batch_size=32']
  return [f'--input={corpus}', f'--model_dir={model_dir}',
          f'--output_dir={output_dir}', f'--max_text_bytes={MAX_TEXT_BYTES}',
          *batch, *extra]


def read_partition(folder):
  """A scoring output folder's Parquet files as one table, and their names."""
  files = sorted(f for f in os.listdir(folder) if f.endswith('.parquet'))
  return pa.concat_tables([pq.read_table(os.path.join(folder, f))
                           for f in files]), files


def built_once(tmp_path_factory, name, build):
  """The folder ``name`` that ``build(folder)`` fills once per test session.
  Under pytest-xdist the workers share it: the first to need it builds it
  while the others wait on a lock, so a worker never repeats a training
  another one has done."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    root = root.parent  # this session's, above every worker's own folder
  folder = root / name
  with open(root / f'{name}.lock', 'w', encoding='utf-8') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (folder / '.built').exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir()
      build(folder)
      (folder / '.built').touch()
  return folder


def _preprocess_reviews(folder):
  from pipeline import preprocess
  write_jsonl(folder / 'reviews.jsonl',
              synthetic_reviews(600, 0) + synthetic_reviews(200, 1))
  preprocess.run([f'--input={folder}/reviews.jsonl',
                  f'--output_dir={folder / "preprocessed"}',
                  '--split_field=split', '--max_len=24'])


@pytest.fixture(scope='session')
def synthetic_preprocessed(tmp_path_factory):
  """The preprocessing output of synthetic reviews (max_len 24), made once
  per session; a test that trains on it must leave it as it is."""
  return built_once(tmp_path_factory, 'synthetic',
                    _preprocess_reviews) / 'preprocessed'


# What Keras warned in every training run while it had to find the end of
# an epoch by running out of data, and was offered to shuffle a dataset.
KERAS_INPUT_WARNINGS = ('Your input ran out of data',
                        '`shuffle=True` was passed')


def keras_input_warnings(recorded):
  """The warnings of ``recorded`` (pytest's recwarn) that Keras gives about
  its input."""
  return [str(warning.message) for warning in recorded
          if str(warning.message).startswith(KERAS_INPUT_WARNINGS)]


def _preprocess_padded_reviews(folder):
  from pipeline import preprocess
  write_jsonl(folder / 'reviews.jsonl',
              synthetic_reviews(200, 0) + synthetic_reviews(100, 1))
  preprocess.run([f'--input={folder}/reviews.jsonl',
                  f'--output_dir={folder}/out', '--split_field=split',
                  '--max_len=40'])


@pytest.fixture(scope='session')
def preprocessed(tmp_path_factory):
  """Synthetic reviews of 10 to 32 words through the preprocessing job,
  padded to 40 tokens, made once per session; a test that trains on it
  must leave it as it is."""
  return built_once(tmp_path_factory, 'padded',
                    _preprocess_padded_reviews) / 'out'


def preprocess_rows(folder, rows, *flags):
  """A preprocessing output of ``rows`` (max_len 16), split by their split
  field; returns its folder."""
  from pipeline import preprocess
  write_jsonl(folder / 'rows.jsonl', rows)
  data_dir = folder / 'preprocessed'
  preprocess.run([f'--input={folder}/rows.jsonl', f'--output_dir={data_dir}',
                  '--split_field=split', '--max_len=16', *flags])
  return data_dir


def read_examples(output_dir, split):
  """The transformed examples of one split, parsed with the saved spec."""
  import tensorflow_transform as tft
  spec = tft.TFTransformOutput(output_dir).transformed_feature_spec()
  if split == raw.TRAIN:
    for name in transformed.HELD_OUT_ONLY:
      spec.pop(name)
  files = glob.glob(os.path.join(output_dir,
                                 transformed.split_file_pattern(split)))
  dataset = tf.data.TFRecordDataset(files, compression_type='GZIP')
  return [{k: v.numpy() for k, v in tf.io.parse_single_example(
      record, spec).items()} for record in dataset]


# Flags of a small, fast training run of the transformer: Keras's fit, its
# epochs and checkpoints.
TINY_MODEL = ['--model=transformer', '--batch_size=16', '--embed_dim=8',
              '--ff_dim=8', '--epochs=2', '--folds=0']
# Flags of a training run for a test of what any run does (publishing,
# blessing, the model folder), whatever the model: the n-gram branch alone,
# fitted by the convex solver, about 3 s where TINY_MODEL's takes 10.
QUICK_MODEL = ['--model=nbsvm', '--batch_size=16', '--folds=0']


# The trained fixture's training flags: choices made on validation
# (tests/test_selection.py trains with cross-validation), both branches of
# the hybrid although the train split is small.
TRAIN_FLAGS = ('--epochs=4', '--batch_size=16', '--embed_dim=16',
               '--ff_dim=16', '--seed=7', '--folds=0',
               '--transformer_min_examples=0')


@pytest.fixture(scope='session')
def trained(tmp_path_factory, synthetic_preprocessed):
  """A model trained on a copy of synthetic_preprocessed, the copy deleted
  after the export so everything after must live in the export. Returns
  (model_dir, export_dir, metrics) as train.run gave them."""
  def train_reviews(folder):
    from trainer import train
    data_dir = folder / 'preprocessed'
    shutil.copytree(synthetic_preprocessed, data_dir)
    metrics, export_dir = train.run([
        f'--data_dir={data_dir}', f'--model_dir={folder / "model"}',
        *TRAIN_FLAGS])
    shutil.rmtree(data_dir)
    (folder / 'trained.json').write_text(json.dumps(
        {'metrics': metrics, 'export_dir': export_dir}))

  folder = built_once(tmp_path_factory, 'trainer', train_reviews)
  result = json.loads((folder / 'trained.json').read_text())
  return folder / 'model', result['export_dir'], result['metrics']


class Poisoned:
  """A model that raises on every call given a text with ``poison`` in it,
  and otherwise answers as ``model``; counts its calls."""

  def __init__(self, model, poison: str):
    self._model = model
    self._poison = poison.encode('utf-8')
    self.calls = 0

  def __call__(self, texts):
    self.calls += 1
    if any(self._poison in text for text in texts):
      raise ValueError('poisoned batch')
    return self._model(texts)


POISON = 'poison-pill'


class PoisonedHandler(inference.RawTextModelHandler):
  """The real model, made to raise on any call that holds a document with
  ``poison`` in its text: a document the model cannot take. Put in place
  of ``inference.RawTextModelHandler``, it is the scoring job's. The model
  it loaded last is ``loaded``, for its calls (the tests' pipelines run in
  this process)."""
  poison = POISON
  loaded = None

  def load_model(self):
    model = Poisoned(super().load_model(), self.poison)
    type(self).loaded = model
    return model


class BrokenHandler(PoisonedHandler):
  """A model that raises on every call: every text holds ''."""
  poison = ''


class ConstantClassifier(tf.Module):
  """The export's serving signature, answering ``label`` (the second class)
  at 0.75 to any text."""

  def __init__(self, label='pos'):
    super().__init__()
    self.label = label

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.string, name=serving.TEXT)])
  def classify(self, text):
    count = tf.shape(text)[0]
    return {
        serving.LABEL: tf.fill([count], self.label),
        serving.LABEL_ID: tf.fill([count], tf.constant(1, tf.int64)),
        serving.CONFIDENCE: tf.fill([count], 0.75),
        serving.PROBABILITIES: tf.tile([[0.25, 0.75]], [count, 1]),
    }


def tiny_export(folder, metadata, label='pos'):
  """An export folder as the trainer lays it out, without training."""
  module = ConstantClassifier(label)
  tf.saved_model.save(module, str(folder),
                      signatures={serving.SIGNATURE: module.classify})
  (folder / 'assets.extra').mkdir()
  (folder / serving.METADATA_FILE).write_text(json.dumps(metadata))
  return folder
