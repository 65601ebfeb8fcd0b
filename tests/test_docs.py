"""The documentation's generated parts: every flag of every entry point has
a help text and a row in the flag reference, usage lines name the command a
user types, and the console scripts run the entry points."""
import argparse
import importlib
import importlib.util
import re

import pytest

from tests.conftest import REPO

ENTRY_POINTS = ('pipeline.preprocess', 'trainer.train', 'trainer.predict',
                'pipeline.score', 'pipeline.datasets')


def _hooks():
  spec = importlib.util.spec_from_file_location('docs_hooks',
                                                REPO / 'docs' / 'hooks.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _actions(parser):
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      for subparser in action.choices.values():
        yield from _actions(subparser)
    elif not isinstance(action, argparse._HelpAction):  # pylint: disable=protected-access
      yield action


@pytest.mark.parametrize('module', ENTRY_POINTS)
def test_every_flag_has_help_and_a_row_in_the_reference(module):
  parser = importlib.import_module(module).build_parser()
  assert parser.format_usage().startswith(f'usage: python -m {module} ')
  table = _hooks().flag_table(module)
  for action in _actions(parser):
    assert action.help and action.help.strip(), action
    name = (action.option_strings or [action.dest])[0]
    assert re.search(rf'^\| (\w+ )?`{re.escape(name)}`', table, re.M), name


@pytest.mark.parametrize('job', ['preprocess', 'score'])
def test_the_pipeline_graph_is_the_jobs_own(job):
  graph = _hooks().pipeline_graph(job)
  assert graph.startswith('```mermaid\nflowchart TD')
  first = {'preprocess': 'Learn', 'score': 'Read'}[job]
  assert f's0["{first}"]' in graph and ' --> ' in graph


def test_every_page_that_asks_for_generated_parts_names_real_ones():
  pages = (REPO / 'docs').rglob('*.md')
  asked = [match for page in pages for match in re.findall(
      r'<!-- (flags|pipeline-graph): ([\w.]+) -->', page.read_text())]
  assert sorted(name for kind, name in asked if kind == 'flags') == sorted(
      ENTRY_POINTS)
  assert sorted(name for kind, name in asked
                if kind == 'pipeline-graph') == ['preprocess', 'score']


def test_each_console_script_runs_its_entry_point():
  setup = (REPO / 'setup.py').read_text()
  scripts = dict(re.findall(r"'(textclf-\w+) = ([\w.]+:main)'", setup))
  assert sorted(target.split(':')[0] for target in scripts.values()) == (
      sorted(ENTRY_POINTS))
  for target in scripts.values():
    module, function = target.split(':')
    assert callable(getattr(importlib.import_module(module), function))
