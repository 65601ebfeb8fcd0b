"""What every Beam job does with raw records besides its real work.

Checking a record, sending a bad one to the dead letters, and counting: the
counts are kept per bundle and summed once into a small file the launcher
reads back, so that a job can check read = written + rejected on any runner,
and the same numbers appear as Beam metrics on the runner's UI.
"""
import collections
import dataclasses
import hashlib
import json
import logging
import posixpath
import re
from typing import Dict, List, Optional, Sequence
import unicodedata

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows
import numpy as np

import cli
from pipeline import filesystems
from pipeline import progress
from schemas import raw
from schemas import rejected

# Output tags of a CountingDoFn besides its main output.
REJECTED = 'rejected'
STATS = 'stats'
_COUNTS_FILE = '_counts'
# Unicode categories no label may contain: control characters (newline, tab,
# NUL...), lone surrogates, and line and paragraph separators.
_BAD_LABEL_CATEGORIES = ('Cc', 'Cs', 'Zl', 'Zp')


def is_bad_label(label: str) -> bool:
  """A label that TFT's label vocabulary or a later reader could mangle.

  TFT's vocabulary files are newline-delimited: TFT leaves out of them any
  value with a newline, whose examples then carry label_id -1 and make the
  loss nan. Other control characters and surrounding whitespace make labels
  that look the same and are not.
  """
  return label != label.strip() or any(
      unicodedata.category(char) in _BAD_LABEL_CATEGORIES for char in label)


_HTML_TAG = re.compile(raw.HTML_TAG)


def has_visible_text(text: str) -> bool:
  """Whether anything is left once normalization removes HTML tags: a
  document of only ``<br />`` or zero-width characters would be scored as
  an empty one, with the same answer whatever it was."""
  stripped = text.lstrip()
  if stripped and stripped[0] != '<' and unicodedata.category(
      stripped[0]) != 'Cf':
    return True  # what most texts start with: a visible character
  return any(not char.isspace() and unicodedata.category(char) != 'Cf'
             for char in _HTML_TAG.sub(' ', text))


def check_record(record: Dict, max_text_bytes: int,
                 require_label: bool) -> Optional[str]:
  """The reason a raw record cannot be used, or None when it can."""
  if record.get(raw.REASON):
    return record[raw.REASON]
  text = record[raw.TEXT]
  if not text.strip():
    return rejected.EMPTY_TEXT
  # A character is at most 4 bytes of UTF-8: most texts fit without being
  # encoded to find out.
  if len(text) > max_text_bytes or (len(text) * 4 > max_text_bytes and len(
      text.encode('utf-8', 'replace')) > max_text_bytes):
    return rejected.TEXT_TOO_LONG
  if not has_visible_text(text):
    return rejected.EMPTY_TEXT
  if require_label:
    label = record.get(raw.LABEL) or ''
    if not label.strip():
      return rejected.MISSING_LABEL
    if is_bad_label(label):
      return rejected.BAD_LABEL
  return None


def dead_letter(record: Dict, reason: str) -> Dict:
  """The dead-letter form of any record, good or bad: its snippet the raw
  record's start where it could not be read, else its text's, after its
  label where the reason is about the label (a newline or a tab in it
  shown as one, not as what it does)."""
  snippet = record.get(raw.SNIPPET)
  if snippet is None:
    snippet = record.get(raw.TEXT) or ''
    if reason in rejected.ABOUT_THE_LABEL:
      label = json.dumps(record.get(raw.LABEL), ensure_ascii=False)
      snippet = f'label {label}: {snippet}'
    snippet = snippet[:rejected.SNIPPET_CHARS]
  return {rejected.ID: record.get(raw.ID), rejected.SOURCE: record.get(
      raw.SOURCE), rejected.REASON: reason, rejected.SNIPPET: snippet}


# Count kinds: the first item of every count key.
READ, WRITTEN, REJECTED_KIND, LABEL, LENGTH, DUPLICATE, BIN = (
    'read', 'written', 'rejected', 'label', 'length', 'duplicate', 'bin')
