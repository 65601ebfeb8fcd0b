"""No job writes over, into or around what it does not own.

Every job × every folder it must not replace (another tool's files, each
other job's output, a folder inside one, the folder of its own input) ×
with and without --overwrite: one ``error:`` line, exit status 2, and not a
byte changed anywhere. Folder names with what Beam and TensorFlow read as a
pattern are refused by every folder flag; other odd names work end to end.
"""
import os
import shutil
import stat

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import pytest

import cli
from cli import flags
from pipeline import jobs
from pipeline import preprocess
from pipeline import score
from tests.conftest import built_once
from tests.conftest import corpus_rows
from tests.conftest import main_in_process
from tests.conftest import run_module
from tests.conftest import score_args
from tests.conftest import synthetic_reviews
from tests.conftest import QUICK_MODEL
from tests.conftest import TINY_MODEL
from tests.conftest import write_jsonl
from trainer import predict
from trainer import train


def _score_reviews(trained):
  def build(folder):
    write_jsonl(folder / 'reviews.jsonl', synthetic_reviews(40, 3))
    score.run([f'--input={folder}/reviews.jsonl',
               f'--model_dir={trained[0]}',
               f'--output_dir={folder / "scored"}'])
  return build


@pytest.fixture(scope='module')
def scored(tmp_path_factory, trained):
  """A scoring output, made once."""
  return built_once(tmp_path_factory, 'scored', _score_reviews(trained)) / (
      'scored')


def snapshot(folder, follow_pipes=True):
  """Every folder and file under ``folder``, with each file's bytes (a
  pipe's unread unless ``follow_pipes``)."""
  found = {}
  for root, folders, names in os.walk(folder):
    for name in folders:
      found[os.path.relpath(os.path.join(root, name), folder) + '/'] = None
    for name in names:
      path = os.path.join(root, name)
      if not follow_pipes and stat.S_ISFIFO(os.stat(path).st_mode):
        found[os.path.relpath(path, folder)] = 'pipe'
        continue
      with open(path, 'rb') as handle:
        found[os.path.relpath(path, folder)] = handle.read()
  return found


def _foreign(target, _):
  """Another tool's experiment folder, with names the trainer uses too."""
  (target / 'checkpoints').mkdir(parents=True)
  (target / 'checkpoints' / 'step-100.ckpt').write_bytes(b'weights')
  for name in ('metrics.json', 'report.md', 'history.csv', 'notes.txt'):
    (target / name).write_text(f'{name} of another tool')


def _copy_of(which):
  def make(target, outputs):
    shutil.copytree(outputs[which], target)
  return make


def _inside(which):
  def make(target, outputs):
    shutil.copytree(outputs[which], target.parent)
  return make


TARGETS = {
    'foreign files': _foreign,
    'a preprocessing output': _copy_of('preprocessed'),
    'a model folder': _copy_of('model'),
    # One version of a model folder's export, copied out: a --model_dir of
    # its own for the scoring job.
    'a model export': _copy_of('export'),
    'a scoring output': _copy_of('scored'),
    'inside a preprocessing output': _inside('preprocessed'),
    'inside a model folder': _inside('model'),
    'inside a scoring output': _inside('scored'),
    'the input\'s folder': None,
}
# Each job's own output, which it replaces on a rerun.
OWN = {'preprocess': 'a preprocessing output', 'score': 'a scoring output',
       'train': 'a model folder'}


def _cases():
  for job in ('preprocess', 'score', 'train'):
    for target in TARGETS:
      if target == OWN[job]:
        continue
      # Foreign files are replaced when the operator says so; the trainer
      # has no --overwrite.
      overwrites = [False] + [True] * (job != 'train' and
                                       target != 'foreign files')
      for overwrite in overwrites:
        yield job, target, overwrite


