"""Replace-whole, the Beam jobs' strategy: a staging folder that replaces
the output folder whole when published, or is removed."""
import contextlib
import dataclasses
import logging
import os
import posixpath
import re
import stat
import time
import uuid
from typing import Callable, List, Optional, Set, Tuple

import cli
from outputs import rules
from outputs import swap
from outputs import tool_files
from outputs.files import Files
from outputs.files import relative
from outputs.ownership import SUCCESS_MARKER
from outputs.ownership import resolved
from outputs.rules import OutputError

# A run killed with SIGKILL (which cannot be handled) leaves its staging
# folder behind; the next run of the same output removes it once no file in
# it has changed for this long.
STALE_SECONDS = 24 * 3600
# Names the staging folders of an output without partitions; a partition
# name never starts with ``_``.
_UNPARTITIONED = '_output'
# Stands for each ``*`` of a Layout's globs in the paths checked against the
# input pattern: the shard name Beam's sinks give their files.
_SHARD = '00000-of-00001'


def _glob_regex(glob: str) -> str:
  """The regular expression of a glob of ``*`` (any characters but ``/``)
  and ``**`` (any characters)."""
  return '.*'.join('[^/]*'.join(re.escape(part) for part in piece.split('*'))
                   for piece in glob.split('**'))


@dataclasses.dataclass(frozen=True)
class Layout(rules.Layout):
  """What a job that replaces its output whole publishes in it.

  ``contents``: globs (``*`` stops at ``/``, ``**`` does not), relative to
  the output folder, of every file the job writes as output; anything else
  staged, such as a runner's ``beam-temp-*`` leftovers, is not published.
  ``markers``: names at the top of a folder that only an output of this job
  has; without any, every existing folder may be replaced. ``owner``: whose
  output it is (``ownership``).
  """
  contents: Tuple[str, ...] = ('**',)
  markers: Tuple[str, ...] = ()
  owner: Optional[str] = None
  replaces_whole = True
  remedy = 'pass --overwrite to replace it whole'

  def publishes(self, path: str) -> bool:
    return any(re.fullmatch(_glob_regex(glob), path)
               for glob in self.contents)

  def writes(self, path: str, marked: bool) -> bool:
    return self.publishes(path) or path == SUCCESS_MARKER

  def nested_markers(self) -> Set[str]:
    return set(self.markers)

  def examples(self) -> List[str]:
    """A path the job writes for each glob, with a shard name for ``*``."""
    return [re.sub(r'\*+', _SHARD, glob) for glob in self.contents]


def staging_root(root: str) -> str:
  """The folder of the staging folders of output root ``root``: its hidden
  sibling ``.<name>.staging``, on the same file system, so that publishing
  is a rename, and where no reader of the output root can reach them,
  however it globs."""
  parent, name = posixpath.split(resolved(root))
  return posixpath.join(parent, f'.{name}.staging')


def _device(path: str) -> int:
  return os.stat(path).st_dev


def _permissions(path: str) -> int:
  return stat.S_IMODE(os.stat(path).st_mode)


def _keep_permissions(previous: str, replacement: str) -> None:
  """Gives the folders of ``replacement`` the permissions of ``previous``,
  the output it replaces, and its files those every file of ``previous``
  had (the bits all of them share): an output an operator made private
  stays private after a rerun."""
  folder_mode = _permissions(previous)
  file_mode = None
  for parent, _, names in os.walk(previous):
    for name in names:
      mode = _permissions(os.path.join(parent, name))
      file_mode = mode if file_mode is None else file_mode & mode
  for parent, _, names in os.walk(replacement):
    os.chmod(parent, folder_mode)
    if file_mode is not None:
      for name in names:
        os.chmod(os.path.join(parent, name), file_mode)


def keep_tool_files(files: Files, previous: str, replacement: str) -> None:
  """Moves what people's tools left in ``previous`` (``tool_files``) to the
  same place in ``replacement``, which is to replace it whole: no job
  deletes them."""
  if not files.exists(previous):
    return
  if not files.is_local(previous):
    kept = [info.path for info in files.files(previous)
            if tool_files.is_tool_file(relative(info.path, previous))]
    if kept:
      files.rename(kept, [replacement + path[len(previous):]
                          for path in kept])
    return
  roots = {tool_files.tool_root(entry.path)
           for entry in rules.entries(files, previous)
           if tool_files.is_tool_file(entry.path)}
  for path in sorted(roots):
    target = posixpath.join(replacement, path)
    if not os.path.lexists(target):
      os.makedirs(posixpath.dirname(target), exist_ok=True)
      os.rename(posixpath.join(previous, path), target)


