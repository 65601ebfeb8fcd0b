"""Progress while a job runs: a line every so many seconds, and counters.

The jobs' counting steps (``records.CountingDoFn``) add what they read,
write and reject to Beam counters every ``FLUSH_EVERY`` records, not only at
a bundle's end, so a runner's UI (Dataflow's, Flink's) moves while a long
bundle runs. On the local runners, where bundles run in the launcher's
process (FnApiRunner in memory or multi-threaded, the jobs' default), the
same counts also reach the launcher's ``Reporter``, which logs a line every
``--progress_seconds`` (and none where no count reaches it):

    score: 1,204,000 read, 1,198,000 scored, 6,000 rejected; 5,230/s;
    0:03:50 elapsed; about 0:15:22 left

The time left is estimated where the input's size in records can be:
``estimate_records``.
"""
import collections
import contextlib
import datetime
import logging
import threading
import time
from typing import Dict, Iterator, Optional

from cli import flags
from pipeline import readers
from schemas import raw

# Records a counting step handles between two updates of its counters.
FLUSH_EVERY = 5000
# A record's bytes besides its text (id, label, quoting), for the estimate.
_FIELDS_BYTES = 40
# What the progress line counts, by the count kinds of ``records``; LEARNT
# is what a first pass over the input read (the preprocessing job's, which
# learns the vocabulary before the second pass writes).
READ, WRITTEN, REJECTED, LEARNT = 'read', 'written', 'rejected', 'learnt'


def _duration(seconds: float) -> str:
  return str(datetime.timedelta(seconds=round(seconds)))


class Reporter:
  """Sums the counts a process's steps report and logs them on a thread of
  its own every ``interval`` seconds."""

  def __init__(self, job: str, written_as: str, interval: float,
               expected: Optional[int] = None, passes: int = 1):
    self._job = job
    self._passes = passes
    self._written_as = written_as
    self._interval = interval
    self._expected = expected
    self._counts = collections.Counter()
    self._lock = threading.Lock()
    self._started = time.monotonic()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name='progress',
                                    daemon=True)

  def add(self, counts: Dict[str, int]) -> None:
    with self._lock:
      self._counts.update(counts)

  def line(self) -> Optional[str]:
    """The progress line; None while no count has reached this process, as
    on a runner whose workers run in other processes (multi_processing,
    Dask, a portable runner, Dataflow): there a line of zeros would say the
    job is stuck, and the runner's UI shows the counters."""
    with self._lock:
      if not self._counts:
        return None
      read, written, rejected, learnt = (
          self._counts[READ], self._counts[WRITTEN], self._counts[REJECTED],
          self._counts[LEARNT])
    elapsed = time.monotonic() - self._started
    done = read + learnt  # records read by every pass
    rate = done / elapsed if elapsed else 0.0
    left = ''
    to_read = self._passes * (self._expected or 0) - done
    if rate and to_read > 0:
      left = f'; about {_duration(to_read / rate)} left'
    counts = (f'{read:,} read, {written:,} {self._written_as}, {rejected:,} '
              'rejected' if read or not learnt else
              f'first pass, {learnt:,} read')
    return (f'{self._job}: {counts}; {rate:,.0f} records/s; '
            f'{_duration(elapsed)} elapsed{left}')

  def _run(self) -> None:
    while not self._stop.wait(self._interval):
      line = self.line()
      if line:
        logging.info('%s', line)

  def start(self) -> None:
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    self._thread.join()


# The longest a job on a cluster runner may show no progress: well above
# the longest quiet spell of a healthy job (docs/runners.md#bounded-waits).
STALL_SECONDS = 600


def add_argument(parser) -> None:
  parser.add_argument(
      '--progress_seconds', type=flags.number(0, 24 * 3600), default=30,
      help='Log a progress line this often while the pipeline runs in this '
      'process (the local runners) or on a Flink or Spark cluster; 0 never.')
  parser.add_argument(
      '--stall_seconds', type=flags.number(0, 7 * 24 * 3600),
      default=STALL_SECONDS,
      help='Cancel the job and fail (exit status 6) when its Flink or Spark '
      'cluster shows no progress for this long (no task finished, no record '
      'moved: a lost worker, a stopped master); 0 waits for ever.')


# The reporter of this process while a job runs in it, if any.
_REPORTERS = []


def report(counts: Dict[str, int]) -> None:
  """Adds a counting step's counts to this process's reporter, if one
  runs (none in a remote worker: there the counters show progress)."""
  for reporter in _REPORTERS:
    reporter.add(counts)


@contextlib.contextmanager
def reporting(job: str, written_as: str, interval: float,
              expected: Optional[int] = None,
              passes: int = 1) -> Iterator[None]:
  """Logs progress every ``interval`` seconds (0: never) while the block
  runs, of a job that reads its ``expected`` records (if known) ``passes``
  times."""
  if interval <= 0:
    yield
    return
  reporter = Reporter(job, written_as, interval, expected, passes)
  _REPORTERS.append(reporter)
  reporter.start()
  try:
    yield
  finally:
    _REPORTERS.remove(reporter)
    reporter.stop()


def estimate_records(matched: readers.Input, sample) -> Optional[int]:
  """The input's records, as far as they can be told before reading it:
  its files for a format of one document a file; else its bytes over the
  mean size of the sampled records (JSON lines, CSV rows, text lines: their
  text and a little for the other fields); None for compressed or binary
  inputs, or without a sample."""
  files = [entry for entry in matched.entries if entry.problem is None]
  if matched.format in ('files', 'email'):
    return len(files)
  if (matched.format not in ('jsonl', 'csv', 'tsv', 'text') or not sample or
      any(readers.is_compressed(entry.path) for entry in files)):
    return None
  mean = _FIELDS_BYTES + sum(len(record.get(raw.TEXT) or '')
                             for record in sample) / len(sample)
  return int(sum(entry.size for entry in files) / mean)
