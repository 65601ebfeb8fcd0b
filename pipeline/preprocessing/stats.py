"""What the preprocessing job writes beside its TFRecords and logs once its
pipeline has run: ``stats.json``, the parameters and the summary line."""
import dataclasses
import logging
import posixpath
from typing import Dict

import numpy as np
import tensorflow_transform as tft

from pipeline import outputs
from pipeline import records
from pipeline.preprocessing.settings import Settings
from schemas import raw
from schemas import transformed


def _percentile(lengths: Dict[int, int], share: float) -> int:
  values = np.array(sorted(lengths))
  cumulative = np.cumsum([lengths[v] for v in values])
  return int(values[np.searchsorted(cumulative, share * cumulative[-1])])


def _token_length_stats(lengths: Dict[int, int], max_len: int) -> Dict:
  documents = sum(lengths.values())
  if not documents:
    return {'p50': 0, 'p90': 0, 'p99': 0, 'max': 0, 'max_len': max_len,
            'truncated_share': 0.0}
  return {
      'p50': _percentile(lengths, 0.5),
      'p90': _percentile(lengths, 0.9),
      'p99': _percentile(lengths, 0.99),
      'max': max(lengths),
      'max_len': max_len,
      'truncated_share': sum(c for n, c in lengths.items() if n > max_len) /
                         documents,
  }


def summarize(tally: records.Tally, staging: str, max_len: int) -> Dict:
  """stats.json from the pipeline's counts and the written transform graph."""
  written = {split: tally.written.get(split, 0) for split in raw.SPLITS}
  tft_output = tft.TFTransformOutput(staging)
  has_vocabulary = bool(written[raw.TRAIN])
  return {
      'records': {
          'read': tally.read,
          'written': written,
          'rejected': tally.rejected,
          'ids_replaced': tally.ids_replaced,
      },
      'rejected_by_reason': tally.rejected_by_reason,
      'vocabulary_size': (
          tft_output.vocabulary_size_by_name(transformed.TOKEN_VOCABULARY) +
          transformed.NUM_RESERVED_IDS) if has_vocabulary else 0,
      'labels': {
          'names': [name.decode('utf-8') for name in
                    tft_output.vocabulary_by_name(
                        transformed.LABEL_VOCABULARY)
                    ] if has_vocabulary else [],
          'counts': {split: tally.labels.get(split, {})
                     for split in raw.SPLITS},
      },
      'token_length': _token_length_stats(tally.lengths, max_len),
  }


def write_sidecars(staging: str, stats: Dict, settings: Settings,
                   input_arg: str) -> None:
  """stats.json and the parameters the trainer and the scorer read."""
  outputs.write_json(posixpath.join(staging, transformed.STATS_FILE), stats)
  outputs.write_json(posixpath.join(staging, transformed.PARAMS_FILE), {
      'transform': dataclasses.asdict(settings.params),
      'input': input_arg,
      'read_config': dataclasses.asdict(settings.read_config),
      'test_fraction': settings.test_fraction,
      'validation_fraction': settings.validation_fraction,
  })


def log_summary(stats: Dict, seconds: float, output_dir: str) -> None:
  totals, lengths = stats['records'], stats['token_length']
  logging.info(
      'preprocess: read %d records in %.1f s -> train %d, validation %d, '
      'test %d, rejected %d%s; vocabulary %d ids, labels %s, p50 length %d '
      '(%.1f%% truncated at %d); output %s', totals['read'], seconds,
      totals['written'][raw.TRAIN], totals['written'][raw.VALIDATION],
      totals['written'][raw.TEST],
      totals['rejected'], ''.join(
          f', {n} {reason}'
          for reason, n in stats['rejected_by_reason'].items()),
      stats['vocabulary_size'], stats['labels']['names'], lengths['p50'],
      100 * lengths['truncated_share'], lengths['max_len'], output_dir)


