"""Add-a-version, the trainer's strategy: a model folder that grows by
versions, each put in place only once complete.

A run writes its scratch files into ``.run-<id>/`` and its export into
``export/.tmp-<id>/``, names no reader of versions looks at; only a run
that succeeded publishes (``Run.publish``): every check again, its export
renamed to ``export/<version>/``, its scratch files in place of the
previous run's. A run that fails or is killed never touches the previous
run's files. TensorBoard logs go to ``logs/<id>/``, one folder a run, and
stay. Under the model folder's lock (the trainer's), every ``.run-*`` and
``export/.tmp-*`` folder that the holder did not make is a killed run's:
``sweep`` removes them.
"""
import logging
import os
import posixpath
import re
import secrets
import time
from typing import Iterable, Optional, Set

import cli
from outputs import ownership
from outputs import rules
from outputs import staging
from outputs.files import Files
from schemas import serving

SCRATCH_PREFIX = '.run-'
STAGING_PREFIX = '.tmp-'
LOGS_DIR = 'logs'
# A run's id (new_run_id), and the lock file's name while a trainer on an
# object store replaces it (its name and a 32-digit hex token).
_RUN_ID = r'\d{8}-\d{6}-[0-9a-f]{6}'
_SCRATCH_NAME = re.compile(re.escape(SCRATCH_PREFIX) + _RUN_ID)
_STAGING_NAME = re.compile(re.escape(STAGING_PREFIX) + _RUN_ID)
_LOCK_NAME = re.compile(re.escape(ownership.MODEL_LOCK) + r'(\.[0-9a-f]{32})?')


def new_run_id() -> str:
  """When the run started (UTC), and a random part: runs started in the
  same second on two machines still differ."""
  return (time.strftime('%Y%m%d-%H%M%S', time.gmtime()) + '-' +
          secrets.token_hex(3))


def _is_version(name: str) -> bool:
  """Whether an export folder's entry is a version or a run's staging."""
  return bool(serving.version_number(name) is not None or
              _STAGING_NAME.fullmatch(name))


class ModelLayout(rules.Layout):
  """What the trainer writes in a model folder: its runs' own folders and
  lock anywhere; and where the folder is a model folder already (it holds
  ``export/`` or the lock), the versions, the newest's report files
  (``reports``) and the last run's scratch files (``scratch``, top-level
  names a run replaces whole; ``scratch_files``, a regular expression of
  the files in them)."""
  owner = ownership.MODEL
  replaces_whole = False
  keeps_notes = True
  remedy = ('train into a new or empty folder, or a model folder of the '
            'trainer\'s')

  def __init__(self, scratch: Iterable[str], scratch_files: str,
               reports: Iterable[str]):
    self.scratch = tuple(scratch)
    self._scratch_files = re.compile(scratch_files)
    self._reports = (ownership.MODEL_METRICS, ownership.MODEL_REPORT,
                     *reports)

  def marked(self, top: Set[str]) -> bool:
    return bool({serving.EXPORT_DIR, ownership.MODEL_LOCK} & top)

  def _folder(self, name: str, marked: bool) -> bool:
    """Whether the trainer makes a folder of this name at the top."""
    return bool(_SCRATCH_NAME.fullmatch(name) or name == LOGS_DIR or
                marked and (name == serving.EXPORT_DIR or (
                    name in self.scratch and
                    not self._scratch_files.fullmatch(name))))

  def writes(self, path: str, marked: bool) -> bool:
    top, _, rest = path.rstrip('/').partition('/')
    if path.endswith('/'):  # an empty folder: nothing in it to lose
      return self._folder(top, marked)
    if _SCRATCH_NAME.fullmatch(top) or top == LOGS_DIR or _LOCK_NAME.fullmatch(
        path):
      return True
    if not marked:
      return False
    if top == serving.EXPORT_DIR:
      return _is_version(rest.split('/')[0])
    return path in self._reports or bool(self._scratch_files.fullmatch(path))

  def nested_own(self, folder: str, job: str) -> bool:
    top, _, version = folder.partition('/')
    return (job == ownership.EXPORT and top == serving.EXPORT_DIR and
            _is_version(version))


