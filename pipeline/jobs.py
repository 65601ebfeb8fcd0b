"""What every Beam job shares: its flags, runner defaults and running a
pipeline."""
import argparse
import importlib
import json
import logging
from typing import Callable, List, Optional, Sequence
import urllib.request
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options import pipeline_options
from apache_beam.options.pipeline_options import FlinkRunnerOptions
from apache_beam.options.pipeline_options import GoogleCloudOptions
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
from apache_beam.runners import runner as runners
from apache_beam.runners.runner import PipelineState

import cli
from cli import flags

# DirectRunner first tries to download the Prism runner, which an offline or
# locked-down machine cannot do; FnApiRunner is the engine DirectRunner then
# falls back to for batch pipelines, so it is our default. Any --runner given
# on the command line wins.
DEFAULT_RUNNER = 'FnApiRunner'


class _WithoutEmptySinkNotice(logging.Filter):
  """Drops Beam's warning that a file sink finalized no shard: the dead
  letters' sink writes none (``skip_if_empty``) in a run that rejected
  nothing, which is no news."""

  def filter(self, record):
    return not record.getMessage().startswith('No shards found to finalize')


_SINK_LOGGER = logging.getLogger('apache_beam.io.filebasedsink')


class _BeamFlagError(Exception):
  pass


class _BeamFlags(pipeline_options._BeamArgumentParser):  # pylint: disable=protected-access
  """Beam's own parser of pipeline options, its errors raised, not
  printed."""

  def error(self, message):
    raise _BeamFlagError(message)


def _runner_problem(pipeline_args: Sequence[str]) -> Optional[str]:
  """Why ``--runner`` cannot be created, if it cannot. Creating it also
  imports its module, whose option classes (DaskOptions) then count."""
  finder = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  finder.add_argument('--runner')
  runner, _ = finder.parse_known_args(pipeline_args)
  if not runner.runner:
    return None
  try:
    runners.create_runner(runner.runner)
  except (ImportError, ValueError, AttributeError) as error:
    return f'--runner={runner.runner}: {error}'
  return None


def _register_dask_options() -> None:
  """Beam's DaskOptions, the one options class outside Beam's
  pipeline_options module, count once its module is imported (with the
  ``dask`` extra installed)."""
  try:
    importlib.import_module('apache_beam.runners.dask.dask_runner')
  except ImportError:
    pass


def beam_flags_problem(pipeline_args: List[str],
                       ours: Sequence[str]) -> Optional[str]:
  """None when every flag is an option of some Beam ``PipelineOptions``
  class; else the error, naming the closest flag of ours or Beam's."""
  problem = _runner_problem(pipeline_args)
  if problem:
    return problem
  if any(arg.startswith('--dask_') for arg in pipeline_args):
    _register_dask_options()
  parser = _BeamFlags(allow_abbrev=False)
  for options in PipelineOptions.__subclasses__():
    options._add_argparse_args(parser)  # pylint: disable=protected-access
  try:
    beam_options, leftover = parser.parse_known_args(pipeline_args)
  except _BeamFlagError as error:
    return str(error)
  # Beam takes any int and fails later with an IndexError; 0 is its "one
  # worker a core".
  if beam_options.direct_num_workers < 0:
    return (f'--direct_num_workers must be >= 0 (0: one a core), not '
            f'{beam_options.direct_num_workers}')
  beam_flags = [option for action in parser._actions  # pylint: disable=protected-access
                for option in action.option_strings]
  return flags.unknown(flags.flag_words(leftover), [*ours, *beam_flags])


def parse_args(parser: flags.Parser, argv: Optional[Sequence[str]]):
  """A Beam job's flags and the pipeline's (every runner's options pass
  through); any other flag ends the run with one ``error:`` line."""
  return flags.parse(parser, argv, passes=lambda rest: beam_flags_problem(
      rest, parser.flag_names()))


