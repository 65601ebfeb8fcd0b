"""The scoring job: any corpus -> the exported model -> Parquet.

    python -m pipeline.score --input=GLOB --model_dir=DIR --output_dir=DIR
        [--partition=dt=2026-11-21] [--keep_fields=a,b:column] [flags]
        [any Beam pipeline option]

Reads any format of ``pipeline.readers``, scores every document with the
trainer's raw-text SavedModel (a batch on the model while the next is read),
and writes one Parquet row a document (``schemas.scored``), bad documents to
``_rejected/``, and a ``_manifest.json`` and ``_SUCCESS`` once the output is
complete. With ``--partition`` the output is ``output_dir/<partition>/``,
replaced whole by a rerun, so the same command can run every night.
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from pipeline import quiet  # pylint: disable=unused-import,g-bad-import-order
import argparse
import concurrent.futures
import dataclasses
import datetime
import logging
import operator
import posixpath
import re
import time
from typing import Dict, List, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.utils.windowed_value import WindowedValue
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import cli
from pipeline import drift
from pipeline import jobs
from pipeline import kept_fields
from pipeline import length_groups
from pipeline import outputs
from pipeline import readers
from pipeline import records
from schemas import raw
from schemas import rejected
from schemas import scored
from schemas import serving
from trainer import export

_NAMESPACE = 'score'
# The Tally names of the partition's predicted labels and confidence bins.
_SCORED = 'scored'
_CONFIDENCE = 'confidence'
# The key of the answer ScoreBatches gives a document the model raised on:
# the error, instead of scores.
FAILED = 'failed'
# The Beam distribution of the model's time a batch, in microseconds (the
# name RunInference gives its own).
BATCH_LATENCY = 'inference_batch_latency_micro_secs'
_CODECS = ('zstd', 'snappy', 'gzip', 'none')
# One writer buffers this much before it writes a row group: row groups of
# tens of MB read well in DuckDB, Spark and BigQuery without making every
# worker hold a large buffer.
_ROW_GROUP_BYTES = 32 << 20


def parse_args(argv):
  # @FILE reads flags from a file, one a line, as the other jobs do.
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                   fromfile_prefix_chars='@')
  readers.add_reader_arguments(parser)
  parser.add_argument('--model_dir', required=True,
                      help='The trainer\'s model folder (its newest export '
                      'is used) or one export version folder.')
  parser.add_argument('--output_dir', required=True)
  parser.add_argument('--partition', default=None,
                      help='Sub-folder of output_dir for this run, e.g. '
                      'dt=2026-11-21; a rerun replaces it whole.')
  parser.add_argument('--overwrite', action='store_true',
                      help='Replace the output folder even if this job did '
                      'not write it, or it holds other partitions.')
  parser.add_argument('--keep_fields', default='',
                      help='Comma-separated input fields copied to each '
                      'output row with their types; field:column names the '
                      'column, e.g. label:true_label.')
  # More documents a batch make the runs of similar lengths longer, at the
  # cost of holding more of them.
  parser.add_argument('--batch_size', type=int, default=2048,
                      help='Documents handed to the model together: sorted '
                      'by length into model calls of '
                      f'{length_groups.CALL_ROWS} (pipeline/length_groups.py).')
  parser.add_argument('--parquet_codec', choices=_CODECS, default='zstd')
  return parser.parse_known_args(argv)


def check_partition(partition: str) -> str:
  """The partition as a relative path; ValueError when it is not a safe one:
  empty (which would be the whole output), leaving the output, hidden from
  readers, unprintable, or named like the files of a partition."""
  segments = partition.strip('/').split('/')
  for segment in segments:
    if (segment in ('', '.', '..') or segment[0] in '._' or
        segment.startswith(scored.FILE_PREFIX + '-') or
        not segment.isprintable() or re.search(r'[\s*?\[\]\\]', segment)):
      raise ValueError(
          f'bad --partition {partition!r}: use folder names such as '
          'dt=2026-11-21 (no spaces or wildcards, none starting with . or _ '
          f'or {scored.FILE_PREFIX}-)')
  return '/'.join(segments)


# Kept fields: (input field, output column) pairs.
KeptColumns = Tuple[Tuple[str, str], ...]
# The column suggested for a kept field that clashes with an output column.
_RENAMES = {scored.LABEL: 'true_label'}


def parse_keep_fields(spec: str) -> KeptColumns:
  """``--keep_fields`` as (input field, output column) pairs: ``field`` keeps
  a field under its name, ``field:column`` under another; ValueError when an
  item or the columns are malformed."""
  pairs = []
  for item in filter(None, (item.strip() for item in spec.split(','))):
    field, colon, column = (part.strip() for part in item.partition(':'))
    if not field or (colon and not column):
      raise ValueError(f'bad --keep_fields item {item!r}: use field or '
                       'field:column')
    pairs.append((field, column or field))
  columns = [column for _, column in pairs]
  doubled = sorted({column for column in columns if columns.count(column) > 1})
  if doubled:
    raise ValueError(f'--keep_fields: two kept fields named {doubled[0]!r}')
  return tuple(pairs)


def check_kept_columns(kept: KeptColumns, label_names) -> None:
  """ValueError, suggesting a rename, for a kept field that would take the
  name of a column the job writes."""
  taken = set(scored.output_columns(label_names))
  for field, column in kept:
    if column in taken:
      rename = _RENAMES.get(column, f'input_{column}')
      raise ValueError(
          f'kept field {column!r} has the name of an output column; keep it '
          f'under another name: use --keep_fields={field}:{rename}')


# --------------------------------------------------------------------------
# The model


class ScoreBatches(beam.DoFn):
  """Batches of records -> a (record, scores) pair a record, one batch in
  flight.

  Beam's RunInference calls the model and waits for it: while the model
  computes, nothing is read, checked or written, and while that runs, the
  model waits. Here the model gets each batch on a thread of its own, and
  the previous batch's answers go on to be written meanwhile; the next batch
  is read while the model computes (on IMDB, 100,000 documents scored
  10 % faster). The model is loaded once per process
  (``length_groups.load``) and shared by the process's DoFn instances.

  ``scores`` holds the model's outputs for the record (keyed by the
  signature's output names, and the batch's time), or, for a record the
  model raised on, ``{FAILED: the error}``.
  """

  def __init__(self, export_dir: str):
    self._export_dir = export_dir

  def load_model(self):
    model, _ = length_groups.load(self._export_dir)
    model.compile_ahead()
    return model

  def setup(self):
    self._model = self.load_model()
    self._latency = Metrics.distribution(_NAMESPACE, BATCH_LATENCY)
    self._scorer = concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix='score-batch')

  def start_bundle(self):
    self._in_flight = None

  def process(self, batch, window=beam.DoFn.WindowParam,
              timestamp=beam.DoFn.TimestampParam):
    submitted = self._scorer.submit(self._timed_score, batch), timestamp, window
    if self._in_flight:
      yield from self._answers(*self._in_flight)
    self._in_flight = submitted

  def finish_bundle(self):
    if self._in_flight:
      yield from self._answers(*self._in_flight)
      self._in_flight = None

  def teardown(self):
    self._scorer.shutdown()

  def _answers(self, future, timestamp, window):
    answers, micros = future.result()
    self._latency.update(micros)
    # Each with the window and time of its own batch: the previous batch's
    # answers are yielded while the next one is processed, or at the
    # bundle's end.
    for answer in answers:
      yield WindowedValue(answer, timestamp, (window,))

  def _timed_score(self, batch):
    started = time.perf_counter()
    answers = self.score(batch)
    return answers, round((time.perf_counter() - started) * 1e6)

  def score(self, batch: Sequence[Dict]) -> List[Tuple[Dict, Dict]]:
    """Scores ``batch``. When the model raises on it, its halves are scored
    the same way, down to single documents: only a document the model
    raises on alone is answered with ``FAILED``, for ToRows to reject."""
    try:
      return self._score(batch)
    except Exception as error:  # pylint: disable=broad-except
      if len(batch) == 1:
        logging.warning('score: the model raised on document %r: %s',
                        batch[0][raw.ID], error)
        return [(batch[0], {FAILED: str(error)})]
    middle = len(batch) // 2
    return self.score(batch[:middle]) + self.score(batch[middle:])

  def _score(self, batch: Sequence[Dict]) -> List[Tuple[Dict, Dict]]:
    outputs = self._model([r[raw.TEXT].encode('utf-8') for r in batch])
    scored_at = datetime.datetime.now(datetime.timezone.utc)
    labels = outputs[serving.LABEL]
    confidences = outputs[serving.CONFIDENCE].tolist()
    probabilities = outputs[serving.PROBABILITIES].tolist()
    # Plain dicts keyed by the signature's output names (and the batch's
    # time): elements crossing processes must unpickle anywhere.
    return [(record, {
        serving.LABEL: labels[i].decode('utf-8'),
        serving.CONFIDENCE: confidences[i],
        serving.PROBABILITIES: probabilities[i],
        scored.SCORED_AT: scored_at,
    }) for i, record in enumerate(batch)]


class ScoreDocuments(beam.PTransform):
  """Records -> (record, scores) pairs, in batches of ``batch_size``."""

  def __init__(self, export_dir: str, batch_size: int):
    super().__init__()
    self._export_dir = export_dir
    self._batch_size = batch_size

  def expand(self, documents):
    return (documents
            | 'Batch' >> beam.BatchElements(min_batch_size=self._batch_size,
                                            max_batch_size=self._batch_size)
            | 'Model' >> beam.ParDo(ScoreBatches(self._export_dir)))


# --------------------------------------------------------------------------
# The steps around it


class Validate(records.CountingDoFn):
  """Counts every record read; bad ones go to the dead letters."""

  def __init__(self, max_text_bytes: int, kept_types):
    super().__init__(_NAMESPACE)
    self._max_text_bytes = max_text_bytes
    self._kept_types = kept_types  # (input field, Arrow type) pairs

  def process(self, record):
    self.count_read()
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
  """Prediction results -> rows of the Parquet schema; a document the model
  failed on -> a dead letter."""

  def __init__(self, label_names, model_version: int, kept: KeptColumns,
               confidence_edges):
    super().__init__(_NAMESPACE)
    self._columns = scored.probability_columns(label_names)
    self._model_version = model_version
    self._kept = kept
    self._edges = confidence_edges

  def process(self, answer: Tuple[Dict, Dict]):
    record, scores = answer
    if FAILED in scores:
      yield self.reject(record, rejected.INFERENCE_FAILED)
      return
    self.count_written()
    self.count_label(_SCORED, scores[serving.LABEL])
    self.count_bin(_CONFIDENCE, drift.confidence_bin(
        scores[serving.CONFIDENCE], self._edges))
    row = {
        scored.ID: record[raw.ID],
        scored.LABEL: scores[serving.LABEL],
        scored.CONFIDENCE: scores[serving.CONFIDENCE],
        scored.MODEL_VERSION: self._model_version,
        scored.SCORED_AT: scores[scored.SCORED_AT],
    }
    row.update(zip(self._columns, scores[serving.PROBABILITIES]))
    for field, column in self._kept:
      row[column] = record[raw.KEPT][field]
    yield row


@dataclasses.dataclass(frozen=True)
class Settings:
  """The job's checked flags and what they lead to."""
  output_dir: str
  partition: str         # '' for none
  pattern: str
  read_config: readers.ReadConfig
  kept: KeptColumns      # --keep_fields
  kept_schema: pa.Schema  # their output columns, with the input's types
  export_dir: str
  metadata: Dict         # the export's metadata.json
  batch_size: int
  codec: str

  @property
  def label_names(self):
    return self.metadata['label_names']

  @property
  def confidence_edges(self):
    """The reference's confidence bins, the default ones without it."""
    reference = self.metadata.get(drift.REFERENCE)
    return (reference['confidence_histogram']['edges'] if reference
            else drift.CONFIDENCE_EDGES)

  @property
  def kept_types(self):
    """(input field, Arrow type) of each kept field."""
    return [(field, arrow_field.type) for (field, _), arrow_field in zip(
        self.kept, self.kept_schema)]


