"""Partitions: the names --partition takes, and what a partition flag may
not replace or publish beside (other layouts, other columns)."""
import os
import shutil

import duckdb
import hypothesis
from hypothesis import strategies as st
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import cli
from outputs import partitions
from pipeline import score
from tests.conftest import corpus_rows
from tests.conftest import main_in_process
from tests.conftest import score_args
from tests.conftest import write_jsonl


def test_partition_names_are_checked():
  assert partitions.checked('dt=2026-11-21/') == 'dt=2026-11-21'
  longest = 'dt=' + 'x' * (partitions.MAX_CHARACTERS - 3)
  assert partitions.checked(longest) == longest
  assert partitions.checked('dt=2026-11-21/hour=03') == (
      'dt=2026-11-21/hour=03')
  for bad in ('', '..', 'dt=1/../x', '.hidden', '_tmp', 'dt=*', 'a//b', ' ',
              '\n', 'dt=1 ', 'dt=1\n', 'dt= 1', 'dt=1/\thour=2', '_rejected',
              '_manifest.json', '_SUCCESS', 'part-00000-of-00001.parquet',
              'dt=1/part-0',
              # What readers misread: a folder without a key (a partition
              # inside a published one, or a date cut into folders), a value
              # holding '=' or a '%' escape, Hive's null, an empty value, a
              # key given twice.
              'dt=2026-11-24/rerun', 'dt=2026/11/25', 'dt=2026-11-25=retry',
              'dt=__HIVE_DEFAULT_PARTITION__', 'dt=', '=1', 'dt=a%2Fb',
              'dt=1/DT=2', 'dt=_x', 'dt=.x', 'd t=1', 'dt=1,2',
              # Too long for its staging folder's name.
              'dt=' + 'x' * (partitions.MAX_CHARACTERS - 2)):
    with pytest.raises(ValueError):
      partitions.checked(bad)


@hypothesis.settings(max_examples=300, derandomize=True, deadline=None)
@hypothesis.given(st.lists(st.tuples(
    st.one_of(st.text(min_size=1, max_size=8),
              st.from_regex(r'[A-Za-z][A-Za-z0-9_]{0,7}', fullmatch=True)),
    st.one_of(st.text(min_size=1, max_size=12),
              st.from_regex(r'[A-Za-z0-9][A-Za-z0-9._+-]{0,11}',
                            fullmatch=True))), min_size=1, max_size=3))
def test_a_partition_accepted_is_read_back_as_given(tmp_path_factory, pairs):
  """Whatever keys and values: a partition the job accepts is read back by
  pyarrow's hive partitioning with every key and value as given."""
  partition = '/'.join(f'{key}={value}' for key, value in pairs)
  try:
    checked = partitions.checked(partition)
  except ValueError:
    return
  root = tmp_path_factory.mktemp('hive')
  (root / checked).mkdir(parents=True)
  # A column no key can be named (keys start with a letter).
  pq.write_table(pa.table({'_n': [1]}), root / checked / 'part.parquet')
  read = ds.dataset(str(root), format='parquet', partitioning=ds.partitioning(
      flavor='hive', schema=pa.schema([(key, pa.string())
                                       for key, _ in pairs]))).to_table()
  assert {key: read.column(key)[0].as_py() for key, _ in pairs} == dict(pairs)


