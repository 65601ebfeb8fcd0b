"""The files that people's tools leave in any folder they open, and what
every job does with them (the table of docs/operations.md, "What a job may
replace").

The Finder's ``.DS_Store`` and ``._*``, Windows Explorer's ``Thumbs.db`` and
``desktop.ini``, Jupyter's ``.ipynb_checkpoints/`` (made on opening a file,
``report.md`` say), git users' ``.gitkeep``, editors' swap, backup and lock
files: every job ignores them (they never make a folder another tool's, nor
a job refuse it) and keeps them (the trainer adds versions beside them; a
job that replaces its output whole carries them into the replacement).
They hold nothing a job reads, and some hold what people care about:
Jupyter's checkpoints are copies of the files being edited.

A note (``README``, ``NOTES``) at a model folder's top is kept too: a model
folder grows by versions, and people document it. In an output that a rerun
replaces whole a note would be deleted with it, so there it is refused as
any other file the job does not write, unless ``--overwrite`` says to
replace the output: keep notes beside such an output, not in it.
"""
import fnmatch
import posixpath
import re

# Names (globs, case-sensitive as the tools write them) of the files tools
# leave, anywhere in a folder; a folder of such a name with all it holds.
TOOL_NAMES = ('.DS_Store', '._*', 'Thumbs.db', 'desktop.ini',
              '.ipynb_checkpoints', '.gitkeep', '.*.swp', '.*.swo', '*~',
              '.#*')
_TOOL_NAME = re.compile('|'.join(fnmatch.translate(name)
                                 for name in TOOL_NAMES))
# A note's name at a model folder's top.
_NOTE = re.compile(r'(readme|notes)(\.(md|txt|rst))?', re.IGNORECASE)


def is_tool_file(relative: str) -> bool:
  """Whether the entry at ``relative`` (a path in an output folder; a
  folder's may end in ``/``) is, or lies in, what a tool left."""
  return any(_TOOL_NAME.fullmatch(part)
             for part in relative.rstrip('/').split('/'))


def tool_root(relative: str) -> str:
  """The outermost path of ``relative`` that a tool left: the
  ``.ipynb_checkpoints`` folder a checkpoint lies in, or the file itself."""
  parts = relative.rstrip('/').split('/')
  for depth, part in enumerate(parts):
    if _TOOL_NAME.fullmatch(part):
      return posixpath.join(*parts[:depth + 1])
  return relative


def is_note(relative: str) -> bool:
  """Whether ``relative`` is a note at the top of a folder."""
  return bool(_NOTE.fullmatch(relative))
