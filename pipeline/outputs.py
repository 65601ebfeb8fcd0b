"""Job outputs that appear whole or not at all, on any Beam filesystem.

A job writes into a staging folder beside its final output and publishes it
only after the pipeline succeeded, so a failed or killed run never leaves a
half-written output where a finished one is expected.
"""
import json
import logging
import os
import posixpath
import uuid

from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem


class OutputError(IOError):
  """The output location cannot be written."""


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


class StagedOutput:
  """A staging folder that replaces ``final_dir`` when published."""

  def __init__(self, final_dir: str):
    self.final_dir = final_dir.rstrip('/')
    parent, name = posixpath.split(self.final_dir)
    self.staging_dir = posixpath.join(
        parent, f'.{name}.staging-{uuid.uuid4().hex[:12]}')

  def create(self) -> str:
    """Creates the staging folder, proving the location writable."""
    try:
      FileSystems.mkdirs(self.staging_dir)
      probe = FileSystems.join(self.staging_dir, '.probe')
      FileSystems.create(probe).close()
      FileSystems.delete([probe])
    except Exception as error:  # pylint: disable=broad-except
      raise OutputError(
          f'cannot write to {self.final_dir}: {error}') from error
    return self.staging_dir

  def check_outside(self, pattern: str) -> None:
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
    delete_tree(self.final_dir)
    if _is_local(self.final_dir):
      os.makedirs(os.path.dirname(os.path.abspath(self.final_dir)),
                  exist_ok=True)
      os.rename(self.staging_dir, self.final_dir)
      return
    sources = _list_files(self.staging_dir)
    targets = [self.final_dir + path[len(self.staging_dir):]
               for path in sources]
    FileSystems.rename(sources, targets)
    delete_tree(self.staging_dir)

  def discard(self) -> None:
    try:
      delete_tree(self.staging_dir)
    except Exception:  # pylint: disable=broad-except
      logging.warning('could not remove %s', self.staging_dir, exc_info=True)
