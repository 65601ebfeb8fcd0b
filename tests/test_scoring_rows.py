"""The scoring job's steps around the model: Validate's batches and
ToArrow's tables, a Beam element a batch."""
import datetime

import apache_beam as beam
from apache_beam.ml.inference.base import PredictionResult
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
import numpy as np
import pyarrow as pa

from pipeline import records
from pipeline.scoring import inference
from pipeline.scoring import rows
from schemas import raw
from schemas import rejected
from schemas import scored
from serving import drift

SOURCE = 'in/part-0.jsonl'
LABELS = ['neg', 'pos']


def good(index):
  return {raw.ID: f'doc-{index}', raw.TEXT: f'a fine film, number {index}',
          raw.SOURCE: SOURCE}


def bad_records():
  """Records Validate rejects, and the dead letter each must become."""
  malformed = {raw.ID: 'line-9', raw.TEXT: '', raw.SOURCE: SOURCE,
               raw.REASON: rejected.MALFORMED_RECORD, raw.SNIPPET: '{"id": '}
  bad = [malformed,
         {raw.ID: 'blank', raw.TEXT: ' <br /> ', raw.SOURCE: SOURCE},
         {raw.ID: 'giant', raw.TEXT: 'x' * 101, raw.SOURCE: SOURCE}]
  letters = [
      {rejected.ID: 'line-9', rejected.SOURCE: SOURCE,
       rejected.REASON: rejected.MALFORMED_RECORD,
       rejected.SNIPPET: '{"id": '},
      {rejected.ID: 'blank', rejected.SOURCE: SOURCE,
       rejected.REASON: rejected.EMPTY_TEXT, rejected.SNIPPET: ' <br /> '},
      {rejected.ID: 'giant', rejected.SOURCE: SOURCE,
       rejected.REASON: rejected.TEXT_TOO_LONG, rejected.SNIPPET: 'x' * 101}]
  return bad, letters


def chunks(read, size):
  """Records in chunks of ``size``, as the reader hands them on."""
  return [read[start:start + size] for start in range(0, len(read), size)]


def test_validate_batches_every_good_record_once_and_rejects_the_rest():
  documents = [good(i) for i in range(23)]
  documents[3][raw.ID_REPLACED] = True  # its id is its file:line
  bad, letters = bad_records()
  # The bad records among the good, so that they fall inside batches.
  read = documents[:7] + bad[:2] + documents[7:16] + bad[2:] + documents[16:]
  with TestPipeline() as pipeline:
    checked = (pipeline
               | beam.Create(chunks(read, 4))
               | beam.ParDo(rows.Validate(100, (), 5)).with_outputs(
                   records.REJECTED, records.STATS, main='batches'))
    assert_that(checked.batches | 'Sizes' >> beam.Map(len)
                | beam.Filter(lambda size: not 0 < size <= 5),
                equal_to([]), label='AtMostTheBatchSize')
    assert_that(checked.batches | beam.FlatMap(lambda batch: batch),
                equal_to(documents), label='EveryGoodRecordOnce')
    assert_that(checked[records.REJECTED], equal_to(letters),
                label='DeadLetters')
    assert_that(checked[records.STATS]
                | beam.CombineGlobally(records.SumCounts()),
                equal_to([{(records.READ,): 26, (records.IDS_REPLACED,): 1,
                           (records.REJECTED_KIND,
                            rejected.MALFORMED_RECORD): 1,
                           (records.REJECTED_KIND, rejected.EMPTY_TEXT): 1,
                           (records.REJECTED_KIND,
                            rejected.TEXT_TOO_LONG): 1}]),
                label='Counts')


def test_validate_fills_each_batch_before_the_bundles_end():
  documents = [good(i) for i in range(12)]
  with TestPipeline() as pipeline:
    sizes = (pipeline
             | beam.Create(chunks(documents, 3), reshuffle=False)
             | beam.ParDo(rows.Validate(100, (), 5))
             | beam.Map(len))
    # One bundle: full batches, then the rest.
    assert_that(sizes, equal_to([5, 5, 2]))


def answered(batch, failed=()):
  """A PredictionResult as RawTextModelHandler gives it: the documents at
  the indices ``failed`` failed alone, the others are answered 'pos' with
  a confidence that grows with the index."""
  scored_count = len(batch) - len(failed)
  confidences = np.linspace(0.5, 1.0, scored_count, dtype=np.float32)
  answers = inference.Answers(
      np.array([b'pos'] * scored_count, dtype=object), confidences,
      np.stack([1 - confidences, confidences], axis=1),
      datetime.datetime(2026, 11, 24, tzinfo=datetime.timezone.utc),
      {index: 'ValueError: poisoned' for index in failed})
  return PredictionResult(batch, answers)


def to_arrow(rows_per_table):
  return rows.ToArrow(scored.arrow_schema(LABELS, pa.schema([])), LABELS,
                      7, (), drift.CONFIDENCE_EDGES, rows_per_table)


def test_to_arrow_writes_each_answered_document_and_rejects_the_failed():
  batches = [[good(i) for i in range(start, start + 3)]
             for start in range(0, 12, 3)]
  results = [answered(batches[0]), answered(batches[1], failed=(1,)),
             answered(batches[2], failed=(0, 2)), answered(batches[3])]
  failed = [batches[1][1], batches[2][0], batches[2][2]]
  with TestPipeline() as pipeline:
    converted = (pipeline
                 | beam.Create(results, reshuffle=False)
                 | beam.ParDo(to_arrow(4)).with_outputs(
                     records.REJECTED, records.STATS, main='tables'))
    # One bundle: tables of at least 4 rows (whole batches), the rest last.
    assert_that(converted.tables | beam.Map(lambda table: table.num_rows),
                equal_to([5, 4]), label='TableSizes')
    assert_that(converted.tables
                | beam.FlatMap(lambda table: table.to_pylist())
                | beam.Map(lambda row: (row[scored.ID], row[scored.LABEL],
                                        row[scored.MODEL_VERSION])),
                equal_to([(record[raw.ID], 'pos', 7)
                          for batch in batches for record in batch
                          if record not in failed]), label='Rows')
    assert_that(converted[records.REJECTED], equal_to([
        records.dead_letter(record, rejected.INFERENCE_FAILED)
        for record in failed]), label='DeadLetters')
    counts = (converted[records.STATS]
              | beam.CombineGlobally(records.SumCounts()))
    assert_that(counts | beam.Map(lambda c: (
        c[(records.WRITTEN,)], c[(records.LABEL, rows.SCORED, 'pos')],
        sum(v for k, v in c.items() if k[0] == records.BIN),
        c[(records.REJECTED_KIND, rejected.INFERENCE_FAILED)])),
                equal_to([(9, 9, 9, 3)]), label='Counts')


def test_to_arrow_columns_match_the_answers():
  batch = [good(i) for i in range(4)]
  result = answered(batch, failed=(2,))
  with TestPipeline() as pipeline:
    tables = (pipeline
              | beam.Create([result])
              | beam.ParDo(to_arrow(100)).with_outputs(
                  records.REJECTED, records.STATS, main='tables'))
    assert_that(tables.tables | beam.Map(lambda table: (
        table.column(scored.ID).to_pylist(),
        table.column(scored.CONFIDENCE).to_pylist(),
        table.column(scored.probability_columns(LABELS)[0]).to_pylist(),
        table.column(scored.SCORED_AT).to_pylist())), equal_to([(
            ['doc-0', 'doc-1', 'doc-3'],
            result.inference.confidences.tolist(),
            result.inference.probabilities[:, 0].tolist(),
            [result.inference.scored_at] * 3)]))
