"""When rejecting records means the run did not do its job.

A few bad records are dead letters in a run that succeeds; a run that
rejects more than ``--max_rejected_fraction`` of what it read publishes
nothing and exits with its own status (``TooManyRejected``). Before a
pipeline starts, ``preflight`` reads the input's first records on the
launcher and stops the job in seconds when none of them would be accepted:
a wrong ``--text_field``, ``--format`` or ``--encoding`` never costs an
hour of workers writing dead letters; nor does a field that a flag names
(``--id_field``, ``--split_field``...) and no record has. Both say why in one
line: the top reasons with their counts and an example, and, when fields
are missing, every one of them and the fields the records do have.
"""
import codecs
import collections
import difflib
import json
import posixpath
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from apache_beam.io.filesystems import FileSystems

import cli
from cli import flags
from pipeline import readers
from schemas import raw
from schemas import rejected

# The records of the input the launcher checks before a pipeline starts.
PREFLIGHT_RECORDS = 100
# Reasons an error line names, most frequent first, and an example of each.
_TOP_REASONS = 3
_EXAMPLE_CHARS = 80
# Dead letters read, at most, to find an example of each top reason.
_EXAMPLE_SCAN = 100_000
# The field a reason says is missing, and the flag that names it.
_MISSING_FIELD_FLAGS = {rejected.MISSING_TEXT: 'text_field',
                        rejected.MISSING_LABEL: 'label_field'}
# Names a field often has, for the hint when none is close to the flag's.
_USUAL_NAMES = {
    'text_field': ('text', 'body', 'content', 'review', 'message', 'sentence',
                   'document', 'comment', 'description'),
    'label_field': ('label', 'labels', 'class', 'category', 'target', 'tag',
                    'sentiment'),
    'id_field': ('id', 'key', 'uid', 'uuid', 'doc_id', 'record_id'),
    'split_field': ('split', 'fold', 'subset', 'set'),
}


class TooManyRejected(cli.JobError):
  """More of the input was rejected than the run accepts: nothing is
  published, and the dead letters are kept for the operator."""
  exit_status = cli.EXIT_TOO_MANY_REJECTED


def add_budget_argument(parser: flags.Parser) -> None:
  parser.add_argument(
      '--max_rejected_fraction', type=flags.number(0, 1), default=0.1,
      help='The share of the records read that may be rejected; a run over '
      'it publishes nothing and exits with status '
      f'{cli.EXIT_TOO_MANY_REJECTED}. 1 accepts any share.')


def _reasons_line(by_reason: Dict[str, int],
                  examples: Dict[str, str]) -> str:
  top = sorted(by_reason.items(), key=lambda item: (-item[1], item[0]))
  parts = []
  for reason, count in top[:_TOP_REASONS]:
    example = examples.get(reason)
    parts.append(f'{reason} {count}' + (
        f', e.g. {example[:_EXAMPLE_CHARS]!r}' if example else ''))
  if len(top) > _TOP_REASONS:
    parts.append(f'{len(top) - _TOP_REASONS} more reasons')
  return '; '.join(parts)


def field_hint(flags: Sequence[str], config: readers.ReadConfig,
               fields: Iterable[str]) -> str:
  """'; the records have fields a, b — is --text_field=b --label_field=a
  meant?', a suggestion for each of ``flags`` (``text_field``...) that a
  field is close to; '' when the records' fields are not known."""
  fields = list(dict.fromkeys(fields))
  if not fields:
    return ''
  meant = []
  for flag in flags:
    wanted = getattr(config, flag) or ''
    close = difflib.get_close_matches(wanted, fields, n=1, cutoff=0.5) or [
        name for name in fields
        if name.lower() in _USUAL_NAMES.get(flag, ())][:1]
    if close:
      meant.append(f'--{flag}={close[0]}')
  return (f'; the records have fields {", ".join(fields)}' +
          (f' — is {" ".join(meant)} meant?' if meant else ''))


