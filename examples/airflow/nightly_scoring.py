"""Nightly scoring DAG: the day's reviews become the day's partition, then
the partition's drift alert picks the branch.

`score_reviews` runs `pipeline.score` on `<input root>/<ds>/*.jsonl` into
`<output root>/dt=<ds>/`, which the job publishes whole or not at all: a
retry or a rerun replaces the partition, a failed run leaves it as it was.
`route_on_drift` reads the partition's `_manifest.json` and goes on to
`review_drift` when `drift.alert` is set, else to `publish`.

A BashOperator, not the Beam provider's BeamRunPythonPipelineOperator: the
job runs with the project's interpreter and its pinned Beam and TensorFlow;
the provider would install apache-beam into Airflow's environment, add
`--runner=DirectRunner` to the job's flags and, off Dataflow, leave the job
running when Airflow kills the task. BashOperator fails the task on every
non-zero exit status (none is kept for skipping) and stops the job with
SIGTERM on a timeout or a kill, which the job answers by removing its
staging folder.

Configuration: environment variables of the Airflow deployment, read when
the file is parsed, else the defaults below. Where the interpreter, the
model and the data live are facts of the host, the same for every run; as
Params, whoever triggers a run could choose what the worker executes and
which folder it replaces.
"""
import datetime
import json
import os

from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, ObjectStoragePath, task

PROJECT_PYTHON = os.environ.get('SCORING_PROJECT_PYTHON',
                                '/srv/beam-text-classifier/.venv/bin/python')
MODEL_DIR = os.environ.get('SCORING_MODEL_DIR', '/models/reviews')
INPUT_ROOT = os.environ.get('SCORING_INPUT_ROOT', '/data/reviews')
OUTPUT_ROOT = os.environ.get('SCORING_OUTPUT_ROOT', '/warehouse/review_scores')

with DAG(
    dag_id='nightly_scoring',
    # In Airflow 3 a cron schedule's ds is the day the run fires, as
    # $(date -u +%F) in the cron line of docs/operations.md.
    schedule='15 2 * * *',
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc),
    catchup=False,
):
  score_reviews = BashOperator(
      task_id='score_reviews',
      # The paths reach bash as variables, so none of their characters is
      # ever read as shell syntax; the job expands the quoted glob itself.
      bash_command=(
          '"$PROJECT_PYTHON" -m pipeline.score'
          ' --input="$INPUT_ROOT/{{ ds }}/*.jsonl" --model_dir="$MODEL_DIR"'
          ' --output_dir="$OUTPUT_ROOT" --partition=dt={{ ds }}'),
      env={'PROJECT_PYTHON': PROJECT_PYTHON, 'MODEL_DIR': MODEL_DIR,
           'INPUT_ROOT': INPUT_ROOT, 'OUTPUT_ROOT': OUTPUT_ROOT},
      append_env=True,  # PATH, HOME, TMPDIR... as the worker has them
      skip_on_exit_code=None,
      # Worth it after a stop (129, 130, 143), an unexpected failure (1), a
      # cluster that made no progress (6) or an input not there yet (2); a
      # bad corpus (3, 4) or model (5) fails the same way again, harmlessly:
      # a retry is a rerun of the partition.
      retries=2,
      retry_delay=datetime.timedelta(minutes=10),
      execution_timeout=datetime.timedelta(hours=4),
  )

  @task.branch
  def route_on_drift(ds=None):
    """A partition whose scores drifted from the test split's goes to a
    person before its consumers are told of it; the others go on."""
    manifest = ObjectStoragePath(OUTPUT_ROOT) / f'dt={ds}' / '_manifest.json'
    drift = json.loads(manifest.read_text())['drift']
    return 'review_drift' if drift['alert'] else 'publish'

  # Stand-ins for what follows in a warehouse: announcing the partition to
  # its readers, or asking a person to look at its `_report.png`.
  publish = EmptyOperator(task_id='publish')
  review_drift = EmptyOperator(task_id='review_drift')

  score_reviews >> route_on_drift() >> [publish, review_drift]
