"""File operations the outputs need, on any Beam file system."""
import json
import os
import re
from typing import List

from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

from schemas import folders


def write_json(path: str, value) -> None:
  with FileSystems.create(path, mime_type='application/json') as handle:
    handle.write(json.dumps(value, indent=2, sort_keys=True).encode('utf-8'))
    handle.write(b'\n')


def read_json(path: str):
  with FileSystems.open(path) as handle:
    return json.loads(handle.read().decode('utf-8'))


def is_local(path: str) -> bool:
  return isinstance(FileSystems.get_filesystem(path), LocalFileSystem)


def exists(path: str) -> bool:
  """Whether a file or a folder is at ``path``; on an object store, a
  folder is the common prefix of files' names."""
  return FileSystems.exists(path) or bool(FileSystems.match(
      [path.rstrip('/') + '/*'], [1])[0].metadata_list)


def files(folder: str) -> List[FileMetadata]:
  """Every file under ``folder``, hidden ones too."""
  return FileSystems.match([folder.rstrip('/') + '/**'])[0].metadata_list


def relative(metadata: FileMetadata, folder: str) -> str:
  return metadata.path[len(folder.rstrip('/')) + 1:]


def delete_tree(path: str) -> None:
  """Removes a folder and everything under it; on an object store, where a
  folder is only the common prefix of its files' names, those files."""
  if is_local(path):
    if os.path.lexists(path):
      FileSystems.delete([path])
  else:
    paths = [m.path for m in files(path)]
    if paths:
      FileSystems.delete(paths)


def resolved(path: str) -> str:
  """A local path with its symbolic links resolved, so that an output goes
  into a linked folder and never replaces the link."""
  return folders.resolved(path)


def resolved_pattern(pattern: str) -> str:
  """An input pattern with its literal folder resolved as output paths are,
  so that the two compare."""
  if not is_local(pattern):
    return pattern
  pattern = os.path.abspath(pattern)
  folder = os.path.dirname(re.match(r'[^[*?]*', pattern).group(0))
  return os.path.realpath(folder) + pattern[len(folder):]


def remove_empty_folders(top: str) -> None:
  for folder, _, _ in os.walk(top, topdown=False):
    if folder != top and not os.listdir(folder):
      os.rmdir(folder)
