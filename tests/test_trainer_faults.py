"""The trainer's faults: bad flags, a missing or incomplete preprocessing
output and data it cannot train on refused before any work, an export
published only once evaluated, a run that fails or is killed leaving the
previous one as it was, one trainer at a time in a model folder, versions
numbered past every existing one, and a model no better than the majority
class not blessed."""
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

import cli
from pipeline.preprocessing import splits
from schemas import raw
from schemas import serving
from schemas import transformed
from serving import exports
from tests.conftest import REPO
from tests.conftest import main_in_process
from tests.conftest import preprocess_rows
from tests.conftest import run_module
from tests.conftest import synthetic_reviews
from tests.conftest import QUICK_MODEL
from tests.conftest import TINY_MODEL
from tests.conftest import tree
from tests.conftest import wait_for
from trainer import blessing
from trainer import data as data_lib
from trainer import evaluate
from trainer import fitting
from trainer import lock
from trainer import runs
from trainer import train


@pytest.fixture
def previous_model(trained, tmp_path):
  """A copy of the trained fixture's model folder: a run's complete
  output, which later runs in these tests must keep or replace whole.
  Returns (the folder, its export folder)."""
  model_dir, export_dir, _ = trained
  copy = tmp_path / 'model'
  shutil.copytree(model_dir, copy)
  return copy, str(copy / serving.EXPORT_DIR / pathlib.Path(export_dir).name)


def outputs_of_runs(model_dir):
  """Every file a run leaves in ``model_dir`` but its TensorBoard logs
  (one folder a run, kept) and the lock file (rewritten by each run)."""
  return {path: data for path, data in tree(model_dir).items()
          if not path.startswith(runs.LOGS_DIR + os.sep) and
          path != lock.LOCK_FILE}


def leftovers(model_dir):
  return (list(model_dir.glob(runs.SCRATCH_PREFIX + '*')) +
          list((model_dir / serving.EXPORT_DIR).glob(
              runs.STAGING_PREFIX + '*')))


@pytest.mark.parametrize('flag', [
    '--epochs=0', '--epochs=-1', '--batch_size=0', '--dropout=1.5',
    '--num_heads=0', '--embed_dim=0', '--learning_rate=-1',
    '--learning_rate=nan'])
def test_a_bad_flag_is_one_error_line_before_any_work(
    flag, previous_model, synthetic_preprocessed, tmp_path, monkeypatch,
    capsys):
  model_dir, _ = previous_model
  before = tree(model_dir)
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={synthetic_preprocessed}',
      f'--model_dir={model_dir}', flag)
  assert status == cli.EXIT_JOB_ERROR
  (line,) = stderr.strip().splitlines()
  assert line.startswith(f'error: argument {flag.split("=")[0]}: ')
  assert tree(model_dir) == before
  status, _ = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={synthetic_preprocessed}',
      f'--model_dir={tmp_path}/new', flag)
  assert status == cli.EXIT_JOB_ERROR
  assert not (tmp_path / 'new').exists()


def remove(path):
  if path.is_dir():
    shutil.rmtree(path)
  else:
    path.unlink()


def break_file(name, text):
  return lambda data_dir: (data_dir / name).write_text(text)


def drop_count(data_dir):
  stats = json.loads((data_dir / transformed.STATS_FILE).read_text())
  del stats['records']['written'][raw.TEST]
  (data_dir / transformed.STATS_FILE).write_text(json.dumps(stats))


def miscount(data_dir):
  stats = json.loads((data_dir / transformed.STATS_FILE).read_text())
  stats['records']['written'][raw.TRAIN] += 1
  (data_dir / transformed.STATS_FILE).write_text(json.dumps(stats))


def cut_in_half(pattern):
  def cut(data_dir):
    (path,) = data_dir.glob(pattern)
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
  return cut


def reorder_labels(data_dir):
  path = data_dir / 'transform_fn' / 'assets' / 'labels'
  path.write_text('\n'.join(reversed(path.read_text().split())) + '\n')


def add_token(data_dir):
  with open(data_dir / 'transform_fn' / 'assets' / 'tokens', 'a') as tokens:
    tokens.write('another-run\n')


def drop(*names):
  return lambda data_dir: [remove(path) for name in names
                           for path in data_dir.glob(name)]


