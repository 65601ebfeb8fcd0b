"""What every runner beyond the default must give (tests/test_runners.py,
tests/test_cluster_*.py): the default runner's preprocessing output and
scores, exit 5 with nothing published for a model that fails on every
batch, and, whatever fault ends a run (a signal to the launcher, SIGKILL
included; a worker killed; the cluster stopped), a bounded end with one
error line, the published partition as it was, nothing of the run left
running, and a rerun that publishes.
Each check takes the runner's flags; the clusters come from ``clusters``."""
import contextlib
import glob
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from typing import Callable, NamedTuple, Optional, Tuple

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
import tensorflow_transform as tft

import cli
from pipeline import preprocess
from pipeline import score
from schemas import raw
from schemas import scored
from schemas import serving
from schemas import transformed
from serving import ngrams as serving_ngrams
from tests.conftest import dead_letters
from tests.conftest import float32_approx
from tests.conftest import start_scoring
from tests.conftest import synthetic_reviews
from tests.conftest import tree
from tests.conftest import wait_for
from tests.conftest import write_jsonl



def scored_rows(output_dir):
  """The scored rows, in id order."""
  table = pa.concat_tables(
      pq.read_table(path) for path in glob.glob(f'{output_dir}/*.parquet'))
  return table.sort_by(scored.ID).to_pylist()


def assert_same_scores(ours, reference):
  """Same documents, labels and model; probabilities equal up to float
  rounding (batches differ between runners, and with them TF's kernels)."""
  assert len(ours) == len(reference)
  for mine, theirs in zip(ours, reference):
    for column, value in theirs.items():
      if column.startswith(scored.PROBABILITY_PREFIX) or (
          column == scored.CONFIDENCE):
        assert mine[column] == float32_approx(value)
      elif column != scored.SCORED_AT:
        assert mine[column] == value, column


def score_on_and_off(runner_args, trained, tmp_path, rows,
                     on_runner=contextlib.nullcontext()):
  """Scores the same corpus on a runner (inside the context ``on_runner``)
  and on the default one; checks that they agree and returns the runner's
  manifest."""
  model_dir, _, _ = trained
  corpus = write_jsonl(tmp_path / 'docs.jsonl', rows)
  common = [f'--input={corpus}', f'--model_dir={model_dir}',
            '--batch_size=16']
  with on_runner:
    ours = score.run(common + [f'--output_dir={tmp_path / "runner"}',
                               *runner_args])
  default = score.run(common + [f'--output_dir={tmp_path / "default"}'])
  assert ours['counts'] == default['counts']
  assert_same_scores(scored_rows(tmp_path / 'runner'),
                     scored_rows(tmp_path / 'default'))
  assert dead_letters(tmp_path / 'runner') == dead_letters(
      tmp_path / 'default')
  return ours


def long_tailed_reviews(count, seed):
  """Reviews over 400 words of long-tailed frequencies, in mixed case with
  HTML and punctuation for the transform to remove, two thirds of them
  train: many words share a count, so a small vocabulary's cut runs through
  ties, and many reviews are longer than a small max_len."""
  rng = random.Random(seed)
  words = [f'word{n}' for n in range(400)]
  weights = [1 / (n + 1) for n in range(400)]
  rows = []
  for i in range(count):
    tokens = rng.choices(words, weights, k=rng.randint(4, 40))
    tokens.insert(rng.randrange(len(tokens)), rng.choice(
        ['<br />', 'Great!', 'DULL...', '"quoted"']))
    rows.append({'id': f'{seed}-{i}', 'text': ' '.join(tokens),
                 'label': 'pos' if i % 2 else 'neg',
                 'split': 'test' if i % 3 == 0 else 'train'})
  return rows


# A dead letter of each route: the reader, the record checks, and the
# held-out label check, which waits for the train labels as a side input.
REJECTED_ROWS = [b'{"id": "broken", "text": ', {'id': 'blank', 'text': ' '},
                 {'id': 'unlabelled', 'text': 'word1', 'split': 'train'},
                 {'id': 'new-label', 'text': 'word2', 'label': 'meh',
                  'split': 'test'}]
# Input files, ranges read by the partitions of the Dask run: more
# partitions (--dask_npartitions) than the cluster's two workers.
INPUT_FILES = 6


@pytest.fixture(scope='module')
def preprocessed_by_default(tmp_path_factory):
  """A corpus in several JSONL files and the default runner's output of it:
  (the job's flags, output folder, stats)."""
  folder = tmp_path_factory.mktemp('preprocessed-by-default')
  rows = long_tailed_reviews(360, 5)
  for index in range(INPUT_FILES):
    write_jsonl(folder / f'reviews-{index}.jsonl', rows[index::INPUT_FILES] + (
        REJECTED_ROWS if index == 0 else []))
  flags = [f'--input={folder}/reviews-*.jsonl', '--split_field=split',
           '--vocab_size=60', '--max_len=16']
  stats = preprocess.run(flags + [f'--output_dir={folder / "default"}'])
  return flags, folder / 'default', stats