def check(files: Files, model_dir: str, layout: ModelLayout) -> None:
  """An OutputError unless ``model_dir`` (resolved) is new, empty or a
  model folder with nothing in it that the trainer does not write but what
  tools leave and notes (``tool_files``), and sits inside no other job's
  output."""
  rules.check(rules.Target(files, model_dir, model_dir, layout,
                           '--model_dir'))


def _move(files: Files, source: str, target: str) -> None:
  """Moves the file or folder ``source`` to ``target``."""
  if files.is_local(source):
    os.rename(source, target)
    return
  paths = [info.path for info in files.files(source)] or [source]
  files.rename(paths, [target + path[len(source):] for path in paths])


class Run:
  """The folders of one run in a model folder."""

  def __init__(self, files: Files, model_dir: str, layout: ModelLayout,
               run_id: Optional[str] = None):
    self._files = files
    self._layout = layout
    self.model_dir = model_dir
    self.run_id = run_id or new_run_id()

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

  def next_version(self) -> int:
    """The version the run's export will have: the time in seconds, but
    above every existing version, so the newest version is always the
    newest run's, even after the clock went back; the model folder's lock
    keeps two runs from taking the same one. An OutputError when no
    version above them fits in 64 bits, as TF Serving reads versions."""
    found = [version for version in map(serving.version_number,
                                        self._files.listdir(posixpath.join(
                                            self.model_dir,
                                            serving.EXPORT_DIR)))
             if version is not None]
    version = max([int(time.time()), *(v + 1 for v in found)])
    if version > serving.MAX_VERSION:
      raise rules.OutputError(
          f'{self.model_dir} has the version {max(found)}, and no version '
          f'above it fits in 64 bits ({serving.MAX_VERSION}) as TF Serving '
          'reads versions: train into another --model_dir')
    return version

  def publish(self, version: int) -> str:
    """Once every check of the model folder passed again, renames the
    complete staged export, whose metadata names ``version``, to
    ``export/<version>/`` and puts the run's scratch files in place of the
    previous run's; returns the version's folder."""
    cli.check_not_stopped()
    try:
      check(self._files, self.model_dir, self._layout)
    except rules.OutputError as error:
      raise rules.OutputError(f'{error}; nothing was published') from error
    final = posixpath.join(self.model_dir, serving.EXPORT_DIR, str(version))
    _move(self._files, self.export, final)
    self._publish_scratch()
    return final

  def _publish_scratch(self) -> None:
    """Puts the run's scratch files in place of the previous run's (the
    files tools left in those folders kept), and removes those of the
    previous run that this one has no counterpart of (a hybrid's n-gram
    files after a transformer run): the model folder then describes one
    run."""
    files = self._files
    for name in self._layout.scratch:
      source = posixpath.join(self.scratch, name)
      target = posixpath.join(self.model_dir, name)
      staging.keep_tool_files(files, target, source)
      files.delete_tree(target)
      if files.exists(source):
        _move(files, source, target)
    files.delete_tree(self.scratch)

  def discard(self) -> None:
    """Removes what a failed run staged; its logs stay, to show why."""
    self._files.delete_tree(self.export)
    self._files.delete_tree(self.scratch)


def sweep(files: Files, model_dir: str) -> None:
  """Removes the scratch and staging folders that killed runs left; only
  under the model folder's lock, when no live run can own them."""
  places = ((model_dir, _SCRATCH_NAME),
            (posixpath.join(model_dir, serving.EXPORT_DIR), _STAGING_NAME))
  for folder, name in places:
    for leftover in sorted(entry for entry in files.listdir(folder)
                           if name.fullmatch(entry)):
      logging.info('train: removing %s, left by a run that did not end',
                   posixpath.join(folder, leftover))
      files.delete_tree(posixpath.join(folder, leftover))
