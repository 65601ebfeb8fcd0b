"""The preprocessing job: raw labelled text -> TFT transform graph + TFRecords.

    python -m pipeline.preprocess --input=GLOB --output_dir=DIR [flags]
        [any Beam pipeline option]

Reads any format of ``pipeline.readers``, rejects bad records to
``_rejected/``, assigns each good one to train, validation or test, learns
the vocabulary on train alone with tensorflow-transform, and writes the three
splits as gzip TFRecords of transformed features next to ``transform_fn/``,
the train split's n-gram statistics, ``stats.json`` and the parameters the
trainer and the scorer need.

Splits come from the data (``--split_field``, or train/ and test/ folders)
or else from a stable hash of each record's group (``--group_field``,
``--group_pattern``) or, without one, of its normalized text; in both cases
validation is carved out of train by that hash (``hash_split``), so copies
of one text, and the records of one group, always land in the same split.
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from cli import quiet  # pylint: disable=unused-import,g-bad-import-order
import argparse
import posixpath
import time

import apache_beam as beam
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam

import cli
from cli import flags
import outputs
from outputs import ownership
from pipeline import filesystems
from pipeline import jobs
from pipeline import progress
from pipeline import readers
from pipeline import records
from pipeline import rejections
from pipeline import tfrecords
from pipeline import transform
from pipeline.preprocessing import examples
from pipeline.preprocessing import ngram_counts
from pipeline.preprocessing import settings as settings_lib
from pipeline.preprocessing import splits
from pipeline.preprocessing import stats as stats_lib
from schemas import raw
from schemas import rejected
from schemas import transformed


# The most tokens a document may keep (--max_len): a transformer's memory
# grows with its square, and every record is padded to it.
MAX_LEN = 65_536


def build_parser() -> flags.Parser:
  """The job's own flags; @FILE reads flags from a file, one a line
  (configs/<name>/)."""
  parser = flags.Parser(__doc__.split('\n\n')[0],
                        module='pipeline.preprocess',
                        epilog=flags.BEAM_OPTIONS_HELP.format(
                            runner=jobs.DEFAULT_RUNNER))
  readers.add_reader_arguments(parser)
  parser.add_argument('--output_dir', required=True, type=flags.folder,
                      help='Folder of the TFRecords, the transform graph, '
                      'stats.json and the dead letters; published whole '
                      'when the job succeeds.')
  parser.add_argument('--overwrite', action='store_true',
                      help='Replace output_dir even if this job did not '
                      'write it.')
  parser.add_argument('--label_field', default='label',
                      help='Field holding each record\'s class name.')
  _add_split_arguments(parser)
  _add_transform_arguments(parser)
  return parser


def _add_split_arguments(parser: flags.Parser) -> None:
  """How each record's split is found: the data's, or a hash."""
  parser.add_argument(
      '--split_field', default=None,
      help='Field naming each record\'s split: train, validation (valid, '
      'dev) or test (eval). The data\'s split wins over --test_fraction.')
  parser.add_argument(
      '--test_fraction', type=flags.number(0, 1, high_open=True),
      default=0.2,
      help='Share of the records the data names no split for (no split '
      'field, no split folders) sent to test by a hash of their group or '
      'normalized text.')
  parser.add_argument(
      '--validation_fraction', type=flags.number(0, 1, high_open=True),
      default=0.1,
      help='Share of the train records carved out as the validation split by '
      'the same hash; 0 where the data names its validation records.')
  parser.add_argument(
      '--group_field', default=None,
      help='Field (for email, header) naming each record\'s group (a movie, '
      'a thread, a sender): the records of a group share their split.')
  parser.add_argument(
      '--group_pattern', type=flags.regex, default=None,
      help='Python regex whose match in each record\'s id (or in its '
      '--group_field) is its group: the non-empty capture groups joined, or '
      'the whole match. A record without a group is split by its text.')


def _add_transform_arguments(parser: flags.Parser) -> None:
  """The transform's parameters (``transform.TransformParams``), with the
  rejection budget and progress flags in their place among them."""
  defaults = transform.TransformParams()
  parser.add_argument('--vocab_size',
                      type=flags.integer(transformed.NUM_RESERVED_IDS + 1),
                      default=defaults.vocab_size,
                      help='Vocabulary size including padding and OOV ids.')
  parser.add_argument('--min_frequency', type=flags.integer(1),
                      default=defaults.min_frequency,
                      help='Train documents a token must appear in to get '
                      'an id of its own; rarer ones are OOV.')
  parser.add_argument('--max_len', type=flags.integer(1, MAX_LEN),
                      default=defaults.max_len,
                      help='Tokens kept of each document (see --truncation), '
                      'padded to this length.')
  parser.add_argument('--max_token_chars', type=flags.integer(1),
                      default=defaults.max_token_chars,
                      help='Characters kept of a token; a longer one is cut '
                      'to this many.')
  parser.add_argument('--truncation', choices=transform.TRUNCATIONS,
                      default=defaults.truncation,
                      help='Tokens kept from a document longer than max_len: '
                      'the first, the last, or half of each.')
  rejections.add_budget_argument(parser)
  progress.add_argument(parser)
  parser.add_argument('--drop_punctuation',
                      action=argparse.BooleanOptionalAction,
                      default=not defaults.keep_punctuation,
                      help='Drop punctuation and symbols instead of making '
                      'them tokens.')


def parse_args(argv):
  """Our flags and the pipeline's (every Beam pipeline option)."""
  return jobs.parse_args(build_parser(), argv)


