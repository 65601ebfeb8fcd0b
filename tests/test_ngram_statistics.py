"""The n-gram statistics: counted by the preprocessing job on the runner
(the train split's n-grams in transformed.NGRAM_MIN_DOCUMENTS documents or
more, by class), read back by ``serving.ngrams`` as the trainer's
in-memory count of the train split (``trainer.ngrams.DocumentNgrams``)
gives them, at every minimum count the trainer tries."""
import json
import logging
import random
import shutil

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

import cli
from pipeline import preprocess
from pipeline.preprocessing import ngram_counts
from schemas import raw
from schemas import transformed
from serving import exports
from serving import ngrams as serving_ngrams
from tests.conftest import write_jsonl
from trainer import data as data_lib
from trainer import model as model_lib
from trainer import ngram_fit
from trainer import ngrams
from trainer import train

WORDS = [f'w{n}' for n in range(40)]
LABELS = ('a', 'b', 'c')


def corpus(count, seed):
  """Records of three classes over a small vocabulary, many longer than the
  max_len of 12 the job cuts them to, some of words outside the token
  vocabulary of 25 the job keeps."""
  rng = random.Random(seed)
  rows = []
  for i in range(count):
    label = rng.choice(LABELS)
    words = rng.choices(WORDS[:30] if label == 'a' else WORDS[10:],
                        k=rng.randint(1, 20))
    rows.append({'id': str(i), 'text': ' '.join(words), 'label': label})
  return rows


@pytest.fixture(scope='module')
def preprocessed(tmp_path_factory):
  """(output folder, stats) of the job on a small corpus."""
  folder = tmp_path_factory.mktemp('ngram-statistics')
  write_jsonl(folder / 'rows.jsonl', corpus(300, 0))
  output = folder / 'preprocessed'
  stats = preprocess.run([f'--input={folder}/rows.jsonl',
                          f'--output_dir={output}', '--max_len=12',
                          '--vocab_size=25', '--test_fraction=0.2'])
  return output, stats


def test_the_trainer_tries_only_counts_the_statistics_hold():
  assert min(ngram_fit.MIN_COUNTS) >= transformed.NGRAM_MIN_DOCUMENTS
  assert model_lib.ModelParams().ngram_order <= transformed.NGRAM_MAX_ORDER


@pytest.mark.parametrize('max_order', [1, 2, 3])
def test_the_statistics_are_the_trainers_count_of_the_train_split(
    preprocessed, max_order):
  output, stats = preprocessed
  classes = len(stats['labels']['names'])
  train = data_lib.of_rows(data_lib.PreprocessedData.load(str(output)),
                           (raw.TRAIN,), None, 37)
  assert any((token_ids == transformed.OOV_ID).numpy().any()
             for token_ids, _ in train)
  counted = ngrams.DocumentNgrams.fit(train, max_order)
  found = serving_ngrams.read_statistics(str(output), max_order, classes)
  if max_order > 1:  # every word of this corpus is in several documents
    # The statistics leave out n-grams the trainer sees in one document.
    assert len(counted.vocabulary(classes, min_count=1).keys) > len(
        found.keys)
  for min_count in (transformed.NGRAM_MIN_DOCUMENTS, *ngram_fit.MIN_COUNTS):
    expected = counted.vocabulary(classes, min_count=min_count)
    kept = found.counts.sum(axis=1) >= min_count
    np.testing.assert_array_equal(found.keys[kept], expected.keys)
    np.testing.assert_array_equal(found.counts[kept], expected.counts)


def _same_vocabulary(found, expected):
  np.testing.assert_array_equal(found.keys, expected.keys)
  np.testing.assert_array_equal(found.counts, expected.counts)
  np.testing.assert_allclose(found.ratios, expected.ratios, rtol=1e-6)


