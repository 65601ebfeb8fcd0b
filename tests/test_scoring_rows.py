"""The scoring job's steps around the model: Validate's batches and
ToArrow's tables, a Beam element a batch; kept fields published as read."""
import collections
import datetime
import fractions
import io
import math
import os
import tempfile

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.ml.inference.base import PredictionResult
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
from apache_beam.utils.windowed_value import WindowedValue
import hypothesis
from hypothesis import strategies as st
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import readers
from pipeline import records
from pipeline.scoring import inference
from pipeline.scoring import kept_fields
from pipeline.scoring import rows
from schemas import raw
from schemas import rejected
from schemas import scored
from serving import drift
from tests.conftest import write_jsonl

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


def run_bundle(dofn, elements):
  """``dofn`` over ``elements`` as one bundle, called as a runner calls it:
  its main outputs, and its tagged outputs by tag."""
  dofn.start_bundle()
  produced = [output for element in elements
              for output in dofn.process(element)]
  produced += list(dofn.finish_bundle())
  main, tagged = [], collections.defaultdict(list)
  for output in produced:
    value = output.value if isinstance(output, pvalue.TaggedOutput) else output
    value = value.value if isinstance(value, WindowedValue) else value
    if isinstance(output, pvalue.TaggedOutput):
      tagged[output.tag].append(value)
    else:
      main.append(value)
  return main, tagged


KEPT = ('v', 'w')


def score_kept(inputs, sampled):
  """``inputs`` (rows of a JSONL file) read, checked and made into Parquet
  rows by the job's own steps, with --keep_fields=v,w typed by the first
  ``sampled`` rows (the job's first 1,000): the rows read back from the
  Parquet file, the dead letters and the counts. None when the job would
  stop before it starts (a field with no value to type it by)."""
  with tempfile.TemporaryDirectory() as folder:
    path = write_jsonl(os.path.join(folder, 'in.jsonl'), inputs)
    config = readers.ReadConfig(format='jsonl', keep_fields=KEPT)
    matched = readers.resolve_input(path, 'jsonl')
    try:
      kept_schema = kept_fields.schema(matched, config, sampled)
    except readers.ReaderError:
      return None
    read = readers.sample(matched, config, len(inputs) + 1)
  kept_types = [(name, kept_schema.field(name).type) for name in KEPT]
  batches, checked = run_bundle(rows.Validate(1000, kept_types, 4), [read])
  schema = scored.arrow_schema(LABELS, kept_schema)
  tables, converted = run_bundle(rows.ToArrow(
      schema, LABELS, 7, tuple(zip(KEPT, KEPT)), drift.CONFIDENCE_EDGES, 4),
                                 map(answered, batches))
  published = []
  if tables:
    buffer = io.BytesIO()
    pq.write_table(pa.concat_tables(tables), buffer, compression='zstd')
    published = pq.read_table(buffer).to_pylist()
  counts = collections.Counter()
  for stats in checked[records.STATS] + converted[records.STATS]:
    counts.update(stats)
  return published, checked[records.REJECTED], counts


def same_json(value):
  """A kept value as JSON means it: numbers by their exact value (JSON has
  one kind of number), an object's null members as absent (Parquet cannot
  tell them apart); NaN and the infinities as themselves."""
  if value is None or isinstance(value, (bool, str)):
    return type(value).__name__, value
  if isinstance(value, (int, float)):
    return 'number', (fractions.Fraction(value) if math.isfinite(value)
                      else repr(value))
  if isinstance(value, list):
    return 'array', tuple(map(same_json, value))
  if isinstance(value, dict):
    return 'object', frozenset((key, same_json(member))
                               for key, member in value.items()
                               if member is not None)
  raise AssertionError(f'not a JSON value: {value!r}')


NUMBERS = st.integers() | st.floats()
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | NUMBERS | st.text(
        st.characters(blacklist_categories=('Cs',)), max_size=4),
    lambda inner: (st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from('abc'), inner, max_size=3)),
    max_leaves=6)
# A kept field's values down the records: anything, or values of one kind
# whose types drift (whole numbers, then fractions or beyond 64 bits;
# objects that gain members).
FIELD_VALUES = st.one_of(
    st.lists(JSON_VALUES, min_size=1, max_size=8),
    st.lists(NUMBERS | st.none(), min_size=1, max_size=8),
    st.lists(st.dictionaries(st.sampled_from('abc'), NUMBERS | st.none(),
                             max_size=3), min_size=1, max_size=8),
    st.lists(st.lists(NUMBERS, max_size=3), min_size=1, max_size=8))


