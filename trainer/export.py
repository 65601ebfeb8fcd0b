"""The exported model: raw text in, label and probabilities out.

A SavedModel in TF Serving's layout, ``<model_dir>/export/<version>/``, whose
``serving_default`` signature takes a batch of raw strings (and whose
``tokenize`` and ``classify_token_ids`` signatures split it in two for a
caller that batches documents by length, ``schemas.serving``). The TFT transform
graph is inside it, so serving tokenizes exactly as training did and the
export keeps working after the preprocessing output is deleted. Metadata
(version, label names, parameters, data stats, and once evaluated the test
split's prediction distribution, ``reference``) is saved beside the graph in
``assets.extra/metadata.json``.
"""
import json
import logging
import posixpath
import time
from typing import Dict, List, Tuple

import tensorflow as tf

from schemas import serving
from schemas import transformed

EXPORT_DIR = 'export'
METADATA_FILE = posixpath.join('assets.extra', 'metadata.json')


class ExportError(Exception):
  """No usable export where one was expected."""


class RawTextClassifier(tf.Module):
  """The transform graph and the Keras model, behind one raw-text signature."""

  def __init__(self, model, tft_output, label_names: List[str]):
    super().__init__()
    self.model = model
    self.transform_layer = tft_output.transform_features_layer()
    self.label_names = tf.constant(label_names)

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.string, name=serving.TEXT)])
  def classify(self, text):
    outputs = self._numeric_outputs(self._token_ids(text))
    outputs[serving.LABEL] = tf.gather(self.label_names,
                                       outputs[serving.LABEL_ID])
    return outputs

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.string, name=serving.TEXT)])
  def tokenize(self, text):
    return {serving.TOKEN_IDS: self._token_ids(text)}

  # XLA fuses the model's many small ops; it compiles once per input shape,
  # so callers cut token ids to a few lengths only. Strings stay outside:
  # XLA has no string type.
  @tf.function(input_signature=[
      tf.TensorSpec([None, None], tf.int64, name=serving.TOKEN_IDS)],
               jit_compile=True)
  def classify_token_ids(self, token_ids):
    return self._numeric_outputs(token_ids)

  def _token_ids(self, text):
    # Only the text is fed: TFT computes just the features that need no
    # label or id.
    return self.transform_layer({serving.TEXT: text})[transformed.TOKEN_IDS]

  def _numeric_outputs(self, token_ids):
    probabilities = self.model(token_ids, training=False)
    return {
        serving.LABEL_ID: tf.argmax(probabilities, axis=-1),
        serving.CONFIDENCE: tf.reduce_max(probabilities, axis=-1),
        serving.PROBABILITIES: probabilities,
    }


def export(model, tft_output, label_names: List[str], model_dir: str,
           metadata: Dict) -> str:
  """Saves a new export version; returns its folder.

  The version is written under a temporary name and renamed into place, so
  a server polling ``export/`` never loads a half-written version.
  """
  version = int(time.time())
  export_root = posixpath.join(model_dir, EXPORT_DIR)
  while tf.io.gfile.exists(posixpath.join(export_root, str(version))):
    version += 1
  final = posixpath.join(export_root, str(version))
  staging = posixpath.join(export_root, f'.tmp-{version}')
  module = RawTextClassifier(model, tft_output, label_names)
  tf.saved_model.save(module, staging,
                      signatures={
                          serving.SIGNATURE: module.classify,
                          serving.TOKENIZE: module.tokenize,
                          serving.CLASSIFY_TOKEN_IDS: module.classify_token_ids,
                      })
  metadata = {**metadata, 'version': version, 'label_names': label_names}
  tf.io.gfile.makedirs(posixpath.join(staging, 'assets.extra'))
  with tf.io.gfile.GFile(posixpath.join(staging, METADATA_FILE), 'w') as out:
    json.dump(metadata, out, indent=2, sort_keys=True)
  tf.io.gfile.rename(staging, final)
  return final


def _missing_files(folder: str) -> List[str]:
  return [name for name in ('saved_model.pb', METADATA_FILE)
          if not tf.io.gfile.exists(posixpath.join(folder, name))]


def add_metadata(export_dir: str, sections: Dict) -> None:
  """Adds ``sections`` to an export's metadata, such as what its evaluation
  found; the file is replaced by a rename, never seen half-written."""
  path = posixpath.join(export_dir, METADATA_FILE)
  with tf.io.gfile.GFile(path) as handle:
    metadata = json.load(handle)
  metadata.update(sections)
  with tf.io.gfile.GFile(path + '.tmp', 'w') as out:
    json.dump(metadata, out, indent=2, sort_keys=True)
  tf.io.gfile.rename(path + '.tmp', path, overwrite=True)


def resolve(model_dir: str) -> str:
  """The export folder: ``model_dir`` itself, or its newest complete version.

  A newer version without its graph or its metadata (a copy cut short, a
  version being deleted) is skipped with a warning, so that a job goes on
  with the newest model it can load.
  """
  if tf.io.gfile.exists(posixpath.join(model_dir, 'saved_model.pb')):
    return model_dir
  root = posixpath.join(model_dir, EXPORT_DIR)
  versions = sorted(
      (int(name.rstrip('/')) for name in (
          tf.io.gfile.listdir(root) if tf.io.gfile.isdir(root) else [])
       if name.rstrip('/').isdigit()), reverse=True)
  for version in versions:
    folder = posixpath.join(root, str(version))
    missing = _missing_files(folder)
    if not missing:
      return folder
    logging.warning('skipping the incomplete export %s: no %s', folder,
                    ' or '.join(missing))
  raise ExportError(f'no exported model in {model_dir} (expected '
                    f'saved_model.pb, or {EXPORT_DIR}/<version>/ with '
                    f'saved_model.pb and {METADATA_FILE})')


def load(model_dir: str) -> Tuple[object, Dict]:
  """The serving signature and metadata of the export ``model_dir`` names."""
  path = resolve(model_dir)
  try:
    loaded = tf.saved_model.load(path)
    with tf.io.gfile.GFile(posixpath.join(path, METADATA_FILE)) as handle:
      metadata = json.load(handle)
  except Exception as error:  # pylint: disable=broad-except
    raise ExportError(f'cannot load the model in {path}: {error}') from error
  names = metadata.get('label_names') if isinstance(metadata, dict) else None
  if not (isinstance(names, list) and names and
          all(isinstance(name, str) for name in names)):
    raise ExportError(f'{posixpath.join(path, METADATA_FILE)} has no '
                      'label_names (a list of the class names)')
  signature = loaded.signatures[serving.SIGNATURE]
  # Keep the loaded object alive as long as its signature is used.
  signature.loaded_object = loaded
  return signature, metadata
