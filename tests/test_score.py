"""The scoring job end to end: Parquet out, drift, reruns, kills, faults."""
import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

from apache_beam.io.filesystems import FileSystems
import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import cli
import outputs
from pipeline import filesystems
from pipeline import jobs
from pipeline import score
from schemas import rejected
from schemas import scored
from serving import drift
from serving import exports
from tests import s3
from tests.conftest import assert_float32_close
from tests.conftest import corpus_rows
from tests.conftest import dead_letters
from tests.conftest import float32_approx
from tests.conftest import main_in_process
from tests.conftest import MAX_TEXT_BYTES
from tests.conftest import read_partition
from tests.conftest import REPO
from tests.conftest import score_args
from tests.conftest import start_scoring
from tests.conftest import synthetic_reviews
from tests.conftest import wait_for
from tests.conftest import write_jsonl
from trainer import predict


BAD_LINES = (
    json.dumps({'id': 'empty', 'text': ''}).encode(),
    json.dumps({'id': 'blank', 'text': ' \n\t '}).encode(),
    b'{"id": "broken", "text": ',
    b'{"id": "latin1", "text": "caf\xe9"}',
    json.dumps({'id': 'giant', 'text': 'word ' * MAX_TEXT_BYTES}).encode(),
    json.dumps({'id': 'stars-as-text', 'text': 'fine film',
                'stars': 'five'}).encode(),
)
BAD_REASONS = {
    rejected.EMPTY_TEXT: 2, rejected.MALFORMED_RECORD: 1,
    rejected.UNDECODABLE_TEXT: 1, rejected.TEXT_TOO_LONG: 1,
    rejected.WRONG_TYPE: 1,
}


@pytest.fixture(scope='module')
def scored_run(trained, tmp_path_factory):
  model_dir, _, _ = trained
  folder = tmp_path_factory.mktemp('score')
  corpus = folder / 'corpus.jsonl'
  rows = corpus_rows(150, 3)
  write_jsonl(corpus, rows + list(BAD_LINES))
  output_dir = folder / 'scores'
  manifest = score.run(score_args(corpus, model_dir, output_dir,
                                  '--partition=dt=2026-11-21',
                                  '--keep_fields=stars'))
  return rows, corpus, output_dir, manifest


def test_counts_reconcile_and_bad_rows_are_dead_letters(scored_run):
  rows, _, output_dir, manifest = scored_run
  counts = manifest['counts']
  assert counts['read'] == len(rows) + len(BAD_LINES)
  assert counts['scored'] == len(rows)
  assert counts['rejected_by_reason'] == BAD_REASONS
  assert counts['read'] == counts['scored'] + counts['rejected']
  partition = output_dir / 'dt=2026-11-21'
  dead = dead_letters(partition)
  assert sorted(d[rejected.REASON] for d in dead) == sorted(
      reason for reason, n in BAD_REASONS.items() for _ in range(n))
  assert all(d[rejected.SOURCE].endswith('corpus.jsonl') for d in dead)
  assert {'empty', 'blank', 'giant', 'stars-as-text'} <= {
      d[rejected.ID] for d in dead}


def test_parquet_rows_match_the_schema_and_trainer_predict(scored_run,
                                                            trained):
  rows, _, output_dir, manifest = scored_run
  partition = output_dir / 'dt=2026-11-21'
  table, files = read_partition(partition)
  assert files == manifest['files']
  label_names = manifest['label_names']
  assert table.schema.remove_metadata() == scored.arrow_schema(
      label_names, pa.schema([('stars', pa.int64())]))
  assert table.num_rows == len(rows)
  assert sorted(table.column(scored.ID).to_pylist()) == sorted(
      r['id'] for r in rows)
  assert pq.ParquetFile(partition / files[0]).metadata.row_group(
      0).column(0).compression == 'ZSTD'

  columns = scored.probability_columns(label_names)
  probabilities = np.stack([table.column(c).to_numpy() for c in columns], 1)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
  assert_float32_close(table.column(scored.CONFIDENCE).to_numpy(),
                       probabilities.max(axis=1))
  assert set(table.column(scored.MODEL_VERSION).to_pylist()) == {
      manifest['model_version']}

  signature, metadata = exports.load(str(trained[0]))
  expected = {r['id']: p for r, p in zip(rows, predict.predict(
      signature, metadata.label_names, [r['text'] for r in rows]))}
  stars = {r['id']: r['stars'] for r in rows}
  for row in table.to_pylist():
    want = expected[row[scored.ID]]
    assert row[scored.LABEL] == want['label']
    for name, column in zip(label_names, columns):
      assert row[column] == float32_approx(want['probabilities'][name])
    assert row['stars'] == stars[row[scored.ID]]


