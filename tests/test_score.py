"""The scoring job: Parquet out, RunInference, partitions, bad input, faults."""
import json
import logging
import os
import signal
import subprocess
import sys
import time

from apache_beam.ml.inference.base import RunInference
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
import apache_beam as beam
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline import drift
from pipeline import outputs
from pipeline import readers
from pipeline import score
from schemas import raw
from schemas import rejected
from schemas import scored
from schemas import serving
from tests.conftest import REPO
from tests.conftest import beam_pipeline
from tests.conftest import run_module
from tests.conftest import synthetic_reviews
from trainer import export
from trainer import predict

MAX_TEXT_BYTES = 2000


def write_corpus(path, rows, bad_lines=()):
  with open(path, 'wb') as handle:
    for row in rows:
      handle.write(json.dumps(row).encode('utf-8') + b'\n')
    for line in bad_lines:
      handle.write(line + b'\n')


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
  return [f'--input={corpus}', f'--model_dir={model_dir}',
          f'--output_dir={output_dir}', f'--max_text_bytes={MAX_TEXT_BYTES}',
          '--batch_size=32', *extra]


def read_partition(folder):
  files = sorted(f for f in os.listdir(folder) if f.endswith('.parquet'))
  return pa.concat_tables([pq.read_table(os.path.join(folder, f))
                           for f in files]), files


def dead_letters(folder):
  dead = []
  for name in os.listdir(folder / rejected.DIR):
    with open(folder / rejected.DIR / name, encoding='utf-8') as handle:
      dead.extend(json.loads(line) for line in handle)
  return dead


@pytest.fixture(scope='module')
def scored_run(trained, tmp_path_factory):
  model_dir, _, _ = trained
  folder = tmp_path_factory.mktemp('score')
  corpus = folder / 'corpus.jsonl'
  rows = corpus_rows(150, 3)
  write_corpus(corpus, rows, BAD_LINES)
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
  dead = dead_letters(output_dir / 'dt=2026-11-21')
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
  np.testing.assert_allclose(table.column(scored.CONFIDENCE).to_numpy(),
                             probabilities.max(axis=1), atol=1e-6)
  assert set(table.column(scored.MODEL_VERSION).to_pylist()) == {
      manifest['model_version']}

  signature, metadata = export.load(str(trained[0]))
  expected = {r['id']: p for r, p in zip(rows, predict.predict(
      signature, metadata['label_names'], [r['text'] for r in rows]))}
  stars = {r['id']: r['stars'] for r in rows}
  for row in table.to_pylist():
    want = expected[row[scored.ID]]
    assert row[scored.LABEL] == want['label']
    for name, column in zip(label_names, columns):
      assert row[column] == pytest.approx(want['probabilities'][name],
                                          abs=1e-5)
    assert row['stars'] == stars[row[scored.ID]]


def test_finished_partition_has_marker_manifest_and_duckdb_reads_it(
    scored_run):
  _, corpus, output_dir, manifest = scored_run
  partition = output_dir / 'dt=2026-11-21'
  assert (partition / outputs.SUCCESS_MARKER).exists()
  assert manifest == outputs.read_json(str(partition / scored.MANIFEST_FILE))
  assert manifest['input'] == str(corpus)
  assert manifest['started_at'] <= manifest['finished_at']
  assert manifest['inference']['batches'] >= 150 // 32
  assert not (output_dir / outputs.STAGING_DIR).exists()
  # The README's query.
  by_label = duckdb.sql(f"""
      SELECT dt, label, count(*) AS documents
      FROM read_parquet('{output_dir}/dt=*/*.parquet', hive_partitioning=true)
      GROUP BY ALL ORDER BY label""").fetchall()
  assert sum(n for _, _, n in by_label) == manifest['counts']['scored']
  assert {str(dt) for dt, _, _ in by_label} == {'2026-11-21'}


def test_export_carries_the_eval_split_reference(trained):
  _, metadata = export.load(str(trained[0]))
  reference = metadata[drift.REFERENCE]
  assert reference['documents'] == 200  # the eval split
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
  # The same kind of reviews as the eval split, half of each label.
  assert report['psi']['labels'] < drift.PSI_ALERT
  assert report['alert'] == (report['psi']['confidence'] > drift.PSI_ALERT)
  image = output_dir / 'dt=2026-11-21' / score.REPORT_IMAGE
  assert image.read_bytes().startswith(b'\x89PNG')


