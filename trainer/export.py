"""The exported model: raw text in, label and probabilities out.

A SavedModel in TF Serving's layout, ``<model_dir>/export/<version>/``, whose
``serving_default`` signature takes a batch of raw strings (and whose
``tokenize`` and ``classify_token_ids`` signatures split it in two for a
caller that batches documents by length, ``schemas.serving``). The TFT transform
graph is inside it, so serving tokenizes exactly as training did and the
export keeps working after the preprocessing output is deleted. Metadata
(version, label names, parameters, data stats, and from the evaluation the
test split's prediction distribution, ``reference``, and the headline
figures, ``evaluation``) is saved beside the graph
(``schemas.serving.METADATA_FILE``); ``serving.exports`` finds and loads it.

An export is saved into a staging folder that no reader looks at, evaluated
there, and renamed to its version only then: a version that a scoring job
can see has its evaluation and its drift reference, whenever the trainer
was stopped.
"""
from typing import Dict, List

import tensorflow as tf

from schemas import serving
from schemas import transformed
from serving import exports


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


def save(model, tft_output, label_names: List[str], staging: str,
         metadata: Dict) -> None:
  """Saves the export, not yet visible, into ``staging`` (``runs.Run.export``),
  for the evaluation to serve and complete; ``runs.Run.publish`` makes it a
  version."""
  module = RawTextClassifier(model, tft_output, label_names)
  tf.saved_model.save(module, staging,
                      signatures={
                          serving.SIGNATURE: module.classify,
                          serving.TOKENIZE: module.tokenize,
                          serving.CLASSIFY_TOKEN_IDS: module.classify_token_ids,
                      })
  exports.write_metadata(staging, {**metadata, 'label_names': label_names})
