"""The export's ``serving_default``, computed in small calls grouped by length.

Two things make the plain signature slow on a CPU. The transform graph pads
every document to ``max_len``, and the model spends as much on the padding
as on the tokens. And a call of hundreds of rows makes activations (the
attention's ``[rows, heads, length, length]`` scores above all) too large
for the processor's caches.

So ``LengthGroupedModel`` tokenizes a batch, sorts the documents by token
count, and calls the model on runs of ``CALL_ROWS`` neighbours cut to the
longest of them, rounded up to one of a few lengths (``bucket_lengths``).
The model masks padding, so a document's prediction does not depend on
where its batch is cut. The model part is compiled with XLA once for each
of those lengths, when the model is loaded; every call has ``CALL_ROWS``
rows (the batch's one short run is filled with padding rows), so no other
shape is ever compiled. The calls of a batch run on a few threads a core:
TensorFlow releases the GIL while it computes.

Exports made before the two signatures this needs (``schemas.serving``) are
served by their ``serving_default``, in calls of ``CALL_ROWS`` as well.

A model computes one batch at a time, on threads that live for that batch
alone: however many callers share it, a process runs at most ``threads``
model calls, and nothing is left running between batches.
"""
import concurrent.futures
import logging
import os
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from schemas import serving
from schemas import transformed
from serving import exports

# Rows of one model call (see above).
CALL_ROWS = 32
# Threads a model calls on, per core: with two, one thread's Python between
# calls and its call's start overlap with the other's computing.
THREADS_PER_CORE = 2
# The shortest cut: below it, an XLA compilation costs more than it saves.
SHORTEST = 64
# Cuts per doubling of the length: a call is then padded by at most a
# quarter of its longest document; more cuts mean more XLA compilations
# (about a second each) at a worker's start.
CUTS_PER_OCTAVE = 4
# LLVM's lighter optimisation: each length compiles faster and the calls
# run as fast; and vectors as wide as the processor has (LLVM's default
# stops at 256 bits). XLA reads them when it first compiles, so a caller
# sets them before loading (the scoring job's model handler does, through
# Beam's env_vars), unless the user set XLA_FLAGS.
XLA_FLAGS = ('--xla_backend_optimization_level=1 '
             '--xla_cpu_prefer_vector_width=512')

Outputs = Dict[str, np.ndarray]


def run_ops_on_callers_threads() -> bool:
  """Makes TensorFlow run each op on the thread that calls it, unless the
  user set TF_NUM_INTRAOP_THREADS: the model's calls already run on a few
  threads a core, and splitting their ops again over TensorFlow's pool of
  a thread a core costs more than it gains (BENCHMARKS.md, issue 21).
  TensorFlow fixes its pools when its runtime starts, so a process calls
  this before it loads any model; returns whether it took effect."""
  if 'TF_NUM_INTRAOP_THREADS' in os.environ:
    return False
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  try:
    tf.config.threading.set_intra_op_parallelism_threads(1)
  except RuntimeError:  # the runtime has started
    return tf.config.threading.get_intra_op_parallelism_threads() == 1
  return True


def supports(signature) -> bool:
  """Whether the export behind ``signature`` (from ``serving.exports.load``)
  has the signatures length grouping needs."""
  signatures = signature.loaded_object.signatures
  return (serving.TOKENIZE in signatures and
          serving.CLASSIFY_TOKEN_IDS in signatures)