def test_finished_partition_has_marker_manifest_and_duckdb_reads_it(
    scored_run):
  _, corpus, output_dir, manifest = scored_run
  partition = output_dir / 'dt=2026-11-21'
  assert (partition / outputs.SUCCESS_MARKER).exists()
  assert manifest == filesystems.read_json(
      str(partition / scored.MANIFEST_FILE))
  assert manifest['input'] == str(corpus)
  assert manifest['started_at'] <= manifest['finished_at']
  # Batches of 32 documents.
  assert manifest['inference']['batches'] >= -(-150 // 32)
  assert not os.path.exists(outputs.staging_root(str(output_dir)))
  # The query docs/operations.md gives.
  by_label = duckdb.sql(f"""
      SELECT dt, label, count(*) AS documents
      FROM read_parquet('{output_dir}/dt=*/*.parquet', hive_partitioning=true)
      GROUP BY ALL ORDER BY label""").fetchall()
  assert sum(n for _, _, n in by_label) == manifest['counts']['scored']
  assert {str(dt) for dt, _, _ in by_label} == {'2026-11-21'}


def test_dataset_readers_see_only_the_scored_rows(scored_run):
  rows, _, output_dir, _ = scored_run
  partition = output_dir / 'dt=2026-11-21'
  ids = sorted(r['id'] for r in rows)
  # The sidecars (_manifest.json, _SUCCESS, _rejected/) are skipped by name,
  # with no reader option.
  for folder in (output_dir, partition):
    assert sorted(pd.read_parquet(folder)[scored.ID]) == ids
  table = ds.dataset(output_dir, partitioning='hive').to_table()
  assert sorted(table.column(scored.ID).to_pylist()) == ids
  assert sorted(r[0] for r in duckdb.sql(
      f"SELECT id FROM read_parquet('{output_dir}/*/*.parquet')").fetchall()
               ) == ids


def test_partition_drift_in_the_manifest_and_its_report(scored_run):
  rows, _, output_dir, manifest = scored_run
  report = manifest['drift']
  assert report['partition']['documents'] == len(rows)
  assert sum(report['partition']['label_shares'].values()) == pytest.approx(
      1.0)
  assert report['reference']['documents'] == 200
  # The same kind of reviews as the test split, half of each label.
  assert report['psi']['labels'] < drift.PSI_ALERT
  # Ten confidence bins need a reference of more than 200 documents.
  assert report['judged'] == {'labels': True, 'confidence': False}
  assert report['not_judged']['confidence'].endswith(
      'the reference is too small to judge any partition')
  assert not report['alert']
  image = output_dir / 'dt=2026-11-21' / scored.REPORT_FILE
  assert image.read_bytes().startswith(b'\x89PNG')


def test_a_shifted_partition_raises_the_drift_alert(trained, tmp_path,
                                                    caplog):
  model_dir, _, _ = trained
  corpus = tmp_path / 'positive.jsonl'
  write_jsonl(corpus, [row for row in synthetic_reviews(120, 14)
                        if row['label'] == 'pos'])
  with caplog.at_level(logging.WARNING):
    manifest = score.run(score_args(corpus, model_dir, tmp_path / 'scores'))
  assert manifest['drift']['psi']['labels'] > drift.PSI_ALERT
  assert manifest['drift']['alert']
  assert any('drifted' in record.getMessage() for record in caplog.records
             if record.levelno == logging.WARNING)


def test_rerun_replaces_the_partition_whole(trained, tmp_path):
  model_dir, _, _ = trained
  first, second = tmp_path / 'first.jsonl', tmp_path / 'second.jsonl'
  write_jsonl(first, corpus_rows(80, 4))
  write_jsonl(second, corpus_rows(30, 5))
  output_dir = tmp_path / 'scores'
  score.run(score_args(first, model_dir, output_dir, '--partition=dt=1'))
  score.run(score_args(first, model_dir, output_dir, '--partition=dt=2'))
  # Slashes around it name the same folder, and the manifest names it so.
  manifest = score.run(score_args(second, model_dir, output_dir,
                                  '--partition=/dt=1/'))
  assert manifest['partition'] == 'dt=1'
  table, files = read_partition(output_dir / 'dt=1')
  assert files == manifest['files']
  assert table.num_rows == 30
  assert sorted(table.column(scored.ID).to_pylist()) == sorted(
      r['id'] for r in corpus_rows(30, 5))
  assert read_partition(output_dir / 'dt=2')[0].num_rows == 80
  assert sorted(os.listdir(output_dir)) == ['dt=1', 'dt=2']


def pipeline_is_writing(staging_root):
  """Whether a run's staging folder under ``staging_root`` holds a folder:
  the sinks' temporary folders are the first thing the running pipeline
  writes there, while StagedOutput.create only ever writes probe files."""
  runs = list(staging_root.iterdir()) if staging_root.is_dir() else []
  return any(entry.is_dir() for run in runs for entry in run.iterdir())


def test_killed_run_leaves_the_previous_partition_untouched(trained,
                                                             tmp_path):
  model_dir, _, _ = trained
  small, large = tmp_path / 'small.jsonl', tmp_path / 'large.jsonl'
  write_jsonl(small, corpus_rows(40, 6))
  # Enough documents to keep the pipeline busy for seconds after its sinks
  # start, so the kill lands while it runs.
  write_jsonl(large, corpus_rows(20000, 7))
  output_dir = tmp_path / 'scores'
  score.run(score_args(small, model_dir, output_dir, '--partition=dt=1'))
  partition = output_dir / 'dt=1'
  before = {name: (partition / name).read_bytes()
            for name in os.listdir(partition) if name != rejected.DIR}

  process = subprocess.Popen(
      [sys.executable, '-m', 'pipeline.score', *score_args(
          large, model_dir, output_dir, '--partition=dt=1')],
      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
      start_new_session=True)
  staging_root = pathlib.Path(outputs.staging_root(str(output_dir)))
  deadline = time.monotonic() + 300
  while not pipeline_is_writing(staging_root):
    assert process.poll() is None, 'the run ended before it wrote anything'
    assert time.monotonic() < deadline, 'the pipeline never started writing'
    time.sleep(0.05)
  os.killpg(process.pid, signal.SIGKILL)
  # Killed by us, not finished on its own before the signal.
  assert process.wait() == -signal.SIGKILL

  after = {name: (partition / name).read_bytes()
           for name in os.listdir(partition) if name != rejected.DIR}
  assert after == before
  # The killed run's files stay in staging, where no reader looks.
  assert pipeline_is_writing(staging_root)
  visible = duckdb.sql(f"""SELECT count(*) FROM
      read_parquet('{output_dir}/*/*.parquet')""").fetchall()[0][0]
  assert visible == 40
  # The next run is not disturbed by the leftovers.
  manifest = score.run(score_args(small, model_dir, output_dir,
                                  '--partition=dt=1'))
  assert manifest['counts']['scored'] == 40


def test_multi_process_direct_runner_scores_the_same(scored_run, trained,
                                                     tmp_path):
  rows, corpus, output_dir, _ = scored_run
  model_dir, _, _ = trained
  manifest = score.run(score_args(
      corpus, model_dir, tmp_path / 'scores', '--keep_fields=stars',
      '--runner=DirectRunner', '--direct_running_mode=multi_processing',
      '--direct_num_workers=2'))
  assert manifest['counts']['scored'] == len(rows)
  assert manifest['counts']['rejected_by_reason'] == BAD_REASONS
  probabilities = scored.probability_columns(manifest['label_names'])
  columns = [scored.ID, scored.LABEL, *probabilities]
  ours = read_partition(tmp_path / 'scores')[0].select(columns).sort_by(
      scored.ID)
  in_memory = read_partition(output_dir / 'dt=2026-11-21')[0].select(
      columns).sort_by(scored.ID)
  assert ours.select([scored.ID, scored.LABEL]).equals(
      in_memory.select([scored.ID, scored.LABEL]))
  # Batched otherwise, documents are cut to other lengths: the same sums
  # in another order.
  for column in probabilities:
    assert_float32_close(ours.column(column).to_numpy(),
                         in_memory.column(column).to_numpy())


def test_a_local_run_loads_the_export_once_and_no_longer_lends_it(
    trained, tmp_path, monkeypatch):
  """The default runner's worker runs in the job's process: it scores
  with the export the preflight loaded and checked, and the job lends it
  only while it runs, failed or not."""
  model_dir, export_dir, _ = trained
  loaded = []
  real_load = tf.saved_model.load

  def counted_load(path, *args, **kwargs):
    loaded.append(path)
    return real_load(path, *args, **kwargs)
  monkeypatch.setattr(tf.saved_model, 'load', counted_load)
  corpus = write_jsonl(tmp_path / 'corpus.jsonl', corpus_rows(20, 5))
  manifest = score.run(score_args(corpus, model_dir, tmp_path / 'scores'))
  assert manifest['counts']['scored'] == 20
  assert loaded == [export_dir]
  exports.load(str(model_dir))
  assert loaded == [export_dir] * 2

  def failed(*_):
    raise RuntimeError('the runner failed')
  monkeypatch.setattr(jobs, 'run_pipeline', failed)
  with pytest.raises(RuntimeError, match='the runner failed'):
    score.run(score_args(corpus, model_dir, tmp_path / 'failed'))
  exports.load(str(model_dir))
  assert loaded == [export_dir] * 4


@pytest.mark.parametrize('flags, here', [
    ([], True), (['--runner=DirectRunner'], True),
    (['--runner=DirectRunner', '--direct_running_mode=multi_threading'], True),
    (['--runner=DirectRunner', '--direct_running_mode=multi_processing'],
     False),
    (['--runner=FlinkRunner'], False), (['--runner=SparkRunner'], False),
    (['--runner=PortableRunner'], False), (['--runner=DataflowRunner'], False),
])
def test_the_export_is_lent_only_where_workers_run_in_the_jobs_process(
    flags, here):
  assert jobs.workers_in_this_process(flags) == here


def test_job_level_faults(trained, tmp_path, monkeypatch, capsys):
  model_dir, _, _ = trained
  corpus = tmp_path / 'corpus.jsonl'
  write_jsonl(corpus, corpus_rows(10, 9))
  (tmp_path / 'notes.txt').write_text('plain text\n')
  (tmp_path / 'in').mkdir()
  write_jsonl(tmp_path / 'in' / 'corpus.jsonl', corpus_rows(10, 9))
  blocker = tmp_path / 'a-file'
  blocker.write_text('')
  output_dir = tmp_path / 'scores'
  faults = {
      'no exported model': score_args(corpus, tmp_path / 'nowhere',
                                      output_dir),
      'no input file matches': score_args(tmp_path / '*.csv', model_dir,
                                          output_dir),
      'a-file is a file, where --output_dir needs a folder': score_args(
          corpus, model_dir, blocker / 'scores'),
      'bad --partition': score_args(corpus, model_dir, output_dir,
                                    '--partition=../up'),
      'needs named fields': score_args(tmp_path / 'notes.txt', model_dir,
                                       output_dir, '--keep_fields=x'),
      "takes the name of the output column 'id'": score_args(
          corpus, model_dir, output_dir, '--keep_fields=id'),
      "takes the name of the output column 'label'": score_args(
          corpus, model_dir, output_dir, '--keep_fields=stars:Label'),
      "'probability_pos'.*use --keep_fields=stars:input_Probability_Pos": (
          score_args(corpus, model_dir, output_dir,
                     '--keep_fields=stars:Probability_Pos')),
      "takes the name of the output column 'dt'": score_args(
          corpus, model_dir, output_dir, '--keep_fields=stars:DT',
          '--partition=dt=2026-11-21'),
      "two kept fields named 'stars'": score_args(
          corpus, model_dir, output_dir, '--keep_fields=stars,id:Stars'),
      # Its dead letters would be read back by every rerun.
      'is inside the input': score_args(tmp_path / '**' / '*.jsonl',
                                        model_dir, output_dir),


      'use --keep_fields=label:true_label': score_args(
          corpus, model_dir, output_dir, '--keep_fields=label'),
      'use --keep_fields=stars:input_confidence': score_args(
          corpus, model_dir, output_dir, '--keep_fields=stars:confidence'),
      'bad --keep_fields item': score_args(
          corpus, model_dir, output_dir, '--keep_fields=stars:'),
      'two kept fields named': score_args(
          corpus, model_dir, output_dir, '--keep_fields=stars:x,id:x'),
  }
  for message, args in faults.items():
    with pytest.raises(cli.JobError, match=message):
      score.run(args)
  assert not output_dir.exists()
  status, stderr = main_in_process(monkeypatch, capsys, score.run,
                                   *faults['no exported model'])
  assert status == 2
  errors = [l for l in stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and 'no exported model' in errors[0]


def test_true_label_kept_beside_the_prediction(trained, tmp_path):
  """A labelled corpus scored with its label kept as another column: what a
  user needs to measure the model on new data."""
  model_dir, _, _ = trained
  rows = synthetic_reviews(60, 10)
  corpus = tmp_path / 'labelled.jsonl'
  write_jsonl(corpus, rows)
  manifest = score.run(score_args(corpus, model_dir, tmp_path / 'scores',
                                  '--keep_fields=label:true_label,split'))
  table, _ = read_partition(tmp_path / 'scores')
  assert table.schema.remove_metadata() == scored.arrow_schema(
      manifest['label_names'],
      pa.schema([('true_label', pa.string()), ('split', pa.string())]))
  by_id = {row[scored.ID]: row for row in table.to_pylist()}
  assert {i: row['true_label'] for i, row in by_id.items()} == {
      row['id']: row['label'] for row in rows}
  assert {row['split'] for row in by_id.values()} == {'test'}
  agree = sum(row['true_label'] == row[scored.LABEL]
              for row in by_id.values())
  assert agree >= 0.8 * len(rows)


def test_kept_values_are_published_as_read_or_are_dead_letters(trained,
                                                               tmp_path):
  """Kept fields typed by the first 1,000 records: a later value its column
  would change (a fraction in an int64 column, an object member its struct
  has no field for) is a wrong_type dead letter that says why; the others
  are published as the input holds them."""
  model_dir, _, _ = trained
  typed_by = [{'id': f'r{index}', 'text': f'a fine film, number {index}',
               'score': index % 7 - 3, 'meta': {'a': index}}
              for index in range(1000)]
  later = [{'id': 'fraction', 'text': 'a fine film', 'score': -2.5,
            'meta': {'a': 1}},
           {'id': 'whole', 'text': 'a fine film', 'score': 4.0,
            'meta': {'a': 1}},
           {'id': 'new-member', 'text': 'a fine film', 'score': 1,
            'meta': {'a': 1, 'b': 2}},
           {'id': 'null-member', 'text': 'a fine film', 'score': 1,
            'meta': {'a': 1, 'b': None}},
           {'id': 'absent', 'text': 'a fine film'}]
  corpus = write_jsonl(tmp_path / 'kept.jsonl', typed_by + later)
  manifest = score.run(score_args(corpus, model_dir, tmp_path / 'scores',
                                  '--keep_fields=score,meta'))
  counts = manifest['counts']
  assert counts['rejected_by_reason'] == {rejected.WRONG_TYPE: 2}
  assert counts['read'] == counts['scored'] + counts['rejected'] == 1005
  letters = {letter[rejected.ID]: letter
             for letter in dead_letters(tmp_path / 'scores')}
  assert letters.keys() == {'fraction', 'new-member'}
  assert all(letter[rejected.SOURCE] == str(corpus)
             for letter in letters.values())
  assert letters['fraction'][rejected.SNIPPET] == (
      '--keep_fields score=-2.5: would be stored as -2 in its int64 column')
  assert letters['new-member'][rejected.SNIPPET].startswith(
      "--keep_fields meta={'a': 1, 'b': 2}: would be stored as {'a': 1}")
  table, _ = read_partition(tmp_path / 'scores')
  assert table.schema.field('score').type == pa.int64()
  published = {row[scored.ID]: row for row in table.to_pylist()}
  given = {row['id']: row for row in typed_by + later}
  assert published.keys() == given.keys() - letters.keys()
  for key, row in published.items():
    assert row['score'] == given[key].get('score')
    assert row['meta'] == ({'a': given[key]['meta']['a']}
                           if 'meta' in given[key] else None)


def test_sigterm_removes_the_staging_folder(trained, tmp_path):
  model_dir, _, _ = trained
  corpus = tmp_path / 'corpus.jsonl'
  write_jsonl(corpus, corpus_rows(60000, 12))
  output_dir = tmp_path / 'scores'
  staging_root = outputs.staging_root(str(output_dir))
  process = start_scoring(score_args(corpus, model_dir, output_dir,
                                     '--partition=dt=1'))
  wait_for(lambda: os.path.isdir(staging_root) and os.listdir(staging_root),
           process)
  process.send_signal(signal.SIGTERM)
  assert process.wait(timeout=120) == cli.EXIT_TERMINATED
  assert not os.path.exists(staging_root)
  assert not output_dir.exists()


def test_readers_of_the_output_folder_never_see_a_run_in_progress(trained,
                                                                   tmp_path):
  model_dir, _, _ = trained
  corpus = tmp_path / 'corpus.jsonl'
  write_jsonl(corpus, corpus_rows(3000, 13) + list(BAD_LINES))
  output_dir = tmp_path / 'scores'
  score.run(score_args(corpus, model_dir, output_dir, '--partition=dt=1'))
  published = re.compile(r'dt=1/(part-\d{5}-of-\d{5}\.parquet|_SUCCESS|'
                         r'_manifest\.json|_report\.png|'
                         r'_rejected/rejected-\d{5}-of-\d{5}\.jsonl)')
  staging_root = outputs.staging_root(str(output_dir))
  seen, staged = set(), []

  def look():
    """One recursive glob of the output folder, as a reader polls it."""
    seen.update(os.path.relpath(m.path, output_dir) for m in
                FileSystems.match([f'{output_dir}/**'])[0].metadata_list)
    staged.append(os.path.isdir(staging_root) and len(os.listdir(
        staging_root)))
    return process.poll() is not None
  process = start_scoring(score_args(corpus, model_dir, output_dir,
                                     '--partition=dt=1'))
  deadline = time.time() + 300
  while not look():
    assert time.time() < deadline, 'timed out'
    time.sleep(0.05)
  assert process.returncode == 0, process.stderr.read()
  assert any(staged), 'the run was never seen staging'
  assert [p for p in seen if not published.fullmatch(p)] == []
  assert all(published.fullmatch(os.path.relpath(m.path, output_dir))
             for m in FileSystems.match([f'{output_dir}/**'])[0].metadata_list)


def test_scoring_into_an_object_store(trained, tmp_path):
  model_dir, _, _ = trained
  with s3.s3_server() as s3_options:
    output_dir = f's3://{s3.BUCKET}/scores'
    partition = f'{output_dir}/dt=1'
    for count in (50, 30):
      corpus = tmp_path / f'corpus-{count}.jsonl'
      write_jsonl(corpus, corpus_rows(count, 14))
      manifest = score.run(score_args(corpus, model_dir, output_dir,
                                      '--partition=dt=1', *s3_options))
      names = sorted(m.path[len(partition) + 1:] for m in FileSystems.match(
          [f'{partition}/**'])[0].metadata_list)
      assert names == sorted([outputs.SUCCESS_MARKER, scored.MANIFEST_FILE,
                              scored.REPORT_FILE, *manifest['files']])
      rows = 0
      for name in manifest['files']:
        with FileSystems.open(f'{partition}/{name}') as handle:
          rows += pq.read_metadata(handle).num_rows
      assert rows == manifest['counts']['scored'] == count
    assert [m.path for m in FileSystems.match(
        [f's3://{s3.BUCKET}/**'])[0].metadata_list if
            not m.path.startswith(partition + '/')] == []
