"""Which folder a job may write, replace or publish: every check, with the
words every job refuses in.

``check`` runs them all, in this order, for any job; a job claims its
output with it before any work and runs it again just before it publishes
(``outputs.claim``, ``outputs.versions``). A new rule goes here, as one more
``_check_*`` that ``check`` calls, and so holds for every job at once.
"""
import collections
import dataclasses
import os
import posixpath
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Set

import cli
from outputs import ownership
from outputs import tool_files
from outputs.files import Files
from outputs.files import relative


class OutputError(cli.JobError):
  """The output location cannot be written, lies inside the input or
  another job's output, or holds something this job may not replace."""


# What an entry in an output folder is.
FILE = 'a file'
LINK = 'a symbolic link'
EMPTY_FOLDER = 'an empty folder'
SHARED = 'a file with other names (a hard link)'
SPECIAL = 'no regular file'


class Entry(NamedTuple):
  """Something an output folder holds: its path relative to the folder (a
  folder's ends in ``/``), and what it is."""
  path: str
  kind: str = FILE


class Layout:
  """What a job writes in its output folder, for the checks: ``owner``,
  whose output the folder is (``ownership``); which of what it holds the
  job writes (``writes``); and how it publishes (``replaces_whole``: the
  Beam jobs, which a rerun replaces with ``--overwrite`` allowed, or, the
  trainer, adding versions, with no ``--overwrite``)."""
  owner: str
  replaces_whole: bool
  # Whether a note at the folder's top (``tool_files.is_note``) is kept.
  keeps_notes = False
  # How an error tells the user out of it when the folder holds files this
  # job does not write.
  remedy: str

  def writes(self, path: str, marked: bool) -> bool:
    """Whether the job writes the entry at ``path`` (relative to the output
    folder) in a folder that is already its output (``marked``) or not."""
    raise NotImplementedError

  def marked(self, top: Set[str]) -> bool:
    """Whether a folder holding the names ``top`` at its top is already
    this job's output."""
    return self.owner in ownership.owners(top.__contains__)

  def nested_own(self, folder: str, job: str) -> bool:
    """Whether ``job``'s output at ``folder`` inside the output folder is
    one this job writes there (the trainer's versions)."""
    del folder, job
    return False

  def nested_markers(self) -> Set[str]:
    """Names that mark a folder inside the output as another output of
    this job's (which only ``--overwrite`` replaces)."""
    return set()

  def examples(self) -> List[str]:
    """Paths, relative to the output folder, of the files the job writes,
    for the input pattern to be checked against."""
    return []


@dataclasses.dataclass(frozen=True)
class Target:
  """An output folder as one run of a job writes it."""
  files: Files
  root: str    # resolved (``ownership.resolved``)
  folder: str  # the root, or the partition below it
  layout: Layout
  flag: str    # how messages name the folder's flag
  overwrite: bool = False
  # The input pattern, and whether it reads a (resolved) path.
  input_pattern: str = ''
  reads: Optional[Callable[[str], bool]] = None
  # The checks of the folders beside this one (partitions), first.
  beside: Optional[Callable[[], None]] = None


def check(target: Target, staging_dir: str = '') -> None:
  """Every check of where ``target`` goes, first failure first (an
  OutputError): nothing in the way, not inside another job's output, not
  holding one, not holding the input nor inside it, and holding nothing
  this job does not write unless it may replace it."""
  if target.beside:
    target.beside()
  _check_no_file_in_the_way(target)
  _check_no_link_on_the_way(target)
  _check_outside_outputs(target)
  if target.reads:
    _check_outside_input(target, staging_dir)
  held = entries(target.files, target.folder)
  _check_holds_no_other_output(target, held)
  if target.reads:
    _check_holds_no_input(target, held)
  if not target.layout.replaces_whole:
    _check_writes_through_nothing(target, held)
  if not target.overwrite:
    _check_holds_only_its_own(target, held)


def _check_no_file_in_the_way(target: Target) -> None:
  """The output folder and every folder above it are folders or nothing:
  a job never writes over a file."""
  files = target.files
  for path in (target.folder, *ownership.ancestors(target.folder)):
    if files.is_local(path):
      in_the_way = os.path.lexists(path) and not os.path.isdir(path)
    else:  # a bucket is no file
      in_the_way = '/' in path.split('://')[-1] and files.is_file(path)
    if in_the_way:
      raise OutputError(f'{path} is a file, where {target.flag} needs a '
                        f'folder; remove it or choose another {target.flag}')


def _check_no_link_on_the_way(target: Target) -> None:
  """No folder from below the (resolved) root down to the output folder
  is a symbolic link: a partition is a folder of its own."""
  if target.folder == target.root or not target.files.is_local(
      target.folder):
    return
  path = target.root
  for part in posixpath.relpath(target.folder, target.root).split('/'):
    path = posixpath.join(path, part)
    if os.path.islink(path):
      raise OutputError(f'{path} is a symbolic link: a partition is a folder '
                        'of its own; remove the link or choose another '
                        '--partition')


def _check_outside_outputs(target: Target) -> None:
  """No folder above the output folder is a job's output (a preprocessing
  output, a scoring output, a model folder): that job's rerun would delete
  this output, or this one corrupt it."""
  found = ownership.enclosing_output(target.folder, target.files.exists)
  if found:
    raise OutputError(f'{target.flag} {target.folder} is inside {found[0]}, '
                      f'{found[1]}: write each output into a folder of its '
                      'own')


