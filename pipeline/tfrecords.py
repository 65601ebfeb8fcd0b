"""Writing TFRecord files a batch of records at a time.

Beam's WriteToTFRecord takes one element per record; a transformed record
batch becomes thousands of elements, and the per-element overhead dominated
the preprocessing job. Here each element is a batch of records, framed as
TFRecords in one buffer, and written through Beam's file sink, which still
gives shard naming, temporary files and exactly-once finalization.
"""
import collections
import concurrent.futures
import io
from typing import Iterable

import apache_beam as beam
from apache_beam import coders
from apache_beam.io import filebasedsink
from apache_beam.io import iobase
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.tfrecordio import _TFRecordUtil


def frame(records: Iterable[bytes]) -> bytes:
  """Records in TFRecord framing (length, crcs), concatenated."""
  buffer = io.BytesIO()
  for record in records:
    _TFRecordUtil.write_record(buffer, record)
  return buffer.getvalue()


class _FramedRecordsSink(filebasedsink.FileBasedSink):
  """A file sink whose elements are already-framed runs of TFRecords."""

  def __init__(self, file_path_prefix, file_name_suffix):
    super().__init__(
        file_path_prefix, coder=coders.BytesCoder(),
        file_name_suffix=file_name_suffix, num_shards=0,
        shard_name_template=None, mime_type='application/octet-stream',
        compression_type=CompressionTypes.AUTO)

  def open(self, temp_path):
    return _WriteBehind(super().open(temp_path))

  def write_encoded_record(self, file_handle, encoded_value):
    file_handle.write(encoded_value)


class _WriteBehind:
  """A file handle whose writes run in order on a thread of their own.

  Compressing is most of writing a gzip file, and zlib lets go of the GIL
  while it compresses: on its own thread, a batch's compression overlaps
  with the work on the next batch instead of following it (about a sixth
  of the preprocessing job's time at 250,000 documents).
  """

  # Writes waiting at most: bounds the batches held in memory.
  _QUEUED = 4

  def __init__(self, handle):
    self._handle = handle
    self._thread = concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix='write-behind')
    self._queued = collections.deque()

  def write(self, data: bytes) -> None:
    while len(self._queued) >= self._QUEUED:
      self._queued.popleft().result()  # a failed write raises here
    self._queued.append(self._thread.submit(self._handle.write, data))

  def close(self) -> None:
    try:
      while self._queued:
        self._queued.popleft().result()
    finally:
      self._thread.shutdown()
      self._handle.close()


class WriteTFRecordBatches(beam.PTransform):
  """Writes a PCollection of record lists as sharded TFRecord files.

  Compression follows the suffix, as with WriteToTFRecord ('.gz' -> gzip).
  """

  def __init__(self, file_path_prefix: str, file_name_suffix: str = ''):
    super().__init__()
    self._sink = _FramedRecordsSink(file_path_prefix, file_name_suffix)

  def expand(self, batches):
    return (batches
            | 'Frame' >> beam.Map(frame)
            | 'Write' >> iobase.Write(self._sink))
