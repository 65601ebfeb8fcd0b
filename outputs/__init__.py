"""Which folder a job may write, replace or publish, for every job.

Beam-free and TensorFlow-free, below the jobs: each job hands it its own
file access (``files.Files``: Beam's ``FileSystems`` for the Beam jobs,
``tf.io.gfile`` for the trainer), and every job refuses the same things the
same way, with the same words:

- ``ownership``: what marks each job's output; no job writes over, into or
  around another's;
- ``rules``: every check of an output folder (a file in the way, a link,
  another job's output around it or in it, the input in it or it in the
  input, what the job does not write), one ``check`` for all;
- ``tool_files``: what people's tools leave in any folder (``.DS_Store``,
  ``.ipynb_checkpoints/``, a model's notes), ignored and kept by every job;
- ``partitions``: an output root's partitions and what may stand beside one;
- two strategies of publishing: replace-whole (``staging``, the Beam jobs:
  a staging folder swapped in whole, or removed) and add-a-version
  (``versions``, the trainer: a version renamed into place beside the
  others).

A job claims its output with one call before any work (``claim``, or
``versions.check``), and publishes with one call that runs every check
again (``StagedOutput.publish``, ``versions.Run.publish``).
"""
from typing import Callable, Optional

from outputs.files import Files
from outputs.ownership import SUCCESS_MARKER
from outputs.rules import OutputError
from outputs.rules import Target
from outputs.rules import check
from outputs.staging import STALE_SECONDS
from outputs.staging import Layout
from outputs.staging import StagedOutput
from outputs.staging import staging_root

__all__ = ('Files', 'Layout', 'OutputError', 'STALE_SECONDS',
           'SUCCESS_MARKER', 'StagedOutput', 'claim', 'staging_root')


def claim(files: Files, output_dir: str, *, layout: Layout,
          partition: str = '', overwrite: bool = False,
          input_pattern: str = '',
          reads: Optional[Callable[[str], bool]] = None,
          beside: Optional[Callable[[str], None]] = None,
          flag: str = '--output_dir') -> StagedOutput:
  """The staged output of a job that writes ``layout`` into
  ``output_dir`` (or its ``partition``), once every check of ``rules``
  passed (else an OutputError); publishing runs them all again. ``reads``:
  whether the job's input pattern reads a (resolved) path; ``beside``: the
  checks of the partitions beside this one, given the (resolved) root
  (``partitions.check_beside``); ``flag``: how messages name the folder's
  flag. Enter it to create the staging folder."""
  output = StagedOutput(files, output_dir, partition=partition,
                        publishes=layout.publishes,
                        check=lambda staging_dir: check(target, staging_dir))
  target = Target(files, output.root, output.final_dir, layout,
                  flag, overwrite, input_pattern, reads,
                  beside and (lambda: beside(output.root)))
  check(target, output.staging_dir)
  return output
