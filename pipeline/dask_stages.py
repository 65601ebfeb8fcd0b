"""What a task of the Dask runner (``pipeline.dask_runner``) runs on a
worker: one dask partition through a fused stage of ParDos, as one Beam
bundle of each, the DoFns set up once a worker process and reused between
bundles. Imported by ``pipeline.dask_runner``, which checks the Beam version
these Beam internals were tested with."""
import collections
import dataclasses
import itertools
import logging
import threading
import typing as t

from apache_beam.internal import pickler
from apache_beam.runners.common import DoFnContext
from apache_beam.runners.common import DoFnInvoker
from apache_beam.runners.common import DoFnSignature
from apache_beam.runners.common import Receiver
from apache_beam.runners.common import _OutputHandler
from apache_beam.runners.dask import transform_evaluator
from apache_beam.transforms.core import DoFn
from apache_beam.transforms.sideinputs import SideInputMap


@dataclasses.dataclass(frozen=True)
class BundleSpec:
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

  def take(self, spec: BundleSpec):
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

  def give_back(self, spec: BundleSpec, fn_and_args) -> None:
    """``fn_and_args`` finished a bundle and is ready for the next."""
    with self._lock:
      if spec.job == self._job:
        self._idle[spec.pickled_fn].append(fn_and_args)


_POOL = _DoFnPool()


def _side_input_maps(spec: BundleSpec, side_values):
  return [SideInputMap(view_class, options, [
      transform_evaluator.get_windowed_value(value, mapping)
      for value in values]) for (view_class, options, mapping), values in zip(
          spec.side_views, side_values)]


@dataclasses.dataclass(frozen=True)
class Step:
  """One ParDo of a fused stage, and where each of its outputs goes."""
  bundle: BundleSpec
  # (tag, indices of the stage's steps that read the output, index of the
  # output's list in the task's result or None) for each output; the tag
  # is None for the main output.
  routes: t.Tuple


@dataclasses.dataclass(frozen=True)
class StageSpec:
  """The steps of a stage in the pipeline's order, each after those it
  reads, and how many outputs its task returns."""
  steps: t.Tuple[Step, ...]
  kept: int


class _Fanout(Receiver):
  """An output of a step: each element goes on to the steps of the stage
  that read it as it is emitted, and is kept for the tasks outside the
  stage that read it."""

  def __init__(self, invokers, kept):
    self._invokers = invokers
    self._kept = kept

  def receive(self, windowed_value):
    for invoker in self._invokers:
      invoker.invoke_process(windowed_value)
    if self._kept is not None:
      # Windows are not kept between stages (as in Beam's DaskRunner): the
      # jobs are batch jobs in the global window.
      self._kept.append(windowed_value.value)


_DROPPED = _Fanout((), None)


class _Tagged(dict):
  """A step's tagged receivers: what it emits under a tag it did not
  declare goes nowhere, as no PCollection holds it."""

  def __missing__(self, tag):
    return _DROPPED


def _invoker(bundle: BundleSpec, receivers, side_values):
  """An invoker of the bundle's DoFn, set up once a worker process (the
  DoFn comes from _POOL where one is idle), and the DoFn with its
  arguments, for _POOL once the bundle is over."""
  reused = _POOL.take(bundle)
  fn, args, kwargs = reused or pickler.loads(bundle.pickled_fn)
  tagged = _Tagged((tag, receiver) for tag, receiver in receivers.items()
                   if tag is not None)
  invoker = DoFnInvoker.create_invoker(
      DoFnSignature(fn),
      _OutputHandler(
          window_fn=bundle.window_fn,
          main_receivers=receivers.get(None, _DROPPED),
          tagged_receivers=tagged,
          per_element_output_counter=None,
          output_batch_converter=None,
          process_yields_batches=False,
          process_batch_yields_elements=False),
      context=DoFnContext(bundle.label, state=None),
      side_inputs=_side_input_maps(bundle, side_values) or None,
      input_args=list(args),
      input_kwargs=kwargs,
      user_state_context=None,
      bundle_finalizer_param=DoFn.BundleFinalizerParam())
  if not reused:
    invoker.invoke_setup()
  return invoker, (fn, args, kwargs)


def run_stage(spec: StageSpec, items, *side_values):
  """One dask partition through a stage's steps as one Beam bundle of each,
  finish_bundle's outputs kept; returns the lists of the outputs that tasks
  outside the stage read.

  An element passes from step to step as it is emitted, as in a Beam
  worker's fused stage: a partition's intermediate outputs are never held
  whole, nor serialized between tasks. ``side_values`` are the side inputs'
  whole contents, the steps' in their order: dask computes them as
  dependencies of this task, in the same graph, instead of each bundle
  computing their lineage again.
  """
  kept = tuple([] for _ in range(spec.kept))
  sides, start = [], 0
  for step in spec.steps:
    sides.append(side_values[start:start + len(step.bundle.side_views)])
    start += len(sides[-1])
  invokers, fns = [None] * len(spec.steps), [None] * len(spec.steps)
  # Last first: a step's receivers call the invokers of the steps after it.
  for index in reversed(range(len(spec.steps))):
    step = spec.steps[index]
    receivers = {tag: _Fanout([invokers[reader] for reader in readers],
                              None if slot is None else kept[slot])
                 for tag, readers, slot in step.routes}
    invokers[index], fns[index] = _invoker(step.bundle, receivers,
                                           sides[index])
  for invoker in reversed(invokers):
    invoker.invoke_start_bundle()
  head = spec.steps[0].bundle
  for item in items:
    invokers[0].invoke_process(
        transform_evaluator.get_windowed_value(item, head.window_fn))
  # In order: what a step emits in finish_bundle reaches the steps after
  # it before their bundles finish.
  for invoker in invokers:
    invoker.invoke_finish_bundle()
  # A bundle that raised drops its DoFns, as Beam's workers do.
  for step, fn in zip(spec.steps, fns):
    _POOL.give_back(step.bundle, fn)
  return kept
