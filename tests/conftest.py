"""Shared fixtures: the dataset cache, fetched corpora, a job runner."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
import pytest

from pipeline import jobs

REPO = pathlib.Path(__file__).resolve().parent.parent
DATASET_CACHE = pathlib.Path(
    os.environ.get('DATASET_CACHE', REPO.parent / 'shared' / 'datasets'))


def require_cache():
  if not (DATASET_CACHE / 'SHA256SUMS').exists():
    pytest.skip(f'no dataset cache at {DATASET_CACHE} (set DATASET_CACHE)')
  return str(DATASET_CACHE)


@pytest.fixture(scope='session')
def corpora(tmp_path_factory):
  """Fetches a corpus once per session; returns its folder."""
  from pipeline import datasets
  dest = tmp_path_factory.mktemp('corpora')
  fetched = {}

  def get(name):
    if name not in fetched:
      fetched[name] = datasets.fetch(name, str(dest), require_cache())
    return fetched[name]
  return get


def run_module(module, *args, timeout=600):
  """Runs ``python -m module args`` as a user would; returns the process."""
  return subprocess.run([sys.executable, '-m', module, *map(str, args)],
                        capture_output=True, text=True, timeout=timeout,
                        cwd=REPO)


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