@pytest.mark.parametrize('job,target,overwrite', list(_cases()))
def test_no_job_replaces_what_it_does_not_own(
    tmp_path, monkeypatch, capsys, synthetic_preprocessed, trained, scored,
    job, target, overwrite):
  outputs = {'preprocessed': synthetic_preprocessed, 'model': trained[0],
             'export': trained[1], 'scored': scored}
  inputs = tmp_path / 'inputs'
  inputs.mkdir()
  corpus = write_jsonl(inputs / 'reviews.jsonl', synthetic_reviews(60, 0))
  data_dir = tmp_path / 'preprocessed'
  shutil.copytree(synthetic_preprocessed, data_dir)
  if TARGETS[target]:
    folder = tmp_path / 'target' / 'out'
    TARGETS[target](folder, outputs)
  else:
    folder = data_dir if job == 'train' else inputs
  before = snapshot(tmp_path)
  if job == 'preprocess':
    status, stderr = main_in_process(
        monkeypatch, capsys, preprocess.run, f'--input={corpus}',
        f'--output_dir={folder}', *['--overwrite'] * overwrite)
  elif job == 'score':
    status, stderr = main_in_process(
        monkeypatch, capsys, score.run, f'--input={corpus}',
        f'--model_dir={trained[0]}', f'--output_dir={folder}',
        *['--overwrite'] * overwrite)
  else:
    status, stderr = main_in_process(
        monkeypatch, capsys, train.run, f'--data_dir={data_dir}',
        f'--model_dir={folder}', *TINY_MODEL)
  assert status == 2, stderr
  assert [line for line in stderr.splitlines()
          if line.startswith('error:')] == [stderr.strip().splitlines()[-1]]
  assert 'Traceback' not in stderr
  assert snapshot(tmp_path) == before


def test_the_trainer_trains_into_a_folder_a_failed_run_left(
    tmp_path, synthetic_preprocessed):
  # Logs and a scratch folder, what a run killed in its first epoch leaves.
  model_dir = tmp_path / 'model'
  (model_dir / 'logs' / 'run-1').mkdir(parents=True)
  (model_dir / '.run-20261125-000000-abcdef').mkdir()
  train.run([f'--data_dir={synthetic_preprocessed}',
             f'--model_dir={model_dir}', *QUICK_MODEL])
  assert (model_dir / 'export').is_dir()


# Every entry point's folder flags, with the flags each needs besides.
FOLDER_FLAGS = {
    'preprocess --output_dir': (preprocess.parse_args, 'output_dir',
                                ['--input=in.jsonl']),
    'score --output_dir': (score.parse_args, 'output_dir',
                           ['--input=in.jsonl', '--model_dir=m']),
    'score --model_dir': (score.parse_args, 'model_dir',
                          ['--input=in.jsonl', '--output_dir=o']),
    'train --data_dir': (train.parse_args, 'data_dir', ['--model_dir=m']),
    'train --model_dir': (train.parse_args, 'model_dir', ['--data_dir=d']),
    'predict --model_dir': (predict.parse_args, 'model_dir', []),
}
_NAMES = st.text(st.sampled_from('[]?*{}\\ ab.-_é文,=\'"$'), min_size=1,
                 max_size=8)


@pytest.mark.parametrize('entry', sorted(FOLDER_FLAGS))
@settings(max_examples=60, deadline=None)
@given(name=_NAMES)
def test_a_folder_flag_takes_a_name_as_it_is_or_refuses_a_pattern(
    entry, name):
  parse, flag, others = FOLDER_FLAGS[entry]
  value = f'/data/{name}/out'
  argv = [*others, f'--{flag}={value}']
  if set(name) & set(flags.PATTERN_CHARACTERS):
    with pytest.raises(SystemExit) as exit_info:
      parse(argv)
    assert exit_info.value.code == 2
  else:
    args = parse(argv)
    args = args[0] if isinstance(args, tuple) else args
    assert getattr(args, flag) == value