def pipeline_options(pipeline_args: List[str]) -> PipelineOptions:
  options = PipelineOptions(pipeline_args)
  standard = options.view_as(StandardOptions)
  if standard.runner is None:
    standard.runner = DEFAULT_RUNNER
  if _flink_rest_url(options):
    names = options.view_as(GoogleCloudOptions)
    # The name the Flink cluster gives the job: how _cancel finds it.
    names.job_name = names.job_name or f'beam-text-classifier-{uuid.uuid4()}'
  return options


def _flink_rest_url(options: PipelineOptions) -> Optional[str]:
  """The REST address of the Flink cluster a FlinkRunner job goes to; None
  for another runner, or Flink's embedded mini-cluster."""
  if options.view_as(StandardOptions).runner not in ('FlinkRunner',
                                                     'flink'):
    return None
  master = options.view_as(FlinkRunnerOptions).flink_master.strip()
  if master.startswith('['):  # [local], [auto], [collection]
    return None
  return master if '://' in master else f'http://{master}'


def check_runner_options(pipeline_args: List[str]) -> None:
  """A JobError naming every problem the runner finds with its options
  (DataflowRunner's missing project, region, temp_location), before any
  work: Beam would find them only once the pipeline is built, and say them
  on lines after its first."""
  options = pipeline_options(pipeline_args)
  try:
    runner = runners.create_runner(options.view_as(StandardOptions).runner)
  except Exception:  # pylint: disable=broad-except
    return  # not a runner by that name: Beam says so when the job runs
  errors = PipelineOptionsValidator(options, runner).validate()
  if errors:
    raise cli.JobError('the runner\'s options are not valid: ' + ' '.join(
        error.strip() for error in errors))


def configure_filesystems(pipeline_args: List[str]) -> None:
  """Gives the launcher's own file access (listing the input, staging and
  publishing the output) the file system options among the pipeline's, such
  as --s3_endpoint_url: Beam sets them only once a pipeline is built."""
  FileSystems.set_options(pipeline_options(pipeline_args))


def run_pipeline(pipeline_args: List[str],
                 build: Callable[[beam.Pipeline], None]):
  """Builds a pipeline with ``build`` and runs it to the end; returns the
  runner's result, whose metrics the job may report."""
  if not any(isinstance(f, _WithoutEmptySinkNotice)
             for f in _SINK_LOGGER.filters):
    _SINK_LOGGER.addFilter(_WithoutEmptySinkNotice())
  options = pipeline_options(pipeline_args)
  pipeline = beam.Pipeline(options=options)
  build(pipeline)
  result = pipeline.run()
  try:
    result.wait_until_finish()
  except BaseException:
    _cancel(result, options)
    raise
  return result


def _cancel(result, options: PipelineOptions) -> None:
  """Cancels the job behind ``result`` when the launcher stops waiting for
  it (a signal, a failure): a cluster runner (Flink, Spark, Dataflow) would
  otherwise run it on, writing into a staging folder that is being
  removed. A job that has ended already, or a runner that cannot cancel,
  leaves nothing to do."""
  try:
    if not PipelineState.is_terminal(result.state):
      result.cancel()
  except Exception as error:  # pylint: disable=broad-except
    logging.warning('could not cancel the pipeline: %s', error)
  rest_url = _flink_rest_url(options)
  if rest_url:
    _cancel_on_flink(rest_url, options.view_as(GoogleCloudOptions).job_name)


_FLINK_ENDED = ('FINISHED', 'CANCELED', 'FAILED')


def _cancel_on_flink(rest_url: str, job_name: str) -> None:
  """Beam's Flink job server marks a job cancelled without cancelling it
  on a remote cluster: Flink's REST API does, by the job's name."""
  try:
    with urllib.request.urlopen(f'{rest_url}/jobs/overview',
                                timeout=10) as response:
      found = json.load(response)['jobs']
    for job in found:
      if job['name'] == job_name and job['state'] not in _FLINK_ENDED:
        urllib.request.urlopen(urllib.request.Request(
            f'{rest_url}/jobs/{job["jid"]}?mode=cancel', method='PATCH'),
                               timeout=10).close()
  except (OSError, ValueError, KeyError) as error:
    logging.warning('could not cancel the job on Flink at %s: %s', rest_url,
                    error)

