"""One trainer at a time in a model folder.

Two trainers in one ``--model_dir`` would interleave their files and race
for export versions, so ``train.run`` holds this lock for the whole run and
refuses a second trainer with a JobError naming the one that holds it.

On a local disk the lock is an ``fcntl.flock`` of ``<model_dir>/.trainer.lock``:
the kernel releases it when the process ends, however it ends, so a killed
trainer leaves no stale lock. Object stores (``gs://``, ``s3://``) have no
locks; there the file itself is the lock: it names its holder (host, pid,
start) and the time, which the holder rewrites every ``HEARTBEAT_SECONDS``,
and a file not rewritten for ``STALE_SECONDS`` is a dead trainer's, taken
over. That is advisory: two trainers that start within a few seconds of each
other can both take it (each reads the file back after a pause to catch the
other, which narrows that window but cannot close it). A read that overlaps
the holder's rewrite can return a torn file (TF's ram:// returns the new
content cut to the old length), so an unparsable file is read again, and
one that stays unparsable is held, like any other, until its modification
time is STALE_SECONDS old: an unreadable lock is never a free folder.
"""
import contextlib
import datetime
import fcntl
import json
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from typing import Dict, Optional

import tensorflow as tf

import cli
from outputs import ownership

LOCK_FILE = ownership.MODEL_LOCK
# Object stores: how often the holder rewrites the lock file, and how long
# after its last rewrite another trainer takes it over.
HEARTBEAT_SECONDS = 60
STALE_SECONDS = 600
# How long a trainer waits after writing the lock file before reading it
# back: one that wrote it in the meantime has then overwritten it.
SETTLE_SECONDS = 2
# How often, and how far apart, an unparsable lock file is read again.
READ_ATTEMPTS, READ_PAUSE_SECONDS = 5, 0.05


class Busy(cli.JobError):
  """Another trainer holds the model folder."""


@contextlib.contextmanager
def exclusive(model_dir: str, made_for_this_run: bool = False):
  """Holds the model folder's lock while the block runs; Busy if another
  trainer holds it. ``made_for_this_run``: the folder did not exist before
  this run, so a run that fails before it wrote anything leaves no folder
  either: the lock file goes while still held (a trainer that starts then
  makes its own), then the folder if nothing else is in it (a run that got
  as far as TensorBoard logs keeps them, as in any model folder)."""
  path = posixpath.join(model_dir, LOCK_FILE)
  held = _file_lock if '://' in model_dir else _kernel_lock
  with held(path, model_dir):
    try:
      yield
    except BaseException:
      if made_for_this_run:
        _remove_made_folder(path, model_dir)
      raise


def _remove_made_folder(path: str, model_dir: str) -> None:
  try:
    tf.io.gfile.remove(path)
    if '://' not in model_dir and not os.listdir(model_dir):
      os.rmdir(model_dir)  # only where empty: never another's files
  except (tf.errors.OpError, OSError) as error:
    logging.warning('train: the model folder %s this run made is left (%s)',
                    model_dir, error)


def _holder() -> Dict:
  return {'host': socket.gethostname(), 'pid': os.getpid(),
          'since': datetime.datetime.now(datetime.timezone.utc).isoformat(
              timespec='seconds'),
          'time': time.time(), 'token': uuid.uuid4().hex}


def _busy(model_dir: str, holder: Optional[Dict]) -> Busy:
  who = (f'host {holder.get("host")}, pid {holder.get("pid")}, since '
         f'{holder.get("since")}' if holder else 'whose name was unreadable')
  return Busy(f'another trainer ({who}) holds {model_dir}: wait for it to '
              'end, or train into another --model_dir')


def _parse(text: str) -> Optional[Dict]:
  try:
    holder = json.loads(text)
  except ValueError:
    return None
  return holder if isinstance(holder, dict) else None


@contextlib.contextmanager
def _kernel_lock(path: str, model_dir: str):
  # Appending: the holder's name stays for the trainer that is refused.
  with open(path, 'a+', encoding='utf-8') as handle:
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.seek(0)
      raise _busy(model_dir, _parse(handle.read())) from None
    handle.truncate(0)
    handle.write(json.dumps(_holder()))
    handle.flush()
    yield  # closing the file releases the lock


def _read(path: str) -> Optional[Dict]:
  """The lock file's holder; None when there is no file, {} when it stays
  unparsable."""
  for attempt in range(READ_ATTEMPTS):
    if attempt:
      time.sleep(READ_PAUSE_SECONDS)
    try:
      with tf.io.gfile.GFile(path) as handle:
        holder = _parse(handle.read())
    except tf.errors.NotFoundError:
      return None
    if holder is not None:
      return holder
  return {}


def _age(path: str, holder: Dict) -> float:
  """Seconds since the holder last rewrote the file: its own time, else
  (an unreadable file) the file's modification time."""
  if isinstance(holder.get('time'), (int, float)):
    return time.time() - holder['time']
  try:
    return time.time() - tf.io.gfile.stat(path).mtime_nsec / 1e9
  except tf.errors.NotFoundError:
    return float('inf')


def _write(path: str, holder: Dict) -> None:
  """Replaces the lock file whole: a reader never finds it half-written."""
  partial = f'{path}.{holder["token"]}'
  with tf.io.gfile.GFile(partial, 'w') as handle:
    handle.write(json.dumps(holder))
  tf.io.gfile.rename(partial, path, overwrite=True)


@contextlib.contextmanager
def _file_lock(path: str, model_dir: str):
  found = _read(path)
  if found is not None and _age(path, found) < STALE_SECONDS:
    raise _busy(model_dir, found)
  holder = _holder()
  _write(path, holder)
  time.sleep(SETTLE_SECONDS)
  found = _read(path)
  if not found or found.get('token') != holder['token']:
    raise _busy(model_dir, found)
  stop = threading.Event()
  beat = threading.Thread(target=_heartbeat, args=(path, holder, stop),
                          daemon=True)
  beat.start()
  try:
    yield
  finally:
    stop.set()
    beat.join()
    if (_read(path) or {}).get('token') == holder['token']:
      tf.io.gfile.remove(path)


def _heartbeat(path: str, holder: Dict, stop: threading.Event) -> None:
  """Rewrites the lock file's time until ``stop``: a live trainer's lock
  never looks stale."""
  while not stop.wait(HEARTBEAT_SECONDS):
    holder['time'] = time.time()
    try:
      _write(path, holder)
    except (tf.errors.OpError, OSError) as error:
      logging.warning('train: cannot rewrite the lock %s (%s); another '
                      'trainer may take it over after %d s', path, error,
                      STALE_SECONDS)
