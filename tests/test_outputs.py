"""outputs: where a job stages, what it publishes, what it refuses."""
import errno
import os
import posixpath
import signal
import time

from apache_beam.io.filesystems import FileSystems
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cli
import outputs
from outputs import ownership
from outputs import staging
from outputs import swap
from outputs import tool_files
from pipeline import filesystems
from pipeline import records
from pipeline import score
from schemas import scored
from tests import s3
from tests.conftest import corpus_rows
from tests.conftest import read_partition
from tests.conftest import score_args
from tests.conftest import tree
from tests.conftest import write_jsonl

LAYOUT = outputs.Layout(
    contents=('part-*.parquet', '_manifest.json', '_SUCCESS',
              '_rejected/rejected-*.jsonl'),
    markers=('_SUCCESS', '_manifest.json'), owner=ownership.SCORING)
PART = 'part-00000-of-00001.parquet'


def claim(root, pattern='', layout=LAYOUT, **kwargs):
  """A Beam job's output claimed, for a job that reads ``pattern``."""
  return outputs.claim(filesystems.FILES, str(root), layout=layout,
                       input_pattern=pattern,
                       reads=pattern and filesystems.reads(pattern),
                       **kwargs)


def write(folder, relative, content=b'x'):
  with FileSystems.create(posixpath.join(folder, relative)) as handle:
    handle.write(content)


def listing(folder):
  """Every file under ``folder``, hidden ones too, relative to it."""
  folder = str(folder).rstrip('/')
  return sorted(m.path[len(folder) + 1:] for m in FileSystems.match(
      [folder + '/**'])[0].metadata_list)


def publish(root, files, **kwargs):
  """One run that stages ``files`` and publishes them."""
  with claim(str(root), layout=LAYOUT, **kwargs) as output:
    for relative in files:
      write(output.staging_dir, relative)
    output.publish()
  return output


def test_staging_is_a_hidden_sibling_of_the_output_root(tmp_path):
  root = tmp_path / 'scores'
  with claim(str(root), partition='dt=5/hour=01',
                      layout=LAYOUT) as output:
    assert posixpath.dirname(output.staging_dir) == str(
        tmp_path / '.scores.staging') == outputs.staging_root(str(root))
    write(output.staging_dir, PART)
    write(output.staging_dir, '_SUCCESS')
    assert listing(root) == []
    output.publish()
  assert os.listdir(tmp_path) == ['scores']
  assert listing(root) == ['dt=5/hour=01/_SUCCESS', f'dt=5/hour=01/{PART}']


def modes(folder):
  """The permission bits of ``folder`` and everything below it."""
  found = {'.': oct(os.stat(folder).st_mode & 0o777)}
  for parent, names, files in os.walk(folder):
    for name in names + files:
      path = os.path.join(parent, name)
      found[os.path.relpath(path, folder)] = oct(os.stat(path).st_mode & 0o777)
  return found


@pytest.mark.parametrize('partition', ['', 'dt=1'])
def test_a_rerun_keeps_the_permissions_of_what_it_replaces(tmp_path,
                                                           partition):
  """An output an operator made private stays private: the rerun's folders
  get the old folder's mode and its files the old files' (the bits they
  all share); while it runs, its staging is no more open than the output."""
  root = tmp_path / 'scores'
  files = [PART, '_SUCCESS', '_rejected/rejected-00000-of-00001.jsonl']
  publish(root, files, partition=partition)
  output = root / partition
  for parent, names, found in os.walk(output):
    os.chmod(parent, 0o700)
    for name in found:
      os.chmod(os.path.join(parent, name), 0o600)
  if partition:
    os.chmod(root, 0o750)
  with claim(str(root), partition=partition,
                      layout=LAYOUT) as staged:
    for relative in files:
      write(staged.staging_dir, relative)
    assert os.stat(staged.staging_dir).st_mode & 0o777 == 0o700
    assert os.stat(outputs.staging_root(str(root))).st_mode & 0o777 == 0o700
    staged.publish()
  assert set(modes(output).values()) == {oct(0o700), oct(0o600)}
  assert modes(output)['.'] == oct(0o700)
  assert modes(output)['_rejected'] == oct(0o700)
  assert modes(output)[PART] == oct(0o600)


