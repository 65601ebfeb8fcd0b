"""The n-gram branch fitted in memory by a convex solver, for a train split
small enough to hold its n-grams.

With the vocabulary and its Naive Bayes ratios r fixed, the branch's logits
are linear in its weights (one w an n-gram, one bias b a class):
logit[d, k] = sum over the n-grams j of document d of r[j, k] w[j], plus
b[k]; ``ngrams.NgramLogits`` computes exactly this. Its mean cross-entropy
over the training documents is convex in (w, b), so full-batch L-BFGS
(scipy's) reaches the minimum in tens of iterations, each two products
with a sparse matrix of the (document, n-gram) pairs: on a few thousand
documents, a fraction of a second, where mini-batch steps take epochs of
Keras fits and a compiled graph for each.

What keeps it from memorising its documents is an L2 penalty,
(strength / 2) sum_j (w[j] - m)^2, m a common weight fitted with the
others: it pulls every weight toward m, so the strongest penalty leaves
Naive Bayes scaled by m (NBSVM's interpolation, Wang & Manning, 2012) and a
weaker one lets the discriminative corrections grow. The strength is chosen
on held-out documents from ``STRENGTHS``, strongest first, each solution
the start of the next (``solve_path``).
"""
import dataclasses
import logging
from typing import Iterator, Sequence, Tuple

import numpy as np
from scipy import optimize
from scipy import sparse

from trainer import ngrams

# The penalties tried, strongest first, on the mean cross-entropy: from
# almost Naive Bayes to almost none; the path stops after PATIENCE of them
# without a better held-out figure (a weaker penalty only lets the weights
# fit their documents more closely).
STRENGTHS = (10.0, 1.0, 0.1, 0.01, 0.001, 0.0001)
PATIENCE = 2
# A faint pull of the common weight toward zero: without it, on documents
# the ratios already separate, it would grow without bound.
_COMMON_PENALTY = 1e-4
# L-BFGS stops when no gradient entry exceeds this, or after these many
# iterations.
_TOLERANCE = 1e-6
_MAX_ITERATIONS = 1000


