"""The scoring job's model step: RunInference with RawTextModelHandler."""
import concurrent.futures
import os
import subprocess
import sys
import threading

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import RunInference
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
import pytest

from pipeline import score
from pipeline.scoring import inference
from pipeline.scoring import report
from schemas import raw
from schemas import rejected
from schemas import scored
from serving import exports
from serving import length_groups
from tests.conftest import BrokenHandler
from tests.conftest import corpus_rows
from tests.conftest import dead_letters
from tests.conftest import POISON
from tests.conftest import PoisonedHandler
from tests.conftest import read_partition
from tests.conftest import REPO
from tests.conftest import beam_pipeline
from tests.conftest import score_args
from tests.conftest import synthetic_reviews
from tests.conftest import write_jsonl
from trainer import predict

def records(texts):
  return [{raw.ID: str(i), raw.TEXT: text} for i, text in enumerate(texts)]


def batches(texts, batch_size):
  """The documents of ``texts`` in batches, as the job's Validate makes
  them."""
  documents = records(texts)
  return [documents[start:start + batch_size]
          for start in range(0, len(documents), batch_size)]


def answers(pipeline, handler, texts, batch_size):
  """(text, label or the failure) of each document, as RunInference gave
  them: a PredictionResult a batch."""
  def answer(result):
    batch, answered = result.example, result.inference
    for index in answered.failed:
      yield batch[index][raw.TEXT], 'failed'
    yield from zip((record[raw.TEXT] for record in answered.scored(batch)),
                   (label.decode('utf-8') for label in answered.labels))
  return (pipeline
          | beam.Create(batches(texts, batch_size))
          | RunInference(handler)
          | beam.FlatMap(answer))


def test_run_inference_scores_as_the_signature_and_reports_its_metrics(
    trained):
  model_dir, export_dir, _ = trained
  texts = [r['text'] for r in synthetic_reviews(20, 8)]
  signature, metadata = exports.load(str(model_dir))
  expected = [(t, p['label']) for t, p in zip(
      texts, predict.predict(signature, metadata.label_names, texts))]
  pipeline = beam_pipeline()
  assert_that(answers(pipeline, inference.RawTextModelHandler(
      str(export_dir)), texts, batch_size=8), equal_to(expected))
  result = pipeline.run()
  result.wait_until_finish()
  metrics = report.inference_metrics(result)
  assert metrics['reported'] == 'committed'
  assert metrics['documents'] == 20
  assert metrics['batches'] == 3  # batches of at most 8
  assert metrics['model_loads'] >= 1
  assert metrics.get('failed_batches', 0) == 0
  sizes = result.metrics().query(MetricsFilter().with_name(
      'inference_request_batch_size'))['distributions']
  assert sizes and max(d.committed.max for d in sizes) <= 8


def test_a_poison_document_is_isolated_and_alone_fails(trained):
  _, export_dir, _ = trained
  texts = [r['text'] for r in synthetic_reviews(20, 9)]
  texts[13] += f' {POISON}'
  with beam_pipeline() as pipeline:
    labels = answers(pipeline, PoisonedHandler(str(export_dir)), texts, 8)
    assert_that(labels | beam.Filter(lambda pair: pair[1] == 'failed'),
                equal_to([(texts[13], 'failed')]), label='OnlyThePoison')
    assert_that(labels | beam.combiners.Count.Globally(), equal_to([20]),
                label='EveryDocument')


def test_a_model_that_fails_on_every_batch_stops_the_pipeline(trained):
  _, export_dir, _ = trained
  texts = [r['text'] for r in synthetic_reviews(64, 10)]
  with pytest.raises(Exception, match=inference.MODEL_FAILED):
    with beam_pipeline() as pipeline:
      answers(pipeline, BrokenHandler(str(export_dir)), texts, 64)
  # Bisection stops after MAX_ISOLATED + 1 documents failed alone: each
  # costs at most a call a level of the halving (64 documents: 7 levels).
  assert BrokenHandler.loaded.calls <= (inference.MAX_ISOLATED + 1) * 7


class CountingPool(concurrent.futures.ThreadPoolExecutor):
  """A thread pool that keeps count of the threads all open pools may run."""
  lock = threading.Lock()
  open_threads = 0
  most = 0

  def __init__(self, max_workers, **kwargs):
    super().__init__(max_workers, **kwargs)
    self._size = max_workers
    with self.lock:
      CountingPool.open_threads += max_workers
      CountingPool.most = max(CountingPool.most, CountingPool.open_threads)

  def shutdown(self, *args, **kwargs):
    super().shutdown(*args, **kwargs)
    with self.lock:
      CountingPool.open_threads -= self._size


def test_model_threads_live_for_their_batch_and_are_bounded(trained,
                                                           monkeypatch):
  _, export_dir, _ = trained
  handler = inference.RawTextModelHandler(str(export_dir), threads=3)
  model = handler.load_model()
  monkeypatch.setattr(concurrent.futures, 'ThreadPoolExecutor', CountingPool)
  batch = records([r['text'] for r in synthetic_reviews(64, 11)])

  def score_repeatedly():
    for _ in range(5):
      (result,) = handler.run_inference(batch, model)
      assert len(result.inference.labels) == len(batch)

  callers = [threading.Thread(target=score_repeatedly) for _ in range(3)]
  for caller in callers:
    caller.start()
  for caller in callers:
    caller.join()
  # Three callers share one model, and never run more than its three
  # threads; each batch's threads end with it.
  assert 0 < CountingPool.most <= 3
  assert CountingPool.open_threads == 0
  assert not [t for t in threading.enumerate()
              if t.name.startswith('model-call')]


def test_workers_run_tensorflows_ops_on_the_models_own_threads(monkeypatch):
  # A fresh process, as a worker is: TensorFlow's runtime not yet started.
  probe = ('import tensorflow as tf\n'
           'from pipeline.scoring import inference\n'
           'inference.RawTextModelHandler("unused").set_environment_vars()\n'
           'print(tf.config.threading.get_intra_op_parallelism_threads())\n')
  env = {name: value for name, value in os.environ.items()
         if name != 'TF_NUM_INTRAOP_THREADS'}
  result = subprocess.run([sys.executable, '-c', probe], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300,
                          check=True)
  assert result.stdout.split() == ['1']
  # A user's own setting wins: TensorFlow is left to read it.
  monkeypatch.setenv('TF_NUM_INTRAOP_THREADS', '2')
  assert not length_groups.run_ops_on_callers_threads()


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
