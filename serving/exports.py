"""Finding and loading the trainer's export (``schemas.serving``).

An export is ``<model_dir>/export/<version>/``: a SavedModel whose
``serving_default`` takes raw text, and its metadata. A job names either the
model folder, and gets its newest complete blessed version (the trainer's
gate, ``trainer.blessing``; a version made before the gate counts as
blessed), or one version folder, which it gets as asked, blessed or not.
"""
import contextlib
import dataclasses
import json
import logging
import posixpath
import threading
from typing import Dict, Iterator, List, Optional, Tuple

import tensorflow as tf

from schemas import metadata as metadata_lib
from schemas import serving
from schemas import transformed
from schemas.metadata import ExportMetadata
from schemas.serving import MAX_VERSION
from schemas.serving import version_number
from serving import drift

__all__ = ('AS_ASKED', 'Chosen', 'ExportError', 'ExportMetadata',
           'MAX_VERSION', 'NEWEST', 'NEWEST_BLESSED', 'add_metadata',
           'check_against_graph', 'choose', 'lending', 'load',
           'load_metadata', 'read_metadata', 'resolve', 'version_number',
           'versions', 'write_metadata')

# Why a job serves the export it serves.
AS_ASKED = 'as asked'  # the folder named is an export: blessed or not
NEWEST_BLESSED = 'newest blessed'
NEWEST = 'newest'  # blessed or not: the report the trainer copies


class ExportError(Exception):
  """No usable export where one was expected."""


def _missing_files(folder: str) -> List[str]:
  return [name for name in (serving.SAVED_MODEL_FILE, serving.METADATA_FILE)
          if not tf.io.gfile.exists(posixpath.join(folder, name))]


def read_metadata(export_dir: str) -> Dict:
  with tf.io.gfile.GFile(posixpath.join(export_dir,
                                        serving.METADATA_FILE)) as handle:
    return json.load(handle)


def write_metadata(export_dir: str, metadata: Dict) -> None:
  """Replaces an export's metadata by a rename: never seen half-written."""
  path = posixpath.join(export_dir, serving.METADATA_FILE)
  tf.io.gfile.makedirs(posixpath.dirname(path))
  with tf.io.gfile.GFile(path + '.tmp', 'w') as out:
    json.dump(metadata, out, indent=2, sort_keys=True)
  tf.io.gfile.rename(path + '.tmp', path, overwrite=True)


def versions(model_dir: str) -> Dict[int, str]:
  """The version folders of a model folder, by version; names that look
  like versions but are none (``007``, ``²``, beyond 2^63) are skipped
  with a warning naming them."""
  root = posixpath.join(model_dir, serving.EXPORT_DIR)
  found = {}
  for name in tf.io.gfile.listdir(root) if tf.io.gfile.isdir(root) else []:
    name = name.rstrip('/')
    version = version_number(name)
    if version is not None:
      found[version] = posixpath.join(root, name)
    elif name[:1].isdigit():
      logging.warning('skipping %s: not a version folder (a whole number '
                      'in ASCII digits, without leading zeros, below 2^63)',
                      posixpath.join(root, name))
  return found


@dataclasses.dataclass(frozen=True)
class Chosen:
  """The export a job serves and why: ``AS_ASKED``, ``NEWEST_BLESSED`` or
  ``NEWEST``; ``passed_over``, the newer complete versions the gate did not
  bless, as (version, the gate's reason)."""
  folder: str
  why: str
  passed_over: Tuple[Tuple[int, str], ...] = ()

  def record(self) -> Dict:
    """What a job's manifest says of its choice."""
    return {'why': self.why, 'passed_over': [
        {'version': version, 'reason': reason}
        for version, reason in self.passed_over]}


