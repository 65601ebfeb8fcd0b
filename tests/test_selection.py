"""Grouped k-fold cross-validation: the folds, what they choose, and the
trainer's runs that choose by them."""
import collections
import hashlib
import json
import shutil

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import keras
import numpy as np
import pytest
import tensorflow as tf

import cli
from schemas import raw
from schemas import transformed
from serving import exports
from bench import common
from tests.conftest import main_in_process
from tests.conftest import preprocess_rows
from tests.conftest import synthetic_reviews
from trainer import calibration
from trainer import data as data_lib
from trainer import evaluate
from trainer import folds
from trainer import model as model_lib
from trainer import ngram_fit
from trainer import ngrams
from trainer import runs
from trainer import selection
from trainer import settings as settings_lib
from trainer import train

# A small hybrid, quick to train five times over: both branches, although
# the train split is small.
SMALL = ['--batch_size=16', '--embed_dim=8', '--ff_dim=8', '--epochs=2',
         '--ngram_epochs=2', '--seed=3', '--transformer_min_examples=0']


def _dealt(keys, folds, seed):
  return selection.assign_folds(selection.fold_digests(keys, seed), folds)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=4, max_size=120),
       st.integers(2, 4), st.integers(0, 2**32 - 1))
def test_a_group_never_spans_two_folds_and_folds_hold_as_many_groups(
    groups, folds, seed):
  keys = [f'g{group}'.encode() for group in groups]
  if len(set(keys)) < folds:
    with pytest.raises(ValueError, match='need as many groups'):
      _dealt(keys, folds, seed)
    return
  fold_of = _dealt(keys, folds, seed)
  folds_of_key = collections.defaultdict(set)
  for key, fold in zip(keys, fold_of):
    folds_of_key[key].add(int(fold))
  assert all(len(found) == 1 for found in folds_of_key.values())
  groups_a_fold = collections.Counter(
      next(iter(found)) for found in folds_of_key.values())
  assert set(groups_a_fold) == set(range(folds))
  assert max(groups_a_fold.values()) - min(groups_a_fold.values()) <= 1
  # The distinct keys in the order of their whole seeded sha256, dealt in
  # turn: eight bytes a record deal them as the whole digest would.
  ranked = sorted(set(keys), key=lambda key: hashlib.sha256(
      seed.to_bytes(8, 'big') + key).digest())
  assert fold_of.tolist() == [ranked.index(key) % folds for key in keys]


def test_the_seed_deals_the_groups_anew():
  keys = [str(i).encode() for i in range(100)]
  assert not np.array_equal(_dealt(keys, 5, 1), _dealt(keys, 5, 2))


def _keys(ids, token_rows, params):
  token_ids = np.zeros((len(ids), 6), np.int64)
  for row, tokens in enumerate(token_rows):
    token_ids[row, :len(tokens)] = tokens
  return selection.fold_keys(np.array([i.encode() for i in ids], object),
                             token_ids, params)


def test_folds_follow_the_group_pattern_else_the_text():
  ids = ['/train/pos/1203_7.txt', '/train/pos/1299_8.txt', 'x', 'y', 'z']
  token_rows = [[5, 6], [7], [5, 6], [5, 6], [9]]
  params = {'group_pattern': r'/((?:pos|neg)/)(?:(\d+)\d\d|\d{1,2})_\d+\.txt',
            'read_config': {'group_field': None}}
  keys = _keys(ids, token_rows, params)
  assert keys[0] == keys[1] == b'group:pos/12'
  # Without a group, a text's copies go together, as the split's text hash
  # sends them; padding is not part of the text.
  assert keys[2] == keys[3] != keys[4]
  # An output split by --group_field does not hold the field: by text, a
  # group's records could sit on both sides of a fold.
  with pytest.raises(ValueError, match='--group_field=movie, which its '
                     'records do not keep'):
    _keys(ids, token_rows, {**params, 'read_config': {'group_field': 'movie'}})


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_a_folds_vocabulary_is_that_of_its_documents_alone(seed):
  rng = np.random.default_rng(seed)
  token_ids = rng.integers(2, 12, size=(40, 8))
  token_ids[:, 6:] = 0
  labels = rng.integers(0, 3, size=40)
  table = ngrams.DocumentNgrams.fit(
      [(token_ids[:25], labels[:25]), (token_ids[25:], labels[25:])], 2)
  chosen = np.flatnonzero(rng.random(40) < 0.6)
  for min_count in (1, 3):
    direct = ngrams.Vocabulary.fit([(token_ids[chosen], labels[chosen])], 2,
                                   3, min_count)
    counted = table.vocabulary(3, chosen, min_count)
    assert np.array_equal(direct.keys, counted.keys)
    assert np.array_equal(direct.counts, counted.counts)
    assert np.allclose(direct.ratios, counted.ratios)


