"""The export's ``serving_default``, computed in small calls grouped by length.

Two things make the plain signature slow on a CPU. The transform graph pads
every document to ``max_len``, and the model spends as much on the padding
as on the tokens. And a call of hundreds of rows makes activations (the
attention's ``[rows, heads, length, length]`` scores above all) too large
for the processor's caches: on IMDB, calls of 16 rows take a third of the
CPU time per document that calls of 256 take.

So ``LengthGroupedModel`` tokenizes a batch, sorts the
documents by token count, and calls the model on runs of ``CALL_ROWS``
neighbours cut to the longest of them, rounded up to one of a few lengths
(``bucket_lengths``). The model masks padding, so a document's prediction
does not depend on where its batch is cut. The model part is compiled with
XLA once for each of those lengths; every call has ``CALL_ROWS`` rows (the
batch's one short run is filled with padding rows), so no other shape is
ever compiled. The calls run on a thread per core: TensorFlow releases the
GIL, and one small call rarely keeps two cores busy.

Exports made before the two signatures this needs (``schemas.serving``) are
served by their ``serving_default``, in calls of ``CALL_ROWS`` as well.
"""
import concurrent.futures
import logging
import os
import threading
from typing import Callable, Dict, List, Sequence

import numpy as np

from schemas import serving
from schemas import transformed
from trainer import export

# Rows of one model call (see above): measured on IMDB, 16 and 32 rows score
# the seed model equally fast, 16 the best (hybrid) model 13-40 % faster.
CALL_ROWS = 16
# The shortest cut: below it, XLA compilations cost more than they save.
# Measured on IMDB: calls of 16 rows cut to 32-64 tokens take 1-4 ms
# whatever the cut, each cut costs a compilation of 0.5-1.5 s in every
# worker process, and 5 % of the documents are that short.
SHORTEST = 64
# Cuts per doubling of the length: a call is then padded by at most a
# quarter of its longest document; more cuts mean more XLA compilations
# (about a second each) at a worker's start.
CUTS_PER_OCTAVE = 4
# LLVM's lighter optimisation compiles each length ~40 % faster and the
# calls run as fast (measured on IMDB). Read when XLA first compiles, so it
# is set on import, which workers do when they unpickle the scoring job's
# model handler; a user's own XLA_FLAGS win.
os.environ.setdefault('XLA_FLAGS', '--xla_backend_optimization_level=1')

Outputs = Dict[str, np.ndarray]


def supports(signature) -> bool:
  """Whether the export behind ``signature`` (from ``trainer.export.load``)
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


class _SmallCalls:
  """A model called in calls of ``call_rows`` documents on a thread per
  core; answers as ``serving_default``'s outputs, numpy arrays."""

  def __init__(self, label_names: Sequence[str], call_rows: int,
               threads: int):
    self._label_names = np.array([name.encode('utf-8')
                                  for name in label_names], dtype=object)
    self._call_rows = call_rows
    self.threads = threads or os.cpu_count() or 1
    self._pool = concurrent.futures.ThreadPoolExecutor(
        self.threads, thread_name_prefix='model-call')

  def compile_ahead(self) -> None:
    """Starts whatever compiling the first batch would wait for."""

  def map(self, call: Callable, arguments: Sequence) -> List:
    """``call`` on each argument on the threads, answers in order."""
    if len(arguments) == 1:  # no thread hop for a batch of one call
      return [call(arguments[0])]
    return list(self._pool.map(call, arguments))

  def outputs(self, probabilities: np.ndarray) -> Outputs:
    label_ids = np.argmax(probabilities, axis=-1)
    return {
        serving.LABEL: self._label_names[label_ids],
        serving.LABEL_ID: label_ids,
        serving.CONFIDENCE: np.max(probabilities, axis=-1),
        serving.PROBABILITIES: probabilities,
    }


class LengthGroupedModel(_SmallCalls):
  """Called as the export's ``serving_default`` is (raw text in, the same
  outputs out, as numpy arrays), for any batch size."""

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
    self._compiling = False

  def compile_ahead(self) -> None:
    """Starts compiling the model part for every cut length, a length a
    thread at a time: left to the first batch, calls of one length would
    wait on each other's compilation. The batch then queues behind them.
    Once per model, however many DoFn instances share it."""
    if self._compiling:
      return
    self._compiling = True
    max_len = self._token_ids([b'']).shape[1]
    for length in bucket_lengths(max_len, self._shortest):
      self._pool.submit(self._classify_rows, np.full(
          (self._call_rows, length), transformed.PAD_ID, np.int64))

  def __call__(self, text: Sequence[bytes]) -> Outputs:
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
    probabilities = np.empty((len(text), len(self._label_names)), np.float32)
    for rows, answer in zip(runs, self.map(self._classify_rows, calls)):
      probabilities[rows] = answer
    return self.outputs(probabilities)

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


class SignatureModel(_SmallCalls):
  """An older export's ``serving_default`` behind the same call."""

  def __init__(self, signature, label_names: Sequence[str],
               call_rows: int = CALL_ROWS, threads: int = 0):
    super().__init__(label_names, call_rows, threads)
    self._signature = signature

  def __call__(self, text: Sequence[bytes]) -> Outputs:
    return self.outputs(np.concatenate(self.map(
        self._probabilities, _slices(text, self._call_rows))))

  def _probabilities(self, text: Sequence[bytes]) -> np.ndarray:
    return self._signature(**{serving.TEXT: list(text)})[
        serving.PROBABILITIES].numpy()


# The last model load() gave, by export directory; the lock makes the
# process's threads (a runner's DoFn instances) wait for one load.
_LOADED = {}
_LOADING = threading.Lock()


def load(export_dir: str):
  """The export's model as ``pipeline.score`` calls it: length-grouped where
  the export allows, else its ``serving_default`` in small calls; and the
  export's metadata.

  Loaded once per process: the scoring job's launcher loads the model to
  check it before the pipeline starts, and a runner that works in the
  launcher's process gets the same model.
  """
  with _LOADING:
    if export_dir not in _LOADED:
      signature, metadata = export.load(export_dir)
      if supports(signature):
        model = LengthGroupedModel(signature, metadata['label_names'])
      else:
        logging.info('score: %s predates the token-id signatures; every '
                     'document is padded to max_len', export_dir)
        model = SignatureModel(signature, metadata['label_names'])
      _LOADED.clear()
      _LOADED[export_dir] = model, metadata
    return _LOADED[export_dir]