def test_a_folds_counts_from_the_statistics_are_its_documents_counts(
    preprocessed):
  output, _ = preprocessed
  data = data_lib.PreprocessedData.load(str(output))
  classes, order = len(data.label_names), model_lib.ModelParams().ngram_order
  statistics = ngram_fit.counted_ngrams(model_lib.ModelParams(), data, None)
  assert isinstance(statistics, ngrams.Vocabulary)  # read, not counted
  splits = (raw.TRAIN, raw.VALIDATION)
  documents = ngrams.DocumentNgrams.fit(
      data_lib.of_rows(data, splits, None, 37), order)
  fold_of = np.random.default_rng(0).integers(
      0, 3, data.num_examples(raw.TRAIN))
  compared = 0
  for fold in range(3):
    fitted, held_out = (np.flatnonzero(fold_of != fold),
                        np.flatnonzero(fold_of == fold))
    for min_count in ngram_fit.MIN_COUNTS:
      try:
        expected = documents.vocabulary(classes, fitted, min_count)
      except ValueError:
        with pytest.raises(ValueError, match='no n-gram is in'):
          ngram_fit.fold_vocabulary(statistics, data, order, fitted, held_out,
                                    min_count)
        continue
      _same_vocabulary(ngram_fit.fold_vocabulary(
          statistics, data, order, fitted, held_out, min_count), expected)
      compared += 1
  assert compared >= 6
  # A fit on train + validation: every document's counts, of the n-grams
  # the statistics hold (those in two train documents or more).
  everything = documents.vocabulary(classes, min_count=1)
  kept = np.isin(everything.keys, statistics.keys)
  assert (~kept).any()
  both = ngram_fit.with_validation(statistics, data, order)
  _same_vocabulary(both.vocabulary(classes, min_count=2),
                   ngrams.Vocabulary(everything.keys[kept],
                                     everything.counts[kept],
                                     everything.ratios[kept]).at_least(2))


def test_stats_json_counts_the_ngrams_kept_of_each_order(preprocessed):
  output, stats = preprocessed
  section = stats[transformed.NGRAMS_STATS]
  assert section['max_order'] == transformed.NGRAM_MAX_ORDER
  assert section['min_documents'] == transformed.NGRAM_MIN_DOCUMENTS
  classes = len(stats['labels']['names'])
  total = 0
  for order in range(1, transformed.NGRAM_MAX_ORDER + 1):
    total += section['kept_by_order'][str(order)]
    assert len(serving_ngrams.read_statistics(
        str(output), order, classes).keys) == total
  assert section['kept_by_order']['3'] > 0


def test_statistics_that_are_missing_or_not_whole_are_refused(
    preprocessed, tmp_path):
  output, stats = preprocessed
  classes = len(stats['labels']['names'])
  with pytest.raises(ValueError, match='up to 3 tokens, not of 4'):
    serving_ngrams.read_statistics(str(output), 4, classes)
  ragged = shutil.copytree(output, tmp_path / 'ragged')
  with tf.io.TFRecordWriter(
      str(ragged / f'{transformed.NGRAM_FILE_PREFIX}-ragged'
          f'{transformed.TFRECORD_SUFFIX}'), 'GZIP') as writer:
    writer.write(tf.train.Example(features=tf.train.Features(feature={
        name: tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        for name, values in ((transformed.NGRAM_FINGERPRINT, [5, 6]),
                             (transformed.NGRAM_ORDER, [1, 1]),
                             (transformed.NGRAM_LABEL_ID, [0]),
                             (transformed.NGRAM_DOCUMENTS, [2, 2]))
    })).SerializeToString())
  with pytest.raises(ValueError, match='differ in length'):
    serving_ngrams.read_statistics(str(ragged), 3, classes)
  cut = shutil.copytree(output, tmp_path / 'cut')
  (largest, *_) = sorted(cut.glob(transformed.ngram_file_pattern()),
                         key=lambda path: -path.stat().st_size)
  largest.unlink()
  with pytest.raises(ValueError, match='not whole'):
    serving_ngrams.read_statistics(str(cut), 3, classes)
  stats_file = cut / transformed.STATS_FILE
  older = json.loads(stats_file.read_text())
  del older[transformed.NGRAMS_STATS]
  stats_file.write_text(json.dumps(older))
  with pytest.raises(ValueError, match='holds no n-gram statistics'):
    serving_ngrams.read_statistics(str(cut), 3, classes)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3),
                                   st.integers(1, 4)), max_size=12),
                min_size=1, max_size=6),
       st.randoms(use_true_random=False))
