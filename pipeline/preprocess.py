"""The preprocessing job: raw labelled text -> TFT transform graph + TFRecords.

    python -m pipeline.preprocess --input=GLOB --output_dir=DIR [flags]
        [any Beam pipeline option]

Reads any format of ``pipeline.readers``, rejects bad records to
``_rejected/``, assigns each good one to train, validation or test, learns
the vocabulary on train alone with tensorflow-transform, and writes the three
splits as gzip TFRecords of transformed features next to ``transform_fn/``,
``stats.json`` and the parameters the trainer and the scorer need.

Splits come from the data (``--split_field``, or train/ and test/ folders)
or else from a stable hash of each record's normalized text; in both cases
validation is carved out of train by that hash (``hash_split``), so copies
of one text always land in the same split.
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from pipeline import quiet  # pylint: disable=unused-import,g-bad-import-order
import argparse
import collections
import dataclasses
import hashlib
import logging
import posixpath
import time
from typing import Dict, List, Optional

import apache_beam as beam
from apache_beam import pvalue
import numpy as np
import pyarrow as pa
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import schema_utils
from tfx_bsl.coders import example_coder
from tfx_bsl.tfxio import tensor_adapter
from tfx_bsl.tfxio import tensor_representation_util

from pipeline import cli
from pipeline import jobs
from pipeline import outputs
from pipeline import readers
from pipeline import records
from pipeline import tfrecords
from pipeline import transform
from schemas import raw
from schemas import rejected
from schemas import scored
from schemas import transformed

_BATCH_SIZE = 4000
_NAMESPACE = 'preprocess'


def parse_args(argv):
  # @FILE reads flags from a file, one a line (configs/<name>/).
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                   fromfile_prefix_chars='@')
  readers.add_reader_arguments(parser)
  parser.add_argument('--output_dir', required=True)
  parser.add_argument('--overwrite', action='store_true',
                      help='Replace output_dir even if this job did not '
                      'write it.')
  parser.add_argument('--label_field', default='label')
  split = parser.add_mutually_exclusive_group()
  split.add_argument(
      '--split_field', default=None,
      help='Field naming each record\'s split: train, validation (valid, '
      'dev) or test (eval).')
  split.add_argument(
      '--test_fraction', type=float, default=0.2,
      help='Without a split field or split folders: share of records sent to '
      'test by a hash of their normalized text.')
  parser.add_argument(
      '--validation_fraction', type=float, default=0.1,
      help='Share of the train records carved out as the validation split by '
      'the same hash; 0 where the data names its validation records.')
  defaults = transform.TransformParams()
  parser.add_argument('--vocab_size', type=int, default=defaults.vocab_size,
                      help='Vocabulary size including padding and OOV ids.')
  parser.add_argument('--min_frequency', type=int,
                      default=defaults.min_frequency)
  parser.add_argument('--max_len', type=int, default=defaults.max_len)
  parser.add_argument('--max_token_chars', type=int,
                      default=defaults.max_token_chars)
  parser.add_argument('--truncation', choices=transform.TRUNCATIONS,
                      default=defaults.truncation,
                      help='Tokens kept from a document longer than max_len: '
                      'the first, the last, or half of each.')
  parser.add_argument('--drop_punctuation',
                      action=argparse.BooleanOptionalAction,
                      default=not defaults.keep_punctuation,
                      help='Drop punctuation and symbols instead of making '
                      'them tokens.')
  return parser.parse_known_args(argv)


@dataclasses.dataclass(frozen=True)
class Settings:
  """The job's checked flags."""
  pattern: str
  read_config: readers.ReadConfig
  params: transform.TransformParams
  test_fraction: Optional[float]  # None: splits come from the data
  validation_fraction: float


# Formats read one document a file, whose train/test/... folder names its
# split (readers.read_document).
_SPLIT_FOLDER_FORMATS = ('files', 'email')


def check_fractions(args, fmt: str) -> None:
  """ValueError unless --test_fraction and --validation_fraction are in
  [0, 1), and 0 only where the data can name such records: else that split
  would be empty, and the trainer needs both."""
  for flag in ('test_fraction', 'validation_fraction'):
    fraction = getattr(args, flag)
    if not 0.0 <= fraction < 1.0:
      raise ValueError(f'--{flag} must be in [0, 1)')
    if not (fraction or args.split_field or fmt in _SPLIT_FOLDER_FORMATS):
      raise ValueError(
          f'--{flag}=0 leaves the {flag.split("_")[0]} split empty: give a '
          'share in (0, 1), or take the splits from the data (--split_field, '
          'or train/, validation/ and test/ folders of a folder input)')


