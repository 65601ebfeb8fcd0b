"""Classify texts from Python with a trained model: for notebooks and
programs, in one process, with no Beam.

    import textclf

    classifier = textclf.load('work/model')       # its newest blessed version
    classifier.predict(['I was charged twice'])    # a row a text
    classifier.predict(texts, as_frame=True)       # a pandas DataFrame
    classifier.mistakes(texts, labels, n=10)       # its surest mistakes

A row is ``predict``'s dict (``text``, ``label``, ``confidence``,
``probabilities`` by label name), the predictions of the export's
``serving_default``, as ``trainer.predict`` prints them and the scoring job
writes them. A blank text has nothing to classify: its row's label,
confidence and probabilities are None.
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from cli import quiet  # pylint: disable=unused-import,g-bad-import-order
import numbers
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from schemas import raw
from schemas import scored
from schemas.metadata import ExportMetadata
from serving import exports
from serving import predictions
from serving.exports import ExportError
from serving.predictions import Mistake

__all__ = ('Classifier', 'ExportError', 'Mistake', 'load')

# Texts classified in one call of the model.
BATCH_SIZE = 256


def load(model_dir: str, version: Optional[int] = None) -> 'Classifier':
  """The classifier a model folder holds: the version a job would use
  (``serving.exports``), or the one named; ``model_dir`` may also be one
  export folder. ExportError when there is none to load. An export is a
  program: load only one you trust."""
  if version is not None:
    _check_whole('version', version, 0)
    found = exports.versions(model_dir)
    if version not in found:
      raise ExportError(f'no version {version} in {model_dir} (its '
                        f'versions: {sorted(found) or "none"})')
    model_dir = found[version]
  return Classifier(*exports.load(model_dir))


class Classifier:
  """An export, loaded: ``load`` makes one."""

  def __init__(self, signature, metadata: ExportMetadata):
    self._signature = signature
    self.metadata = metadata

  @property
  def labels(self) -> Tuple[str, ...]:
    """The classes, in the order of the probabilities."""
    return self.metadata.label_names

  @property
  def version(self) -> Optional[int]:
    """The export's version folder (None for one not published)."""
    return self.metadata.version

  def __repr__(self) -> str:
    return f'Classifier(version={self.version}, labels={self.labels})'

  def predict(self, texts: Iterable[str], as_frame: bool = False,
              batch_size: int = BATCH_SIZE):
    """A row a text, in order, classified ``batch_size`` at a time; with
    ``as_frame``, a pandas DataFrame of ``text``, ``label``, ``confidence``
    and a ``probability_<label>`` column a class, as the scoring job's
    Parquet names them."""
    _check_whole('batch_size', batch_size, 1)
    texts = _checked_texts(texts)
    rows = []
    for start in range(0, len(texts), batch_size):
      rows += predictions.predict_batch(self._signature, self.labels,
                                        texts[start:start + batch_size])
    rows = [row or {'text': text, 'label': None, 'confidence': None,
                    'probabilities': None}
            for text, row in zip(texts, rows)]
    return self._frame(rows) if as_frame else rows

  def mistakes(self, texts: Iterable[str], labels: Iterable[str],
               n: Optional[int] = 10, as_frame: bool = False):
    """The ``n`` texts (all where None) whose prediction is not their
    label, the most confident first: ``Mistake`` tuples of text, label,
    prediction and confidence, or with ``as_frame`` a DataFrame of those
    columns. Blank texts are left out; a label the model does not know is
    a ValueError, not a mistake of the model's."""
    if n is not None:
      _check_whole('n', n, 0)
    texts, labels = _checked_texts(texts), list(labels)
    if len(labels) != len(texts):
      raise ValueError(f'{len(texts)} texts but {len(labels)} labels')
    unknown = [label for label in dict.fromkeys(labels)
               if label not in self.labels]
    if unknown:
      raise ValueError(f'labels the model does not know: {unknown[:10]} '
                       f'(its labels: {list(self.labels)})')
    worst = predictions.worst_mistakes(
        ((row['text'], label, row['label'], row['confidence'])
         for row, label in zip(self.predict(texts), labels)
         if row['label'] is not None), n)
    return _data_frame(worst, Mistake._fields) if as_frame else worst

  def _frame(self, rows: List[Dict]):
    columns = scored.probability_columns(list(self.labels))
    return _data_frame(
        [{'text': row['text'], 'label': row['label'],
          'confidence': row['confidence'],
          **{column: (row['probabilities'] or {}).get(label)
             for column, label in zip(columns, self.labels)}}
         for row in rows],
        ('text', 'label', 'confidence', *columns))


def _data_frame(records: List, columns: Sequence[str]):
  # pandas only where a frame is asked for: it adds to every import.
  import pandas  # pylint: disable=import-outside-toplevel
  return pandas.DataFrame(records, columns=list(columns))


def _check_whole(name: str, value, minimum: int) -> None:
  """A TypeError where ``value`` is not an int (a bool is not one), a
  ValueError where it is below ``minimum``: a negative batch size would
  make the batches, and so the rows, none."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f'{name} must be an int, not a {type(value).__name__}')
  if value < minimum:
    raise ValueError(f'{name} must be at least {minimum}, not {value}')


def _checked_texts(texts: Iterable[str]) -> List[str]:
  """The texts as a list; a TypeError for a lone string (its characters
  would be classified) and for any text that is not a string (a missing
  value of a DataFrame's column, NaN, say); a ValueError for a string that
  is no text (a NUL, a lone surrogate: ``raw.is_undecodable``), which the
  scoring job would reject rather than score."""
  if isinstance(texts, (str, bytes)):
    raise TypeError('texts must be a list (or any iterable) of strings, '
                    'not one string')
  texts = list(texts)
  wrong = [(index, type(text).__name__) for index, text in enumerate(texts)
           if not isinstance(text, str)]
  if wrong:
    raise TypeError(f'texts must be strings; text {wrong[0][0]} is a '
                    f'{wrong[0][1]}' + (f' ({len(wrong)} are not)'
                                        if len(wrong) > 1 else ''))
  undecodable = [index for index, text in enumerate(texts)
                 if raw.is_undecodable(text)]
  if undecodable:
    raise ValueError(f'text {undecodable[0]} is not text: it holds a NUL or '
                     'a lone surrogate' + (f' ({len(undecodable)} do)'
                                           if len(undecodable) > 1 else ''))
  return texts
