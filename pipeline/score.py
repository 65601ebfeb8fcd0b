"""The scoring job: any corpus -> the exported model -> Parquet.

    python -m pipeline.score --input=GLOB --model_dir=DIR --output_dir=DIR
        [--partition=dt=2026-11-21] [--keep_fields=a,b:column] [flags]
        [any Beam pipeline option]

Reads any format of ``pipeline.readers``, scores every document with the
trainer's raw-text SavedModel through Beam's RunInference
(``pipeline.scoring.inference``), and writes one Parquet row a document
(``schemas.scored``), bad documents to ``_rejected/``, and a
``_manifest.json`` and ``_SUCCESS`` once the output is complete. With
``--partition`` the output is ``output_dir/<partition>/``, replaced whole by
a rerun, so the same command can run every night.
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from cli import quiet  # pylint: disable=unused-import,g-bad-import-order
import contextlib
import posixpath
import time

import apache_beam as beam
from apache_beam.ml.inference.base import RunInference

import cli
from cli import flags
import outputs
from outputs import ownership
from outputs import partitions
from pipeline import filesystems
from pipeline import jobs
from pipeline import progress
from pipeline import readers
from pipeline import records
from pipeline import rejections
from pipeline.scoring import inference
from pipeline.scoring import report
from pipeline.scoring import rows
from pipeline.scoring import settings as settings_lib
from schemas import rejected
from schemas import scored
from serving import exports
from serving import length_groups

_CODECS = ('zstd', 'snappy', 'gzip', 'none')
# Documents a row group of the output: tens of MB, which read well in
# DuckDB, Spark and BigQuery without making every worker hold much.
_ROWS_PER_GROUP = 100_000
# Documents a model step: more make the runs of similar lengths longer and
# the model's threads idle less often between batches, at the cost of
# holding more of them.
BATCH_SIZE = 4096
# Everything a partition holds; anything else staged is not published, and
# no file of it may match the input pattern.
LAYOUT = outputs.Layout(
    contents=(scored.FILE_PATTERN, rejected.FILE_PATTERN,
              scored.MANIFEST_FILE, scored.REPORT_FILE,
              ownership.SUCCESS_MARKER),
    markers=(ownership.SUCCESS_MARKER, scored.MANIFEST_FILE),
    owner=ownership.SCORING)


def build_parser() -> flags.Parser:
  """The job's own flags; @FILE reads flags from a file, one a line, as
  the other jobs do."""
  parser = flags.Parser(__doc__.split('\n\n')[0],
                        module='pipeline.score',
                        epilog=flags.BEAM_OPTIONS_HELP.format(
                            runner=jobs.DEFAULT_RUNNER))
  readers.add_reader_arguments(parser)
  parser.add_argument('--model_dir', required=True, type=flags.folder,
                      help='The trainer\'s model folder (its newest blessed '
                      'export is used) or one export version folder (used '
                      'as asked, blessed or not).')
  parser.add_argument('--output_dir', required=True, type=flags.folder,
                      help='Root folder of the scored Parquet files; each '
                      'run publishes it, or its --partition, whole.')
  parser.add_argument('--partition', default=None,
                      help='Sub-folder of output_dir for this run, '
                      'hive-style: key=value folders such as dt=2026-11-21 '
                      'or dt=2026-11-21/hour=03, keyed as the partitions '
                      'already there; a rerun replaces it whole.')
  parser.add_argument('--allow_schema_change', action='store_true',
                      help='Write a partition whose columns differ from '
                      'those of the partitions beside it (a model with '
                      'other labels, other --keep_fields); readers must '
                      'then merge the partitions\' schemas.')
  parser.add_argument('--overwrite', action='store_true',
                      help='Replace the output folder even if this job did '
                      'not write it, or it holds other partitions.')
  parser.add_argument('--keep_fields', default='',
                      help='Comma-separated input fields copied to each '
                      'output row with their types; field:column names the '
                      'column, e.g. label:true_label.')
  parser.add_argument('--batch_size', type=flags.integer(1),
                      default=BATCH_SIZE,
                      help='Documents handed to the model together: sorted '
                      'by length into model calls of '
                      f'{length_groups.CALL_ROWS} '
                      '(serving/length_groups.py).')
  parser.add_argument('--parquet_codec', choices=_CODECS, default='zstd',
                      help='Compression of the Parquet files.')
  rejections.add_budget_argument(parser)
  progress.add_argument(parser)
  return parser


def parse_args(argv):
  """Our flags and the pipeline's (every Beam pipeline option)."""
  return jobs.parse_args(build_parser(), argv)


