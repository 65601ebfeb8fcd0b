"""The scoring job: Parquet out, the model step, partitions, bad input, faults."""
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

from apache_beam.io.filesystems import FileSystems
import duckdb
import hypothesis
from hypothesis import strategies as st
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import cli
from serving import drift
from serving import length_groups
import outputs
from outputs import partitions
from pipeline import filesystems
from pipeline import readers
from pipeline import records
from pipeline import score
from pipeline.scoring import inference
from pipeline.scoring import kept_fields
from schemas import rejected
from schemas import scored
from schemas import serving
from tests import s3
from tests.conftest import assert_float32_close
from tests.conftest import dead_letters
from tests.conftest import float32_approx
from tests.conftest import main_in_process
from tests.conftest import POISON
from tests.conftest import PoisonedHandler
from tests.conftest import REPO
from tests.conftest import run_module
from tests.conftest import start_scoring
from tests.conftest import synthetic_reviews
from tests.conftest import tiny_export
from tests.conftest import wait_for
from tests.conftest import write_jsonl
from serving import exports
from trainer import predict

MAX_TEXT_BYTES = 2000


def corpus_rows(count, seed):
  rows = synthetic_reviews(count, seed)
  for index, row in enumerate(rows):
    row['stars'] = index % 5
    del row['label']
  return rows


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


def score_args(corpus, model_dir, output_dir, *extra):
  """The job's flags; ``extra`` may set its own --batch_size (a flag is
  given once)."""
  batch = [] if any(flag.startswith('--batch_size') for flag in extra) else [
      '--batch_size=32']
  return [f'--input={corpus}', f'--model_dir={model_dir}',
          f'--output_dir={output_dir}', f'--max_text_bytes={MAX_TEXT_BYTES}',
          *batch, *extra]


def read_partition(folder):
  files = sorted(f for f in os.listdir(folder) if f.endswith('.parquet'))
  return pa.concat_tables([pq.read_table(os.path.join(folder, f))
                           for f in files]), files


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


def test_export_carries_the_test_split_reference(trained):
  _, metadata = exports.load(str(trained[0]))
  reference = metadata.reference
  assert reference['documents'] == 200  # the test split
  assert sorted(reference['label_shares']) == ['neg', 'pos']
  assert sum(reference['label_shares'].values()) == pytest.approx(1.0)
  histogram = reference['confidence_histogram']
  assert histogram['edges'] == list(drift.CONFIDENCE_EDGES)
  assert sum(histogram['shares']) == pytest.approx(1.0)


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
  manifest = score.run(score_args(second, model_dir, output_dir,
                                  '--partition=dt=1'))
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


def test_length_grouped_model_gives_the_signatures_outputs(trained):
  signature, metadata = exports.load(str(trained[0]))
  assert length_groups.supports(signature)
  # Cuts at 4, 5, ..., 20 and max_len 24, and calls of 3 rows on two
  # threads: the tests' documents fall into all of them, and most runs need
  # padding rows.
  grouped = length_groups.LengthGroupedModel(
      signature, metadata.label_names, call_rows=3, shortest=4, threads=2)
  texts = [r['text'] for r in synthetic_reviews(30, 12)] + [
      'great ' * 60,  # longer than max_len
      '', ' <br /><br /> ', 'superb', 'dull film']  # empty after HTML tags
  texts = [' '.join(t.split()[:n]) for n, t in enumerate(texts[:20])] + texts
  for batch in (texts, texts[-6:-5], texts[:1], texts[-3:-2]):
    encoded = [t.encode() for t in batch]
    ours, plain = grouped(text=encoded), signature(text=encoded)
    assert ours[serving.LABEL].tolist() == plain[serving.LABEL].numpy().tolist()
    assert_float32_close(ours[serving.PROBABILITIES],
                         plain[serving.PROBABILITIES].numpy())
    assert_float32_close(ours[serving.CONFIDENCE],
                         plain[serving.CONFIDENCE].numpy())


def test_bucket_lengths():
  assert length_groups.bucket_lengths(200) == [
      64, 80, 96, 112, 128, 160, 192, 200]
  assert length_groups.bucket_lengths(200, shortest=32)[:5] == [
      32, 40, 48, 56, 64]
  assert length_groups.bucket_lengths(1024)[-6:] == [
      448, 512, 640, 768, 896, 1024]
  assert length_groups.bucket_lengths(24, shortest=4) == [
      4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24]
  assert length_groups.bucket_lengths(16) == [16]