# Records whose id field held no usable id (raw.ID_REPLACED).
IDS_REPLACED = 'ids_replaced'
# The preprocessing job's splits: records by split and by what chose it;
# records a group flag left without a group; distinct groups by split.
CHOSEN, UNGROUPED, GROUPS = 'chosen', 'ungrouped', 'groups'
# Kinds in the progress line; labels and lengths are stats, not progress.
_PROGRESS_KINDS = {READ: progress.READ, WRITTEN: progress.WRITTEN,
                   REJECTED_KIND: progress.REJECTED}
# Reasons for input files the job could not read whole.
_INCOMPLETE_FILE_REASONS = (rejected.CORRUPT_FILE, rejected.UNREADABLE_FILE)


class CountingDoFn(beam.DoFn):
  """Counts per bundle and emits the counts once, at the bundle's end.

  What it reads, writes and rejects also goes to Beam counters and to the
  process's progress line (``pipeline.progress``) every
  ``progress.FLUSH_EVERY`` records and at the bundle's end: not once an
  element, which matters at tens of thousands of elements a second. A pass
  that only learns from records another pass counts is not ``metered``: its
  counters would show each record twice.
  """

  def __init__(self, namespace: str, metered: bool = True):
    self._namespace = namespace
    self._metered = metered

  def start_bundle(self):
    self._counts = collections.Counter()
    self._unreported = collections.Counter()
    self._unreported_records = 0

  def finish_bundle(self):
    self._report()
    if self._counts:
      yield pvalue.TaggedOutput(
          STATS, GlobalWindows.windowed_value(dict(self._counts)))

  def _meter(self, key: tuple, count: int) -> None:
    if not self._metered and key[0] != READ:
      return
    self._unreported[key] += count
    self._unreported_records += count
    if self._unreported_records >= progress.FLUSH_EVERY:
      self._report()

  def _report(self) -> None:
    if not self._unreported:
      return
    by_kind = collections.Counter()
    for key, count in self._unreported.items():
      if not self._metered:  # a first pass's reads: progress, not counters
        by_kind[progress.LEARNT] += count
        continue
      Metrics.counter(self._namespace, '_'.join(map(str, key))).inc(count)
      if key[0] in _PROGRESS_KINDS:
        by_kind[_PROGRESS_KINDS[key[0]]] += count
    progress.report(by_kind)
    self._unreported.clear()
    self._unreported_records = 0

  def count_read(self, records: Sequence[Dict]):
    """Counts ``records`` read: a chunk, or one record in a tuple."""
    replaced = sum(1 for record in records if record.get(raw.ID_REPLACED))
    for key, count in (((READ,), len(records)), ((IDS_REPLACED,), replaced)):
      if count:
        self._counts[key] += count
        self._meter(key, count)

  def count_written(self, count: int = 1, output: Optional[str] = None):
    """``count`` records written to ``output`` (a split), or to the job's
    one output."""
    key = (WRITTEN, output) if output else (WRITTEN,)
    self._counts[key] += count
    self._meter(key, count)

  def count_label(self, split: str, label: str, count: int = 1):
    self._counts[(LABEL, split, label)] += count

  def count_bin(self, histogram: str, index: int, count: int = 1):
    """``count`` records in bin ``index`` of the histogram named
    ``histogram``."""
    self._counts[(BIN, histogram, index)] += count

  def count_lengths(self, lengths: Dict[int, int]):
    for length, count in lengths.items():
      self._counts[(LENGTH, length)] += count

  def reject(self, record: Dict, reason: str):
    """Counts a rejection; the dead letter, for the REJECTED output."""
    self._counts[(REJECTED_KIND, reason)] += 1
    self._meter((REJECTED_KIND, reason), 1)
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


# Ids are compared by 128-bit BLAKE2 digests: two different ids share one
# with a chance of about n^2 / 2^129, nil for any corpus.
_DIGEST_BYTES = 16
# Digests are combined per bucket (their first byte), so that a distributed
# runner spreads the work.
_DIGEST_BUCKETS = 256


def _bucketed_digest(record_id: str):
  digest = hashlib.blake2b(record_id.encode('utf-8', 'surrogatepass'),
                           digest_size=_DIGEST_BYTES).digest()
  return digest[0] % _DIGEST_BUCKETS, digest


