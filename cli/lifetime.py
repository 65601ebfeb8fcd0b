"""Processes that end with the command that started them, however it ended.

A command starts processes that would outlive it if it ended without
cleaning up (SIGKILL from the OOM killer or a preempted node, which no
handler sees): a Beam launcher's job server (a JVM), Prism, multi-process
SDK workers; ``python -m clusters``' JobManager, TaskManager, Master, Worker
and worker pool. And a job on a remote cluster runs on after its job server
is gone.

``start()`` starts a watchdog beside the command: a small process, in a
session of its own so that the terminal's signals do not end it first,
that notes every process the command starts (its descendants, rescanned
every ``SCAN_SECONDS``) and notices when the command is gone (the pipe it
holds closes, or it is no longer the watchdog's parent). Then it runs the
stops every process it noted that still runs (SIGTERM, and SIGKILL after
``GRACE_SECONDS``), then runs the commands registered with ``on_exit``
(cancelling a cluster's job by its id). After a clean exit there is usually nothing left
to stop; after an abrupt one the watchdog says on standard error what it
cancelled and stopped.

The rescan misses a process started just before the command was killed,
and a process whose parent ended first is no longer below the command: so
``start()`` also marks the command's environment, which every process it
starts inherits (as Jenkins finds a build's processes), and the watchdog
stops what carries the mark too.

A watchdog killed on its own is started again at once, with the exit
commands registered so far.

Without ``start()`` (a job run inside a test process, whose other children
are not the job's), ``on_exit`` and ``forget`` do nothing.
"""
import atexit
import json
import locale
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

SCAN_SECONDS = 0.5
# How long a stopped process gets to end on SIGTERM: a JVM runs its
# shutdown hooks (Flink's TaskManager, Spark's Worker), Beam's job servers
# end their jobs.
GRACE_SECONDS = 15
# How long one registered exit command may run.
COMMAND_SECONDS = 30

_WATCHDOG: List[subprocess.Popen] = []
# The environment variable that marks the processes a command started.
MARK = 'BEAM_TEXT_CLASSIFIER_RUN'
# What the watchdog was told, to tell a new one: the exit commands by key.
_COMMANDS: Dict[str, List[str]] = {}
_LOCK = threading.Lock()


def _send(message: dict) -> None:
  """Writes one message to the watchdog; the caller holds _LOCK."""
  if not _WATCHDOG:
    return
  try:
    _WATCHDOG[0].stdin.write(json.dumps(message) + '\n')
    _WATCHDOG[0].stdin.flush()
  except (OSError, ValueError):
    pass  # the watchdog is gone: _keep_watching starts another