@hypothesis.settings(max_examples=300, derandomize=True, database=None,
                     deadline=None)
@hypothesis.given(FIELD_VALUES, FIELD_VALUES, st.integers(1, 8))
@hypothesis.example([1, 2, -2.5], [{'a': 1}, {'a': 2}, {'a': 3, 'b': 4}], 2)
def test_kept_values_are_published_as_read_or_rejected_as_wrong_type(
    first, second, sampled):
  """Whatever values kept fields hold down the records, in the records that
  type them and after: each record is published with its kept values as
  the input holds them, or is a wrong_type dead letter saying why; the
  counts reconcile."""
  inputs = []
  for index in range(max(len(first), len(second))):
    row = {'id': f'doc-{index}', 'text': f'a fine film, number {index}'}
    row.update({name: values[index] for name, values in zip(
        KEPT, (first, second)) if index < len(values)})
    inputs.append(row)
  outcome = score_kept(inputs, sampled)
  if outcome is None:
    # Stopped before it starts: a field with no value, or none that a
    # Parquet column can hold.
    assert any(not present or (
        not any(parquet_holds([value]) for value in present) and
        not parquet_holds(present))
               for present in ([value for value in values[:sampled]
                                if value is not None]
                               for values in (first, second)))
    return
  published, letters, counts = outcome
  given = {row['id']: row for row in inputs}
  assert sorted([row[scored.ID] for row in published] +
                [letter[rejected.ID] for letter in letters]) == sorted(given)
  for row in published:
    for name in KEPT:
      assert same_json(row[name]) == same_json(given[row[scored.ID]].get(
          name)), (name, row[name], given[row[scored.ID]])
  for letter in letters:
    assert letter[rejected.REASON] == rejected.WRONG_TYPE
    assert letter[rejected.SOURCE].endswith('in.jsonl')
    assert letter[rejected.SNIPPET].startswith('--keep_fields ')
  # A record that keeps nothing has nothing that could fail to fit.
  assert {row[scored.ID] for row in published} >= {
      key for key, row in given.items()
      if all(row.get(name) is None for name in KEPT)}
  assert counts[(records.READ,)] == len(inputs) == (
      counts[(records.WRITTEN,)] + sum(
          count for key, count in counts.items()
          if key[0] == records.REJECTED_KIND))


def parquet_holds(values):
  """Whether pyarrow makes a column of ``values`` that Parquet can write."""
  try:
    pq.write_table(pa.table({'v': pa.array(values)}), io.BytesIO())
    return True
  except (pa.ArrowException, TypeError, ValueError, OverflowError):
    return False


@pytest.mark.parametrize('values, misfits', [
    # Whole numbers first: the column is int64, and a fraction does not fit.
    ([1, 2, -2.5, 3.0], {'doc-2': 'would be stored as -2 in its int64'}),
    # An object that gains a member its struct has no field for.
    ([{'a': 1}, {'a': 2}, {'a': 3, 'b': 4}],
     {'doc-2': "would be stored as {'a': 3}"}),
    ([1, 2, 2**64, 'three', True, None],
     {'doc-2': 'does not fit int64', 'doc-3': 'does not fit int64',
      'doc-4': 'does not fit int64'}),
    (['one', 'two', 3], {'doc-2': 'does not fit string'}),
    ([0.5, 1.5, 2**60 + 1, True], {'doc-2': 'does not fit double',
                                   'doc-3': 'would be stored as 1.0'}),
    ([[1, 2], [3], [4.5]], {'doc-2': 'would be stored as [4]'}),
])
def test_a_kept_value_its_column_would_change_is_a_dead_letter(values,
                                                               misfits):
  """Values after the two records that type the column."""
  published, letters, _ = score_kept([
      {'id': f'doc-{index}', 'text': 'a fine film', 'v': value, 'w': 1}
      for index, value in enumerate(values)], 2)
  assert {letter[rejected.ID]: letter[rejected.SNIPPET]
          for letter in letters}.keys() == misfits.keys()
  for letter in letters:
    assert misfits[letter[rejected.ID]] in letter[rejected.SNIPPET]
    assert letter[rejected.SNIPPET].startswith(
        f'--keep_fields v={values[int(letter[rejected.ID][4:])]!r}: ')
  assert [row['v'] for row in published] == [
      value for index, value in enumerate(values)
      if f'doc-{index}' not in misfits]
