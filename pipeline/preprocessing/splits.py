"""Routing each record: to train, validation or test, or to the dead
letters."""
import collections
import dataclasses
import hashlib
from typing import Dict, Optional, Tuple

from apache_beam import pvalue

import cli
from pipeline import records
from schemas import raw
from schemas import rejected
from schemas import scored

NAMESPACE = 'preprocess'


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


@dataclasses.dataclass(frozen=True)
class Routing:
  """How records are checked and sent to their split."""
  max_text_bytes: int
  test_fraction: float
  validation_fraction: float
  split_required: bool  # the data names each record's split

  def route(self, record: Dict) -> Tuple[Optional[str], Optional[str]]:
    """(The record's split, None), or (None, why it is rejected):
    ValidateAndSplit's choice, and the launcher's before the pipeline."""
    reason = records.check_record(record, self.max_text_bytes,
                                  require_label=True)
    if reason:
      return None, reason
    value = record.get(raw.SPLIT)
    if not value and self.split_required:
      return None, rejected.MISSING_SPLIT
    split = assign_split(record[raw.TEXT], value, self.test_fraction,
                         self.validation_fraction)
    return (split, None) if split else (None, rejected.UNKNOWN_SPLIT)


class ValidateAndSplit(records.CountingDoFn):
  """Routes each raw record to train, validation, test or the dead
  letters."""

  def __init__(self, routing: Routing, metered: bool = True):
    super().__init__(NAMESPACE, metered)
    self._routing = routing

  def process(self, record):
    self.count_read(record)
    split, reason = self._routing.route(record)
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


