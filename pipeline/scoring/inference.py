"""The scoring job's model step: Beam's RunInference with a handler of ours.

``RawTextModelHandler`` is a ``ModelHandler`` of batches of raw records,
each batch one element (the job's ``rows.Validate`` forms them, so that
RunInference skips its own batching, ``should_skip_batching``) and answered
by one ``PredictionResult``, whose inference is the model's answers as
columns (``Answers``): not a Beam element, ``PredictionResult`` and answer
object a document, which cost more than the rest of the job besides the
model and reading (BENCHMARKS.md). RunInference loads the model
once a process through Beam's ``Shared`` handle, reports Beam's standard
inference metrics (``num_inferences``, ``inference_request_batch_size``,
``inference_batch_latency_micro_secs``, ``load_model_latency_milli_secs``,
``model_byte_size``, ``failed_batches_counter``) and follows a model path
given as a side input (``update_model_path``). The model is
``serving.length_groups``': the export's raw-text signature in small
length-grouped XLA calls.

A document the model raises on (a poison document) is isolated by scoring
the halves of its batch, down to single documents: it alone is answered
with its error (``Answers.failed``), and the job rejects it. A model that
fails on more documents of one batch than ``MAX_ISOLATED`` is broken, not
fed a poison document: the batch raises ``ModelFailed`` and the job stops.
That also bounds what bisection costs.
"""
import datetime
import logging
import os
import re
from typing import Any, Dict, Iterable, NamedTuple, Optional, Sequence

from apache_beam.ml.inference import base
import numpy as np

import cli
from schemas import raw
from schemas import serving
from serving import exports
from serving import length_groups

# Documents of one batch the model may fail on alone before the batch, and
# so the job, fails instead.
MAX_ISOLATED = 8
# What a ModelFailed says first, so that the launcher finds it in whatever
# a runner makes of a worker's exception.
MODEL_FAILED = 'the model failed on'


class _WithoutMissingResourceNotice(logging.Filter):
  """Drops Beam's warning that the ``resource`` module is missing, which it
  logs twice a model load where it is not: Beam 2.77 imports ``resource``
  and its ``ModelManager`` (which needs PyTorch) in one ``try``, so without
  PyTorch ``resource`` counts as missing and ``model_byte_size`` stays 0."""

  def filter(self, record):
    return 'Resource module is not available' not in record.getMessage()


# Beam logs it through the root logger.
_BEAM_INFERENCE_LOGGER = logging.getLogger()


class ModelFailed(RuntimeError):
  """The model failed on a whole batch, beyond what a poison document
  explains: raised in a worker, it fails the pipeline."""


class ModelFailure(cli.JobError):
  """The job-level form of ModelFailed: nothing is published."""
  exit_status = cli.EXIT_MODEL_FAILED


# A ModelFailed's message as a runner passes it on, inside its own text.
_MODEL_FAILED_TEXT = re.compile(re.escape(MODEL_FAILED) + r"[^\n\[]*")


def model_failure(error: BaseException) -> Optional[ModelFailure]:
  """The ModelFailure behind a pipeline's exception, however the runner
  wrapped or retold it; None when the model is not what failed."""
  for cause in cli.causes(error):
    match = _MODEL_FAILED_TEXT.search(str(cause))
    if match:
      return ModelFailure(match.group(0).strip())
  return None


def check_model(signature, texts: Sequence[str]) -> None:
  """Before the pipeline: ModelFailure when the export's signature raises on
  each of the input's first acceptable texts, alone as well as together."""
  def fails(batch):
    try:
      signature(**{serving.TEXT: [text.encode('utf-8') for text in batch]})
      return None
    except Exception as error:  # pylint: disable=broad-except
      return error
  if not texts or not fails(texts):
    return
  errors = [fails([text]) for text in texts[:MAX_ISOLATED + 1]]
  if all(errors):
    raise ModelFailure(
        f'{MODEL_FAILED} each of the first {len(errors)} documents of the '
        f'input, so the job did not start: {type(errors[0]).__name__}: '
        f'{errors[0]}')


class Answers(NamedTuple):
  """The model's answers to a batch, as columns: the signature's outputs
  for the documents it scored, in the batch's order, and the error of each
  document it raised on alone, by its index in the batch."""
  labels: np.ndarray  # bytes
  confidences: np.ndarray
  probabilities: np.ndarray  # a row a document, a column a label
  scored_at: datetime.datetime
  failed: Dict[int, str]

  def scored(self, batch: Sequence[Any]) -> Sequence[Any]:
    """The documents of ``batch`` the columns answer."""
    if not self.failed:
      return batch
    return [item for index, item in enumerate(batch)
            if index not in self.failed]


