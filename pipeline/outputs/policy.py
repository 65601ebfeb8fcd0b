"""What an output may replace: the checks a job's output passes before its
pipeline starts."""
import dataclasses
import os
import posixpath
import re
from typing import List, Tuple

from apache_beam.io.filesystem import FileSystem
from apache_beam.io.filesystems import FileSystems

import cli
from pipeline.outputs import files
from pipeline.readers import matching

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
  existing folder may be replaced.
  """
  contents: Tuple[str, ...] = ('**',)
  markers: Tuple[str, ...] = ()

  def publishes(self, relative: str) -> bool:
    return any(re.match(FileSystem.translate_pattern(glob), relative)
               for glob in self.contents)

  def examples(self) -> List[str]:
    """A path the job writes for each glob, with a shard name for ``*``."""
    return [re.sub(r'\*+', _SHARD, glob) for glob in self.contents]


def check_outside_input(folders: List[str], layout: Layout,
                        pattern: str) -> None:
  """Fails if the input pattern would match a file the job writes in any of
  ``folders`` (the output, its staging folder): a job reading its own
  output never runs the same twice."""
  matches = re.compile(matching.translate(
      files.resolved_pattern(pattern))).fullmatch
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


def check_replaceable(root: str, final_dir: str, layout: Layout,
                      overwrite: bool) -> None:
  """Fails, unless told to overwrite, if the output folder is a file, or
  holds files and is not an output this job published: no marker at its
  top, or one further down (other partitions, which a rerun would
  delete)."""
  in_the_way = _file_in_the_way(root, final_dir)
  if in_the_way:
    raise OutputError(f'{in_the_way} is a file, where the output needs a '
                      'folder; remove it or choose another --output_dir')
  if overwrite or not layout.markers:
    return
  held = [files.relative(m, final_dir) for m in files.files(final_dir)]
  nested = [p for p in held if '/' in p and
            posixpath.basename(p) in layout.markers]
  if nested:
    problem = ('holds other outputs of this job, such as '
               f'{posixpath.dirname(nested[0])}')
  elif held and not {p.split('/')[0] for p in held} & set(layout.markers):
    problem = 'is not an output of this job'
  else:
    return
  raise OutputError(f'{final_dir} {problem}; pass --overwrite to replace '
                    'it whole')
