"""The nightly scoring DAG, run by Airflow itself: `dag.test()` in a fresh
AIRFLOW_HOME with a SQLite metadata DB, against a small model trained here.

Airflow's own environment runs this file (`make test-airflow`); the jobs run
with $PROJECT_PYTHON, in the project's environment, as the DAG runs them in
production, so that neither environment's pins touch the other's.
"""
import datetime
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DAG_FILE = pathlib.Path(__file__).with_name('nightly_scoring.py')
PROJECT_PYTHON = os.environ.get('PROJECT_PYTHON',
                                str(REPO / '.venv' / 'bin' / 'python'))
CUES = {'pos': ['great', 'superb', 'moving', 'loved'],
        'neg': ['awful', 'dull', 'boring', 'hated']}
FILLER = ['film', 'plot', 'actor', 'scene', 'the', 'story', 'music', 'cast']
ALL_TASKS = ('score_reviews', 'route_on_drift', 'publish', 'review_drift')


def reviews(count, seed, labels=('neg', 'pos'), split=None):
  """Short reviews, the labels taken in turn, each given away by two cue
  words: a model learns them in a few epochs."""
  rng = random.Random(seed)
  rows = []
  for index in range(count):
    label = labels[index % len(labels)]
    words = rng.choices(FILLER, k=rng.randint(8, 20)) + rng.choices(
        CUES[label], k=2)
    rng.shuffle(words)
    rows.append({'id': f'{seed}-{index}', 'text': ' '.join(words),
                 'label': label, 'split': split})
  return rows


