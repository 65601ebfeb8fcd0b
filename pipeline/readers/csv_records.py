"""CSV records from line pieces, each held in bounded memory.

The csv module parses the records. It takes a field up to its field size
limit and, past it, raises and starts a new record on the next line, in the
middle of the field: one lost quote or one huge field then turns every later
line of it into a record and eats the next good row. Here the lines of one
record are fed to the csv module only up to the reader's record bound; a
record that goes past it is read to its end by a scan that follows the same
quoting rules but keeps nothing, and becomes one dead letter. A quoted field
that is never closed runs to the end of the file, whatever its size: every
record after its quote is lost in it, so the file cannot be read to its end
(``streams.CorruptFile`` from the record's start), not one record's fault.
"""
import csv
import re
from typing import Iterator, List, NamedTuple, Optional

from pipeline.readers import lines
from pipeline.readers import streams
from schemas import rejected

_SNIPPET_CHARS = 200


class Record(NamedTuple):
  """A CSV row, or why the record at ``offset`` cannot be one."""
  offset: int
  row: Optional[List[str]]
  reason: Optional[str] = None
  detail: str = ''
  # The row's record as the file has it (its quotes kept, without its last
  # line end): what a dead letter of it shows.
  text: str = ''


class _QuoteScan:
  """Finds where a CSV record ends as the csv module does (strict, doubled
  quotes, no escape character), without keeping the record."""

  _FIELD_START, _UNQUOTED, _QUOTED, _QUOTE_IN_QUOTED = range(4)

  def __init__(self, delimiter: str):
    self._delimiter = delimiter
    self._unquoted_end = re.compile('[\r\n' + re.escape(delimiter) + ']')
    self._state = self._FIELD_START

  @property
  def in_quotes(self) -> bool:
    return self._state in (self._QUOTED, self._QUOTE_IN_QUOTED)

  def ends_record(self, text: str) -> bool:
    """Reads on; whether the record ends in ``text`` (at its line end)."""
    position = 0
    while position < len(text):
      if self._state == self._QUOTED:
        position = text.find('"', position) + 1
        if not position:
          return False
        self._state = self._QUOTE_IN_QUOTED
      elif self._state == self._QUOTE_IN_QUOTED:
        if text[position] == '"':  # a doubled quote, inside the field
          self._state, position = self._QUOTED, position + 1
        else:  # the closing quote; what follows is read unquoted
          self._state = self._UNQUOTED
      elif self._state == self._FIELD_START and text[position] == '"':
        self._state, position = self._QUOTED, position + 1
      else:
        match = self._unquoted_end.search(text, position)
        if match is None:
          self._state = self._UNQUOTED
          return False
        if match.group() != self._delimiter:
          return True
        self._state, position = self._FIELD_START, match.end()
    return False


class _Feed:
  """The decoded lines of one CSV record at a time, for a csv.reader.

  Ends the reader's input (StopIteration) when the record goes past
  ``max_bytes``, keeping what the scan of the rest of it needs.
  """

  def __init__(self, line_pieces: Iterator[lines.Piece],
               encoding: lines.TextEncoding, max_bytes: int):
    self._pieces = line_pieces
    self._encoding = encoding
    self._max_bytes = max_bytes
    self.exhausted = False  # the pieces have ended
    self.start_record()

  def start_record(self):
    self.record_start = None  # the offset of the record's first line
    self.overflow = None  # the piece that took the record past the bound
    self.record_lines = []  # the record's lines so far, within the bound
    self._size = 0

  def __iter__(self):
    return self

  def __next__(self) -> str:
    if self.overflow is not None:
      raise StopIteration
    piece = next(self._pieces, None)
    if piece is None:
      self.exhausted = True
      raise StopIteration
    if self.record_start is None:
      self.record_start = piece.offset
    self._size += len(piece.data)
    if not piece.ends_line or self._size > self._max_bytes:
      self.overflow = piece
      raise StopIteration
    line = self._encoding.decode(piece.data, piece.offset,
                                 lines.MARK_UNDECODABLE)
    self.record_lines.append(line)
    return line

  def record_text(self) -> str:
    """The record's lines, without the last one's line end."""
    text = ''.join(self.record_lines)
    for end in ('\r\n', '\n', '\r'):
      if text.endswith(end):
        return text[:-len(end)]
    return text

  def ends_in_quotes(self, delimiter: str) -> bool:
    """Whether the pieces ended inside a quoted field of the record."""
    scan = _QuoteScan(delimiter)
    for line in self.record_lines:
      scan.ends_record(line)
    return self.exhausted and scan.in_quotes

  def unterminated(self, start: str) -> streams.CorruptFile:
    return streams.CorruptFile(self.record_start, (
        f'unterminated quoted field: the record from byte '
        f'{self.record_start} runs {self._size} bytes to the end of the '
        f'file, every record after its quote in it: {start}'))

  def skip_overflow(self, delimiter: str) -> Record:
    """Reads past the rest of the record that overflowed: one dead letter."""
    scan = _QuoteScan(delimiter)
    for line in self.record_lines:
      scan.ends_record(line)
    start = ''.join(self.record_lines)[:_SNIPPET_CHARS]
    piece, ended = self.overflow, False
    while piece is not None and not ended:
      text = self._encoding.decode(piece.data, piece.offset,
                                   lines.MARK_UNDECODABLE)
      start = start or text[:_SNIPPET_CHARS]
      ended = scan.ends_record(text)
      piece = None if ended else next(self._pieces, None)
      self._size += len(piece.data) if piece else 0
    if scan.in_quotes and not ended:
      raise self.unterminated(start)
    return Record(self.record_start, None, rejected.TEXT_TOO_LONG, (
        f'a CSV record of {self._size} bytes from byte {self.record_start}, '
        f'over the {self._max_bytes}-byte bound: {start}'))


def records(line_pieces: Iterator[lines.Piece], encoding: lines.TextEncoding,
            delimiter: str, max_bytes: int) -> Iterator[Record]:
  """The CSV records in some line pieces; each record's offset is the byte
  offset of its first line. Raises CorruptFile from the start of the record
  the stream broke in."""
  # The csv module must never stop a field before the bound does; its limit
  # is per process, and only ever raised here.
  csv.field_size_limit(max(csv.field_size_limit(), max_bytes))
  feed = _Feed(line_pieces, encoding, max_bytes)
  reader = csv.reader(feed, delimiter=delimiter, strict=True)
  while True:
    feed.start_record()
    try:
      row = next(reader)
    except StopIteration:
      row = None
    except csv.Error as error:
      row = error
    except streams.CorruptFile as error:
      raise error.at(error.position if feed.record_start is None
                     else feed.record_start) from error
    if feed.overflow is not None:
      try:
        letter = feed.skip_overflow(delimiter)
      except streams.CorruptFile as error:
        raise error.at(feed.record_start) from error
      yield letter
      reader = csv.reader(feed, delimiter=delimiter, strict=True)
    elif row is None:
      return
    elif isinstance(row, csv.Error) and feed.ends_in_quotes(delimiter):
      raise feed.unterminated(''.join(feed.record_lines)[:_SNIPPET_CHARS])
    elif isinstance(row, csv.Error):
      yield Record(feed.record_start, None, rejected.MALFORMED_RECORD,
                   f'{row}: {feed.record_text()}')
    else:
      yield Record(feed.record_start, row, text=feed.record_text())
