"""Progress while a job runs: the line, its estimate, and a run that logs
it."""
import logging
import re

from pipeline import progress
from pipeline import readers
from pipeline import score
from tests.conftest import synthetic_reviews
from tests.conftest import write_jsonl


def test_the_line_counts_rates_and_the_time_left(monkeypatch):
  now = [100.0]
  monkeypatch.setattr(progress.time, 'monotonic', lambda: now[0])
  reporter = progress.Reporter('score', 'scored', 30, expected=1000)
  # Nothing counted in this process (the workers run elsewhere): no line
  # of zeros.
  assert reporter.line() is None
  reporter.add({progress.READ: 300, progress.WRITTEN: 290,
                progress.REJECTED: 10})
  now[0] += 60
  assert reporter.line() == ('score: 300 read, 290 scored, 10 rejected; 5 '
                             'records/s; 0:01:00 elapsed; about 0:02:20 left')
  two_passes = progress.Reporter('preprocess', 'written', 30, expected=1000,
                                 passes=2)
  two_passes.add({progress.LEARNT: 500})
  now[0] += 50
  assert two_passes.line() == (
      'preprocess: first pass, 500 read; 10 records/s; 0:00:50 elapsed; '
      'about 0:02:30 left')


def test_the_input_is_estimated_from_its_size_and_a_sample(tmp_path):
  rows = synthetic_reviews(400, 3)
  corpus = write_jsonl(tmp_path / 'in.jsonl', rows)
  matched = readers.resolve_input(str(corpus), 'auto')
  config = readers.ReadConfig(format=matched.format, label_field=None)
  sample = readers.sample(matched, config, 100)
  estimate = progress.estimate_records(matched, sample)
  assert 0.7 * len(rows) < estimate < 1.3 * len(rows)
  assert progress.estimate_records(matched, []) is None


def test_a_run_logs_its_progress(trained, tmp_path, caplog):
  model_dir, _, _ = trained
  corpus = write_jsonl(tmp_path / 'in.jsonl', synthetic_reviews(12000, 4))
  with caplog.at_level(logging.INFO):
    # Batches of 1,000: several are scored between two flushes of the read
    # count, each a chance for a line, so that the test does not depend on
    # when the reporter wakes.
    score.run([f'--input={corpus}', f'--model_dir={model_dir}',
               f'--output_dir={tmp_path / "out"}', '--batch_size=1000',
               '--progress_seconds=0.05'])
  lines = [record.getMessage() for record in caplog.records
           if re.match(r'score: [\d,]+ read', record.getMessage())]
  assert lines, 'no progress line'
  assert re.match(r'score: [\d,]+ read, [\d,]+ scored, [\d,]+ rejected; '
                  r'[\d,]+ records/s; \d+:\d\d:\d\d elapsed', lines[-1])
  # The counts move while the run goes, a flush every FLUSH_EVERY records.
  reads = [int(re.match(r'score: ([\d,]+)', line).group(1).replace(',', ''))
           for line in lines]
  assert any(0 < read < 12000 for read in reads)
