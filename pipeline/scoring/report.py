"""What the scoring job writes and logs once its pipeline has run: the
manifest, the drift report, the row-count check and the summary line."""
import datetime
import logging
import posixpath
from typing import Dict, Sequence

from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
import pyarrow.parquet as pq

import cli
from pipeline import records
from pipeline.scoring import rows
from pipeline.scoring.settings import Settings
from schemas import scored
from serving import drift

# RunInference's metrics (its handler's default namespace), as the manifest
# reports them: (manifest key, metric name, distribution part or None for a
# counter, scale).
INFERENCE_NAMESPACE = 'RunInference'
_INFERENCE_METRICS = (
    ('documents', 'num_inferences', None, 1),
    ('batches', 'inference_batch_latency_micro_secs', 'count', 1),
    ('inference_seconds', 'inference_batch_latency_micro_secs', 'sum', 1e-6),
    ('failed_batches', 'failed_batches_counter', None, 1),
    ('model_loads', 'load_model_latency_milli_secs', 'count', 1),
    ('load_model_seconds', 'load_model_latency_milli_secs', 'sum', 1e-3),
)


def inference_metrics(result) -> Dict:
  """RunInference's standard metrics, summed over workers, and ``reported``:
  ``committed`` where the runner reports the values of bundles that
  succeeded, ``attempted`` where it reports only those of every attempt
  (retried bundles counted again), ``none`` where it reports none."""
  try:
    queried = result.metrics().query(
        MetricsFilter().with_namespace(INFERENCE_NAMESPACE))
  except Exception:  # pylint: disable=broad-except
    queried = {}
  metrics = [metric for kind in ('counters', 'distributions')
             for metric in queried.get(kind, ())]
  reported = ('committed' if any(m.committed is not None for m in metrics)
              else 'attempted' if metrics else 'none')
  by_name = {metric.key.metric.name: getattr(metric, reported)
             for metric in metrics if reported != 'none'}
  found = {'reported': reported}
  for key, name, part, scale in _INFERENCE_METRICS:
    if by_name.get(name) is not None:
      value = by_name[name] if part is None else getattr(by_name[name], part)
      found[key] = value * scale if scale != 1 else value
  return found


# What each of the drift section's PSIs is measured over.
_MEASURED = {'labels': 'label shares', 'confidence': 'confidence'}


def partition_drift(settings: Settings, tally: records.Tally) -> Dict:
  """The partition's label shares and confidence histogram against the
  export's reference (``serving.drift``)."""
  current = drift.distribution(
      settings.label_names, tally.labels.get(rows.SCORED, {}),
      tally.bins.get(rows.CONFIDENCE, {}), settings.confidence_edges)
  return drift.compare(current, settings.metadata.reference)


def write_drift_report(staging: str, drift_section: Dict) -> None:
  """``_report.png`` where matplotlib is installed (on the launcher: the
  workers need no plotting); a warning when the drift alert is raised, a
  note for each PSI too few documents left unjudged."""
  if drift_section['alert']:
    psi = drift_section['psi']
    logging.warning(
        'score: predictions drifted from the test split: %s (alert over '
        '%.1f)', ', '.join(
            f'PSI {psi[name]:.3f} on {_MEASURED[name]}'
            for name, judged in drift_section['judged'].items()
            if judged and psi[name] > drift.PSI_ALERT), drift.PSI_ALERT)
  for name, why in drift_section['not_judged'].items():
    logging.info('score: drift of the %s not judged: %s', _MEASURED[name],
                 why)
  image = drift.plot(drift_section)
  if image:
    with FileSystems.create(posixpath.join(staging, scored.REPORT_FILE),
                            mime_type='image/png') as handle:
      handle.write(image)


def utc_now() -> str:
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
      'model_version': settings.metadata.version,
      # Why this version: as asked, or the newest the trainer blessed (and
      # the newer ones it did not), with the trainer's verdict.
      'model_choice': {**settings.chosen.record(),
                       'blessing': settings.metadata.blessing},
      'label_names': settings.label_names,
      'partition': settings.partition or None,
      'counts': {
          'read': tally.read,
          'scored': tally.total_written,
          'rejected': tally.rejected,
          'rejected_by_reason': tally.rejected_by_reason,
          'duplicate_ids': tally.duplicate_ids,
          'duplicate_rows': tally.duplicate_rows,
          'ids_replaced': tally.ids_replaced,
      },
      'inference': inference_metrics(result),
      'drift': partition_drift(settings, tally),
      'files': files,
      'started_at': started_at,
      'finished_at': utc_now(),
  }


def check_row_count(staging: str, files: Sequence[str], scored_count: int):
  """Fails unless the Parquet files to publish hold as many rows as the
  pipeline scored: a file a runner lost or left behind would otherwise be
  published as data. Reads only the files' footers."""
  count = 0
  for name in files:
    with FileSystems.open(posixpath.join(staging, name)) as handle:
      count += pq.read_metadata(handle).num_rows
  if count != scored_count:
    raise cli.JobError(
        f'the Parquet files to publish hold {count} rows but the pipeline '
        f'counted {scored_count} scored')


def log_summary(written: Dict, seconds: float, final_dir: str) -> None:
  """One line for the run; a warning when the input repeats ids."""
  counts = written['counts']
  duplicates = (f'; {counts["duplicate_ids"]} duplicate ids '
                f'({counts["duplicate_rows"]} records beyond their first)'
                if counts['duplicate_ids'] else '')
  logging.log(
      logging.WARNING if duplicates else logging.INFO,
      'score: read %d documents in %.1f s (%.0f/s) -> scored %d, rejected %d%s'
      '%s; model version %s (%s); output %s', counts['read'], seconds,
      counts['read'] / seconds, counts['scored'], counts['rejected'], ''.join(
          f', {n} {reason}'
          for reason, n in counts['rejected_by_reason'].items()), duplicates,
      written['model_version'], written['model_choice']['why'], final_dir)
