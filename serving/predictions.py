"""An export's answers as rows, and the mistakes among them.

``predict`` and ``predict_batch`` make what ``trainer.predict`` prints and
``textclf`` returns: each text's label, its confidence and every class's
probability.
``worst_mistakes`` ranks what a model got wrong by how sure it was of its
answer, the start of every error analysis: the trainer's report lists the
test split's, ``textclf`` those of any labelled texts.
"""
import heapq
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence

from schemas import serving


def predict(signature, label_names: Sequence[str],
            texts: List[str]) -> List[Dict]:
  """The seed article's predict(text), for a batch of texts: a row
  (``text``, ``label``, ``confidence``, ``probabilities`` by label name) a
  text, in order."""
  outputs = signature(text=[t.encode('utf-8') for t in texts])
  labels = outputs[serving.LABEL].numpy()
  confidences = outputs[serving.CONFIDENCE].numpy()
  probabilities = outputs[serving.PROBABILITIES].numpy()
  return [{'text': text, 'label': label.decode('utf-8'),
           'confidence': float(confidence),
           'probabilities': dict(zip(label_names, row.tolist()))}
          for text, label, confidence, row
          in zip(texts, labels, confidences, probabilities)]


def predict_batch(signature, label_names: Sequence[str],
                  texts: List[Optional[str]]) -> List[Optional[Dict]]:
  """``predict``'s row of each text, in one call of the model; None for a
  text that is None or blank: nothing to classify, rather than what the
  model makes of an empty document."""
  wanted = [text for text in texts if text is not None and text.strip()]
  answered = iter(predict(signature, label_names, wanted) if wanted else [])
  return [next(answered) if text is not None and text.strip() else None
          for text in texts]


class Mistake(NamedTuple):
  """A text the model labelled otherwise than its true label."""
  text: str
  label: str  # the true label
  prediction: str
  confidence: float  # the probability the model gave its prediction


def worst_mistakes(examples: Iterable[Sequence], most: Optional[int]
                   ) -> List[Mistake]:
  """Of (text, label, prediction, confidence) examples, the ``most`` (all
  where None) whose prediction is not their label, the most confident
  first; ties keep the examples' order. Holds ``most`` at a time, however
  many the examples: a ``Mistake`` is an example, so what one call kept
  and the next batch rank together."""
  wrong = (Mistake(*example) for example in examples
           if example[1] != example[2])
  if most is None:
    return sorted(wrong, key=lambda mistake: -mistake.confidence)
  return heapq.nlargest(most, wrong, key=lambda mistake: mistake.confidence)
