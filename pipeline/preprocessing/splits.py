"""Routing each record: to train, validation or test, or to the dead
letters; the split the data names, else a hash of the record's group (a
movie, a thread, a sender: --group_field, --group_pattern) or of its text."""
import collections
import dataclasses
import functools
import hashlib
import re
from typing import Dict, Optional, Tuple

import apache_beam as beam
from apache_beam import pvalue
import numpy as np

import cli
from pipeline import records
from schemas import raw
from schemas import rejected
from schemas import scored
from schemas import transformed

NAMESPACE = 'preprocess'

# What chose a record's split (records.CHOSEN), as stats.json names it.
BY_DATA = transformed.CHOSEN_BY_DATA
BY_GROUP = transformed.CHOSEN_BY_GROUP
BY_TEXT = transformed.CHOSEN_BY_TEXT
# ValidateAndSplit's output of (split, digest bucket), group digest pairs.
GROUP_DIGESTS = 'group_digests'
# Groups are counted by 8-byte digests: a chance of about n^2 / 2^65 that two
# groups count as one, nil for any corpus; 256 buckets spread the count.
_GROUP_DIGEST_BYTES = 8
_GROUP_BUCKETS = 256


def _share(key: bytes) -> float:
  """A stable share in [0, 1) from a key's SHA-256."""
  return int.from_bytes(hashlib.sha256(key).digest()[:8], 'big') / 2.0**64


def _split_of_share(share: float, test_fraction: float,
                    validation_fraction: float) -> str:
  if share < test_fraction:
    return raw.TEST
  if share < test_fraction + validation_fraction * (1.0 - test_fraction):
    return raw.VALIDATION
  return raw.TRAIN


def hash_split(text: str, test_fraction: float, validation_fraction: float,
               group: Optional[str] = None) -> str:
  """Train, validation or test from the text alone (or from its ``group``,
  when it has one): stable across runs and runners, and the same for every
  copy of a text (up to case and spacing) and every record of a group.

  The hash is a share h in [0, 1), cut into disjoint ranges:
  test is [0, t); validation is the first v of the rest,
  [t, t + v (1 - t)); train is what is left. A record the data sends to
  train is carved with t = 0: validation is [0, v) of the train records.
  """
  if group:
    # The group as it is: two groups differing in case are two groups.
    key = b'group:' + group.encode('utf-8', 'surrogatepass')
  else:
    key = ' '.join(text.casefold().split()).encode('utf-8', 'replace')
  return _split_of_share(_share(key), test_fraction, validation_fraction)


def assign_split(text: str, named: Optional[str], test_fraction: float,
                 validation_fraction: float,
                 group: Optional[str] = None) -> Optional[str]:
  """The split of a record whose data names split ``named`` (None: none);
  None for a name that is no split. Train records give validation its
  share, by their group where they have one; the others keep the split the
  data gave them."""
  if not named:
    return hash_split(text, test_fraction, validation_fraction, group)
  split = raw.SPLIT_ALIASES.get(named.strip().lower())
  if split == raw.TRAIN:
    return hash_split(text, 0.0, validation_fraction, group)
  return split


@dataclasses.dataclass(frozen=True)
class Grouping:
  """Where a record's group comes from: ``field`` (raw.GROUP, read by the
  readers), else the id; ``pattern`` takes the group out of that value."""
  field: Optional[str] = None
  pattern: Optional[str] = None

  def __bool__(self) -> bool:
    return bool(self.field or self.pattern)

  def describe(self) -> Optional[str]:
    """The flags, as the stats and the report name them; None: no group."""
    named = [f'--group_field={self.field}'] if self.field else []
    named += [f'--group_pattern={self.pattern}'] if self.pattern else []
    return ' '.join(named) or None

  def group_of(self, record: Dict) -> Optional[str]:
    """The record's group; None (the text hash decides) when it has none or
    the pattern does not match."""
    if not self:
      return None
    value = record.get(raw.GROUP) if self.field else record.get(raw.ID)
    if not value or not self.pattern:
      return value or None
    return raw.group_from(value, _compiled(self.pattern))


