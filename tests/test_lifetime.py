"""cli.lifetime: what a command starts ends with it, however it ends."""
import os
import signal
import subprocess
import sys
import time

import pytest

import cli
from cli import lifetime
from tests.conftest import REPO

# A command run through cli.main, as every entry point is: it starts a
# child (python sleeping), registers an exit command that writes a file,
# says so, and waits. argv: the file, then 'wait', 'exit' (return), 'forget'
# (take the exit command back, return) or 'early' (SIGKILL itself as soon
# as the child runs, likely before any rescan of the watchdog's saw it).
_COMMAND = """
import os, subprocess, sys, time
import cli
from cli import lifetime

def run(argv):
  marker, how = argv[0], argv[1]
  child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
  lifetime.on_exit('mark', [sys.executable, '-c',
                            f'open({marker!r}, "w").write("ran")'])
  if how == 'forget':
    lifetime.forget('mark')
  print(child.pid, flush=True)
  if how == 'early':
    os.kill(os.getpid(), 9)
  if how in ('exit', 'forget'):
    return
  time.sleep(600)

cli.main(run)
"""


def start(tmp_path, how):
  command = subprocess.Popen(
      [sys.executable, '-c', _COMMAND, str(tmp_path / 'ran'), how], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  child = int(command.stdout.readline())
  return command, child


def gone(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as stat:
      return stat.read().rsplit(')', 1)[1].split()[0] == 'Z'
  except OSError:
    return True


def wait_until(condition, seconds=60):
  deadline = time.monotonic() + seconds
  while not condition():
    assert time.monotonic() < deadline, 'timed out'
    time.sleep(0.1)


@pytest.mark.parametrize('how', ['wait', 'early'])
def test_a_killed_command_leaves_nothing_running(tmp_path, how):
  """SIGKILL, which no handler sees: the watchdog stops the child, also one
  started too late for any rescan to see (found by its environment's
  mark), runs the exit command, and says so."""
  command, child = start(tmp_path, how)
  if how == 'wait':
    command.kill()
  _, stderr = command.communicate(timeout=120)
  assert command.returncode == -signal.SIGKILL
  wait_until(lambda: gone(child))
  assert (tmp_path / 'ran').read_text() == 'ran'
  assert f'process {command.pid} ended without cleaning up; stopped python' \
      in stderr, stderr


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGHUP,
                                    signal.SIGINT])
def test_a_signalled_command_says_so_and_leaves_nothing_running(tmp_path,
                                                                signum):
  command, child = start(tmp_path, 'wait')
  command.send_signal(signum)
  _, stderr = command.communicate(timeout=120)
  assert command.returncode == 128 + signum
  assert stderr.splitlines()[-1] == (
      f'error: stopped by {signal.Signals(signum).name}; nothing was '
      'published')
  wait_until(lambda: gone(child))
  # It exited by itself: the exit command still runs (a job it would have
  # cancelled), and the watchdog says nothing.
  assert (tmp_path / 'ran').read_text() == 'ran'
  assert 'watchdog' not in stderr


def test_a_forgotten_exit_command_does_not_run(tmp_path):
  command, child = start(tmp_path, 'forget')
  _, stderr = command.communicate(timeout=120)
  assert command.returncode == 0, stderr
  wait_until(lambda: gone(child))
  assert not (tmp_path / 'ran').exists()


def test_python_m_clusters_without_java_is_one_error_line(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'clusters', 'flink', f'--run_dir={tmp_path}'],
      cwd=REPO, capture_output=True, text=True, timeout=120,
      env={**os.environ, 'JAVA_HOME': str(tmp_path / 'no-jdk')})
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f'error: {tmp_path / "no-jdk" / "bin" / "java"} does not run '
      f'([Errno 2] No such file or directory: '
      f'\'{tmp_path / "no-jdk" / "bin" / "java"}\'); install a JDK 17, or '
      'point JAVA_HOME at one']


def test_java_gets_a_utf8_locale_where_the_command_has_none():
  result = subprocess.run(
      [sys.executable, '-c', 'from cli import lifetime; '
       'print(lifetime.java_environment().get("LC_ALL"))'],
      cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
      env={**os.environ, 'LC_ALL': 'C'})
  assert result.stdout.strip() == 'C.UTF-8'


