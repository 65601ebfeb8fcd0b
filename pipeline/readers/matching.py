"""Which files an input pattern names: one listing, for the launcher and the
pipeline alike.

Beam's ``FileSystems.match`` does not fit a reader that must account for
every file: its ``**`` needs at least one folder (``data/**/*.jsonl`` skips
``data/x.jsonl``, which bash, Python's glob and DuckDB match), its ``?`` and
``[...]`` cross ``/``, and on a local disk its listing drops dangling
symbolic links and folders without a word and lists FIFOs, whose reading
blocks forever. Here a pattern is listed once, below its literal folder; the
regular files it matches are read by their paths, taken literally from then
on (a file named ``part[1].jsonl`` is never taken for a pattern again), and
whatever else it matches is an ``Entry`` with a ``problem``, which the
reader reports as a dead letter.

Pattern syntax: ``*`` is any characters but ``/``, ``?`` one of them,
``[...]`` one of a class (``[!...]`` negated), never ``/``; ``**`` as a
whole folder name (``data/**/*.jsonl``) is zero or more folders, and
elsewhere (``data/**``) any characters, ``/`` included, as in Beam. A
pattern ending in ``/`` ends in ``*``, as in Beam. Symbolic links to files
are read; links to folders are not followed (as bash's ``**`` and ``find``
do not), so that no listing can loop and no file is read twice by two
names.
"""
import os
import re
import stat
from typing import Iterator, List, NamedTuple, Optional, Tuple

from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

_GLOB = re.compile(r'[*?[]')
_DANGLING = 'a dangling symbolic link: what it points to does not exist'
_FOLDER = 'a folder, not a file'
_LINKED_FOLDER = 'a symbolic link to a folder, which is not followed'
_KINDS = ((stat.S_ISFIFO, 'a FIFO (named pipe), not a regular file'),
          (stat.S_ISSOCK, 'a socket, not a regular file'),
          (stat.S_ISCHR, 'a character device, not a regular file'),
          (stat.S_ISBLK, 'a block device, not a regular file'))


class Entry(NamedTuple):
  """A path the pattern matches: a regular file of ``size`` bytes, or
  something that cannot be read as one, and why (``problem``)."""
  path: str
  size: int = 0
  problem: Optional[str] = None


def _class(pattern: str, start: int) -> Tuple[Optional[str], int]:
  """The regular expression of the ``[...]`` class that opens at
  ``start``, and where the pattern goes on; None when no ``]`` closes it
  (the ``[`` is then a character of the name)."""
  end = start + 1
  if pattern[end:end + 1] == '!':
    end += 1
  if pattern[end:end + 1] == ']':
    end += 1
  end = pattern.find(']', end)
  if end < 0:
    return None, start + 1
  body = pattern[start + 1:end]
  negated = body.startswith('!')
  members = ''.join(char if char == '-' else re.escape(char)
                    for char in body[negated:])
  return f'(?!/)[{"^" if negated else ""}{members}]', end + 1


def _normalized(pattern: str) -> str:
  return pattern + '*' if pattern.endswith('/') else pattern


def translate(pattern: str) -> str:
  """The regular expression, for ``re.fullmatch``, of the paths a pattern
  matches. ValueError when a ``[...]`` class is invalid (``[z-a]``)."""
  pattern = _normalized(pattern)
  parts, position = [], 0
  while position < len(pattern):
    char = pattern[position]
    if pattern.startswith('**', position):
      whole_folder = (position == 0 or pattern[position - 1] == '/') and (
          pattern.startswith('/', position + 2))
      parts.append('(?:[^/]+/)*' if whole_folder else '.*')
      position += 3 if whole_folder else 2
    elif char in '*?':
      parts.append('[^/]*' if char == '*' else '[^/]')
      position += 1
    elif char == '[':
      regex, position = _class(pattern, position)
      parts.append(regex or re.escape(char))
    else:
      parts.append(re.escape(char))
      position += 1
  regex = '(?s)' + ''.join(parts)
  try:
    re.compile(regex)
  except re.error as error:
    raise ValueError(f'{pattern} is not a valid pattern: {error}') from error
  return regex