def parsed_examples(output_dir, split):
  """Each tf.Example of a split as a dict of its features' values, in id
  order: equal lists are the same records, each as often."""
  files = glob.glob(os.path.join(output_dir,
                                 transformed.split_file_pattern(split)))
  examples = []
  for record in tf.data.TFRecordDataset(files, compression_type='GZIP'):
    features = tf.train.Example.FromString(record.numpy()).features.feature
    examples.append({name: list(getattr(value, value.WhichOneof('kind')).value)
                     for name, value in features.items()})
  return sorted(examples, key=lambda example: example[transformed.ID])


def ngram_statistics(output_dir, stats):
  """The n-gram statistics as the trainer reads them: equal tuples are the
  same n-grams with the same counts."""
  found = serving_ngrams.read_statistics(
      str(output_dir), transformed.NGRAM_MAX_ORDER,
      len(stats['labels']['names']))
  return found.keys.tolist(), found.counts.tolist()


def vocabularies(output_dir):
  assets = os.path.join(output_dir, tft.TFTransformOutput.TRANSFORM_FN_DIR,
                        'assets')
  return {name: (pathlib.Path(assets) / name).read_bytes()
          for name in (transformed.TOKEN_VOCABULARY,
                       transformed.LABEL_VOCABULARY)}


def preprocesses_as_the_default_runner(flags, preprocessed_by_default,
                                       output_dir):
  job_flags, default_dir, default_stats = preprocessed_by_default
  stats = preprocess.run(job_flags + [f'--output_dir={output_dir}', *flags])
  assert stats == default_stats
  assert stats['rejected_by_reason'] == {
      'malformed_record': 1, 'empty_text': 1, 'missing_label': 1,
      'label_not_in_train': 1}
  assert vocabularies(output_dir) == vocabularies(default_dir)
  statistics = ngram_statistics(output_dir, stats)
  assert statistics == ngram_statistics(default_dir, default_stats)
  assert statistics[0]
  for split in raw.SPLITS:
    examples = parsed_examples(output_dir, split)
    assert examples == parsed_examples(default_dir, split), split
    assert len(examples) == stats['records']['written'][split] > 0
  assert dead_letters(output_dir) == dead_letters(default_dir)


def scores_as_the_default_runner(flags, trained, tmp_path, metrics):
  """``metrics``: how the runner reports RunInference's metrics, as the
  manifest says (committed, attempted)."""
  rows = synthetic_reviews(300, 41)
  manifest = score_on_and_off(flags, trained, tmp_path,
                              rows + [{'id': 'bad', 'text': ''}])
  assert manifest['counts']['scored'] == 300
  assert manifest['counts']['rejected'] == 1
  assert manifest['inference']['reported'] == metrics
  assert manifest['inference']['documents'] == 300
  assert manifest['inference'].get('failed_batches', 0) == 0
  return manifest


class _PoisonedClassifier(tf.Module):
  """The trained export's serving signature, failing on any batch that holds
  a document with 'poison' in it."""

  def __init__(self, export_dir):
    super().__init__()
    self.real = tf.saved_model.load(export_dir)

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.string, name=serving.TEXT)])
  def classify(self, text):
    poisoned = tf.reduce_any(tf.strings.regex_full_match(text, '.*poison.*'))
    tf.debugging.assert_equal(poisoned, False, message='poisoned batch')
    return self.real.signatures[serving.SIGNATURE](text=text)


def poisoned_export(export_dir, folder: pathlib.Path) -> pathlib.Path:
  """A copy of the export that fails in every worker process on any batch
  holding a 'poison' document: a model failure no monkeypatch of the
  launcher could fake on a cluster."""
  module = _PoisonedClassifier(export_dir)
  tf.saved_model.save(module, str(folder),
                      signatures={serving.SIGNATURE: module.classify})
  shutil.copytree(pathlib.Path(export_dir, 'assets.extra'),
                  folder / 'assets.extra')
  return folder


def publish_a_partition(trained, output_dir, rows=20):
  """Scores a small corpus into output_dir/dt=1 on the default runner;
  returns the folder's tree, which a failed or stopped run must leave."""
  model_dir, _, _ = trained
  corpus = write_jsonl(pathlib.Path(output_dir).parent / 'first.jsonl',
                       synthetic_reviews(rows, 42))
  score.run([f'--input={corpus}', f'--model_dir={model_dir}',
             f'--output_dir={output_dir}', '--partition=dt=1'])
  return tree(output_dir)


def a_failing_model_publishes_nothing(flags, trained, tmp_path):
  _, export_dir, _ = trained
  output_dir = tmp_path / 'scores'
  published = publish_a_partition(trained, output_dir)
  # The first documents pass the launcher's check of the model; every
  # batch after them holds poison.
  rows = synthetic_reviews(60, 43)
  for row in rows[9:]:
    row['text'] += ' poison'
  corpus = write_jsonl(tmp_path / 'poisoned.jsonl', rows)
  model = poisoned_export(export_dir, tmp_path / 'poisoned-export')
  process = start_scoring([f'--input={corpus}', f'--model_dir={model}',
                           f'--output_dir={output_dir}', '--partition=dt=1',
                           '--batch_size=20', *flags])
  _, stderr = process.communicate(timeout=600)
  assert process.returncode == cli.EXIT_MODEL_FAILED, stderr[-3000:]
  errors = [line for line in stderr.splitlines()
            if line.startswith('error: ')]
  # However the runner cut the batches, each failed whole, then document by
  # document.
  assert len(errors) == 1 and re.match(
      r'error: the model failed on \d+ documents of a batch, each alone '
      r'.*InvalidArgumentError', errors[0]), errors
  assert tree(output_dir) == published


