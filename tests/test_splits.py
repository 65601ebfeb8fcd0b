"""Splits: each record to train, validation, test or the dead letters, by
the split its data names, else by a stable hash."""
import apache_beam as beam
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
import pytest

from pipeline.preprocessing import splits as split_lib
from schemas import raw
from schemas import rejected
from tests.conftest import beam_pipeline


def test_hash_split_carves_three_disjoint_stable_splits():
  texts = [f'review number {i}' for i in range(4000)]
  splits = [split_lib.hash_split(t, 0.2, 0.1) for t in texts]
  shares = {split: splits.count(split) / len(texts) for split in raw.SPLITS}
  # Validation takes 0.1 of what test leaves: 0.08 of all.
  assert shares[raw.TEST] == pytest.approx(0.2, abs=0.025)
  assert shares[raw.VALIDATION] == pytest.approx(0.08, abs=0.015)
  assert splits == [split_lib.hash_split(t, 0.2, 0.1) for t in texts]
  # Disjoint ranges of one hash: growing a split only takes from train,
  # never moves a record between validation and test.
  for text, split in zip(texts, splits):
    if split == raw.TEST:
      assert split_lib.hash_split(text, 0.2, 0.5) == raw.TEST
    if split == raw.VALIDATION:
      assert split_lib.hash_split(text, 0.2, 0.5) == raw.VALIDATION
  # Copies of a text, up to case and spacing, share their split.
  for text in texts[:200]:
    assert split_lib.hash_split(f'  {text.upper()} ', 0.2, 0.1) == (
        split_lib.hash_split(text.replace(' ', '\t'), 0.2, 0.1))


@pytest.mark.parametrize('named, expected', [
    ('validation', raw.VALIDATION), ('Valid', raw.VALIDATION),
    ('dev', raw.VALIDATION), ('test', raw.TEST), ('EVAL ', raw.TEST),
    ('holdout', None),
])
def test_split_field_values_name_our_splits(named, expected):
  assert split_lib.assign_split('some text', named, 0.2, 0.5) == expected


def test_train_records_of_the_data_give_validation_its_share():
  texts = [f'review number {i}' for i in range(2000)]
  splits = [split_lib.assign_split(t, 'train', 0.2, 0.1) for t in texts]
  # The test fraction does not apply where the data names the splits.
  assert set(splits) == {raw.TRAIN, raw.VALIDATION}
  assert splits.count(raw.VALIDATION) / len(texts) == pytest.approx(
      0.1, abs=0.02)
  assert splits == [split_lib.hash_split(t, 0.0, 0.1) for t in texts]
  assert {split_lib.assign_split(t, 'Training', 0.2, 0.0)
          for t in texts} == {raw.TRAIN}


def test_validate_and_split_routes_records_in_a_pipeline():
  records = [
      {raw.ID: '1', raw.SOURCE: 's', raw.TEXT: 'fine', raw.LABEL: 'a',
       raw.SPLIT: 'validation'},
      {raw.ID: '2', raw.SOURCE: 's', raw.TEXT: 'also fine', raw.LABEL: 'b',
       raw.SPLIT: 'TRAIN'},
      {raw.ID: '3', raw.SOURCE: 's', raw.TEXT: '   ', raw.LABEL: 'a',
       raw.SPLIT: 'train'},
      {raw.ID: '4', raw.SOURCE: 's', raw.REASON: rejected.MALFORMED_RECORD,
       raw.SNIPPET: '{oops'},
      {raw.ID: '5', raw.SOURCE: 's', raw.TEXT: 'tested', raw.LABEL: 'b',
       raw.SPLIT: 'eval'},
  ]
  with beam_pipeline() as pipeline:
    routed = (pipeline | beam.Create(records) | beam.ParDo(
        split_lib.ValidateAndSplit(split_lib.Routing(
            100, 0.2, 0.0, split_required=True)))
              .with_outputs('rejected', 'stats', *raw.SPLITS))
    assert_that(routed[raw.TRAIN] | 'TrainIds' >> beam.Map(lambda r: r[raw.ID]),
                equal_to(['2']), label='train')
    assert_that(routed[raw.VALIDATION]
                | 'ValidationIds' >> beam.Map(lambda r: r[raw.ID]),
                equal_to(['1']), label='validation')
    assert_that(routed[raw.TEST] | 'TestIds' >> beam.Map(lambda r: r[raw.ID]),
                equal_to(['5']), label='test')
    assert_that(routed['rejected'], equal_to([
        {'id': '3', 'source': 's', 'reason': rejected.EMPTY_TEXT,
         'snippet': '   '},
        {'id': '4', 'source': 's', 'reason': rejected.MALFORMED_RECORD,
         'snippet': '{oops'}]), label='rejected')