def _local_entry(path: str) -> Optional[Entry]:
  """What a local path is, symbolic links followed; None when it is gone."""
  try:
    info = os.stat(path)
  except FileNotFoundError:
    return Entry(path, problem=_DANGLING) if os.path.islink(path) else None
  except OSError as error:  # a loop of links, a folder we may not enter
    return Entry(path, problem=f'a path that cannot be looked at: {error}')
  if stat.S_ISREG(info.st_mode):
    return Entry(path, info.st_size)
  if stat.S_ISDIR(info.st_mode):
    return Entry(path, problem=_LINKED_FOLDER if os.path.islink(path) else
                 _FOLDER)
  problem = next((problem for is_kind, problem in _KINDS
                  if is_kind(info.st_mode)), 'not a regular file')
  return Entry(path, problem=problem)


def _walk(folder: str, max_depth: Optional[int]
          ) -> Iterator[Tuple[str, bool, Optional[OSError]]]:
  """(path, is a real folder, the error listing it) for everything below
  ``folder`` (a path ending in ``/``, or '' for the current folder), down
  to ``max_depth`` folders (None: all)."""
  pending = [(folder, 0)]
  while pending:
    current, depth = pending.pop()
    try:
      with os.scandir(current or '.') as listing:
        children = [(child.name, child.is_dir(follow_symlinks=False))
                    for child in listing]
    except FileNotFoundError:
      continue
    except OSError as error:
      yield current or '.', True, error
      continue
    for name, is_folder in children:
      yield current + name, is_folder, None
      if is_folder and (max_depth is None or depth < max_depth):
        pending.append((current + name + '/', depth + 1))


def _local_entries(pattern: str, regex: str) -> List[Entry]:
  """Every entry below the pattern's literal folder that it matches. A
  folder it matches is reported when nothing below it is read and the
  pattern's last part has no ``**`` (which names what lies below)."""
  prefix = pattern[:_GLOB.search(pattern).start()]
  folder = prefix[:prefix.rfind('/') + 1]
  max_depth = None if '**' in pattern else pattern.count('/', len(folder))
  matches = re.compile(regex).fullmatch
  found, folders = [], []
  for path, is_folder, error in _walk(folder, max_depth):
    if error is not None:
      found.append(Entry(path, problem=f'a folder that cannot be listed: '
                         f'{error}'))
    elif is_folder:
      if matches(path):
        folders.append(path)
    elif matches(path):
      found.append(_local_entry(path))
  found = [entry for entry in found if entry is not None]
  if '**' not in pattern.rsplit('/', 1)[-1]:
    below = {path for entry in found if entry.problem is None
             for path in _folders_above(entry.path)}
    found.extend(Entry(path, problem=_FOLDER) for path in folders
                 if path not in below)
  return found


def _folders_above(path: str) -> Iterator[str]:
  while '/' in path.strip('/'):
    path = path.rstrip('/').rsplit('/', 1)[0]
    yield path


def _store_entries(pattern: str, regex: str) -> List[Entry]:
  """The objects a pattern matches on an object store, which has neither
  folders nor links: what Beam lists under its literal prefix."""
  matches = re.compile(regex).fullmatch
  prefix = pattern[:_GLOB.search(pattern).start()]
  listed = FileSystems.match([prefix + '**'])[0].metadata_list
  return [Entry(metadata.path, metadata.size_in_bytes) for metadata in listed
          if matches(metadata.path)]


def entries(pattern: str) -> List[Entry]:
  """Everything ``pattern`` matches, sorted by path: regular files, and
  entries with a ``problem``. A pattern without glob characters is a path."""
  is_local = isinstance(FileSystems.get_filesystem(pattern), LocalFileSystem)
  if not _GLOB.search(pattern):
    if is_local:
      found = [_local_entry(pattern)]
    else:
      found = [Entry(metadata.path, metadata.size_in_bytes) for metadata in
               FileSystems.match([pattern])[0].metadata_list]
  else:
    pattern = _normalized(pattern)
    lister = _local_entries if is_local else _store_entries
    found = lister(pattern, translate(pattern))
  return sorted((entry for entry in found if entry is not None),
                key=lambda entry: entry.path)


def files(pattern: str) -> List[str]:
  """The regular files ``pattern`` matches, sorted."""
  return [entry.path for entry in entries(pattern) if entry.problem is None]
