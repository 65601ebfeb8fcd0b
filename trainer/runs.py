"""A training run's own folders in the model folder, and what killed runs
left there.

A run writes its scratch files (Keras's history.csv, the best checkpoint,
the hybrid's n-gram branch's) into ``.run-<id>/`` and its export into
``export/.tmp-<id>/``, names that ``serving.exports.resolve`` skips; only a
run that succeeded puts them in place (``export.publish``,
``Run.publish_scratch``), so a run that fails or is killed never touches
the previous run's files. TensorBoard logs go to ``logs/<id>/``, one folder
a run, and stay. The model folder's lock (``trainer.lock``) makes every
``.run-*`` and ``export/.tmp-*`` folder that the holder did not make a
killed run's: ``sweep`` removes them.
"""
import dataclasses
import logging
import os
import posixpath
import re
import secrets
import time

import tensorflow as tf

import cli
from schemas import folders
from schemas import serving
from serving import exports
from trainer import evaluate
from trainer import model as model_lib

SCRATCH_PREFIX = '.run-'
STAGING_PREFIX = '.tmp-'
LOGS_DIR = 'logs'
CHECKPOINTS_DIR = 'checkpoints'
# A run's files beside its export: each replaces the previous run's.
SCRATCH = (evaluate.HISTORY_FILE, CHECKPOINTS_DIR, model_lib.NGRAM_LOGITS)


def new_run_id() -> str:
  """When the run started (UTC), and a random part: runs started in the
  same second on two machines still differ."""
  return (time.strftime('%Y%m%d-%H%M%S', time.gmtime()) + '-' +
          secrets.token_hex(3))


def _remove(path: str) -> None:
  if tf.io.gfile.isdir(path):
    tf.io.gfile.rmtree(path)
  elif tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)


@dataclasses.dataclass(frozen=True)
class Run:
  """The folders of one run in ``model_dir``."""
  model_dir: str
  run_id: str = dataclasses.field(default_factory=new_run_id)

  @property
  def scratch(self) -> str:
    return posixpath.join(self.model_dir, SCRATCH_PREFIX + self.run_id)

  @property
  def export(self) -> str:
    """Where the export is saved and evaluated before it is published."""
    return posixpath.join(self.model_dir, serving.EXPORT_DIR,
                          STAGING_PREFIX + self.run_id)

  @property
  def logs(self) -> str:
    return posixpath.join(self.model_dir, LOGS_DIR, self.run_id)

  def publish_scratch(self) -> None:
    """Puts the run's scratch files in place of the previous run's, and
    removes those of the previous run that this one has no counterpart of
    (a hybrid's n-gram files after a transformer run): the model folder then
    describes one run."""
    for name in SCRATCH:
      source = posixpath.join(self.scratch, name)
      target = posixpath.join(self.model_dir, name)
      if tf.io.gfile.isdir(target):
        tf.io.gfile.rmtree(target)
      if tf.io.gfile.exists(source):
        tf.io.gfile.rename(source, target, overwrite=True)
      else:
        _remove(target)
    _remove(self.scratch)

  def discard(self) -> None:
    """Removes what a failed run staged; its logs stay, to show why."""
    _remove(self.export)
    _remove(self.scratch)


# A run's id (new_run_id), and the lock file's name while a trainer on an
# object store replaces it (trainer.lock).
_RUN_ID = r'\d{8}-\d{6}-[0-9a-f]{6}'
_SCRATCH_NAME = re.compile(re.escape(SCRATCH_PREFIX) + _RUN_ID)
_STAGING_NAME = re.compile(re.escape(STAGING_PREFIX) + _RUN_ID)
_LOCK_NAME = re.compile(re.escape(folders.MODEL_LOCK) + r'(\.[0-9a-f]{32})?')


def _ours(name: str, model_folder: bool) -> bool:
  """Whether the trainer writes an entry of this name at the top of a
  folder that is a ``model_folder`` (one it published a version in, or
  locked), or else one that only its runs that failed wrote to."""
  return bool(_SCRATCH_NAME.fullmatch(name) or _LOCK_NAME.fullmatch(name) or
              name == LOGS_DIR or model_folder and name in (
                  serving.EXPORT_DIR, folders.MODEL_METRICS,
                  folders.MODEL_REPORT, *SCRATCH, *evaluate.PLOTS))


# The files a run's scratch folders (SCRATCH) hold, by path in the model
# folder: publish_scratch replaces these folders whole.
_SCRATCH_FILES = re.compile(
    r'history\.csv|checkpoints/best\.weights\.h5|ngram_logits/'
    r'(min_count_\d+/)?(history\.csv|checkpoints/best\.weights\.h5)')


