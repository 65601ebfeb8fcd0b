"""The documentation's own tooling: its generated parts, the scripts it
serves, and a check that the built site works opened from disk.

Generated parts. ``<!-- flags: MODULE -->`` is followed by the table of every
flag of that entry point, read from its parser (``build_parser``): name,
values, default and help. ``<!-- pipeline-graph: JOB -->`` is followed by a
Mermaid flowchart of the Beam job's top-level steps, from the pipeline the
job builds (constructed, not run, on a two-line input). Each ends at
``<!-- end PART -->``. They are committed in the pages, so that the pages
read whole where Markdown is shown as it is (GitHub renders the tables and
Mermaid); ``python docs/hooks.py generate`` rewrites them from the code,
and a page whose parts are not the code's fails the build (``--strict``)
and ``tests/test_docs.py``.

Served scripts. Mermaid and the Web Worker shim that Material's search
needs on ``file://`` come from their npm packages, pinned by version and
sha256 (``VENDORED``): ``python docs/hooks.py fetch`` (``make docs``) puts
them under ``build/docs-assets``, and the build serves them with the site.

The check. After a build, every page's links must name files of the site,
and its scripts and stylesheets must be the site's own (``offline_problems``):
the site is read from ``site/index.html`` with no server and no network.
"""
import argparse
import contextlib
import dataclasses
import html.parser
import importlib
import json
import logging
import os
import posixpath
import re
import sys
import tarfile
import tempfile
from typing import List, Optional
import urllib.parse

from mkdocs import plugins
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

# The site is built from the repository root; the packages are imported
# from there.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import cli  # pylint: disable=wrong-import-position,g-bad-import-order
from cli import flags  # pylint: disable=wrong-import-position,g-bad-import-order

_LOG = logging.getLogger('mkdocs.hooks')
# A generated part: its opening marker, what the code generated, its end
# marker; a marker alone (a part not generated yet) is one too.
_PART = re.compile(
    r'<!-- (flags|pipeline-graph): ([\w.]+) -->\n'
    r'(?:(?:(?!<!-- (?:flags|pipeline-graph):).)*?<!-- end \1 -->\n)?',
    re.DOTALL)


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
  if action.required:
    return 'required'
  text = flags.default_text(action)  # as --help shows it
  return f'`{text}`' if text else ''


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
      *([parser.epilog, ''] if parser.epilog else []),
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


def _generate(kind: str, name: str) -> str:
  return flag_table(name) if kind == 'flags' else pipeline_graph(name)


def generated(markdown: str) -> str:
  """``markdown`` with each generated part as the code generates it now."""
  return _PART.sub(
      lambda match: (f'<!-- {match[1]}: {match[2]} -->\n'
                     f'{_generate(match[1], match[2])}\n'
                     f'<!-- end {match[1]} -->\n'), markdown)


def pages() -> List[str]:
  """The Markdown pages under docs/, as paths."""
  docs = os.path.join(REPO, 'docs')
  return sorted(os.path.join(folder, name)
                for folder, _, names in os.walk(docs) for name in names
                if name.endswith('.md'))


def on_page_markdown(markdown, page, config, files):  # pylint: disable=unused-argument
  current = generated(markdown)
  if current != markdown:
    _LOG.warning('docs/%s: its generated parts are not what the code '
                 'generates now: run .venv/bin/python docs/hooks.py generate',
                 page.file.src_uri)
  return current


# --------------------------------------------------------------------------
# Served scripts


@dataclasses.dataclass(frozen=True)
class Vendored:
  """A file of an npm package that the site serves at ``site_path``."""
  package: str
  version: str
  sha256: str       # of the package's tarball, as npm pack writes it
  member: str       # the file in the tarball
  site_path: str

  @property
  def tarball(self) -> str:
    return f'{self.package}-{self.version}.tgz'


VENDORED = (
    # Material loads mermaid@11 from a CDN unless the page has it already.
    Vendored('mermaid', '11.17.2',
             '6ad2f42c3fc26bbf9e45cbb6d11898972573ea52b33a5f4ff51952899f950ffd',
             'package/dist/mermaid.min.js',
             'assets/vendor/mermaid/mermaid.min.js'),
    # Runs Material's search worker where a page opened from disk cannot
    # start a Web Worker; the offline plugin adds it from a CDN unless a
    # polyfill named iframe-worker is there (mkdocs.yml).
    Vendored('iframe-worker', '1.0.4',
             'e8c5d12d87829c503afba01d67772ea9f4aba5b7ae57a0c98e1917711030efbb',
             'package/shim/index.js',
             'assets/vendor/iframe-worker/shim.js'),
)
# Where ``fetch`` keeps the tarballs and the files taken out of them.
ASSETS_DIR = os.path.join(REPO, 'build', 'docs-assets')


