"""What every Beam job does with raw records besides its real work.

Checking a record, sending a bad one to the dead letters, and counting: the
counts are kept per bundle and summed once into a small file the launcher
reads back, so that a job can check read = written + rejected on any runner,
and the same numbers appear as Beam metrics on the runner's UI.
"""
import collections
import json
import posixpath
from typing import Dict, Optional

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from pipeline import outputs
from schemas import raw
from schemas import rejected

# Output tags of a CountingDoFn besides its main output.
REJECTED = 'rejected'
STATS = 'stats'
# Count kinds shown as Beam counters; the others (label, length) are stats.
_METERED = ('read', 'rejected', 'written', 'scored')
_COUNTS_FILE = '_counts'


def check_record(record: Dict, max_text_bytes: int,
                 require_label: bool) -> Optional[str]:
  """The reason a raw record cannot be used, or None when it can."""
  if record.get(raw.REASON):
    return record[raw.REASON]
  text = record[raw.TEXT]
  if not text.strip():
    return rejected.EMPTY_TEXT
  if len(text) > max_text_bytes or len(
      text.encode('utf-8', 'replace')) > max_text_bytes:
    return rejected.TEXT_TOO_LONG
  if require_label and not (record.get(raw.LABEL) or '').strip():
    return rejected.MISSING_LABEL
  return None


def dead_letter(record: Dict, reason: str) -> Dict:
  """The dead-letter form of any record, good or bad."""
  snippet = record.get(raw.SNIPPET)
  if snippet is None:
    snippet = (record.get(raw.TEXT) or '')[:rejected.SNIPPET_CHARS]
  return {rejected.ID: record.get(raw.ID), rejected.SOURCE: record.get(
      raw.SOURCE), rejected.REASON: reason, rejected.SNIPPET: snippet}


class CountingDoFn(beam.DoFn):
  """Counts per bundle and emits the counts once, at the bundle's end.

  Counts are keyed by tuples whose first item is the kind: ``('read',)``,
  ``('rejected', reason)``, ``('written', split)``... Beam counters are
  updated here too: once a bundle, not once an element, which matters at tens
  of thousands of elements a second.
  """

  def __init__(self, namespace: str):
    self._namespace = namespace

  def start_bundle(self):
    self._counts = collections.Counter()

  def finish_bundle(self):
    if self._counts:
      for key, count in self._counts.items():
        if key[0] in _METERED:
          Metrics.counter(self._namespace, '_'.join(key)).inc(count)
      yield pvalue.TaggedOutput(
          STATS, GlobalWindows.windowed_value(dict(self._counts)))

  def reject(self, record: Dict, reason: str):
    """Counts a rejection; the dead letter, for the REJECTED output."""
    self._counts[('rejected', reason)] += 1
    return pvalue.TaggedOutput(REJECTED, dead_letter(record, reason))


class SumCounts(beam.CombineFn):
  """Adds up the per-bundle count dicts."""

  def create_accumulator(self):
    return collections.Counter()

  def add_input(self, accumulator, counts):
    accumulator.update(counts)
    return accumulator

  def merge_accumulators(self, accumulators):
    total = collections.Counter()
    for accumulator in accumulators:
      total.update(accumulator)
    return total

  def extract_output(self, accumulator):
    return dict(accumulator)


def _counts_to_json(counts: Dict[tuple, int]) -> str:
  return json.dumps(sorted(list(key) + [count] for key, count in counts.items()))


class WriteCounts(beam.PTransform):
  """Sums a PCollection of count dicts into one file in ``folder``."""

  def __init__(self, folder: str):
    super().__init__()
    self._folder = folder

  def expand(self, counts):
    return (counts
            | 'SumCounts' >> beam.CombineGlobally(SumCounts())
            | 'CountsToJson' >> beam.Map(_counts_to_json)
            | 'WriteCounts' >> beam.io.WriteToText(
                posixpath.join(self._folder, _COUNTS_FILE), num_shards=1,
                shard_name_template=''))


def pop_counts(folder: str) -> Dict[str, Dict[tuple, int]]:
  """The counts WriteCounts wrote, by kind, then by the rest of their key;
  the file is removed so that it never reaches a published output."""
  path = posixpath.join(folder, _COUNTS_FILE)
  counts = outputs.read_json(path)
  FileSystems.delete([path])
  by_kind = collections.defaultdict(dict)
  for *key, count in counts:
    by_kind[key[0]][tuple(key[1:])] = count
  return by_kind


class WriteDeadLetters(beam.PTransform):
  """Writes dead letters as JSON lines in ``folder``."""

  def __init__(self, folder: str):
    super().__init__()
    self._folder = folder

  def expand(self, dead_letters):
    return (dead_letters
            | 'RejectedToJson' >> beam.Map(json.dumps, ensure_ascii=False)
            | 'WriteRejected' >> beam.io.WriteToText(
                posixpath.join(self._folder, 'rejected'),
                file_name_suffix='.jsonl'))