def test_the_choice_is_the_best_mean_over_the_folds_and_its_epoch():
  labels = np.array([0, 1, 0, 1])
  right, wrong = np.array([[2., 0.], [0., 2.]]), np.array([[0., 2.], [2., 0.]])
  # Two folds of two examples; candidate a is right after epoch 2 in both,
  # b right after epoch 1 in one fold only.
  a = selection.Candidate('ngram_logits', {'ngram_min_count': 8})
  a.add_fold(np.array([0, 1]), [wrong, right, wrong])
  a.add_fold(np.array([2, 3]), [wrong, right, right])
  b = selection.Candidate('ngram_logits', {'ngram_min_count': 4})
  b.add_fold(np.array([0, 1]), [right, wrong, wrong])
  b.add_fold(np.array([2, 3]), [wrong, wrong, wrong])
  t = selection.Candidate('transformer_logits', {})
  t.add_fold(np.array([0, 1]), [right])
  t.add_fold(np.array([2, 3]), [wrong])
  choice = selection.choose(
      {'ngram_logits': [a, b], 'transformer_logits': [t]},
      ['transformer_logits', 'ngram_logits'], labels, 'val_accuracy', 2, 4)
  assert choice.ngram_min_count == 8
  assert choice.epochs == {'ngram_logits': 2, 'transformer_logits': 1}
  summary = choice.tried['ngram_logits'][0]
  assert summary['setting'] == {'ngram_min_count': 8}
  assert (summary['mean'], summary['std']) == (1.0, 0.0)
  assert summary['by_epoch'] == [0.0, 1.0, 0.5]
  assert choice.tried['ngram_logits'][1]['mean'] == 0.5
  # Every example's held-out logits at the chosen epochs, branches in order.
  assert np.array_equal(choice.logits[:, 1], np.concatenate([right, right]))
  assert np.array_equal(choice.logits[:, 0], np.concatenate([right, wrong]))


def test_the_mean_is_over_every_held_out_example_not_every_fold():
  labels = np.zeros(4, np.int64)
  right, wrong = np.array([[2., 0.]]), np.array([[0., 2.]])
  # A fold of one example, wrong, and one of three, right.
  candidate = selection.Candidate('ngram_logits', {'ngram_min_count': 2})
  candidate.add_fold(np.array([0]), [wrong])
  candidate.add_fold(np.array([1, 2, 3]), [np.repeat(right, 3, axis=0)])
  summary = candidate.summary(labels, 'val_accuracy')
  assert summary['mean'] == 0.75
  assert summary['std'] == pytest.approx(np.std([0, 1], ddof=1), abs=1e-4)


@pytest.mark.parametrize('sizes, batch_size, fails', [
    ((5, 5, 5), 10, False),
    ((5, 5, 5), 11, True),
    ((28, 1, 1), 10, True),   # the first fold leaves 2 to train on
])
def test_a_fold_that_leaves_less_than_a_batch_to_train_on_is_refused(
    sizes, batch_size, fails):
  fold_of = np.repeat(np.arange(len(sizes)), sizes)
  if fails:
    with pytest.raises(ValueError, match='fewer than a batch'):
      selection.check_training_parts(fold_of, len(sizes), batch_size)
  else:
    selection.check_training_parts(fold_of, len(sizes), batch_size)


@pytest.fixture(scope='module')
def cross_validated(synthetic_preprocessed, tmp_path_factory):
  folder = tmp_path_factory.mktemp('cv')
  metrics, export_dir = train.run([
      f'--data_dir={synthetic_preprocessed}', f'--model_dir={folder}',
      '--folds=2', '--ngram_fit=epochs', *SMALL])
  return folder, metrics, exports.read_metadata(export_dir)