class PackedDigests(beam.CombineFn):
  """Digests packed end to end in one bytearray: a few bytes a record
  however many records, where a list of bytes objects costs tens each.
  Subclasses read the packed digests in ``extract_output``."""

  def create_accumulator(self):
    return bytearray()

  def add_input(self, accumulator, digest):
    accumulator += digest
    return accumulator

  def merge_accumulators(self, accumulators):
    merged = bytearray()
    for accumulator in accumulators:
      merged += accumulator
    return merged


class _RepeatedDigests(PackedDigests):
  """Digests, packed 16 bytes each -> the count dict of those seen more than
  once."""

  def extract_output(self, accumulator):
    digests = np.frombuffer(bytes(accumulator), np.uint64).reshape(
        -1, _DIGEST_BYTES // 8)
    counts = np.unique(digests, axis=0, return_counts=True)[1]
    repeated = counts[counts > 1]
    return {(DUPLICATE, 'ids'): len(repeated),
            (DUPLICATE, 'rows'): int(repeated.sum()) - len(repeated)}


class _PackDigests(beam.DoFn):
  """Chunks of records -> (bucket, their ids' digests packed), a pair a
  bucket a bundle: one Beam element a bucket, not a Map's and a combine's
  an id, which the scoring job paid for every document (BENCHMARKS.md,
  issue 21)."""

  def start_bundle(self):
    self._buckets = collections.defaultdict(bytearray)

  def process(self, chunk):
    for record in chunk:
      bucket, digest = _bucketed_digest(record[raw.ID])
      self._buckets[bucket] += digest

  def finish_bundle(self):
    for bucket, packed in self._buckets.items():
      yield GlobalWindows.windowed_value((bucket, packed))


class CountDuplicateIds(beam.PTransform):
  """Chunks of records (``ReadRecords(chunked=True)``) -> the count dicts
  of the ids seen more than once (Tally's duplicate_ids and duplicate_rows),
  for WriteCounts.

  Counting happens on the workers, as a combine per digest bucket: the
  launcher never holds the ids. A combine per id would hold every id as a
  key, hundreds of bytes each, in a local runner's memory (BENCHMARKS.md);
  packed digests take 16 bytes an id.
  """

  def expand(self, records):
    # PackedDigests adds packed digests to its accumulator as it adds one.
    return (records
            | 'Digests' >> beam.ParDo(_PackDigests())
            | 'RepeatedPerBucket' >> beam.CombinePerKey(_RepeatedDigests())
            | 'DuplicateCounts' >> beam.Values())


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


@dataclasses.dataclass(frozen=True)
class Tally:
  """What a job's pipeline counted, summed over every bundle and worker."""
  read: int = 0
  # Records written, by output (split) name; '' for a job with one output.
  written: Dict[str, int] = dataclasses.field(default_factory=dict)
  rejected_by_reason: Dict[str, int] = dataclasses.field(default_factory=dict)
  # Records per label, by split.
  labels: Dict[str, Dict[str, int]] = dataclasses.field(default_factory=dict)
  # Documents per token length.
  lengths: Dict[int, int] = dataclasses.field(default_factory=dict)
  # Ids found in more than one record read, and the records beyond the
  # first of each (so read - duplicate_rows ids are distinct).
  duplicate_ids: int = 0
  duplicate_rows: int = 0
  # Records per bin, by histogram name.
  bins: Dict[str, Dict[int, int]] = dataclasses.field(default_factory=dict)
  # Records whose id field held no usable id, which got file:position ids.
  ids_replaced: int = 0
  # Records by split, by what chose the split (data, group, text).
  chosen: Dict[str, Dict[str, int]] = dataclasses.field(default_factory=dict)
  # Records whose split the text hash chose though a group was asked for.
  ungrouped: int = 0
  # Distinct groups by split.
  groups: Dict[str, int] = dataclasses.field(default_factory=dict)

  @property
  def total_written(self) -> int:
    return sum(self.written.values())

  @property
  def rejected(self) -> int:
    return sum(self.rejected_by_reason.values())

  def reconcile(self) -> None:
    """Every record read was written or rejected, once: else a JobError,
    and the output is not published."""
    if self.read != self.total_written + self.rejected:
      raise cli.JobError(
          f'counts do not reconcile: read {self.read}, written '
          f'{self.written}, rejected {self.rejected_by_reason}')

  def check_complete(self, allow_corrupt_files: bool) -> None:
    """After publishing: a warning when ids were replaced; an
    IncompleteInput when files were corrupt or unreadable, unless the user
    accepts that."""
    if self.ids_replaced:
      logging.warning(
          '%d records had an id field with no usable id (null, "", an '
          'object, an array, NaN...): their ids are file:position',
          self.ids_replaced)
    by_reason = {reason: self.rejected_by_reason[reason]
                 for reason in _INCOMPLETE_FILE_REASONS
                 if self.rejected_by_reason.get(reason)}
    if by_reason and not allow_corrupt_files:
      raise cli.IncompleteInput(
          f'{sum(by_reason.values())} input file(s) could not be read to the '
          'end; what was readable is published, each such file is a dead '
          f'letter ({", ".join(f"{n} {r}" for r, n in by_reason.items())}; '
          '--allow_corrupt_files makes this exit 0)')

  @classmethod
  def from_counts(cls, counts: List[list]) -> 'Tally':
    """From the rows WriteCounts wrote: the key's items, then the count."""
    fields = dict(read=0, written={}, rejected_by_reason={},
                  labels=collections.defaultdict(dict), lengths={},
                  duplicate_ids=0, duplicate_rows=0,
                  bins=collections.defaultdict(dict), ids_replaced=0,
                  chosen=collections.defaultdict(dict), ungrouped=0,
                  groups={})
    for *key, count in counts:
      kind, rest = key[0], key[1:]
      if kind == READ:
        fields['read'] += count
      elif kind == WRITTEN:
        fields['written'][rest[0] if rest else ''] = count
      elif kind == REJECTED_KIND:
        fields['rejected_by_reason'][rest[0]] = count
      elif kind == LABEL:
        fields['labels'][rest[0]][rest[1]] = count
      elif kind == LENGTH:
        fields['lengths'][int(rest[0])] = count
      elif kind == DUPLICATE:
        fields[f'duplicate_{rest[0]}'] = count
      elif kind == BIN:
        fields['bins'][rest[0]][int(rest[1])] = count
      elif kind == IDS_REPLACED:
        fields['ids_replaced'] = count
      elif kind == CHOSEN:
        fields['chosen'][rest[0]][rest[1]] = count
      elif kind == UNGROUPED:
        fields['ungrouped'] = count
      elif kind == GROUPS:
        fields['groups'][rest[0]] = count
    fields['rejected_by_reason'] = dict(
        sorted(fields['rejected_by_reason'].items()))
    fields['labels'] = {split: dict(sorted(by_label.items()))
                        for split, by_label in fields['labels'].items()}
    fields['bins'] = dict(fields['bins'])
    fields['chosen'] = dict(fields['chosen'])
    return cls(**fields)


def pop_tally(folder: str) -> Tally:
  """The counts WriteCounts wrote in ``folder``; the file is removed so that
  it never reaches a published output."""
  path = posixpath.join(folder, _COUNTS_FILE)
  counts = filesystems.read_json(path)
  FileSystems.delete([path])
  return Tally.from_counts(counts)


class WriteDeadLetters(beam.PTransform):
  """Writes dead letters as JSON lines in ``folder``; none, no file.

  Beam's S3 filesystem cannot write an empty file (a multipart upload of no
  part), so an empty shard would fail the job there.
  """

  def __init__(self, folder: str):
    super().__init__()
    self._folder = folder

  def expand(self, dead_letters):
    return (dead_letters
            | 'RejectedToJson' >> beam.Map(json.dumps, ensure_ascii=False)
            | 'WriteRejected' >> beam.io.WriteToText(
                posixpath.join(self._folder, rejected.FILE_PREFIX),
                file_name_suffix=rejected.FILE_SUFFIX, skip_if_empty=True))
