"""The packages' import direction: schemas < cli < serving and outputs <
the two jobs, the jobs independent of each other, and no job using the
clusters tooling; where the tests are: each test file named on the
architecture page, none imported by another."""
import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

# What each package may import of ours; nothing imports a job but itself.
ALLOWED = {
    'schemas': {'schemas'},
    'cli': {'schemas', 'cli'},
    'serving': {'schemas', 'cli', 'serving'},
    # Where a job may write: below the jobs, which hand it their file
    # access, so it imports neither Beam nor TensorFlow.
    'outputs': {'schemas', 'cli', 'outputs'},
    'pipeline': {'schemas', 'cli', 'serving', 'outputs', 'pipeline'},
    'trainer': {'schemas', 'cli', 'serving', 'outputs', 'trainer'},
    # The Python API over an export: what serving offers, no job.
    'textclf': {'schemas', 'cli', 'serving', 'textclf'},
    # Tooling beside the jobs (the runners' clusters): none of them imports
    # it, and it imports none of them; an entry point itself, it shares
    # cli's (processes that end with the command that started them).
    'clusters': {'cli', 'clusters'},
}


def imported_packages(path: pathlib.Path):
  """The top-level packages a module imports, anywhere in it."""
  for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
    if isinstance(node, ast.Import):
      yield from (alias.name.split('.')[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      yield node.module.split('.')[0]


@pytest.mark.parametrize('package', sorted(ALLOWED))
def test_a_package_imports_only_the_packages_below_it(package):
  ours = set(ALLOWED)
  wrong = sorted(
      f'{path.relative_to(REPO)} imports {name}'
      for path in (REPO / package).rglob('*.py')
      for name in imported_packages(path)
      if name in ours and name not in ALLOWED[package])
  assert not wrong


def imported_modules(path: pathlib.Path):
  """Every module a file of ``tests/`` imports, by its full name: a name
  imported from a package (``from tests import x``) counts as its module,
  and a relative import is resolved from ``tests``."""
  for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      package = '.'.join(['tests'] * bool(node.level) + [node.module or ''])
      yield package.strip('.')
      yield from (f'{package.strip(".")}.{alias.name}' for alias in node.names)


def test_no_test_file_imports_another():
  """What test files share is in conftest.py (and runner_checks.py for the
  cluster tests): a test file is run, never imported."""
  wrong = sorted(
      f'{path.relative_to(REPO)} imports {name}'
      for path in (REPO / 'tests').glob('*.py')
      for name in imported_modules(path)
      if name.startswith('tests.test_'))
  assert not wrong


def test_the_architecture_page_names_every_test_file():
  """Its Tests section says where the tests of each module and behaviour
  are."""
  page = (REPO / 'docs' / 'architecture.md').read_text(encoding='utf-8')
  section = page.split('\n## Tests\n', 1)[1].split('\n## ', 1)[0]
  unnamed = sorted(path.name for path in (REPO / 'tests').glob('test_*.py')
                   if not re.search(rf'\b{re.escape(path.name)}', section))
  assert not unnamed


def modules_loaded_by(code: str, unimportable=()):
  """The modules a fresh interpreter holds after running ``code``, with
  the packages ``unimportable`` missing. Its environment is a shell's: not
  this process's TF_USE_LEGACY_KERAS, which tensorflow-transform sets once
  a test imports it, and which decides whether TensorFlow loads Keras 3
  (and with it matplotlib, where installed)."""
  probe = ''.join(f'import sys\nsys.modules[{name!r}] = None\n'
                  for name in unimportable)
  probe += code + '\nimport sys\nprint("\\n".join(sorted(sys.modules)))'
  environment = {name: value for name, value in os.environ.items()
                 if name != 'TF_USE_LEGACY_KERAS'}
  result = subprocess.run([sys.executable, '-c', probe], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          check=True, env=environment)
  return set(result.stdout.split())


def test_the_trainer_loads_no_beam():
  loaded = modules_loaded_by('import trainer.train, trainer.predict')
  assert not {m for m in loaded if m.startswith('apache_beam')}


def test_the_python_api_loads_no_beam_and_no_trainer(trained):
  """A notebook's import and prediction load neither Beam nor the jobs'
  packages (tensorflow-transform, the trainer), and work without the
  trainer's matplotlib (which Keras 3 loads where it is installed)."""
  model_dir, _, _ = trained
  loaded = modules_loaded_by(f'''
import textclf
textclf.load({str(model_dir)!r}).predict(['a fine film'], as_frame=True)
''', unimportable=('matplotlib',))
  assert 'textclf' in loaded and 'pandas' in loaded
  assert not {m for m in loaded if m.split('.')[0] in (
      'apache_beam', 'tensorflow_transform', 'trainer', 'pipeline')}


def test_the_outputs_layer_uses_neither_beam_nor_tensorflow():
  """Each job hands it its own file access: the trainer loads no Beam for
  it, the Beam jobs no TensorFlow of its own."""
  wrong = sorted(
      f'{path.relative_to(REPO)} imports {name}'
      for path in (REPO / 'outputs').rglob('*.py')
      for name in imported_packages(path)
      if name in ('apache_beam', 'tensorflow'))
  assert not wrong
  loaded = modules_loaded_by('import outputs, outputs.partitions, '
                             'outputs.versions')
  assert 'outputs.rules' in loaded
  assert not {m for m in loaded if m.startswith('apache_beam')}


def test_a_scoring_worker_loads_no_tensorflow_transform(trained):
  _, export_dir, _ = trained
  loaded = modules_loaded_by(f'''
from pipeline import score
from pipeline.scoring import inference
handler = inference.RawTextModelHandler({str(export_dir)!r})
model = handler.load_model()
list(handler.run_inference([{{'id': '1', 'text': 'a fine film'}}], model))
''')
  assert 'pipeline.score' in loaded
  assert not {m for m in loaded if m.startswith('tensorflow_transform')}
