"""Job outputs that appear whole or not at all, on any Beam filesystem.

A job writes into a staging folder and publishes it only after the pipeline
succeeded, so a failed or killed run never leaves a half-written output where
a finished one is expected. The staging folders of an output root such as
``warehouse/scores`` are in its hidden sibling ``warehouse/.scores.staging/``:
on the same file system, so that publishing is a rename, and where no reader
of the output root can reach them, however it globs.
"""
import ctypes
import dataclasses
import json
import logging
import os
import posixpath
import re
import sys
import time
import uuid
from typing import List, Optional, Tuple

from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.filesystem import FileSystem
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

from pipeline import cli


class OutputError(cli.JobError):
  """The output location cannot be written, lies inside the input, or holds
  something this job did not publish."""


def write_json(path: str, value) -> None:
  with FileSystems.create(path, mime_type='application/json') as handle:
    handle.write(json.dumps(value, indent=2, sort_keys=True).encode('utf-8'))
    handle.write(b'\n')


def read_json(path: str):
  with FileSystems.open(path) as handle:
    return json.loads(handle.read().decode('utf-8'))


def _is_local(path: str) -> bool:
  return isinstance(FileSystems.get_filesystem(path), LocalFileSystem)


def _files(folder: str) -> List[FileMetadata]:
  """Every file under ``folder``, hidden ones too."""
  return FileSystems.match([folder.rstrip('/') + '/**'])[0].metadata_list


def _relative(metadata: FileMetadata, folder: str) -> str:
  return metadata.path[len(folder.rstrip('/')) + 1:]


def _delete_tree(path: str) -> None:
  """Removes a folder and everything under it; on an object store, where a
  folder is only the common prefix of its files' names, those files."""
  if _is_local(path):
    if os.path.lexists(path):
      FileSystems.delete([path])
  else:
    paths = [m.path for m in _files(path)]
    if paths:
      FileSystems.delete(paths)


def _resolved(path: str) -> str:
  """A local path with its symbolic links resolved, so that an output goes
  into a linked folder and never replaces the link."""
  return os.path.realpath(path) if _is_local(path) else path.rstrip('/')


def _resolved_pattern(pattern: str) -> str:
  """An input pattern with its literal folder resolved as output paths are,
  so that the two compare."""
  if not _is_local(pattern):
    return pattern
  pattern = os.path.abspath(pattern)
  folder = os.path.dirname(re.match(r'[^[*?]*', pattern).group(0))
  return os.path.realpath(folder) + pattern[len(folder):]


def _device(path: str) -> int:
  return os.stat(path).st_dev


def _remove_empty_folders(top: str) -> None:
  for folder, _, _ in os.walk(top, topdown=False):
    if folder != top and not os.listdir(folder):
      os.rmdir(folder)


# The marker a finished output carries (the Hadoop convention): on object
# stores, where a folder cannot be replaced in one step, it goes last.
SUCCESS_MARKER = '_SUCCESS'
# A run killed with SIGKILL (which cannot be handled) leaves its staging
# folder behind; the next run of the same output removes it once no file in
# it has changed for this long.
STALE_SECONDS = 24 * 3600
# Stands for each ``*`` of a Layout's globs in the paths checked against the
# input pattern: the shard name Beam's sinks give their files.
_SHARD = '00000-of-00001'
# Names the staging folders of an output without partitions; a partition
# name never starts with ``_``.
_UNPARTITIONED = '_output'


def mark_finished(folder: str) -> None:
  """Writes the success marker in ``folder``. Not empty: Beam's S3
  filesystem cannot write an empty file (a multipart upload of no part)."""
  with FileSystems.create(posixpath.join(folder, SUCCESS_MARKER)) as handle:
    handle.write(b'\n')


def staging_root(root: str) -> str:
  """The folder of the staging folders of output root ``root``: its hidden
  sibling ``.<name>.staging``."""
  parent, name = posixpath.split(_resolved(root))
  return posixpath.join(parent, f'.{name}.staging')