def settings_from_args(args) -> Settings:
  """The flags checked and the model loaded before anything runs; a
  JobError names what is wrong."""
  try:
    if args.batch_size < 1:
      raise ValueError('--batch_size must be at least 1')
    partition = ('' if args.partition is None else
                 check_partition(args.partition))
    kept = parse_keep_fields(args.keep_fields)
    pattern, fmt = readers.resolve_input(args.input, args.format)
    config = readers.read_config_from_args(
        args, format=fmt, label_field=None,
        keep_fields=tuple(dict.fromkeys(field for field, _ in kept)))
    export_dir = export.resolve(args.model_dir)
    _, metadata = length_groups.load(export_dir)  # fails early on a bad one
    check_kept_columns(kept, metadata['label_names'])
    by_field = kept_fields.schema(pattern, config)
    kept_schema = pa.schema([by_field.field(field).with_name(column)
                             for field, column in kept])
    # Fails here, before the pipeline, on labels that would give clashing
    # Parquet columns.
    scored.arrow_schema(metadata['label_names'], kept_schema)
  except (ValueError, export.ExportError) as error:  # ReaderError is one
    raise cli.JobError(str(error)) from error
  return Settings(args.output_dir, partition, pattern, config, kept,
                  kept_schema, export_dir, metadata, args.batch_size,
                  args.parquet_codec)