def children(pid: int):
  """The processes whose parent is ``pid`` (a runner's job server or Prism)."""
  found = []
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat', encoding='utf-8') as stat:
          fields = stat.read().rsplit(')', 1)[1].split()
      except OSError:
        continue
      if int(fields[1]) == pid:
        found.append(int(entry))
  return found


def command_line(pid: int) -> str:
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as cmdline:
      return cmdline.read().replace(b'\0', b' ').decode(errors='replace')
  except OSError:
    return ''


def alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as stat:
      return stat.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


def descendants(pid: int):
  """Every process below ``pid``: its children, theirs, and so on."""
  found = children(pid)
  for child in list(found):
    found.extend(descendants(child))
  return found


# Documents the runners take about a minute to score: a job to stop while it
# runs.
LARGE_CORPUS = 100_000


class Fault(NamedTuple):
  """What happens to a run on a runner, and how the run must end."""
  # Does it to the run, given the launcher process and the job's name.
  inject: Callable[[subprocess.Popen, str], None]
  # The launcher's exit statuses that may end it (negative: the signal
  # that killed it): a runner that notices the fault fails the job (1)
  # unless no progress for --stall_seconds ended it first (6).
  status: Tuple[int, ...]
  # What the launcher's last line of standard error, its one error line,
  # matches; None where it was killed and says nothing.
  error: Optional[str]
  # Seconds from the fault to the launcher's end.
  bound: float = 120


def signalled(signum: int) -> Fault:
  """A signal to the launcher: a scheduler's SIGTERM, a closed terminal's
  SIGHUP, SIGINT, or SIGKILL (the OOM killer, a preempted node)."""
  if signum == signal.SIGKILL:
    return Fault(lambda launcher, _: launcher.kill(), (-signal.SIGKILL,),
                 None)
  return Fault(lambda launcher, _: launcher.send_signal(signum),
               (128 + signum,),
               f'error: stopped by {signal.Signals(signum).name}; nothing '
               'was published')


def a_fault_ends_the_run(flags, trained, tmp_path, fault: Fault, running,
                         job_ended=lambda name: True):
  """A run of the scoring job on a runner (its ``flags``), once
  ``running(job name, launcher)`` holds (``launcher.said``: the lines of
  standard error so far), suffers ``fault``: the launcher
  ends within the fault's bound, with its status and one error line, the
  last; the published partition stays as it was; every process the run
  started ends, the cluster's job with it (``job_ended(name)`` comes true);
  and a rerun publishes."""
  model_dir, _, _ = trained
  output_dir = tmp_path / 'scores'
  published = publish_a_partition(trained, output_dir)
  corpus = write_jsonl(tmp_path / 'large.jsonl',
                       synthetic_reviews(LARGE_CORPUS, 44))
  name = f'fault-{os.getpid()}-{time.monotonic_ns()}'
  launcher = start_scoring([f'--input={corpus}', f'--model_dir={model_dir}',
                            f'--output_dir={output_dir}', '--partition=dt=1',
                            f'--job_name={name}', *flags])
  # Read while it runs: a launcher whose pipe is full would wait on it.
  said = launcher.said = []
  reading = threading.Thread(target=lambda: said.extend(launcher.stderr))
  reading.start()
  try:
    wait_for(lambda: running(name, launcher) or launcher.poll() is not None)
    assert launcher.poll() is None, ''.join(said)[-3000:]
    started = descendants(launcher.pid)
    fault.inject(launcher, name)
    launcher.wait(timeout=fault.bound)
  finally:
    if launcher.poll() is None:
      launcher.kill()
  # Its watchdog, still cleaning up, holds the pipe too.
  reading.join(timeout=120)
  stderr = ''.join(said)
  assert launcher.returncode in fault.status, stderr[-3000:]
  lines = stderr.splitlines()
  errors = [line for line in lines if line.startswith('error: ')]
  if fault.error is None:
    assert not errors, errors
    assert any(line.startswith('watchdog: ') for line in lines), (
        stderr[-3000:])
  else:
    assert errors == lines[-1:] and re.fullmatch(fault.error, errors[0]), (
        stderr[-3000:])
  assert tree(output_dir) == published
  wait_for(lambda: job_ended(name), seconds=60)
  wait_for(lambda: not any(alive(pid) for pid in started), seconds=60)
  rerun = score.run([f'--input={tmp_path / "first.jsonl"}',
                     f'--model_dir={model_dir}', f'--output_dir={output_dir}',
                     '--partition=dt=1'])
  assert rerun['counts']['scored'] == len(scored_rows(output_dir / 'dt=1'))
  assert tree(output_dir) != published
  print(f'{launcher.returncode}: {lines[-1]}')  # what an operator reads
