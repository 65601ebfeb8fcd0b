"""MkDocs hooks: the parts of the site generated from the code itself.

``<!-- flags: MODULE -->`` becomes the table of every flag of that entry
point, read from its parser (``build_parser``): name, values, default and
help. ``<!-- pipeline-graph: JOB -->`` becomes a Mermaid flowchart of the
Beam job's top-level steps, from the pipeline the job builds (constructed,
not run, on a two-line input). Neither can drift from the code.
"""
import argparse
import contextlib
import importlib
import json
import os
import re
import sys
import tempfile

# The site is built from the repository root; the packages are imported
# from there.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

_FLAGS = re.compile(r'<!-- flags: ([\w.]+) -->')
_GRAPH = re.compile(r'<!-- pipeline-graph: (\w+) -->')


def _values(action: argparse.Action) -> str:
  if action.choices is not None:
    return ' \\| '.join(f'`{choice}`' for choice in action.choices)
  if action.nargs == 0:
    return 'switch' if not isinstance(
        action, argparse.BooleanOptionalAction) else 'switch (`--no-` to unset)'
  described = getattr(action.type, 'values', None)
  if described:
    return described
  return 'text' if action.nargs is None else 'texts'


def _default(action: argparse.Action) -> str:
  if action.required or action.default in (None, argparse.SUPPRESS) or (
      action.nargs == 0 and action.default is False):
    return 'required' if action.required else ''
  return f'`{action.default}`'


def _cell(text: str) -> str:
  return ' '.join(str(text).split()).replace('|', '\\|')


def _rows(parser: argparse.ArgumentParser, prefix: str = ''):
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._HelpAction):  # pylint: disable=protected-access
      continue
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      for name, subparser in action.choices.items():
        yield from _rows(subparser, f'{prefix}{name} ')
      continue
    name = ', '.join(f'`{option}`' for option in action.option_strings) or (
        f'`{action.dest}` (positional)')
    yield (f'| {prefix}{name} | {_values(action)} | {_default(action)} | '
           f'{_cell(action.help)} |')


def flag_table(module: str) -> str:
  """The Markdown table of every flag of ``module``'s parser."""
  parser = importlib.import_module(module).build_parser()
  usage = ' '.join(parser.format_usage().split())
  return '\n'.join([
      f'```text\n{usage}\n```', '',
      '| flag | values | default | what it does |',
      '| --- | --- | --- | --- |', *_rows(parser), ''])


@contextlib.contextmanager
def _small_input():
  """A folder with a two-record JSONL input and a stand-in model folder
  (metadata only: building a pipeline loads no model)."""
  with tempfile.TemporaryDirectory() as folder:
    with open(os.path.join(folder, 'in.jsonl'), 'w', encoding='utf-8') as out:
      for index, label in enumerate(('pos', 'neg')):
        out.write(json.dumps({'id': str(index), 'text': 'a film',
                              'label': label}) + '\n')
    export = os.path.join(folder, 'model', 'export', '1')
    os.makedirs(os.path.join(export, 'assets.extra'))
    open(os.path.join(export, 'saved_model.pb'), 'wb').close()
    with open(os.path.join(export, 'assets.extra', 'metadata.json'), 'w',
              encoding='utf-8') as out:
      json.dump({'label_names': ['neg', 'pos'], 'version': 1}, out)
    yield folder


def _built_pipeline(job: str, folder: str):
  import apache_beam as beam  # pylint: disable=import-outside-toplevel
  module = importlib.import_module(f'pipeline.{job}')
  settings_module = importlib.import_module(
      f'pipeline.{"preprocessing" if job == "preprocess" else "scoring"}'
      '.settings')
  argv = [f'--input={folder}/in.jsonl', f'--output_dir={folder}/out']
  if job == 'score':
    argv.append(f'--model_dir={folder}/model')
  args, _ = module.parse_args(argv)
  settings = settings_module.settings_from_args(args)
  pipeline = beam.Pipeline()
  module.build_pipeline(pipeline, settings, os.path.join(folder, 'staging'))
  return pipeline


def _inputs(applied):
  """Every PCollection ``applied`` or a step inside it reads."""
  yield from applied.inputs
  yield from (side.pvalue for side in applied.side_inputs)
  for part in applied.parts:
    yield from _inputs(part)


def pipeline_graph(job: str) -> str:
  """A Mermaid flowchart of the Beam job's top-level steps and what flows
  between them."""
  with _small_input() as folder:
    pipeline = _built_pipeline(job, folder)
  steps = pipeline.transforms_stack[0].parts
  owner = {}

  def own(applied, step):
    owner[applied] = step
    for part in applied.parts:
      own(part, step)

  for step in steps:
    own(step, step)
  lines = ['```mermaid', 'flowchart TD']
  ids = {step: f's{index}' for index, step in enumerate(steps)}
  for step in steps:
    lines.append(f'  {ids[step]}["{step.full_label}"]')
  edges = []
  for step in steps:
    for pcollection in _inputs(step):
      source = owner.get(pcollection.producer)
      if source is not None and source is not step:
        edge = f'  {ids[source]} --> {ids[step]}'
        if edge not in edges:
          edges.append(edge)
  return '\n'.join(lines + edges + ['```'])


def on_page_markdown(markdown, page, config, files):  # pylint: disable=unused-argument
  markdown = _FLAGS.sub(lambda match: flag_table(match.group(1)), markdown)
  return _GRAPH.sub(lambda match: pipeline_graph(match.group(1)), markdown)