def test_counts_add_up_however_the_batches_are_combined(batches, rng):
  """Batches of (n-gram, label, documents) rows, each batch as wide as its
  labels, added and merged in any grouping and order."""
  def counted(rows):
    if not rows:
      return ngram_counts.Counted(np.zeros(0, np.int64),
                                  np.zeros((0, 1), np.int32),
                                  np.zeros(0, np.int8))
    keys = np.array(sorted({key for key, _, _ in rows}), np.int64)
    documents = np.zeros((len(keys), max(label for _, label, _ in rows) + 1),
                         np.int32)
    for key, label, count in rows:
      documents[np.searchsorted(keys, key), label] += count
    return ngram_counts.Counted(keys, documents,
                                (keys % 3 + 1).astype(np.int8))
  combine = ngram_counts.SumCounted()
  accumulators = []
  for rows in batches:
    accumulator = combine.create_accumulator()
    for half in (rows[:len(rows) // 2], rows[len(rows) // 2:]):
      accumulator = combine.add_input(accumulator, counted(half))
    accumulators.append(combine.compact(accumulator) if rng.random() < 0.5
                        else accumulator)
  rng.shuffle(accumulators)
  result = combine.extract_output(combine.merge_accumulators(accumulators))
  expected = {}
  for key, label, documents in (row for rows in batches for row in rows):
    expected[(key, label)] = expected.get((key, label), 0) + documents
  found = {(key, label): documents
           for key, row in zip(result.keys.tolist(), result.documents.tolist())
           for label, documents in enumerate(row) if documents}
  assert found == expected
  assert result.keys.tolist() == sorted({key for key, _ in expected})
  assert (result.orders == result.keys % 3 + 1).all()


# The n-gram branch alone, by Keras epochs on the validation split's
# choice: the path that reads the statistics.
EPOCHS_PATH = ['--model=nbsvm', '--ngram_fit=epochs', '--folds=0',
               '--ngram_epochs=2', '--batch_size=16', '--seed=5']


def without_statistics(output, folder):
  """A copy of the preprocessing output ``output`` as a job that did not
  count n-grams wrote it."""
  older = shutil.copytree(output, folder)
  for path in older.glob(transformed.ngram_file_pattern()):
    path.unlink()
  stats_file = older / transformed.STATS_FILE
  stats = json.loads(stats_file.read_text())
  del stats[transformed.NGRAMS_STATS]
  stats_file.write_text(json.dumps(stats))
  return older


def test_the_trainer_reads_the_statistics_and_fits_as_if_it_counted(
    preprocessed, tmp_path, caplog):
  output, _ = preprocessed
  caplog.set_level(logging.INFO)
  read = train.run([f'--data_dir={output}', f'--model_dir={tmp_path / "a"}',
                    *EPOCHS_PATH])
  assert "n-gram counts: the preprocessing job's" in caplog.text
  caplog.clear()
  older = without_statistics(output, tmp_path / 'older')
  counted = train.run([f'--data_dir={older}', f'--model_dir={tmp_path / "b"}',
                       *EPOCHS_PATH])
  assert 'n-gram counts: counted here' in caplog.text
  choices = [exports.read_metadata(export_dir)['training']['choices']
             for _, export_dir in (read, counted)]
  assert choices[0]['tried'] == choices[1]['tried']
  assert choices[0]['ngram_min_count'] == choices[1]['ngram_min_count']
  assert read[0]['test']['accuracy'] == counted[0]['test']['accuracy']


def test_statistics_that_are_not_whole_end_the_trainer_before_it_fits(
    preprocessed, tmp_path):
  output, _ = preprocessed
  cut = shutil.copytree(output, tmp_path / 'cut')
  (largest, *_) = sorted(cut.glob(transformed.ngram_file_pattern()),
                         key=lambda path: -path.stat().st_size)
  largest.unlink()
  with pytest.raises(cli.JobError, match='not whole.*preprocess it again'):
    train.run([f'--data_dir={cut}', f'--model_dir={tmp_path / "model"}',
               *EPOCHS_PATH])
  assert not (tmp_path / 'model' / 'export').exists()
  # A file cut short: its gzip stream ends too soon.
  short = shutil.copytree(output, tmp_path / 'short')
  (largest, *_) = sorted(short.glob(transformed.ngram_file_pattern()),
                         key=lambda path: -path.stat().st_size)
  largest.write_bytes(largest.read_bytes()[:largest.stat().st_size // 2])
  with pytest.raises(cli.JobError, match='cannot be read.*preprocess it '
                     'again'):
    train.run([f'--data_dir={short}', f'--model_dir={tmp_path / "model"}',
               *EPOCHS_PATH])
  assert not (tmp_path / 'model' / 'export').exists()
