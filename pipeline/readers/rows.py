"""A row of named fields (JSON object, CSV row, Parquet row, tf.Example) or a
parse failure -> one raw record, keyed by ``schemas.raw`` names."""
import json
import math
import re
import unicodedata
from typing import Any, Callable, Dict, Optional, Sequence

from pipeline.readers import config as config_lib
from schemas import raw
from schemas import rejected

_LONE_SURROGATE = re.compile('[\ud800-\udfff]')


def snippet(value: Any) -> str:
  """Enough of a raw record, as text, to recognise it in the dead letters;
  always encodable, so that writing the dead letter cannot fail."""
  if isinstance(value, bytes):
    value = value.decode('utf-8', 'replace')
  elif not isinstance(value, str):
    value = repr(value)
  return _LONE_SURROGATE.sub('\ufffd', value[:rejected.SNIPPET_CHARS])


def rejection(record_id: str, source: str, reason: str, payload: Any) -> Dict:
  """A record the job will count and send to the dead letters."""
  return {raw.ID: record_id, raw.SOURCE: source, raw.REASON: reason,
          raw.SNIPPET: snippet(payload)}


def guarded(record_id: str, source: str, payload: Any,
            parse: Callable[..., Dict], *args) -> Dict:
  """``parse(*args)``, one record's parse, or the record's malformed_record
  dead letter whatever it raises: one record never ends the reading of its
  file (a RecursionError from JSON nested 10,000 deep, a value no check
  foresaw)."""
  try:
    return parse(*args)
  except Exception:  # pylint: disable=broad-except
    return rejection(record_id, source, rejected.MALFORMED_RECORD, payload)


def _holds_surrogates(value: Any) -> bool:
  """Whether a field value, however nested, holds a lone surrogate."""
  if isinstance(value, str):
    return raw.has_surrogates(value)
  if isinstance(value, dict):
    return any(map(_holds_surrogates, value.items()))
  if isinstance(value, (list, tuple)):
    # None and empty values hold none: most optional fields are one of them.
    return any(map(_holds_surrogates, filter(None, value)))
  return False


def _optional_str(value: Any) -> Optional[str]:
  """A label or split value as text; None when absent or not a scalar."""
  if value is None or isinstance(value, (bool, float, list, dict)):
    return None
  if isinstance(value, bytes):
    return value.decode('utf-8', 'replace')
  return str(value)


def label_of(value: Any) -> Optional[str]:
  """A label field's value (or a folder's name) as the record's label, in
  Unicode NFC: canonically equal spellings (an accented letter as one code
  point, or as a letter and a combining accent, as macOS spells file names)
  are one label, and so one class. Every label a reader gives passes here.
  None when absent or not a scalar."""
  text = _optional_str(value)
  return None if text is None else unicodedata.normalize('NFC', text)


def _id_text(value: Any) -> Optional[str]:
  """An id field's value as the record's id: a string as it is, a number or
  a boolean as its JSON text (12345.0 stays "12345.0"); None for what no id
  can be (null, "", a lone surrogate, bytes that are no UTF-8, NaN, an
  object, an array): two such ids, spelt alike, would name two records."""
  if isinstance(value, bytes):
    try:
      value = value.decode('utf-8')
    except UnicodeDecodeError:
      return None
  if isinstance(value, str):
    return value if value and not raw.has_surrogates(value) else None
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, (bool, int, float)):
    return json.dumps(value)
  if value is None or isinstance(value, (dict, list, tuple)):
    return None
  return str(value)  # other scalars of Parquet: decimals, dates


def record_from_fields(fields: Dict[str, Any], config: config_lib.ReadConfig,
                       default_id: str, source: str, payload: Any,
                       names: Optional[Sequence[str]] = None) -> Dict:
  """A record from a row of named fields (JSON object, CSV row, Parquet row,
  tf.Example). A row whose id field holds no usable id, or lacks an id field
  that --id_field named, gets ``default_id``, and is marked
  (raw.ID_REPLACED) so that the jobs count it. With ``config.list_fields``
  the record lists the row's field names: ``names`` where a reader read
  only the fields it needs (Parquet's columns), else the row's."""
  given_id = fields.get(config.id_field) if config.id_field else None
  record_id = _id_text(given_id)
  record = _record(fields, config, record_id or default_id, source, payload)
  if record_id is None and config.id_field and (
      config.id_field in fields or config.id_field_required):
    record[raw.ID_REPLACED] = True
  if config.list_fields:
    record[raw.FIELDS] = list(fields if names is None else names)
  return record


def _record(fields: Dict[str, Any], config: config_lib.ReadConfig,
            record_id: str, source: str, payload: Any) -> Dict:
  text = fields.get(config.text_field)
  if text is None:
    return rejection(record_id, source, rejected.MISSING_TEXT, payload)
  if isinstance(text, bytes):
    try:
      text = text.decode(config.encoding)
    except UnicodeDecodeError:
      return rejection(record_id, source, rejected.UNDECODABLE_TEXT, payload)
  if not isinstance(text, str):
    return rejection(record_id, source, rejected.WRONG_TYPE, payload)
  label = fields.get(config.label_field) if config.label_field else None
  if label is not None and _optional_str(label) is None:
    return rejection(record_id, source, rejected.WRONG_TYPE, payload)
  split = fields.get(config.split_field) if config.split_field else None
  kept = {name: fields.get(name) for name in config.keep_fields}
  given_id = fields.get(config.id_field) if config.id_field else None
  if raw.is_undecodable(text) or _holds_surrogates(
      (given_id, label, split, kept)):
    return rejection(record_id, source, rejected.UNDECODABLE_TEXT, payload)
  record = {raw.ID: record_id, raw.SOURCE: source, raw.TEXT: text,
            raw.LABEL: label_of(label), raw.SPLIT: _optional_str(split)}
  if config.keep_fields:
    record[raw.KEPT] = kept
  if config.group_field:
    # An id's rules: a number is its JSON text, null or "" no group.
    # Bytes that are no UTF-8 still group, spelt with replacement
    # characters: two groups spelt alike are joined, never split.
    group = fields.get(config.group_field)
    if isinstance(group, bytes):
      group = group.decode('utf-8', 'replace')
    record[raw.GROUP] = _id_text(group)
  return record
