"""The first records of an input, read on the launcher: what a job checks
before it starts a pipeline, and what it learns of the input's fields."""
import itertools
from typing import Dict, List

from apache_beam.io.filesystems import FileSystems

from pipeline.readers import config as config_lib
from pipeline.readers import documents
from pipeline.readers import sources

# Files a sample looks into for its records: an input of many empty files
# is not read whole on the launcher.
_SAMPLE_FILES = 20


def sample(pattern: str, config: config_lib.ReadConfig,
           count: int) -> List[Dict]:
  """Up to ``count`` raw records from the first files ``pattern`` matches
  (in their listed order), parsed and checked as the jobs' readers do."""
  paths = [m.path for m in FileSystems.match([pattern])[0].metadata_list]
  found = []
  for path in sorted(paths)[:_SAMPLE_FILES]:
    found.extend(itertools.islice(_records(path, config), count - len(found)))
    if len(found) >= count:
      break
  return found


def sample_covers(pattern: str) -> bool:
  """Whether ``sample`` reads every file of ``pattern`` when it finds too
  few records: an empty sample then means an empty input."""
  return len(FileSystems.match([pattern])[0].metadata_list) <= _SAMPLE_FILES


def _records(path: str, config: config_lib.ReadConfig):
  if config.format in ('files', 'email'):
    yield documents.read_document(path, config, config.format == 'email')
    return
  source = sources.source_factory(config.format, config)(path)
  yield from source.read(source.get_range_tracker(None, None))
