"""What every Beam job shares: runner defaults and running a pipeline."""
from typing import Callable, List

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.pipeline_options import StandardOptions

# DirectRunner first tries to download the Prism runner, which an offline or
# locked-down machine cannot do; FnApiRunner is the engine DirectRunner then
# falls back to for batch pipelines, so it is our default. Any --runner given
# on the command line wins.
DEFAULT_RUNNER = 'FnApiRunner'


def pipeline_options(pipeline_args: List[str]) -> PipelineOptions:
  options = PipelineOptions(pipeline_args)
  standard = options.view_as(StandardOptions)
  if standard.runner is None:
    standard.runner = DEFAULT_RUNNER
  return options


def configure_filesystems(pipeline_args: List[str]) -> None:
  """Gives the launcher's own file access (listing the input, staging and
  publishing the output) the file system options among the pipeline's, such
  as --s3_endpoint_url: Beam sets them only once a pipeline is built."""
  FileSystems.set_options(pipeline_options(pipeline_args))


def run_pipeline(pipeline_args: List[str],
                 build: Callable[[beam.Pipeline], None]):
  """Builds a pipeline with ``build`` and runs it to the end; returns the
  runner's result, whose metrics the job may report."""
  pipeline = beam.Pipeline(options=pipeline_options(pipeline_args))
  build(pipeline)
  result = pipeline.run()
  result.wait_until_finish()
  return result
