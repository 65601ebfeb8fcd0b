"""Records parsed on a thread of their own, ahead of the steps that take
them.

A Beam worker runs a fused stage on one thread. In the scoring job the
model step holds that thread for the whole of a batch, while TensorFlow
computes on threads of its own without the GIL; the next batch was read only
after, so the model waited for the reading and the reading for the model.
Read on a thread, the next records are parsed while the model computes.

How far ahead is bounded by text, not only by records, so that a corpus of
large documents holds no more in memory than one of short ones.

The records cross the thread in chunks, and a step that takes records a
chunk at a time can have them so (``read_chunks_ahead``): one Beam element
a chunk, not a record, costs the stage a thousandth of the per-element work.
"""
import contextlib
import queue
import threading
from typing import Dict, Iterator, List, NamedTuple

from schemas import raw

# Chunks handed over at once: a hand-over costs a lock, a record nothing.
CHUNK_RECORDS = 1024
CHUNK_CHARS = 1 << 20
# Chunks read ahead: enough for a scoring batch of short documents.
DEPTH = 8


class _End(NamedTuple):
  """The last hand-over: the reading ended, with ``error`` if it raised."""
  error: BaseException = None


class _Chunks:
  """Records gathered into chunks of at most ``records`` records or about
  ``chars`` characters of text."""

  def __init__(self, records: int, chars: int):
    self._records, self._chars = records, chars
    self.pending, self._pending_chars = [], 0

  def add(self, record: Dict) -> List[Dict]:
    """The chunk ``record`` completes, or an empty list."""
    self.pending.append(record)
    self._pending_chars += len(record.get(raw.TEXT) or '')
    if (len(self.pending) < self._records and
        self._pending_chars < self._chars):
      return []
    return self.take()

  def take(self) -> List[Dict]:
    chunk, self.pending, self._pending_chars = self.pending, [], 0
    return chunk


def read_ahead(records: Iterator[Dict], depth: int = DEPTH,
               chunk_records: int = CHUNK_RECORDS,
               chunk_chars: int = CHUNK_CHARS) -> Iterator[Dict]:
  """``records`` in their order, as ``read_chunks_ahead`` reads them."""
  with contextlib.closing(read_chunks_ahead(
      records, depth, chunk_records, chunk_chars)) as chunks:
    for chunk in chunks:
      yield from chunk


def read_chunks_ahead(records: Iterator[Dict], depth: int = DEPTH,
                      chunk_records: int = CHUNK_RECORDS,
                      chunk_chars: int = CHUNK_CHARS) -> Iterator[List[Dict]]:
  """``records`` in their order, in lists of at most ``chunk_records``
  records or about ``chunk_chars`` characters of text, taken from the
  iterator on a reading thread at most ``depth`` chunks ahead. What the
  reading raises is raised here after the records before it; once this
  generator is closed or exhausted, the thread has ended and ``records`` is
  closed."""
  handoff = queue.Queue(maxsize=depth)
  stop = threading.Event()

  def produce():
    chunks = _Chunks(chunk_records, chunk_chars)
    end = _End()
    try:
      try:
        for record in records:
          chunk = chunks.add(record)
          if chunk:
            handoff.put(chunk)
            if stop.is_set():
              break
      finally:
        getattr(records, 'close', lambda: None)()
    except BaseException as error:  # pylint: disable=broad-except
      end = _End(error)  # raised on the taking thread, where it belongs
    if chunks.pending and not stop.is_set():
      handoff.put(chunks.take())  # the records before the end, or the error
    handoff.put(end)

  reader = threading.Thread(target=produce, name='read-ahead', daemon=True)
  reader.start()
  taken = None
  try:
    while not isinstance(taken, _End):
      taken = handoff.get()
      if not isinstance(taken, _End):
        yield taken
    if taken.error:
      raise taken.error
  finally:
    stop.set()
    # Taking what is left unblocks a reader waiting for room; it sees the
    # stop before its next chunk and ends with one last hand-over.
    while not isinstance(taken, _End):
      taken = handoff.get()
    reader.join()