def test_only_what_the_job_wrote_as_output_is_published(tmp_path):
  root = tmp_path / 'scores'
  publish(root, [PART, '_SUCCESS', '_rejected/rejected-00000-of-00001.jsonl',
                 'beam-temp-part-0a1b/part.parquet', 'stray.txt',
                 '_rejected/beam-temp-rejected-2c3d/x.jsonl'])
  assert listing(root) == ['_SUCCESS',
                           '_rejected/rejected-00000-of-00001.jsonl', PART]
  assert sorted(os.listdir(root)) == ['_SUCCESS', '_rejected', PART]
  assert os.listdir(root / '_rejected') == ['rejected-00000-of-00001.jsonl']


def test_a_symlinked_output_root_is_published_into_its_target(tmp_path):
  real, link = tmp_path / 'real', tmp_path / 'link'
  real.mkdir()
  link.symlink_to(real)
  for run in (1, 2):
    publish(link, [f'part-0000{run}-of-00001.parquet', '_SUCCESS'])
  assert link.is_symlink() and os.readlink(link) == str(real)
  assert sorted(os.listdir(real)) == ['_SUCCESS',
                                      'part-00002-of-00001.parquet']
  assert sorted(os.listdir(tmp_path)) == ['link', 'real']


def test_an_output_the_input_pattern_would_read_is_refused(tmp_path,
                                                           monkeypatch):
  data = tmp_path / 'data'
  data.mkdir()
  (tmp_path / 'alias').symlink_to(data)
  monkeypatch.chdir(tmp_path)
  root = str(data / 'scores')
  for pattern in (f'{data}/**/*.jsonl', f'{data}/**', 'data/**/*.jsonl',
                  f'{tmp_path}/alias/**/*.parquet', f'{data}/scores/*/*',
                  # Folders it makes, read as (unreadable) input files: the
                  # root, the partition, the staging folders.
                  f'{data}/*', f'{data}/scores/*', f'{data}/.*'):
    with pytest.raises(outputs.OutputError, match='inside the input'):
      with claim(root, pattern, partition='dt=1',
                          layout=LAYOUT):
        pass
  assert os.listdir(data) == []
  for pattern in (f'{data}/*.jsonl', f'{data}/*/*.parquet',
                  f'{data}/scores/dt=2/*.parquet'):
    with claim(root, pattern, partition='dt=1', layout=LAYOUT):
      pass


def test_an_existing_folder_is_replaced_only_if_this_job_published_it(
    tmp_path):
  root = tmp_path / 'scores'
  foreign = root / 'dt=5' / 'notes.txt'
  foreign.parent.mkdir(parents=True)
  foreign.write_text('not ours')
  with pytest.raises(outputs.OutputError, match='--overwrite'):
    publish(root, [PART, '_SUCCESS'], partition='dt=5')
  assert listing(root) == ['dt=5/notes.txt']
  publish(root, [PART, '_SUCCESS'], partition='dt=5', overwrite=True)
  assert listing(root) == ['dt=5/_SUCCESS', f'dt=5/{PART}']

  # A folder that holds other partitions is not replaced either.
  for hour in ('01', '02'):
    publish(root, [PART, '_SUCCESS'], partition=f'dt=6/hour={hour}')
  with pytest.raises(outputs.OutputError, match='--overwrite'):
    publish(root, [PART, '_SUCCESS'], partition='dt=6')
  publish(root, [PART], partition='dt=6/hour=01')
  assert [p for p in listing(root) if p.startswith('dt=6')] == [
      f'dt=6/hour=01/{PART}', 'dt=6/hour=02/_SUCCESS', f'dt=6/hour=02/{PART}']
  # Nor is the root of partitions, once it holds some.
  with pytest.raises(outputs.OutputError, match='--overwrite'):
    publish(root, [PART, '_SUCCESS'])
  # An empty folder holds nothing to lose.
  (tmp_path / 'empty').mkdir()
  publish(tmp_path / 'empty', [PART])
  assert listing(tmp_path / 'empty') == [PART]


