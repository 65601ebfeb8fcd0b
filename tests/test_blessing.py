"""The trainer's gate: a retrain worse than the version it would replace is
published but not blessed, and jobs that name the model folder go on serving
the newest blessed version; a version folder named is served as asked; an
export made before the gate counts as blessed."""
import json
import os
import shutil
import types

import numpy as np
import pytest

import cli
from pipeline import score
from schemas import metadata as metadata_lib
from schemas import raw
from schemas import scored
from serving import exports
from tests.conftest import main_in_process
from tests.conftest import write_jsonl
from tests.conftest import QUICK_MODEL
from tests.conftest import TINY_MODEL
from tests.conftest import corpus_rows
from tests.conftest import score_args
from trainer import blessing
from trainer import evaluate
from trainer import train

# A retrain that learns nothing: one epoch at a rate that moves no weight.
WORSE = [*(flag for flag in TINY_MODEL if not flag.startswith('--epochs=')),
         '--epochs=1', '--learning_rate=1e-9']


def test_a_worse_retrain_is_not_blessed_and_scoring_serves_the_earlier_one(
    trained, synthetic_preprocessed, tmp_path, monkeypatch, capsys):
  model_dir = tmp_path / 'model'
  shutil.copytree(trained[0], model_dir)
  earlier = str(model_dir / 'export' / os.path.basename(trained[1]))
  # As a model folder trained before the gate has it: no blessing.
  document = exports.read_metadata(earlier)
  del document[metadata_lib.BLESSING]
  exports.write_metadata(earlier, document)
  earlier_version = document['version']

  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={synthetic_preprocessed}',
      f'--model_dir={model_dir}', *WORSE)
  assert status == cli.EXIT_NOT_BLESSED
  [line] = [line for line in stderr.splitlines() if line.startswith('error:')]
  assert 'is published but not blessed' in line
  assert f'they serve {earlier}' in line

  newest = exports.resolve(str(model_dir), blessed_only=False)
  assert newest != earlier
  metadata = exports.load_metadata(newest)
  verdict = metadata.blessing
  assert not metadata.blessed
  assert verdict['compared_with']['version'] == earlier_version
  assert (f'below {verdict["compared_with"]["accuracy"]:.4f}, that of '
          f'version {earlier_version}') in verdict['reason']
  # Judged on the split that chose the model, never on test.
  assert verdict['measured_on'] == 'the validation split'
  assert verdict['accuracy'] == (
      metadata.document[evaluate.EVALUATION][raw.VALIDATION]['accuracy'])
  assert 'Not blessed' in (model_dir / evaluate.REPORT_FILE).read_text()
  assert exports.resolve(str(model_dir)) == earlier

  corpus = tmp_path / 'corpus.jsonl'
  write_jsonl(corpus, corpus_rows(40, 6))
  served = score.run(score_args(corpus, model_dir, tmp_path / 'scores'))
  assert served['model_version'] == earlier_version
  assert served['model_choice'] == {
      'why': exports.NEWEST_BLESSED, 'blessing': None,
      'passed_over': [{'version': metadata.version,
                       'reason': verdict['reason']}]}
  written = json.loads((tmp_path / 'scores' / scored.MANIFEST_FILE
                        ).read_text())
  assert written['model_choice'] == served['model_choice']

  # Named, the version the gate refused is served all the same.
  asked = score.run(score_args(corpus, newest, tmp_path / 'asked'))
  assert asked['model_version'] == metadata.version
  assert asked['model_choice'] == {'why': exports.AS_ASKED,
                                   'blessing': verdict, 'passed_over': []}


def test_a_model_must_beat_the_majority_class_by_the_gain_asked(
    synthetic_preprocessed, tmp_path, monkeypatch, capsys):
  # The majority class is right half the time on these reviews: no model
  # gains 0.6 over it.
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={synthetic_preprocessed}',
      f'--model_dir={tmp_path}', *QUICK_MODEL,
      '--bless_min_gain_over_majority=0.6')
  assert status == cli.EXIT_NOT_BLESSED
  assert ', by more than 0.6: the model has learned nothing' in stderr
  assert 'none is blessed' in stderr
  only = exports.resolve(str(tmp_path), blessed_only=False)
  verdict = exports.load_metadata(only).blessing
  assert (verdict['min_gain_over_majority'], verdict['compared_with']) == (
      0.6, None)
  with pytest.raises(exports.ExportError, match='no blessed export'):
    exports.resolve(str(tmp_path))


def test_a_refitted_model_is_compared_on_recorded_figures_of_the_same_data():
  measured_on = "cross-validation's held-out predictions"
  previous = metadata_lib.ExportMetadata.parse({
      'label_names': ['neg', 'pos'], 'version': 1,
      'preprocessing_fingerprint': 'same data',
      'blessing': {'blessed': True, 'measured_on': measured_on,
                   'accuracy': 0.8}})
  data = types.SimpleNamespace(fingerprint='same data',
                               label_names=['neg', 'pos'])
  # pylint: disable=protected-access
  assert blessing._previous_accuracy(previous, 'unused', measured_on, True,
                                     data) == (0.8, '')
  data.fingerprint = 'other data'
  accuracy, why_not = blessing._previous_accuracy(previous, 'unused',
                                                  measured_on, True, data)
  assert accuracy is None
  assert 'not recorded' in why_not


def test_the_version_before_is_read_by_its_own_label_order():
  """A retrain on new data may order the same classes otherwise."""
  probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
  ours = np.array([0, 0, 1])  # pos, pos, neg in this run's order
  assert blessing.accuracy(ours, probabilities, ['pos', 'neg'],
                           ['pos', 'neg']) == pytest.approx(1 / 3)
  # The same answers under columns named the other way round.
  assert blessing.accuracy(ours, probabilities[:, ::-1], ['neg', 'pos'],
                           ['pos', 'neg']) == pytest.approx(1 / 3)


def test_a_version_refitted_on_this_validation_split_is_not_compared():
  previous = metadata_lib.ExportMetadata.parse({
      'label_names': ['neg', 'pos'], 'version': 1,
      'preprocessing_fingerprint': 'same data', 'training': {'refit': True}})
  data = types.SimpleNamespace(fingerprint='same data',
                               label_names=['neg', 'pos'])
  # pylint: disable=protected-access
  accuracy, why_not = blessing._previous_accuracy(
      previous, 'unused', 'the validation split', False, data)
  assert accuracy is None
  assert 'refitted on this run\'s validation split' in why_not