@pytest.mark.parametrize('damage, message', [
    (drop('transform_fn'), 'no transform_fn/ (the TFT transform graph)'),
    (drop('transformed_metadata', transformed.STATS_FILE),
     'no transformed_metadata/ (the schema of the TFRecords), no stats.json'),
    (drop(transformed.PARAMS_FILE), f'no {transformed.PARAMS_FILE}'),
    (drop('validation-*'), 'no validation-*.tfrecord.gz for the 62 '
     'validation records stats.json counts'),
    (break_file(transformed.STATS_FILE, '{"records": '),
     'stats.json is not readable JSON'),
    (drop_count, 'stats.json has no records.written count'),
    (break_file(transformed.PARAMS_FILE, '{"transform": {}}'),
     f'{transformed.PARAMS_FILE} has no transform.max_len'),
    (drop('transform_fn/assets/labels'), 'labels'),
    (drop('transformed_metadata/schema.pbtxt'), 'schema.pbtxt'),
    (miscount, 'its train files hold '),
    (cut_in_half('train-*'), '.tfrecord.gz cannot be read whole'),
    # Another run's transform graph beside these records and stats.json.
    (reorder_labels, 'its transform graph\'s labels, '),
    (add_token, 'its transform graph\'s token vocabulary, '),
])
def test_an_incomplete_preprocessing_output_is_a_job_error_naming_the_gap(
    damage, message, synthetic_preprocessed, tmp_path, monkeypatch, capsys):
  data_dir = tmp_path / 'preprocessed'
  shutil.copytree(synthetic_preprocessed, data_dir)
  damage(data_dir)
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={data_dir}',
      f'--model_dir={tmp_path}/model')
  assert status == cli.EXIT_JOB_ERROR
  (line,) = [line for line in stderr.splitlines() if line.startswith('error')]
  assert line.startswith(f'error: {data_dir} is not a complete preprocessing '
                         'output: ')
  assert message in line
  assert not (tmp_path / 'model').exists()


def test_trainer_job_error_on_a_missing_data_dir(tmp_path, monkeypatch,
                                                 capsys):
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={tmp_path}/missing',
      f'--model_dir={tmp_path}/model')
  assert status == 2
  assert 'is not a preprocessing output' in stderr.strip().splitlines()[-1]


def test_a_corpus_without_a_shared_ngram_fails_the_default_model(tmp_path):
  # Every document's words are its own: the search (by the folds --folds=auto
  # deals for the convex solver) finds no n-gram in two training documents,
  # and says what would train.
  rows = [{'id': str(i), 'text': f'w{i} x{i}', 'label': 'ab'[i % 2],
           'split': 'train' if i < 40 else ('validation' if i < 50 else 'test')}
          for i in range(60)]
  preprocessed = preprocess_rows(tmp_path, rows)
  with pytest.raises(cli.JobError, match=(
      "no n-gram is in 2 training documents of every fold's training part "
      r'\(the smallest: \d+ examples\): try --model=transformer or '
      '--ngram_min_count=1 or --folds=0')):
    train.run([f'--data_dir={preprocessed}', f'--model_dir={tmp_path}/model'])
  assert not (tmp_path / 'model' / serving.EXPORT_DIR).exists()


def _copies_of_two_texts_hashed_to_train(validation_fraction):
  """Ten copies of each of two texts that both hash to train: a share
  given to validation, but dealt by a hash of the text, reaches none."""
  rows = [{**row, 'text': f"{row['label']} {row['label']}"}
          for row in synthetic_reviews(20, 0)]
  assert {splits.hash_split(row['text'], 0, validation_fraction)
          for row in rows} == {raw.TRAIN}
  return rows + synthetic_reviews(8, 1)


@pytest.mark.parametrize('make_rows, validation_fraction, message', [
    (lambda: [row for row in synthetic_reviews(20, 0) + synthetic_reviews(
        8, 1) if row['label'] == 'pos'], 0.5, 'at least two classes'),
    (lambda: synthetic_reviews(20, 0), 0.5, 'the test split is empty'),
    (lambda: synthetic_reviews(20, 0) + synthetic_reviews(8, 1), 0,
     'the validation split is empty.*preprocess with --validation_fraction '
     '> 0'),
    (lambda: _copies_of_two_texts_hashed_to_train(0.2), 0.2,
     r'the validation split is empty.*--validation_fraction=0\.2 of the '
     'records the data names train or does not name, dealt by a hash of '
     r'each text \(or group\), and they held too few distinct texts'),
])
def test_untrainable_data_is_a_job_error_before_training(
    tmp_path, make_rows, validation_fraction, message):
  data_dir = preprocess_rows(tmp_path, make_rows(),
                             f'--validation_fraction={validation_fraction}')
  with pytest.raises(cli.JobError, match=message):
    train.run([f'--data_dir={data_dir}', f'--model_dir={tmp_path}/model',
               *TINY_MODEL])
  assert not (tmp_path / 'model').exists()


