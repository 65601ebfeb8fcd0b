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


def _oracle_accuracy(rows):
  """The expected accuracy of a classifier that knows every class's
  phrases: it counts each class's phrases in a ticket (its spelling slips
  undone) and takes the class of the most, a tie by a fair coin."""
  unslipped = {slip: word for word, slip in tickets.SLIPS.items()}
  phrase_class = {phrase.lower(): label for label, phrases in
                  tickets.PHRASES.items() for phrase in phrases}
  expected = 0.0
  for _, text, label in rows:
    found = collections.Counter()
    for part in text.rstrip('.!?').split('. '):
      words = [unslipped.get(word, word) for word in part.lower().split()]
      if ' '.join(words) in phrase_class:
        found[phrase_class[' '.join(words)]] += 1
    most = max(found.values())
    leaders = [name for name, count in found.items() if count == most]
    expected += (label in leaders) / len(leaders)
  return expected / len(rows)


def test_no_classifier_expects_more_than_the_ceiling():
  rows = tickets.tickets(count=40_000, seed=tickets.SEED + 7)
  # Three standard errors of an accuracy near 0.93 over 40,000 tickets.
  assert abs(_oracle_accuracy(rows) - tickets.accuracy_ceiling()) < 0.004
  assert 0.93 < tickets.accuracy_ceiling() < 0.94
