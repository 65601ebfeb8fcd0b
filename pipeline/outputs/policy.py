"""What an output may replace: the checks a job's output passes before its
pipeline starts."""
import collections
import dataclasses
import os
import posixpath
import re
from typing import Dict, List, Optional, Set, Tuple

from apache_beam.io.filesystem import FileSystem
from apache_beam.io.filesystems import FileSystems

import cli
from pipeline.outputs import files
from pipeline.readers import matching
from schemas import folders

# Stands for each ``*`` of a Layout's globs in the paths checked against the
# input pattern: the shard name Beam's sinks give their files.
_SHARD = '00000-of-00001'


class OutputError(cli.JobError):
  """The output location cannot be written, lies inside the input, or holds
  something this job did not publish."""


@dataclasses.dataclass(frozen=True)
class Layout:
  """What a job publishes in its output folder.

  ``contents``: globs in the syntax of ``FileSystems.match`` (``*`` stops at
  ``/``, ``**`` does not), relative to the output folder, of every file the
  job writes as output; anything else staged, such as a runner's
  ``beam-temp-*`` leftovers, is not published. ``markers``: names at the top
  of a folder that only an output of this job has; without any, every
  existing folder may be replaced. ``owner``: whose output it is, as
  ``schemas.folders`` names it.
  """
  contents: Tuple[str, ...] = ('**',)
  markers: Tuple[str, ...] = ()
  owner: Optional[str] = None

  def publishes(self, relative: str) -> bool:
    return any(re.match(FileSystem.translate_pattern(glob), relative)
               for glob in self.contents)

  def examples(self) -> List[str]:
    """A path the job writes for each glob, with a shard name for ``*``."""
    return [re.sub(r'\*+', _SHARD, glob) for glob in self.contents]


def _reads(pattern: str):
  """Whether the input pattern matches a (resolved) path."""
  return re.compile(matching.translate(
      files.resolved_pattern(pattern))).fullmatch


def check_outside_input(folders: List[str], layout: Layout,
                        pattern: str) -> None:
  """Fails if the input pattern would match a file the job writes in any of
  ``folders`` (the output, its staging folder): a job reading its own
  output never runs the same twice."""
  matches = _reads(pattern)
  for folder in folders:
    for example in layout.examples():
      path = posixpath.join(folder, example)
      if matches(path):
        raise OutputError(
            f'the output folder {folders[0]} is inside the input {pattern}: '
            f'the input would include {path}')


def _file_in_the_way(root: str, final_dir: str) -> str:
  """The output folder or a folder between it and the root that exists as
  a file; '' if none does."""
  path = final_dir
  while True:
    if files.is_local(path):
      if os.path.lexists(path) and not os.path.isdir(path):
        return path
    elif FileSystems.exists(path):  # an object, not a prefix
      return path
    if path == root or '/' not in path.strip('/'):
      return ''
    path = posixpath.dirname(path)


def check_not_inside_output(final_dir: str) -> None:
  """Fails if a folder above the output folder is a job's output (a
  preprocessing output, a scoring output, a model folder): that job's rerun
  would delete this output, or this one corrupt it."""
  found = folders.enclosing_output(final_dir, files.exists)
  if found:
    raise OutputError(f'{final_dir} is inside {found[0]}, {found[1]}: '
                      'write each output into a folder of its own')


def _link_below(root: str, final_dir: str) -> str:
  """The first folder from below the (resolved) root down to the output
  folder that is a symbolic link; '' if none is."""
  if not files.is_local(final_dir) or final_dir == root:
    return ''
  path = root
  for part in posixpath.relpath(final_dir, root).split('/'):
    path = posixpath.join(path, part)
    if os.path.islink(path):
      return path
  return ''


def _held(folder: str) -> List[str]:
  """What ``folder`` holds, by path relative to it: every file, and on a
  local disk also every symbolic link (which a listing of files would
  follow or miss) and every empty folder."""
  if not files.is_local(folder):
    return [files.relative(m, folder) for m in files.files(folder)]
  held = []
  for parent, subfolders, names in os.walk(folder):
    relative = posixpath.relpath(parent, folder)
    prefix = '' if relative == '.' else relative + '/'
    held += [prefix + name for name in names]
    held += [prefix + name for name in subfolders
             if os.path.islink(posixpath.join(parent, name))]
    if not subfolders and not names and prefix:
      held.append(prefix)
  return held


def _owners(held: List[str]) -> Dict[str, Set[str]]:
  """Whose outputs the folders among ``held`` (paths relative to the output
  folder) are, of those that are a job's, by folder ('' the output folder
  itself)."""
  names = collections.defaultdict(set)
  for path in held:
    parts = path.split('/')
    for depth in range(len(parts)):
      names['/'.join(parts[:depth])].add(parts[depth])
  found = {}
  for folder, inside in names.items():
    jobs = folders.owners(inside.__contains__)
    if jobs:
      found[folder] = jobs
  return found


def check_replaceable(root: str, final_dir: str, layout: Layout,
                      overwrite: bool, input_pattern: str = '') -> None:
  """Fails if the output folder is a file or sits inside another job's
  output; and if it holds files, unless every one of them is one this job
  publishes (an earlier run's output, which a rerun replaces) or
  ``overwrite``. Even with ``overwrite``, fails if the output folder is or
  holds another job's output, or files the input pattern reads: replacing
  the folder would delete them."""
  in_the_way = _file_in_the_way(root, final_dir)
  if in_the_way:
    raise OutputError(f'{in_the_way} is a file, where the output needs a '
                      'folder; remove it or choose another --output_dir')
  link = _link_below(root, final_dir)
  if link:
    raise OutputError(f'{link} is a symbolic link: a partition is a folder '
                      'of its own; remove the link or choose another '
                      '--partition')
  check_not_inside_output(final_dir)
  held = _held(final_dir)
  others = {folder: jobs - {layout.owner}
            for folder, jobs in _owners(held).items()
            if jobs - {layout.owner}}
  if others:
    folder, jobs = sorted(others.items())[0]
    raise OutputError(
        f'{posixpath.join(final_dir, folder).rstrip("/")} is '
        f'{" and ".join(sorted(jobs))}, which this job never replaces, with '
        '--overwrite or without; choose another --output_dir')
  if input_pattern:
    reads = _reads(input_pattern)
    inputs = [path for path in held
              if reads(posixpath.join(final_dir, path))]
    if inputs:
      raise OutputError(
          f'{final_dir} holds the input {posixpath.join(final_dir, inputs[0])}'
          ', which replacing it would delete, with --overwrite or without; '
          'choose another --output_dir')
  if overwrite:
    return
  nested = [p for p in held if '/' in p and
            posixpath.basename(p) in layout.markers]
  foreign = [p for p in held if not (layout.publishes(p) or p == folders.SUCCESS_MARKER)]
  if nested:
    problem = ('holds other outputs of this job, such as '
               f'{posixpath.dirname(nested[0])}')
  elif foreign:
    problem = ('holds files this job does not write, such as '
               f'{foreign[0]}')
  else:
    return
  raise OutputError(f'{final_dir} {problem}; pass --overwrite to replace '
                    'it whole')
