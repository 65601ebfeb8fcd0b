"""The frames of a TFRecord file, CRC-checked.

A frame is a little-endian uint64 length, the masked CRC32-C of those 8
bytes, the data, and the masked CRC32-C of the data. A bad data CRC spoils
one record: its length is sound, so reading goes on after it. A bad length
CRC leaves nothing to find the next frame by: the rest of the file is lost.
"""
import struct
import sys
from typing import Iterator, NamedTuple, Optional

# Installed with apache-beam[gcp] (google-cloud-storage needs it); Beam's own
# TFRecord reader uses it too.
import google_crc32c

from pipeline.readers import streams
from schemas import rejected

_HEADER = struct.Struct('<QI')
_DATA_CRC = struct.Struct('<I')
_MASK_DELTA = 0xa282ead8


def masked_crc(data: bytes) -> int:
  """TFRecord's checksum: CRC32-C, rotated and offset ("masked")."""
  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xffffffff


class Frame(NamedTuple):
  """A record's data, or the reason and detail of its dead letter."""
  index: int
  offset: int
  data: Optional[bytes]
  reason: Optional[str] = None
  detail: str = ''


def frames(reader: streams.ByteReader, max_bytes: int) -> Iterator[Frame]:
  """Every frame of a file; one over ``max_bytes`` is skipped unread.

  Raises CorruptFile, positioned at the index of the first frame lost, when a
  length fails its CRC or the compressed stream breaks.
  """
  index = 0
  try:
    while True:
      frame = _next_frame(reader, index, max_bytes)
      if frame is None:
        return
      yield frame
      index += 1
  except streams.CorruptFile as error:
    raise error.at(index) from error


def _next_frame(reader: streams.ByteReader, index: int,
                max_bytes: int) -> Optional[Frame]:
  offset = reader.position
  header = reader.read(_HEADER.size)
  if not header:
    return None
  cut_short = Frame(index, offset, None, rejected.MALFORMED_RECORD, (
      f'the record at byte {offset} is cut short by the end of the file'))
  if len(header) < _HEADER.size:
    return cut_short
  length, length_crc = _HEADER.unpack(header)
  if masked_crc(header[:8]) != length_crc:
    end = reader.position + reader.skip(sys.maxsize)
    raise streams.CorruptFile(index, (
        f'the length of the record at byte {offset} fails its CRC: bytes '
        f'{offset}-{end} of the file cannot be read'))
  if length > max_bytes:
    if reader.skip(length + _DATA_CRC.size) < length + _DATA_CRC.size:
      return cut_short
    return Frame(index, offset, None, rejected.TEXT_TOO_LONG, (
        f'a record of {length} bytes at byte {offset}, over the '
        f'{max_bytes}-byte bound'))
  data = reader.read(length)
  data_crc = reader.read(_DATA_CRC.size)
  if len(data_crc) < _DATA_CRC.size:
    return cut_short
  if masked_crc(data) != _DATA_CRC.unpack(data_crc)[0]:
    return Frame(index, offset, None, rejected.MALFORMED_RECORD, (
        f'the data of the record at byte {offset} fails its CRC'))
  return Frame(index, offset, data)
