"""Record checks and the counts every job reconciles before publishing."""
import logging
import re
import unicodedata

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
import hypothesis
from hypothesis import strategies as st
import pytest

import cli
from pipeline import records
from pipeline import score
from schemas import raw
from schemas import rejected

from tests.conftest import corpus_rows
from tests.conftest import score_args
from tests.conftest import write_jsonl


def record(text, label='pos'):
  return {raw.ID: 'x', raw.SOURCE: 'file', raw.TEXT: text, raw.LABEL: label}


@pytest.mark.parametrize('text', [
    '', ' \n\t ', '<br />', '<br /><br />  <p>', '\u200b\u200b',
    '\ufeff<br />\u200d', '\u00ad'])
def test_text_with_nothing_visible_is_empty(text):
  assert records.check_record(record(text), 1000, True) == rejected.EMPTY_TEXT


@pytest.mark.parametrize('text', ['a', '<br />ok', '\u200bhi', '!', '1 < 2'])
def test_text_with_something_visible_is_kept(text):
  assert records.check_record(record(text), 1000, True) is None


def test_length_is_checked_in_characters_and_in_utf8_bytes():
  assert records.check_record(record('é' * 6), 10,
                              True) == rejected.TEXT_TOO_LONG
  assert records.check_record(record('e' * 10), 10, True) is None


def test_a_label_is_required_only_where_asked():
  assert records.check_record(record('fine', label=' '), 100,
                              True) == rejected.MISSING_LABEL
  assert records.check_record(record('fine', label=None), 100, False) is None


def test_tally_from_counts_and_reconcile():
  tally = records.Tally.from_counts([
      ['read', 10], ['written', 'train', 6], ['written', 'test', 2],
      ['rejected', 'empty_text', 1], ['rejected', 'bad', 1],
      ['label', 'train', 'pos', 4], ['label', 'train', 'neg', 2],
      ['length', 7, 3]])
  assert (tally.read, tally.total_written, tally.rejected) == (10, 8, 2)
  assert tally.rejected_by_reason == {'bad': 1, 'empty_text': 1}
  assert tally.labels == {'train': {'neg': 2, 'pos': 4}}
  assert tally.lengths == {7: 3}
  tally.reconcile()


def test_a_tally_that_does_not_add_up_is_a_job_error():
  tally = records.Tally.from_counts([['read', 3], ['written', 2]])
  assert tally.written == {'': 2}
  with pytest.raises(cli.JobError, match='do not reconcile'):
    tally.reconcile()


def test_count_duplicate_ids_counts_repeated_ids_and_their_extra_rows():
  ids = ['a', 'b', 'a', 'c', 'a', 'b', 'é', 'é'] + [f'd{i}' for i in range(500)]
  with TestPipeline() as pipeline:
    counts = (pipeline
              # Chunks as the reader makes them, a repeated id in another.
              | beam.Create([[{raw.ID: i} for i in ids[start:start + 3]]
                             for start in range(0, len(ids), 3)],
                            reshuffle=False)
              | records.CountDuplicateIds()
              | beam.CombineGlobally(records.SumCounts()))
    # a twice beyond its first, b and é once each.
    assert_that(counts, equal_to([{(records.DUPLICATE, 'ids'): 3,
                                   (records.DUPLICATE, 'rows'): 4}]))


def visible_the_slow_way(text):
  return any(not char.isspace() and unicodedata.category(char) != 'Cf'
             for char in re.sub(raw.HTML_TAG, ' ', text))


@hypothesis.settings(max_examples=300, deadline=None, database=None)
@hypothesis.given(st.text(alphabet=st.sampled_from(
    [' ', '\t', '\n', '\u200b', '\ufeff', '<', '>', '/', 'b', 'r', 'é',
     '3', '\u00a0'])))
def test_visible_text_is_what_is_left_without_tags(text):
  assert records.has_visible_text(text) == visible_the_slow_way(text)


def test_unreadable_and_corrupt_files_make_an_incomplete_input():
  tally = records.Tally.from_counts([
      ['read', 5], ['written', 2], ['rejected', rejected.CORRUPT_FILE, 1],
      ['rejected', rejected.UNREADABLE_FILE, 2], [records.IDS_REPLACED, 3]])
  assert tally.ids_replaced == 3
  with pytest.raises(cli.IncompleteInput,
                     match='3 input file.*1 corrupt_file, 2 unreadable_file'):
    tally.check_complete(allow_corrupt_files=False)
  tally.check_complete(allow_corrupt_files=True)


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