def fetch(folder: str = ASSETS_DIR) -> None:
  """Each of VENDORED from its npm package (``npm pack``, kept in
  ``folder``, checked against its sha256), taken out under ``folder``."""
  from pipeline import datasets  # pylint: disable=import-outside-toplevel
  os.makedirs(folder, exist_ok=True)
  for vendored in VENDORED:
    tarball = datasets.locate(datasets.Artifact(
        vendored.tarball, vendored.sha256,
        npm_spec=f'{vendored.package}@{vendored.version}'), folder)
    target = os.path.join(folder, vendored.site_path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tarfile.open(tarball) as archive, open(target + '.part',
                                                'wb') as out:
      out.write(archive.extractfile(vendored.member).read())
    os.replace(target + '.part', target)


def on_files(files, config):
  """Serves VENDORED with the site, from where ``fetch`` put them."""
  for vendored in VENDORED:
    path = os.path.join(ASSETS_DIR, vendored.site_path)
    if not os.path.exists(path):
      raise PluginError(f'{path} is missing: make docs fetches it (python '
                        'docs/hooks.py fetch)')
    files.append(File.generated(config, vendored.site_path,
                                abs_src_path=path))
  return files


# --------------------------------------------------------------------------
# The check


class _References(html.parser.HTMLParser):
  """What a page refers to: links, scripts, stylesheets and images, and
  whether it draws a Mermaid diagram."""

  def __init__(self):
    super().__init__()
    self.links, self.loads, self.diagrams = [], [], 0

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if tag == 'a' and attrs.get('href'):
      self.links.append(attrs['href'])
    elif tag in ('script', 'img') and attrs.get('src'):
      self.loads.append(attrs['src'])
    elif tag == 'link' and attrs.get('href'):
      self.loads.append(attrs['href'])
    if 'mermaid' in (attrs.get('class') or '').split():
      self.diagrams += 1


def _opened(site_dir: str, page: str, url: str) -> Optional[str]:
  """The path a browser opens for ``url`` on ``page`` of the site read from
  disk (``/x`` is the machine's /x); None for another site's URL."""
  parts = urllib.parse.urlsplit(url)
  if parts.scheme or parts.netloc:
    return None
  return os.path.normpath(os.path.join(
      site_dir, posixpath.dirname(page), urllib.parse.unquote(parts.path)))


def offline_problems(site_dir: str) -> List[str]:
  """What keeps the built site in ``site_dir`` from working opened from
  disk: a link to a folder or to nothing (a page opens a folder listing
  without a server), a script, stylesheet or image from the network, a
  Mermaid diagram without the site's own Mermaid, search without its index
  as a script. Links to other sites are fine: they are links."""
  site_dir = os.path.abspath(site_dir)
  mermaid = next(os.path.join(site_dir, v.site_path) for v in VENDORED
                 if v.package == 'mermaid')

  def in_site(path):
    return path.startswith(site_dir + os.sep) and os.path.isfile(path)

  problems, diagrams = [], 0
  for folder, _, names in os.walk(site_dir):
    for name in sorted(names):
      # 404.html is a web server's page for a missing path, with links
      # from the site's root; nothing on disk links to it.
      if not name.endswith('.html') or (folder, name) == (site_dir,
                                                          '404.html'):
        continue
      path = os.path.join(folder, name)
      page = os.path.relpath(path, site_dir).replace(os.sep, '/')
      found = _References()
      with open(path, encoding='utf-8') as handle:
        found.feed(handle.read())
      diagrams += found.diagrams
      for url in found.links:
        opened = _opened(site_dir, page, url)
        # A link to another site is a link; '#part' stays on the page.
        if opened and urllib.parse.urlsplit(url).path and not in_site(opened):
          problems.append(f'{page}: the link {url} names no file of the site')
      loaded = [_opened(site_dir, page, url) for url in found.loads]
      for url, opened in zip(found.loads, loaded):
        if not (opened and in_site(opened)):
          problems.append(f'{page}: {url} is not a file of the site')
      if found.diagrams and mermaid not in loaded:
        problems.append(f'{page}: Mermaid diagrams without the site\'s own '
                        f'{os.path.relpath(mermaid, site_dir)}')
  if not diagrams:
    problems.append('no page draws a Mermaid diagram')
  search = os.path.join(site_dir, 'search')
  if os.path.isdir(search) and not os.path.isfile(
      os.path.join(search, 'search_index.js')):
    problems.append('search/search_index.js is missing: search needs it on '
                    'file:// (the offline plugin writes it)')
  return problems


@plugins.event_priority(-200)
def on_post_build(config):
  """Fails the build whose site would not work opened from disk; after
  every plugin, the offline one's search index included."""
  problems = offline_problems(config['site_dir'])
  if problems:
    raise PluginError('the site does not work opened from disk:\n' +
                      '\n'.join(problems))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description='The documentation\'s '
                                   'tooling (docs/hooks.py).')
  parser.add_argument('command', choices=('generate', 'fetch'),
                      help='generate: rewrite the generated parts of the '
                      'pages from the code; fetch: the scripts the site '
                      'serves, from npm.')
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format='%(message)s')
  if args.command == 'fetch':
    try:
      fetch()
    except cli.JobError as error:  # the download failed, or its checksum
      _LOG.error('error: %s', error)
      return cli.EXIT_JOB_ERROR
    return 0
  for path in pages():
    with open(path, encoding='utf-8') as handle:
      markdown = handle.read()
    current = generated(markdown)
    if current != markdown:
      with open(path, 'w', encoding='utf-8') as handle:
        handle.write(current)
      _LOG.info('rewrote %s', os.path.relpath(path, REPO))
  return 0


if __name__ == '__main__':
  sys.exit(main())
