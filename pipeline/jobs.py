"""What every Beam job shares: its flags, runner defaults and running a
pipeline."""
import argparse
import importlib
import logging
import socket
import threading
from typing import Callable, List, Optional, Sequence

import apache_beam as beam
import grpc
from apache_beam.io.filesystems import FileSystems
from apache_beam.options import pipeline_options
from apache_beam.options.pipeline_options import DirectOptions
from apache_beam.options.pipeline_options import FlinkRunnerOptions
from apache_beam.options.pipeline_options import GoogleCloudOptions
from apache_beam.options.pipeline_options import JobServerOptions
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
from apache_beam.runners import runner as runners
from apache_beam.runners.runner import PipelineState

import cli
from cli import flags
from pipeline import job_servers
from pipeline import watch

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
  return options


def _runner(options: PipelineOptions) -> str:
  return (options.view_as(StandardOptions).runner or '').lower().replace(
      'runner', '')


def workers_in_this_process(pipeline_args: List[str]) -> bool:
  """Whether the runner runs the pipeline's workers in the launcher's
  process: the default FnApiRunner and DirectRunner, in memory or on
  threads (not multi_processing)."""
  options = pipeline_options(pipeline_args)
  return (_runner(options) in ('fnapi', 'direct') and
          options.view_as(DirectOptions).direct_running_mode in (
              'in_memory', 'multi_threading'))


def _flink_rest_url(options: PipelineOptions) -> Optional[str]:
  """The REST address of the Flink cluster a FlinkRunner job goes to; None
  for another runner, or Flink's embedded mini-cluster."""
  if _runner(options) != 'flink':
    return None
  master = options.view_as(FlinkRunnerOptions).flink_master.strip()
  if master.startswith('['):  # [local], [auto], [collection]
    return None
  return master if '://' in master else f'http://{master}'


def _free_port() -> int:
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    return probe.getsockname()[1]


_SPARK_UI_PORT = '-Dspark.ui.port='


def _cluster_view(options: PipelineOptions) -> watch.View:
  """How this run sees its job on a cluster runner, its options set for
  it: a name of its own on the cluster; for Spark, the port of the driver's
  UI (the driver runs in the job server the launcher starts)."""
  names = options.view_as(GoogleCloudOptions)
  rest_url = _flink_rest_url(options)
  if rest_url:
    names.job_name = watch.unique_job_name(names.job_name)
    return watch.FlinkView(rest_url, names.job_name)
  if _runner(options) == 'spark':
    names.job_name = watch.unique_job_name(names.job_name)
    properties = options.view_as(JobServerOptions).job_server_jvm_properties
    given = [p for p in properties if p.startswith(_SPARK_UI_PORT)]
    port = given[-1][len(_SPARK_UI_PORT):] if given else str(_free_port())
    if not given:
      properties.append(_SPARK_UI_PORT + port)
    return watch.SparkView(f'http://localhost:{port}', names.job_name)
  return watch.View()


def check_runner_options(pipeline_args: List[str]) -> None:
  """A JobError naming every problem the runner finds with its options
  (DataflowRunner's missing project, region, temp_location) or with the
  job server it would start, before any work: Beam would find them only
  once the pipeline is built, and say them on lines after its first, or
  not at all."""
  options = pipeline_options(pipeline_args)
  try:
    runner = runners.create_runner(options.view_as(StandardOptions).runner)
  except Exception:  # pylint: disable=broad-except
    return  # not a runner by that name: Beam says so when the job runs
  errors = PipelineOptionsValidator(options, runner).validate()
  if errors:
    raise cli.JobError('the runner\'s options are not valid: ' + ' '.join(
        error.strip() for error in errors))
  job_servers.check(options)


def configure_filesystems(pipeline_args: List[str]) -> None:
  """Gives the launcher's own file access (listing the input, staging and
  publishing the output) the file system options among the pipeline's, such
  as --s3_endpoint_url: Beam sets them only once a pipeline is built."""
  FileSystems.set_options(pipeline_options(pipeline_args))


def run_pipeline(pipeline_args: List[str],
                 build: Callable[[beam.Pipeline], None],
                 stall_seconds: float = 0, progress_seconds: float = 0):
  """Builds a pipeline with ``build`` and runs it to the end; returns the
  runner's result, whose metrics the job may report. On a cluster runner
  the wait is bounded by the job's progress (``watch``)."""
  if not any(isinstance(f, _WithoutEmptySinkNotice)
             for f in _SINK_LOGGER.filters):
    _SINK_LOGGER.addFilter(_WithoutEmptySinkNotice())
  options = pipeline_options(pipeline_args)
  view = _cluster_view(options)
  pipeline = beam.Pipeline(options=options)
  build(pipeline)
  view.submitting()
  result = pipeline.run()
  try:
    quiet = watch.wait(result, view, stall_seconds, progress_seconds)
  except watch.NoProgress as stalled:
    outcome = ('the job was cancelled' if _cancel(result, view) else
               'cancelling the job failed (see the warnings above)')
    raise watch.NoProgress(
        f'{stalled}; {outcome}; nothing was published') from stalled
  except grpc.RpcError as lost:
    _cancel(result, view)
    raise RunnerFailed(
        'the runner\'s job service stopped answering '
        f'({lost.code().name}: {lost.details()}); nothing was published'
    ) from lost
  except BaseException:
    _cancel(result, view)
    raise
  if quiet is not None:
    logging.info('the runner\'s longest spell without progress: %.0f s '
                 '(--stall_seconds=%g)', quiet, stall_seconds)
  return result


# How long the job service may take to answer a cancel: one that no longer
# answers (its cluster gone) must not keep the launcher.
_CANCEL_SECONDS = 30


class RunnerFailed(cli.JobError):
  """The runner went away while the job ran."""
  exit_status = cli.EXIT_FAILED


def _cancel(result, view: watch.View) -> bool:
  """Cancels the job behind ``result`` when the launcher stops waiting for
  it (a signal, a failure, no progress): a cluster runner (Flink, Spark,
  Dataflow) would otherwise run it on, writing into a staging folder that
  is being removed. The job service cancels by the job's id; Beam's Flink
  job server marks a job on a remote cluster cancelled without cancelling
  it there, so the view cancels it by the id the cluster gave it too. A
  job that has ended already, or a runner that cannot cancel, leaves
  nothing to do. Whether the job is cancelled."""
  cancelled = []

  def cancel():
    try:
      if not PipelineState.is_terminal(result.state):
        result.cancel()
      cancelled.append(True)
    except Exception as error:  # pylint: disable=broad-except
      logging.warning('could not cancel the pipeline: %s', error)

  cancelling = threading.Thread(target=cancel, name='cancel', daemon=True)
  cancelling.start()
  cancelling.join(_CANCEL_SECONDS)
  if cancelling.is_alive():
    logging.warning('the job service did not answer the cancel in %d s',
                    _CANCEL_SECONDS)
  # A job on a remote cluster, which the job service's cancel does not
  # reach, is cancelled when the cluster says so.
  return view.cancel() if view.remote else bool(cancelled)

