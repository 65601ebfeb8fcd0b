"""Beam's DaskRunner with what our jobs need and Beam 2.77's version lacks.

    --runner=pipeline.dask_runner.DaskRunner --dask_client_address=HOST:8786

Beam 2.77's DaskRunner translates each Beam primitive into a dask.bag
operation. Three gaps in it lose or mix data in our jobs, and one leaves a
cluster idle; this runner closes them and keeps everything else (options,
overrides, the other translations) as Beam has it:

- Only the lineage of the last transform applied is computed, so a pipeline
  with several sinks (Parquet, dead letters, counts) runs one of them. Here
  every transform whose output nobody consumes is computed.
- What a DoFn emits in ``finish_bundle`` is dropped, and with it the last
  batch of every BatchElements (so RunInference's last documents) and our
  per-bundle counts. Here a bundle's outputs are collected after
  ``finish_bundle``.
- A consumer of one output of a multi-output ParDo receives every output of
  it (main and tagged together). Here each output PCollection gets only its
  own elements.
- Reshuffle is an identity, so a job that starts from one file pattern reads
  everything in one partition, on one worker. Here Reshuffle re-chunks its
  input over the cluster's worker threads (or ``--dask_npartitions``).
"""
import dataclasses
import functools
import typing as t

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
  import dask  # pylint: disable=unused-import
  import dask.distributed  # pylint: disable=unused-import
except ImportError as missing:
  raise ImportError(
      'the Dask runner needs the dask extra: pip install '
      '"beam-text-classifier[dask]"') from missing

# pylint: disable=wrong-import-position
from apache_beam import pvalue
from apache_beam.pipeline import PipelineVisitor
from apache_beam.runners.common import DoFnContext
from apache_beam.runners.common import DoFnInvoker
from apache_beam.runners.common import DoFnSignature
from apache_beam.runners.common import _OutputHandler
from apache_beam.runners.dask import dask_runner
from apache_beam.runners.dask import overrides
from apache_beam.runners.dask import transform_evaluator
from apache_beam.transforms.core import DoFn
from apache_beam.transforms.sideinputs import SideInputMap


def _run_bundle(items, invoker_args, invoker_kwargs, receivers):
  """One dask partition as one Beam bundle, finish_bundle's outputs kept."""
  invoker = DoFnInvoker.create_invoker(*invoker_args, **invoker_kwargs)
  invoker.invoke_setup()
  invoker.invoke_start_bundle()
  for item in items:
    invoker.invoke_process(item)
  invoker.invoke_finish_bundle()
  invoker.invoke_teardown()
  # Windows are not kept between transforms (as in Beam's DaskRunner): the
  # jobs are batch jobs in the global window.
  outputs = [pvalue.TaggedOutput(item.tag, item.value.value)
             if isinstance(item, pvalue.TaggedOutput) else item.value
             for item in receivers.values]
  receivers.values.clear()
  return outputs


class _ParDo(transform_evaluator.DaskBagOp):
  """A ParDo over each partition; its bag holds every output, the tagged
  ones wrapped in TaggedOutput, for _output_bag to tell apart."""

  def apply(self, input_bag, side_inputs=None):
    transform = self.transform
    args, kwargs = transform.raw_side_inputs
    main_input = next(iter(self.applied.main_inputs.values()))
    window_fn = getattr(main_input, 'windowing', None)
    window_fn = window_fn.windowfn if window_fn else None
    receivers = transform_evaluator.OneReceiver()
    invoker_args = [
        DoFnSignature(transform.fn),
        _OutputHandler(
            window_fn=window_fn,
            main_receivers=receivers[None],
            tagged_receivers=receivers,
            per_element_output_counter=None,
            output_batch_converter=None,
            process_yields_batches=False,
            process_batch_yields_elements=False),
    ]
    invoker_kwargs = dict(
        context=DoFnContext(transform.label, state=None),
        side_inputs=side_inputs,
        input_args=list(args),
        input_kwargs=kwargs,
        user_state_context=None,
        bundle_finalizer_param=DoFn.BundleFinalizerParam(),
    )
    return input_bag.map(transform_evaluator.get_windowed_value,
                         window_fn).map_partitions(
                             _run_bundle, invoker_args, invoker_kwargs,
                             receivers)


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


class _BagBuilder(PipelineVisitor):
  """Builds a dask bag for every PCollection of the pipeline."""

  def __init__(self, bag_kwargs: t.Dict, partitions: int):
    self._bag_kwargs = bag_kwargs
    self._partitions = partitions
    self._bags = {}
    self._consumed = set()

  def _op(self, node):
    kind = type(node.transform)
    if kind is overrides._Reshuffle:  # pylint: disable=protected-access
      return _Reshuffle(node, self._bag_kwargs, self._partitions)
    op_class = {**transform_evaluator.TRANSLATIONS, beam.ParDo: _ParDo}.get(
        kind, transform_evaluator.NoOp)
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
      side_inputs.append(SideInputMap(
          type(side_input), side_input._view_options(),  # pylint: disable=protected-access
          transform_evaluator.DaskBagWindowedIterator(
              self._bags[side_input.pvalue],
              side_input._window_mapping_fn)))  # pylint: disable=protected-access
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
    builder = _BagBuilder(bag_kwargs, partitions)
    pipeline.visit(builder)
    futures = client.compute(dask.optimize(*builder.sinks()))
    return dask_runner.DaskRunnerResult(client, futures)