def test_odd_folder_names_work_end_to_end(tmp_path):
  """Spaces, braces, quotes, commas and non-ASCII in every folder: the
  three jobs and trainer.predict."""
  odd = tmp_path / 'a {b,c} é 文\'s "$x",y=1'
  odd.mkdir()
  corpus = write_jsonl(odd / 'reviews.jsonl',
                       synthetic_reviews(300, 0) + synthetic_reviews(100, 1))
  preprocess.run([f'--input={corpus}', f'--output_dir={odd / "pre {1}"}',
                  '--split_field=split', '--max_len=24'])
  _, export_dir = train.run([f'--data_dir={odd / "pre {1}"}',
                             f'--model_dir={odd / "model é"}', *QUICK_MODEL])
  assert export_dir.startswith(str(odd / 'model é'))
  manifest = score.run([f'--input={corpus}', f'--model_dir={odd / "model é"}',
                        f'--output_dir={odd / "scores {x}"}'])
  assert manifest['counts']['scored'] == 400
  predicted = run_module('trainer.predict', f'--model_dir={odd / "model é"}',
                         'a superb film')
  assert predicted.returncode == 0, predicted.stderr
  assert predicted.stdout.split('\t')[0] in ('pos', 'neg')


def _model_copy(trained, tmp_path, name='model'):
  folder = tmp_path / name
  shutil.copytree(trained[0], folder)
  return folder


def _linked_model_dir_inside_preprocessed(tmp_path, trained, preprocessed):
  shutil.copytree(preprocessed, tmp_path / 'pre2')
  (tmp_path / 'pre2' / 'sub').mkdir()
  (tmp_path / 'link').symlink_to(tmp_path / 'pre2' / 'sub')
  return tmp_path / 'link'


def _operator_files_named_like_the_trainers(tmp_path, trained, _):
  folder = _model_copy(trained, tmp_path)
  (folder / '.run-archive').mkdir()
  (folder / '.run-archive' / 'notes.txt').write_text('kept')
  (folder / '.trainer.lock.bak').write_text('kept')
  return folder


def _linked_checkpoints(tmp_path, trained, _):
  folder = _model_copy(trained, tmp_path)
  (tmp_path / 'victim').mkdir()
  (tmp_path / 'victim' / 'notes.txt').write_text('kept')
  shutil.rmtree(folder / 'checkpoints', ignore_errors=True)
  (folder / 'checkpoints').symlink_to(tmp_path / 'victim')
  return folder


def _export_linked_to_another_model(tmp_path, trained, _):
  other = _model_copy(trained, tmp_path, 'other')
  folder = tmp_path / 'model'
  folder.mkdir()
  (folder / 'export').symlink_to(other / 'export')
  return folder


def _lock_as_a_folder(tmp_path, trained, _):
  folder = _model_copy(trained, tmp_path)
  (folder / '.trainer.lock').unlink(missing_ok=True)
  (folder / '.trainer.lock').mkdir()
  return folder


def _files_inside_the_trainers_folders(tmp_path, trained, _):
  folder = _model_copy(trained, tmp_path)
  (folder / 'checkpoints').mkdir(exist_ok=True)
  (folder / 'checkpoints' / 'notes.txt').write_text('kept')
  return folder


def _lock_hard_linked_to_another_file(tmp_path, trained, _):
  folder = _model_copy(trained, tmp_path)
  (tmp_path / 'stats.json').write_text('kept')
  (folder / '.trainer.lock').unlink(missing_ok=True)
  os.link(tmp_path / 'stats.json', folder / '.trainer.lock')
  return folder


def _lock_as_a_pipe(tmp_path, trained, _):
  folder = _model_copy(trained, tmp_path)
  (folder / '.trainer.lock').unlink(missing_ok=True)
  os.mkfifo(folder / '.trainer.lock')
  return folder


@pytest.mark.parametrize('make', [
    _linked_model_dir_inside_preprocessed,
    _operator_files_named_like_the_trainers, _linked_checkpoints,
    _export_linked_to_another_model, _lock_as_a_folder,
    _files_inside_the_trainers_folders, _lock_hard_linked_to_another_file,
    _lock_as_a_pipe])