def _written_by_trainer(relative: str, model_folder: bool) -> bool:
  """Whether the trainer writes the file at ``relative`` in a model folder
  (``model_folder``: one it published a version in, or locked)."""
  top, _, rest = relative.partition('/')
  if (_SCRATCH_NAME.fullmatch(top) or top == LOGS_DIR or
      _LOCK_NAME.fullmatch(relative)):
    return True  # a run's own folders, and the lock
  if not model_folder:
    return False
  if top == serving.EXPORT_DIR:
    version = rest.split('/')[0]
    return bool(exports.version_number(version) is not None or
                _STAGING_NAME.fullmatch(version))
  return bool(relative in (folders.MODEL_METRICS, folders.MODEL_REPORT,
                           *evaluate.PLOTS) or
              _SCRATCH_FILES.fullmatch(relative))


def _first_shared(model_dir: str) -> str:
  """The first entry of a local model folder that is a symbolic link, or a
  file with other names (a hard link): writing or deleting it would reach
  something else. '' if none is, or the folder is on an object store."""
  if '://' in model_dir:
    return ''
  for folder, subfolders, names in os.walk(model_dir):
    for name in sorted(subfolders + names):
      path = os.path.join(folder, name)
      if os.path.islink(path) or (name in names and
                                  os.stat(path).st_nlink > 1):
        return path
  return ''


def check_own(model_dir: str) -> None:
  """A JobError unless ``model_dir`` is new, empty or a model folder with
  nothing in it that the trainer does not write (anything else would be
  overwritten or swept away), and sits inside no other job's output."""
  found = folders.enclosing_output(model_dir, tf.io.gfile.exists)
  if found:
    raise cli.JobError(f'--model_dir {model_dir} is inside {found[0]}, '
                       f'{found[1]}: train into a folder of its own')
  absolute = model_dir if '://' in model_dir else os.path.abspath(model_dir)
  for folder in (absolute, *folders.ancestors(absolute)):
    if tf.io.gfile.exists(folder) and not tf.io.gfile.isdir(folder):
      raise cli.JobError(f'{folder} is a file, where --model_dir needs a '
                         'folder')
  if not tf.io.gfile.isdir(model_dir):
    return
  names = [name.rstrip('/') for name in tf.io.gfile.listdir(model_dir)]
  jobs = folders.owners(set(names).__contains__)
  model_folder = bool({serving.EXPORT_DIR, folders.MODEL_LOCK} & set(names))
  shared = _first_shared(model_dir)
  lock_file = posixpath.join(model_dir, folders.MODEL_LOCK)
  foreign = [name for name in names if not _ours(name, model_folder)] + [
      posixpath.relpath(posixpath.join(folder, name), model_dir)
      for folder, _, files in tf.io.gfile.walk(model_dir) for name in files
      if not _written_by_trainer(posixpath.relpath(
          posixpath.join(folder, name), model_dir), model_folder)]
  if jobs - {folders.MODEL}:
    problem = f'is {" and ".join(sorted(jobs - {folders.MODEL}))}'
  elif shared:
    problem = (f'holds {shared}, a link or a file with other names, and '
               'the trainer writes and deletes through none')
  elif tf.io.gfile.exists(lock_file) and (
      tf.io.gfile.isdir(lock_file) or '://' not in lock_file and
      not os.path.isfile(lock_file)):
    problem = f'holds {lock_file}, which is no file, where its lock is one'
  elif foreign:
    problem = (f'holds {foreign[0]}, which the trainer does not write and '
               'would not keep')
  else:
    return
  raise cli.JobError(f'--model_dir {model_dir} {problem}: train into a new '
                     'or empty folder, or a model folder of the trainer\'s')


def report_dir(export_dir: str) -> str:
  return posixpath.join(export_dir, serving.REPORT_DIR)


def copy_report(model_dir: str) -> None:
  """Copies the newest version's report to the model folder's top, where
  readers look for it; a run killed before it had copied is made good by
  the next, which copies again when it starts."""
  try:
    newest = exports.resolve(model_dir)
  except exports.ExportError:
    return
  folder = report_dir(newest)
  if not tf.io.gfile.isdir(folder):
    return  # a version exported before the report went with it
  for name in tf.io.gfile.listdir(folder):
    tf.io.gfile.copy(posixpath.join(folder, name),
                     posixpath.join(model_dir, name), overwrite=True)


def sweep(model_dir: str) -> None:
  """Removes the scratch and staging folders that killed runs left; only
  under the model folder's lock, when no live run can own them."""
  places = ((model_dir, _SCRATCH_NAME),
            (posixpath.join(model_dir, serving.EXPORT_DIR), _STAGING_NAME))
  for folder, name in places:
    leftovers = [posixpath.join(folder, entry.rstrip('/'))
                 for entry in (tf.io.gfile.listdir(folder)
                               if tf.io.gfile.isdir(folder) else [])
                 if name.fullmatch(entry.rstrip('/'))]
    for leftover in leftovers:
      logging.info('train: removing %s, left by a run that did not end',
                   leftover)
      _remove(leftover)