def test_an_output_root_that_is_a_mount_point_is_refused(tmp_path,
                                                          monkeypatch):
  root = tmp_path / 'scores'
  root.mkdir()
  monkeypatch.setattr(staging, '_device',
                      lambda path: os.path.realpath(path) == str(root))
  with pytest.raises(outputs.OutputError, match='mount point'):
    publish(root, [PART], partition='dt=1')
  assert os.listdir(tmp_path) == ['scores']


def leave_behind(root, partition):
  """A run killed with SIGKILL: entered, never left."""
  output = claim(str(root), partition=partition, layout=LAYOUT)
  output.__enter__()
  write(output.staging_dir, PART)
  return output.staging_dir


def backdate(folder, seconds):
  then = time.time() - seconds
  for path in [folder] + [os.path.join(folder, f) for f in os.listdir(folder)]:
    os.utime(path, (then, then))


def test_a_killed_runs_staging_folder_is_swept_after_a_day(tmp_path,
                                                           caplog):
  """A recent one is named (a run killed with its watchdog may have left a
  cluster's job writing into it), never published, and kept."""
  root = tmp_path / 'scores'
  stale = leave_behind(root, 'dt=1')
  backdate(stale, outputs.STALE_SECONDS + 60)
  recent = leave_behind(root, 'dt=1')
  backdate(recent, outputs.STALE_SECONDS - 600)
  other = leave_behind(root, 'dt=10')
  backdate(other, outputs.STALE_SECONDS + 60)
  publish(root, [PART], partition='dt=1')
  assert sorted(os.listdir(outputs.staging_root(str(root)))) == sorted(
      os.path.basename(f) for f in (recent, other))
  assert [record.getMessage().split(':')[0] for record in caplog.records
          if record.levelname == 'WARNING'] == [recent]


def test_publish_and_rerun_on_an_object_store(monkeypatch):
  with s3.s3_server():
    root = f's3://{s3.BUCKET}/scores'
    first = ['part-00000-of-00002.parquet', 'part-00001-of-00002.parquet',
             '_SUCCESS', '_manifest.json', 'beam-temp-part-1/x.parquet']
    publish(root, first, partition='dt=1')
    publish(root, [PART], partition='dt=2')
    assert listing(root) == ['dt=1/_SUCCESS', 'dt=1/_manifest.json',
                             'dt=1/part-00000-of-00002.parquet',
                             'dt=1/part-00001-of-00002.parquet', f'dt=2/{PART}']

    calls = []
    for name in ('delete', 'rename'):
      original = getattr(FileSystems, name)
      monkeypatch.setattr(FileSystems, name, lambda paths, *rest, _name=name,
                          _original=original: calls.append(
                              (_name, paths)) or _original(paths, *rest))
    publish(root, [PART, '_SUCCESS', '_manifest.json'], partition='dt=1')
    assert listing(root) == ['dt=1/_SUCCESS', 'dt=1/_manifest.json',
                             f'dt=1/{PART}', f'dt=2/{PART}']
    # Readers that wait for _SUCCESS never see a partition being replaced:
    # the old marker goes before any file, the new one after every file.
    first_delete = [c for c in calls if c[0] == 'delete' and
                    c[1][0].startswith(f'{root}/dt=1/')][0]
    renames = [c for c in calls if c[0] == 'rename']
    assert first_delete == ('delete', [f'{root}/dt=1/_SUCCESS'])
    assert calls.index(first_delete) < calls.index(renames[0])
    assert [posixpath.basename(p) for p in renames[-1][1]] == ['_SUCCESS']
    monkeypatch.undo()

    # What the Finder left in a partition stays through its rerun.
    write(f'{root}/dt=2', '.DS_Store')
    publish(root, [PART, '_SUCCESS'], partition='dt=2')
    assert listing(f'{root}/dt=2') == ['.DS_Store', '_SUCCESS', PART]
    publish(root, [PART], partition='dt=2')

    with pytest.raises(RuntimeError):
      with claim(root, partition='dt=1', layout=LAYOUT) as out:
        write(out.staging_dir, 'part-00000-of-00003.parquet')
        raise RuntimeError('the pipeline failed')
    assert listing(f's3://{s3.BUCKET}') == [
        'scores/dt=1/_SUCCESS', 'scores/dt=1/_manifest.json',
        f'scores/dt=1/{PART}', 'scores/dt=2/.DS_Store', f'scores/dt=2/{PART}']
    write(f's3://{s3.BUCKET}/other', 'notes.txt')
    with pytest.raises(outputs.OutputError, match='--overwrite'):
      publish(f's3://{s3.BUCKET}/other', [PART])