class _Isolation:
  """Scores a batch, bisecting it around the documents the model raises
  on, until more than ``limit`` of them failed alone."""

  def __init__(self, model, limit: int):
    self._model = model
    self._limit = limit
    self._outputs = []  # the model's answers to the parts it scored
    self._failed = {}

  def answers(self, texts: Sequence[bytes]) -> Answers:
    self._score(texts, 0)
    scored_at = datetime.datetime.now(datetime.timezone.utc)
    if not self._outputs:  # every document failed alone
      empty = np.empty(0)
      return Answers(empty, empty, empty, scored_at, self._failed)
    columns = [np.concatenate([outputs[name] for outputs in self._outputs])
               if len(self._outputs) > 1 else self._outputs[0][name]
               for name in (serving.LABEL, serving.CONFIDENCE,
                            serving.PROBABILITIES)]
    return Answers(*columns, scored_at, self._failed)

  def _score(self, texts: Sequence[bytes], start: int) -> None:
    """``texts``, the batch's from index ``start`` on; depth first, so
    that the parts scored stay in the batch's order."""
    try:
      self._outputs.append(self._model(texts))
    except Exception as error:  # pylint: disable=broad-except
      if len(texts) > 1:
        middle = len(texts) // 2
        self._score(texts[:middle], start)
        self._score(texts[middle:], start + middle)
        return
      self._failed[start] = f'{type(error).__name__}: {error}'
      if len(self._failed) > self._limit:
        raise ModelFailed(
            f'{MODEL_FAILED} {len(self._failed)} documents of a batch, each '
            f'alone (more than the {self._limit} a poison document '
            f'explains): {type(error).__name__}: {error}') from error


class RawTextModelHandler(base.ModelHandler[Sequence[Dict],
                                            base.PredictionResult,
                                            length_groups.SmallCalls]):
  """A batch of raw records (``schemas.raw``) in, as one element; one
  PredictionResult out, whose example is the batch and whose inference is
  its ``Answers``."""

  def __init__(self, export_dir: str, threads: int = 0,
               max_isolated: int = MAX_ISOLATED,
               metadata: Optional[exports.ExportMetadata] = None):
    # XLA_FLAGS as Beam sets environment variables for a model: in the
    # worker, before the model loads; a user's own XLA_FLAGS win.
    env_vars = ({} if 'XLA_FLAGS' in os.environ else
                {'XLA_FLAGS': length_groups.XLA_FLAGS})
    super().__init__(env_vars=env_vars)
    self._export_dir = export_dir
    # What the launcher read of the export: a worker does not read it
    # again.
    self._metadata = metadata
    self._threads = threads
    self._max_isolated = max_isolated

  def set_environment_vars(self):
    """Beam calls this in each worker before it loads the model."""
    super().set_environment_vars()
    length_groups.run_ops_on_callers_threads()
    if not any(isinstance(f, _WithoutMissingResourceNotice)
               for f in _BEAM_INFERENCE_LOGGER.filters):
      _BEAM_INFERENCE_LOGGER.addFilter(_WithoutMissingResourceNotice())

  def should_skip_batching(self) -> bool:
    """Elements come batched (what ``with_no_batching`` would say, through
    a wrapper that leaves out ``set_environment_vars`` above)."""
    return True

  def load_model(self) -> length_groups.SmallCalls:
    model, _ = length_groups.load(self._export_dir, self._threads,
                                  self._metadata)
    return model

  def update_model_path(self, model_path: Optional[str] = None):
    """A model folder or export given as a side input (RunInference's
    ``model_metadata_pcoll``): its newest complete blessed version is
    loaded."""
    if model_path:
      self._export_dir = exports.resolve(model_path)
      self._metadata = None

  def run_inference(self, batch: Sequence[Dict], model,
                    inference_args=None) -> Iterable[base.PredictionResult]:
    del inference_args  # the signature takes none
    isolation = _Isolation(model, self._max_isolated)
    answers = isolation.answers([record[raw.TEXT].encode('utf-8')
                                 for record in batch])
    return [base.PredictionResult(batch, answers)]

  def get_num_bytes(self, batch: Sequence[Dict]) -> int:
    """The text's characters: what the model reads (Beam's default pickles
    the whole batch to measure it)."""
    return sum(len(record[raw.TEXT]) for record in batch)

  def __repr__(self):
    # ASCII: Beam encodes it, as RunInference's annotation, in ASCII.
    return f'RawTextModelHandler({ascii(self._export_dir)})'
