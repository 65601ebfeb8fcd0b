"""The trainer's model folder through the outputs layer (``outputs``,
add-a-version: ``outputs.versions``): ``tf.io.gfile`` as its file access,
the names of what a run writes there, and the newest version's report
copied to the folder's top.

A run writes its scratch files (Keras's history.csv, the best checkpoint,
the hybrid's n-gram branch's) into ``Run.scratch`` and its export into
``Run.export``, names that ``serving.exports.resolve`` skips; only a run
that succeeded puts them in place (``Run.publish``). The model folder's
lock (``trainer.lock``) makes every run folder that the holder did not make
a killed run's: ``sweep`` removes them.
"""
import posixpath
import re
from typing import BinaryIO, List, Optional, Sequence

import tensorflow as tf

from outputs import files as files_lib
from outputs import versions
from outputs.versions import LOGS_DIR
from outputs.versions import SCRATCH_PREFIX
from outputs.versions import STAGING_PREFIX
from schemas import serving
from serving import exports
from trainer import evaluate
from trainer import model as model_lib

__all__ = ('CHECKPOINTS_DIR', 'CHECKPOINT_FILE', 'FILES', 'LAYOUT',
           'LOGS_DIR', 'Run', 'SCRATCH', 'SCRATCH_PREFIX', 'STAGING_PREFIX',
           'check_own', 'copy_report', 'report_dir', 'sweep')

CHECKPOINTS_DIR = 'checkpoints'
CHECKPOINT_FILE = 'best.weights.h5'
# A run's files beside its export: each replaces the previous run's.
SCRATCH = (evaluate.HISTORY_FILE, CHECKPOINTS_DIR, model_lib.NGRAM_LOGITS)
# The files in them: a branch's history and best checkpoint; the n-gram
# branch's in its folder, in a folder a minimum count where several were
# tried (``train.fit_ngram_branch``).
_BRANCH_FILES = '|'.join(re.escape(path) for path in (
    evaluate.HISTORY_FILE, posixpath.join(CHECKPOINTS_DIR, CHECKPOINT_FILE)))
LAYOUT = versions.ModelLayout(
    SCRATCH, rf'({re.escape(model_lib.NGRAM_LOGITS)}/(min_count_\d+/)?)?'
    rf'({_BRANCH_FILES})', evaluate.PLOTS)


class GFiles(files_lib.Files):
  """Any file system ``tf.io.gfile`` reaches; a path without a scheme is
  on a local disk."""

  def is_local(self, path: str) -> bool:
    return '://' not in path

  def exists(self, path: str) -> bool:
    return tf.io.gfile.exists(path)

  def is_file(self, path: str) -> bool:
    return tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)

  def files(self, folder: str) -> List[files_lib.FileInfo]:
    if not tf.io.gfile.isdir(folder):
      return []
    return [files_lib.FileInfo(posixpath.join(parent, name))
            for parent, _, names in tf.io.gfile.walk(folder)
            for name in names]

  def listdir(self, folder: str) -> List[str]:
    if not tf.io.gfile.isdir(folder):
      return []
    return [name.rstrip('/') for name in tf.io.gfile.listdir(folder)]

  def makedirs(self, path: str) -> None:
    tf.io.gfile.makedirs(path)

  def write(self, path: str, data: bytes) -> None:
    with tf.io.gfile.GFile(path, 'wb') as handle:
      handle.write(data)

  def open(self, path: str) -> BinaryIO:
    return tf.io.gfile.GFile(path, 'rb')

  def delete(self, paths: Sequence[str]) -> None:
    for path in paths:
      tf.io.gfile.remove(path)

  def rename(self, sources: Sequence[str], targets: Sequence[str]) -> None:
    for source, target in zip(sources, targets):
      tf.io.gfile.makedirs(posixpath.dirname(target))
      tf.io.gfile.rename(source, target, overwrite=True)


FILES = GFiles()


class Run(versions.Run):
  """The folders of one run in ``model_dir``."""

  def __init__(self, model_dir: str, run_id: Optional[str] = None):
    super().__init__(FILES, model_dir, LAYOUT, run_id)

  def publish(self, version: int) -> str:
    """Publishes the run (``versions.Run.publish``), then copies the new
    version's report to the model folder's top; returns the version's
    folder."""
    final = super().publish(version)
    copy_report(self.model_dir)
    return final


def check_own(model_dir: str) -> None:
  """An OutputError unless the trainer may write into ``model_dir``
  (``versions.check``)."""
  versions.check(FILES, model_dir, LAYOUT)


def sweep(model_dir: str) -> None:
  """Removes what killed runs left (``versions.sweep``)."""
  versions.sweep(FILES, model_dir)


def report_dir(export_dir: str) -> str:
  return posixpath.join(export_dir, serving.REPORT_DIR)


def copy_report(model_dir: str) -> None:
  """Copies the newest version's report, blessed or not (it says which),
  to the model folder's top, where readers look for it; a run killed
  before it had copied is made good by the next, which copies again when
  it starts."""
  try:
    newest = exports.resolve(model_dir, blessed_only=False)
  except exports.ExportError:
    return
  folder = report_dir(newest)
  if not tf.io.gfile.isdir(folder):
    return  # a version exported before the report went with it
  for name in tf.io.gfile.listdir(folder):
    tf.io.gfile.copy(posixpath.join(folder, name),
                     posixpath.join(model_dir, name), overwrite=True)