def test_a_failed_evaluation_publishes_nothing_and_the_next_run_all(
    previous_model, synthetic_preprocessed, monkeypatch):
  model_dir, previous_export = previous_model
  before = outputs_of_runs(model_dir)
  real_evaluate = evaluate.evaluate

  def failing(*_):
    assert exports.resolve(str(model_dir)) == previous_export
    raise RuntimeError('evaluation failed')
  monkeypatch.setattr(evaluate, 'evaluate', failing)
  # A tiny model after the fixture's: blessed whatever it scores, as this
  # test is of publishing (tests/test_blessing.py has the gate's).
  flags = [f'--data_dir={synthetic_preprocessed}', f'--model_dir={model_dir}',
           *TINY_MODEL, '--bless_tolerance=1']
  with pytest.raises(RuntimeError, match='evaluation failed'):
    train.run(flags)
  assert exports.resolve(str(model_dir)) == previous_export
  assert outputs_of_runs(model_dir) == before
  assert not leftovers(model_dir)

  # What a killed run leaves, and a hybrid run's n-gram files: the next run
  # removes the first, and replaces the second by its own (none).
  killed = '20261125-000000-abcdef'  # a run's id
  for leftover in (model_dir / f'.run-{killed}',
                   model_dir / serving.EXPORT_DIR / f'.tmp-{killed}'):
    leftover.mkdir()
    (leftover / 'saved_model.pb').write_bytes(b'')
  (model_dir / 'ngram_logits').mkdir(exist_ok=True)  # the fixture's is a hybrid
  (model_dir / 'ngram_logits' / evaluate.HISTORY_FILE).write_text('old')
  monkeypatch.setattr(evaluate, 'evaluate', real_evaluate)
  metrics, export_dir = train.run(flags)
  assert exports.resolve(str(model_dir)) == export_dir != previous_export
  assert int(pathlib.Path(export_dir).name) > int(
      pathlib.Path(previous_export).name)
  metadata = exports.read_metadata(export_dir)
  assert metadata['version'] == int(pathlib.Path(export_dir).name)
  assert metadata[evaluate.EVALUATION]['test']['accuracy'] == (
      metrics[raw.TEST]['accuracy'])
  assert metadata['reference']['documents'] == 200
  assert f'Export version {metadata["version"]}' in (
      model_dir / evaluate.REPORT_FILE).read_text()
  assert json.loads((model_dir / evaluate.METRICS_FILE).read_text()) == metrics
  epochs = (model_dir / evaluate.HISTORY_FILE).read_text().splitlines()
  assert len(epochs) == 1 + metadata['training']['epochs_run']
  assert not leftovers(model_dir)
  assert not (model_dir / 'ngram_logits').exists()
  assert (model_dir / runs.LOGS_DIR / metadata['training']['run_id']).is_dir()


