"""What the preprocessing job writes beside its TFRecords and logs once its
pipeline has run: ``stats.json``, the parameters and the summary line."""
import dataclasses
import logging
import posixpath
from typing import Dict, Optional

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
from tensorflow_transform import analyzers as tft_analyzers

from pipeline import filesystems
from pipeline import records
from pipeline.preprocessing import ngram_counts
from pipeline.preprocessing import splits
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


def _split_stats(tally: records.Tally, grouped_by: Optional[str]) -> Dict:
  """How the splits were made, for the trainer's report: the group flags,
  the records each split got by what chose them (the data, the hash of a
  group, of a text; counted as routed, before held-out records with a label
  train lacks are rejected), the distinct groups of each split, and the
  records a group flag left to the text hash."""
  return {
      'grouped_by': grouped_by,
      'chosen_by': {split: tally.chosen.get(split, {}) for split in raw.SPLITS},
      'groups': {split: tally.groups.get(split, 0) for split in raw.SPLITS},
      'ungrouped': tally.ungrouped,
  }


def token_vocabulary_is_empty(staging: str) -> bool:
  """Whether no token of train made the vocabulary (all below
  --min_frequency): TFT then writes one placeholder token of its own."""
  _, placeholder = tft_analyzers.get_empy_vocabulary_dummy_value(tf.string)
  return tft.TFTransformOutput(staging).vocabulary_by_name(
      transformed.TOKEN_VOCABULARY) in ([], [placeholder])


def summarize(tally: records.Tally, staging: str, max_len: int,
              grouped_by: Optional[str] = None) -> Dict:
  """stats.json from the pipeline's counts and the written transform graph;
  ``grouped_by``: the group flags, if any."""
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
      transformed.SPLITS_STATS: _split_stats(tally, grouped_by),
      transformed.NGRAMS_STATS: _ngram_stats(tally),
  }


def _ngram_stats(tally: records.Tally) -> Dict:
  """What the n-gram statistics' files hold, for their reader to check."""
  kept = tally.bins.get(ngram_counts.KEPT_BY_ORDER, {})
  return {
      'max_order': transformed.NGRAM_MAX_ORDER,
      'min_documents': transformed.NGRAM_MIN_DOCUMENTS,
      'kept_by_order': {str(order): kept.get(order, 0) for order in range(
          1, transformed.NGRAM_MAX_ORDER + 1)},
  }


def write_sidecars(staging: str, stats: Dict, settings: Settings,
                   input_arg: str) -> None:
  """stats.json and the parameters the trainer and the scorer read."""
  filesystems.write_json(posixpath.join(staging, transformed.STATS_FILE), stats)
  filesystems.write_json(posixpath.join(staging, transformed.PARAMS_FILE), {
      'transform': dataclasses.asdict(settings.params),
      'input': input_arg,
      'read_config': dataclasses.asdict(settings.read_config),
      'test_fraction': settings.test_fraction,
      'validation_fraction': settings.validation_fraction,
      'group_pattern': settings.group_pattern,
  })


def _grouping_summary(splits: Dict) -> str:
  """'; 250 groups (--group_pattern=...), 3 records ungrouped', or ''."""
  if not splits['grouped_by']:
    return ''
  return (f'; {sum(splits["groups"].values())} groups '
          f'({splits["grouped_by"]}), {splits["ungrouped"]} records '
          'ungrouped')


def log_summary(stats: Dict, seconds: float, output_dir: str) -> None:
  totals, lengths = stats['records'], stats['token_length']
  logging.info(
      'preprocess: read %d records in %.1f s -> train %d, validation %d, '
      'test %d, rejected %d%s%s; vocabulary %d ids, labels %s, p50 length %d '
      '(%.1f%% truncated at %d); output %s', totals['read'], seconds,
      totals['written'][raw.TRAIN], totals['written'][raw.VALIDATION],
      totals['written'][raw.TEST],
      totals['rejected'], ''.join(
          f', {n} {reason}'
          for reason, n in stats['rejected_by_reason'].items()),
      _grouping_summary(stats[transformed.SPLITS_STATS]),
      stats['vocabulary_size'], stats['labels']['names'], lengths['p50'],
      100 * lengths['truncated_share'], lengths['max_len'], output_dir)


def log_unused_test_fraction(tally: records.Tally,
                             test_fraction: float) -> None:
  """One line when the data named every test record: --test_fraction (a
  default, or a configuration's) chose none, so that no one reads the test
  share from it."""
  test = tally.chosen.get(raw.TEST, {})
  if test.get(splits.BY_DATA) and not (test.get(splits.BY_GROUP) or
                                       test.get(splits.BY_TEXT)):
    logging.info('preprocess: the data names the test split (--split_field, '
                 'or split folders): --test_fraction=%g is not used',
                 test_fraction)


