"""The benchmarks' 500 tickets: the committed file is the generator's,
another seed draws other tickets of the same make, and the accuracy no
classifier can expect to pass is what an oracle reading them reaches."""
import collections
import csv

from bench import tickets


def _rows(path):
  with open(path, newline='', encoding='utf-8') as handle:
    return [tuple(row.values()) for row in csv.DictReader(handle)]


def test_the_committed_tickets_are_the_generators(tmp_path):
  drawn = tmp_path / 'again' / 'tickets.csv'
  tickets.write(str(drawn))
  assert _rows(drawn) == _rows(tickets.TICKETS)


def test_another_seed_draws_other_tickets_of_the_same_make(tmp_path):
  drawn = tmp_path / 'tickets.csv'
  tickets.write(str(drawn), seed=tickets.SEED + 1)
  rows, committed = _rows(drawn), _rows(tickets.TICKETS)
  assert len(rows) == len(committed) == tickets.COUNT
  assert {text for _, text, _ in rows} != {text for _, text, _ in committed}
  # As many of each class, give or take the mislabelled few.
  by_label = collections.Counter(label for _, _, label in rows)
  assert set(by_label) == set(tickets.PHRASES)
  assert max(by_label.values()) - min(by_label.values()) < 0.1 * tickets.COUNT


def test_no_classifier_expects_more_than_the_ceiling():
  rows = tickets.tickets(count=40_000, seed=tickets.SEED + 7)
  oracle = tickets.oracle_accuracy([text for _, text, _ in rows],
                                   [label for _, _, label in rows])
  # Three standard errors of an accuracy near 0.93 over 40,000 tickets.
  assert abs(oracle - tickets.accuracy_ceiling()) < 0.004
  assert 0.93 < tickets.accuracy_ceiling() < 0.94


def test_fresh_tickets_hold_no_text_a_model_was_trained_on():
  committed = [text for _, text, _ in _rows(tickets.TICKETS)]
  texts, labels = tickets.fresh(committed)
  assert not set(texts) & set(committed)
  # Only the few texts a short ticket can repeat are left out.
  assert 0.9 * tickets.FRESH_COUNT < len(texts) < tickets.FRESH_COUNT
  assert collections.Counter(labels).keys() == tickets.PHRASES.keys()
  # The same draw each time: every benchmark run judges on these tickets.
  assert tickets.fresh(committed) == (texts, labels)
  assert len(tickets.fresh([])[0]) == tickets.FRESH_COUNT