def test_a_trainer_killed_before_publishing_leaves_no_visible_version(
    previous_model, synthetic_preprocessed, tmp_path):
  model_dir, previous_export = previous_model
  before = outputs_of_runs(model_dir)
  staged = tmp_path / 'staged'
  # The trainer itself, stopped where its export is saved and evaluation
  # begins, until it is killed.
  code = (
      'import pathlib, sys, time\n'
      'import cli\n'
      'from trainer import evaluate, train\n'
      'def stalled(export_dir, data):\n'
      f'  pathlib.Path({str(staged)!r}).write_text(export_dir)\n'
      '  time.sleep(600)\n'
      'evaluate.evaluate = stalled\n'
      'cli.main(train.run)\n')
  trainer = subprocess.Popen(
      [sys.executable, '-c', code, f'--data_dir={synthetic_preprocessed}',
       f'--model_dir={model_dir}', *TINY_MODEL], cwd=REPO,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    wait_for(staged.exists, trainer)
  finally:
    trainer.kill()
    trainer.communicate()
  assert trainer.returncode == -signal.SIGKILL
  staging = pathlib.Path(staged.read_text())
  assert (staging / 'saved_model.pb').exists()
  assert staging.name.startswith(runs.STAGING_PREFIX)
  assert exports.resolve(str(model_dir)) == previous_export
  # The previous run's files as they were; the killed run's only in its
  # own folders, which the next run removes.
  after = outputs_of_runs(model_dir)
  assert {path: after.get(path) for path in before} == before
  hidden = (runs.SCRATCH_PREFIX,
            os.path.join(serving.EXPORT_DIR, runs.STAGING_PREFIX))
  assert all(path.startswith(hidden) for path in after if path not in before)


def lock_holder_pid(model_dir):
  try:
    return json.loads((model_dir / lock.LOCK_FILE).read_text())['pid']
  except (OSError, ValueError, KeyError):
    return None


def test_a_second_trainer_on_one_model_dir_is_refused_naming_the_first(
    synthetic_preprocessed, tmp_path):
  model_dir = tmp_path / 'model'
  flags = [f'--data_dir={synthetic_preprocessed}', f'--model_dir={model_dir}',
           *TINY_MODEL]
  # Enough epochs to outlast the second trainer's start.
  first = subprocess.Popen(
      [sys.executable, '-m', 'trainer.train',
       *[flag for flag in flags if not flag.startswith('--epochs=')],
       '--epochs=10000', '--patience=10000'], cwd=REPO,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    wait_for(lambda: lock_holder_pid(model_dir) == first.pid, first)
    second = run_module('trainer.train', *flags)
    assert first.poll() is None
  finally:
    first.send_signal(signal.SIGTERM)
    first.communicate()
  assert second.returncode == cli.EXIT_JOB_ERROR
  errors = [line for line in second.stderr.splitlines()
            if line.startswith('error:')]
  assert len(errors) == 1
  assert f'another trainer (host {socket.gethostname()}, pid {first.pid}' in (
      errors[0])
  # The first, stopped, published nothing and left nothing but its logs:
  # not even its lock file, in the folder it made.
  assert first.returncode == cli.EXIT_TERMINATED
  assert sorted(path.name for path in model_dir.iterdir()) == [runs.LOGS_DIR]


def test_a_version_is_newer_than_every_existing_one(tmp_path):
  future = int(time.time()) + 10**6
  export_root = tmp_path / serving.EXPORT_DIR
  # Only the first is a version: a leading zero, a non-ASCII digit and a
  # number beyond int64 are no version's names.
  for name in (str(future), f'0{future + 5}', '\u00b2', str(2**63)):
    (export_root / name).mkdir(parents=True)
  assert runs.Run(str(tmp_path)).next_version() == future + 1


def test_no_version_beyond_int64_is_published(tmp_path):
  (tmp_path / serving.EXPORT_DIR / str(2**63 - 1)).mkdir(parents=True)
  with pytest.raises(cli.JobError, match='64 bits'):
    runs.Run(str(tmp_path)).next_version()


def test_a_model_no_better_than_the_majority_class_is_not_blessed(
    tmp_path, monkeypatch, capsys):
  # One text for every document: whatever the model learns, it answers one
  # class for all, which on validation is right at most as often as the
  # train split's majority class.
  rows = [{'id': str(index), 'text': 'the film and the plot',
           'label': 'neg' if index % 5 < 3 else 'pos', 'split': split}
          for split, count in ((raw.TRAIN, 60), (raw.VALIDATION, 20),
                               (raw.TEST, 20))
          for index in range(count)]
  data_dir = preprocess_rows(tmp_path, rows, '--validation_fraction=0')
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={data_dir}',
      f'--model_dir={tmp_path}/model', *QUICK_MODEL)
  assert status == cli.EXIT_NOT_BLESSED
  assert "no better than 0.6000, that of always answering 'neg'" in stderr
  assert 'none is blessed' in stderr
  # Published all the same, for whoever names it.
  export_dir = exports.resolve(f'{tmp_path}/model', blessed_only=False)
  assert exports.read_metadata(export_dir)['evaluation'][raw.VALIDATION][
      'majority_baseline'] == 0.6
  with pytest.raises(exports.ExportError, match='no blessed export'):
    exports.resolve(f'{tmp_path}/model')


def test_a_model_better_than_the_majority_class_beats_it():
  metrics = {raw.VALIDATION: {'accuracy': 0.61, 'majority_baseline': 0.6}}
  assert blessing.held_out_figure(metrics) == (0.61, 0.6,
                                               'the validation split')


def test_a_data_folder_republished_while_training_publishes_nothing(
    tmp_path, monkeypatch, synthetic_preprocessed):
  data_dir, model_dir = tmp_path / 'preprocessed', tmp_path / 'model'
  shutil.copytree(synthetic_preprocessed, data_dir)
  flags = [f'--data_dir={data_dir}', f'--model_dir={model_dir}', *QUICK_MODEL]
  _, first = train.run(flags)
  assert exports.read_metadata(first)['preprocessing_fingerprint'] == (
      data_lib.fingerprint_of(str(data_dir)))
  real_fit = fitting.fit

  def fit_then_republish(*args):
    trained = real_fit(*args)
    # What a nightly preprocessing run does: new files, put in place.
    fresh = tmp_path / 'fresh'
    shutil.copytree(data_dir, fresh, copy_function=shutil.copy)
    shutil.rmtree(data_dir)
    fresh.rename(data_dir)
    return trained

  monkeypatch.setattr(fitting, 'fit', fit_then_republish)
  with pytest.raises(cli.JobError, match='changed while the trainer read'):
    train.run(flags)
  assert os.listdir(model_dir / serving.EXPORT_DIR) == [
      os.path.basename(first)]


def test_a_run_killed_before_copying_its_report_is_made_good(
    previous_model, monkeypatch, synthetic_preprocessed):
  model_dir, _ = previous_model
  flags = [f'--data_dir={synthetic_preprocessed}', f'--model_dir={model_dir}',
           *QUICK_MODEL]
  copies = []

  def killed_the_second_time(folder):
    copies.append(folder)
    if len(copies) == 2:  # the new version's, once published
      raise KeyboardInterrupt
    real_copy(folder)

  real_copy = runs.copy_report
  monkeypatch.setattr(runs, 'copy_report', killed_the_second_time)
  with pytest.raises(KeyboardInterrupt):
    train.run(flags)
  newest = exports.resolve(str(model_dir))
  # The version carries its own report, naming it ...
  own = pathlib.Path(runs.report_dir(newest), evaluate.REPORT_FILE)
  version = exports.read_metadata(newest)['version']
  assert f'Export version {version},' in own.read_text()
  assert f'Export version {version},' not in (
      model_dir / evaluate.REPORT_FILE).read_text()
  # ... and the next run copies it to the top as it starts.
  monkeypatch.setattr(runs, 'copy_report', real_copy)
  monkeypatch.setattr(fitting, 'fit', _fail)
  with pytest.raises(RuntimeError):
    train.run(flags)
  assert (model_dir / evaluate.REPORT_FILE).read_text() == own.read_text()


def _fail(*_):
  raise RuntimeError('injected')


def test_a_refitted_model_is_judged_on_the_folds_held_out_predictions():
  # Validation was trained on (0.99 there); the folds' held-out figure is
  # what tells.
  metrics = {raw.VALIDATION: {'accuracy': 0.99, 'majority_baseline': 0.6}}
  refitted_on = {'what': 'cross-validation', 'majority_baseline': 0.6,
                 'after': {'accuracy': 0.55}}
  assert blessing.held_out_figure(metrics, refitted_on) == (
      0.55, 0.6, "cross-validation's held-out predictions")


def test_a_run_that_fails_once_it_holds_the_model_folder_leaves_it_as_it_was(
    previous_model, synthetic_preprocessed, tmp_path, monkeypatch, capsys):
  # Its n-gram statistics cut short: found only once the run has the lock
  # and reads them to fit the n-gram branch by epochs.
  data_dir = tmp_path / 'preprocessed'
  shutil.copytree(synthetic_preprocessed, data_dir)
  cut_in_half('ngrams-*')(data_dir)
  model_dir, _ = previous_model
  before = outputs_of_runs(model_dir)
  for folder in (model_dir, tmp_path / 'new'):
    status, stderr = main_in_process(
        monkeypatch, capsys, train.run, f'--data_dir={data_dir}',
        f'--model_dir={folder}', '--model=nbsvm', '--ngram_fit=epochs',
        '--folds=0')
    assert status == cli.EXIT_JOB_ERROR
    (line,) = [line for line in stderr.splitlines()
               if line.startswith('error')]
    assert 'its n-gram statistics cannot be read' in line
    # TensorFlow's message, without what TensorFlow wraps it in.
    assert re.search(r'cannot be read \(\w', line), line
    assert not re.search(r'function_node|\[Op:|name:', line), line
  assert outputs_of_runs(model_dir) == before
  # The folder it made for itself goes with the run: nothing written.
  assert not (tmp_path / 'new').exists()