def _start_watchdog(mark: str) -> None:
  """Starts a watchdog that holds the exit commands registered so far from
  its first instruction (its command line): sent once it had started, they
  would be lost with a command killed in between."""
  with _LOCK:
    _WATCHDOG[:] = [subprocess.Popen(
        [sys.executable, '-c', 'import sys; from cli import lifetime; '
         f'lifetime.watch({os.getpid()}, {mark!r}, sys.argv[1])',
         json.dumps(_COMMANDS)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        start_new_session=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]


def _keep_watching(mark: str) -> None:
  """Starts a new watchdog whenever the last one ends (killed on its own):
  the command's processes would otherwise outlive it."""
  while True:
    _WATCHDOG[0].wait()
    if _EXITING:
      return
    _start_watchdog(mark)


_EXITING = []


def start() -> None:
  """Starts this process's watchdog, once."""
  if _WATCHDOG:
    return
  mark = _mark(os.getpid())
  _start_watchdog(mark)
  os.environ[MARK] = mark
  threading.Thread(target=_keep_watching, args=(mark,), name='watchdog',
                   daemon=True).start()
  # Runs last (atexit is last in, first out): after Beam's own handlers
  # have stopped the job servers they started.
  atexit.register(exiting)


def exiting() -> None:
  """Tells the watchdog that this process exits as it means to: what is
  left to stop or cancel is no news to report."""
  _EXITING.append(True)
  with _LOCK:
    _send({'exiting': True})


def java_environment(base: Optional[dict] = None) -> dict:
  """The environment for a JVM the command starts: ``base`` (this
  process's), in C.UTF-8 where its locale's encoding is not UTF-8 (cron
  runs commands in the C locale): Java opens file names in that encoding,
  and could not open a path with a character beyond ASCII."""
  env = dict(os.environ if base is None else base)
  if locale.nl_langinfo(locale.CODESET).replace('-', '').lower() != 'utf8':
    env['LC_ALL'] = 'C.UTF-8'
  return env


def on_exit(key: str, command: Sequence[str]) -> None:
  """Has the watchdog run ``command`` (bounded by COMMAND_SECONDS) once this
  process is gone, unless ``forget(key)`` came first."""
  with _LOCK:
    if _WATCHDOG:
      _COMMANDS[key] = list(command)
      _send({'on_exit': key, 'command': list(command)})


def forget(key: str) -> None:
  with _LOCK:
    _COMMANDS.pop(key, None)
    _send({'forget': key})


def end_children() -> None:
  """Sends SIGTERM to every process this one started (the watchdog
  aside), as a terminal's Ctrl-C reaches its whole process group: a stopped
  run's job servers, Prism and SDK workers end now, not once the run's
  unwinding gets to them (a library may wait on one without a bound)."""
  if not _WATCHDOG:
    return
  for pid, _ in _descendants(os.getpid()):
    if pid != _WATCHDOG[0].pid:
      try:
        os.kill(pid, signal.SIGTERM)
      except OSError:
        pass


# The watchdog's side.

ProcessId = Tuple[int, str]  # (pid, start time): a pid can be reused


def _mark(pid: int) -> str:
  """A value of MARK that no other command has: the pid and its start
  time."""
  return f'{pid}-{_processes().get(pid, (0, "", ""))[1]}'


def _marked(mark: str) -> Dict[ProcessId, str]:
  """The processes whose environment carries ``mark`` (where /proc tells)."""
  needle = f'\0{MARK}={mark}\0'.encode()
  found = {}
  for pid, (_, started, name) in _processes().items():
    try:
      with open(f'/proc/{pid}/environ', 'rb') as environ:
        if needle in b'\0' + environ.read() + b'\0' and pid != os.getpid():
          found[(pid, started)] = name
    except OSError:
      continue
  return found


def _processes() -> Dict[int, Tuple[int, str, str]]:
  """pid -> (parent pid, start time, name) of every process."""
  found = {}
  if os.path.isdir('/proc'):
    for entry in os.listdir('/proc'):
      if not entry.isdigit():
        continue
      try:
        with open(f'/proc/{entry}/stat', encoding='utf-8',
                  errors='replace') as stat:
          text = stat.read()
      except OSError:
        continue
      name = text[text.find('(') + 1:text.rfind(')')]
      fields = text[text.rfind(')') + 2:].split()
      # After the name: state, ppid, ...; the start time is field 22.
      found[int(entry)] = (int(fields[1]), fields[19], name)
    return found
  listing = subprocess.run(['ps', '-A', '-o', 'pid=', '-o', 'ppid=', '-o',
                            'comm='], capture_output=True, text=True,
                           check=False).stdout
  for line in listing.splitlines():
    parts = line.split(None, 2)
    if len(parts) == 3:
      found[int(parts[0])] = (int(parts[1]), '', parts[2])
  return found


def _descendants(root: int) -> Dict[ProcessId, str]:
  table = _processes()
  children: Dict[int, List[int]] = {}
  for pid, (parent, _, _) in table.items():
    children.setdefault(parent, []).append(pid)
  found, pending = {}, list(children.get(root, []))
  while pending:
    pid = pending.pop()
    if pid == os.getpid() or pid not in table:
      continue
    _, started, name = table[pid]
    found[(pid, started)] = name
    pending.extend(children.get(pid, []))
  return found


def _running(noted: Dict[ProcessId, str]) -> List[ProcessId]:
  table = _processes()
  return [(pid, started) for pid, started in noted
          if pid in table and table[pid][1] == started]


def _stop(noted: Dict[ProcessId, str]) -> List[str]:
  """Stops what still runs of ``noted``; returns what it stopped."""
  running = _running(noted)
  for pid, _ in running:
    try:
      os.kill(pid, signal.SIGTERM)
    except OSError:
      pass
  deadline = time.monotonic() + GRACE_SECONDS
  while _running(noted) and time.monotonic() < deadline:
    time.sleep(0.2)
  for pid, _ in _running(noted):
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass
  return [f'{noted[process]} ({process[0]})' for process in running]


def _run_commands(commands: Dict[str, List[str]]) -> List[str]:
  """Runs each registered command; returns what each did, in words."""
  done = []
  for key, command in commands.items():
    try:
      ran = subprocess.run(command, capture_output=True, text=True,
                           timeout=COMMAND_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
      done.append(f'{key}: failed: {error}')
      continue
    said = (ran.stdout + ran.stderr).strip().splitlines()
    done.append(f'{key}: ' + (said[-1] if said else
                              f'exit status {ran.returncode}'))
  return done


def _message(line: str, commands: Dict[str, List[str]]) -> Optional[bool]:
  """Applies one message; True when the command says it is exiting."""
  try:
    message = json.loads(line)
  except ValueError:
    return None
  if 'on_exit' in message:
    commands[message['on_exit']] = message['command']
  elif 'forget' in message:
    commands.pop(message['forget'], None)
  return bool(message.get('exiting'))


def watch(parent: int, mark: str, commands_so_far: str) -> None:
  """The watchdog of process ``parent``, whose pipe is this process's
  standard input, and whose processes carry ``mark``; ``commands_so_far``:
  the exit commands registered before it started, by key (JSON)."""
  # The terminal's and the command's signals are the command's business.
  for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(signum, signal.SIG_IGN)
  noted: Dict[ProcessId, str] = {}
  commands: Dict[str, List[str]] = json.loads(commands_so_far)
  exiting = False
  pipe = sys.stdin.buffer.raw
  pending = b''
  while True:
    readable, _, _ = select.select([pipe], [], [], SCAN_SECONDS)
    if readable:
      chunk = os.read(pipe.fileno(), 65536)
      if not chunk:
        break
      pending += chunk
      *lines, pending = pending.split(b'\n')
      for line in lines:
        exiting = _message(line.decode('utf-8', 'replace'), commands) or (
            exiting)
    if os.getppid() != parent:
      break
    noted.update(_descendants(parent))
  noted.update(_marked(mark))
  # Stopped first: a job server stopped submits nothing after the commands
  # cancelled what it had submitted.
  stopped = _stop(noted)
  cancelled = _run_commands(commands)
  if not exiting and (cancelled or stopped):
    said = ([f'stopped {", ".join(stopped)}'] if stopped else []) + cancelled
    print(f'watchdog: process {parent} ended without cleaning up; '
          + '; '.join(said), file=sys.stderr, flush=True)
