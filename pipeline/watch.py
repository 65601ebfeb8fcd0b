"""Waiting for a job on a cluster: bounded by its progress, cancelled by its
id.

A job on a cluster can stop making progress without failing: a Spark
application whose Worker died waits for executors for ever, a Flink job
whose TaskManager is gone waits for slots. While the launcher waits, it
looks at the job as the cluster's own API shows it (a ``View``: Flink's
REST API, the Spark driver's), logs what it sees every
``--progress_seconds``, and gives up, cancelling the job, once nothing has
changed for ``--stall_seconds``: no task finished, no record moved.

Each run's job has a name of its own on the cluster (``unique_job_name``),
by which the launcher finds the id the cluster gave it; from then on it
cancels that id, never a name, and it registers the cancel with the
process's watchdog (``cli.lifetime``), which runs it if the launcher dies
without doing so.

Beam-free on import: the watchdog runs ``python -m pipeline.watch cancel
flink URL ID``.
"""
import json
import logging
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Callable, List, Optional, Tuple

import cli
from cli import lifetime

# How often the launcher looks at its job.
POLL_SECONDS = 5
# How long a request to a cluster's API may take.
_REQUEST_SECONDS = 10
# Job states after which Flink runs nothing more of the job.
_FLINK_ENDED = ('FINISHED', 'CANCELED', 'FAILED')


class NoProgress(cli.JobError):
  """The runner showed no progress for --stall_seconds; the job was
  cancelled."""
  exit_status = cli.EXIT_NO_PROGRESS


def unique_job_name(given: Optional[str]) -> str:
  """The job's name on a cluster: the --job_name given (or the project's
  name) and a suffix of this run's, so that two launchers given one name
  never take each other's job for their own."""
  return f'{given or "beam-text-classifier"}-{uuid.uuid4().hex[:8]}'


def _request(url: str, method: str = 'GET'):
  request = urllib.request.Request(url, method=method)
  with urllib.request.urlopen(request, timeout=_REQUEST_SECONDS) as response:
    body = response.read()
  return json.loads(body) if body.strip() else None


class View:
  """What the launcher sees of its job on a runner. This base sees nothing
  beyond the job service's state, and judges no progress."""
  # Whether the job runs on a cluster the job service's cancel does not
  # reach.
  remote = False

  def submitting(self) -> None:
    """Called before the job is submitted."""

  def observe(self) -> Tuple[Optional[object], str]:
    """(what changes when the job progresses, or None where this view
    cannot tell; the runner's state in words)."""
    return None, ''

  def cancel(self) -> bool:
    """Cancels the job on the cluster by its id, beyond what the job
    service's cancel does; whether it is cancelled (or was never there)."""
    return True

  def ended(self) -> None:
    """The job has ended: nothing is left for the watchdog to cancel."""


class FlinkView(View):
  """A job on a Flink cluster, through its REST API."""
  remote = True

  def __init__(self, rest_url: str, job_name: str):
    self._rest_url = rest_url.rstrip('/')
    self._job_name = job_name
    self._job_id = None

  @property
  def _exit_key(self) -> str:
    return f'Flink job {self._job_name}'

  def _on_exit(self) -> None:
    """Has the watchdog cancel the job: by its id once known; until then
    by this run's name for it, which no other job has."""
    lifetime.on_exit(self._exit_key, [
        sys.executable, '-m', 'pipeline.watch', 'cancel', 'flink',
        self._rest_url, self._job_name, *([self._job_id] if self._job_id
                                          else [])])

  def submitting(self):
    self._on_exit()

  def _find(self) -> Optional[str]:
    if self._job_id is None:
      self._job_id = flink_job_id(self._rest_url, self._job_name)
      if self._job_id is not None:
        self._on_exit()
    return self._job_id

  def observe(self):
    try:
      job_id = self._find()
      if job_id is None:
        return None, (f'the job {self._job_name} is not on the Flink cluster '
                      f'at {self._rest_url} yet')
      job = _request(f'{self._rest_url}/jobs/{job_id}')
      managers = _request(f'{self._rest_url}/taskmanagers')['taskmanagers']
    except (OSError, ValueError, KeyError) as error:
      return _unanswered(self._job_id, f'the Flink cluster at '
                         f'{self._rest_url} does not answer ({error})')
    vertices = job.get('vertices', [])
    moved = tuple(
        (vertex['id'], vertex['status'],
         tuple(sorted(vertex.get('tasks', {}).items())),
         tuple(sorted((name, value) for name, value in
                      vertex.get('metrics', {}).items()
                      if not name.endswith('-complete'))))
        for vertex in vertices)
    tasks = sum(vertex.get('parallelism', 0) for vertex in vertices)
    finished = sum(vertex.get('tasks', {}).get('FINISHED', 0)
                   for vertex in vertices)
    slots = sum(manager.get('freeSlots', 0) for manager in managers)
    return (job['state'], moved), (
        f'Flink job {job_id} is {job["state"]}, {finished} of {tasks} tasks '
        f'finished; {len(managers)} TaskManagers, {slots} free slots')

  def cancel(self):
    try:
      logging.info('%s', cancel_flink_job(self._rest_url, self._job_name,
                                          self._job_id))
    except (OSError, ValueError, KeyError) as error:
      logging.warning('could not cancel the job on Flink at %s: %s',
                      self._rest_url, error)
      return False
    self.ended()
    return True

  def ended(self):
    lifetime.forget(self._exit_key)


