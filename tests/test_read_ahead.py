"""Records read ahead on a thread: the same records in the same order,
errors where they happened, and a thread that ends with the reading."""
import threading

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from pipeline.readers import read_ahead
from schemas import raw


def _records(texts):
  for index, text in enumerate(texts):
    yield {raw.ID: str(index), raw.TEXT: text}


def _reading_threads():
  return [thread for thread in threading.enumerate()
          if thread.name == 'read-ahead']


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(max_size=40), max_size=300),
       depth=st.integers(1, 4), chunk_records=st.integers(1, 50),
       chunk_chars=st.integers(1, 200))
def test_every_record_comes_out_once_in_order(texts, depth, chunk_records,
                                              chunk_chars):
  expected = list(_records(texts))
  got = list(read_ahead.read_ahead(_records(texts), depth, chunk_records,
                                   chunk_chars))
  assert got == expected
  chunks = list(read_ahead.read_chunks_ahead(_records(texts), depth,
                                             chunk_records, chunk_chars))
  assert [record for chunk in chunks for record in chunk] == expected
  assert all(0 < len(chunk) <= chunk_records for chunk in chunks)
  assert not _reading_threads()


def test_an_error_comes_after_the_records_read_before_it():
  def failing():
    yield from _records(['a', 'b', 'c'])
    raise OSError('the disk went away')

  got = []
  with pytest.raises(OSError, match='the disk went away'):
    for record in read_ahead.read_ahead(failing(), chunk_records=2):
      got.append(record[raw.TEXT])
  assert got == ['a', 'b', 'c']
  assert not _reading_threads()


def test_closing_early_ends_the_thread_and_closes_the_reading():
  pulled, closed = [], []

  def endless():
    try:
      index = 0
      while True:
        pulled.append(index)
        yield {raw.ID: str(index), raw.TEXT: 'x'}
        index += 1
    finally:
      closed.append(True)

  records = read_ahead.read_ahead(endless(), depth=3, chunk_records=10)
  assert [next(records)[raw.ID] for _ in range(15)] == [
      str(index) for index in range(15)]
  records.close()
  assert closed == [True]
  assert not _reading_threads()
  # Bounded: the two chunks taken, three queued, one in hand, one more
  # built before the reader saw the stop.
  assert len(pulled) <= (2 + 3 + 1 + 1) * 10


def test_long_texts_make_short_chunks():
  chunks = read_ahead._Chunks(records=1000, chars=250)  # pylint: disable=protected-access
  sizes = [len(chunks.add(record))
           for record in _records(['x' * 100] * 10)]
  assert sizes == [0, 0, 3, 0, 0, 3, 0, 0, 3, 0]
  assert len(chunks.take()) == 1