@dataclasses.dataclass(frozen=True)
class Layout:
  """What a job publishes in its output folder.

  ``contents``: globs in the syntax of ``FileSystems.match`` (``*`` stops at
  ``/``, ``**`` does not), relative to the output folder, of every file the
  job writes as output; anything else staged, such as a runner's
  ``beam-temp-*`` leftovers, is not published. ``markers``: names at the top
  of a folder that only an output of this job has; without any, every
  existing folder may be replaced.
  """
  contents: Tuple[str, ...] = ('**',)
  markers: Tuple[str, ...] = ()

  def publishes(self, relative: str) -> bool:
    return any(re.match(FileSystem.translate_pattern(glob), relative)
               for glob in self.contents)

  def examples(self) -> List[str]:
    """A path the job writes for each glob, with a shard name for ``*``."""
    return [re.sub(r'\*+', _SHARD, glob) for glob in self.contents]


def _exchange(first: str, second: str) -> bool:
  """Atomically swaps two local folders; False where the OS cannot."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    if sys.platform.startswith('linux'):
      at_fdcwd, rename_exchange = -100, 2
      result = libc.renameat2(at_fdcwd, os.fsencode(first), at_fdcwd,
                              os.fsencode(second), rename_exchange)
    elif sys.platform == 'darwin':
      rename_swap = 2
      result = libc.renamex_np(os.fsencode(first), os.fsencode(second),
                               rename_swap)
    else:
      return False
  except (AttributeError, OSError):  # no such call in this C library
    return False
  return result == 0


class StagedOutput:
  """A staging folder that replaces the output folder whole when published.

  Used as a context manager::

      with StagedOutput(root, input_pattern, partition='dt=1',
                        layout=LAYOUT, overwrite=False) as output:
        ...write under output.staging_dir...
        output.publish()

  The output folder is ``root``, or ``root/partition``. Entering checks that
  the input pattern would match no file of the output, and that an existing
  output folder is one this job published (a layout marker at its top, none
  further down) unless ``overwrite``; removes this output's staging folders
  left by killed runs; and creates the staging folder. Any failure there is
  an OutputError. Leaving without having published, whatever the reason,
  removes the staging folder, so nothing half-written ever remains.

  On a local disk the replacement is one atomic swap of folders: a reader
  sees the old output or the new one, never a mix and never neither. On an
  object store, files are moved one by one: the old success marker goes
  first and the new one last, so readers that wait for it see whole outputs.
  """

  def __init__(self, root: str, input_pattern: Optional[str] = None, *,
               partition: str = '', layout: Layout = Layout(),
               overwrite: bool = False):
    self.root = _resolved(root)
    self.final_dir = posixpath.join(self.root, partition) if partition else (
        self.root)
    self._input_pattern = input_pattern
    self._layout = layout
    self._overwrite = overwrite
    self._staging_root = staging_root(self.root)
    self._name = partition.replace('/', '~') if partition else _UNPARTITIONED
    self.staging_dir = posixpath.join(
        self._staging_root, f'{self._name}-{uuid.uuid4().hex[:12]}')
    self._published = False

  def __enter__(self) -> 'StagedOutput':
    try:
      if self._input_pattern:
        self._check_outside(self._input_pattern)
      self._check_replaceable()
      self._sweep_stale()
      self._create()
    except OutputError:
      self.discard()
      raise
    return self

  def __exit__(self, *exc_info) -> None:
    if not self._published:
      self.discard()

  def _check_outside(self, pattern: str) -> None:
    """Fails if the input pattern would match a file of this output, staged
    or published: a job reading its own output never runs the same twice."""
    matches = re.compile(FileSystem.translate_pattern(
        _resolved_pattern(pattern))).match
    for folder in (self.final_dir, self.staging_dir):
      for example in self._layout.examples():
        path = posixpath.join(folder, example)
        if matches(path):
          raise OutputError(
              f'the output folder {self.final_dir} is inside the input '
              f'{pattern}: the input would include {path}')

  def _check_replaceable(self) -> None:
    """Fails, unless told to overwrite, if the output folder holds files and
    is not an output this job published: no marker at its top, or one
    further down (other partitions, which a rerun would delete)."""
    if self._overwrite or not self._layout.markers:
      return
    held = [_relative(m, self.final_dir) for m in _files(self.final_dir)]
    nested = [p for p in held if '/' in p and
              posixpath.basename(p) in self._layout.markers]
    if nested:
      problem = ('holds other outputs of this job, such as '
                 f'{posixpath.dirname(nested[0])}')
    elif held and not {p.split('/')[0] for p in held} & set(
        self._layout.markers):
      problem = 'is not an output of this job'
    else:
      return
    raise OutputError(f'{self.final_dir} {problem}; pass --overwrite to '
                      'replace it whole')

  def _sweep_stale(self) -> None:
    """Removes this output's staging folders in which nothing has changed
    for STALE_SECONDS: those of killed runs."""
    own = re.compile(re.escape(self._name) + r'-[0-9a-f]{12}')
    changed = {}
    for metadata in _files(self._staging_root):
      folder = _relative(metadata, self._staging_root).split('/')[0]
      # A file system that gives no time makes the folder look fresh.
      changed[folder] = max(changed.get(folder, 0),
                            metadata.last_updated_in_seconds or time.time())
    if _is_local(self._staging_root) and os.path.isdir(self._staging_root):
      for folder in os.listdir(self._staging_root):  # empty ones too
        changed[folder] = max(changed.get(folder, 0), os.path.getmtime(
            posixpath.join(self._staging_root, folder)))
    for folder, when in changed.items():
      if own.fullmatch(folder) and when < time.time() - STALE_SECONDS:
        logging.info('removing %s, left by a run killed %.0f hours ago',
                     folder, (time.time() - when) / 3600)
        _delete_tree(posixpath.join(self._staging_root, folder))

  def _create(self) -> None:
    """Creates the staging folder, proving the location writable and, on a
    local disk, on the output's file system, so that publishing is a
    rename."""
    try:
      FileSystems.mkdirs(self.staging_dir)
      probe = FileSystems.join(self.staging_dir, '.probe')
      with FileSystems.create(probe) as handle:
        handle.write(b'probe')
      FileSystems.delete([probe])
    except Exception as error:  # pylint: disable=broad-except
      raise OutputError(
          f'cannot write to {self.final_dir}: {error}') from error
    if (_is_local(self.root) and os.path.isdir(self.root) and
        _device(self.root) != _device(self._staging_root)):
      raise OutputError(
          f'{self.root} is a mount point: its staging folders, in '
          f'{self._staging_root}, would be on another file system; use a '
          'folder inside it as --output_dir')

  def publish(self) -> None:
    """Moves the staged output into place, replacing any previous one."""
    self._remove_strays()
    if _is_local(self.final_dir):
      self._publish_local()
    else:
      self._publish_by_files()
    self._published = True
    self._remove_empty_staging_root()

  def _remove_strays(self) -> None:
    """Removes what the job did not write as output from the staging
    folder."""
    strays = [m.path for m in _files(self.staging_dir) if not
              self._layout.publishes(_relative(m, self.staging_dir))]
    if strays:
      logging.info('not publishing %d files that are no output, such as %s',
                   len(strays), strays[0])
      FileSystems.delete(strays)
    if _is_local(self.staging_dir):
      _remove_empty_folders(self.staging_dir)

  def _publish_local(self):
    if not os.path.lexists(self.final_dir):
      os.makedirs(os.path.dirname(self.final_dir), exist_ok=True)
      os.rename(self.staging_dir, self.final_dir)
      return
    if not _exchange(self.staging_dir, self.final_dir):
      # A file system without the swap: the old output is moved aside, for
      # the moment between two renames.
      aside = self.staging_dir + '.old'
      os.rename(self.final_dir, aside)
      os.rename(self.staging_dir, self.final_dir)
      os.rename(aside, self.staging_dir)
    # The staging folder now holds the previous output.
    _delete_tree(self.staging_dir)

  def _publish_by_files(self):
    def markers_and_others(paths):
      markers = [p for p in paths if posixpath.basename(p) == SUCCESS_MARKER]
      return markers, [p for p in paths if p not in markers]

    for batch in markers_and_others([m.path for m in _files(self.final_dir)]):
      if batch:
        FileSystems.delete(batch)
    staged = [m.path for m in _files(self.staging_dir)]
    for batch in reversed(markers_and_others(staged)):
      if batch:
        FileSystems.rename(batch, [self.final_dir + p[len(self.staging_dir):]
                                   for p in batch])
    _delete_tree(self.staging_dir)

  def _remove_empty_staging_root(self):
    if _is_local(self._staging_root):
      try:
        os.rmdir(self._staging_root)
      except OSError:  # not empty: another run is staging beside this one
        pass

  def discard(self) -> None:
    try:
      _delete_tree(self.staging_dir)
      self._remove_empty_staging_root()
    except Exception:  # pylint: disable=broad-except
      logging.warning('could not remove %s', self.staging_dir, exc_info=True)