def _not_blessed_because(folder: str) -> Optional[str]:
  """The gate's reason where the export's metadata says it is not blessed;
  None where it is, where it predates the gate, and where the metadata
  cannot be read as one (``load_metadata`` then names the fault)."""
  try:
    metadata = metadata_lib.ExportMetadata.parse(read_metadata(folder))
  except Exception:  # pylint: disable=broad-except
    return None
  if metadata.blessed:
    return None
  return str(metadata.blessing.get('reason', 'no reason recorded'))


def choose(model_dir: str, blessed_only: bool = True) -> Chosen:
  """The export folder a job takes, and why: ``model_dir`` itself if it is
  an export, as asked; else the newest complete version of the model folder
  that the trainer's gate blessed (any, ``blessed_only=False``).

  A newer version without its graph or its metadata (a copy cut short, a
  version being deleted) is skipped with a warning, so that a job goes on
  with the newest model it can load; one the gate did not bless, with a
  warning naming it and why.
  """
  if tf.io.gfile.exists(posixpath.join(model_dir, serving.SAVED_MODEL_FILE)):
    return Chosen(model_dir, AS_ASKED)
  found = versions(model_dir)
  passed_over = []
  for version in sorted(found, reverse=True):
    folder = found[version]
    missing = _missing_files(folder)
    if missing:
      logging.warning('skipping the incomplete export %s: no %s', folder,
                      ' or '.join(missing))
      continue
    reason = _not_blessed_because(folder) if blessed_only else None
    if reason is None:
      return Chosen(folder, NEWEST_BLESSED if blessed_only else NEWEST,
                    tuple(passed_over))
    logging.warning('skipping the export %s, not blessed: %s (name its '
                    'folder to serve it anyway)', folder, reason)
    passed_over.append((version, reason))
  if passed_over:
    raise ExportError(f'no blessed export in {model_dir}: ' + '; '.join(
        f'version {version} is not blessed: {reason}'
        for version, reason in passed_over) + '; name its version folder '
        f'({found[passed_over[0][0]]}) to serve it anyway')
  raise ExportError(f'no exported model in {model_dir} (expected '
                    f'saved_model.pb, or {serving.EXPORT_DIR}/<version>/ '
                    f'with saved_model.pb and {serving.METADATA_FILE})')


def resolve(model_dir: str, blessed_only: bool = True) -> str:
  """The export folder a job takes (``choose``)."""
  return choose(model_dir, blessed_only).folder


def load_metadata(export_dir: str) -> ExportMetadata:
  """An export's metadata, parsed and checked (``schemas.metadata``), and
  checked to belong to its version folder."""
  path = posixpath.join(export_dir, serving.METADATA_FILE)
  try:
    document = read_metadata(export_dir)
  except Exception as error:  # pylint: disable=broad-except
    raise ExportError(f'cannot read {path}: {error}') from error
  try:
    metadata = ExportMetadata.parse(document)
  except ValueError as error:
    raise ExportError(f'{path} {error}') from error
  folder = export_dir.rstrip('/')
  named = version_number(posixpath.basename(folder))
  if (named is not None and metadata.version not in (None, named) and
      posixpath.basename(posixpath.dirname(folder)) == serving.EXPORT_DIR):
    # The scores would name a model that is not the one that made them.
    raise ExportError(f'{path} says version {metadata.version}, but it is '
                      f'the metadata of version folder {named}')
  problem = drift.reference_problem(metadata.reference,
                                    list(metadata.label_names))
  if problem:
    raise ExportError(f'{path} has a {drift.REFERENCE} (the test split\'s '
                      f'predictions, which drift is measured against) that '
                      f'cannot be one: {problem}')
  return metadata


# Exports loaded in this process and lent, for as long as a job runs, to
# the loads of the same folder in its own in-process workers (``lending``).
_LENT: Dict[str, List[Tuple[object, ExportMetadata]]] = {}
_LENDING = threading.Lock()


