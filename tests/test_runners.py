"""The jobs beyond one process: our package installed from its sdist in a
clean virtual environment, Beam's portable job service with an EXTERNAL
worker pool (the way Flink and Spark run Python workers), and a
dask.distributed cluster through Beam's DaskRunner."""
import collections
import contextlib
import functools
import glob
import json
import os
import subprocess
import sys
import sysconfig
import uuid

import distributed
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipeline import preprocess
from pipeline.preprocessing import splits as split_lib
from pipeline.scoring import inference
from schemas import raw
from schemas import scored
from schemas import transformed
from clusters import processes
from tests import runner_checks
from tests.conftest import REPO
from tests.conftest import synthetic_reviews
from tests.conftest import write_jsonl
from tests.runner_checks import preprocessed_by_default  # pylint: disable=unused-import
from tests.runner_checks import score_on_and_off


@contextlib.contextmanager
def running(command, port, log=None, **kwargs):
  """``command`` running until the context ends, once it listens on
  ``port``; its output in ``log``."""
  with processes.started(command, log, **kwargs) as process:
    processes.wait_until(lambda: processes.listens(port), [(process, None)],
                         str(command[-1]))
    yield process


@pytest.fixture(scope='module')
def sdist_env(tmp_path_factory):
  """A virtual environment holding our package only as installed from the
  sdist that ``--setup_file`` builds; the heavy dependencies (TF, Beam) are
  borrowed from the test's own environment through a .pth file, which does
  not carry over our editable install."""
  folder = tmp_path_factory.mktemp('sdist')
  subprocess.run([sys.executable, 'setup.py', '-q', 'sdist', '--dist-dir',
                  str(folder / 'dist')], cwd=REPO, check=True,
                 capture_output=True)
  (sdist,) = glob.glob(str(folder / 'dist' / '*.tar.gz'))
  venv = folder / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)],
                 check=True)
  python = venv / 'bin' / 'python'
  site = subprocess.run(
      [python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
      check=True, capture_output=True, text=True).stdout.strip()
  with open(os.path.join(site, 'borrowed_dependencies.pth'), 'w') as handle:
    handle.write(sysconfig.get_path('purelib') + '\n')
  subprocess.run([python, '-m', 'pip', 'install', '--quiet', '--no-deps',
                  '--no-index', '--no-build-isolation', sdist],
                 cwd=folder, check=True, capture_output=True)
  return venv, folder


def test_package_installs_from_its_sdist(sdist_env):
  venv, folder = sdist_env
  found = subprocess.run(
      [venv / 'bin' / 'python', '-c',
       'import pipeline.score, pipeline.preprocess, trainer.train, '
       'schemas.scored; print(pipeline.__file__)'],
      cwd=folder, check=True, capture_output=True, text=True).stdout
  assert found.startswith(str(venv)), found
  usage = subprocess.run([venv / 'bin' / 'python', '-m', 'pipeline.score',
                          '--help'], cwd=folder, capture_output=True,
                         text=True)
  assert usage.returncode == 0 and '--partition' in usage.stdout


@pytest.fixture(scope='module')
def portable_runner(sdist_env):
  """Beam's job service and an EXTERNAL worker pool on 127.0.0.1; the pool
  starts SDK workers with the `python` on its PATH: the sdist environment's."""
  venv, folder = sdist_env
  job_port, pool_port = processes.free_port(), processes.free_port()
  env = dict(os.environ, PATH=f'{venv / "bin"}{os.pathsep}{os.environ["PATH"]}')
  env.pop('PYTHONPATH', None)
  with running([sys.executable, '-m',
                'apache_beam.runners.portability.local_job_service_main',
                f'--port={job_port}'], job_port), running(
                    [venv / 'bin' / 'python', '-m',
                     'apache_beam.runners.worker.worker_pool_main',
                     f'--service_port={pool_port}'], pool_port, env=env,
                    cwd=folder):
    yield ['--runner=PortableRunner', f'--job_endpoint=localhost:{job_port}',
           '--environment_type=EXTERNAL',
           f'--environment_config=localhost:{pool_port}',
           f'--setup_file={REPO / "setup.py"}']


def test_preprocess_on_the_portable_runner(portable_runner, tmp_path):
  corpus = write_jsonl(tmp_path / 'reviews.jsonl', synthetic_reviews(
      120, 0) + synthetic_reviews(40, 1) + [{'id': 'bad', 'text': ' '}])
  stats = preprocess.run([f'--input={corpus}',
                          f'--output_dir={tmp_path / "pre"}',
                          '--split_field=split', '--max_len=24',
                          *portable_runner])
  validation = sum(split_lib.hash_split(row['text'], 0.0, 0.1) ==
                   raw.VALIDATION for row in synthetic_reviews(120, 0))
  assert stats['records'] == {'read': 161, 'rejected': 1, 'ids_replaced': 0,
                              'written': {'train': 120 - validation,
                                          'validation': validation,
                                          'test': 40}}
  assert sorted(stats['labels']['names']) == ['neg', 'pos']
  assert glob.glob(str(tmp_path / 'pre' / 'train-*.tfrecord.gz'))
  assert glob.glob(str(tmp_path / 'pre' / transformed.ngram_file_pattern()))


def test_score_on_the_portable_runner(portable_runner, trained, tmp_path):
  manifest = score_on_and_off(portable_runner, trained, tmp_path,
                              synthetic_reviews(60, 2))
  assert manifest['counts']['scored'] == 60


class CountingHandler(inference.RawTextModelHandler):
  """Leaves a file a batch, naming its documents, in a folder every worker
  process shares: how often each document was scored; and a file a model
  load, named by its process, in another."""

  def __init__(self, *args, calls_dir, loads_dir, **kwargs):
    super().__init__(*args, **kwargs)
    self._calls_dir = calls_dir
    self._loads_dir = loads_dir

  def load_model(self):
    with open(os.path.join(self._loads_dir,
                           f'{os.getpid()}-{uuid.uuid4().hex}'), 'w'):
      pass
    return super().load_model()

  def run_inference(self, batch, model, inference_args=None):
    with open(os.path.join(self._calls_dir, uuid.uuid4().hex), 'w',
              encoding='utf-8') as handle:
      json.dump([record[raw.ID] for record in batch], handle)
    return super().run_inference(batch, model, inference_args)


@contextlib.contextmanager
def counting_model_calls(calls_dir, loads_dir):
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(inference, 'RawTextModelHandler', functools.partial(
        CountingHandler, calls_dir=str(calls_dir), loads_dir=str(loads_dir)))
    yield


def loads_by_process(loads_dir):
  return collections.Counter(name.split('-')[0]
                             for name in os.listdir(loads_dir))


def scored_ids(calls_dir):
  ids = []
  for name in os.listdir(calls_dir):
    with open(os.path.join(calls_dir, name), encoding='utf-8') as handle:
      ids.extend(json.load(handle))
  return sorted(ids)


def assert_each_document_once(output_dir, ids):
  """What any reader of the folder sees: every Parquet file below it, as a
  recursive glob or a pyarrow dataset finds them, holds each id once."""
  everything = glob.glob(f'{output_dir}/**', recursive=True)
  assert not [path for path in everything if 'beam-temp' in path]
  files = [path for path in everything if path.endswith('.parquet')]
  table = pa.concat_tables(pq.read_table(path) for path in files)
  assert table.num_rows == len(ids)
  assert sorted(table.column(scored.ID).to_pylist()) == sorted(ids)
  found = ds.dataset(str(output_dir), format='parquet',
                     exclude_invalid_files=True).to_table()
  assert found.num_rows == len(ids)


# Two layouts of two single-threaded worker processes: two `dask worker`
# commands, and one command that starts both.
DASK_WORKERS = {
    'two-workers': [['--nworkers=1'], ['--nworkers=1']],
    'one-worker-two-processes': [['--nworkers=2']],
}


def started_dask(stack: contextlib.ExitStack, workers, logs):
  """A dask.distributed scheduler and a `dask worker` command for each of
  ``workers`` (their arguments) of single-threaded processes, stopped when
  ``stack`` closes, their logs in ``logs``: (the scheduler's address, its
  process)."""
  port = processes.free_port()
  address = f'127.0.0.1:{port}'
  scheduler = stack.enter_context(running(
      [sys.executable, '-m', 'distributed.cli.dask_scheduler',
       '--host=127.0.0.1', f'--port={port}', '--no-dashboard'], port,
      logs / 'scheduler.log'))
  for index, worker_args in enumerate(workers):
    stack.enter_context(running(
        [sys.executable, '-m', 'distributed.cli.dask_worker',
         f'tcp://{address}', '--nthreads=1', '--no-dashboard',
         *worker_args], port, logs / f'worker-{index}.log', cwd=REPO))
  return address, scheduler


@pytest.fixture(scope='module', params=sorted(DASK_WORKERS))
def dask_cluster(request, tmp_path_factory):
  """A dask.distributed scheduler and two single-threaded worker processes,
  all connected before the fixture returns; their logs in a folder of the
  test's temporary files."""
  with contextlib.ExitStack() as stack:
    address, _ = started_dask(stack, DASK_WORKERS[request.param],
                              tmp_path_factory.mktemp('dask-logs'))
    with distributed.Client(address) as client:
      client.wait_for_workers(2, timeout=120)
    yield ['--runner=pipeline.dask_runner.DaskRunner',
           f'--dask_client_address={address}']


@pytest.mark.runners
def test_score_on_dask_writes_each_document_once(dask_cluster, trained,
                                                 tmp_path):
  rows = synthetic_reviews(300, 3)
  calls, loads = tmp_path / 'calls', tmp_path / 'loads'
  calls.mkdir()
  loads.mkdir()
  # More partitions than worker processes: each process runs several.
  manifest = score_on_and_off(dask_cluster + ['--dask_npartitions=6'],
                              trained, tmp_path,
                              rows + [{'id': 'bad', 'text': ''}],
                              on_runner=counting_model_calls(calls, loads))
  ids = [row['id'] for row in rows]
  assert manifest['counts']['scored'] == len(rows)
  assert manifest['counts']['rejected'] == 1
  assert_each_document_once(tmp_path / 'runner', ids)
  # One model call a document, on the Dask run (the only one counted).
  assert scored_ids(calls) == sorted(ids)
  # A worker process loads the model once for all its partitions, as a
  # Beam worker sets a DoFn up once for all its bundles.
  assert set(loads_by_process(loads).values()) == {1}


@pytest.mark.runners
def test_preprocess_on_dask_matches_the_default_runner(
    dask_cluster, preprocessed_by_default, tmp_path):
  runner_checks.preprocesses_as_the_default_runner(
      dask_cluster + [f'--dask_npartitions={runner_checks.INPUT_FILES}'],
      preprocessed_by_default, tmp_path)


def fused_steps(pipeline):
  """Chains of ParDos the Dask runner runs as one task a partition, with
  what a fused stage must get right, checked with assert_that: a
  multi-output step with outputs read inside the stage, outside it and by
  nothing; a NoOp (WindowInto) between two steps; a step that emits only in
  finish_bundle, before the steps after it finish; and a step whose side
  input waits for the stage that makes its main input, so cannot join it."""
  # pylint: disable=import-outside-toplevel
  import apache_beam as beam
  from apache_beam.testing.util import assert_that
  from apache_beam.testing.util import equal_to
  from apache_beam.transforms import window
  from apache_beam.utils.windowed_value import WindowedValue

  class Split(beam.DoFn):

    def process(self, number):
      if number % 3 == 0:
        yield beam.pvalue.TaggedOutput('threes', number)
      if number % 5 == 0:
        yield beam.pvalue.TaggedOutput('unread', number)
      yield number

  class CountPerBundle(beam.DoFn):

    def start_bundle(self):
      self.count = 0  # pylint: disable=attribute-defined-outside-init

    def process(self, number):
      self.count += 1

    def finish_bundle(self):
      yield WindowedValue(self.count, 0, [window.GlobalWindow()])

  numbers = pipeline | beam.Create(range(40)) | beam.Reshuffle()
  split = numbers | beam.ParDo(Split()).with_outputs(
      'threes', 'unread', main='all')
  doubled = (split.all | 'Double' >> beam.Map(lambda n: 2 * n)
             | beam.WindowInto(window.GlobalWindows()))
  counted = (doubled | beam.ParDo(CountPerBundle())
             | 'Counted' >> beam.CombineGlobally(sum))
  assert_that(counted, equal_to([40]), label='CountedOnce')
  total = doubled | 'Total' >> beam.CombineGlobally(sum)
  shares = doubled | 'Share' >> beam.Map(
      lambda n, total: (n, total), total=beam.pvalue.AsSingleton(total))
  assert_that(shares, equal_to([(2 * n, 1560) for n in range(40)]),
              label='SideInputOfItsOwnStage')
  both = ((split.threes, doubled) | beam.Flatten()
          | 'Both' >> beam.combiners.Count.Globally())
  assert_that(both, equal_to([14 + 40]), label='ReadOutsideTheStage')


@pytest.mark.runners
def test_dask_runner_fuses_steps_as_beam_runs_them(dask_cluster):
  # pylint: disable=import-outside-toplevel
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions
  with beam.Pipeline(options=PipelineOptions(
      dask_cluster + ['--dask_npartitions=3'])) as pipeline:
    fused_steps(pipeline)


@pytest.mark.runners
def test_dask_runner_gathers_no_output_to_the_client(dask_cluster):
  """What no transform reads stays on the workers: the client that waits
  for the job gets empty lists, however large that output is."""
  # pylint: disable=import-outside-toplevel
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions
  pipeline = beam.Pipeline(options=PipelineOptions(dask_cluster))
  _ = (pipeline | beam.Create(range(4)) | beam.Reshuffle()
       | beam.FlatMap(lambda n: [str(n) * 1000] * 1000))
  result = pipeline.run()
  try:
    gathered = result.client.gather(result.futures)
  finally:
    result.wait_until_finish()
  sizes = [len(part) for part in gathered]
  assert sizes and not any(sizes), sizes


# One layout: what keeps the value lives on the scheduler, whatever the
# workers' layout.
@pytest.mark.runners
@pytest.mark.parametrize('dask_cluster', ['two-workers'], indirect=True)
def test_a_side_input_keeps_its_first_value_when_its_workers_are_lost(
    dask_cluster, tmp_path):
  """Dask computes a lost key again. A side input drawn at random (as TFT's
  analysis names a new folder each time it runs) keeps the value the job's
  first readers saw when every worker is restarted in the middle of the
  job: the DoFns that read it, set up with it, never see another."""
  # pylint: disable=import-outside-toplevel
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions
  seen, go = tmp_path / 'seen', tmp_path / 'go'
  seen.mkdir()

  def record(number, drawn):
    # Every attempt at every element leaves its own file.
    (seen / uuid.uuid4().hex).write_text(drawn)
    processes.wait_until(go.exists, [], 'the test lets the job go on', 300)
    return number

  pipeline = beam.Pipeline(options=PipelineOptions(
      dask_cluster + ['--dask_npartitions=4']))
  drawn = (pipeline | 'One' >> beam.Create([None])
           | 'Draw' >> beam.Map(lambda _: uuid.uuid4().hex))
  _ = (pipeline | beam.Create(range(4)) | beam.Reshuffle()
       | beam.Map(record, drawn=beam.pvalue.AsSingleton(drawn)))
  result = pipeline.run()
  address = dask_cluster[-1].split('=', 1)[1]
  with distributed.Client(address) as client:
    processes.wait_until(lambda: any(seen.iterdir()), [],
                         'a task read the side input')
    client.restart_workers(list(client.scheduler_info()['workers']))
  go.touch()
  assert result.wait_until_finish() == 'DONE'
  attempts = list(seen.iterdir())
  assert len(attempts) > 4  # the restart made the job run elements again
  assert len({path.read_text() for path in attempts}) == 1
  # The job leaves nothing on the scheduler.
  with distributed.Client(address) as client:
    assert not client.list_datasets()


@pytest.mark.runners
def test_a_job_whose_dask_scheduler_is_lost_fails(tmp_path):
  """The scheduler killed while the job's tasks run: Beam's result would
  count the tasks the client then cancels as done; ours fails the job."""
  # pylint: disable=import-outside-toplevel
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions
  from apache_beam.runners.runner import PipelineState
  started, never = tmp_path / 'started', tmp_path / 'never'
  with contextlib.ExitStack() as stack:
    address, scheduler = started_dask(stack, [[]], tmp_path)

    def wait(number):
      started.touch()
      # Released by the worker's end with the cluster, never by the test.
      processes.wait_until(never.exists, [], 'the test ends the cluster', 300)
      return number

    pipeline = beam.Pipeline(options=PipelineOptions([
        '--runner=pipeline.dask_runner.DaskRunner',
        f'--dask_client_address={address}']))
    _ = pipeline | beam.Create(range(2)) | beam.Reshuffle() | beam.Map(wait)
    result = pipeline.run()
    processes.wait_until(started.exists, [], 'a task started')
    scheduler.kill()
    with pytest.raises(Exception):
      result.wait_until_finish()
    assert result.state == PipelineState.FAILED
