"""The scoring job's flags, checked before anything runs, as ``Settings``."""
import dataclasses
from typing import Dict, List, NamedTuple, Optional, Tuple

import pyarrow as pa

import cli
from outputs import partitions
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


def check_kept_columns(kept: KeptColumns, label_names,
                       partition: str) -> None:
  """ValueError, suggesting a rename, for a kept field that would take the
  name of a column the job writes, or of a partition key (which hive-style
  readers add as a column), compared without case."""
  taken = {name.casefold(): name for name in (
      *scored.output_columns(label_names), *partitions.keys(partition))}
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
  input: readers.Input
  read_config: readers.ReadConfig
  kept: KeptColumns      # --keep_fields
  kept_schema: pa.Schema  # their output columns, with the input's types
  export_dir: str
  chosen: exports.Chosen  # why export_dir: as asked, the newest blessed
  metadata: exports.ExportMetadata
  batch_size: int
  codec: str
  max_rejected_fraction: float
  allow_schema_change: bool

  @property
  def pattern(self) -> str:
    return self.input.pattern

  @property
  def label_names(self) -> List[str]:
    return list(self.metadata.label_names)

  @property
  def schema(self) -> pa.Schema:
    """The Parquet files' columns."""
    return scored.arrow_schema(self.label_names, self.kept_schema)

  @property
  def sibling_schema(self) -> Optional[pa.Schema]:
    """The columns the partitions beside this run's must have; None where
    they may differ (--allow_schema_change)."""
    return None if self.allow_schema_change else self.schema

  @property
  def confidence_edges(self):
    """The reference's confidence bins, the default ones without it."""
    reference = self.metadata.reference
    return (reference['confidence_histogram']['edges'] if reference
            else drift.CONFIDENCE_EDGES)

  @property
  def kept_types(self):
    """(input field, Arrow type) of each kept field."""
    return [(field, arrow_field.type) for (field, _), arrow_field in zip(
        self.kept, self.kept_schema)]


def settings_from_args(args) -> Settings:
  """The flags checked and the export's metadata read before anything
  runs; a JobError names what is wrong. Where the output goes is checked
  when the job claims it (``outputs``)."""
  try:
    partition = ('' if args.partition is None else
                 partitions.checked(args.partition))
    kept = parse_keep_fields(args.keep_fields)
    matched = readers.resolve_input(args.input, args.format)
    config = readers.read_config_from_args(
        args, format=matched.format, label_field=None,
        keep_fields=tuple(dict.fromkeys(field for field, _ in kept)))
    chosen = exports.choose(args.model_dir)
    export_dir = chosen.folder
    metadata = exports.load_metadata(export_dir)
    if metadata.version is None:
      raise ValueError(f'{export_dir} has no version in its metadata: an '
                       'export the trainer never finished')
    check_kept_columns(kept, metadata.label_names, partition)
    by_field = kept_fields.schema(matched, config)
    kept_schema = pa.schema([by_field.field(field).with_name(column)
                             for field, column in kept])
    # Fails here, before the pipeline, on labels that would give clashing
    # Parquet columns.
    scored.arrow_schema(list(metadata.label_names), kept_schema)
  except (ValueError, exports.ExportError) as error:  # ReaderError is one
    raise cli.JobError(str(error)) from error
  return Settings(args.output_dir, partition, matched, config, kept,
                  kept_schema, export_dir, chosen, metadata, args.batch_size,
                  args.parquet_codec, args.max_rejected_fraction,
                  args.allow_schema_change)


class Preflight(NamedTuple):
  """What the checks before the pipeline read and loaded."""
  sample: List[Dict]  # the input's first acceptable records
  signature: object   # the export's, loaded and checked (``exports.load``)


def preflight(settings: Settings) -> Preflight:
  """Before any worker starts: loads the export's graph (to fail on one
  that cannot be, and on metadata that does not describe it), reads the
  input's first records as the pipeline will, and scores the acceptable
  ones; a JobError when none is acceptable, a ModelFailure when the model
  fails on each."""
  # In a local runner's process this load starts TensorFlow's runtime, and
  # with it the threading the model handler sets in every worker.
  length_groups.run_ops_on_callers_threads()
  try:
    signature, _ = exports.load(settings.export_dir, settings.metadata)
  except exports.ExportError as error:
    raise cli.JobError(str(error)) from error
  accepted = rejections.preflight(
      settings.input, settings.read_config, lambda record: rows.reason_of(
          record, settings.read_config.max_text_bytes, settings.kept_types))
  inference.check_model(signature, [record[raw.TEXT] for record in accepted])
  return Preflight(accepted, signature)