def build_pipeline(pipeline, settings: Settings, staging: str):
  """Adds the scoring steps to ``pipeline``, writing under ``staging``."""
  read = pipeline | 'Read' >> readers.ReadRecords(settings.pattern,
                                                 settings.read_config)
  duplicates = (read
                | 'Ids' >> beam.Map(operator.itemgetter(raw.ID))
                | 'Duplicates' >> records.CountDuplicateIds())
  checked = (read
             | 'Validate' >> beam.ParDo(Validate(
                 settings.read_config.max_text_bytes,
                 settings.kept_types)).with_outputs(
                     records.REJECTED, records.STATS, main='documents'))
  answers = checked.documents | 'Score' >> ScoreDocuments(
      settings.export_dir, settings.batch_size)
  rows = answers | 'ToRows' >> beam.ParDo(ToRows(
      settings.label_names, settings.metadata['version'], settings.kept,
      settings.confidence_edges)).with_outputs(
          records.REJECTED, records.STATS, main='rows')

  _ = rows.rows | 'WriteParquet' >> beam.io.WriteToParquet(
      posixpath.join(staging, scored.FILE_PREFIX),
      schema=scored.arrow_schema(settings.label_names, settings.kept_schema),
      codec=settings.codec,
      row_group_buffer_size=_ROW_GROUP_BYTES,
      file_name_suffix=scored.FILE_SUFFIX)
  _ = ((checked[records.REJECTED], rows[records.REJECTED])
       | 'AllRejected' >> beam.Flatten()
       | 'Rejected' >> records.WriteDeadLetters(
           posixpath.join(staging, rejected.DIR)))
  _ = ((checked[records.STATS], rows[records.STATS], duplicates)
       | 'AllCounts' >> beam.Flatten()
       | 'Counts' >> records.WriteCounts(staging))