def settings_from_args(args) -> Settings:
  """The flags checked before anything runs; a JobError names a bad one."""
  try:
    pattern, fmt = readers.resolve_input(args.input, args.format)
    check_fractions(args, fmt)
    config = readers.read_config_from_args(
        args, format=fmt, label_field=args.label_field or None,
        split_field=args.split_field)
    params = transform.TransformParams(
        vocab_size=args.vocab_size, min_frequency=args.min_frequency,
        max_len=args.max_len, max_token_chars=args.max_token_chars,
        truncation=args.truncation,
        keep_punctuation=not args.drop_punctuation)
  except ValueError as error:  # ReaderError is one
    raise cli.JobError(str(error)) from error
  return Settings(pattern, config, params,
                  None if args.split_field else args.test_fraction,
                  args.validation_fraction)


# --------------------------------------------------------------------------
# Validation and split assignment


def hash_split(text: str, test_fraction: float,
               validation_fraction: float) -> str:
  """Train, validation or test from the text alone: stable across runs and
  runners, and the same for every copy of a text (up to case and spacing).

  The text's hash is a share h in [0, 1), cut into disjoint ranges:
  test is [0, t); validation is the first v of the rest,
  [t, t + v (1 - t)); train is what is left. A record the data sends to
  train is carved with t = 0: validation is [0, v) of the train records.
  """
  normalized = ' '.join(text.casefold().split()).encode('utf-8', 'replace')
  digest = hashlib.sha256(normalized).digest()
  share = int.from_bytes(digest[:8], 'big') / 2.0**64
  if share < test_fraction:
    return raw.TEST
  if share < test_fraction + validation_fraction * (1.0 - test_fraction):
    return raw.VALIDATION
  return raw.TRAIN


def assign_split(text: str, named: Optional[str], test_fraction: float,
                 validation_fraction: float) -> Optional[str]:
  """The split of a record whose data names split ``named`` (None: none);
  None for a name that is no split. Train records give validation its
  share; the others keep the split the data gave them."""
  if not named:
    return hash_split(text, test_fraction, validation_fraction)
  split = raw.SPLIT_ALIASES.get(named.strip().lower())
  if split == raw.TRAIN:
    return hash_split(text, 0.0, validation_fraction)
  return split


class ValidateAndSplit(records.CountingDoFn):
  """Routes each raw record to train, validation, test or the dead
  letters."""

  def __init__(self, max_text_bytes: int, test_fraction: float,
               validation_fraction: float, split_required: bool,
               metered: bool = True):
    super().__init__(_NAMESPACE, metered)
    self._max_text_bytes = max_text_bytes
    self._test_fraction = test_fraction
    self._validation_fraction = validation_fraction
    self._split_required = split_required

  def _split(self, record):
    """The record's split, or the reason it has none."""
    value = record.get(raw.SPLIT)
    if not value and self._split_required:
      return None, rejected.MISSING_SPLIT
    split = assign_split(record[raw.TEXT], value, self._test_fraction,
                         self._validation_fraction)
    return (split, None) if split else (None, rejected.UNKNOWN_SPLIT)

  def process(self, record):
    self.count_read()
    reason = records.check_record(record, self._max_text_bytes,
                                  require_label=True)
    split = None
    if not reason:
      split, reason = self._split(record)
    if reason:
      yield self.reject(record, reason)
      return
    if split == raw.TRAIN:
      self.count_label(raw.TRAIN, record[raw.LABEL])
    yield pvalue.TaggedOutput(split, record)


class RejectUnknownLabels(records.CountingDoFn):
  """Held-out records whose label never occurs in train go to the dead
  letters."""

  def __init__(self, split: str):
    super().__init__(_NAMESPACE)
    self._split = split

  def process(self, record, train_counts):
    label = record[raw.LABEL]
    if (records.LABEL, raw.TRAIN, label) in train_counts:
      self.count_label(self._split, label)
      yield record
    else:
      yield self.reject(record, rejected.LABEL_NOT_IN_TRAIN)