def build_pipeline(pipeline, settings: settings_lib.Settings, staging: str):
  """Adds the scoring steps to ``pipeline``, writing under ``staging``."""
  read = pipeline | 'Read' >> readers.ReadRecords(
      settings.pattern, settings.read_config, chunked=True)
  duplicates = read | 'Duplicates' >> records.CountDuplicateIds()
  checked = read | 'Validate' >> beam.ParDo(rows.Validate(
      settings.read_config.max_text_bytes, settings.kept_types,
      settings.batch_size)).with_outputs(
          records.REJECTED, records.STATS, main='batches')
  predictions = checked.batches | 'Score' >> RunInference(
      inference.RawTextModelHandler(settings.export_dir,
                                    metadata=settings.metadata))
  schema = settings.schema
  scored_rows = predictions | 'ToArrow' >> beam.ParDo(rows.ToArrow(
      schema, settings.label_names, settings.metadata.version,
      settings.kept, settings.confidence_edges,
      _ROWS_PER_GROUP)).with_outputs(
          records.REJECTED, records.STATS, main='rows')

  _ = scored_rows.rows | 'WriteParquet' >> beam.io.WriteToParquetBatched(
      posixpath.join(staging, scored.FILE_PREFIX), schema=schema,
      codec=settings.codec, file_name_suffix=scored.FILE_SUFFIX)
  _ = ((checked[records.REJECTED], scored_rows[records.REJECTED])
       | 'AllRejected' >> beam.Flatten()
       | 'Rejected' >> records.WriteDeadLetters(
           posixpath.join(staging, rejected.DIR)))
  _ = ((checked[records.STATS], scored_rows[records.STATS], duplicates)
       | 'AllCounts' >> beam.Flatten()
       | 'Counts' >> records.WriteCounts(staging))


def run_pipeline(pipeline_args, settings: settings_lib.Settings,
                 staging: str, stall_seconds: float = 0,
                 progress_seconds: float = 0):
  """Runs the scoring pipeline; a ModelFailure when the model failed on a
  whole batch in a worker, whatever the runner made of the exception."""
  try:
    return jobs.run_pipeline(pipeline_args, lambda pipeline: build_pipeline(
        pipeline, settings, staging), stall_seconds, progress_seconds)
  except Exception as error:  # pylint: disable=broad-except
    failure = inference.model_failure(error)
    if failure:
      raise failure from error
    raise


def run(argv=None):
  args, pipeline_args = parse_args(argv)
  started, started_at = time.time(), report.utc_now()
  jobs.check_runner_options(pipeline_args)
  jobs.configure_filesystems(pipeline_args)
  settings = settings_lib.settings_from_args(args)
  output = filesystems.claim(
      settings.output_dir, settings.pattern, LAYOUT, args.overwrite,
      partition=settings.partition, beside=lambda root: (
          partitions.check_beside(filesystems.FILES, root, settings.partition,
                                  settings.sibling_schema)))
  sample, signature = settings_lib.preflight(settings)
  # A worker in this process (a local runner's) scores with the export the
  # preflight loaded and checked, instead of loading it again; for workers
  # elsewhere the launcher does not hold it while the job runs.
  lent = (exports.lending(settings.export_dir, signature, settings.metadata)
          if jobs.workers_in_this_process(pipeline_args)
          else contextlib.nullcontext())
  del signature
  with output:
    staging = output.staging_dir
    with progress.reporting('score', 'scored', args.progress_seconds,
                            progress.estimate_records(settings.input,
                                                      sample)), lent:
      result = run_pipeline(pipeline_args, settings, staging,
                            args.stall_seconds, args.progress_seconds)
    tally = records.pop_tally(staging)
    tally.reconcile()
    rejections.check_budget(tally, settings.max_rejected_fraction,
                            settings.input, settings.read_config, output)
    written = report.manifest(args, settings, tally, result, staging,
                              started_at)
    report.check_row_count(staging, written['files'], tally.total_written)
    filesystems.write_json(posixpath.join(staging, scored.MANIFEST_FILE),
                           written)
    report.write_drift_report(staging, written['drift'])
    output.mark_finished()
    output.publish()
  report.log_summary(written, time.time() - started, output.final_dir)
  tally.check_complete(settings.read_config.allow_corrupt_files)
  return written


def main():
  """The console script's entry point."""
  cli.main(run)


if __name__ == '__main__':
  main()
