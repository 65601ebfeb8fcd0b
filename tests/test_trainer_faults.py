"""The trainer's faults: bad flags and incomplete preprocessing outputs
refused before any work."""
import json
import pathlib
import shutil

import pytest

import cli
from schemas import raw
from schemas import serving
from schemas import transformed
from tests.conftest import main_in_process
from tests.test_fail_loud import tree
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
