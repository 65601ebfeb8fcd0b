"""Beam's DaskRunner with what our jobs need and Beam 2.77's version lacks.

    --runner=pipeline.dask_runner.DaskRunner --dask_client_address=HOST:8786

Beam 2.77's DaskRunner translates each Beam primitive into a dask.bag
operation. Gaps in it lose, mix or duplicate data in our jobs or end a
failed job as done, and one leaves a cluster idle; this runner closes them
and keeps everything else (options, overrides, the other translations) as
Beam has it:

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
- Dask computes a key again when the workers that held it are gone, so a
  side input whose transform is not deterministic (TFT's analysis writes its
  graph to a new temporary folder each time) changes in the middle of a job
  when a worker is lost, and TFT's DoFns, set up with the first value, fail.
  Here a side input's first value is kept on the scheduler for the job and
  a recomputation returns it: its readers see one value, as on the runners
  that materialize a side input once.
- A task the client cancelled (its scheduler lost) counts as done, so such a
  job ends DONE. Here a job fails unless every task finished.
- Reshuffle is an identity, so a job that starts from one file pattern reads
  everything in one partition, on one worker. Here Reshuffle re-chunks its
  input over the cluster's worker threads (or ``--dask_npartitions``).

And where Beam's DaskRunner makes each ParDo a dask task of its own, whose
output for a whole partition is held as one list and pickled to whichever
worker runs the next task, this runner fuses a chain of ParDos into one task
a partition, as Beam's workers fuse a stage: an element passes from step to
step as it is emitted. Only what a GroupByKey, Flatten, Reshuffle or side
input reads leaves a stage, and what nothing reads is dropped on the workers
rather than gathered to the client.
"""
import collections
import dataclasses
import functools
import logging
import operator
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
from apache_beam.runners.dask import dask_runner
from apache_beam.runners.dask import overrides
from apache_beam.runners.dask import transform_evaluator
from apache_beam.runners.runner import PipelineState

from pipeline import dask_stages


def _nothing(_):
  return []


def _layer(name, inputs, function, npartitions, *args):
  """A bag whose every partition is ``function`` of that partition of each
  bag of ``inputs`` (and of the whole of each dask Item), then ``args``.

  The graph is written out rather than made by map_partitions: that wraps
  each dask Item argument in a finalizing copy of the Item's whole lineage,
  with keys of its own, and so computes the lineage again.
  """
  tasks = {(name, index): Task(
      (name, index), function,
      *(TaskRef((bag.name, index)) if isinstance(bag, dask.bag.Bag)
        else TaskRef(bag.key) for bag in inputs), *args)
           for index in range(npartitions)}
  graph = HighLevelGraph.from_collections(name, tasks, dependencies=inputs)
  return dask.bag.Bag(graph, name, npartitions)


@dataclasses.dataclass
class _Reshuffle(transform_evaluator.DaskBagOp):
  partitions: int = 1

  def apply(self, input_bag, side_inputs=None):
    return input_bag.repartition(npartitions=self.partitions)


def _concat(lists):
  return [item for part in lists for item in part]


_UNPUBLISHED = object()


def _pinned(name: str, value):
  """The first value a side input had in this job: kept on the scheduler
  under ``name`` by whichever task computed it first, returned to any later
  computation. Two first computations at once: the scheduler refuses to
  publish a name twice (atomically, with a KeyError), and the loser takes
  the winner's value."""
  client = dask.distributed.get_client()
  first = client.get_dataset(name, default=_UNPUBLISHED)
  if first is not _UNPUBLISHED:
    return first
  try:
    client.publish_dataset(value, name=name)
  except KeyError:
    return client.get_dataset(name)
  return value


@dataclasses.dataclass(eq=False)
class _Stage:
  """ParDos that run as one dask task a partition, each reading the output
  of one before it, as Beam fuses a stage's steps."""
  input: t.Any
  nodes: t.List = dataclasses.field(default_factory=list)
  # The outputs that something outside the stage reads (a GroupByKey, a
  # Flatten, a side input, a ParDo that cannot join), each to its list in
  # the task's result.
  kept: t.Dict = dataclasses.field(default_factory=dict)


