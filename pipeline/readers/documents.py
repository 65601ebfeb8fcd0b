"""One document a file (aclImdb, email folders): the label is the folder."""
import posixpath
from typing import Dict, Iterable, List, Optional

from apache_beam.io.filesystems import FileSystems

from pipeline import email_text
from pipeline.readers import config as config_lib
from pipeline.readers import matching
from pipeline.readers import rows
from schemas import raw
from schemas import rejected

_BOM = '\ufeff'  # a byte order mark: no part of the text


def _split_from_path(path: str) -> Optional[str]:
  """aclImdb layout: <split>/<label>/<file>; the split folder, when named so."""
  grandparent = posixpath.basename(posixpath.dirname(posixpath.dirname(path)))
  return grandparent if grandparent.lower() in raw.SPLIT_ALIASES else None


def read_documents(entries: Iterable[matching.Entry],
                   config: config_lib.ReadConfig, is_email: bool) -> List[Dict]:
  """A record or a dead letter for each matched entry; an entry that is no
  regular file is an unreadable_file dead letter."""
  return [rows.rejection(entry.path, entry.path, rejected.UNREADABLE_FILE,
                         entry.problem) if entry.problem else
          read_document(entry.path, config, is_email) for entry in entries]


def read_document(path: str, config: config_lib.ReadConfig,
                  is_email: bool) -> Dict:
  """One document a file (aclImdb, email folders); label = parent folder.

  Never raises: a file that cannot be read is an unreadable_file dead
  letter, one whose content cannot be parsed a malformed_record one.
  """
  try:
    with FileSystems.open(path) as handle:
      # One byte past the limit is enough to know the document is too long.
      content = handle.read(config.max_text_bytes + 1)
  except Exception as error:  # pylint: disable=broad-except
    return rows.rejection(path, path, rejected.UNREADABLE_FILE,
                          f'{type(error).__name__}: {error}')
  return rows.guarded(path, path, content, _document, path, content, config,
                      is_email)


def _document(path: str, content: bytes, config: config_lib.ReadConfig,
              is_email: bool) -> Dict:
  if len(content) > config.max_text_bytes:
    return rows.rejection(path, path, rejected.TEXT_TOO_LONG, content)
  group = None
  if is_email:
    text, group = email_text.email_text_and_header(content, config.group_field)
  else:
    try:
      text = content.decode(config.encoding)
    except UnicodeDecodeError:
      return rows.rejection(path, path, rejected.UNDECODABLE_TEXT, content)
  text = text.removeprefix(_BOM)
  if raw.is_undecodable(text):
    return rows.rejection(path, path, rejected.UNDECODABLE_TEXT, content)
  record = {raw.ID: path, raw.SOURCE: path, raw.TEXT: text,
            raw.LABEL: rows.label_of(
                posixpath.basename(posixpath.dirname(path)) or None),
            raw.SPLIT: _split_from_path(path)}
  if config.group_field:  # a header of an email (--group_field=From)
    record[raw.GROUP] = None if group is None or raw.has_surrogates(
        group) else group
  return record