def check_label_columns(train_labels) -> None:
  """A JobError when two labels would share a probability column of the
  scoring job's output; the labels are only known once the pipeline counted
  them, so this runs after it and before anything is published."""
  by_column = collections.defaultdict(list)
  for label in sorted(train_labels):
    by_column[scored.probability_column(label)].append(label)
  clashes = [f'{" and ".join(map(repr, labels))} would share {column}'
             for column, labels in by_column.items() if len(labels) > 1]
  if clashes:
    raise cli.JobError('labels clash as score columns: ' + '; '.join(clashes)
                       + '; rename them in the input')


def to_record_batch(rows: List[Dict]) -> pa.RecordBatch:
  """Raw records as the Arrow batch TFT's tensor adapter reads."""
  offsets = pa.array(np.arange(len(rows) + 1, dtype=np.int64))
  columns = []
  for name in raw.RAW_FEATURE_SPEC:
    values = pa.array([r[name].encode('utf-8', 'replace') for r in rows],
                      type=pa.large_binary())
    columns.append(pa.LargeListArray.from_arrays(offsets, values))
  return pa.RecordBatch.from_arrays(columns, schema=raw.RAW_ARROW_SCHEMA)


def raw_tensor_adapter_config() -> tensor_adapter.TensorAdapterConfig:
  schema = schema_utils.schema_from_feature_spec(raw.RAW_FEATURE_SPEC)
  return tensor_adapter.TensorAdapterConfig(
      raw.RAW_ARROW_SCHEMA,
      tensor_representation_util.InferTensorRepresentationsFromSchema(schema))


class EncodeExamples(records.CountingDoFn):
  """Transformed record batches -> lists of serialized tf.Examples + stats."""

  def __init__(self, split: str):
    super().__init__(_NAMESPACE)
    self._split = split
    self._dropped = transformed.HELD_OUT_ONLY if split == raw.TRAIN else []

  def setup(self):
    self._encoder = example_coder.RecordBatchToExamplesEncoder()

  def process(self, batch_and_passthrough):
    batch, _ = batch_and_passthrough
    batch = batch.drop_columns(self._dropped)
    self.count_written(batch.num_rows, self._split)
    lengths = batch.column(transformed.LENGTH).flatten().to_numpy()
    self.count_lengths({int(length): int(count) for length, count in zip(
        *np.unique(lengths, return_counts=True))})
    yield self._encoder.encode(batch)


class ReadAndRoute(beam.PTransform):
  """Reads the input and routes each record: the outputs of
  ValidateAndSplit."""

  def __init__(self, settings: Settings, metered: bool):
    super().__init__()
    self._settings = settings
    self._metered = metered

  def expand(self, pbegin):
    settings, config = self._settings, self._settings.read_config
    return (pbegin
            | 'Read' >> readers.ReadRecords(settings.pattern, config)
            | 'ValidateAndSplit' >> beam.ParDo(ValidateAndSplit(
                config.max_text_bytes, settings.test_fraction or 0.0,
                settings.validation_fraction,
                split_required=bool(config.split_field),
                metered=self._metered)).with_outputs(
                    records.REJECTED, records.STATS, *raw.SPLITS))


def to_arrow_batches(split_records, split: str):
  return (split_records
          | f'Batch{split}' >> beam.BatchElements(
              min_batch_size=_BATCH_SIZE, max_batch_size=_BATCH_SIZE)
          | f'ToArrow{split}' >> beam.Map(to_record_batch))


