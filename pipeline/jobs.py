"""What every job's entry point shares: runner defaults and clean failure."""
import logging
import sys
from typing import Callable, List, Optional

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.pipeline_options import StandardOptions

from pipeline import outputs

# DirectRunner first tries to download the Prism runner, which an offline or
# locked-down machine cannot do; FnApiRunner is the engine DirectRunner then
# falls back to for batch pipelines, so it is our default. Any --runner given
# on the command line wins.
DEFAULT_RUNNER = 'FnApiRunner'


class JobError(Exception):
  """A job-level fault: reported as one line, exit status 2."""


def pipeline_options(pipeline_args: List[str]) -> PipelineOptions:
  options = PipelineOptions(pipeline_args)
  standard = options.view_as(StandardOptions)
  if standard.runner is None:
    standard.runner = DEFAULT_RUNNER
  return options


def stage_output(final_dir: str, input_pattern: str) -> outputs.StagedOutput:
  """A created staging folder for a job's output; a JobError when the output
  cannot be written or lies inside the input."""
  output = outputs.StagedOutput(final_dir)
  try:
    output.create(input_pattern=input_pattern)
  except outputs.OutputError as error:
    raise JobError(str(error)) from error
  return output


def main(run: Callable[[Optional[List[str]]], object]) -> None:
  """Runs a job's ``run(argv)``, turning a JobError into one line and exit 2."""
  logging.basicConfig(
      level=logging.INFO, format='%(asctime)s %(levelname)s %(message)s')
  # Beam and TF log every stage at INFO; keep the job's own lines readable.
  for noisy in ('apache_beam', 'tensorflow', 'absl', 'tensorflow_transform'):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  try:
    run(sys.argv[1:])
  except JobError as error:
    print(f'error: {error}', file=sys.stderr)
    sys.exit(2)