@functools.lru_cache(maxsize=None)
def _compiled(pattern: str) -> 're.Pattern':
  return re.compile(pattern)


@dataclasses.dataclass(frozen=True)
class Routing:
  """How records are checked and sent to their split."""
  max_text_bytes: int
  test_fraction: float
  validation_fraction: float
  split_required: bool  # the data names each record's split
  grouping: Grouping = Grouping()

  def decide(self, record: Dict) -> Tuple[Optional[str], Optional[str], str,
                                          Optional[str]]:
    """(split, None, what chose it, group), or (None, why it is rejected,
    '', None)."""
    reason = records.check_record(record, self.max_text_bytes,
                                  require_label=True)
    if reason:
      return None, reason, '', None
    value = record.get(raw.SPLIT)
    if not value and self.split_required:
      return None, rejected.MISSING_SPLIT, '', None
    named = raw.SPLIT_ALIASES.get(value.strip().lower()) if value else None
    if named in raw.HELD_OUT:
      return named, None, BY_DATA, None
    group = self.grouping.group_of(record)
    split = assign_split(record[raw.TEXT], value, self.test_fraction,
                         self.validation_fraction, group)
    if not split:
      return None, rejected.UNKNOWN_SPLIT, '', None
    return split, None, BY_GROUP if group else BY_TEXT, group

  def route(self, record: Dict) -> Tuple[Optional[str], Optional[str]]:
    """(The record's split, None), or (None, why it is rejected):
    ValidateAndSplit's choice, and the launcher's before the pipeline."""
    return self.decide(record)[:2]


def _group_digest(split: str, group: str):
  digest = hashlib.blake2b(group.encode('utf-8', 'surrogatepass'),
                           digest_size=_GROUP_DIGEST_BYTES).digest()
  return (split, digest[0] % _GROUP_BUCKETS), digest


class ValidateAndSplit(records.CountingDoFn):
  """Routes each raw record to train, validation, test or the dead
  letters; counts what chose each split, and sends the digest of each
  record's group, if any, to GROUP_DIGESTS."""

  def __init__(self, routing: Routing, metered: bool = True):
    super().__init__(NAMESPACE, metered)
    self._routing = routing

  def process(self, record):
    self.count_read((record,))
    split, reason, chosen_by, group = self._routing.decide(record)
    if reason:
      yield self.reject(record, reason)
      return
    if split == raw.TRAIN:
      self.count_label(raw.TRAIN, record[raw.LABEL])
    self._counts[(records.CHOSEN, split, chosen_by)] += 1
    if chosen_by == BY_TEXT and self._routing.grouping:
      # A wrong --group_pattern shows as a count of these on the runner.
      self._counts[(records.UNGROUPED,)] += 1
      self._meter((records.UNGROUPED,), 1)
    if group and self._metered:
      yield pvalue.TaggedOutput(GROUP_DIGESTS, _group_digest(split, group))
    yield pvalue.TaggedOutput(split, record)


class _DistinctDigests(records.PackedDigests):
  """Group digests, packed -> how many are distinct."""

  def extract_output(self, accumulator):
    return len(np.unique(np.frombuffer(bytes(accumulator), np.uint64)))


class CountGroups(beam.PTransform):
  """GROUP_DIGESTS -> count dicts of the distinct groups of each split, for
  WriteCounts: a group lies in one bucket, so the buckets' counts add up.
  The launcher never holds the groups; the workers hold 8 bytes a record."""

  def expand(self, digests):
    return (digests
            | 'DistinctPerBucket' >> beam.CombinePerKey(_DistinctDigests())
            | 'GroupCounts' >> beam.MapTuple(
                lambda key, count: {(records.GROUPS, key[0]): count}))


class RejectUnknownLabels(records.CountingDoFn):
  """Held-out records whose label never occurs in train go to the dead
  letters."""

  def __init__(self, split: str):
    super().__init__(NAMESPACE)
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