def test_a_shifted_partition_raises_the_drift_alert(trained, tmp_path,
                                                    caplog):
  model_dir, _, _ = trained
  corpus = tmp_path / 'positive.jsonl'
  write_corpus(corpus, [row for row in synthetic_reviews(120, 14)
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
  write_corpus(first, corpus_rows(80, 4))
  write_corpus(second, corpus_rows(30, 5))
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


def test_killed_run_leaves_the_previous_partition_untouched(trained,
                                                             tmp_path):
  model_dir, _, _ = trained
  small, large = tmp_path / 'small.jsonl', tmp_path / 'large.jsonl'
  write_corpus(small, corpus_rows(40, 6))
  write_corpus(large, corpus_rows(60000, 7))
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
  staging_root = output_dir / outputs.STAGING_DIR
  deadline = time.time() + 120
  while not (staging_root.exists() and os.listdir(staging_root)):
    assert process.poll() is None and time.time() < deadline
    time.sleep(0.2)
  time.sleep(2)  # into the pipeline
  assert process.poll() is None, 'the run finished before it could be killed'
  os.killpg(process.pid, signal.SIGKILL)
  process.wait()

  after = {name: (partition / name).read_bytes()
           for name in os.listdir(partition) if name != rejected.DIR}
  assert after == before
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
  columns = [scored.ID, scored.LABEL, *scored.probability_columns(
      manifest['label_names'])]
  ours = read_partition(tmp_path / 'scores')[0].select(columns).sort_by(
      scored.ID)
  in_memory = read_partition(output_dir / 'dt=2026-11-21')[0].select(
      columns).sort_by(scored.ID)
  assert ours.equals(in_memory)


def test_model_handler_in_run_inference(trained):
  model_dir, export_dir, _ = trained
  texts = [r['text'] for r in synthetic_reviews(20, 8)]
  signature, metadata = export.load(str(model_dir))
  expected = [(t, p['label']) for t, p in zip(
      texts, predict.predict(signature, metadata['label_names'], texts))]
  with beam_pipeline() as pipeline:
    labels = (pipeline
              | beam.Create([{raw.ID: str(i), raw.TEXT: t}
                             for i, t in enumerate(texts)])
              | RunInference(score.RawTextModelHandler(str(export_dir), 8))
              | beam.Map(lambda result: (result.example[raw.TEXT],
                                         result.inference['label'])))
    assert_that(labels, equal_to(expected))


POISON = 'poison-pill'


class PoisonedModelHandler(score.RawTextModelHandler):
  """The real model, made to raise on any batch that holds a document with
  the poison in its text: a document the model cannot take."""

  def load_model(self):
    signature = super().load_model()

    def model(**inputs):
      if any(POISON.encode() in text for text in inputs[serving.TEXT]):
        raise ValueError('poisoned batch')
      return signature(**inputs)
    return model


def test_a_failing_batch_is_bisected_to_the_failing_document(
    trained, tmp_path, monkeypatch):
  model_dir, _, _ = trained
  rows = corpus_rows(32, 11)
  rows[13]['text'] += f' {POISON}'
  corpus = tmp_path / 'corpus.jsonl'
  write_corpus(corpus, rows)
  monkeypatch.setattr(score, 'RawTextModelHandler', PoisonedModelHandler)
  manifest = score.run(score_args(corpus, model_dir, tmp_path / 'scores'))
  assert manifest['counts']['scored'] == 31
  assert manifest['counts']['rejected_by_reason'] == {
      rejected.INFERENCE_FAILED: 1}
  assert [d[rejected.ID] for d in dead_letters(tmp_path / 'scores')] == [
      rows[13]['id']]
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
  write_corpus(corpus, rows)
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
  write_corpus(corpus, corpus_rows(10, 9))
  (tmp_path / 'notes.txt').write_text('plain text\n')
  blocker = tmp_path / 'a-file'
  blocker.write_text('')
  output_dir = tmp_path / 'scores'
  faults = {
      'no exported model': score_args(corpus, tmp_path / 'nowhere',
                                      output_dir),
      'no input file matches': score_args(tmp_path / '*.csv', model_dir,
                                          output_dir),
      'cannot write': score_args(corpus, model_dir, blocker / 'scores'),
      'bad --partition': score_args(corpus, model_dir, output_dir,
                                    '--partition=../up'),
      'needs named fields': score_args(tmp_path / 'notes.txt', model_dir,
                                       output_dir, '--keep_fields=x'),
      'has the name of an output column': score_args(
          corpus, model_dir, output_dir, '--keep_fields=id'),
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
  write_corpus(corpus, rows)
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


def test_partition_names_are_checked():
  assert score.check_partition('dt=2026-11-21/') == 'dt=2026-11-21'
  assert score.check_partition('dt=2026-11-21/hour=03') == (
      'dt=2026-11-21/hour=03')
  for bad in ('', '..', 'dt=1/../x', '.hidden', '_tmp', 'dt=*', 'a//b'):
    with pytest.raises(ValueError):
      score.check_partition(bad)


def test_kept_field_types_come_from_the_input(tmp_path):
  jsonl = tmp_path / 'rows.jsonl'
  jsonl.write_text('{"text": "a", "n": 1, "x": 1.5, "tag": "t"}\n'
                   '{"text": "b", "n": 2, "x": 2, "tag": null}\n')
  config = readers.ReadConfig(format='jsonl', keep_fields=('n', 'x', 'tag'))
  assert readers.kept_fields_schema(str(jsonl), config) == pa.schema(
      [('n', pa.int64()), ('x', pa.float64()), ('tag', pa.string())])
  parquet = tmp_path / 'rows.parquet'
  pq.write_table(pa.table({'text': ['a'], 'day': pa.array(
      [1], pa.date32())}), parquet)
  config = readers.ReadConfig(format='parquet', keep_fields=('day',))
  assert readers.kept_fields_schema(str(parquet), config) == pa.schema(
      [('day', pa.date32())])
  assert readers.conforms(3, pa.int64())
  assert not readers.conforms('three', pa.int64())
  with pytest.raises(readers.ReaderError, match='no field'):
    readers.kept_fields_schema(str(parquet), readers.ReadConfig(
        format='parquet', keep_fields=('missing',)))