def test_cross_validation_chooses_and_the_final_model_is_refitted(
    cross_validated, synthetic_preprocessed):
  folder, metrics, metadata = cross_validated
  data = data_lib.PreprocessedData.load(str(synthetic_preprocessed))
  choices = metadata['training']['choices']
  assert choices['on'] == selection.CROSS_VALIDATION and choices['refit']
  folds = choices['cross_validation']
  assert folds['folds'] == 2
  assert folds['examples'] == data.num_examples(raw.TRAIN)
  assert set(folds['epochs']) == {model_lib.NGRAM_LOGITS,
                                  model_lib.TRANSFORMER_LOGITS}
  assert folds['ngram_min_count'] == choices['ngram_min_count']
  tried = folds['tried'][model_lib.NGRAM_LOGITS]
  assert [c['setting']['ngram_min_count'] for c in tried] == list(
      ngram_fit.MIN_COUNTS[:len(tried)])
  # The final fit runs the chosen epochs, and trains on validation too.
  assert metadata['training']['epochs_run_by_branch'] == folds['epochs']
  fitted = metadata['calibration']['fitted_on']
  assert fitted['what'] == selection.CROSS_VALIDATION
  assert fitted['examples'] == data.num_examples(raw.TRAIN)
  assert set(fitted['branch_accuracy']) == set(folds['epochs'])
  # Blessed on what it did not train on: the folds' held-out predictions.
  blessing = metadata['blessing']
  assert blessing['blessed']
  assert blessing['measured_on'] == "cross-validation's held-out predictions"
  assert blessing['accuracy'] == fitted['after']['accuracy']
  assert metrics['selected_on'] == selection.CROSS_VALIDATION
  assert metrics['refit'] is True
  assert metrics['test']['accuracy'] > 0.9
  report = (folder / evaluate.REPORT_FILE).read_text()
  assert 'Grouped 2-fold cross-validation over the train split' in report
  assert 'trained on train + validation' in report
  assert "held-out predictions of the cross-validation folds" in report
  assert report.count('| yes |') == 2
  on_disk = json.loads((folder / evaluate.METRICS_FILE).read_text())
  assert on_disk['selected_on'] == selection.CROSS_VALIDATION


def test_without_refit_validation_calibrates_and_is_held_out(
    synthetic_preprocessed, tmp_path):
  metrics, export_dir = train.run([
      f'--data_dir={synthetic_preprocessed}', f'--model_dir={tmp_path}',
      '--folds=2', '--no-refit', '--model=nbsvm', *SMALL])
  metadata = exports.read_metadata(export_dir)
  assert metadata['calibration']['fitted_on']['what'] == raw.VALIDATION
  assert metrics['refit'] is False
  report = (tmp_path / evaluate.REPORT_FILE).read_text()
  assert 'The validation split chose the temperature' in report
  assert 'Temperature fitted on the validation split' in report


def test_held_out_logits_keep_the_rows_order_in_any_batching():
  keras_model = model_lib.build_model(
      20, 12, 2, model_lib.ModelParams(model='transformer', embed_dim=4,
                                       ff_dim=4))
  rng = np.random.default_rng(0)
  token_ids = np.zeros((7, 12), np.int64)
  for row, length in enumerate(rng.integers(1, 12, size=7)):
    token_ids[row, :length] = rng.integers(2, 20, size=length)
  rows = np.array([1, 4, 5, 9, 10, 11, 20])
  read_order = rng.permutation(7)

  def batches(width):
    return data_lib.batched(tf.data.Dataset.from_tensor_slices(
        (token_ids[read_order], (np.zeros(7, np.int64), rows[read_order]))),
                            7, 3, False, width)

  cut = selection.held_out_logits(keras_model, model_lib.TRANSFORMER_LOGITS,
                                  batches(4), rows)
  uncut = selection.held_out_logits(keras_model,
                                    model_lib.TRANSFORMER_LOGITS, batches(0),
                                    rows)
  np.testing.assert_allclose(cut, uncut, rtol=1e-5, atol=1e-5)
  probe = keras.Model(keras_model.inputs, keras_model.get_layer(
      model_lib.TRANSFORMER_LOGITS).output)
  np.testing.assert_allclose(cut, probe([token_ids]), rtol=1e-5, atol=1e-5)
  assert calibration.softmax(cut).shape == (7, 2)
  with pytest.raises(selection.ShortRead, match='6 of the 7 held-out records'):
    selection.held_out_logits(keras_model, model_lib.TRANSFORMER_LOGITS,
                              batches(0).unbatch().take(6).batch(3), rows)