def _inference_metrics(result) -> Dict:
  """Batches and model time, as ScoreBatches counted them."""
  try:
    queried = result.metrics().query(MetricsFilter().with_namespace(_NAMESPACE))
  except Exception:  # pylint: disable=broad-except
    return {}  # a runner without metrics support
  found = {}
  for distribution in queried['distributions']:
    name = distribution.key.metric.name
    if name == BATCH_LATENCY:
      found['batches'] = distribution.committed.count
      found['inference_seconds'] = distribution.committed.sum / 1e6
  return found


def partition_drift(settings: Settings, tally: records.Tally) -> Dict:
  """The partition's label shares and confidence histogram against the
  export's reference (``pipeline.drift``)."""
  current = drift.distribution(
      settings.label_names, tally.labels.get(_SCORED, {}),
      tally.bins.get(_CONFIDENCE, {}), settings.confidence_edges)
  return drift.compare(current, settings.metadata.get(drift.REFERENCE))


def write_drift_report(staging: str, drift_section: Dict) -> None:
  """``_report.png`` where matplotlib is installed (on the launcher: the
  workers need no plotting); a warning when the drift alert is raised."""
  if drift_section['alert']:
    logging.warning(
        'score: predictions drifted from the test split: PSI %.3f on label '
        'shares, %.3f on confidence (alert over %.1f)',
        drift_section['psi']['labels'], drift_section['psi']['confidence'],
        drift.PSI_ALERT)
  image = drift.plot(drift_section)
  if image:
    with FileSystems.create(posixpath.join(staging, scored.REPORT_FILE),
                            mime_type='image/png') as handle:
      handle.write(image)