class _BagBuilder(PipelineVisitor):
  """Plans the pipeline's fused stages, then builds a dask bag for every
  PCollection read outside the stage that makes it."""

  def __init__(self, bag_kwargs: t.Dict, partitions: int, job: str):
    self._bag_kwargs = bag_kwargs
    self._partitions = partitions
    self._job = job
    self._nodes = []
    # The plan: each ParDo's output to its stage, a NoOp's output to its
    # input, each PCollection to the stages it depends on; the units (the
    # stages and the other transforms) in the pipeline's order.
    self._stage_of = {}
    self._alias = {}
    self._after = {}
    self._units = []
    self._consumed = set()
    self._bags = {}
    self._stage_bags = []
    # The scheduler's names of the side inputs' first values (_pinned).
    self.pinned = set()

  def visit_transform(self, transform_node):
    self._nodes.append(transform_node)

  def _op(self, node):
    kind = type(node.transform)
    if kind is overrides._Reshuffle:  # pylint: disable=protected-access
      return _Reshuffle(node, self._bag_kwargs, self._partitions)
    op_class = transform_evaluator.TRANSLATIONS.get(kind,
                                                    transform_evaluator.NoOp)
    return op_class(node, bag_kwargs=self._bag_kwargs)

  def _source(self, pcoll):
    """The PCollection that holds ``pcoll``'s elements: NoOps (WindowInto
    in the global window) pass their input on."""
    while pcoll in self._alias:
      pcoll = self._alias[pcoll]
    return pcoll

  def _read(self, pcoll, outside: bool = True):
    self._consumed.add(pcoll)
    stage = self._stage_of.get(pcoll)
    if outside and stage is not None:
      stage.kept.setdefault(pcoll, len(stage.kept))

  def _plan(self, node):
    inputs = [self._source(pcoll) for pcoll in node.inputs
              if not isinstance(pcoll, pvalue.PBegin)]
    sides = [self._source(side.pvalue) for side in node.side_inputs]
    after = set().union(*(self._after.get(pcoll, ()) for pcoll in
                          inputs + sides))
    for side in sides:
      self._read(side)
    if type(node.transform) is beam.ParDo and inputs:
      stage = self._stage_of.get(inputs[0])
      # A step cannot join the stage whose outputs its side inputs wait
      # for: the stage's task would wait for itself.
      if stage is None or any(stage in self._after.get(side, ())
                              for side in sides):
        stage = _Stage(inputs[0])
        self._units.append(stage)
        self._read(inputs[0])
      else:
        self._read(inputs[0], outside=False)
      stage.nodes.append(node)
      for pcoll in node.outputs.values():
        self._stage_of[pcoll] = stage
        self._after[pcoll] = after | {stage}
    elif (isinstance(self._op(node), transform_evaluator.NoOp) and
          len(inputs) == 1 and not sides):
      for pcoll in node.outputs.values():
        self._alias[pcoll] = inputs[0]
    else:
      self._units.append(node)
      for pcoll in inputs:
        self._read(pcoll)
      for pcoll in node.outputs.values():
        self._after[pcoll] = after

  def _needs(self, unit):
    nodes = unit.nodes if isinstance(unit, _Stage) else [unit]
    needs = [self._source(side.pvalue) for node in nodes
             for side in node.side_inputs]
    if isinstance(unit, _Stage):
      return needs + [unit.input]
    return needs + [self._source(pcoll) for pcoll in unit.inputs
                    if not isinstance(pcoll, pvalue.PBegin)]

  def sinks(self):
    """Builds the bags; returns what computing runs the whole pipeline:
    each stage and each PCollection nothing reads, all emptied on the
    workers, so that no data reaches the client."""
    for node in self._nodes:
      self._plan(node)
    pending = list(self._units)
    while pending:
      # The first unit whose inputs are built: a stage waits for the side
      # inputs of its last steps, which Beam may apply after the
      # transforms that read its first steps' outputs.
      unit = next((unit for unit in pending if all(
          pcoll in self._bags for pcoll in self._needs(unit))), None)
      if unit is None:
        raise RuntimeError('the Dask runner planned stages that wait for '
                           'each other')
      pending.remove(unit)
      if isinstance(unit, _Stage):
        self._build_stage(unit)
      else:
        self._build_node(unit)
    ends = self._stage_bags + [
        bag for pcoll, bag in self._bags.items()
        if pcoll not in self._consumed and pcoll not in self._stage_of]
    return [_layer(f'done-{bag.name}', [bag], _nothing, bag.npartitions)
            for bag in ends]

  def _side_inputs(self, node):
    """(view, dask Item of the whole side input) of each side input."""
    side_inputs = []
    for side_input in node.side_inputs:
      view = (type(side_input), side_input._view_options(),  # pylint: disable=protected-access
              side_input._window_mapping_fn)  # pylint: disable=protected-access
      whole = self._bags[self._source(side_input.pvalue)].reduction(
          list, _concat)
      name = f'beam-side-input-{self._job}-{whole.key}'
      self.pinned.add(name)
      side_inputs.append((view, whole.apply(functools.partial(_pinned,
                                                              name))))
    return side_inputs

  def _build_node(self, node):
    op = self._op(node)
    inputs = [self._bags[self._source(pcoll)] for pcoll in node.inputs
              if not isinstance(pcoll, pvalue.PBegin)]
    if isinstance(op, transform_evaluator.Flatten):
      input_bag = inputs
    else:
      input_bag = inputs[0] if inputs else None
    bag = op.apply(input_bag=input_bag,
                   side_inputs=self._side_inputs(node) or None)
    for pcoll in node.outputs.values():
      self._bags[pcoll] = bag

  def _bundle(self, node, views) -> dask_stages.BundleSpec:
    transform = node.transform
    args, kwargs = transform.raw_side_inputs
    main_input = next(iter(node.main_inputs.values()))
    window_fn = getattr(main_input, 'windowing', None)
    return dask_stages.BundleSpec(
        # The full label also makes the task names of two identical
        # transforms differ.
        label=node.full_label,
        pickled_fn=pickler.dumps((transform.fn, args, kwargs)),
        window_fn=window_fn.windowfn if window_fn else None,
        job=self._job,
        side_views=tuple(views))

  def _build_stage(self, stage: _Stage):
    readers = collections.defaultdict(list)
    for index, node in enumerate(stage.nodes[1:], 1):
      readers[self._source(next(iter(node.main_inputs.values())))].append(
          index)
    steps, items = [], []
    for node in stage.nodes:
      views = []
      for view, item in self._side_inputs(node):
        views.append(view)
        items.append(item)
      tagged = set(node.transform.output_tags)
      steps.append(dask_stages.Step(self._bundle(node, views), tuple(
          (tag if tag in tagged else None, tuple(readers[pcoll]),
           stage.kept.get(pcoll)) for tag, pcoll in node.outputs.items())))
    spec = dask_stages.StageSpec(tuple(steps), len(stage.kept))
    input_bag = self._bags[stage.input]
    bag = _layer(f'stage-{dask.base.tokenize(spec, input_bag.name, *items)}',
                 [input_bag, *items],
                 functools.partial(dask_stages.run_stage, spec),
                 input_bag.npartitions)
    self._stage_bags.append(bag)
    for pcoll, slot in stage.kept.items():
      self._bags[pcoll] = _layer(f'output-{slot}-{bag.name}', [bag],
                                 operator.getitem, bag.npartitions, slot)


