"""The documentation: every flag of every entry point has a help text, its
default in --help and a row in the flag reference, usage lines name the
command a user types, the generated parts committed in the pages are the
code's, the check of the built site refuses what needs a server or the
network, the console scripts run the entry points, and the front pages
stay short and name no issue."""
import argparse
import importlib
import importlib.util
import re

import pytest

from cli import flags
from tests.conftest import REPO

ENTRY_POINTS = ('pipeline.preprocess', 'trainer.train', 'trainer.predict',
                'pipeline.score', 'pipeline.datasets')
BEAM_JOBS = ('pipeline.preprocess', 'pipeline.score')


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


@pytest.mark.parametrize('module', ENTRY_POINTS)
def test_help_shows_every_default_and_what_passes_to_beam(module):
  parser = importlib.import_module(module).build_parser()
  shown = ' '.join(parser.format_help().split())
  actions = parser._actions  # pylint: disable=protected-access
  for text in filter(None, map(flags.default_text, actions)):
    assert f'(default: {text})' in shown, text
  passes = 'Any other flag is one of Beam\'s pipeline options, passed ' \
      'through to Beam'
  assert (passes in shown) == (module in BEAM_JOBS)


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


def test_the_pages_hold_the_generated_parts_the_code_generates_now():
  """The flag tables and pipeline graphs are committed in the pages, to
  read where Markdown is shown as it is; they must be the code's."""
  hooks = _hooks()
  stale = []
  for page in hooks.pages():
    with open(page, encoding='utf-8') as handle:
      markdown = handle.read()
    if hooks.generated(markdown) != markdown:
      stale.append(page)
  assert not stale, (f'{stale}: run .venv/bin/python docs/hooks.py generate '
                     'and commit the pages')


def test_a_generated_part_is_written_after_its_marker_and_rewritten_whole():
  hooks = _hooks()
  asked = 'Before.\n\n<!-- flags: trainer.predict -->\n\nAfter.\n'
  written = hooks.generated(asked)
  assert written == ('Before.\n\n<!-- flags: trainer.predict -->\n'
                     f'{hooks.flag_table("trainer.predict")}\n'
                     '<!-- end flags -->\n\nAfter.\n')
  stale = written.replace('`--json`', '`--jsn`')
  assert stale != written and hooks.generated(stale) == written


def write_site(folder, pages, files=()):
  """A built site: ``pages`` by path, and empty ``files``."""
  for path, body in pages.items():
    (folder / path).parent.mkdir(parents=True, exist_ok=True)
    (folder / path).write_text(f'<html><body>{body}</body></html>')
  for path in files:
    (folder / path).parent.mkdir(parents=True, exist_ok=True)
    (folder / path).write_text('')
  return str(folder)


MERMAID = 'assets/vendor/mermaid/mermaid.min.js'
WORKING = {
    'index.html': '<a href="jobs/score.html#drift">drift</a> <a href="#top">'
                  'top</a> <a href="https://beam.apache.org/">Beam</a> '
                  '<a href="mailto:a@b.c">mail</a>'
                  '<link rel="stylesheet" href="assets/main.css">'
                  f'<script src="{MERMAID}"></script>'
                  '<pre class="mermaid"><code>flowchart TD</code></pre>',
    'jobs/score.html': '<a href="../index.html">home</a>'
                       '<img src="../images/report.png">',
}
WORKING_FILES = (MERMAID, 'assets/main.css', 'images/report.png',
                 'search/search_index.json', 'search/search_index.js')


@pytest.mark.parametrize('page, body, removed, problem', [
    ('index.html', '<a href="jobs/">jobs</a>', None,
     'index.html: the link jobs/ names no file of the site'),
    ('index.html', '<a href="/jobs/score.html">score</a>', None,
     'index.html: the link /jobs/score.html names no file of the site'),
    ('jobs/score.html', '<a href="gone.html">gone</a>', None,
     'jobs/score.html: the link gone.html names no file of the site'),
    ('index.html', '<script src="https://unpkg.com/mermaid@11/dist/'
     'mermaid.min.js"></script>', None, 'index.html: https://unpkg.com/'
     'mermaid@11/dist/mermaid.min.js is not a file of the site'),
    ('index.html', '<link rel="stylesheet" href="https://fonts.googleapis.'
     'com/css?family=Roboto">', None, 'index.html: https://fonts.googleapis.'
     'com/css?family=Roboto is not a file of the site'),
    ('jobs/score.html', '<div class="mermaid">flowchart TD</div>', None,
     'jobs/score.html: Mermaid diagrams without the site\'s own '
     f'{MERMAID}'),
    (None, '', 'search/search_index.js', 'search/search_index.js is missing: '
     'search needs it on file:// (the offline plugin writes it)'),
], ids=['folder-link', 'absolute-link', 'no-such-page', 'cdn-script',
        'web-font', 'mermaid-from-nowhere', 'search-needs-a-server'])
def test_a_site_that_needs_a_server_or_the_network_is_refused(
    tmp_path, page, body, removed, problem):
  hooks = _hooks()
  assert hooks.offline_problems(write_site(
      tmp_path / 'working', WORKING, WORKING_FILES)) == []
  pages = dict(WORKING)
  if page:
    pages[page] += body
  broken = write_site(tmp_path / 'broken', pages,
                      [f for f in WORKING_FILES if f != removed])
  assert hooks.offline_problems(broken) == [problem]


def test_a_site_without_its_diagrams_is_refused(tmp_path):
  pages = {**WORKING, 'index.html': WORKING['index.html'].split('<pre')[0]}
  assert _hooks().offline_problems(write_site(
      tmp_path, pages, WORKING_FILES)) == ['no page draws a Mermaid diagram']


@pytest.mark.parametrize('name, most', [('README.md', 250),
                                        ('BENCHMARKS.md', 400)])
def test_the_front_pages_stay_short(name, most):
  lines = len((REPO / name).read_text(encoding='utf-8').splitlines())
  assert lines <= most, (f'{name} has {lines} lines, more than {most}: '
                         'move background to a page under docs/')


def test_what_users_read_names_no_issue():
  """Users read what is; the issue that changed it is the history's."""
  read = [REPO / 'README.md', REPO / 'BENCHMARKS.md',
          *(REPO / 'configs').rglob('*.md'), *(REPO / 'docs').rglob('*.md')]
  # '#12' names an issue; '(#130-and-143)' is a link to a heading.
  named = [(str(path.relative_to(REPO)), match) for path in read
           for match in re.findall(r'\bissues? #?\d+|(?<![\w&(])#\d+\b',
                                   path.read_text(encoding='utf-8'), re.I)]
  assert not named


def test_each_console_script_runs_its_entry_point():
  setup = (REPO / 'setup.py').read_text()
  scripts = dict(re.findall(r"'(textclf-\w+) = ([\w.]+:main)'", setup))
  assert sorted(target.split(':')[0] for target in scripts.values()) == (
      sorted(ENTRY_POINTS))
  for target in scripts.values():
    module, function = target.split(':')
    assert callable(getattr(importlib.import_module(module), function))
