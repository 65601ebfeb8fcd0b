"""What to read and how: the reading flags, their config, the input's format."""
import argparse
import codecs
import csv
import dataclasses
import os
import posixpath
from typing import Dict, List, Optional, Tuple

from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

from cli import flags
from pipeline.readers import matching

FORMATS = ('jsonl', 'csv', 'tsv', 'parquet', 'tfrecord', 'text', 'files',
           'email')
_EXTENSION_FORMATS = {
    '.jsonl': 'jsonl', '.ndjson': 'jsonl', '.json': 'jsonl',
    '.csv': 'csv', '.tsv': 'tsv',
    '.parquet': 'parquet', '.pq': 'parquet',
    '.tfrecord': 'tfrecord', '.tfrecords': 'tfrecord',
    '.eml': 'email',
    '.txt': 'text',
}
_COMPRESSION_EXTENSIONS = ('.gz', '.bz2', '.zst', '.deflate', '.lzma', '.xz')
_LINE_FORMATS = ('jsonl', 'csv', 'tsv', 'text')
# Formats whose records hold no field but the text (email has its headers).
_FIELDLESS_FORMATS = ('text', 'files')
# Encodings whose code unit is wider than a byte, by codecs.lookup name: their
# line ends are code units, found at offsets that are multiples of the width.
CODE_UNIT_BYTES = {'utf-16': 2, 'utf-16-le': 2, 'utf-16-be': 2,
                   'utf-32': 4, 'utf-32-le': 4, 'utf-32-be': 4}
# The longest encoding of one byte of text in any format read: a JSON \u
# escape, six code units.
_CODE_UNITS_PER_TEXT_BYTE = 6
# Room in a record for the fields besides the text: id, label, kept fields.
_OTHER_FIELDS_BYTES = 64 << 10


class ReaderError(ValueError):
  """A job-level problem with the input: no files, unknown format."""


@dataclasses.dataclass(frozen=True)
class ReadConfig:
  """How to read records: the format and where text, label, id and split are."""
  format: str = 'auto'
  text_field: str = 'text'
  label_field: Optional[str] = 'label'
  id_field: Optional[str] = 'id'
  # --id_field was given: the records must have that field, where by
  # default a record without an id field gets its position.
  id_field_required: bool = False
  split_field: Optional[str] = None
  # A field (an email header, for email) read as raw.GROUP.
  group_field: Optional[str] = None
  csv_columns: Optional[Tuple[str, ...]] = None  # None: the first row names them
  csv_delimiter: Optional[str] = None  # None: ',' for csv, tab for tsv
  csv_splittable: bool = False
  encoding: str = 'utf-8'
  max_text_bytes: int = 1 << 20
  keep_fields: Tuple[str, ...] = ()  # passed through as raw.KEPT
  # Readers report a corrupt file the same either way; the jobs choose their
  # exit status from it.
  allow_corrupt_files: bool = False
  # Each record read from a row of named fields lists them (raw.FIELDS):
  # the launcher's sample, for the jobs to name the fields an input has.
  list_fields: bool = False

  def __post_init__(self):
    # An encoding the reader cannot use is a job-level error, found before
    # the pipeline starts rather than as a traceback on a worker.
    try:
      name = codecs.lookup(self.encoding).name
      line_ends = '\r\n'.encode(name)
    except LookupError as error:
      raise ReaderError(
          f'unknown encoding {self.encoding!r}: {error}') from error
    if (self.format in _LINE_FORMATS and name not in CODE_UNIT_BYTES and
        name != 'utf-8-sig' and line_ends != b'\r\n'):
      raise ReaderError(f'encoding {self.encoding!r} is not supported for '
                        f'{self.format}: its line ends are not ASCII bytes')
    if self.csv_delimiter is not None:
      _check_csv_delimiter(self.csv_delimiter)
    if self.group_field and self.format in _FIELDLESS_FORMATS:
      raise ReaderError(
          f'--group_field: {self.format} records have no fields; take the '
          'group from the id with --group_pattern')

  @property
  def named_fields(self) -> Dict[str, str]:
    """The fields the records must have, by the flag that names them
    (``text_field``: ``'body'``)."""
    named = {'text_field': self.text_field, 'label_field': self.label_field,
             'id_field': self.id_field if self.id_field_required else None,
             'split_field': self.split_field,
             'group_field': self.group_field}
    return {flag: name for flag, name in named.items() if name}

  @property
  def max_record_bytes(self) -> int:
    """The most bytes a reader holds of one record: a line, a CSV record, a
    TFRecord. A longer record is rejected as text_too_long without being read
    whole, so that one runaway record (a lost quote, a file without line
    ends) cannot take all the memory; the bound leaves room for the longest
    encoding of max_text_bytes of text and for the other fields.
    """
    unit = CODE_UNIT_BYTES.get(codecs.lookup(self.encoding).name, 1)
    return (_CODE_UNITS_PER_TEXT_BYTE * unit * self.max_text_bytes +
            _OTHER_FIELDS_BYTES)


def _check_csv_delimiter(delimiter: str) -> None:
  """ReaderError unless ``delimiter`` is one character the csv module takes,
  given as itself or as an escape (``\\t``): the csv module would raise
  only once the pipeline reads, as a traceback."""
  try:
    character = codecs.decode(delimiter, 'unicode_escape')
    csv.reader([], delimiter=character)
  except (TypeError, ValueError) as error:  # UnicodeDecodeError is one
    raise ReaderError(f'--csv_delimiter={delimiter!r} is not one character '
                      f'(or an escape such as \\t): {error}') from error
  if character in '\r\n':
    raise ReaderError('--csv_delimiter cannot be a line break')