def missing_fields(sample: List[Dict],
                   config: readers.ReadConfig) -> Dict[str, str]:
  """The fields the flags name (``config.named_fields``) that no record of
  ``sample`` read from a row of named fields has, by flag."""
  rows = [record[raw.FIELDS] for record in sample if raw.FIELDS in record]
  if not rows:
    return {}
  return {flag: name for flag, name in config.named_fields.items()
          if not any(name in fields for fields in rows)}


def _named(missing: Dict[str, str]) -> str:
  """'body (--text_field) or sentiment (--label_field)'."""
  named = [f'{name} (--{flag})' for flag, name in missing.items()]
  return ' or '.join([', '.join(named[:-1]), named[-1]] if len(named) > 1
                     else named)


def _fields_hint(by_reason: Dict[str, int], config: readers.ReadConfig,
                 sample: List[Dict]) -> str:
  """'; no record has the field body (--text_field) or sentiment
  (--label_field); the records have fields …' when the sample lacks fields
  the flags name; else the fields of the sample when the most frequent
  reason is a missing field; else ''."""
  missing = missing_fields(sample, config)
  if missing:
    return f'; no record has the field {_named(missing)}' + field_hint(
        list(missing), config, _fields_of(sample))
  top = max(by_reason, key=by_reason.get) if by_reason else None
  if top in _MISSING_FIELD_FLAGS:
    return field_hint([_MISSING_FIELD_FLAGS[top]], config, _fields_of(sample))
  return ''


# Byte order marks, longest first, and the encoding each one starts.
_BYTE_ORDER_MARKS = ((codecs.BOM_UTF32_LE, 'utf-32'), (codecs.BOM_UTF32_BE,
                                                       'utf-32'),
                     (codecs.BOM_UTF16_LE, 'utf-16'), (codecs.BOM_UTF16_BE,
                                                       'utf-16'),
                     (codecs.BOM_UTF8, 'utf-8-sig'))
# Reasons a wrong --format or --encoding gives every record.
_MISREAD = (rejected.MALFORMED_RECORD, rejected.MISSING_TEXT,
            rejected.UNDECODABLE_TEXT, rejected.EMPTY_TEXT)


def input_hint(by_reason: Dict[str, int], matched: readers.Input,
               config: readers.ReadConfig) -> str:
  """' — is --format=jsonl meant?' when the first file's extension names
  another format than the one read; ' — is --encoding=utf-16 meant?' when
  it starts with another encoding's byte order mark; '' otherwise."""
  if not by_reason or max(by_reason, key=by_reason.get) not in _MISREAD:
    return ''
  paths = matched.files
  if not paths:
    return ''
  named = readers.format_of(paths[0])
  if named and named != config.format:
    return (f'; {posixpath.basename(paths[0])} is named like {named}, not '
            f'{config.format} — is --format={named} meant?')
  try:
    with FileSystems.open(paths[0]) as handle:
      head = handle.read(4)
  except Exception:  # pylint: disable=broad-except
    return ''  # the file's own dead letter says why it cannot be read
  for mark, encoding in _BYTE_ORDER_MARKS:
    if head.startswith(mark) and codecs.lookup(encoding).name != codecs.lookup(
        config.encoding).name:
      return (f'; {posixpath.basename(paths[0])} starts with a {encoding} '
              f'byte order mark — is --encoding={encoding} meant?')
  return ''


def _fields_of(sample: List[Dict]) -> List[str]:
  names = []
  for record in sample:
    names.extend(record.get(raw.FIELDS, ()))
  return names


def diagnosis(matched: readers.Input, config: readers.ReadConfig,
              by_reason: Dict[str, int], examples: Dict[str, str]) -> str:
  """The reasons with their counts and examples, and the fields the input's
  first records have when a field is missing."""
  hint = input_hint(by_reason, matched, config)
  if not hint and any(reason in _MISSING_FIELD_FLAGS for reason in by_reason):
    hint = _fields_hint(by_reason, config, readers.sample(
        matched, config, PREFLIGHT_RECORDS))
  return _reasons_line(by_reason, examples) + hint