def test_a_partition_flag_never_replaces_what_it_should_not(trained,
                                                            tmp_path):
  model_dir, _, _ = trained
  corpus = tmp_path / 'corpus.jsonl'
  write_jsonl(corpus, corpus_rows(20, 11))
  output_dir = tmp_path / 'scores'
  for partition in ('dt=4/hour=00', 'dt=5/hour=01', 'dt=5/hour=02'):
    score.run(score_args(corpus, model_dir, output_dir,
                         f'--partition={partition}'))
  (output_dir / 'dt=6' / 'hour=00').mkdir(parents=True)
  (output_dir / 'dt=6' / 'hour=00' / 'notes.txt').write_text('not ours')

  def tree():
    return sorted(os.path.relpath(os.path.join(folder, name), output_dir)
                  for folder, _, names in os.walk(output_dir)
                  for name in names)
  before = tree()
  for partition, message in (('', 'bad --partition'),
                             (' ', 'bad --partition'),
                             ('\n', 'bad --partition'),
                             # Daily beside hourly: DuckDB reads neither.
                             ('dt=5', 'would mix layouts'),
                             ('day=7/hour=00', 'would mix layouts'),
                             ('dt=6/hour=00', 'files this job does not write.*'
                              '--overwrite')):
    with pytest.raises(cli.JobError, match=message):
      score.run(score_args(corpus, model_dir, output_dir,
                           f'--partition={partition}'))
  # Nor does no --partition replace the partitions.
  with pytest.raises(cli.JobError, match='--overwrite'):
    score.run(score_args(corpus, model_dir, output_dir))
  assert tree() == before
  score.run(score_args(corpus, model_dir, output_dir,
                       '--partition=dt=6/hour=00', '--overwrite'))
  assert not (output_dir / 'dt=6' / 'hour=00' / 'notes.txt').exists()
  assert len(pd.read_parquet(output_dir / 'dt=6' / 'hour=00')) == 20
  # An output without partitions takes none beside it.
  score.run(score_args(corpus, model_dir, tmp_path / 'flat'))
  with pytest.raises(cli.JobError, match='without partitions'):
    score.run(score_args(corpus, model_dir, tmp_path / 'flat',
                         '--partition=dt=1'))


def _first_day(tmp_path, trained):
  """A root with partition dt=1 of ten reviews with a source field; the
  flags that scored it, bar the partition."""
  corpus = write_jsonl(tmp_path / 'in.jsonl', [
      {'id': str(i), 'text': 'a superb film', 'source': 'web'}
      for i in range(10)])
  root = tmp_path / 'scores'
  common = [f'--input={corpus}', f'--model_dir={trained[0]}',
            f'--output_dir={root}']
  score.run([*common, '--partition=dt=1'])
  return root, common


def test_a_partition_of_other_columns_needs_its_flag_and_readers_see_all(
    tmp_path, trained, monkeypatch, capsys):
  root, common = _first_day(tmp_path, trained)
  # A new column (a model with a third label does the same): readers of
  # the root would take one partition's columns for all.
  status, stderr = main_in_process(
      monkeypatch, capsys, score.run, *common, '--partition=dt=2',
      '--keep_fields=source')
  assert status == 2
  assert 'this run adds: source string' in stderr.splitlines()[-1]
  assert sorted(os.listdir(root)) == ['dt=1']
  score.run([*common, '--partition=dt=2', '--keep_fields=source',
             '--allow_schema_change'])
  # The reader options docs/operations.md gives see every column of every
  # day.
  files = sorted(root.glob('*/part-*.parquet'))
  schema = pa.unify_schemas([pq.read_schema(path) for path in files])
  table = ds.dataset(root, partitioning='hive', schema=schema).to_table()
  assert table.num_rows == 20
  assert table.column('source').null_count == 10
  counts = duckdb.sql(f"""
      SELECT dt, count(source) FROM read_parquet('{root}/*/*.parquet',
          hive_partitioning = true, union_by_name = true)
      GROUP BY dt ORDER BY dt""").fetchall()
  assert counts == [(1, 0), (2, 10)]


def test_a_partition_published_beside_this_one_meanwhile_is_checked_again(
    tmp_path, trained, monkeypatch):
  root, common = _first_day(tmp_path, trained)
  elsewhere = tmp_path / 'elsewhere'
  score.run([*common[:2], f'--output_dir={elsewhere}', '--partition=hour=1'])
  real_write = score.report.write_drift_report

  def another_run_publishes(*args):
    # Another run into the same root, launched at the same time, finishes
    # first: hourly partitions beside this run's daily one.
    shutil.copytree(elsewhere / 'hour=1', root / 'hour=1')
    return real_write(*args)

  monkeypatch.setattr(score.report, 'write_drift_report',
                      another_run_publishes)
  with pytest.raises(cli.JobError, match='would mix layouts.*nothing was '
                     'published'):
    score.run([*common, '--partition=dt=2'])
  assert sorted(os.listdir(root)) == ['dt=1', 'hour=1']
