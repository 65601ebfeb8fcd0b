"""Beam's Java job servers (Flink's, Spark's), checked before a job starts
one: Beam reports a jar cut short, a Java that does not run or a path Java
cannot open only as "Service failed to start up with error 1".
"""
import os
import subprocess
import zipfile
from typing import Optional

from apache_beam.options.pipeline_options import FlinkRunnerOptions
from apache_beam.options.pipeline_options import JobServerOptions
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.pipeline_options import PortableOptions
from apache_beam.options.pipeline_options import SparkRunnerOptions
from apache_beam.options.pipeline_options import StandardOptions

import cli
from cli import lifetime

# How long ``java -version`` may take.
_JAVA_SECONDS = 60


def _jar_flag(options: PipelineOptions):
  """(the flag, its jar) of the job server the runner would start; None
  where it starts none (another runner, a --job_endpoint given)."""
  if options.view_as(PortableOptions).job_endpoint:
    return None
  runner = (options.view_as(StandardOptions).runner or '').lower()
  if runner in ('flinkrunner', 'flink'):
    master = options.view_as(FlinkRunnerOptions).flink_master.strip()
    if master == '[auto]':
      return None
    return ('--flink_job_server_jar',
            options.view_as(FlinkRunnerOptions).flink_job_server_jar)
  if runner in ('sparkrunner', 'spark'):
    return ('--spark_job_server_jar',
            options.view_as(SparkRunnerOptions).spark_job_server_jar)
  return None


def _jar_problem(path: str) -> Optional[str]:
  if '://' in path:
    return None  # Beam downloads it
  if not os.path.isfile(path):
    return 'no such file'
  try:
    with zipfile.ZipFile(path) as jar:
      jar.getinfo('META-INF/MANIFEST.MF')
  except (zipfile.BadZipFile, KeyError, OSError) as error:
    return f'not a whole jar ({error})'
  return None


def _java_problem(java: str) -> Optional[str]:
  try:
    ran = subprocess.run([java, '-version'], capture_output=True, text=True,
                         timeout=_JAVA_SECONDS, check=False)
  except (OSError, subprocess.TimeoutExpired) as error:
    return str(error)
  if ran.returncode:
    said = (ran.stderr + ran.stdout).strip().splitlines()
    return f'exit status {ran.returncode}' + (f': {said[-1]}' if said else '')
  return None


def check(options: PipelineOptions) -> None:
  """A JobError, before any work, where the job server the runner would
  start cannot start: its jar is missing or cut short, its Java does not
  run. The job server, which Beam starts with the launcher's environment,
  gets a UTF-8 locale where the launcher has none
  (``lifetime.java_environment``)."""
  found = _jar_flag(options)
  if found is None:
    return
  flag, jar = found
  problem = _jar_problem(jar) if jar else None
  if problem:
    raise cli.JobError(
        f'{flag}={jar}: {problem}; fetch it again (python -m clusters fetch '
        'for this project\'s job servers) or leave the flag out for Beam\'s '
        'own')
  java = options.view_as(JobServerOptions).job_server_java_launcher
  problem = _java_problem(java)
  if problem:
    raise cli.JobError(
        f'{java}, which runs the runner\'s job server, does not run '
        f'({problem}); install a JDK 17 or name one with '
        '--job_server_java_launcher')
  os.environ.update(lifetime.java_environment())