class StagedOutput:
  """A staging folder that replaces the output folder whole when published.

  Used as a context manager::

      with outputs.claim(files, root, layout=..., partition='dt=1') as output:
        ...write under output.staging_dir...
        output.publish()

  The output folder is ``root``, or ``root/partition``. Entering removes
  this output's staging folders left by killed runs and creates the staging
  folder (an OutputError where it cannot). Leaving without having
  published, whatever the reason, removes the staging folder, so nothing
  half-written ever remains. Publishing runs ``check`` again, then moves the
  files ``publishes`` accepts (by their path relative to the staging
  folder) into place, keeping the files people's tools left in the folder
  it replaces (``tool_files``).

  On a local disk the replacement is one atomic swap of folders: a reader
  sees the old output or the new one, never a mix and never neither. On an
  object store, files are moved one by one: the old success marker goes
  first and the new one last, so readers that wait for it see whole outputs.
  """

  def __init__(self, files: Files, root: str, *, partition: str = '',
               publishes: Callable[[str], bool] = lambda relative: True,
               check: Callable[[str], None] = lambda staging_dir: None):
    self._files = files
    self.root = resolved(root)
    # The output location's checks (given the staging folder), run again
    # just before publishing: another job may have written into it while
    # this one ran.
    self._check = check
    self.final_dir = posixpath.join(self.root, partition) if partition else (
        self.root)
    self._publishes = publishes
    self._staging_root = staging_root(self.root)
    self._name = partition.replace('/', '~') if partition else _UNPARTITIONED
    self.staging_dir = posixpath.join(
        self._staging_root, f'{self._name}-{uuid.uuid4().hex[:12]}')
    self._published = False
    self._while_staged = contextlib.ExitStack()

  def __enter__(self) -> 'StagedOutput':
    if self._files.is_local(self._staging_root) and os.path.islink(
        self._staging_root):
      raise OutputError(
          f'{self._staging_root}, where the output is staged, is a symbolic '
          'link: staging would write, and remove, where it points; remove '
          'the link')
    try:
      self._sweep_stale()
      self._create()
    except OutputError:
      self.discard()
      raise
    # A stopped run that cannot unwind is exited regardless: its staging
    # folder goes with it.
    self._while_staged.enter_context(cli.at_forced_exit(self.discard))
    return self

  def __exit__(self, *exc_info) -> None:
    self._while_staged.close()
    if not self._published:
      self.discard()

  def _last_changes(self) -> dict:
    """When anything in each folder of the staging root last changed."""
    changed = {}
    for info in self._files.files(self._staging_root):
      folder = relative(info.path, self._staging_root).split('/')[0]
      # A file system that gives no time makes the folder look fresh.
      changed[folder] = max(changed.get(folder, 0),
                            info.changed or time.time())
    if self._files.is_local(self._staging_root) and os.path.isdir(
        self._staging_root):
      for folder in os.listdir(self._staging_root):  # empty ones too
        changed[folder] = max(changed.get(folder, 0), os.path.getmtime(
            posixpath.join(self._staging_root, folder)))
    return changed

  def _sweep_stale(self) -> None:
    """Removes this output's staging folders in which nothing has changed
    for STALE_SECONDS: those of killed runs."""
    own = re.compile(re.escape(self._name) + r'-[0-9a-f]{12}')
    for folder, when in self._last_changes().items():
      if not own.fullmatch(folder):
        continue
      if when < time.time() - STALE_SECONDS:
        logging.info('removing %s, left by a run killed %.0f hours ago',
                     folder, (time.time() - when) / 3600)
        self._files.delete_tree(posixpath.join(self._staging_root, folder))
      else:
        # Another run of this output, or one killed with its watchdog (a
        # job on a cluster may still write there): never published.
        logging.warning(
            '%s: another run is staging this output, or one was killed '
            '(last change %.0f minutes ago); this run does not publish it, '
            'and removes it once unchanged for a day',
            posixpath.join(self._staging_root, folder),
            (time.time() - when) / 60)

  def _create(self) -> None:
    """Creates the staging folder, proving the location writable and, on a
    local disk, on the output's file system, so that publishing is a
    rename."""
    files = self._files
    try:
      files.makedirs(self.staging_dir)
      probe = posixpath.join(self.staging_dir, '.probe')
      files.write(probe, b'probe')
      files.delete([probe])
    except Exception as error:  # pylint: disable=broad-except
      raise OutputError(
          f'cannot write to {self.final_dir}: {error}') from error
    if not (files.is_local(self.root) and os.path.isdir(self.root)):
      return
    # No more open than the output it will replace: what a failed run
    # keeps here (its dead letters) is the output's data too.
    mode = _permissions(self.root)
    if os.path.isdir(self.final_dir):
      mode &= _permissions(self.final_dir)
    for folder in (self._staging_root, self.staging_dir):
      os.chmod(folder, mode)
    if _device(self.root) != _device(self._staging_root):
      raise OutputError(
          f'{self.root} is a mount point: its staging folders, in '
          f'{self._staging_root}, would be on another file system; use a '
          'folder inside it as --output_dir')

  def mark_finished(self) -> None:
    """Writes the success marker in the staging folder, published last.
    Not empty: Beam's S3 filesystem cannot write an empty file (a multipart
    upload of no part)."""
    self._files.write(posixpath.join(self.staging_dir, SUCCESS_MARKER),
                      b'\n')

  @property
  def kept_dir(self) -> str:
    """Where ``keep`` keeps what a failed run leaves for the operator."""
    return posixpath.join(self._staging_root, f'{self._name}.failed')

  def keep(self, path: str) -> str:
    """Moves ``path`` of the staging folder to ``kept_dir`` (replacing what
    an earlier failed run kept there), so that it outlives the run; returns
    its new path. The next run that publishes removes it."""
    source = posixpath.join(self.staging_dir, path)
    target = posixpath.join(self.kept_dir, path)
    self._files.delete_tree(self.kept_dir)
    if self._files.is_local(source):
      os.makedirs(os.path.dirname(target), exist_ok=True)
      if os.path.exists(source):
        os.rename(source, target)
    else:
      paths = [info.path for info in self._files.files(source)]
      if paths:
        self._files.rename(paths, [target + p[len(source):] for p in paths])
    return target

  def publish(self) -> None:
    """Moves the staged output into place, replacing any previous one,
    once every check of the claim passed again."""
    cli.check_not_stopped()
    try:
      self._check(self.staging_dir)
    except OutputError as error:
      raise OutputError(f'{error}; nothing was published') from error
    self._files.delete_tree(self.kept_dir)
    self._remove_strays()
    if self._files.is_local(self.final_dir):
      keep_tool_files(self._files, self.final_dir, self.staging_dir)
      self._publish_local()
    else:
      self._publish_by_files()
    self._published = True
    self._remove_empty_staging_root()

  def _remove_strays(self) -> None:
    """Removes what the job did not write as output from the staging
    folder."""
    strays = [info.path for info in self._files.files(self.staging_dir)
              if not self._publishes(relative(info.path, self.staging_dir))]
    if strays:
      logging.info('not publishing %d files that are no output, such as %s',
                   len(strays), strays[0])
      self._files.delete(strays)
    if self._files.is_local(self.staging_dir):
      for folder, _, _ in os.walk(self.staging_dir, topdown=False):
        if folder != self.staging_dir and not os.listdir(folder):
          os.rmdir(folder)

  def _publish_local(self):
    if not os.path.lexists(self.final_dir):
      os.makedirs(os.path.dirname(self.final_dir), exist_ok=True)
      os.rename(self.staging_dir, self.final_dir)
      return
    _keep_permissions(self.final_dir, self.staging_dir)
    if not swap.exchange(self.staging_dir, self.final_dir):
      # A file system without the swap: the old output is moved aside, for
      # the moment between two renames.
      aside = self.staging_dir + '.old'
      os.rename(self.final_dir, aside)
      os.rename(self.staging_dir, self.final_dir)
      os.rename(aside, self.staging_dir)
    # The staging folder now holds the previous output.
    self._files.delete_tree(self.staging_dir)

  def _publish_by_files(self):
    def markers_and_others(paths):
      markers = [p for p in paths if posixpath.basename(p) == SUCCESS_MARKER]
      return markers, [p for p in paths if p not in markers]

    files = self._files
    # What people's tools left stays where it is.
    old = [info.path for info in files.files(self.final_dir)
           if not tool_files.is_tool_file(relative(info.path,
                                                   self.final_dir))]
    for batch in markers_and_others(old):
      if batch:
        files.delete(batch)
    staged = [info.path for info in files.files(self.staging_dir)]
    for batch in reversed(markers_and_others(staged)):
      if batch:
        files.rename(batch, [self.final_dir + p[len(self.staging_dir):]
                             for p in batch])
    files.delete_tree(self.staging_dir)

  def _remove_empty_staging_root(self):
    if self._files.is_local(self._staging_root):
      try:
        os.rmdir(self._staging_root)
      except OSError:  # not empty: another run is staging beside this one
        pass

  def discard(self) -> None:
    try:
      self._files.delete_tree(self.staging_dir)
      self._remove_empty_staging_root()
    except Exception:  # pylint: disable=broad-except
      logging.warning('could not remove %s', self.staging_dir, exc_info=True)
