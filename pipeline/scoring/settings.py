"""The scoring job's flags, checked before anything runs, as ``Settings``."""
import dataclasses
import posixpath
import re
from typing import Dict, List, Tuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
import pyarrow as pa
import pyarrow.parquet as pq

import cli
from pipeline import outputs
from pipeline import readers
from pipeline import rejections
from pipeline.scoring import inference
from pipeline.scoring import kept_fields
from pipeline.scoring import rows
from schemas import raw
from schemas import scored
from serving import drift
from serving import exports
from serving import length_groups


# A hive-style partition folder, key=value, in the characters every reader
# of the output (pyarrow, pandas, DuckDB, Spark, BigQuery) takes as they are:
# no second '=', no '%' escapes, no wildcards or spaces, and a value that
# starts with a letter or digit, so never hidden, never Hive's null
# (__HIVE_DEFAULT_PARTITION__) and never a name a partition holds.
_PARTITION_SEGMENT = re.compile(
    r'(?P<key>[A-Za-z][A-Za-z0-9_]*)=(?P<value>[A-Za-z0-9][A-Za-z0-9._+-]*)')


def check_partition(partition: str) -> str:
  """The partition as a relative path; ValueError unless every folder of it
  is ``key=value`` in the characters every reader takes as they are
  (``_PARTITION_SEGMENT``): an empty one would be the whole output, a
  segment without a key (``dt=2026/11/25``) a folder readers skip or take
  for another key's value."""
  segments = partition.strip('/').split('/')
  keys = []
  for segment in segments:
    match = _PARTITION_SEGMENT.fullmatch(segment)
    if not match:
      raise ValueError(
          f'bad --partition {partition!r}: each folder must be key=value, '
          'such as dt=2026-11-21 or dt=2026-11-21/hour=03 (a key of letters, '
          'digits and _; a value of letters, digits and . _ + -, starting '
          'with a letter or digit)')
    keys.append(match.group('key').lower())
  if len(set(keys)) != len(keys):
    raise ValueError(f'bad --partition {partition!r}: a key appears twice')
  return '/'.join(segments)


def finished_outputs(output_dir: str) -> List[str]:
  """The folders under the output root that hold a finished output (a
  success marker), sorted, by path relative to the root ('' the root)."""
  markers = FileSystems.match([posixpath.join(
      output_dir, '**', outputs.SUCCESS_MARKER)])[0].metadata_list
  return sorted(posixpath.dirname(posixpath.relpath(marker.path, output_dir))
                for marker in markers)


def check_partition_layout(output_dir: str, partition: str,
                           finished: List[str]) -> None:
  """ValueError when the output root holds finished outputs (``finished``)
  of another layout than ``partition``'s: an unpartitioned output, or
  partitions of other keys (dt=… beside dt=…/hour=…), which hive-style
  readers (DuckDB, Spark) refuse to read together."""
  if not partition:
    return
  if FileSystems.exists(posixpath.join(output_dir, outputs.SUCCESS_MARKER)):
    raise ValueError(f'{output_dir} is an output without partitions; a '
                     f'--partition={partition} beside it would mix layouts')
  wanted = partition_keys(partition)
  for existing in finished:
    if partition_keys(existing) != wanted:
      raise ValueError(
          f'{output_dir} holds partitions such as {existing}, keyed '
          f'{"/".join(partition_keys(existing)) or "otherwise"}; '
          f'--partition={partition} (keyed {"/".join(wanted) or "otherwise"})'
          ' would mix layouts that hive-style readers cannot read together')


def _columns(schema: pa.Schema) -> List[str]:
  return [f'{field.name} {field.type}' for field in schema]


def check_sibling_schemas(output_dir: str, partition: str,
                          finished: List[str], schema: pa.Schema) -> None:
  """ValueError when a partition among ``finished`` beside ``partition``
  has other columns than ``schema`` (a model with another label set, other
  kept fields): readers of the root (pyarrow.dataset, pandas, DuckDB) take
  one partition's columns for all and drop or refuse the others'."""
  if not partition:
    return
  for existing in finished:
    if existing == partition:
      continue  # the partition this run replaces
    folder = posixpath.join(output_dir, existing)
    parts = FileSystems.match([posixpath.join(folder, scored.FILE_PATTERN)],
                              [1])[0].metadata_list
    if not parts:
      continue
    with FileSystems.open(parts[0].path,
                          compression_type=CompressionTypes.UNCOMPRESSED
                          ) as handle:
      found = pq.read_schema(handle)
    if found.remove_metadata().equals(schema.remove_metadata()):
      continue
    ours, theirs = _columns(schema), _columns(found)
    difference = '; '.join(
        f'{what}: {", ".join(columns)}' for what, columns in (
            ('this run adds', [c for c in ours if c not in theirs]),
            ('it has, this run does not', [c for c in theirs
                                           if c not in ours]))
        if columns) or 'the same columns in another order'
    raise ValueError(
        f'the partition {existing} beside '
        f'--partition={partition} has other columns ({difference}), and '
        'readers of the root take one partition\'s columns for all: pass '
        '--allow_schema_change to write it all the same, and read the root '
        'as docs/operations.md, "Partitions of different columns", says, or '
        'score into another --output_dir')


