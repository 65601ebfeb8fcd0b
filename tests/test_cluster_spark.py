"""Both jobs on a Spark standalone cluster (a Master and a Worker, two JVMs
on 127.0.0.1, SDK workers in an EXTERNAL worker pool), against the default
runner, and the faults a Spark run meets (make test-runners)."""
import os
import signal

import pytest

from clusters import spark
from tests import runner_checks
from tests.conftest import wait_for
from tests.runner_checks import Fault
from tests.runner_checks import preprocessed_by_default  # pylint: disable=unused-import

pytestmark = pytest.mark.runners

# A bound on a run without progress that a test can wait for.
STALL = '--stall_seconds=30'


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
  with spark.standalone_cluster(tmp_path_factory.mktemp('spark')) as running:
    yield running


@pytest.fixture
def own_cluster(tmp_path):
  """A cluster of the test's own, for a fault that breaks it."""
  with spark.standalone_cluster(tmp_path / 'spark') as running:
    yield running


def named(cluster, name):
  """The cluster's active applications of the run whose --job_name is
  ``name``: the launcher names its job NAME-<run>, and Beam's Spark job
  server names each job's application after it, NAME-<run>_<invocation
  id>."""
  return [app for app in spark.applications(cluster.ui_url)['active']
          if app['name'].startswith(f'{name}-')]


def runs_on(cluster):
  return lambda name, _: any(app['state'] == 'RUNNING'
                             for app in named(cluster, name))


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


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGKILL],
                         ids=['sigterm', 'sigkill'])
def test_a_stopped_launcher_ends_its_spark_application(cluster, trained,
                                                       tmp_path, signum):
  """The job server the launcher started is the application's driver:
  stopped with the launcher, SIGKILL too (by its watchdog), it ends the
  application."""
  runner_checks.a_fault_ends_the_run(
      cluster.runner_flags, trained, tmp_path, runner_checks.signalled(signum),
      running=runs_on(cluster), job_ended=lambda name: not named(cluster,
                                                                 name))


def test_a_lost_spark_worker_ends_the_run(own_cluster, trained, tmp_path):
  """Spark's driver waits for executors for ever once its only Worker is
  gone: the launcher gives up after --stall_seconds. Gone as a lost machine
  goes, its executors with it (they share its process group): an executor
  left running could finish the job before the Master saw its Worker
  lost."""
  def kill_the_worker(*_):
    os.killpg(own_cluster.processes['worker'].pid, signal.SIGKILL)

  runner_checks.a_fault_ends_the_run(
      [*own_cluster.runner_flags, STALL], trained, tmp_path,
      # The driver, busy losing its executors, may not answer in time.
      Fault(kill_the_worker, (6,), r'error: no progress for \d+ s '
            r'\(--stall_seconds=30\): (Spark application \S+: 0 executors'
            r'|the Spark driver at \S+ does not answer).*; the job was '
            r'cancelled; nothing was published'),
      running=runs_on(own_cluster))


def test_a_stopped_spark_cluster_ends_the_run(own_cluster, trained, tmp_path):
  """The cluster's services stopped as a service manager stops them: every
  process of each, the Worker's executors with it, also one the Worker
  launched while it stopped (a Worker's own SIGTERM may leave its executor
  to finish the job). Each service runs in a process group of its own,
  which its executors share."""
  def gone(group):
    try:
      os.killpg(group, signal.SIGKILL)  # what is left of it
    except ProcessLookupError:
      return True
    return False

  def stop_the_cluster(*_):
    for role in ('worker', 'master'):
      group = own_cluster.processes[role].pid
      os.killpg(group, signal.SIGTERM)
      own_cluster.processes[role].wait(timeout=60)
      wait_for(lambda: gone(group), seconds=60)

  runner_checks.a_fault_ends_the_run(
      [*own_cluster.runner_flags, STALL], trained, tmp_path,
      Fault(stop_the_cluster, (1, 6), r'error: .*'),
      running=runs_on(own_cluster))
