"""Both jobs on a Flink session cluster (a JobManager and a TaskManager, two
JVMs on 127.0.0.1, SDK workers in an EXTERNAL worker pool) and on Flink's
embedded mini-cluster, against the default runner (make test-runners)."""
import pytest

from clusters import flink
from tests import runner_checks
from tests.runner_checks import preprocessed_by_default  # pylint: disable=unused-import

pytestmark = pytest.mark.runners


@pytest.fixture(scope='module')
def session(tmp_path_factory):
  with flink.session_cluster(tmp_path_factory.mktemp('flink')) as cluster:
    yield cluster


def named(cluster, name):
  return [job for job in flink.jobs(cluster.rest_url) if job['name'] == name]


def test_preprocess_on_a_flink_cluster(session, preprocessed_by_default,
                                       tmp_path):
  runner_checks.preprocesses_as_the_default_runner(
      session.runner_flags, preprocessed_by_default, tmp_path / 'out')
  # It ran on the cluster, not in a mini-cluster of the job server's.
  assert any(job['state'] == 'FINISHED'
             for job in flink.jobs(session.rest_url))


def test_score_on_a_flink_cluster(session, trained, tmp_path):
  runner_checks.scores_as_the_default_runner(
      session.runner_flags, trained, tmp_path, metrics='committed')


def test_a_failing_model_on_a_flink_cluster_exits_5(session, trained,
                                                     tmp_path):
  runner_checks.a_failing_model_publishes_nothing(session.runner_flags,
                                                   trained, tmp_path)


def test_sigterm_cancels_the_flink_job(session, trained, tmp_path):
  runner_checks.sigterm_cancels_the_job(
      session.runner_flags, trained, tmp_path,
      job_running=lambda name, _: any(
          job['state'] == 'RUNNING' for job in named(session, name)),
      job_cancelled=lambda name: [job['state'] for job in named(
          session, name)] == ['CANCELED'])


def test_preprocess_on_flinks_mini_cluster(preprocessed_by_default, tmp_path):
  runner_checks.preprocesses_as_the_default_runner(
      flink.local_flags(), preprocessed_by_default, tmp_path / 'out')


def test_score_on_flinks_mini_cluster(trained, tmp_path):
  runner_checks.scores_as_the_default_runner(
      flink.local_flags(), trained, tmp_path, metrics='committed')