def test_the_trainer_writes_through_no_link_and_keeps_what_is_not_its(
    tmp_path, monkeypatch, capsys, synthetic_preprocessed, trained, make):
  work = tmp_path / 'work'
  work.mkdir()
  model_dir = make(work, trained, synthetic_preprocessed)
  before = snapshot(work, follow_pipes=False)
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={synthetic_preprocessed}',
      f'--model_dir={model_dir}', *TINY_MODEL)
  assert status == 2, stderr
  assert 'Traceback' not in stderr
  assert snapshot(work, follow_pipes=False) == before


def test_the_trainer_never_reads_its_data_from_inside_its_model_folder(
    tmp_path, monkeypatch, capsys, synthetic_preprocessed, trained):
  model_dir = _model_copy(trained, tmp_path)
  shutil.rmtree(model_dir / 'checkpoints', ignore_errors=True)
  shutil.copytree(synthetic_preprocessed, model_dir / 'checkpoints')
  before = snapshot(tmp_path)
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={model_dir}/checkpoints',
      f'--model_dir={model_dir}', *TINY_MODEL)
  assert status == 2, stderr
  assert snapshot(tmp_path) == before


def test_an_output_written_into_while_the_job_ran_is_not_replaced(
    tmp_path, monkeypatch, capsys, scored):
  corpus = write_jsonl(tmp_path / 'in.jsonl', synthetic_reviews(20, 0))
  output = tmp_path / 'out'
  real_run_pipeline = jobs.run_pipeline

  def run_while_another_job_publishes(*args):
    result = real_run_pipeline(*args)
    # A scoring job publishes inside this job's output folder meanwhile.
    shutil.copytree(scored, output / 'scores')
    return result

  monkeypatch.setattr(jobs, 'run_pipeline', run_while_another_job_publishes)
  status, stderr = main_in_process(
      monkeypatch, capsys, preprocess.run, f'--input={corpus}',
      f'--output_dir={output}')
  assert status == 2, stderr
  assert 'a scoring output' in stderr.splitlines()[-1]
  assert snapshot(output / 'scores') == snapshot(scored)
  assert sorted(os.listdir(tmp_path)) == ['in.jsonl', 'out']


def test_a_beam_job_sees_links_and_empty_folders_and_writes_through_no_link(
    tmp_path, monkeypatch, capsys, synthetic_preprocessed, trained):
  corpus = write_jsonl(tmp_path / 'in.jsonl', synthetic_reviews(20, 0))
  # An output folder of a link and an empty folder: not this job's.
  (tmp_path / 'tool').mkdir()
  (tmp_path / 'out' / 'empty').mkdir(parents=True)
  (tmp_path / 'out' / 'shared').symlink_to(tmp_path / 'tool')
  # A partition through a link into another job's output, and a partition
  # that is a link.
  shutil.copytree(synthetic_preprocessed, tmp_path / 'pre')
  (tmp_path / 'scores').mkdir()
  (tmp_path / 'scores' / 'dt=1').symlink_to(tmp_path / 'pre' / 'transform_fn')
  (tmp_path / 'scores' / 'dt=2').symlink_to(tmp_path / 'tool')
  # A staging folder that is a link into another job's output.
  (tmp_path / '.linked.staging').symlink_to(tmp_path / 'pre')
  before = snapshot(tmp_path)
  runs = [
      (preprocess.run, f'--input={corpus}', f'--output_dir={tmp_path / "out"}'),
      (score.run, f'--input={corpus}', f'--model_dir={trained[0]}',
       f'--output_dir={tmp_path / "scores"}', '--partition=dt=1/hour=01'),
      (score.run, f'--input={corpus}', f'--model_dir={trained[0]}',
       f'--output_dir={tmp_path / "scores"}', '--partition=dt=2',
       '--overwrite'),
      (preprocess.run, f'--input={corpus}',
       f'--output_dir={tmp_path / "linked"}'),
  ]
  for run, *flags_given in runs:
    status, stderr = main_in_process(monkeypatch, capsys, run, *flags_given)
    assert status == 2, stderr
    assert 'Traceback' not in stderr
  assert snapshot(tmp_path) == before