def check_beside(settings: 'Settings', allow_schema_change: bool) -> None:
  """The partitions beside this run's, checked again just before it
  publishes (a JobError): another run into the same root may have
  published a partition of another layout or other columns since the
  checks at launch."""
  try:
    finished = finished_outputs(settings.output_dir)
    check_partition_layout(settings.output_dir, settings.partition, finished)
    if not allow_schema_change:
      check_sibling_schemas(settings.output_dir, settings.partition,
                            finished, settings.schema)
  except ValueError as error:
    raise cli.JobError(f'{error}; nothing was published') from error


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
  # Column names compare without case, as SQL engines compare them.
  columns = [column.casefold() for _, column in pairs]
  doubled = sorted({column for column in columns if columns.count(column) > 1})
  if doubled:
    raise ValueError(f'--keep_fields: two kept fields named {doubled[0]!r} '
                     '(column names compare without case)')
  return tuple(pairs)


def partition_keys(partition: str) -> Tuple[str, ...]:
  """The hive keys of a partition path: ('dt', 'hour') for
  dt=2026-11-21/hour=03; a segment without ``=`` names no key."""
  return tuple(segment.split('=', 1)[0] for segment in partition.split('/')
               if '=' in segment)


def check_kept_columns(kept: KeptColumns, label_names,
                       partition: str) -> None:
  """ValueError, suggesting a rename, for a kept field that would take the
  name of a column the job writes, or of a partition key (which hive-style
  readers add as a column), compared without case."""
  taken = {name.casefold(): name for name in (
      *scored.output_columns(label_names), *partition_keys(partition))}
  for field, column in kept:
    if column.casefold() in taken:
      name = taken[column.casefold()]
      rename = _RENAMES.get(name, f'input_{column}')
      raise ValueError(
          f'kept field {column!r} takes the name of the output column '
          f'{name!r} (column names compare without case); keep it under '
          f'another name: use --keep_fields={field}:{rename}')


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
  max_rejected_fraction: float

  @property
  def label_names(self):
    return self.metadata['label_names']

  @property
  def schema(self) -> pa.Schema:
    """The Parquet files' columns."""
    return scored.arrow_schema(self.label_names, self.kept_schema)

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
    partition = ('' if args.partition is None else
                 check_partition(args.partition))
    finished = finished_outputs(args.output_dir)
    check_partition_layout(args.output_dir, partition, finished)
    kept = parse_keep_fields(args.keep_fields)
    pattern, fmt = readers.resolve_input(args.input, args.format)
    config = readers.read_config_from_args(
        args, format=fmt, label_field=None,
        keep_fields=tuple(dict.fromkeys(field for field, _ in kept)))
    export_dir = exports.resolve(args.model_dir)
    metadata = exports.load_metadata(export_dir)
    if 'version' not in metadata:
      raise ValueError(f'{export_dir} has no version in its metadata: an '
                       'export the trainer never finished')
    check_kept_columns(kept, metadata['label_names'], partition)
    by_field = kept_fields.schema(pattern, config)
    kept_schema = pa.schema([by_field.field(field).with_name(column)
                             for field, column in kept])
    # Fails here, before the pipeline, on labels that would give clashing
    # Parquet columns.
    schema = scored.arrow_schema(metadata['label_names'], kept_schema)
    if not args.allow_schema_change:
      check_sibling_schemas(args.output_dir, partition, finished, schema)
  except (ValueError, exports.ExportError) as error:  # ReaderError is one
    raise cli.JobError(str(error)) from error
  return Settings(args.output_dir, partition, pattern, config, kept,
                  kept_schema, export_dir, metadata, args.batch_size,
                  args.parquet_codec, args.max_rejected_fraction)


def preflight(settings: Settings) -> List[Dict]:
  """Before any worker starts: loads the export (to fail on one that cannot
  be), reads the input's first records as the pipeline will, and scores the
  acceptable ones; a JobError when none is acceptable, a ModelFailure when
  the model fails on each. Returns the acceptable ones."""
  # In a local runner's process this load starts TensorFlow's runtime, and
  # with it the threading the model handler sets in every worker.
  length_groups.run_ops_on_callers_threads()
  try:
    signature, _ = exports.load(settings.export_dir)
  except exports.ExportError as error:
    raise cli.JobError(str(error)) from error
  accepted = rejections.preflight(
      settings.pattern, settings.read_config, lambda record: rows.reason_of(
          record, settings.read_config.max_text_bytes, settings.kept_types))
  inference.check_model(signature, [record[raw.TEXT] for record in accepted])
  return accepted


