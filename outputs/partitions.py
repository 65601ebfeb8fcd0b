"""Partitions of an output root: their names, and the partitions beside
one that a run may not publish it next to.

Hive-style readers (pyarrow, pandas, DuckDB, Spark, BigQuery) read an
output root of ``key=value`` folders as one table, its keys as columns:
they refuse partitions of different keys side by side, and take one
partition's columns for all.
"""
import fnmatch
import posixpath
import re
from typing import List, Optional, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from outputs import ownership
from outputs.files import Files
from outputs.files import relative
from outputs.rules import OutputError
from schemas import scored

# A hive-style partition folder, key=value, in the characters every reader
# of the output (pyarrow, pandas, DuckDB, Spark, BigQuery) takes as they are:
# no second '=', no '%' escapes, no wildcards or spaces, and a value that
# starts with a letter or digit, so never hidden, never Hive's null
# (__HIVE_DEFAULT_PARTITION__) and never a name a partition holds.
_SEGMENT = re.compile(
    r'(?P<key>[A-Za-z][A-Za-z0-9_]*)=(?P<value>[A-Za-z0-9][A-Za-z0-9._+-]*)')


# The longest partition: its staging folder's name is the partition (its
# '/' as '~') with a 13-character run id, and '.old' where a publish moves
# it aside, within the 255 bytes a file name may hold (ASCII, as _SEGMENT
# allows, one byte a character).
MAX_CHARACTERS = 255 - 13 - len('.old')


def checked(partition: str) -> str:
  """The partition as a relative path; ValueError unless every folder of it
  is ``key=value`` in the characters every reader takes as they are
  (``_SEGMENT``): an empty one would be the whole output, a segment without
  a key (``dt=2026/11/25``) a folder readers skip or take for another key's
  value."""
  segments = partition.strip('/').split('/')
  keys = []
  for segment in segments:
    match = _SEGMENT.fullmatch(segment)
    if not match:
      raise ValueError(
          f'bad --partition {partition!r}: each folder must be key=value, '
          'such as dt=2026-11-21 or dt=2026-11-21/hour=03 (a key of letters, '
          'digits and _; a value of letters, digits and . _ + -, starting '
          'with a letter or digit)')
    keys.append(match.group('key').lower())
  if len(set(keys)) != len(keys):
    raise ValueError(f'bad --partition {partition!r}: a key appears twice')
  joined = '/'.join(segments)
  if len(joined) > MAX_CHARACTERS:
    raise ValueError(f'bad --partition: {len(joined)} characters, over the '
                     f'{MAX_CHARACTERS} its staging folder\'s name leaves')
  return joined


def keys(partition: str) -> Tuple[str, ...]:
  """The hive keys of a partition path: ('dt', 'hour') for
  dt=2026-11-21/hour=03; a segment without ``=`` names no key."""
  return tuple(segment.split('=', 1)[0] for segment in partition.split('/')
               if '=' in segment)


def finished(files: Files, root: str) -> List[str]:
  """The folders under the output root that hold a finished output (a
  success marker), sorted, by path relative to the root ('' the root)."""
  return sorted(posixpath.dirname(relative(info.path, root))
                for info in files.files(root)
                if posixpath.basename(info.path) == ownership.SUCCESS_MARKER)


def _check_layout(files: Files, root: str, partition: str,
                  done: List[str]) -> None:
  """No finished output under the root (``done``) is of another layout
  than ``partition``'s: an unpartitioned output, or partitions of other
  keys (dt=… beside dt=…/hour=…), which hive-style readers refuse to read
  together."""
  if files.exists(posixpath.join(root, ownership.SUCCESS_MARKER)):
    raise OutputError(f'{root} is an output without partitions; a '
                      f'--partition={partition} beside it would mix layouts')
  wanted = keys(partition)
  for existing in done:
    if keys(existing) != wanted:
      raise OutputError(
          f'{root} holds partitions such as {existing}, keyed '
          f'{"/".join(keys(existing)) or "otherwise"}; '
          f'--partition={partition} (keyed {"/".join(wanted) or "otherwise"})'
          ' would mix layouts that hive-style readers cannot read together')


def _columns(schema: pa.Schema) -> List[str]:
  return [f'{field.name} {field.type}' for field in schema]


def _check_columns(files: Files, root: str, partition: str, done: List[str],
                   schema: pa.Schema) -> None:
  """No partition among ``done`` beside ``partition`` has other columns
  than ``schema`` (a model with another label set, other kept fields):
  readers of the root (pyarrow.dataset, pandas, DuckDB) take one
  partition's columns for all and drop or refuse the others'."""
  for existing in done:
    if existing == partition:
      continue  # the partition this run replaces
    folder = posixpath.join(root, existing)
    parts = sorted(info.path for info in files.files(folder)
                   if fnmatch.fnmatchcase(relative(info.path, folder),
                                          scored.FILE_PATTERN) and
                   '/' not in relative(info.path, folder))
    if not parts:
      continue
    with files.open(parts[0]) as handle:
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
    raise OutputError(
        f'the partition {existing} beside '
        f'--partition={partition} has other columns ({difference}), and '
        'readers of the root take one partition\'s columns for all: pass '
        '--allow_schema_change to write it all the same, and read the root '
        'as docs/operations.md, "Partitions of different columns", says, or '
        'score into another --output_dir')


def check_beside(files: Files, root: str, partition: str,
                 schema: Optional[pa.Schema]) -> None:
  """The finished outputs beside ``partition`` under ``root``: of its
  layout, and (unless ``schema`` is None) of its columns."""
  if not partition:
    return
  done = finished(files, root)
  _check_layout(files, root, partition, done)
  if schema is not None:
    _check_columns(files, root, partition, done, schema)
