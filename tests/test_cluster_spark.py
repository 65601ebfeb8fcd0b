"""Both jobs on a Spark standalone cluster (a Master and a Worker, two JVMs
on 127.0.0.1, SDK workers in an EXTERNAL worker pool), against the default
runner (make test-runners)."""
import pytest

from clusters import spark
from tests import runner_checks
from tests.runner_checks import preprocessed_by_default  # pylint: disable=unused-import

pytestmark = pytest.mark.runners


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
  with spark.standalone_cluster(tmp_path_factory.mktemp('spark')) as running:
    yield running


def named(cluster, name):
  """The cluster's active applications of the job ``name``: Beam's Spark job
  server names each job's application NAME_<invocation id>."""
  return [app for app in spark.applications(cluster.ui_url)['active']
          if app['name'].startswith(f'{name}_')]


def test_preprocess_on_a_spark_cluster(cluster, preprocessed_by_default,
                                       tmp_path):
  runner_checks.preprocesses_as_the_default_runner(
      cluster.runner_flags, preprocessed_by_default, tmp_path / 'out')
  # It ran on the cluster's worker, not in the job server's own Spark.
  assert spark.applications(cluster.ui_url)['completed']


def test_score_on_a_spark_cluster(cluster, trained, tmp_path):
  runner_checks.scores_as_the_default_runner(
      cluster.runner_flags, trained, tmp_path, metrics='attempted')


def test_a_failing_model_on_a_spark_cluster_exits_5(cluster, trained,
                                                     tmp_path):
  runner_checks.a_failing_model_publishes_nothing(cluster.runner_flags,
                                                   trained, tmp_path)


def test_sigterm_cancels_the_spark_job(cluster, trained, tmp_path):
  runner_checks.sigterm_cancels_the_job(
      cluster.runner_flags, trained, tmp_path,
      job_running=lambda name, _: any(
          app['state'] == 'RUNNING' for app in named(cluster, name)),
      job_cancelled=lambda name: not named(cluster, name))