def _unanswered(found: Optional[str], state: str):
  """What a view that could not reach its cluster saw: no progress, once it
  had found the job there (the cluster is gone); nothing to judge before
  (the job is starting, or its driver's UI is not where the launcher
  looks: Spark moves it from a port in use)."""
  return (('unreachable',) if found else None), state


def flink_job_id(rest_url: str, job_name: str) -> Optional[str]:
  """The id of the job named ``job_name`` (a run's unique name), if Flink
  has it."""
  for job in _request(f'{rest_url}/jobs/overview')['jobs']:
    if job['name'] == job_name:
      return job['jid']
  return None


def cancel_flink_job(rest_url: str, job_name: str,
                     job_id: Optional[str] = None) -> str:
  """Cancels Flink job ``job_id`` (else the one of the run's unique
  ``job_name``) unless it has ended; says what it did."""
  job_id = job_id or flink_job_id(rest_url, job_name)
  if job_id is None:
    return f'no job {job_name} on the Flink cluster at {rest_url}'
  state = _request(f'{rest_url}/jobs/{job_id}')['state']
  if state in _FLINK_ENDED:
    return f'Flink job {job_id} had ended ({state})'
  try:
    _request(f'{rest_url}/jobs/{job_id}?mode=cancel', method='PATCH')
  except urllib.error.HTTPError as error:
    if error.code != 409:  # Conflict: it ended since
      raise
    return f'Flink job {job_id} had ended'
  return f'cancelled Flink job {job_id} at {rest_url}'


class SparkView(View):
  """An application of Beam's Spark job server, which is its Spark driver,
  through the driver's REST API (on the port the launcher gave it; where
  the application is not found there, nothing is judged)."""

  def __init__(self, ui_url: str, job_name: str):
    self._ui_url = ui_url.rstrip('/')
    self._job_name = job_name
    self._app_id = None

  def observe(self):
    api = f'{self._ui_url}/api/v1/applications'
    try:
      if self._app_id is None:
        # The job server names the application NAME_<invocation id>.
        for app in _request(api):
          if app['name'].startswith(f'{self._job_name}_'):
            self._app_id = app['id']
        if self._app_id is None:
          return None, 'the Spark application has not started yet'
      jobs = _request(f'{api}/{self._app_id}/jobs')
      executors = [executor for executor in
                   _request(f'{api}/{self._app_id}/executors')
                   if executor['id'] != 'driver']
    except (OSError, ValueError, KeyError) as error:
      return _unanswered(self._app_id, f'the Spark driver at {self._ui_url} '
                         f'does not answer ({error})')
    done = sum(job.get('numCompletedTasks', 0) for job in jobs)
    total = sum(job.get('numTasks', 0) for job in jobs)
    running = sum(executor.get('activeTasks', 0) for executor in executors)
    state = (f'Spark application {self._app_id}: {len(executors)} '
             f'executors running {running} tasks; {done} of {total} tasks '
             f'of {len(jobs)} Spark jobs done')
    # The driver hears of a task's work only when it ends, and a task can
    # run for long: a live executor running one is working.
    return (None if running else (len(jobs), done)), state


def _wait_in_thread(wait: Callable[[], object]) -> Tuple[threading.Event,
                                                          List]:
  """Runs ``wait`` on a thread of its own; returns (set when it returned,
  [its result or exception])."""
  returned, outcome = threading.Event(), []

  def waiting():
    try:
      outcome.append(wait())
    except BaseException as error:  # pylint: disable=broad-except
      outcome.append(error)
    finally:
      returned.set()

  threading.Thread(target=waiting, name='wait_until_finish',
                   daemon=True).start()
  return returned, outcome


def wait(result, view: View, stall_seconds: float,
         progress_seconds: float) -> Optional[float]:
  """Waits until the job behind ``result`` ends; raises what ended it
  otherwise, or NoProgress once ``view`` has shown the same for
  ``stall_seconds`` (0: never). Returns the longest time the view showed
  no progress (None where it judged none), which a healthy job's
  ``--stall_seconds`` must stay well above."""
  returned, outcome = _wait_in_thread(result.wait_until_finish)
  last, changed, logged = None, time.monotonic(), time.monotonic()
  longest = None
  while not returned.wait(POLL_SECONDS if last is not None else 1):
    seen, state = view.observe()
    now = time.monotonic()
    if seen is None or seen != last:
      last, changed = seen, now
    if seen is not None:
      longest = max(longest or 0, now - changed)
      if stall_seconds and now - changed >= stall_seconds:
        raise NoProgress(
            f'no progress for {now - changed:.0f} s (--stall_seconds='
            f'{stall_seconds:g}): {state}')
    if state and progress_seconds and now - logged >= progress_seconds:
      logging.info('%s', state)
      logged = now
  view.ended()
  if isinstance(outcome[0], BaseException):
    raise outcome[0]
  return longest


def main(argv: List[str]) -> int:
  """``cancel flink REST_URL JOB_NAME [JOB_ID]``: what the watchdog runs."""
  if argv[:2] != ['cancel', 'flink'] or len(argv) not in (4, 5):
    print('usage: python -m pipeline.watch cancel flink REST_URL JOB_NAME '
          '[JOB_ID]', file=sys.stderr)
    return 2
  try:
    print(cancel_flink_job(*argv[2:]))
  except (OSError, ValueError, KeyError) as error:
    print(f'could not cancel the Flink job {argv[3]} at {argv[2]}: {error}')
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
