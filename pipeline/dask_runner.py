"""Beam's DaskRunner with what our jobs need and Beam 2.77's version lacks.

    --runner=pipeline.dask_runner.DaskRunner --dask_client_address=HOST:8786

Beam 2.77's DaskRunner translates each Beam primitive into a dask.bag
operation. Four gaps in it lose, mix or duplicate data in our jobs, and one
leaves a cluster idle; this runner closes them and keeps everything else
(options, overrides, the other translations) as Beam has it:

- Only the lineage of the last transform applied is computed, so a pipeline
  with several sinks (Parquet, dead letters, counts) runs one of them. Here
  every transform whose output nobody consumes is computed.
- What a DoFn emits in ``finish_bundle`` is dropped, and with it the last
  batch of every BatchElements (so the scoring job's last documents) and our
  per-bundle counts. Here a bundle's outputs are collected after
  ``finish_bundle``.
- A consumer of one output of a multi-output ParDo receives every output of
  it (main and tagged together). Here each output PCollection gets only its
  own elements.
- A side input is computed inside each task that reads it, its whole lineage
  again, and dask's graph optimization runs the transforms that several sinks
  share once per sink: every file sink initialized several temporary folders
  and wrote its rows more than once, leaving ``beam-temp-*`` folders of
  duplicate rows beside the output. Here the sinks and the side inputs are
  one graph, in which each transform's tasks run once.
- Reshuffle is an identity, so a job that starts from one file pattern reads
  everything in one partition, on one worker. Here Reshuffle re-chunks its
  input over the cluster's worker threads (or ``--dask_npartitions``).
"""
import collections
import dataclasses
import functools
import itertools
import logging
import threading
import typing as t
import uuid

import apache_beam as beam

# This runner reaches into Beam's private DaskRunner internals
# (_OutputHandler, overrides._Reshuffle, the bag translations), which change
# between Beam releases without notice: refuse any other version than those
# it was tested with, rather than lose data quietly.
TESTED_BEAM_VERSIONS = ('2.77.0',)
if beam.__version__ not in TESTED_BEAM_VERSIONS:
  raise ImportError(
      f'pipeline.dask_runner was tested with apache-beam '
      f'{", ".join(TESTED_BEAM_VERSIONS)} and relies on its internals; this '
      f'is apache-beam {beam.__version__}. Install a tested version or use '
      'another runner.')
try:
  import dask
  import dask.bag
  import dask.distributed
  # Dask's task specification (private, like the Beam internals above): the
  # dask version is pinned in constraints.txt and tested with this runner.
  from dask._task_spec import Task
  from dask._task_spec import TaskRef
  from dask.highlevelgraph import HighLevelGraph
except ImportError as missing:
  raise ImportError(
      'the Dask runner needs the dask extra: pip install '
      '"beam-text-classifier[dask]"') from missing

# pylint: disable=wrong-import-position
from apache_beam import pvalue
from apache_beam.internal import pickler
from apache_beam.pipeline import PipelineVisitor
from apache_beam.runners.common import DoFnContext
from apache_beam.runners.common import DoFnInvoker
from apache_beam.runners.common import DoFnSignature
from apache_beam.runners.common import _OutputHandler
from apache_beam.runners.dask import dask_runner
from apache_beam.runners.dask import overrides
from apache_beam.runners.dask import transform_evaluator
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms.core import DoFn
from apache_beam.transforms.sideinputs import SideInputMap


@dataclasses.dataclass(frozen=True)
class _BundleSpec:
  """What a task needs to run one dask partition as one bundle of a ParDo."""
  label: str
  # The DoFn and its extra arguments, pickled by Beam: a worker process
  # unpickles a copy for each bundle it runs at the same time (two bundles
  # never share a DoFn's state) and reuses it for later bundles (_DoFnPool).
  pickled_fn: bytes
  window_fn: t.Any
  # The run of the pipeline, so that a worker keeps no DoFns of past jobs.
  job: str
  # (view class, view options, window mapping) of each side input, in the
  # order of the side-input values the task is given.
  side_views: t.Tuple = ()


