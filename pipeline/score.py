"""The scoring job: any corpus -> the exported model -> Parquet.

    python -m pipeline.score --input=GLOB --model_dir=DIR --output_dir=DIR
        [--partition=dt=2026-11-21] [--keep_fields=a,b] [flags]
        [any Beam pipeline option]

Reads any format of ``pipeline.readers``, scores every document with the
trainer's raw-text SavedModel through Beam's RunInference, and writes one
Parquet row a document (``schemas.scored``), bad documents to ``rejected/``,
and a ``manifest.json`` and ``_SUCCESS`` once the output is complete. With
``--partition`` the output is ``output_dir/<partition>/``, replaced whole by a
rerun, so the same command can run every night.
"""
import argparse
import datetime
import logging
import posixpath
import re
import time
from typing import Dict, Iterable, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference import base as inference
from apache_beam.metrics.metric import MetricsFilter
import pyarrow as pa

from pipeline import jobs
from pipeline import kept_fields
from pipeline import outputs
from pipeline import readers
from pipeline import records
from schemas import raw
from schemas import rejected
from schemas import scored
from trainer import export

_NAMESPACE = 'score'
_CODECS = ('zstd', 'snappy', 'gzip', 'none')
# One writer buffers this much before it writes a row group: row groups of
# tens of MB read well in DuckDB, Spark and BigQuery without making every
# worker hold a large buffer.
_ROW_GROUP_BYTES = 32 << 20


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  readers.add_reader_arguments(parser)
  parser.add_argument('--model_dir', required=True,
                      help='The trainer\'s model folder (its newest export '
                      'is used) or one export version folder.')
  parser.add_argument('--output_dir', required=True)
  parser.add_argument('--partition', default=None,
                      help='Sub-folder of output_dir for this run, e.g. '
                      'dt=2026-11-21; a rerun replaces it whole.')
  parser.add_argument('--keep_fields', default='',
                      help='Comma-separated input fields copied to each '
                      'output row with their types.')
  parser.add_argument('--batch_size', type=int, default=256,
                      help='Documents per model call.')
  parser.add_argument('--parquet_codec', choices=_CODECS, default='zstd')
  return parser.parse_known_args(argv)


def check_partition(partition: str) -> str:
  """The partition as a relative path; ValueError when it is not a safe one."""
  segments = partition.strip('/').split('/')
  for segment in segments:
    if (not segment or segment in ('.', '..') or segment[0] in '._' or
        re.search(r'[*?\[\]\\]', segment)):
      raise ValueError(
          f'bad --partition {partition!r}: use folder names such as '
          'dt=2026-11-21 (no wildcards, none starting with . or _)')
  return '/'.join(segments)


# --------------------------------------------------------------------------
# The model behind RunInference


# The model's answer for one document, as PredictionResult.inference: a
# plain dict, since elements crossing processes must unpickle anywhere.
_LABEL, _CONFIDENCE, _PROBABILITIES, _SCORED_AT = (
    'label', 'confidence', 'probabilities', 'scored_at')


class RawTextModelHandler(inference.ModelHandler):
  """Beam's access to our export: raw records in, label and scores out.

  RunInference loads the model once per worker process and shares it
  between the process's threads; batches are formed by Beam's BatchElements
  with the sizes given here. Every document costs the same in the model
  whatever its length (the transform graph pads or truncates it to the
  trained length), so batches are sized by count alone.
  """

  def __init__(self, export_dir: str, batch_size: int):
    super().__init__(min_batch_size=batch_size, max_batch_size=batch_size)
    self._export_dir = export_dir

  def load_model(self):
    signature, _ = export.load(self._export_dir)
    return signature

  def run_inference(self, batch: Sequence[Dict], model,
                    inference_args: Optional[Dict] = None
                    ) -> Iterable[inference.PredictionResult]:
    outputs = model(text=[r[raw.TEXT].encode('utf-8') for r in batch])
    scored_at = datetime.datetime.now(datetime.timezone.utc)
    labels = outputs[export.LABEL].numpy()
    confidences = outputs[export.CONFIDENCE].numpy().tolist()
    probabilities = outputs[export.PROBABILITIES].numpy().tolist()
    return [
        inference.PredictionResult(record, {
            _LABEL: labels[i].decode('utf-8'),
            _CONFIDENCE: confidences[i],
            _PROBABILITIES: probabilities[i],
            _SCORED_AT: scored_at,
        }) for i, record in enumerate(batch)
    ]

  def get_num_bytes(self, batch: Sequence[Dict]) -> int:
    # The default pickles the whole batch just to measure it.
    return sum(len(r[raw.TEXT]) for r in batch)

  def get_metrics_namespace(self) -> str:
    return _NAMESPACE


