"""The export's ``serving_default``, computed on documents grouped by length.

The transform graph pads every document to ``max_len`` and the model then
spends as much on the padding as on the tokens. The model masks padding, so
a document's prediction does not depend on how much of it follows: given a
batch, ``LengthGroupedModel`` tokenizes it in one call, sorts the documents
by token count, and calls the model on runs of ``batch_size`` neighbours cut
to the length of the longest of them, rounded up to a power of two (capped
at max_len). The model part is compiled with XLA, once for each of those few
lengths; every call has ``batch_size`` rows (the one short run of a batch is
filled with padding rows), so that no other shape is ever compiled.

Exports made before the two signatures this needs (``schemas.serving``) are
served by their ``serving_default`` as they are.
"""
import logging
from typing import Dict, List, Sequence

import numpy as np

from schemas import serving
from schemas import transformed
from trainer import export

# The shortest cut: below it, XLA compilations cost more than they save.
SHORTEST = 32


def supports(signature) -> bool:
  """Whether the export behind ``signature`` (from ``trainer.export.load``)
  has the signatures length grouping needs."""
  signatures = signature.loaded_object.signatures
  return (serving.TOKENIZE in signatures and
          serving.CLASSIFY_TOKEN_IDS in signatures)


def bucket_lengths(max_len: int, shortest: int = SHORTEST) -> List[int]:
  """The lengths batches are cut to: powers of two from ``shortest``, and
  max_len itself."""
  lengths = []
  length = shortest
  while length < max_len:
    lengths.append(length)
    length *= 2
  return lengths + [max_len]


class LengthGroupedModel:
  """Called as the export's ``serving_default`` is (raw text in, the same
  outputs out, as numpy arrays), for any batch size."""

  def __init__(self, signature, label_names: Sequence[str], batch_size: int,
               shortest: int = SHORTEST):
    signatures = signature.loaded_object.signatures
    self._tokenize = signatures[serving.TOKENIZE]
    self._classify = signatures[serving.CLASSIFY_TOKEN_IDS]
    # Keep the loaded object alive as long as its signatures are used.
    self.loaded_object = signature.loaded_object
    self._label_names = np.array([name.encode('utf-8')
                                  for name in label_names], dtype=object)
    self._batch_size = batch_size
    self._shortest = shortest

  def __call__(self, text: Sequence[bytes]) -> Dict[str, np.ndarray]:
    token_ids = self._tokenize(**{serving.TEXT: text})[
        serving.TOKEN_IDS].numpy()
    lengths = np.count_nonzero(token_ids != transformed.PAD_ID, axis=1)
    cuts = np.array(bucket_lengths(token_ids.shape[1], self._shortest))
    # Longest first: the one short run is then of the shortest documents.
    order = np.argsort(-lengths, kind='stable')
    probabilities = np.empty((len(text), len(self._label_names)), np.float32)
    for start in range(0, len(order), self._batch_size):
      rows = order[start:start + self._batch_size]
      cut = cuts[np.searchsorted(cuts, max(lengths[rows[0]], 1))]
      probabilities[rows] = self._classify_rows(token_ids[rows, :cut])
    label_ids = np.argmax(probabilities, axis=-1)
    return {
        serving.LABEL: self._label_names[label_ids],
        serving.LABEL_ID: label_ids,
        serving.CONFIDENCE: np.max(probabilities, axis=-1),
        serving.PROBABILITIES: probabilities,
    }

  def _classify_rows(self, token_ids: np.ndarray) -> np.ndarray:
    count = len(token_ids)
    if count < self._batch_size:
      token_ids = np.pad(token_ids, [(0, self._batch_size - count), (0, 0)],
                         constant_values=transformed.PAD_ID)
    outputs = self._classify(**{serving.TOKEN_IDS: token_ids})
    return outputs[serving.PROBABILITIES].numpy()[:count]


def load(export_dir: str, batch_size: int):
  """The export's model as ``pipeline.score`` calls it: length-grouped where
  the export allows, else its ``serving_default``."""
  signature, metadata = export.load(export_dir)
  if not supports(signature):
    logging.info('score: %s predates the token-id signatures; every '
                 'document is padded to max_len', export_dir)
    return signature
  return LengthGroupedModel(signature, metadata['label_names'], batch_size)
