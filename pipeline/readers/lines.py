"""The lines of a text file as byte pieces: what the line formats share.

A line ends at \\n, \\r\\n or a lone \\r (old Mac files). In UTF-16 and UTF-32
a line end is one code unit at an offset that is a multiple of the unit's
width (\\n is b'\\n\\x00' in UTF-16-LE), so lines are found in the bytes
without decoding them: a byte range can start anywhere, the offset of every
line is exact, and bytes invalid in the encoding spoil only their own line.
A line longer than the reader's bound is handed out in pieces, never held
whole.
"""
import codecs
import dataclasses
from typing import Callable, Iterator, NamedTuple, Optional, Tuple

from pipeline.readers import streams

MARK_UNDECODABLE = 'readers.mark_undecodable'
_BOM = '\ufeff'


def _mark_undecodable(error: UnicodeDecodeError) -> Tuple[str, int]:
  """Like surrogateescape, but for any byte (surrogateescape refuses bytes
  under 0x80, which UTF-16 can find invalid): each invalid byte becomes a
  lone surrogate, so that the CSV row holding it is rejected as
  undecodable_text while the rest of the file decodes."""
  invalid = error.object[error.start:error.end]
  return ''.join(chr(0xDC00 + byte) for byte in invalid), error.end


codecs.register_error(MARK_UNDECODABLE, _mark_undecodable)


class Piece(NamedTuple):
  """A whole line, line end included, or a piece of an over-long one."""
  offset: int
  data: bytes
  ends_line: bool


@dataclasses.dataclass(frozen=True)
class TextEncoding:
  """How one file's bytes are split into lines and decoded."""
  codec: str  # with an explicit byte order, so a line decodes on its own
  unit: int  # bytes per code unit; every line starts at a multiple of it
  newline: bytes
  carriage_return: bytes

  @classmethod
  def of(cls, encoding: str, head: Callable[[], bytes]) -> 'TextEncoding':
    """The encoding of a file; ``head`` gives its first bytes when needed."""
    name = codecs.lookup(encoding).name
    if name in ('utf-16', 'utf-32'):
      # The byte order mark tells the order; without one, little-endian, as
      # Python's codec reads it on the machines the jobs run on.
      big_endian = codecs.BOM_UTF16_BE if name == 'utf-16' else (
          codecs.BOM_UTF32_BE)
      name += '-be' if head().startswith(big_endian) else '-le'
    elif name == 'utf-8-sig':
      name = 'utf-8'  # every file's byte order mark is dropped anyway
    newline = '\n'.encode(name)
    return cls(name, len(newline), newline, '\r'.encode(name))

  def decode(self, data: bytes, offset: int, errors: str = 'strict') -> str:
    """A line's text; the byte order mark that starts a file dropped."""
    text = data.decode(self.codec, errors)
    return text[1:] if offset == 0 and text.startswith(_BOM) else text

  def find_line_end(self, buffer: bytearray, start: int, search_from: int,
                    final: bool) -> Tuple[Optional[int], int]:
    """(The end of the line that starts at ``start``, or None when the
    buffer does not hold it yet; where to search from when it grows.)"""
    # Two finds, not one regular expression: bytes.find scans in C, and the
    # JSONL and text readers search every byte they read.
    position = search_from
    while True:
      newline = buffer.find(self.newline, position)
      carriage_return = buffer.find(self.carriage_return, position,
                                    len(buffer) if newline < 0 else newline)
      found = carriage_return if carriage_return >= 0 else newline
      if found < 0:
        # A line end may begin in the last, still incomplete code unit.
        whole_units = (len(buffer) - start) // self.unit * self.unit
        return None, max(search_from, start + whole_units)
      if (found - start) % self.unit:
        position = found + 1  # bytes inside a code unit
        continue
      end = found + self.unit
      if found == carriage_return:
        if buffer.startswith(self.newline, end):
          end += self.unit  # \r\n
        elif not final and len(buffer) - end < self.unit:
          return None, found  # \r: wait for a \n that may follow
      return end, end


def pieces(byte_chunks: Iterator[bytes], offset: int, encoding: TextEncoding,
           max_bytes: int) -> Iterator[Piece]:
  """The lines of a stream whose first byte is at ``offset``.

  A line of at most ``max_bytes`` is one piece; a longer one comes in pieces
  of ``max_bytes``, the last of which ends the line. Raises CorruptFile from
  the start of the first line not handed out whole.
  """
  buffer, start, search_from, final = bytearray(), 0, 0, False
  piece_bytes = max(max_bytes // encoding.unit, 1) * encoding.unit
  while True:
    end, search_from = encoding.find_line_end(buffer, start, search_from,
                                              final)
    if end is not None and end - start <= max_bytes:
      yield Piece(offset, bytes(buffer[start:end]), True)
    elif end is not None or len(buffer) - start > max_bytes:
      end = start + piece_bytes
      yield Piece(offset, bytes(buffer[start:end]), False)
    elif final:
      if len(buffer) > start:  # the last line, without a line end
        yield Piece(offset, bytes(buffer[start:]), True)
      return
    else:
      del buffer[:start]
      search_from, start = search_from - start, 0
      try:
        buffer += next(byte_chunks)
      except StopIteration:
        final = True
      except streams.CorruptFile as error:
        raise error.at(offset) from error
      continue
    offset += end - start
    start = search_from = end


def in_range(chunks_from: Callable[[int], Iterator[bytes]], range_tracker,
             encoding: TextEncoding, max_bytes: int) -> Iterator[Piece]:
  """The pieces of the lines whose first byte is in the tracker's range.

  ``chunks_from(offset)`` opens the file's bytes from an offset.
  """
  start = range_tracker.start_position() or 0
  skipping = start > 0
  if skipping:
    # A line belongs to the range its first byte is in: read from one code
    # unit before the first line start the range may hold, and skip the end
    # of the line the previous range owns (or just a line end).
    start = -(-start // encoding.unit) * encoding.unit - encoding.unit
  begins_line = True
  for piece in pieces(chunks_from(start), start, encoding, max_bytes):
    if skipping:
      skipping = not piece.ends_line
      continue
    if begins_line and not range_tracker.try_claim(piece.offset):
      return
    yield piece
    begins_line = piece.ends_line


def whole_lines(line_pieces: Iterator[Piece]
                ) -> Iterator[Tuple[int, bytes, bool]]:
  """(offset, line, too long) for each line; of a line too long to hand out
  whole, only its first piece."""
  skipping = False
  for piece in line_pieces:
    if not skipping:
      yield piece.offset, piece.data, not piece.ends_line
    skipping = not piece.ends_line
