"""Job outputs that appear whole or not at all, on any Beam filesystem.

A job writes into a staging folder beside its final output and publishes it
only after the pipeline succeeded, so a failed or killed run never leaves a
half-written output where a finished one is expected.
"""
import ctypes
import json
import logging
import os
import posixpath
import sys
import uuid
from typing import Optional

from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

from pipeline import cli


class OutputError(cli.JobError):
  """The output location cannot be written, or lies inside the input."""


def write_json(path: str, value) -> None:
  with FileSystems.create(path, mime_type='application/json') as handle:
    handle.write(json.dumps(value, indent=2, sort_keys=True).encode('utf-8'))
    handle.write(b'\n')


def read_json(path: str):
  with FileSystems.open(path) as handle:
    return json.loads(handle.read().decode('utf-8'))


def _is_local(path: str) -> bool:
  return isinstance(FileSystems.get_filesystem(path), LocalFileSystem)


def _list_files(folder: str):
  return [m.path for m in
          FileSystems.match([folder.rstrip('/') + '/**'])[0].metadata_list]


def delete_tree(path: str) -> None:
  if FileSystems.exists(path):
    FileSystems.delete([path])


# The marker a finished output carries (the Hadoop convention): on object
# stores, where a folder cannot be replaced in one step, it goes last.
SUCCESS_MARKER = '_SUCCESS'
# Where outputs are staged, beside the final one: hidden from Hive-style
# readers (Spark, pyarrow datasets) and one level too deep for a glob such as
# ``scores/*/*.parquet``.
STAGING_DIR = '.staging'


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
  """A staging folder that replaces ``final_dir`` whole when published.

  Used as a context manager::

      with StagedOutput(final_dir, input_pattern) as output:
        ...write under output.staging_dir...
        output.publish()

  Entering creates the staging folder (an OutputError if the location cannot
  be written or lies inside the input); leaving without having published,
  whatever the reason, removes it, so nothing half-written ever remains.

  On a local disk the replacement is one atomic swap of folders: a reader
  sees the old output or the new one, never a mix and never neither. On an
  object store, files are moved one by one: the old success marker goes
  first and the new one last, so readers that wait for it see whole outputs.
  """

  def __init__(self, final_dir: str, input_pattern: Optional[str] = None):
    self.final_dir = final_dir.rstrip('/')
    self._input_pattern = input_pattern
    parent, name = posixpath.split(self.final_dir)
    self._staging_root = posixpath.join(parent, STAGING_DIR)
    self.staging_dir = posixpath.join(
        self._staging_root, f'{name}-{uuid.uuid4().hex[:12]}')
    self._published = False

  def __enter__(self) -> 'StagedOutput':
    self._create()
    return self

  def __exit__(self, *exc_info) -> None:
    if not self._published:
      self.discard()

  def _create(self) -> None:
    """Creates the staging folder, proving the location writable (and
    outside the input); on failure, nothing is left behind."""
    try:
      try:
        FileSystems.mkdirs(self.staging_dir)
        probe = FileSystems.join(self.staging_dir, '.probe')
        FileSystems.create(probe).close()
        FileSystems.delete([probe])
      except Exception as error:  # pylint: disable=broad-except
        raise OutputError(
            f'cannot write to {self.final_dir}: {error}') from error
      if self._input_pattern:
        self._check_outside(self._input_pattern)
    except OutputError:
      self.discard()
      raise

  def _check_outside(self, pattern: str) -> None:
    """Fails if files staged here would match ``pattern``: a job reading its
    own output would never finish the same way twice."""
    probe = FileSystems.join(self.staging_dir, 'overlap-probe')
    FileSystems.create(probe).close()
    try:
      matched = {m.path for m in
                 FileSystems.match([pattern])[0].metadata_list}
    finally:
      FileSystems.delete([probe])
    if probe in matched:
      raise OutputError(
          f'the output folder {self.final_dir} is inside the input {pattern}')

  def publish(self) -> None:
    """Moves the staged files into place, replacing any previous output."""
    if _is_local(self.final_dir):
      self._publish_local()
    else:
      self._publish_by_files()
    self._published = True
    self._remove_empty_staging_root()

  def _publish_local(self):
    if not os.path.lexists(self.final_dir):
      os.makedirs(os.path.dirname(os.path.abspath(self.final_dir)),
                  exist_ok=True)
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
    delete_tree(self.staging_dir)

  def _publish_by_files(self):
    def markers_and_others(paths):
      markers = [p for p in paths if posixpath.basename(p) == SUCCESS_MARKER]
      return markers, [p for p in paths if p not in markers]

    if FileSystems.exists(self.final_dir):
      for batch in markers_and_others(_list_files(self.final_dir)):
        if batch:
          FileSystems.delete(batch)
    for batch in reversed(markers_and_others(_list_files(self.staging_dir))):
      if batch:
        FileSystems.rename(batch, [self.final_dir + p[len(self.staging_dir):]
                                   for p in batch])
    delete_tree(self.staging_dir)

  def _remove_empty_staging_root(self):
    if _is_local(self._staging_root):
      try:
        os.rmdir(self._staging_root)
      except OSError:  # not empty: another run is staging beside this one
        pass

  def discard(self) -> None:
    try:
      delete_tree(self.staging_dir)
      self._remove_empty_staging_root()
    except Exception:  # pylint: disable=broad-except
      logging.warning('could not remove %s', self.staging_dir, exc_info=True)
