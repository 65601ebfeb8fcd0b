"""The file operations the outputs layer needs, behind one interface.

Each job implements it with the library it already reads and writes with:
the Beam jobs with Beam's ``FileSystems`` (``pipeline/filesystems.py``), the
trainer with ``tf.io.gfile`` (``trainer/runs.py``), so that the layer imports
neither and the rules hold on every file system the jobs reach. What only a
local disk has (symbolic and hard links, permissions, a folder renamed or
swapped in one step) the layer does with ``os`` where ``is_local`` says so.
"""
import abc
import os
import shutil
from typing import BinaryIO, List, NamedTuple, Optional, Sequence


class FileInfo(NamedTuple):
  """A file below a folder: its path, and when it last changed (seconds
  since the epoch; None where the file system does not say)."""
  path: str
  changed: Optional[float] = None


class Files(abc.ABC):
  """A file system as the outputs layer uses it. On an object store a
  folder is only the common prefix of its files' names."""

  @abc.abstractmethod
  def is_local(self, path: str) -> bool:
    """Whether ``path`` is on a local disk, which ``os`` reaches."""

  @abc.abstractmethod
  def exists(self, path: str) -> bool:
    """Whether a file or a folder is at ``path``."""

  @abc.abstractmethod
  def is_file(self, path: str) -> bool:
    """Whether a file (an object, not a prefix) is at ``path``."""

  @abc.abstractmethod
  def files(self, folder: str) -> List[FileInfo]:
    """Every file below ``folder``, hidden ones too; none when there is no
    such folder."""

  @abc.abstractmethod
  def makedirs(self, path: str) -> None:
    """Creates a folder and those above it (nothing on an object store)."""

  @abc.abstractmethod
  def write(self, path: str, data: bytes) -> None:
    """Creates or replaces the file at ``path``."""

  @abc.abstractmethod
  def open(self, path: str) -> BinaryIO:
    """The file at ``path``, opened to read its bytes as they are."""

  @abc.abstractmethod
  def delete(self, paths: Sequence[str]) -> None:
    """Removes files."""

  @abc.abstractmethod
  def rename(self, sources: Sequence[str], targets: Sequence[str]) -> None:
    """Moves each file of ``sources`` to the path at its place in
    ``targets``, creating folders as needed."""

  def listdir(self, folder: str) -> List[str]:
    """The names at the top of ``folder`` (empty folders too on a local
    disk); none when there is no such folder."""
    if self.is_local(folder):
      return os.listdir(folder) if os.path.isdir(folder) else []
    return sorted({relative(info.path, folder).split('/')[0]
                   for info in self.files(folder)})

  def delete_tree(self, path: str) -> None:
    """Removes a file or a folder and everything under it (on a local disk
    a link itself, never what it points to); nothing if nothing is there."""
    if self.is_local(path):
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
      elif os.path.lexists(path):
        os.remove(path)
      return
    paths = [info.path for info in self.files(path)]
    if self.is_file(path):
      paths.append(path.rstrip('/'))
    if paths:
      self.delete(paths)


def relative(path: str, folder: str) -> str:
  """``path`` relative to ``folder``, which holds it."""
  return path[len(folder.rstrip('/')) + 1:]
