"""Both jobs on a Flink session cluster (a JobManager and a TaskManager, two
JVMs on 127.0.0.1, SDK workers in an EXTERNAL worker pool) and on Flink's
embedded mini-cluster, against the default runner, and the faults a Flink
run meets (make test-runners)."""
import os
import re
import signal
import subprocess
import sys
import zipfile

import pytest

from clusters import artifacts
from clusters import flink
from clusters import processes
from tests import runner_checks
from tests.conftest import REPO
from tests.runner_checks import Fault
from tests.runner_checks import preprocessed_by_default  # pylint: disable=unused-import

pytestmark = pytest.mark.runners


@pytest.fixture(scope='module')
def session(tmp_path_factory):
  with flink.session_cluster(tmp_path_factory.mktemp('flink')) as cluster:
    yield cluster


@pytest.fixture
def own_session(tmp_path):
  """A cluster of the test's own, for a fault that breaks it."""
  with flink.session_cluster(tmp_path / 'flink') as cluster:
    yield cluster


def named(cluster, name):
  """The cluster's jobs of the run whose --job_name is ``name``: the
  launcher names its job NAME-<run>."""
  return [job for job in flink.jobs(cluster.rest_url)
          if job['name'].startswith(f'{name}-')]


def runs_on(cluster):
  return lambda name, _: any(job['state'] == 'RUNNING'
                             for job in named(cluster, name))


def ended_as(cluster, *states):
  return lambda name: [job['state'] for job in named(cluster, name)] in [
      [state] for state in states]


def test_the_cluster_waits_out_a_slow_taskmanager(session):
  """The JobManager waits on a TaskManager's answer for clusters.flink.RPC's
  time, not Flink's default 10 s, past which a TaskManager slowed by a
  loaded machine failed a sound job: the key is the one this Flink reads,
  and the running cluster has the value."""
  (dist_jar,) = (artifacts.home('flink') / 'lib').glob('flink-dist-*.jar')
  with zipfile.ZipFile(dist_jar) as dist:
    options = dist.read('org/apache/flink/configuration/RpcOptions.class')
  configured = {entry['key']: entry['value'] for entry in processes.get_json(
      f'{session.rest_url}/jobmanager/config')}
  for key, value in flink.RPC.items():
    assert key.encode() in options
    assert configured[key] == value


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


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGKILL],
                         ids=['sigterm', 'sigkill'])
def test_a_stopped_launcher_cancels_its_flink_job(session, trained, tmp_path,
                                                  signum):
  """SIGKILL too: the launcher's watchdog cancels the job by its id and
  stops the job server."""
  runner_checks.a_fault_ends_the_run(
      session.runner_flags, trained, tmp_path, runner_checks.signalled(signum),
      running=runs_on(session), job_ended=ended_as(session, 'CANCELED'))


def test_a_launcher_cancels_only_its_own_job(session, trained, tmp_path):
  """Two launchers given one --job_name (a scheduler reusing a name, a rerun
  started before the last one ended), started together: a SIGTERM to one
  cancels its job, by id, and the other publishes."""
  model_dir, _, _ = trained
  corpus = runner_checks.write_jsonl(
      tmp_path / 'large.jsonl',
      runner_checks.synthetic_reviews(runner_checks.LARGE_CORPUS, 44))
  launchers = [runner_checks.start_scoring([
      f'--input={corpus}', f'--model_dir={model_dir}',
      f'--output_dir={tmp_path / run}', '--job_name=nightly',
      *session.runner_flags]) for run in ('kept', 'stopped')]
  kept, stopped = launchers
  runner_checks.wait_for(
      lambda: [job['state'] for job in named(session, 'nightly')] == [
          'RUNNING', 'RUNNING'], process=stopped)
  stopped.send_signal(signal.SIGTERM)
  for launcher, status in ((stopped, 128 + signal.SIGTERM), (kept, 0)):
    _, stderr = launcher.communicate(timeout=600)
    assert launcher.returncode == status, stderr[-3000:]
  assert not (tmp_path / 'stopped').exists()
  assert len(runner_checks.scored_rows(tmp_path / 'kept')) == (
      runner_checks.LARGE_CORPUS)
  assert sorted(job['state'] for job in named(session, 'nightly')) == [
      'CANCELED', 'FINISHED']


def stop(process: subprocess.Popen, signum: int) -> None:
  process.send_signal(signum)
  process.wait(timeout=60)


# A bound on a run without progress that a test can wait for.
STALL = '--stall_seconds=30'


def test_a_lost_taskmanager_ends_the_run(own_session, trained, tmp_path):
  runner_checks.a_fault_ends_the_run(
      [*own_session.runner_flags, STALL], trained, tmp_path,
      Fault(lambda *_: stop(own_session.processes['taskmanager'],
                            signal.SIGKILL), (6,), r'error: no progress .*'),
      running=runs_on(own_session),
      job_ended=ended_as(own_session, 'FAILED', 'CANCELED'))


def test_a_stopped_flink_cluster_ends_the_run(own_session, trained, tmp_path):
  def stop_the_cluster(*_):
    for role in ('taskmanager', 'jobmanager'):
      stop(own_session.processes[role], signal.SIGTERM)

  runner_checks.a_fault_ends_the_run(
      [*own_session.runner_flags, STALL], trained, tmp_path,
      Fault(stop_the_cluster, (1, 6), r'error: .*'),
      running=runs_on(own_session))