def write_jsonl(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(''.join(json.dumps(row) + '\n' for row in rows),
                  encoding='utf-8')


def project_job(module, *flags):
  """Runs one of the project's jobs with the project's interpreter, from the
  checkout, so that its packages are the ones under test."""
  job = subprocess.run([PROJECT_PYTHON, '-m', module, *flags], cwd=REPO,
                       capture_output=True, text=True, check=False)
  assert job.returncode == 0, job.stderr[-3000:]


def scored_ids(partition):
  """The ids of a partition's Parquet rows, read by pyarrow in the project's
  environment (Airflow's has no pyarrow)."""
  read = ('import sys, pyarrow.dataset as ds; print(*ds.dataset(sys.argv[1])'
          '.to_table(columns=["id"])["id"].to_pylist(), sep="\\n")')
  ids = subprocess.run([PROJECT_PYTHON, '-c', read, str(partition)],
                       capture_output=True, text=True, check=True).stdout
  return sorted(ids.split())


def snapshot(folder):
  """Every file under ``folder`` with its bytes."""
  return {path.relative_to(folder): path.read_bytes()
          for path in folder.rglob('*') if path.is_file()}


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
  """A model trained on synthetic reviews as the suite's `trained` fixture
  trains one: a few epochs, small dimensions."""
  folder = tmp_path_factory.mktemp('model')
  write_jsonl(folder / 'reviews.jsonl', reviews(600, 0, split='train') +
              reviews(200, 1, split='test'))
  project_job('pipeline.preprocess', f'--input={folder}/reviews.jsonl',
              f'--output_dir={folder}/preprocessed', '--split_field=split',
              '--max_len=24')
  project_job('trainer.train', f'--data_dir={folder}/preprocessed',
              f'--model_dir={folder}/model', '--epochs=4', '--batch_size=16',
              '--embed_dim=16', '--ff_dim=16', '--seed=7')
  return folder / 'model'


class NightlyRuns:
  """The DAG with its input and output roots: a run for a day writes the
  day's input, lets Airflow run the DAG for it and returns the DagRun's
  state with its tasks'."""

  def __init__(self, dag, data):
    self.dag = dag
    self.input_root = data / 'reviews'
    self.output_root = data / 'scores'

  def run(self, day, rows):
    folder = self.input_root / day
    shutil.rmtree(folder, ignore_errors=True)
    write_jsonl(folder / 'reviews.jsonl', rows)
    logical_date = datetime.datetime.fromisoformat(day).replace(
        tzinfo=datetime.timezone.utc)
    dag_run = self.dag.test(logical_date=logical_date)
    return dag_run.state, {instance.task_id: instance.state
                           for instance in dag_run.get_task_instances()}

  def partition(self, day):
    return self.output_root / f'dt={day}'


@pytest.fixture(scope='module')
def nightly(tmp_path_factory, model_dir):
  """The DAG as Airflow finds it in the dags folder of a fresh AIRFLOW_HOME,
  whose SQLite DB `airflow db migrate` made. Its scoring task has no
  retries here, so that a failed run is final at once instead of waiting
  for the retry delay."""
  home = tmp_path_factory.mktemp('airflow_home')
  data = tmp_path_factory.mktemp('data')
  (home / 'dags').mkdir()
  (home / 'dags' / DAG_FILE.name).symlink_to(DAG_FILE)
  settings = {
      'AIRFLOW_HOME': home, 'AIRFLOW__CORE__DAGS_FOLDER': home / 'dags',
      'AIRFLOW__CORE__LOAD_EXAMPLES': 'False',
      'SCORING_PROJECT_PYTHON': PROJECT_PYTHON, 'SCORING_MODEL_DIR': model_dir,
      'SCORING_INPUT_ROOT': data / 'reviews',
      'SCORING_OUTPUT_ROOT': data / 'scores',
      # The checkout's packages, whatever the interpreter has installed.
      'PYTHONPATH': REPO}
  with pytest.MonkeyPatch.context() as environment:
    for name, value in settings.items():
      environment.setenv(name, str(value))
    subprocess.run([sys.executable, '-m', 'airflow', 'db', 'migrate'],
                   capture_output=True, check=True)
    # Airflow reads its configuration when first imported: only now.
    from airflow.dag_processing.dagbag import DagBag
    dag = DagBag(dag_folder=str(home / 'dags')).dags['nightly_scoring']
    dag.task_dict['score_reviews'].retries = 0
    yield NightlyRuns(dag, data)


DAY = '2026-11-21'


@pytest.fixture(scope='module')
def published(nightly):
  """DAY's first run, on a balanced corpus: its reviews and the run."""
  rows = reviews(300, 2)
  return rows, nightly.run(DAY, rows)


def test_a_run_writes_its_partition_and_publishes_it(nightly, published):
  rows, (state, tasks) = published
  assert state == 'success'
  assert tasks == dict(zip(ALL_TASKS,
                           ['success', 'success', 'success', 'skipped']))
  partition = nightly.partition(DAY)
  assert (partition / '_SUCCESS').is_file()
  assert scored_ids(partition) == sorted(row['id'] for row in rows)


def test_a_rerun_replaces_the_partition(nightly, published):
  rows = reviews(240, 3)
  state, _ = nightly.run(DAY, rows)
  assert state == 'success'
  assert scored_ids(nightly.partition(DAY)) == sorted(
      row['id'] for row in rows)


def test_a_failing_run_fails_its_task_and_keeps_the_partition(
    nightly, published, capfd):
  before = snapshot(nightly.partition(DAY))
  blank = [{'id': f'blank-{index}', 'text': ' \t '} for index in range(50)]
  state, tasks = nightly.run(DAY, blank)
  assert state == 'failed'
  assert tasks == dict(zip(ALL_TASKS, ['failed'] + ['upstream_failed'] * 3))
  assert snapshot(nightly.partition(DAY)) == before
  # The job's own refusal, not an interpreter that failed to start.
  task_log = capfd.readouterr().out
  assert 'so the job did not start (empty_text 50' in task_log
  assert 'non-zero exit code 2.' in task_log


def test_drifted_scores_go_to_review_instead_of_publish(nightly):
  day = '2026-11-22'
  state, tasks = nightly.run(day, reviews(300, 4, labels=('pos',)))
  assert state == 'success'
  assert tasks == dict(zip(ALL_TASKS,
                           ['success', 'success', 'skipped', 'success']))
  manifest = json.loads(
      (nightly.partition(day) / '_manifest.json').read_text(encoding='utf-8'))
  assert manifest['drift']['alert']
