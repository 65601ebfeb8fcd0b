"""The Python API (``textclf``) against a real trained export."""
import pytest

import textclf
from serving import exports
from serving import predictions
from tests.conftest import float32_approx

TEXTS = ['superb wonderful film', 'dull waste of a plot',
         'a film with a plot', 'wonderful', 'waste']


def test_predict_answers_the_rows_of_the_export_in_batches(trained):
  model_dir, export_dir, _ = trained
  classifier = textclf.load(str(model_dir))
  signature, metadata = exports.load(export_dir)
  assert classifier.version == metadata.version is not None
  assert classifier.labels == metadata.label_names
  # Batches of two: the rows of three calls, in the texts' order.
  rows = classifier.predict(TEXTS + ['  \n'], batch_size=2)
  expected = predictions.predict(signature, metadata.label_names, TEXTS)
  assert [row['text'] for row in rows] == TEXTS + ['  \n']
  assert [row['label'] for row in rows] == [
      row['label'] for row in expected] + [None]
  for row, wanted in zip(rows, expected):
    assert row['confidence'] == float32_approx(wanted['confidence'])
    assert row['probabilities'] == {
        label: float32_approx(p) for label, p in
        wanted['probabilities'].items()}
  assert rows[-1]['probabilities'] is None

  frame = classifier.predict(TEXTS, as_frame=True)
  assert list(frame.columns) == ['text', 'label', 'confidence', *(
      f'probability_{label}' for label in metadata.label_names)]
  assert frame['label'].tolist() == [row['label'] for row in expected]
  for label in metadata.label_names:
    assert frame[f'probability_{label}'].tolist() == [
        float32_approx(row['probabilities'][label]) for row in expected]


def test_a_version_is_loaded_by_its_number_and_a_missing_one_refused(
    trained):
  model_dir, export_dir, _ = trained
  version = int(export_dir.rstrip('/').rsplit('/', 1)[-1])
  assert textclf.load(str(model_dir), version=version).version == version
  with pytest.raises(textclf.ExportError, match=rf'no version {version + 1}'
                     rf' in .*versions: \[{version}\]'):
    textclf.load(str(model_dir), version=version + 1)


def test_mistakes_are_the_wrong_predictions_most_confident_first(trained):
  model_dir, _, _ = trained
  classifier = textclf.load(str(model_dir))
  rows = classifier.predict(TEXTS)
  other = {label: next(name for name in classifier.labels if name != label)
           for label in classifier.labels}
  # Every text labelled otherwise than predicted but the first, and a blank
  # text (nothing to classify, no mistake).
  labels = [rows[0]['label']] + [other[row['label']] for row in rows[1:]]
  mistakes = classifier.mistakes(TEXTS + [''], labels + [labels[0]], n=3)
  wrong = sorted(rows[1:], key=lambda row: -row['confidence'])[:3]
  assert [m.text for m in mistakes] == [row['text'] for row in wrong]
  assert [m.prediction for m in mistakes] == [row['label'] for row in wrong]
  assert [m.label for m in mistakes] == [other[row['label']]
                                         for row in wrong]
  assert [m.confidence for m in mistakes] == [
      float32_approx(row['confidence']) for row in wrong]
  assert len(classifier.mistakes(TEXTS, labels, n=None)) == len(TEXTS) - 1
  assert classifier.mistakes(TEXTS, [row['label'] for row in rows]) == []
  frame = classifier.mistakes(TEXTS, labels, n=2, as_frame=True)
  assert list(frame.columns) == ['text', 'label', 'prediction', 'confidence']
  assert frame['text'].tolist() == [row['text'] for row in wrong[:2]]


def test_wrong_inputs_are_refused_with_what_is_wrong(trained):
  model_dir, _, _ = trained
  classifier = textclf.load(str(model_dir))
  with pytest.raises(TypeError, match='not one string'):
    classifier.predict('one text')
  with pytest.raises(TypeError, match='text 1 is a float'):
    classifier.predict(['a film', float('nan')])
  # What the scoring job rejects as undecodable_text is no text here either.
  for no_text in ('a\x00film', 'a \ud800 film'):
    with pytest.raises(ValueError, match='text 1 is not text: it holds a NUL '
                       'or a lone surrogate'):
      classifier.predict(['a film', no_text])
  with pytest.raises(ValueError, match=r'text 0 .* \(2 do\)'):
    classifier.mistakes(['\x00', '\x00'], [classifier.labels[0]] * 2)
  with pytest.raises(ValueError, match='2 texts but 1 labels'):
    classifier.mistakes(['a', 'b'], [classifier.labels[0]])
  with pytest.raises(ValueError, match=r"does not know: \['positive'\]"):
    classifier.mistakes(['a', 'b'], [classifier.labels[0], 'positive'])
  # A batch size or count that would make no batches, or no rows, silently.
  for wrong in (0, -1):
    with pytest.raises(ValueError, match=f'batch_size must be at least 1, '
                       f'not {wrong}'):
      classifier.predict(['a film'], batch_size=wrong)
  with pytest.raises(TypeError, match='batch_size must be an int, not a '
                     'float'):
    classifier.predict(['a film'], batch_size=1.5)
  with pytest.raises(ValueError, match='n must be at least 0, not -1'):
    classifier.mistakes(['a'], [classifier.labels[0]], n=-1)
  with pytest.raises(TypeError, match='version must be an int, not a str'):
    textclf.load(str(model_dir), version='1')