@pytest.mark.parametrize('noticed, message', [
    (True, 'changed while the trainer read it'),
    (False, r'\d+ of the \d+ held-out records were read in .*fold_1, yet '
     'the folder is unchanged')])
def test_a_held_out_fold_read_short_names_its_cause(
    synthetic_preprocessed, tmp_path, noticed, message):
  data_dir = tmp_path / 'preprocessed'
  shutil.copytree(synthetic_preprocessed, data_dir)
  args = train.parse_args([
      f'--data_dir={data_dir}', f'--model_dir={tmp_path / "model"}',
      '--folds=2', '--model=transformer', '--epochs=1', *SMALL[:3]])
  settings, data = settings_lib.settings_from_args(args)
  planned = folds.plan(settings, data)
  # The last record, held out by the first fold, is cut from its file, as a
  # preprocessing run publishing under the trainer would: that fold's
  # held-out read comes up one record short.
  planned.fold_of[-1] = 0
  last = data.files(raw.TRAIN)[-1]
  records = list(tf.data.TFRecordDataset(last, compression_type='GZIP'))
  with tf.io.TFRecordWriter(last, 'GZIP') as writer:
    for record in records[:-1]:
      writer.write(record.numpy())
  if not noticed:  # the folder as the trainer found it: a fault of ours
    data.fingerprint = data_lib.fingerprint_of(str(data_dir))
  with pytest.raises(cli.JobError, match=message):
    folds.held_out_candidate(settings, settings.params, data, planned, None,
                             runs.Run(settings.model_dir),
                             model_lib.TRANSFORMER_LOGITS, None)


def test_a_fold_reads_its_rows_from_the_files_as_memory_would(
    synthetic_preprocessed):
  data = data_lib.PreprocessedData.load(str(synthetic_preprocessed))
  splits = (raw.TRAIN, raw.VALIDATION)
  names = (transformed.TOKEN_IDS, transformed.LABEL_ID)
  token_ids, labels = common.split_arrays(data, splits, names)
  assert len(labels) == sum(data.num_examples(split) for split in splits)
  rows = np.flatnonzero(np.random.default_rng(0).random(len(labels)) < 0.7)
  numbered = data_lib.of_rows(data, splits, rows, 64, bucket_width=8,
                              numbered=True)
  read = np.concatenate([found.numpy() for _, (_, found) in numbered])
  assert sorted(read) == rows.tolist()
  # Shuffled whole, the batches are those of the same records in memory:
  # a small corpus's folds train as they did when they were held there.
  from_files = data_lib.of_rows(data, splits, rows, 16, shuffle=True, seed=3,
                                drop_remainder=True)
  in_memory = data_lib.batched(
      tf.data.Dataset.from_tensor_slices((token_ids[rows], labels[rows]))
      .shuffle(len(rows), seed=3, reshuffle_each_iteration=True),
      len(rows), 16, True, 0)
  for _ in range(2):  # two epochs: reshuffled alike
    for (files_ids, files_labels), (memory_ids, memory_labels) in zip(
        from_files, in_memory, strict=True):
      np.testing.assert_array_equal(files_ids, memory_ids)
      np.testing.assert_array_equal(files_labels, memory_labels)
  # A shuffle smaller than the rows reads the files in a new order each
  # epoch: every row once an epoch, wherever its file comes.
  windowed = data_lib.of_rows(data, splits, rows, 16, shuffle=True, seed=3,
                              buffer_size=16, numbered=True)
  epochs = [np.concatenate([found.numpy() for _, (_, found) in windowed])
            for _ in range(2)]
  assert [sorted(epoch) for epoch in epochs] == [rows.tolist()] * 2
  assert epochs[0].tolist() != epochs[1].tolist()