def examples_of(dead_letter_dir: str, reasons: Iterable[str]) -> Dict[str, str]:
  """A snippet of one dead letter of each of ``reasons``, read from the
  job's dead-letter files."""
  wanted, found, scanned = set(reasons), {}, 0
  pattern = posixpath.join(dead_letter_dir, f'{rejected.FILE_PREFIX}-*')
  matches = FileSystems.match([pattern])[0].metadata_list
  for path in sorted(m.path for m in matches):
    with FileSystems.open(path) as handle:
      for line in handle:
        letter = json.loads(line)
        if letter[rejected.REASON] in wanted - set(found):
          found[letter[rejected.REASON]] = letter[rejected.SNIPPET]
        scanned += 1
        if set(found) >= wanted or scanned >= _EXAMPLE_SCAN:
          return found
  return found


def over_budget(read: int, by_reason: Dict[str, int], max_fraction: float,
                matched: readers.Input, config: readers.ReadConfig,
                dead_letter_dir: str) -> Optional[str]:
  """Why the run rejected too much (the first part of its error line), or
  None when it is within its budget."""
  rejected_count = sum(by_reason.values())
  if rejected_count <= max_fraction * read:
    return None
  return (f'{rejected_count} of {read} records rejected, more than '
          f'--max_rejected_fraction={max_fraction:g} allows ('
          + diagnosis(matched, config, by_reason,
                      examples_of(dead_letter_dir, by_reason)) + ')')


def check_budget(tally, max_fraction: float, matched: readers.Input,
                 config: readers.ReadConfig, output) -> None:
  """TooManyRejected when a run's tally (``records.Tally``) is over its
  budget; its dead letters are kept (``output.keep``, a StagedOutput) where
  the error line says. A JobError when nothing was read."""
  if not tally.read:
    raise cli.JobError(f'no record was read from {matched.pattern}: the '
                       'files it matches are empty; nothing was published')
  problem = over_budget(tally.read, tally.rejected_by_reason, max_fraction,
                        matched, config,
                        posixpath.join(output.staging_dir, rejected.DIR))
  if problem:
    raise TooManyRejected(
        f'{problem}; nothing was published; the dead letters are in '
        f'{output.keep(rejected.DIR)}')


def preflight(matched: readers.Input, config: readers.ReadConfig,
              reason_of: Callable[[Dict], Optional[str]]) -> List[Dict]:
  """The input's first records that the job would accept (``reason_of``
  gives None); a JobError when there are records and none would be, or
  when none of them has a field that a flag names (every such field in one
  line)."""
  sample = readers.sample(matched, config, PREFLIGHT_RECORDS)
  if not sample and readers.sample_covers(matched):
    raise cli.JobError(f'no record in {matched.pattern}: the files it '
                       'matches are empty, so the job did not start')
  reasons = [reason_of(record) for record in sample]
  accepted = [record for record, reason in zip(sample, reasons)
              if not reason]
  if sample and not accepted:
    by_reason = collections.Counter(reasons)
    examples = {}
    for record, reason in zip(sample, reasons):
      examples.setdefault(reason, record.get(raw.SNIPPET) or
                          record.get(raw.TEXT) or '')
    raise cli.JobError(
        f'none of the first {len(sample)} records of {matched.pattern} '
        'would be accepted, so the job did not start ('
        + _reasons_line(dict(by_reason), examples)
        + (input_hint(by_reason, matched, config) or
           _fields_hint(by_reason, config, sample)) + ')')
  missing = missing_fields(sample, config)
  if missing:
    raise cli.JobError(
        f'none of the first {len(sample)} records of {matched.pattern} has '
        f'the field {_named(missing)}, so the job did not start'
        + field_hint(list(missing), config, _fields_of(sample)))
  return accepted