def _check_outside_input(target: Target, staging_dir: str) -> None:
  """The input pattern matches nothing the job writes: no file of it in the
  output folder or its staging folder, and none of those folders (nor the
  folders between the output root and the output folder, nor the staging
  folders' own): a job reading its own output never runs the same twice,
  and a pattern that matched a folder it makes would read it as an
  unreadable input file."""
  for path in _written_paths(target, staging_dir):
    if target.reads(path):
      raise OutputError(
          f'the output folder {target.folder} is inside the input '
          f'{target.input_pattern}: the input would include {path}')


def _written_paths(target: Target, staging_dir: str) -> Iterator[str]:
  """Every folder a run of ``target`` makes or writes into, and a path of
  each file it writes in the output and staging folders."""
  folder = target.folder
  while True:
    yield folder
    if folder == target.root or not folder.startswith(target.root + '/'):
      break
    folder = posixpath.dirname(folder)
  if staging_dir:
    yield posixpath.dirname(staging_dir)
    yield staging_dir
  for folder in filter(None, (target.folder, staging_dir)):
    for example in target.layout.examples():
      yield posixpath.join(folder, example)


def entries(files: Files, folder: str) -> List[Entry]:
  """What ``folder`` holds: every file, and on a local disk every symbolic
  link (which a listing of files would follow or miss), empty folder, hard
  link and entry that is no regular file, each as such."""
  if not files.is_local(folder):
    return [Entry(relative(info.path, folder))
            for info in files.files(folder)]
  held = []
  for parent, subfolders, names in os.walk(folder):
    prefix = posixpath.relpath(parent, folder) + '/'
    prefix = '' if prefix == './' else prefix
    held += [Entry(prefix + name, _kind(posixpath.join(parent, name)))
             for name in names]
    held += [Entry(prefix + name, LINK) for name in subfolders
             if os.path.islink(posixpath.join(parent, name))]
    if not subfolders and not names and prefix:
      held.append(Entry(prefix, EMPTY_FOLDER))
  return held


def _kind(path: str) -> str:
  info = os.lstat(path)
  if os.path.islink(path):
    return LINK
  if not os.path.isfile(path):
    return SPECIAL
  return SHARED if info.st_nlink > 1 else FILE


def _folders_and_names(held: List[Entry]) -> Dict[str, Set[str]]:
  """The names each folder among ``held`` holds at its top, by its path
  relative to the output folder ('' the output folder itself)."""
  names = collections.defaultdict(set)
  for entry in held:
    parts = entry.path.rstrip('/').split('/')
    for depth in range(len(parts)):
      names['/'.join(parts[:depth])].add(parts[depth])
  names.setdefault('', set())
  return names


def _check_holds_no_other_output(target: Target, held: List[Entry]) -> None:
  """The output folder is no other job's output and holds none, with
  ``--overwrite`` or without: replacing or writing into it would delete or
  corrupt that output."""
  layout = target.layout
  for folder, names in sorted(_folders_and_names(held).items()):
    # Other outputs of its own kind below it are for the last check.
    others = {job for job in ownership.owners(names.__contains__)
              if job != layout.owner and
              not (folder and layout.nested_own(folder, job))}
    if not others:
      continue
    path = posixpath.join(target.folder, folder).rstrip('/')
    jobs = ' and '.join(sorted(others))
    raise OutputError(
        f'{path} is {jobs}, which this job never replaces'
        f'{", with --overwrite or without" if layout.replaces_whole else ""}'
        f'; choose another {target.flag}')


def _check_holds_no_input(target: Target, held: List[Entry]) -> None:
  """The output folder holds no file the input pattern reads: replacing
  the folder would delete it."""
  inputs = [entry.path for entry in held
            if not tool_files.is_tool_file(entry.path) and
            target.reads(posixpath.join(target.folder, entry.path))]
  if inputs:
    raise OutputError(
        f'{target.folder} holds the input '
        f'{posixpath.join(target.folder, inputs[0])}, which replacing it '
        f'would delete, with --overwrite or without; choose another '
        f'{target.flag}')


def _check_writes_through_nothing(target: Target, held: List[Entry]) -> None:
  """A job that writes into its existing output (the trainer) finds no
  link there, no file with other names and nothing that is no regular
  file (but what tools leave): writing or deleting it would reach
  something else, or block."""
  for entry in held:
    if entry.kind in (LINK, SHARED, SPECIAL) and not (
        tool_files.is_tool_file(entry.path)):  # never written nor read
      path = posixpath.join(target.folder, entry.path)
      raise OutputError(
          f'{target.flag} {target.folder} holds {path}, {entry.kind}, and '
          'this job writes and deletes through none; remove it or choose '
          f'another {target.flag}')


def _foreign(layout: Layout, held: List[Entry]) -> Iterator[str]:
  """The paths among ``held`` that the job does not write, nor keeps
  (``tool_files``)."""
  marked = layout.marked(_folders_and_names(held)[''])
  for entry in held:
    if not (tool_files.is_tool_file(entry.path) or
            layout.keeps_notes and tool_files.is_note(entry.path) or
            layout.writes(entry.path, marked)):
      yield entry.path


def _check_holds_only_its_own(target: Target, held: List[Entry]) -> None:
  """Without ``--overwrite``, the output folder holds only what this job
  writes: an earlier run's output, which a rerun replaces, and what the
  tools of ``tool_files`` leave; not other outputs of this job below it."""
  markers = target.layout.nested_markers()
  nested = [entry.path for entry in held if '/' in entry.path and
            posixpath.basename(entry.path) in markers]
  other = next(_foreign(target.layout, held), None)
  if nested:
    problem = ('holds other outputs of this job, such as '
               f'{posixpath.dirname(nested[0])}')
  elif other is not None:
    problem = f'holds files this job does not write, such as {other}'
  else:
    return
  raise OutputError(f'{target.flag} {target.folder} {problem}; '
                    f'{target.layout.remedy}')