class _DoFnPool:
  """The set-up DoFns of this worker process between their bundles.

  Beam's workers set a DoFn up once and hand it bundle after bundle, one at
  a time; DoFns rely on it to load what is costly once. Set up anew for
  each bundle, RunInference loaded its model again for every dask partition
  (its ``setup`` acquires a fresh ``Shared`` status object, which takes the
  model's place as the one object Beam's ``Shared`` map keeps alive, so the
  model is gone once the last bundle's DoFn is), and TFT's
  ``_RunMetaGraphDoFn`` its graph. A dask worker outlives the jobs it runs:
  the pool keeps one job's DoFns, and a bundle of another job tears the idle
  ones down.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._job = None
    self._idle = collections.defaultdict(list)

  def take(self, spec: _BundleSpec):
    """An idle (fn, args, kwargs) set up from ``spec.pickled_fn``, or None."""
    with self._lock:
      stale = {}
      if spec.job != self._job:
        stale, self._idle = self._idle, collections.defaultdict(list)
        self._job = spec.job
      idle = self._idle[spec.pickled_fn]
      taken = idle.pop() if idle else None
    for fn, _, _ in itertools.chain.from_iterable(stale.values()):
      try:
        fn.teardown()
      except Exception:  # pylint: disable=broad-except
        logging.warning('tearing down a DoFn of a past job failed',
                        exc_info=True)
    return taken

  def give_back(self, spec: _BundleSpec, fn_and_args) -> None:
    """``fn_and_args`` finished a bundle and is ready for the next."""
    with self._lock:
      if spec.job == self._job:
        self._idle[spec.pickled_fn].append(fn_and_args)


_POOL = _DoFnPool()


def _side_input_maps(spec: _BundleSpec, side_values):
  return [SideInputMap(view_class, options, [
      transform_evaluator.get_windowed_value(value, mapping)
      for value in values]) for (view_class, options, mapping), values in zip(
          spec.side_views, side_values)]


def _run_bundle(spec: _BundleSpec, items, *side_values):
  """One dask partition as one Beam bundle, finish_bundle's outputs kept.

  ``side_values`` are the side inputs' whole contents: dask computes them as
  dependencies of this task, in the same graph, instead of each bundle
  computing their lineage again.
  """
  reused = _POOL.take(spec)
  fn, args, kwargs = reused or pickler.loads(spec.pickled_fn)
  receivers = transform_evaluator.OneReceiver()
  invoker = DoFnInvoker.create_invoker(
      DoFnSignature(fn),
      _OutputHandler(
          window_fn=spec.window_fn,
          main_receivers=receivers[None],
          tagged_receivers=receivers,
          per_element_output_counter=None,
          output_batch_converter=None,
          process_yields_batches=False,
          process_batch_yields_elements=False),
      context=DoFnContext(spec.label, state=None),
      side_inputs=_side_input_maps(spec, side_values) or None,
      input_args=list(args),
      input_kwargs=kwargs,
      user_state_context=None,
      bundle_finalizer_param=DoFn.BundleFinalizerParam())
  if not reused:
    invoker.invoke_setup()
  invoker.invoke_start_bundle()
  for item in items:
    invoker.invoke_process(
        transform_evaluator.get_windowed_value(item, spec.window_fn))
  invoker.invoke_finish_bundle()
  # A bundle that raised drops its DoFn, as Beam's workers do.
  _POOL.give_back(spec, (fn, args, kwargs))
  # Windows are not kept between transforms (as in Beam's DaskRunner): the
  # jobs are batch jobs in the global window.
  return [pvalue.TaggedOutput(item.tag, item.value.value)
          if isinstance(item, pvalue.TaggedOutput) else item.value
          for item in receivers.values]


@dataclasses.dataclass
class _ParDo(transform_evaluator.DaskBagOp):
  """A ParDo over each partition; its bag holds every output, the tagged
  ones wrapped in TaggedOutput, for _BagBuilder._add_outputs to tell apart.

  ``side_inputs`` are (view, dask Item of the whole side input) pairs.
  """
  job: str = ''

  def apply(self, input_bag, side_inputs=None):
    transform = self.transform
    args, kwargs = transform.raw_side_inputs
    main_input = next(iter(self.applied.main_inputs.values()))
    window_fn = getattr(main_input, 'windowing', None)
    views, items = zip(*side_inputs) if side_inputs else ((), ())
    spec = _BundleSpec(
        # The full label also makes the task names of two identical
        # transforms differ.
        label=self.applied.full_label,
        pickled_fn=pickler.dumps((transform.fn, args, kwargs)),
        window_fn=window_fn.windowfn if window_fn else None,
        job=self.job,
        side_views=views)
    # The graph is written out rather than made by map_partitions: that
    # wraps each Item argument in a finalizing copy of the Item's whole
    # lineage, with keys of its own, and so computes the lineage again.
    name = f'pardo-{dask.base.tokenize(spec, *items)}'
    run = functools.partial(_run_bundle, spec)
    tasks = {(name, index): Task(
        (name, index), run, TaskRef((input_bag.name, index)),
        *(TaskRef(item.key) for item in items))
             for index in range(input_bag.npartitions)}
    graph = HighLevelGraph.from_collections(
        name, tasks, dependencies=[input_bag, *items])
    return dask.bag.Bag(graph, name, input_bag.npartitions)


@dataclasses.dataclass
class _Reshuffle(transform_evaluator.DaskBagOp):
  partitions: int = 1

  def apply(self, input_bag, side_inputs=None):
    return input_bag.repartition(npartitions=self.partitions)


def _is_tagged(item, tag) -> bool:
  return isinstance(item, pvalue.TaggedOutput) and item.tag == tag


def _is_main(item) -> bool:
  return not isinstance(item, pvalue.TaggedOutput)


def _unwrap(item):
  return item.value


def _concat(lists):
  return [item for part in lists for item in part]


class _BagBuilder(PipelineVisitor):
  """Builds a dask bag for every PCollection of the pipeline."""

  def __init__(self, bag_kwargs: t.Dict, partitions: int, job: str):
    self._bag_kwargs = bag_kwargs
    self._partitions = partitions
    self._job = job
    self._bags = {}
    self._consumed = set()

  def _op(self, node):
    kind = type(node.transform)
    if kind is overrides._Reshuffle:  # pylint: disable=protected-access
      return _Reshuffle(node, self._bag_kwargs, self._partitions)
    if kind is beam.ParDo:
      return _ParDo(node, self._bag_kwargs, self._job)
    op_class = transform_evaluator.TRANSLATIONS.get(kind,
                                                    transform_evaluator.NoOp)
    return op_class(node, bag_kwargs=self._bag_kwargs)

  def visit_transform(self, transform_node):
    op = self._op(transform_node)
    inputs = [pcoll for pcoll in transform_node.inputs
              if not isinstance(pcoll, pvalue.PBegin)]
    self._consumed.update(inputs)
    if isinstance(op, transform_evaluator.Flatten):
      input_bag = [self._bags[pcoll] for pcoll in inputs]
    else:
      input_bag = self._bags[inputs[0]] if inputs else None
    side_inputs = []
    for side_input in transform_node.side_inputs:
      self._consumed.add(side_input.pvalue)
      view = (type(side_input), side_input._view_options(),  # pylint: disable=protected-access
              side_input._window_mapping_fn)  # pylint: disable=protected-access
      side_inputs.append((view, self._bags[side_input.pvalue].reduction(
          list, _concat)))
    bag = op.apply(input_bag=input_bag, side_inputs=side_inputs or None)
    self._add_outputs(transform_node, op, bag)

  def _add_outputs(self, node, op, bag):
    if not isinstance(op, _ParDo):
      for pcoll in node.outputs.values():
        self._bags[pcoll] = bag
      return
    tagged = set(node.transform.output_tags)
    for tag, pcoll in node.outputs.items():
      if tag in tagged:
        self._bags[pcoll] = bag.filter(
            functools.partial(_is_tagged, tag=tag)).map(_unwrap)
      else:
        self._bags[pcoll] = bag.filter(_is_main)

  def sinks(self):
    """The bags no transform consumes: computing them runs the pipeline."""
    return [bag for pcoll, bag in self._bags.items()
            if pcoll not in self._consumed]


class _Result(dask_runner.DaskRunnerResult):
  """Closes the runner's client once the pipeline is over, so that a
  finished job keeps no connection to the scheduler."""

  def wait_until_finish(self, duration=None):
    try:
      return super().wait_until_finish(duration)
    finally:
      if PipelineState.is_terminal(self.state):
        self.client.close()


class DaskRunner(dask_runner.DaskRunner):
  """Runs a pipeline on a dask.distributed cluster; see the module's doc."""

  def run_pipeline(self, pipeline, options):
    dask_options = options.view_as(dask_runner.DaskOptions).get_all_options(
        drop_default=True, current_only=True)
    bag_kwargs = dask_runner.DaskOptions._extract_bag_kwargs(  # pylint: disable=protected-access
        dask_options)
    client = dask.distributed.Client(**dask_options)
    partitions = bag_kwargs.get('npartitions') or max(
        1, sum(client.nthreads().values()))
    pipeline.replace_all(overrides.dask_overrides())
    builder = _BagBuilder(bag_kwargs, partitions, uuid.uuid4().hex)
    pipeline.visit(builder)
    # Unoptimized: dask optimizes each sink's graph on its own, fusing a
    # transform that several sinks share into a differently named task in
    # each, which then runs once per sink. Unoptimized, the sinks' graphs
    # name a shared transform's tasks alike, and dask computes each once.
    return _Result(client, client.compute(builder.sinks(),
                                          optimize_graph=False))
