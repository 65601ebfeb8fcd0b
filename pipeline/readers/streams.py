"""The bytes of an input file, decompressed here rather than by Beam.

Beam's reader ends a compressed stream that is cut short as if the file ended
there, and raises a bare zlib.error on a corrupt one. Here both raise
CorruptFile, which names where the data stops, so that the source can keep
the records read before the fault and report the rest as one dead letter.
"""
import bz2
import lzma
from typing import Iterator, Optional
import zlib

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
import zstandard

_READ_BYTES = 64 << 10  # also how closely a corrupt byte is located
_DECOMPRESSION_ERRORS = (zlib.error, OSError, EOFError, lzma.LZMAError,
                         zstandard.ZstdError)


class CorruptFile(Exception):
  """A file that cannot be read past some point.

  ``position`` is where the lost records begin, in the unit of the format's
  record ids (a byte offset in the decompressed data, a row number, a record
  index); ``detail`` says what broke and at which byte of the file.
  """

  def __init__(self, position: int, detail: str):
    super().__init__(detail)
    self.position = position
    self.detail = detail

  def at(self, position: int) -> 'CorruptFile':
    """The same fault, reported from an earlier record's start."""
    return CorruptFile(position, self.detail)


def _decompressor(compression: str):
  if compression == CompressionTypes.GZIP:
    return zlib.decompressobj(zlib.MAX_WBITS | 16)
  if compression == CompressionTypes.DEFLATE:
    return zlib.decompressobj()
  if compression == CompressionTypes.BZIP2:
    return bz2.BZ2Decompressor()
  if compression == CompressionTypes.LZMA:
    return lzma.LZMADecompressor()
  if compression == CompressionTypes.ZSTD:
    return zstandard.ZstdDecompressor().decompressobj()
  raise ValueError(f'unknown compression {compression!r}')


def chunks(path: str, compression: str, start: int = 0,
           listed_size: Optional[int] = None) -> Iterator[bytes]:
  """The bytes of ``path`` from ``start`` on, decompressed, in chunks.

  ``compression`` is a CompressionTypes value; AUTO goes by the extension. A
  compressed file can only be read from its start. ``listed_size`` is the
  file's size when the job matched it, which its ranges were planned on: a
  file that ends short of it shrank while the job read it, and what it lost
  cannot be named record by record. Raises CorruptFile.
  """
  if compression == CompressionTypes.AUTO:
    compression = CompressionTypes.detect_compression_type(path)
  with FileSystems.open(path, 'application/octet-stream',
                        CompressionTypes.UNCOMPRESSED) as handle:
    if compression == CompressionTypes.UNCOMPRESSED:
      handle.seek(start)
      position = start
      while chunk := handle.read(_READ_BYTES):
        position += len(chunk)
        yield chunk
      _check_not_shrunk(position, position, listed_size)
      return
    if start:
      raise ValueError(f'{path} is compressed: it cannot be read from {start}')
    yield from _decompressed(handle, compression, listed_size)


def _check_not_shrunk(position: int, end: int,
                      listed_size: Optional[int]) -> None:
  """CorruptFile, lost from ``position`` on, where a file ended at byte
  ``end``, short of the ``listed_size`` it had when it was matched."""
  if listed_size is not None and end < listed_size:
    raise CorruptFile(position, (
        f'the file ends at byte {end}, short of the {listed_size} bytes it '
        'held when the job matched it: it shrank while it was read'))


def _decompressed(handle, compression: str,
                  listed_size: Optional[int]) -> Iterator[bytes]:
  """A compressed stream's data, checked to its end marker and to the
  file's size when it was matched."""
  decompressor = _decompressor(compression)
  read = produced = 0
  pending = b''
  while True:
    if not pending:
      pending = handle.read(_READ_BYTES)
      if not pending:
        if read and not decompressor.eof:
          raise CorruptFile(produced, (
              f'the {compression} data stops at byte {read}, the end of the '
              'file, before the end of its stream: the file is truncated'))
        _check_not_shrunk(produced, read, listed_size)
        return
      read += len(pending)
    if decompressor.eof:
      # More data after a complete stream: a concatenated one (gzip -c a b).
      decompressor = _decompressor(compression)
    try:
      data = decompressor.decompress(pending)
    except _DECOMPRESSION_ERRORS as error:
      raise CorruptFile(produced, (
          f'the {compression} data is corrupt in bytes '
          f'{read - len(pending)}-{read} of the file: {error}')) from error
    pending = decompressor.unused_data if decompressor.eof else b''
    if data:
      produced += len(data)
      yield data


class ByteReader:
  """Reads of exact sizes over chunks, for framed formats (TFRecord)."""

  def __init__(self, byte_chunks: Iterator[bytes]):
    self._chunks = byte_chunks
    self._buffer = bytearray()
    self.position = 0

  def _fill(self, size: int):
    while len(self._buffer) < size:
      chunk = next(self._chunks, None)
      if chunk is None:
        return
      self._buffer += chunk

  def read(self, size: int) -> bytes:
    """The next ``size`` bytes; fewer at the end of the file."""
    self._fill(size)
    data = bytes(self._buffer[:size])
    del self._buffer[:size]
    self.position += len(data)
    return data

  def skip(self, size: int) -> int:
    """Skips up to ``size`` bytes without holding them; how many it skipped."""
    left = size
    while left:
      self._fill(1)
      if not self._buffer:
        break
      step = min(left, len(self._buffer))
      del self._buffer[:step]
      left -= step
    self.position += size - left
    return size - left