def test_preprocess_on_flinks_mini_cluster(preprocessed_by_default, tmp_path):
  runner_checks.preprocesses_as_the_default_runner(
      flink.local_flags(), preprocessed_by_default, tmp_path / 'out')


def test_score_on_flinks_mini_cluster(trained, tmp_path):
  runner_checks.scores_as_the_default_runner(
      flink.local_flags(), trained, tmp_path, metrics='committed')


# Progress lines every second: the mini-cluster's SDK workers run in the
# launcher, whose counts the lines report.
PROGRESS = '--progress_seconds=1'


def scores_on_the_mini_cluster(_, launcher):
  """Documents flow: the launcher's progress line counts them."""
  return any(re.match(r'.* score: [1-9][\d,]* read', line)
             for line in launcher.said)


@pytest.mark.parametrize('signum', [signal.SIGHUP, signal.SIGKILL],
                         ids=['sighup', 'sigkill'])
def test_a_stopped_launcher_stops_flinks_mini_cluster(trained, tmp_path,
                                                      signum):
  runner_checks.a_fault_ends_the_run(
      [*flink.local_flags(), PROGRESS], trained, tmp_path,
      runner_checks.signalled(signum), running=scores_on_the_mini_cluster)


@pytest.mark.parametrize('signum', [signal.SIGHUP, signal.SIGKILL],
                         ids=['sighup', 'sigkill'])
def test_python_m_clusters_stops_its_cluster(tmp_path, signum):
  """A closed terminal (SIGHUP) or SIGKILL ends `python -m clusters flink`
  with every process of its cluster: the JobManager, the TaskManager, the
  worker pool. Its folder's name may hold what YAML and URLs read as
  syntax."""
  run_dir = tmp_path / 'run #1'
  command = subprocess.Popen(
      [sys.executable, '-m', 'clusters', 'flink', f'--run_dir={run_dir}'],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert 'is up' in command.stdout.readline()
  started = runner_checks.descendants(command.pid)
  assert sum('java' in runner_checks.command_line(pid)
             for pid in started) == 2, started
  command.send_signal(signum)
  command.wait(timeout=120)
  runner_checks.wait_for(
      lambda: not any(runner_checks.alive(pid) for pid in started),
      seconds=60)
  assert (run_dir / 'jobmanager.log').exists()
  assert os.listdir(tmp_path) == ['run #1']


def test_python_m_clusters_stopped_while_starting(tmp_path):
  command = subprocess.Popen(
      [sys.executable, '-m', 'clusters', 'flink', f'--run_dir={tmp_path}'],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  runner_checks.wait_for(lambda: any(
      'java' in runner_checks.command_line(pid)
      for pid in runner_checks.descendants(command.pid)), process=command)
  started = runner_checks.descendants(command.pid)
  command.send_signal(signal.SIGTERM)
  out, err = command.communicate(timeout=120)
  assert command.returncode == 128 + signal.SIGTERM
  assert 'is up' not in out
  assert err.splitlines() == ['error: stopped by SIGTERM while starting; '
                              'nothing is left running']
  runner_checks.wait_for(
      lambda: not any(runner_checks.alive(pid) for pid in started),
      seconds=60)


def test_a_killed_job_server_ends_the_run(trained, tmp_path):
  def kill_the_job_server(launcher, _):
    (server,) = [pid for pid in runner_checks.children(launcher.pid)
                 if 'job-server' in runner_checks.command_line(pid)]
    os.kill(server, signal.SIGKILL)

  runner_checks.a_fault_ends_the_run(
      [*flink.local_flags(), PROGRESS], trained, tmp_path,
      Fault(kill_the_job_server, (1,), r"error: the runner's job service "
            r'stopped answering \(\w+: .*\); nothing was published'),
      running=scores_on_the_mini_cluster)


def test_a_job_server_beyond_ascii_runs_under_crons_locale(trained, tmp_path):
  """Cron runs jobs in the C locale, where Java cannot open a path with a
  character beyond ASCII: the launcher gives the job server C.UTF-8."""
  model_dir, _, _ = trained
  jar = artifacts.job_server_jar('flink')
  folder = tmp_path / 'runners café'
  folder.mkdir()
  (folder / jar.name).symlink_to(jar)
  flags = [flag for flag in flink.local_flags()
           if not flag.startswith('--flink_job_server_jar=')]
  corpus = runner_checks.write_jsonl(tmp_path / 'docs.jsonl',
                                     runner_checks.synthetic_reviews(50, 9))
  result = subprocess.run(
      [sys.executable, '-m', 'pipeline.score', f'--input={corpus}',
       f'--model_dir={model_dir}', f'--output_dir={tmp_path / "scores"}',
       f'--flink_job_server_jar={folder / jar.name}', *flags],
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env={**os.environ, 'LC_ALL': 'C'})
  assert result.returncode == 0, result.stderr[-3000:]
  assert len(runner_checks.scored_rows(tmp_path / 'scores')) == 50