@dataclasses.dataclass
class Design:
  """Some documents as a sparse matrix of the vocabulary's n-grams each
  holds (1 where it does), with the vocabulary's ratios and the documents'
  labels."""
  holds: sparse.csr_matrix  # [documents, n-grams of the vocabulary]
  ratios: np.ndarray        # float64 [n-grams, classes]
  labels: np.ndarray        # int64 [documents]

  @classmethod
  def of(cls, table: ngrams.DocumentNgrams, rows: np.ndarray,
         vocabulary: ngrams.Vocabulary) -> 'Design':
    """The documents at ``rows`` of ``table``, in that order, over the
    n-grams of ``vocabulary`` (those it lacks count for nothing, as in the
    layer)."""
    position = np.searchsorted(vocabulary.keys, table.keys)
    position = np.minimum(position, len(vocabulary.keys) - 1)
    column_of_key = np.where(vocabulary.keys[position] == table.keys,
                             position, -1)
    row_of_document = np.full(len(table.labels), -1)
    row_of_document[rows] = np.arange(len(rows))
    documents = row_of_document[table.documents]
    columns = column_of_key[table.key_rows]
    kept = (documents >= 0) & (columns >= 0)
    holds = sparse.csr_matrix(
        (np.ones(int(kept.sum())), (documents[kept], columns[kept])),
        shape=(len(rows), len(vocabulary.keys)))
    return cls(holds, vocabulary.ratios.astype(np.float64),
               table.labels[rows])

  def logits(self, kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """[documents, classes]: the branch's logits with these weights."""
    return self.holds @ (self.ratios * kernel[:, None]) + bias


@dataclasses.dataclass
class Solution:
  """The branch's weights at one penalty strength: ``NgramLogits``'s kernel
  and bias, and the solver's iterations."""
  kernel: np.ndarray  # float64 [n-grams]
  bias: np.ndarray    # float64 [classes]
  strength: float
  iterations: int
  loss: float         # the mean cross-entropy on the fitted documents

  def logits(self, design: Design) -> np.ndarray:
    return design.logits(self.kernel, self.bias)

  def set_layer_weights(self, layer) -> None:
    """Makes this solution an ``NgramLogits``'s kernel and bias."""
    layer.kernel.assign(self.kernel.astype(np.float32)[:, None])
    layer.bias.assign(self.bias.astype(np.float32))


def _penalised_loss(design: Design, one_hot: np.ndarray, strength: float):
  """The objective of the parameters (m, w - m, b): its value and
  gradient."""
  width = design.holds.shape[1]
  held_by = design.holds.T.tocsr()
  documents = design.holds.shape[0]

  def objective(parameters: np.ndarray) -> Tuple[float, np.ndarray]:
    common, offsets = parameters[0], parameters[1:width + 1]
    bias = parameters[width + 1:]
    logits = design.logits(common + offsets, bias)
    logits -= logits.max(axis=1, keepdims=True)
    log_sums = np.log(np.exp(logits).sum(axis=1))
    loss = float(np.mean(log_sums - (logits * one_hot).sum(axis=1)))
    errors = (np.exp(logits - log_sums[:, None]) - one_hot) / documents
    by_weight = ((held_by @ errors) * design.ratios).sum(axis=1)
    value = (loss + strength / 2 * float(offsets @ offsets) +
             _COMMON_PENALTY / 2 * common * common)
    gradient = np.concatenate([[by_weight.sum() + _COMMON_PENALTY * common],
                               by_weight + strength * offsets,
                               errors.sum(axis=0)])
    return value, gradient

  return objective


def solve_path(design: Design, strengths: Sequence[float] = STRENGTHS
               ) -> Iterator[Solution]:
  """The minimum of the penalised mean cross-entropy on ``design``'s
  documents at each of ``strengths`` in turn, each started from the one
  before."""
  width, classes = design.ratios.shape
  one_hot = np.eye(classes)[design.labels]
  parameters = np.zeros(1 + width + classes)
  for strength in strengths:
    result = optimize.minimize(
        _penalised_loss(design, one_hot, strength), parameters, jac=True,
        method='L-BFGS-B',
        options={'maxiter': _MAX_ITERATIONS, 'gtol': _TOLERANCE})
    if not np.all(np.isfinite(result.x)):
      raise ArithmeticError(f'the n-gram solver diverged at penalty '
                            f'{strength}: {result.message}')
    if not result.success:
      # Its last point is still the best it found; held out, it is judged
      # as any other.
      logging.warning('the n-gram solver stopped short of the minimum at '
                      'penalty %g after %d iterations: %s', strength,
                      result.nit, result.message)
    parameters = result.x
    kernel = parameters[0] + parameters[1:width + 1]
    bias = parameters[width + 1:]
    logits = design.logits(kernel, bias)
    logits -= logits.max(axis=1, keepdims=True)
    loss = float(np.mean(np.log(np.exp(logits).sum(axis=1)) -
                         (logits * one_hot).sum(axis=1)))
    yield Solution(kernel, bias, strength, int(result.nit), loss)


def solve(design: Design, strength: float) -> Solution:
  """The minimum at one ``strength``."""
  return next(solve_path(design, (strength,)))


def held_out_path(table: ngrams.DocumentNgrams, fitted_rows: np.ndarray,
                  held_out_rows: np.ndarray, vocabulary: ngrams.Vocabulary,
                  strengths: Sequence[float] = STRENGTHS
                  ) -> Iterator[Tuple[Solution, np.ndarray]]:
  """Fitted on the documents at ``fitted_rows`` of ``table`` over
  ``vocabulary``, at each strength: the solution and its logits for the
  documents at ``held_out_rows``."""
  held_out = Design.of(table, held_out_rows, vocabulary)
  for solution in solve_path(Design.of(table, fitted_rows, vocabulary),
                             strengths):
    yield solution, solution.logits(held_out)