def build_pipeline(pipeline, settings: Settings, staging: str):
  """Adds the preprocessing steps to ``pipeline``, writing under ``staging``.

  The input is read twice. The first pass learns the train labels and the
  vocabulary; the second checks, transforms and writes every record, and
  alone counts. A runner holds a PCollection whole between two stages
  (DirectRunner in its own memory), so keeping the records until the
  vocabulary is known would hold the corpus. Read again, each record
  streams from its file to its TFRecord, with what the first pass learnt
  waiting as side inputs.
  """
  learnt = pipeline | 'Learn' >> ReadAndRoute(settings, metered=False)
  train_labels = learnt[records.STATS] | 'SumTrainLabels' >> (
      beam.CombineGlobally(records.SumCounts()))
  routed = pipeline | 'Route' >> ReadAndRoute(settings, metered=True)
  split_records = {raw.TRAIN: routed[raw.TRAIN]}
  stats, rejects = [routed[records.STATS]], [routed[records.REJECTED]]
  for split in raw.HELD_OUT:
    checked = routed[split] | f'RejectUnknownLabels{split}' >> beam.ParDo(
        RejectUnknownLabels(split), train_counts=beam.pvalue.AsSingleton(
            train_labels)).with_outputs(
                records.REJECTED, records.STATS, main='checked')
    split_records[split] = checked.checked
    stats.append(checked[records.STATS])
    rejects.append(checked[records.REJECTED])

  adapter_config = raw_tensor_adapter_config()
  with tft_beam.Context(temp_dir=posixpath.join(staging, 'tmp')):
    # Train alone: no word of validation or test may shape the vocabulary.
    transform_fn = ((to_arrow_batches(learnt[raw.TRAIN], 'Learnt'),
                     adapter_config)
                    | 'AnalyzeTrain' >> tft_beam.AnalyzeDataset(
                        transform.make_preprocessing_fn(settings.params)))
    for split in raw.SPLITS:
      transformed_batches, _ = (
          ((to_arrow_batches(split_records[split], split), adapter_config),
           transform_fn)
          | f'Transform{split}' >> tft_beam.TransformDataset(
              output_record_batches=True))
      encoded = transformed_batches | f'Encode{split}' >> beam.ParDo(
          EncodeExamples(split)).with_outputs(records.STATS, main='examples')
      stats.append(encoded[records.STATS])
      _ = encoded.examples | f'Write{split}' >> tfrecords.WriteTFRecordBatches(
          posixpath.join(staging, split),
          file_name_suffix=transformed.TFRECORD_SUFFIX)
    _ = transform_fn | 'WriteTransformFn' >> tft_beam.WriteTransformFn(staging)

  _ = (rejects
       | 'AllRejected' >> beam.Flatten()
       | 'Rejected' >> records.WriteDeadLetters(
           posixpath.join(staging, rejected.DIR)))
  _ = (stats
       | 'AllCounts' >> beam.Flatten()
       | 'Counts' >> records.WriteCounts(staging))


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


# Everything the output holds; anything else staged (TFT's temporary files,
# a runner's leftovers) is not published, and no file of it may match the
# input pattern.
LAYOUT = outputs.Layout(
    contents=(*(transformed.split_file_pattern(split) for split in raw.SPLITS),
              tft.TFTransformOutput.TRANSFORM_FN_DIR + '/**',
              tft.TFTransformOutput.TRANSFORMED_METADATA_DIR + '/**',
              transformed.STATS_FILE, transformed.PARAMS_FILE,
              rejected.FILE_PATTERN),
    markers=(transformed.STATS_FILE, tft.TFTransformOutput.TRANSFORM_FN_DIR))


def log_summary(stats: Dict, seconds: float, output_dir: str) -> None:
  totals, lengths = stats['records'], stats['token_length']
  logging.info(
      'preprocess: read %d records in %.1f s -> train %d, validation %d, '
      'test %d, rejected %d%s; vocabulary %d ids, labels %s, p50 length %d '
      '(%.1f%% truncated at %d); output %s', totals['read'], seconds,
      totals['written'][raw.TRAIN], totals['written'][raw.VALIDATION],
      totals['written'][raw.TEST],
      totals['rejected'], ''.join(
          f', {n} {reason}' for reason, n in stats['rejected_by_reason'].items()),
      stats['vocabulary_size'], stats['labels']['names'], lengths['p50'],
      100 * lengths['truncated_share'], lengths['max_len'], output_dir)


def run(argv=None):
  args, pipeline_args = parse_args(argv)
  started = time.time()
  jobs.configure_filesystems(pipeline_args)
  settings = settings_from_args(args)
  with outputs.StagedOutput(args.output_dir, settings.pattern, layout=LAYOUT,
                            overwrite=args.overwrite) as output:
    staging = output.staging_dir
    jobs.run_pipeline(pipeline_args, lambda pipeline: build_pipeline(
        pipeline, settings, staging))
    tally = records.pop_tally(staging)
    tally.reconcile()
    if not tally.written.get(raw.TRAIN):
      raise cli.JobError(
          f'no record reached the train split ({tally.rejected} of '
          f'{tally.read} rejected: {tally.rejected_by_reason})')
    check_label_columns(tally.labels.get(raw.TRAIN, {}))
    stats = summarize(tally, staging, settings.params.max_len)
    write_sidecars(staging, stats, settings, args.input)
    output.publish()
  log_summary(stats, time.time() - started, args.output_dir)
  tally.check_complete(settings.read_config.allow_corrupt_files)
  return stats


if __name__ == '__main__':
  cli.main(run)
