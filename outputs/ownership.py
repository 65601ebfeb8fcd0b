"""What marks each job's output folder, so that no job writes over, into or
around the output of another.

A folder is a job's output when it holds, at its top, every name of one of
that job's entries in ``MARKERS``: names no other job writes there.
"""
import os
import posixpath
from typing import Callable, Iterator, Optional, Set, Tuple

from schemas import scored
from schemas import serving
from schemas import transformed

# The marker a finished output of a Beam job carries (the Hadoop
# convention): on object stores, where a folder cannot be replaced in one
# step, it goes last, and readers wait for it.
SUCCESS_MARKER = '_SUCCESS'

PREPROCESSING = 'a preprocessing output'
SCORING = 'a scoring output'
MODEL = 'a model folder'
# One version of a model folder's export, or one copied out: a SavedModel
# with the trainer's metadata (the preprocessing output's transform_fn/ is
# a SavedModel too, without it).
EXPORT = 'a model export'

# The model folder's own files at its top (besides its export folder and
# the run's scratch files): the trainer's lock, which stays on a local disk,
# and the newest version's report.
MODEL_LOCK = '.trainer.lock'
MODEL_METRICS = 'metrics.json'
MODEL_REPORT = 'report.md'

# (names a folder holds at its top, whose output it then is). The lock goes
# with the trainer's run on an object store; the export and its report stay.
MARKERS: Tuple[Tuple[Tuple[str, ...], str], ...] = (
    ((transformed.PARAMS_FILE,), PREPROCESSING),
    ((scored.MANIFEST_FILE,), SCORING),
    ((MODEL_LOCK,), MODEL),
    ((serving.EXPORT_DIR, MODEL_METRICS), MODEL),
    ((serving.SAVED_MODEL_FILE, posixpath.dirname(serving.METADATA_FILE)),
     EXPORT),
)


def owners(holds: Callable[[str], bool]) -> Set[str]:
  """Whose output a folder is, given ``holds(name)``: whether it holds
  ``name`` at its top; more than one job's when jobs wrote into one folder,
  none when no job did."""
  return {job for names, job in MARKERS
          if all(holds(name) for name in names)}


def resolved(path: str) -> str:
  """A local path made absolute with its symbolic links resolved (a job
  checks and writes the folder a link leads to, never the link's spelling
  of it); another file system's path without a trailing ``/``."""
  if '://' in path:
    return path.rstrip('/')
  return os.path.realpath(path)


def absolute(path: str) -> str:
  """A local path made absolute (its links kept); another file system's
  as it is."""
  return path if '://' in path else os.path.abspath(path)


def ancestors(path: str) -> Iterator[str]:
  """The folders above ``path``, nearest first, up to the root of its file
  system (``/``, or ``gs://bucket``)."""
  scheme, _, rest = path.rstrip('/').rpartition('://')
  prefix = f'{scheme}://' if scheme else ''
  while True:
    parent = posixpath.dirname(rest)
    if parent == rest or not parent:
      return
    rest = parent
    yield prefix + rest


def enclosing_output(path: str, exists: Callable[[str], bool]
                     ) -> Optional[Tuple[str, str]]:
  """(folder, whose output) of the nearest folder above ``path`` (a local
  one made absolute) that is a job's output, given ``exists`` of a path;
  None if none is."""
  for folder in ancestors(absolute(path)):
    jobs = owners(lambda name, folder=folder: exists(posixpath.join(folder,
                                                                   name)))
    if jobs:
      return folder, ' and '.join(sorted(jobs))
  return None
