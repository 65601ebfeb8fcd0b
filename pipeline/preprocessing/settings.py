"""The preprocessing job's flags, checked before anything runs, as
``Settings``."""
import dataclasses
from typing import Dict, List, Optional

import cli
from pipeline import readers
from pipeline import rejections
from pipeline import transform
from pipeline.preprocessing import splits


@dataclasses.dataclass(frozen=True)
class Settings:
  """The job's checked flags."""
  input: readers.Input
  read_config: readers.ReadConfig
  params: transform.TransformParams
  test_fraction: Optional[float]  # None: splits come from the data
  validation_fraction: float
  max_rejected_fraction: float
  group_pattern: Optional[str] = None

  @property
  def pattern(self) -> str:
    return self.input.pattern

  @property
  def grouping(self) -> splits.Grouping:
    return splits.Grouping(self.read_config.group_field, self.group_pattern)

  @property
  def routing(self) -> splits.Routing:
    return splits.Routing(self.read_config.max_text_bytes,
                          self.test_fraction or 0.0, self.validation_fraction,
                          split_required=bool(self.read_config.split_field),
                          grouping=self.grouping)


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
    matched = readers.resolve_input(args.input, args.format)
    check_fractions(args, matched.format)
    config = readers.read_config_from_args(
        args, format=matched.format, label_field=args.label_field or None,
        split_field=args.split_field, group_field=args.group_field or None)
    params = transform.TransformParams(
        vocab_size=args.vocab_size, min_frequency=args.min_frequency,
        max_len=args.max_len, max_token_chars=args.max_token_chars,
        truncation=args.truncation,
        keep_punctuation=not args.drop_punctuation)
  except ValueError as error:  # ReaderError is one
    raise cli.JobError(str(error)) from error
  return Settings(matched, config, params,
                  None if args.split_field else args.test_fraction,
                  args.validation_fraction, args.max_rejected_fraction,
                  args.group_pattern)


def preflight(settings: Settings) -> List[Dict]:
  """Before any worker starts: a JobError when none of the input's first
  records would be accepted; else those that would be."""
  return rejections.preflight(
      settings.input, settings.read_config,
      lambda record: settings.routing.route(record)[1])


