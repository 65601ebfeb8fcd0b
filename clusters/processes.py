"""Long-running processes of a cluster: started with their output in a log
file, waited for until they answer, and stopped whatever happens."""
import contextlib
import ctypes
import ctypes.util
import functools
import json
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.request
from typing import Callable, Iterator, Optional, Sequence

from cli import lifetime


class ClusterError(Exception):
  """A cluster process exited or did not come up in time."""


def free_port() -> int:
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    return probe.getsockname()[1]


def listens(port: int) -> bool:
  with contextlib.suppress(OSError), socket.create_connection(
      ('127.0.0.1', port), timeout=1):
    return True
  return False


def get_json(url: str):
  with urllib.request.urlopen(url, timeout=10) as response:
    return json.load(response)


def _tail(log: Optional[pathlib.Path]) -> str:
  with contextlib.suppress(OSError, AttributeError):
    return log.read_text(errors='replace')[-2000:]
  return ''


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)


def _end_with_parent() -> None:
  """In the child, before exec: SIGTERM when the process that started it
  ends (Linux), however it ended; a watchdog (``cli.lifetime``) covers the
  rest where one runs."""
  if hasattr(_LIBC, 'prctl'):
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(process.pid, signum)


@contextlib.contextmanager
def started(command: Sequence, log: Optional[pathlib.Path],
            env: Optional[dict] = None,
            cwd: Optional[pathlib.Path] = None) -> Iterator[subprocess.Popen]:
  """Runs ``command`` for the context in a process group of its own, its
  output in ``log`` (None: nowhere); on the way out SIGTERM to the group
  (a worker pool's workers too), and SIGKILL if it is not gone in 30 s."""
  if log is not None:
    log.parent.mkdir(parents=True, exist_ok=True)
  with (open(log, 'ab') if log is not None else
        open(os.devnull, 'wb')) as output:
    process = subprocess.Popen([str(part) for part in command], stdout=output,
                               stderr=subprocess.STDOUT,
                               env=lifetime.java_environment(env), cwd=cwd,
                               start_new_session=True,
                               preexec_fn=_end_with_parent)
  try:
    yield process
  finally:
    _signal_group(process, signal.SIGTERM)
    try:
      process.wait(timeout=30)
    except subprocess.TimeoutExpired:
      _signal_group(process, signal.SIGKILL)
      process.wait()
    # What the group's leader left behind it.
    _signal_group(process, signal.SIGKILL)


def wait_until(ready: Callable[[], bool], processes: Sequence, what: str,
               seconds: float = 180) -> None:
  """Polls ``ready`` until it holds; fails as soon as one of ``processes``
  (``(Popen, log)`` pairs) exits, with the end of its log."""
  deadline = time.monotonic() + seconds
  while True:
    for process, log in processes:
      if process.poll() is not None:
        raise ClusterError(f'{what}: {process.args[0]} exited with '
                           f'{process.returncode}:\n{_tail(log)}')
    with contextlib.suppress(OSError, ValueError):
      if ready():
        return
    if time.monotonic() > deadline:
      raise ClusterError(f'{what} did not come up in {seconds:.0f} s')
    time.sleep(0.5)


@functools.lru_cache(maxsize=None)
def java() -> str:
  """The Java that runs the clusters ($JAVA_HOME's, else the PATH's), once
  it was seen to run."""
  home = os.environ.get('JAVA_HOME')
  found = str(pathlib.Path(home, 'bin', 'java')) if home else 'java'
  try:
    ran = subprocess.run([found, '-version'], capture_output=True, text=True,
                         timeout=60, check=False)
    problem = (f'exit status {ran.returncode}: '
               f'{(ran.stderr + ran.stdout).strip()[-300:]}'
               if ran.returncode else '')
  except (OSError, subprocess.TimeoutExpired) as error:
    problem = str(error)
  if problem:
    raise ClusterError(f'{found} does not run ({problem}); install a JDK 17, '
                       'or point JAVA_HOME at one')
  return found


def run_java(arguments: Sequence[str]) -> str:
  """Runs ``java arguments`` to its end; its standard output, or a
  ClusterError with what it said."""
  ran = subprocess.run([java(), *map(str, arguments)], capture_output=True,
                       text=True, env=lifetime.java_environment(),
                       check=False)
  if ran.returncode:
    raise ClusterError(f'{java()} {" ".join(map(str, arguments))[:200]}... '
                       f'failed ({ran.returncode}): '
                       f'{(ran.stderr + ran.stdout).strip()[-1000:]}')
  return ran.stdout