def bucket_lengths(max_len: int, shortest: int = SHORTEST) -> List[int]:
  """The lengths batches are cut to: from ``shortest``, ``CUTS_PER_OCTAVE``
  evenly spaced lengths per doubling, and max_len itself."""
  lengths = []
  length = shortest
  while length < max_len:
    lengths.append(length)
    octave = 1 << (length.bit_length() - 1)  # the power of two <= length
    length += max(octave // CUTS_PER_OCTAVE, 1)
  return lengths + [max_len]


def _slices(items: Sequence, size: int) -> List[Sequence]:
  return [items[start:start + size] for start in range(0, len(items), size)]


class SmallCalls:
  """A model called in calls of ``call_rows`` documents on up to
  ``threads`` threads (by default ``THREADS_PER_CORE`` a core); called as
  the export's ``serving_default`` is, raw text in, its outputs out as
  numpy arrays."""

  def __init__(self, label_names: Sequence[str], call_rows: int,
               threads: int):
    self.label_names = list(label_names)
    self._label_bytes = np.array([name.encode('utf-8')
                                  for name in label_names], dtype=object)
    self._call_rows = call_rows
    self.threads = threads or THREADS_PER_CORE * (os.cpu_count() or 1)
    # One batch at a time: its calls already take every thread.
    self._one_batch = threading.Lock()

  def __call__(self, text: Sequence[bytes]) -> Outputs:
    with self._one_batch:
      return self.outputs(self._probabilities(text))

  def _probabilities(self, text: Sequence[bytes]) -> np.ndarray:
    raise NotImplementedError

  def map(self, call: Callable, arguments: Sequence) -> List:
    """``call`` on each argument, on threads that end with the batch;
    answers in order."""
    if len(arguments) == 1:  # no thread for a batch of one call
      return [call(arguments[0])]
    with concurrent.futures.ThreadPoolExecutor(
        min(self.threads, len(arguments)),
        thread_name_prefix='model-call') as pool:
      return list(pool.map(call, arguments))

  def outputs(self, probabilities: np.ndarray) -> Outputs:
    label_ids = np.argmax(probabilities, axis=-1)
    return {
        serving.LABEL: self._label_bytes[label_ids],
        serving.LABEL_ID: label_ids,
        serving.CONFIDENCE: np.max(probabilities, axis=-1),
        serving.PROBABILITIES: probabilities,
    }


class LengthGroupedModel(SmallCalls):
  """An export with the token-id signatures, called in length groups."""

  def __init__(self, signature, label_names: Sequence[str],
               call_rows: int = CALL_ROWS, shortest: int = SHORTEST,
               threads: int = 0):
    super().__init__(label_names, call_rows, threads)
    signatures = signature.loaded_object.signatures
    self._tokenize = signatures[serving.TOKENIZE]
    self._classify = signatures[serving.CLASSIFY_TOKEN_IDS]
    # Keep the loaded object alive as long as its signatures are used.
    self.loaded_object = signature.loaded_object
    self._shortest = shortest

  def compile(self) -> None:
    """Compiles the model part for every cut length, a length a thread:
    left to the first batches, calls of one length would wait on each
    other's compilation. A length that fails to compile raises here."""
    max_len = self._token_ids([b'']).shape[1]
    self.map(self._classify_rows, [
        np.full((self._call_rows, length), transformed.PAD_ID, np.int64)
        for length in bucket_lengths(max_len, self._shortest)])

  def _probabilities(self, text: Sequence[bytes]) -> np.ndarray:
    # A tokenize call runs on one core: a share of the batch on each.
    token_ids = np.concatenate(self.map(self._token_ids, _slices(
        text, -(-len(text) // self.threads))))
    lengths = np.count_nonzero(token_ids != transformed.PAD_ID, axis=1)
    cuts = np.array(bucket_lengths(token_ids.shape[1], self._shortest))
    # Longest first: the one short run is then of the shortest documents.
    order = np.argsort(-lengths, kind='stable')
    runs = _slices(order, self._call_rows)
    calls = [token_ids[rows, :cuts[np.searchsorted(
        cuts, max(lengths[rows[0]], 1))]] for rows in runs]
    probabilities = np.empty((len(text), len(self.label_names)), np.float32)
    for rows, answer in zip(runs, self.map(self._classify_rows, calls)):
      probabilities[rows] = answer
    return probabilities

  def _token_ids(self, text: Sequence[bytes]) -> np.ndarray:
    return self._tokenize(**{serving.TEXT: list(text)})[
        serving.TOKEN_IDS].numpy()

  def _classify_rows(self, token_ids: np.ndarray) -> np.ndarray:
    count = len(token_ids)
    if count < self._call_rows:
      token_ids = np.pad(token_ids, [(0, self._call_rows - count), (0, 0)],
                         constant_values=transformed.PAD_ID)
    outputs = self._classify(**{serving.TOKEN_IDS: token_ids})
    return outputs[serving.PROBABILITIES].numpy()[:count]


class SignatureModel(SmallCalls):
  """An older export's ``serving_default`` behind the same call."""

  def __init__(self, signature, label_names: Sequence[str],
               call_rows: int = CALL_ROWS, threads: int = 0):
    super().__init__(label_names, call_rows, threads)
    self._signature = signature

  def compile(self) -> None:
    """Nothing to compile ahead: the signature is not compiled with XLA."""

  def _probabilities(self, text: Sequence[bytes]) -> np.ndarray:
    return np.concatenate(self.map(self._call, _slices(text,
                                                       self._call_rows)))

  def _call(self, text: Sequence[bytes]) -> np.ndarray:
    return self._signature(**{serving.TEXT: list(text)})[
        serving.PROBABILITIES].numpy()


def load(export_dir: str, threads: int = 0,
         metadata: Optional[exports.ExportMetadata] = None
         ) -> Tuple[SmallCalls, exports.ExportMetadata]:
  """The export's model, compiled for every length it will be called with:
  length-grouped where the export allows, else its ``serving_default`` in
  small calls; and the export's metadata (``metadata``, where the caller
  has it already: ``exports.load``). Raises ExportError."""
  signature, metadata = exports.load(export_dir, metadata)
  if supports(signature):
    model = LengthGroupedModel(signature, metadata.label_names,
                               threads=threads)
  else:
    logging.info('%s predates the token-id signatures; every document is '
                 'padded to max_len', export_dir)
    model = SignatureModel(signature, metadata.label_names,
                           threads=threads)
  try:
    model.compile()
  except Exception as error:  # pylint: disable=broad-except
    raise exports.ExportError(
        f'cannot compile the model in {export_dir}: {error}') from error
  return model, metadata
