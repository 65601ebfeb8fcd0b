"""The files a pattern matched, as byte ranges read by their paths.

Beam's ``ReadAllFiles`` matches every path it is handed again, as a
pattern, when it reads each range: a file named ``part[1].jsonl`` is then
read as whatever ``part1.jsonl`` names, and ``st*r/a.jsonl`` as both itself
and ``star/a.jsonl``. Here a range carries its file's path, which the
source opens as it is: matching happens once, in ``matching``.
"""
from typing import Callable, Dict, Iterator, NamedTuple, Optional

from apache_beam.io import filebasedsource
from apache_beam.io import range_trackers
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.restriction_trackers import OffsetRange

from pipeline.readers import matching
from pipeline.readers import rows
from schemas import rejected

OFFSET_INFINITY = range_trackers.OffsetRangeTracker.OFFSET_INFINITY


class FileRange(NamedTuple):
  """Bytes ``start`` to ``stop`` of a matched file (``stop`` infinite: the
  whole file, unsplit), or a matched path that cannot be read and why."""
  path: str
  start: int = 0
  stop: float = OFFSET_INFINITY
  problem: Optional[str] = None
  # The file's size when it was matched: the ranges are planned on it, and
  # a file that ends short of it lost records while it was read.
  size: Optional[int] = None


def split(entry: matching.Entry, splittable: bool, compression: str,
          desired_bytes: int) -> Iterator[FileRange]:
  """The ranges to read a matched entry in. An empty file has none, as in
  Beam: there is nothing in it to read, and an empty Parquet file would be
  taken for a truncated one."""
  if entry.problem:
    yield FileRange(entry.path, problem=entry.problem)
    return
  if not entry.size:
    return
  FileSystems.report_source_lineage(entry.path)
  if compression == CompressionTypes.AUTO:
    compression = CompressionTypes.detect_compression_type(entry.path)
  if splittable and compression == CompressionTypes.UNCOMPRESSED:
    for part in OffsetRange(0, entry.size).split(desired_bytes):
      yield FileRange(entry.path, part.start, part.stop, size=entry.size)
  else:
    yield FileRange(entry.path, size=entry.size)


def read(file_range: FileRange,
         source_from_file: Callable[[str, Optional[int]],
                                    filebasedsource.FileBasedSource]
         ) -> Iterator[Dict]:
  """The records of a range, read by the source ``source_from_file`` makes
  for its path and size when matched; an unreadable_file dead letter for a
  path that is no regular file."""
  path = file_range.path
  if file_range.problem:
    yield rows.rejection(path, path, rejected.UNREADABLE_FILE,
                         file_range.problem)
    return
  tracker = range_trackers.OffsetRangeTracker(file_range.start,
                                              file_range.stop)
  if file_range.stop == OFFSET_INFINITY:
    tracker = range_trackers.UnsplittableRangeTracker(tracker)
  yield from source_from_file(path, file_range.size).read_records(path,
                                                                 tracker)