@contextlib.contextmanager
def lending(export_dir: str, signature, metadata: ExportMetadata
            ) -> Iterator[None]:
  """While it lasts, ``load`` of ``export_dir`` (a folder ``resolve``
  gave) in this process, with its metadata or none, answers ``signature``
  (loaded and checked by ``load``) instead of reading the export again: a
  local runner's workers score with the graph the job loaded before the
  pipeline. A worker in another process loads its own."""
  lent = (signature, metadata)
  with _LENDING:
    _LENT.setdefault(export_dir, []).append(lent)
  try:
    yield
  finally:
    with _LENDING:
      loans = _LENT[export_dir]
      loans.remove(lent)
      if not loans:
        del _LENT[export_dir]


def load(model_dir: str, metadata: Optional[ExportMetadata] = None
         ) -> Tuple[object, ExportMetadata]:
  """The serving signature and metadata of the export ``model_dir`` names,
  checked against each other. Given the ``metadata`` that a caller read of
  this export already (``load_metadata``), it is not read again; where a
  job lends it (``lending``), the lent signature is the answer."""
  path = resolve(model_dir)
  for signature, lent_metadata in _LENT.get(path, ())[-1:]:
    if metadata is None or metadata == lent_metadata:
      return signature, lent_metadata
  metadata = metadata or load_metadata(path)
  try:
    loaded = tf.saved_model.load(path)
  except Exception as error:  # pylint: disable=broad-except
    raise ExportError(f'cannot load the model in {path}: {error}') from error
  signature = loaded.signatures[serving.SIGNATURE]
  # Keep the loaded object alive as long as its signature is used.
  signature.loaded_object = loaded
  check_against_graph(signature, metadata, path)
  return signature, metadata


# Texts the graph answers when its metadata is checked: any will do.
_PROBE_TEXTS = ('the', 'a b c d')


def check_against_graph(signature, metadata: ExportMetadata,
                        path: str) -> None:
  """ExportError unless the metadata describes the graph it sits beside:
  as many label names as the graph has probabilities, each answer's label
  the name of its most probable class, and the label vocabulary the graph
  was built with (its ``assets/labels``) in the same order. A metadata file
  edited or copied from another export would otherwise relabel every
  prediction."""
  names = list(metadata.label_names)
  problem = None
  vocabulary_file = posixpath.join(path, 'assets',
                                   transformed.LABEL_VOCABULARY)
  if tf.io.gfile.exists(vocabulary_file):
    with tf.io.gfile.GFile(vocabulary_file) as handle:
      vocabulary = handle.read().splitlines()
    if vocabulary != names:
      problem = (f'its label vocabulary is {vocabulary}, the metadata\'s '
                 f'label_names {names}')
  if problem is None:
    try:
      outputs = signature(text=tf.constant([t.encode() for t in
                                            _PROBE_TEXTS]))
      probabilities = outputs[serving.PROBABILITIES].numpy()
      labels = [label.decode('utf-8', 'replace')
                for label in outputs[serving.LABEL].numpy()]
    except Exception:  # pylint: disable=broad-except
      # A model that fails on any text is the scoring job's to report, as
      # the model failing (its own exit status), not as its metadata.
      return
    if probabilities.ndim != 2 or probabilities.shape[1] != len(names):
      problem = (f'it answers {probabilities.shape[-1]} probabilities, the '
                 f'metadata names {len(names)} labels {names}')
    elif labels != [names[i] for i in probabilities.argmax(axis=1)]:
      problem = (f'it labels its most probable classes {labels}, the '
                 f'metadata\'s label_names {names} call them '
                 f'{[names[i] for i in probabilities.argmax(axis=1)]}')
  if problem:
    raise ExportError(f'{posixpath.join(path, serving.METADATA_FILE)} does '
                      f'not describe the model beside it: {problem}')


def add_metadata(export_dir: str, sections: Dict) -> None:
  """Adds ``sections`` to an export's metadata, such as what its evaluation
  found."""
  write_metadata(export_dir, {**read_metadata(export_dir), **sections})
