"""Both jobs on Beam's Prism runner, built from the Go module proxy at the
SDK's version and installed where Beam looks for it, against the default
runner (make test-runners)."""
import signal

import pytest
from apache_beam.runners.portability import prism_runner

from clusters import artifacts
from pipeline import preprocess
from pipeline import score
from tests import runner_checks
from tests.runner_checks import preprocessed_by_default  # pylint: disable=unused-import
from tests.runner_checks import scored_rows

pytestmark = pytest.mark.runners


@pytest.fixture(scope='module')
def prism():
  artifacts.prism_binary()
  # No --prism_location: Beam finds the binary where it would download it.
  return ['--runner=PrismRunner']


def test_preprocess_on_prism(prism, preprocessed_by_default, tmp_path):
  runner_checks.preprocesses_as_the_default_runner(
      prism, preprocessed_by_default, tmp_path / 'out')


def test_score_on_prism(prism, trained, tmp_path):
  runner_checks.scores_as_the_default_runner(prism, trained, tmp_path,
                                              metrics='committed')


def test_direct_runner_runs_the_jobs_on_prism(prism, trained,
                                              preprocessed_by_default,
                                              tmp_path, monkeypatch):
  """DirectRunner sends a pipeline to Prism where it finds Prism and the
  pipeline needs nothing Prism lacks, and falls back to its in-process
  engine otherwise: both jobs' pipelines go to Prism."""
  del prism
  submitted = []
  run_pipeline = prism_runner.PrismRunner.run_pipeline

  def recorded(self, pipeline, options):
    result = run_pipeline(self, pipeline, options)
    submitted.append(result)
    return result

  monkeypatch.setattr(prism_runner.PrismRunner, 'run_pipeline', recorded)
  model_dir, _, _ = trained
  corpus = runner_checks.write_jsonl(
      tmp_path / 'docs.jsonl', runner_checks.synthetic_reviews(40, 45))
  manifest = score.run([f'--input={corpus}', f'--model_dir={model_dir}',
                        f'--output_dir={tmp_path / "out"}',
                        '--runner=DirectRunner'])
  assert manifest['counts']['scored'] == len(scored_rows(tmp_path / 'out'))
  flags, _, default_stats = preprocessed_by_default
  stats = preprocess.run(flags + [f'--output_dir={tmp_path / "pre"}',
                                  '--runner=DirectRunner'])
  assert stats == default_stats
  assert [result.state for result in submitted] == ['DONE', 'DONE']


def test_a_failing_model_on_prism_exits_5(prism, trained, tmp_path):
  runner_checks.a_failing_model_publishes_nothing(prism, trained, tmp_path)


def prism_runs(_, launcher):
  return any('prism' in runner_checks.command_line(pid)
             for pid in runner_checks.children(launcher.pid))


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGKILL],
                         ids=['sigterm', 'sigkill'])
def test_a_stopped_launcher_stops_prism(prism, trained, tmp_path, signum):
  runner_checks.a_fault_ends_the_run(prism, trained, tmp_path,
                                     runner_checks.signalled(signum),
                                     running=prism_runs)