@pytest.fixture
def no_exchange(monkeypatch):
  """A file system without the atomic swap of folders; returns the calls the
  publishing made to it, to show the fallback was taken."""
  calls = []

  def cannot_swap(first, second):
    calls.append((first, second))
    return False
  monkeypatch.setattr(swap, 'exchange', cannot_swap)
  return calls


def publish_contents(root, files):
  """One run of partition dt=1 that stages ``files`` (name: bytes)."""
  with claim(str(root), partition='dt=1',
                      layout=LAYOUT) as output:
    for relative, content in files.items():
      write(output.staging_dir, relative, content)
    output.publish()


@pytest.mark.usefixtures('no_exchange')
def test_first_publish_without_the_swap_moves_the_staging_into_place(
    tmp_path):
  new = {PART: b'new rows', '_rejected/rejected-0.jsonl': b'{}',
         '_SUCCESS': b'\n'}
  publish_contents(tmp_path / 'scores', new)
  assert tree(tmp_path / 'scores' / 'dt=1') == new
  assert os.listdir(tmp_path) == ['scores']


def test_publish_without_the_swap_replaces_the_output_whole(tmp_path,
                                                            no_exchange):
  publish_contents(tmp_path / 'scores', {
      PART: b'old rows', 'part-00001-of-00002.parquet': b'old rows',
      '_rejected/rejected-0.jsonl': b'old', '_SUCCESS': b'\n'})
  new = {PART: b'new rows', '_SUCCESS': b'\n'}
  publish_contents(tmp_path / 'scores', new)
  assert len(no_exchange) == 1
  # The old output's files are gone, not merged with the new ones.
  assert tree(tmp_path / 'scores' / 'dt=1') == new
  # Neither the staging folder nor the old output moved aside for the
  # renames is left.
  assert os.listdir(tmp_path) == ['scores']


def test_leaving_without_publishing_removes_the_staging(tmp_path):
  with pytest.raises(RuntimeError):
    with claim(str(tmp_path / 'scores'), partition='dt=1',
                        layout=LAYOUT) as output:
      write(output.staging_dir, PART, b'half')
      raise RuntimeError('the pipeline failed')
  assert os.listdir(tmp_path) == []


def test_a_stopped_run_never_publishes_though_the_stop_was_swallowed(
    tmp_path, monkeypatch):
  publish_contents(tmp_path / 'scores', {PART: b'old rows', '_SUCCESS': b''})
  before = tree(tmp_path / 'scores')
  # SIGTERM came, and a library on the way took the exception it raised
  # for an error of its own and went on: the pipeline finished.
  monkeypatch.setattr(cli, '_STOPPED_BY', [signal.SIGTERM])
  with pytest.raises(cli.Stopped):
    publish_contents(tmp_path / 'scores', {PART: b'new rows',
                                           '_SUCCESS': b''})
  assert tree(tmp_path / 'scores') == before
  assert os.listdir(tmp_path) == ['scores']