# --------------------------------------------------------------------------
# The steps around it


class Validate(records.CountingDoFn):
  """Counts every record read; bad ones go to the dead letters."""

  def __init__(self, max_text_bytes: int, kept: pa.Schema):
    super().__init__(_NAMESPACE)
    self._max_text_bytes = max_text_bytes
    self._kept_types = [(field.name, field.type) for field in kept]

  def process(self, record):
    self._counts[('read',)] += 1
    reason = records.check_record(record, self._max_text_bytes,
                                  require_label=False)
    if not reason and not all(
        kept_fields.conforms(record[raw.KEPT][name], arrow_type)
        for name, arrow_type in self._kept_types):
      reason = rejected.WRONG_TYPE
    if reason:
      yield self.reject(record, reason)
    else:
      yield record


class ToRows(records.CountingDoFn):
  """Prediction results -> rows of the Parquet schema."""

  def __init__(self, label_names, model_version: int, kept: pa.Schema):
    super().__init__(_NAMESPACE)
    self._columns = scored.probability_columns(label_names)
    self._model_version = model_version
    self._kept_names = kept.names

  def process(self, result: inference.PredictionResult):
    self._counts[('scored',)] += 1
    record, scores = result.example, result.inference
    row = {
        scored.ID: record[raw.ID],
        scored.LABEL: scores[_LABEL],
        scored.CONFIDENCE: scores[_CONFIDENCE],
        scored.MODEL_VERSION: self._model_version,
        scored.SCORED_AT: scores[_SCORED_AT],
    }
    row.update(zip(self._columns, scores[_PROBABILITIES]))
    for name in self._kept_names:
      row[name] = record[raw.KEPT][name]
    yield row


class RejectFailedBatches(records.CountingDoFn):
  """A batch the model raised on: each of its documents is a dead letter."""

  def __init__(self):
    super().__init__(_NAMESPACE)

  def process(self, failed):
    batch, _ = failed
    for record in batch:
      yield self.reject(record, rejected.INFERENCE_FAILED)


def build_pipeline(pipeline, pattern: str, config: readers.ReadConfig,
                   export_dir: str, metadata: Dict, kept: pa.Schema,
                   batch_size: int, codec: str, staging: str):
  """Adds the scoring steps to ``pipeline``, writing under ``staging``."""
  checked = (pipeline
             | 'Read' >> readers.ReadRecords(pattern, config)
             | 'Validate' >> beam.ParDo(Validate(
                 config.max_text_bytes, kept)).with_outputs(
                     records.REJECTED, records.STATS, main='documents'))
  results, failures = (
      checked.documents
      | 'RunInference' >> inference.RunInference(
          RawTextModelHandler(export_dir, batch_size)).with_exception_handling())
  rows = results | 'ToRows' >> beam.ParDo(ToRows(
      metadata['label_names'], metadata['version'], kept)).with_outputs(
          records.STATS, main='rows')
  failed = failures.failed_inferences | 'RejectFailed' >> beam.ParDo(
      RejectFailedBatches()).with_outputs(records.REJECTED, records.STATS)

  _ = rows.rows | 'WriteParquet' >> beam.io.WriteToParquet(
      posixpath.join(staging, scored.FILE_PREFIX),
      schema=scored.arrow_schema(metadata['label_names'], kept),
      codec=codec,
      row_group_buffer_size=_ROW_GROUP_BYTES,
      file_name_suffix=scored.FILE_SUFFIX)
  _ = ((checked[records.REJECTED], failed[records.REJECTED])
       | 'AllRejected' >> beam.Flatten()
       | 'Rejected' >> records.WriteDeadLetters(
           posixpath.join(staging, rejected.DIR)))
  _ = ((checked[records.STATS], rows[records.STATS], failed[records.STATS])
       | 'AllCounts' >> beam.Flatten()
       | 'Counts' >> records.WriteCounts(staging))


