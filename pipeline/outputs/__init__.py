"""Job outputs that appear whole or not at all, on any Beam filesystem.

A job writes into a staging folder and publishes it only after the pipeline
succeeded, so a failed or killed run never leaves a half-written output where
a finished one is expected (``staging``). Before it starts, its output
location is checked (``policy``): never inside the input, and never
replacing what the job did not publish unless told to. ``staged`` does both.
"""
from typing import Optional

from pipeline.outputs.files import read_json
from pipeline.outputs.files import write_json
from pipeline.outputs.policy import Layout
from pipeline.outputs.policy import OutputError
from pipeline.outputs.policy import check_outside_input
from pipeline.outputs.policy import check_replaceable
from pipeline.outputs.staging import STALE_SECONDS
from pipeline.outputs.staging import StagedOutput
from schemas.folders import SUCCESS_MARKER
from pipeline.outputs.staging import mark_finished
from pipeline.outputs.staging import staging_root

__all__ = ('Layout', 'OutputError', 'STALE_SECONDS', 'SUCCESS_MARKER',
           'StagedOutput', 'mark_finished', 'read_json', 'staged',
           'staging_root', 'write_json')


def staged(root: str, input_pattern: Optional[str] = None, *,
           partition: str = '', layout: Layout = Layout(),
           overwrite: bool = False) -> StagedOutput:
  """The staged output of a job that reads ``input_pattern`` and writes
  ``layout``, once the location passed the policy's checks (else an
  OutputError), which publishing runs again; enter it to create the staging
  folder."""
  def check():
    check_replaceable(output.root, output.final_dir, layout, overwrite,
                      input_pattern or '')

  output = StagedOutput(root, partition=partition, publishes=layout.publishes,
                        check=check)
  if input_pattern:
    check_outside_input([output.final_dir, output.staging_dir], layout,
                        input_pattern)
  check()
  return output