# What people's tools leave in the folders they open (outputs.tool_files),
# by path, with bytes that must outlive every job's run.
TOOL_FILES = {
    '.DS_Store': b'Finder',
    '.gitkeep': b'',
    '.ipynb_checkpoints/report-checkpoint.md': b'JupyterLab',
    '.report.md.swp': b'vim',
}


def _leave(folder, found):
  for path, content in found.items():
    (folder / path).parent.mkdir(parents=True, exist_ok=True)
    (folder / path).write_bytes(content)


def _kept(folder, found):
  return {path: (folder / path).read_bytes() for path in found
          if (folder / path).exists()}


def test_the_trainer_keeps_what_tools_and_people_leave_in_a_model_folder(
    tmp_path, synthetic_preprocessed, trained):
  """.DS_Store, .ipynb_checkpoints/, .gitkeep, swap files and a NOTES.md
  beside the versions: a new version is added, every one of them kept,
  also in the folders a run replaces whole (checkpoints/)."""
  model_dir = _model_copy(trained, tmp_path)
  (model_dir / 'checkpoints').mkdir(exist_ok=True)
  left = {**TOOL_FILES, 'NOTES.md': b'trained nightly',
          'checkpoints/.DS_Store': b'Finder',
          f'export/{os.path.basename(trained[1])}/.DS_Store': b'Finder'}
  _leave(model_dir, left)
  # A tiny model after the fixture's: blessed whatever it scores.
  _, export_dir = train.run([f'--data_dir={synthetic_preprocessed}',
                             f'--model_dir={model_dir}', *TINY_MODEL,
                             '--bless_tolerance=1'])
  assert os.path.basename(export_dir) != os.path.basename(trained[1])
  assert _kept(model_dir, left) == left


def test_the_trainer_trains_into_a_folder_holding_only_notes_and_tool_files(
    tmp_path, synthetic_preprocessed):
  model_dir = tmp_path / 'model'
  left = {'.gitkeep': b'', 'README.txt': b'the nightly model', **TOOL_FILES}
  _leave(model_dir, left)
  train.run([f'--data_dir={synthetic_preprocessed}',
             f'--model_dir={model_dir}', *QUICK_MODEL])
  assert (model_dir / 'export').is_dir()
  assert _kept(model_dir, left) == left


def test_a_rerun_replaces_a_partition_that_tools_left_files_in_and_keeps_them(
    tmp_path, trained):
  corpus = write_jsonl(tmp_path / 'in.jsonl', synthetic_reviews(20, 0))
  root = tmp_path / 'scores'
  flags_given = [f'--input={corpus}', f'--model_dir={trained[0]}',
                 f'--output_dir={root}', '--partition=dt=1']
  score.run(flags_given)
  left = {**TOOL_FILES, 'Thumbs.db': b'Explorer'}
  _leave(root / 'dt=1', left)
  manifest = score.run(flags_given)
  assert manifest['counts']['scored'] == 20
  assert _kept(root / 'dt=1', left) == left
  # A note is a file a rerun would delete: kept only with --overwrite's
  # leave to replace the partition whole.
  (root / 'dt=1' / 'NOTES.md').write_text('ours')
  with pytest.raises(cli.JobError, match='files this job does not write, '
                     'such as NOTES.md'):
    score.run(flags_given)


def test_a_file_where_the_output_folder_goes_is_never_replaced(trained,
                                                              tmp_path):
  model_dir, _, _ = trained
  corpus = write_jsonl(tmp_path / 'corpus.jsonl', corpus_rows(20, 12))
  report = tmp_path / 'report.csv'
  report.write_text('a user file')
  (tmp_path / 'scores').mkdir()
  (tmp_path / 'scores' / 'dt=1').write_text('another')
  for output, extra in ((report, ()), (report, ('--overwrite',)),
                        (tmp_path / 'scores', ('--partition=dt=1',))):
    with pytest.raises(cli.JobError, match='is a file'):
      score.run(score_args(corpus, model_dir, output, *extra))
  assert report.read_text() == 'a user file'
  assert (tmp_path / 'scores' / 'dt=1').read_text() == 'another'