def test_an_export_without_the_token_id_signatures_is_served_as_it_is(
    tmp_path):
  folder = tiny_export(tmp_path / 'export', {'label_names': ['neg', 'pos']})
  model, _ = length_groups.load(str(folder))
  assert isinstance(model, length_groups.SignatureModel)
  assert model([b'any'] * 40)[serving.LABEL].tolist() == [b'pos'] * 40


def test_a_failing_batch_is_bisected_to_the_failing_document(
    trained, tmp_path, monkeypatch):
  model_dir, _, _ = trained
  rows = corpus_rows(32, 11)
  rows[13]['text'] += f' {POISON}'
  corpus = tmp_path / 'corpus.jsonl'
  write_jsonl(corpus, rows)
  monkeypatch.setattr(inference, 'RawTextModelHandler', PoisonedHandler)
  # Four batches of 8, the poisoned one neither first nor last.
  manifest = score.run(score_args(corpus, model_dir, tmp_path / 'scores',
                                  '--batch_size=8'))
  assert manifest['counts'] == {
      'read': 32, 'scored': 31, 'rejected': 1,
      'rejected_by_reason': {rejected.INFERENCE_FAILED: 1},
      'duplicate_ids': 0, 'duplicate_rows': 0, 'ids_replaced': 0}
  assert dead_letters(tmp_path / 'scores') == [{
      rejected.ID: rows[13]['id'], rejected.SOURCE: str(corpus),
      rejected.REASON: rejected.INFERENCE_FAILED,
      rejected.SNIPPET: rows[13]['text']}]
  table, _ = read_partition(tmp_path / 'scores')
  assert sorted(table.column(scored.ID).to_pylist()) == sorted(
      row['id'] for i, row in enumerate(rows) if i != 13)


def test_duplicate_ids_are_counted_and_logged(trained, tmp_path, caplog):
  model_dir, _, _ = trained
  rows = corpus_rows(20, 12)
  for index in (1, 2, 3):
    rows[index]['id'] = 'twice-a'
  rows[4]['id'] = rows[5]['id'] = 'twice-b'
  corpus = tmp_path / 'corpus.jsonl'
  write_jsonl(corpus, rows)
  with caplog.at_level(logging.WARNING):
    manifest = score.run(score_args(corpus, model_dir, tmp_path / 'scores'))
  # Two ids seen more than once, in three records beyond their first.
  assert manifest['counts']['duplicate_ids'] == 2
  assert manifest['counts']['duplicate_rows'] == 3
  assert manifest['counts']['scored'] == 20
  assert any('2 duplicate ids' in record.getMessage()
             for record in caplog.records
             if record.levelno == logging.WARNING)


def test_job_level_faults(trained, tmp_path):
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
  process = run_module('pipeline.score', *faults['no exported model'])
  assert process.returncode == 2
  errors = [l for l in process.stderr.splitlines() if l.startswith('error:')]
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


def test_partition_names_are_checked():
  assert partitions.checked('dt=2026-11-21/') == 'dt=2026-11-21'
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
              'dt=1/DT=2', 'dt=_x', 'dt=.x', 'd t=1', 'dt=1,2'):
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


def test_kept_field_types_come_from_the_input(tmp_path):
  jsonl = tmp_path / 'rows.jsonl'
  jsonl.write_text('{"text": "a", "n": 1, "x": 1.5, "tag": "t"}\n'
                   '{"text": "b", "n": 2, "x": 2, "tag": null}\n')
  config = readers.ReadConfig(format='jsonl', keep_fields=('n', 'x', 'tag'))
  assert kept_fields.schema(readers.resolve_input(str(jsonl), 'jsonl'), config) == pa.schema(
      [('n', pa.int64()), ('x', pa.float64()), ('tag', pa.string())])
  parquet = tmp_path / 'rows.parquet'
  pq.write_table(pa.table({'text': ['a'], 'day': pa.array(
      [1], pa.date32())}), parquet)
  config = readers.ReadConfig(format='parquet', keep_fields=('day',))
  assert kept_fields.schema(readers.resolve_input(str(parquet), 'parquet'),
                            config) == pa.schema(
      [('day', pa.date32())])
  assert kept_fields.misfit({'n': 3}, [('n', pa.int64())]) is None
  assert 'does not fit int64' in kept_fields.misfit({'n': 'three'},
                                                    [('n', pa.int64())])
  with pytest.raises(readers.ReaderError, match='no field'):
    kept_fields.schema(readers.resolve_input(str(parquet), 'parquet'),
                       readers.ReadConfig(format='parquet',
                                          keep_fields=('missing',)))


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
