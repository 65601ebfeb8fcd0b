"""A row of named fields (JSON object, CSV row, Parquet row, tf.Example) or a
parse failure -> one raw record, keyed by ``schemas.raw`` names."""
from typing import Any, Dict, Optional

from pipeline.readers import config as config_lib
from schemas import raw
from schemas import rejected


def snippet(value: Any) -> str:
  """Enough of a raw record, as text, to recognise it in the dead letters."""
  if isinstance(value, bytes):
    value = value.decode('utf-8', 'replace')
  elif not isinstance(value, str):
    value = repr(value)
  return value[:rejected.SNIPPET_CHARS]


def rejection(record_id: str, source: str, reason: str, payload: Any) -> Dict:
  """A record the job will count and send to the dead letters."""
  return {raw.ID: record_id, raw.SOURCE: source, raw.REASON: reason,
          raw.SNIPPET: snippet(payload)}


def has_surrogates(value: str) -> bool:
  try:
    value.encode('utf-8')
    return False
  except UnicodeEncodeError:
    return True


def _optional_str(value: Any) -> Optional[str]:
  """A label, id or split value as text; None when absent or not a scalar."""
  if value is None or isinstance(value, (bool, float, list, dict)):
    return None
  if isinstance(value, bytes):
    return value.decode('utf-8', 'replace')
  return str(value)


def record_from_fields(fields: Dict[str, Any], config: config_lib.ReadConfig,
                       default_id: str, source: str, payload: Any) -> Dict:
  """A record from a row of named fields (JSON object, CSV row, Parquet row)."""
  record_id = _optional_str(fields.get(config.id_field)) if config.id_field else None
  record_id = record_id or default_id
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
  record = {raw.ID: record_id, raw.SOURCE: source, raw.TEXT: text,
            raw.LABEL: _optional_str(label), raw.SPLIT: _optional_str(split)}
  if config.keep_fields:
    record[raw.KEPT] = {name: fields.get(name) for name in config.keep_fields}
  return record