def test_what_tools_leave_is_told_from_what_jobs_and_people_write():
  for path in ('.DS_Store', 'dt=1/.DS_Store', '._part-00000.parquet',
               'Thumbs.db', 'desktop.ini', '.ipynb_checkpoints/',
               '.ipynb_checkpoints/report-checkpoint.md', 'export/1/.gitkeep',
               '.report.md.swp', '.report.md.swo', 'report.md~',
               '.#report.md'):
    assert tool_files.is_tool_file(path), path
  for path in (PART, '_SUCCESS', '_manifest.json', '.trainer.lock',
               '.run-20261125-000000-abcdef', 'export/.tmp-x', 'notes.txt',
               'NOTES.md', 'DS_Store', 'checkpoints/best.weights.h5',
               'ipynb_checkpoints/x'):
    assert not tool_files.is_tool_file(path), path
  assert tool_files.tool_root('a/.ipynb_checkpoints/b/c.md') == (
      'a/.ipynb_checkpoints')
  for path in ('NOTES.md', 'README', 'readme.txt', 'Notes.rst'):
    assert tool_files.is_note(path), path
  for path in ('notes.docx', 'dt=1/README.md', 'NOTES.md.bak', 'READ.md'):
    assert not tool_files.is_note(path), path


def test_a_rerun_keeps_what_tools_left_in_the_output_it_replaces(tmp_path):
  root = tmp_path / 'scores'
  publish(root, [PART, '_SUCCESS'], partition='dt=1')
  left = {'dt=1/.DS_Store': b'Finder', 'dt=1/_rejected/.DS_Store': b'Finder',
          'dt=1/.ipynb_checkpoints/x-checkpoint.md': b'Jupyter',
          'dt=1/.gitkeep': b''}
  for path, content in left.items():
    write(root, path, content)
  publish(root, [PART, '_SUCCESS'], partition='dt=1')
  assert {path: (root / path).read_bytes() for path in left} == left
  assert os.listdir(tmp_path) == ['scores']


def test_a_location_that_cannot_be_written_is_refused_leaving_nothing(
    tmp_path):
  class ReadOnly(filesystems.BeamFiles):
    def write(self, path, data):
      raise OSError(errno.EROFS, 'Read-only file system')

  output = outputs.claim(ReadOnly(), str(tmp_path / 'scores'), layout=LAYOUT)
  with pytest.raises(outputs.OutputError,
                     match='cannot write to .*Read-only file system'):
    with output:
      pass
  assert os.listdir(tmp_path) == []


def add_to_staging(monkeypatch, files):
  """Makes the job find ``files`` (name -> Arrow table) in its staging folder
  once its pipeline has run, as a runner's leftovers would be."""
  pop_tally = records.pop_tally

  def add_then_pop(staging):
    for name, table in files.items():
      os.makedirs(os.path.dirname(os.path.join(staging, name)), exist_ok=True)
      pq.write_table(table, os.path.join(staging, name))
    return pop_tally(staging)
  monkeypatch.setattr(records, 'pop_tally', add_then_pop)


def test_publishing_drops_leftovers_and_checks_the_row_count(
    trained, tmp_path, monkeypatch):
  model_dir, _, _ = trained
  corpus = tmp_path / 'corpus.jsonl'
  write_jsonl(corpus, corpus_rows(40, 10))
  output_dir = tmp_path / 'scores'
  three_rows = pa.table({scored.ID: ['a', 'b', 'c']})
  add_to_staging(monkeypatch, {'beam-temp-part-0a1b/part.parquet': three_rows})
  score.run(score_args(corpus, model_dir, output_dir, '--partition=dt=1'))
  partition = output_dir / 'dt=1'
  assert sorted(os.listdir(partition)) == sorted(
      [outputs.SUCCESS_MARKER, scored.MANIFEST_FILE, scored.REPORT_FILE,
       *read_partition(partition)[1]])
  assert len(pd.read_parquet(partition)) == 40
  before = sorted(os.listdir(partition))

  add_to_staging(monkeypatch, {'part-99999-of-99999.parquet': three_rows})
  with pytest.raises(cli.JobError, match='43 rows.*40 scored'):
    score.run(score_args(corpus, model_dir, output_dir, '--partition=dt=1'))
  assert sorted(os.listdir(partition)) == before
  assert len(pd.read_parquet(partition)) == 40
  assert sorted(os.listdir(tmp_path)) == ['corpus.jsonl', 'scores']