def _utc_now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds')


def manifest(args, settings: Settings, tally: records.Tally, result,
             staging: str, started_at: str) -> Dict:
  """What a reader of the partition needs to trust it, in _manifest.json."""
  files = sorted(posixpath.relpath(m.path, staging) for m in FileSystems.match(
      [posixpath.join(staging, scored.FILE_PATTERN)])[0].metadata_list)
  return {
      'input': args.input,
      'model_dir': settings.export_dir,
      'model_version': settings.metadata['version'],
      'label_names': settings.label_names,
      'partition': args.partition,
      'counts': {
          'read': tally.read,
          'scored': tally.total_written,
          'rejected': tally.rejected,
          'rejected_by_reason': tally.rejected_by_reason,
          'duplicate_ids': tally.duplicate_ids,
          'duplicate_rows': tally.duplicate_rows,
      },
      'inference': _inference_metrics(result),
      'drift': partition_drift(settings, tally),
      'files': files,
      'started_at': started_at,
      'finished_at': _utc_now(),
  }


def check_row_count(staging: str, files: Sequence[str], scored_count: int):
  """Fails unless the Parquet files to publish hold as many rows as the
  pipeline scored: a file a runner lost or left behind would otherwise be
  published as data. Reads only the files' footers."""
  rows = 0
  for name in files:
    with FileSystems.open(posixpath.join(staging, name)) as handle:
      rows += pq.read_metadata(handle).num_rows
  if rows != scored_count:
    raise cli.JobError(
        f'the Parquet files to publish hold {rows} rows but the pipeline '
        f'counted {scored_count} scored')


# Everything a partition holds; anything else staged is not published, and
# no file of it may match the input pattern.
LAYOUT = outputs.Layout(
    contents=(scored.FILE_PATTERN, rejected.FILE_PATTERN,
              scored.MANIFEST_FILE, scored.REPORT_FILE,
              outputs.SUCCESS_MARKER),
    markers=(outputs.SUCCESS_MARKER, scored.MANIFEST_FILE))


def log_summary(written: Dict, seconds: float, final_dir: str) -> None:
  """One line for the run; a warning when the input repeats ids."""
  counts = written['counts']
  duplicates = (f'; {counts["duplicate_ids"]} duplicate ids '
                f'({counts["duplicate_rows"]} records beyond their first)'
                if counts['duplicate_ids'] else '')
  logging.log(
      logging.WARNING if duplicates else logging.INFO,
      'score: read %d documents in %.1f s (%.0f/s) -> scored %d, rejected %d%s'
      '%s; model version %s; output %s', counts['read'], seconds,
      counts['read'] / seconds, counts['scored'], counts['rejected'], ''.join(
          f', {n} {reason}'
          for reason, n in counts['rejected_by_reason'].items()), duplicates,
      written['model_version'], final_dir)


def run(argv=None):
  args, pipeline_args = parse_args(argv)
  started, started_at = time.time(), _utc_now()
  jobs.configure_filesystems(pipeline_args)
  settings = settings_from_args(args)
  with outputs.StagedOutput(
      settings.output_dir, settings.pattern, partition=settings.partition,
      layout=LAYOUT, overwrite=args.overwrite) as output:
    staging = output.staging_dir
    result = jobs.run_pipeline(pipeline_args, lambda pipeline: build_pipeline(
        pipeline, settings, staging))
    tally = records.pop_tally(staging)
    tally.reconcile()
    written = manifest(args, settings, tally, result, staging, started_at)
    check_row_count(staging, written['files'], tally.total_written)
    outputs.write_json(posixpath.join(staging, scored.MANIFEST_FILE), written)
    write_drift_report(staging, written['drift'])
    outputs.mark_finished(staging)
    output.publish()
  log_summary(written, time.time() - started, output.final_dir)
  tally.check_complete(settings.read_config.allow_corrupt_files)
  return written


if __name__ == '__main__':
  cli.main(run)
