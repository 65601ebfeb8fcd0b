"""One reading layer for every Beam job: any supported corpus -> raw records.

The pattern is matched once (``matching``): regular files are read by their
paths, taken literally, and any other path it matches (a dangling symbolic
link, a FIFO, a folder) is an unreadable_file dead letter. Each format is a
Beam ``FileBasedSource`` (``sources``) whose files are read as byte ranges
(``ranges``), so that large files are read in parallel and many small files
spread over the workers, each range parsed on a thread of its own ahead of
the steps that take its records (``read_ahead``); folders of documents are
read one file a document (``documents``). Every record is a dict keyed by
``schemas.raw`` names. A record the reader cannot parse is still yielded,
with ``reason`` set (``rows.rejection``), so that the job can count it and
send it to the dead letters: readers never drop and never raise, whatever a
record or a file holds. Any exception parsing one record is that record's
malformed_record dead letter; a file that breaks off mid-way
(``streams.CorruptFile``) keeps what was read before the fault and is one
corrupt_file dead letter for the rest; any other exception reading a file is
its unreadable_file dead letter.

The jobs need only the names this package exports.
"""
import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes

from pipeline.readers import documents
from pipeline.readers import matching
from pipeline.readers import ranges
from pipeline.readers import read_ahead
from pipeline.readers import sources
from pipeline.readers.config import FORMATS
from pipeline.readers.config import Input
from pipeline.readers.config import ReadConfig
from pipeline.readers.config import ReaderError
from pipeline.readers.config import add_reader_arguments
from pipeline.readers.config import format_of
from pipeline.readers.config import is_compressed
from pipeline.readers.config import read_config_from_args
from pipeline.readers.config import resolve_input
from pipeline.readers.documents import read_document
from pipeline.readers.matching import files as matched_files
from pipeline.readers.sampling import sample
from pipeline.readers.sampling import sample_covers

# read_document is for bench/train.py, which reads corpora without Beam.
__all__ = ('FORMATS', 'Input', 'ReadConfig', 'ReaderError', 'ReadRecords',
           'add_reader_arguments', 'format_of', 'is_compressed',
           'matched_files', 'read_config_from_args', 'read_document',
           'resolve_input', 'sample', 'sample_covers')

_DESIRED_SPLIT_BYTES = 64 << 20
_FILES_PER_READ = 100


class ReadRecords(beam.PTransform):
  """Reads raw-record dicts from every file matching a pattern; with
  ``chunked``, lists of them as they were read (``read_ahead``), an element
  a list, for steps that take records a chunk at a time.

  ``pattern`` and ``config.format`` should come from ``resolve_input``.
  """

  def __init__(self, pattern: str, config: ReadConfig, chunked: bool = False):
    super().__init__()
    if config.format not in FORMATS:
      raise ReaderError(f'resolve the format first, not {config.format!r}')
    self._pattern = pattern
    self._fmt = config.format
    self._config = config
    self._chunked = chunked

  def expand(self, pbegin):
    matched = (pbegin
               | 'Pattern' >> beam.Create([self._pattern])
               | 'Match' >> beam.FlatMap(matching.entries))
    if self._fmt in ('files', 'email'):
      # A source per file costs a split per file; for many small documents,
      # spreading groups of paths over the workers costs less.
      return (matched
              | 'Group' >> beam.BatchElements(
                  min_batch_size=_FILES_PER_READ, max_batch_size=_FILES_PER_READ)
              | 'Spread' >> beam.Reshuffle()
              | 'ReadDocuments' >> beam.FlatMap(
                  _read_documents, self._config, self._fmt == 'email',
                  self._chunked))
    splittable = self._fmt in ('jsonl', 'text', 'parquet') or (
        self._fmt in ('csv', 'tsv') and self._config.csv_splittable)
    compression = (CompressionTypes.UNCOMPRESSED if self._fmt == 'parquet'
                   else CompressionTypes.AUTO)
    return (matched
            | 'Ranges' >> beam.FlatMap(ranges.split, splittable, compression,
                                       _DESIRED_SPLIT_BYTES)
            | 'Spread' >> beam.Reshuffle()
            | 'ReadRanges' >> beam.FlatMap(
                _read_range_ahead,
                sources.source_factory(self._fmt, self._config),
                self._chunked))


def _read_range_ahead(file_range: ranges.FileRange, source_from_file,
                      chunked: bool):
  """A range's records, or their chunks, parsed on a reading thread
  (``read_ahead``)."""
  read = read_ahead.read_chunks_ahead if chunked else read_ahead.read_ahead
  return read(ranges.read(file_range, source_from_file))


def _read_documents(paths, config: ReadConfig, email: bool, chunked: bool):
  """A group of documents' records, or them as one chunk."""
  records = documents.read_documents(paths, config, email)
  return [records] if chunked else records