def _inference_metrics(result) -> Dict:
  """Documents, batches and model time, as RunInference counted them."""
  try:
    queried = result.metrics().query(MetricsFilter().with_namespace(_NAMESPACE))
  except Exception:  # pylint: disable=broad-except
    return {}  # a runner without metrics support
  found = {}
  for distribution in queried['distributions']:
    name = distribution.key.metric.name
    if name.endswith('inference_batch_latency_micro_secs'):
      found['batches'] = distribution.committed.count
      found['inference_seconds'] = distribution.committed.sum / 1e6
  return found


def _utc_now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds')


def run(argv=None):
  args, pipeline_args = parse_args(argv)
  started, started_at = time.time(), _utc_now()
  keep_fields = tuple(f.strip() for f in args.keep_fields.split(',')
                      if f.strip())
  try:
    if args.batch_size < 1:
      raise ValueError('--batch_size must be at least 1')
    final_dir = args.output_dir.rstrip('/')
    if args.partition:
      final_dir = posixpath.join(final_dir, check_partition(args.partition))
    pattern, fmt = readers.resolve_input(args.input, args.format)
    config = readers.read_config_from_args(
        args, format=fmt, label_field=None, keep_fields=keep_fields)
    kept = kept_fields.schema(pattern, config)
    export_dir = export.resolve(args.model_dir)
    _, metadata = export.load(export_dir)
    scored.arrow_schema(metadata['label_names'], kept)
  except (readers.ReaderError, export.ExportError, ValueError) as error:
    raise jobs.JobError(str(error)) from error

  output = jobs.stage_output(final_dir, pattern)
  staging = output.staging_dir

  try:
    options = jobs.pipeline_options(pipeline_args)
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, pattern, config, export_dir, metadata, kept,
                   args.batch_size, args.parquet_codec, staging)
    result = pipeline.run()
    result.wait_until_finish()
    counts = records.pop_counts(staging)
    read = counts['read'].get((), 0)
    written = counts['scored'].get((), 0)
    rejected_by_reason = {k[0]: v for k, v in sorted(
        counts['rejected'].items())}
    if read != written + sum(rejected_by_reason.values()):
      raise jobs.JobError(f'counts do not reconcile: read {read}, scored '
                          f'{written}, rejected {rejected_by_reason}')
    files = sorted(posixpath.relpath(m.path, staging) for m in FileSystems.match(
        [posixpath.join(staging, '*' + scored.FILE_SUFFIX)])[0].metadata_list)
    manifest = {
        'input': args.input,
        'model_dir': export_dir,
        'model_version': metadata['version'],
        'label_names': metadata['label_names'],
        'partition': args.partition,
        'counts': {
            'read': read,
            'scored': written,
            'rejected': sum(rejected_by_reason.values()),
            'rejected_by_reason': rejected_by_reason,
        },
        'inference': _inference_metrics(result),
        'files': files,
        'started_at': started_at,
        'finished_at': _utc_now(),
    }
    outputs.write_json(posixpath.join(staging, scored.MANIFEST_FILE), manifest)
    FileSystems.create(
        posixpath.join(staging, outputs.SUCCESS_MARKER)).close()
    output.publish()
  except BaseException:
    output.discard()
    raise

  seconds = time.time() - started
  logging.info(
      'score: read %d documents in %.1f s (%.0f/s) -> scored %d, rejected %d%s;'
      ' model version %s; output %s', read, seconds, read / seconds, written,
      manifest['counts']['rejected'], ''.join(
          f', {n} {reason}' for reason, n in rejected_by_reason.items()),
      metadata['version'], final_dir)
  return manifest


if __name__ == '__main__':
  jobs.main(run)