def add_reader_arguments(parser: argparse.ArgumentParser):
  """The reading flags every job shares."""
  group = parser.add_argument_group('input')
  group.add_argument('--input', required=True,
                     help='File pattern (glob, ** allowed) or folder to read.')
  group.add_argument('--format', default='auto', choices=('auto',) + FORMATS,
                     help='Input format; auto picks it from the extension, '
                     'and a folder is read as one document per file.')
  group.add_argument('--text_field', default='text',
                     help='Field holding the text to classify (csv, tsv, '
                     'jsonl, parquet, tfrecord).')
  group.add_argument('--id_field', default=None,
                     help='Field with each record\'s id, which the records '
                     'must have; a record whose field holds no id gets its '
                     'source file + position, and is counted. Not given: '
                     f'the field {ReadConfig.id_field} where a record has '
                     'one, else its position; empty (--id_field=): '
                     'positions.')
  group.add_argument('--csv_columns', default=None,
                     help='Comma-separated column names for CSV/TSV files '
                     'without a header row.')
  group.add_argument('--csv_delimiter', default=None,
                     help='One character between CSV fields, itself or an '
                     'escape such as \\t; default: , for csv, tab for tsv.')
  group.add_argument('--csv_splittable', action='store_true',
                     help='Split CSV files at line boundaries for parallel '
                     'reads; only safe when no quoted field holds a newline.')
  group.add_argument('--encoding', default='utf-8',
                     help='Text encoding of the input; records with bytes '
                     'invalid in it are rejected (emails replace them).')
  group.add_argument('--max_text_bytes', type=flags.integer(1),
                     default=1 << 20,
                     help='Records with more text than this are rejected.')
  group.add_argument('--allow_corrupt_files', action='store_true',
                     help='Exit 0 when an input file is truncated, '
                     'corrupt or unreadable (by default the job exits 3); '
                     'either way its readable records are used and the rest '
                     'of it is one corrupt_file or unreadable_file dead '
                     'letter.')
  return group


def read_config_from_args(args, **overrides) -> ReadConfig:
  values = dict(
      format=args.format,
      text_field=args.text_field,
      id_field=(ReadConfig.id_field if args.id_field is None else
                args.id_field or None),
      id_field_required=bool(args.id_field),
      csv_columns=(tuple(c.strip() for c in args.csv_columns.split(','))
                   if args.csv_columns else None),
      csv_delimiter=args.csv_delimiter,
      csv_splittable=args.csv_splittable,
      encoding=args.encoding,
      max_text_bytes=args.max_text_bytes,
      allow_corrupt_files=args.allow_corrupt_files,
  )
  values.update(overrides)
  return ReadConfig(**values)


def _strip_compression(path: str) -> str:
  for extension in _COMPRESSION_EXTENSIONS:
    if path.endswith(extension):
      return path[:-len(extension)]
  return path


def _is_directory(path: str) -> bool:
  if any(c in path for c in '*?['):
    return False
  if isinstance(FileSystems.get_filesystem(path), LocalFileSystem):
    return os.path.isdir(path)
  # Object stores have no folders, only prefixes that objects share.
  return path.endswith('/') or (not FileSystems.exists(path) and bool(
      FileSystems.match([path.rstrip('/') + '/**'], [1])[0].metadata_list))


def is_compressed(path: str) -> bool:
  return path.endswith(_COMPRESSION_EXTENSIONS)


def format_of(path: str) -> Optional[str]:
  """The format a file's extension names, compression aside; None when it
  names none."""
  extension = posixpath.splitext(_strip_compression(path))[1]
  return _EXTENSION_FORMATS.get(extension.lower())


def _format_of_files(paths) -> str:
  """The one format the files' extensions name; ReaderError when one names
  none, or two name different ones: a pattern over a.csv and b.jsonl is not
  read as either."""
  formats = {}
  for path in paths:
    formats.setdefault(format_of(path), path)
  if None in formats:
    raise ReaderError(
        f'cannot tell the format of {formats[None]} from its extension; '
        f'pass --format (one of {", ".join(FORMATS)})')
  if len(formats) > 1:
    named = ', '.join(f'{path} is {fmt}' for fmt, path in sorted(
        formats.items()))
    raise ReaderError(f'the input holds files of more than one format ('
                      f'{named}); narrow --input to one, or pass --format')
  return next(iter(formats))


@dataclasses.dataclass(frozen=True)
class Input:
  """An input as the launcher matched it, once: the pattern to read, its
  format, and everything the pattern matched (``matching.entries``), which
  every check before the pipeline looks at."""
  pattern: str
  format: str
  entries: Tuple[matching.Entry, ...]

  @property
  def files(self) -> List[str]:
    """The regular files it matched, sorted."""
    return [entry.path for entry in self.entries if entry.problem is None]


def resolve_input(pattern: str, fmt: str) -> Input:
  """The file pattern and format to read, and what it matched; a folder
  means every file below it.

  Raises ReaderError when the format is unknown or no regular file matches,
  so that the job can stop with one clear line before it starts a pipeline.
  """
  if fmt != 'auto' and fmt not in FORMATS:
    raise ReaderError(f'unknown format {fmt!r}; choose one of {FORMATS}')
  if _is_directory(pattern):
    pattern = pattern.rstrip('/') + '/**'
    if fmt == 'auto':
      fmt = 'files'
  try:
    matched = matching.entries(pattern)
  except Exception as error:  # pylint: disable=broad-except
    raise ReaderError(f'cannot list {pattern}: {error}') from error
  paths = [entry.path for entry in matched if entry.problem is None]
  if not paths:
    others = ''.join(f'; {entry.path} is {entry.problem}'
                     for entry in matched[:3])
    raise ReaderError(f'no input file matches {pattern}{others}')
  if fmt == 'auto':
    fmt = _format_of_files(paths)
  return Input(pattern, fmt, tuple(matched))