def watchdogs(command):
  return [pid for pid in _children(command.pid)
          if 'lifetime.watch(' in _command_line(pid)]


def _children(pid):
  found = []
  for entry in os.listdir('/proc'):
    try:
      with open(f'/proc/{entry}/stat', encoding='utf-8') as stat:
        if int(stat.read().rsplit(')', 1)[1].split()[1]) == pid:
          found.append(int(entry))
    except (OSError, ValueError, IndexError):
      continue
  return found


def _command_line(pid):
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as cmdline:
      return cmdline.read().replace(b'\0', b' ').decode(errors='replace')
  except OSError:
    return ''


def one_watchdog(command, other_than=None):
  """The pid of the command's one watchdog once there is one (other than
  ``other_than``), from one look at the processes: between two looks, a
  killed watchdog may be gone and its successor not yet started."""
  seen = []
  def found():
    seen[:] = watchdogs(command)
    return len(seen) == 1 and seen[0] != other_than
  wait_until(found)
  return seen[0]


def test_a_killed_watchdog_is_replaced(tmp_path):
  """A watchdog killed on its own is started again, holding the exit
  commands from its start (a command killed before it could tell them
  again would lose them), and still ends the command's processes."""
  command, child = start(tmp_path, 'wait')
  first = one_watchdog(command)
  os.kill(first, signal.SIGKILL)
  second = one_watchdog(command, other_than=first)
  assert str(tmp_path / 'ran') in _command_line(second)
  command.kill()
  _, stderr = command.communicate(timeout=120)
  wait_until(lambda: gone(child))
  assert (tmp_path / 'ran').read_text() == 'ran', stderr


def test_nohup_protects_a_command_from_a_closed_terminal(tmp_path):
  """A command started ignoring SIGHUP (nohup) keeps ignoring it."""
  command = subprocess.Popen(
      ['nohup', sys.executable, '-c', _COMMAND, str(tmp_path / 'ran'),
       'wait'], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)
  int(command.stdout.readline())
  command.send_signal(signal.SIGHUP)
  command.send_signal(signal.SIGTERM)
  _, stderr = command.communicate(timeout=120)
  assert command.returncode == 128 + signal.SIGTERM
  assert stderr.splitlines()[-1].startswith('error: stopped by SIGTERM;')


# A command that stages an output, fills its standard error until a write
# blocks (its reader reads nothing), and waits.
_BLOCKED = """
import logging, os, sys, threading, time
import cli
from pipeline import filesystems
import outputs

def run(argv):
  with outputs.StagedOutput(filesystems.FILES, argv[0]):
    def fill():
      while True:
        logging.warning('x' * 4096)
    threading.Thread(target=fill, daemon=True).start()
    time.sleep(600)

# The bound under test (its second argument), shorter than a run's own:
# the mechanism is the same.
cli.STOP_SECONDS = int(sys.argv[2])
cli.main(run)
"""
_STOP_SECONDS = 5


def test_a_stopped_command_ends_while_standard_error_is_full(tmp_path):
  """Its reader stopped reading: the stop cannot say so, and the command
  still ends within its bound, its staging folder removed."""
  command = subprocess.Popen(
      [sys.executable, '-c', _BLOCKED, str(tmp_path / 'scores'),
       str(_STOP_SECONDS)], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  # Until its writes block: the pipe's buffer is full.
  wait_until(lambda: 'pipe_write' in _wait_channel(command.pid), seconds=120)
  assert os.listdir(tmp_path)  # the staging folder
  command.send_signal(signal.SIGTERM)
  command.wait(timeout=_STOP_SECONDS + 30)
  assert command.returncode == 128 + signal.SIGTERM
  assert not os.listdir(tmp_path)


def _wait_channel(pid):
  try:
    tasks = os.listdir(f'/proc/{pid}/task')
  except OSError:
    return ''
  channels = []
  for task in tasks:
    try:
      with open(f'/proc/{pid}/task/{task}/wchan', encoding='utf-8') as wchan:
        channels.append(wchan.read())
    except OSError:
      continue
  return ' '.join(channels)
