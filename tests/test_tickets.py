"""The benchmarks' 500 tickets: the committed file is the generator's, and
another seed draws other tickets of the same make."""
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