class ReadAndRoute(beam.PTransform):
  """Reads the input and routes each record: the outputs of
  ValidateAndSplit."""

  def __init__(self, settings: settings_lib.Settings, metered: bool):
    super().__init__()
    self._settings = settings
    self._metered = metered

  def expand(self, pbegin):
    settings, config = self._settings, self._settings.read_config
    return (pbegin
            | 'Read' >> readers.ReadRecords(settings.pattern, config)
            | 'ValidateAndSplit' >> beam.ParDo(splits.ValidateAndSplit(
                settings.routing, metered=self._metered)).with_outputs(
                    records.REJECTED, records.STATS, splits.GROUP_DIGESTS,
                    *raw.SPLITS))


def build_pipeline(pipeline, settings: settings_lib.Settings, staging: str):
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
  stats.append(routed[splits.GROUP_DIGESTS] | 'CountGroups' >> (
      splits.CountGroups()))
  for split in raw.HELD_OUT:
    checked = routed[split] | f'RejectUnknownLabels{split}' >> beam.ParDo(
        splits.RejectUnknownLabels(split),
        train_counts=beam.pvalue.AsSingleton(train_labels)).with_outputs(
            records.REJECTED, records.STATS, main='checked')
    split_records[split] = checked.checked
    stats.append(checked[records.STATS])
    rejects.append(checked[records.REJECTED])

  adapter_config = examples.raw_tensor_adapter_config()
  with tft_beam.Context(temp_dir=posixpath.join(staging, 'tmp')):
    # Train alone: no word of validation or test may shape the vocabulary.
    transform_fn = ((examples.to_arrow_batches(learnt[raw.TRAIN], 'Learnt'),
                     adapter_config)
                    | 'AnalyzeTrain' >> tft_beam.AnalyzeDataset(
                        transform.make_preprocessing_fn(settings.params)))
    for split in raw.SPLITS:
      batches = examples.to_arrow_batches(split_records[split], split)
      transformed_batches, _ = (
          ((batches, adapter_config), transform_fn)
          | f'Transform{split}' >> tft_beam.TransformDataset(
              output_record_batches=True))
      encoded = transformed_batches | f'Encode{split}' >> beam.ParDo(
          examples.EncodeExamples(split)).with_outputs(records.STATS,
                                                       main='examples')
      stats.append(encoded[records.STATS])
      if split == raw.TRAIN:
        stats.append(transformed_batches | 'NgramStatistics' >> (
            ngram_counts.CountNgrams(posixpath.join(
                staging, transformed.NGRAM_FILE_PREFIX))))
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


# Everything the output holds; anything else staged (TFT's temporary files,
# a runner's leftovers) is not published, and no file of it may match the
# input pattern.
LAYOUT = outputs.Layout(
    contents=(*(transformed.split_file_pattern(split) for split in raw.SPLITS),
              transformed.ngram_file_pattern(),
              tft.TFTransformOutput.TRANSFORM_FN_DIR + '/**',
              tft.TFTransformOutput.TRANSFORMED_METADATA_DIR + '/**',
              transformed.STATS_FILE, transformed.PARAMS_FILE,
              rejected.FILE_PATTERN),
    markers=(transformed.STATS_FILE, tft.TFTransformOutput.TRANSFORM_FN_DIR),
    owner=ownership.PREPROCESSING)


def run(argv=None):
  args, pipeline_args = parse_args(argv)
  started = time.time()
  jobs.check_runner_options(pipeline_args)
  jobs.configure_filesystems(pipeline_args)
  settings = settings_lib.settings_from_args(args)
  output = filesystems.claim(args.output_dir, settings.pattern, LAYOUT,
                             args.overwrite)
  sample = settings_lib.preflight(settings)
  with output:
    staging = output.staging_dir
    with progress.reporting('preprocess', 'written', args.progress_seconds,
                            progress.estimate_records(settings.input, sample),
                            passes=2):
      jobs.run_pipeline(pipeline_args, lambda pipeline: build_pipeline(
          pipeline, settings, staging), args.stall_seconds,
                        args.progress_seconds)
    tally = records.pop_tally(staging)
    tally.reconcile()
    if tally.read and not tally.written.get(raw.TRAIN):
      raise cli.JobError(
          f'no record reached the train split ({tally.rejected} of '
          f'{tally.read} rejected: {tally.rejected_by_reason})')
    grouped_by = settings.grouping.describe()
    if grouped_by and tally.ungrouped and not sum(tally.groups.values()):
      # Every record split by its text, as if the flag were not given.
      raise cli.JobError(
          f'{grouped_by} gave none of the {tally.ungrouped} records it was '
          'to split a group (an empty or missing field, an id the pattern '
          'does not match): check the field or the pattern')
    rejections.check_budget(tally, settings.max_rejected_fraction,
                            settings.input, settings.read_config, output)
    splits.check_label_columns(tally.labels.get(raw.TRAIN, {}))
    stats = stats_lib.summarize(tally, staging, settings.params.max_len,
                                grouped_by)
    if stats_lib.token_vocabulary_is_empty(staging):
      raise cli.JobError(
          f'the token vocabulary is empty: no token of the train split is '
          f'seen --min_frequency={settings.params.min_frequency} times or '
          'more; every example would be out-of-vocabulary ids')
    stats_lib.write_sidecars(staging, stats, settings, args.input)
    output.publish()
  stats_lib.log_summary(stats, time.time() - started, args.output_dir)
  stats_lib.log_unused_test_fraction(tally, args.test_fraction)
  tally.check_complete(settings.read_config.allow_corrupt_files)
  return stats


def main():
  """The console script's entry point."""
  cli.main(run)


if __name__ == '__main__':
  main()