@dataclasses.dataclass
class _Result(dask_runner.DaskRunnerResult):
  """Fails a job whose tasks did not all finish (Beam's result counts a
  task the cluster cancelled, its scheduler gone, as done), and once the
  pipeline is over drops the job's side-input values from the scheduler
  and closes the runner's client, so that a finished job leaves nothing on
  the cluster and keeps no connection to it."""
  pinned: t.Tuple[str, ...] = ()
  _released: threading.Lock = dataclasses.field(
      default_factory=threading.Lock, init=False, repr=False)

  def wait_until_finish(self, duration=None):
    try:
      state = super().wait_until_finish(duration)
      unfinished = [future for future in self.futures
                    if future.status != 'finished']
      if state == PipelineState.DONE and unfinished:
        self._state = PipelineState.FAILED
        raise RuntimeError(
            f'the Dask cluster ended {len(unfinished)} of the job\'s '
            f'{len(self.futures)} outputs unfinished '
            f'({unfinished[0].status}): was its scheduler lost?')
      return state
    finally:
      if PipelineState.is_terminal(self.state):
        self._release()

  def cancel(self):
    try:
      return super().cancel()
    finally:
      self._release()

  def _release(self):
    """Once, whoever calls it first (a cancel and the wait can end at once);
    never raises over the job's own outcome: a scheduler that is gone took
    the values with it."""
    if not self._released.acquire(blocking=False):
      return
    try:
      # Not while reconnecting: a scheduler that is gone would be waited
      # for until the connect timeout, and took the values with it.
      if self.pinned and self.client.status == 'running':
        self.client.unpublish_dataset(list(self.pinned))
    except Exception:  # pylint: disable=broad-except
      logging.warning('could not drop the job\'s side-input values from the '
                      'Dask scheduler', exc_info=True)
    finally:
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
    sinks = builder.sinks()
    return _Result(client, client.compute(sinks, optimize_graph=False),
                   tuple(builder.pinned))