@pytest.mark.parametrize('flags, message', [
    (['--folds=1'], 'one fold holds out every example'),
    (['--folds=0', '--refit'], 'it needs --folds of 2 or more'),
    # 538 train examples: a fold of 2 leaves about 269 to train on.
    (['--folds=2', '--batch_size=300', '--ngram_fit=epochs'],
     'fewer than a batch of 300'),
])
def test_impossible_cross_validation_is_one_error_line(
    synthetic_preprocessed, tmp_path, flags, message, monkeypatch, capsys):
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={synthetic_preprocessed}',
      f'--model_dir={tmp_path / "m"}', *flags)
  assert status == 2
  assert message in stderr
  assert stderr.count('error:') == 1
  assert not (tmp_path / 'm' / 'export').exists()


def test_folds_the_groups_cannot_fill_are_an_error_only_where_asked_for(
    tmp_path, caplog, monkeypatch, capsys):
  # 200 train reviews of 4 groups, by their ids; no flag would have 5 folds.
  rows = synthetic_reviews(240, 0)
  for index, row in enumerate(rows):
    row['id'] = f'g{index % 4}-{index}'
    row['split'] = raw.VALIDATION if index % 6 == 0 else raw.TRAIN
  data_dir = preprocess_rows(tmp_path, rows + synthetic_reviews(60, 1),
                             r'--group_pattern=^(g\d)-')
  caplog.set_level('INFO')
  metrics, _ = train.run([f'--data_dir={data_dir}',
                          f'--model_dir={tmp_path / "auto"}'])
  assert metrics['selected_on'] == raw.VALIDATION and not metrics['refit']
  assert '--folds: 0, not the 5 of auto' in caplog.text
  assert 'need as many groups' in caplog.text
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={data_dir}',
      f'--model_dir={tmp_path / "asked"}', '--folds=5')
  assert status == 2 and stderr.count('error:') == 1
  assert '--folds=5: 5 folds need as many groups; there are only 4' in stderr
  # Two folds of two groups leave 100 reviews to a fold's fit, fewer than
  # a batch: no matter to the convex solver, which fits without batches.
  metrics, _ = train.run([f'--data_dir={data_dir}',
                          f'--model_dir={tmp_path / "two"}', '--folds=2',
                          '--batch_size=150'])
  assert metrics['selected_on'] == selection.CROSS_VALIDATION


@pytest.mark.parametrize('examples, median_length, epochs, folds', [
    (3508, 16, 13, selection.FOLDS),    # SMS
    (22700, 20, 2, 0),                  # IMDB's first sentences
    (1809, 207, 20, 0),                 # 2,000 IMDB reviews
    (22700, 207, 2, 0),                 # IMDB
    (40, 10, 5, selection.FOLDS),       # folds leave 32 to train on
    (39, 10, 5, 0),                     # 31: less than a batch of 32
    (39, 10, 0, selection.FOLDS),       # the convex solver needs no batch
])
def test_auto_folds_cross_validate_where_a_training_is_cheap(
    examples, median_length, epochs, folds):
  assert selection.auto_folds(examples, median_length, epochs, 32) == folds


def test_the_report_names_the_measure_that_chose_and_a_count_only_searched():
  summary = {'setting': {'ngram_min_count': 16}, 'epochs': 2, 'mean': 0.31,
             'std': 0.01, 'by_epoch': [0.4, 0.31]}
  choices = {'refit': True, 'cross_validation': {
      'folds': 3, 'groups': 9, 'examples': 90, 'monitor': 'val_loss',
      'epochs': {'ngram_logits': 2}, 'ngram_min_count': 16,
      'tried': {'ngram_logits': [summary]}}}
  text = '\n'.join(evaluate.cross_validation_lines(choices))
  assert 'by the held-out loss over every training example' in text
  assert '| held-out loss |' in text
  # One count, given by the flag: cross-validation did not choose it.
  assert 'minimum count' not in text
  choices['cross_validation']['monitor'] = 'val_accuracy'
  choices['cross_validation']['tried']['ngram_logits'] = [
      summary, {**summary, 'setting': {'ngram_min_count': 8}}]
  text = '\n'.join(evaluate.cross_validation_lines(choices))
  assert 'epochs and the n-gram minimum count, by the held-out accuracy' in (
      text)
