"""The first records of an input, read on the launcher: what a job checks
before it starts a pipeline, and what it learns of the input's fields."""
import dataclasses
import itertools
from typing import Dict, List

from pipeline.readers import config as config_lib
from pipeline.readers import documents
from pipeline.readers import matching
from pipeline.readers import ranges
from pipeline.readers import sources

# Files a sample looks into for its records: an input of many empty files
# is not read whole on the launcher.
_SAMPLE_FILES = 20


def sample(matched: config_lib.Input, config: config_lib.ReadConfig,
           count: int) -> List[Dict]:
  """Up to ``count`` raw records from the first regular files the input
  matched (in sorted order), parsed and checked as the jobs' readers do;
  each one read from a row of named fields lists them (raw.FIELDS)."""
  config = dataclasses.replace(config, list_fields=True)
  found = []
  regular = [entry for entry in matched.entries if not entry.problem]
  for entry in regular[:_SAMPLE_FILES]:
    found.extend(itertools.islice(_records(entry, config), count - len(found)))
    if len(found) >= count:
      break
  return found


def sample_covers(matched: config_lib.Input) -> bool:
  """Whether ``sample`` reads every file of the input when it finds too
  few records: an empty sample then means an empty input."""
  return len(matched.files) <= _SAMPLE_FILES


def _records(entry: matching.Entry, config: config_lib.ReadConfig):
  if config.format in ('files', 'email'):
    yield documents.read_document(entry.path, config, config.format == 'email')
  elif entry.size:  # the pipeline reads no empty file either
    yield from ranges.read(ranges.FileRange(entry.path, size=entry.size),
                           sources.source_factory(config.format, config))
