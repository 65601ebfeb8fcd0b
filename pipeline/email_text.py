"""Readable text from a raw RFC-822 email: the subject plus its text bodies.

Mail in the wild is malformed in every way the RFCs allow and more, so nothing
here raises: unknown charsets, broken transfer encodings and undecodable bytes
all degrade to replacement characters.
"""
import email
import email.header
import email.policy
import html.parser
import re
from typing import Optional, Tuple

_BLANK_RUNS = re.compile(r'\n\s*\n+')


class _HtmlToText(html.parser.HTMLParser):
  """Collects the visible text of an HTML document."""
  _INVISIBLE = frozenset(('script', 'style', 'head', 'title'))
  _BREAKS = frozenset(('br', 'p', 'div', 'tr', 'li', 'h1', 'h2', 'h3', 'td'))

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self._chunks = []
    self._hidden_depth = 0

  def handle_starttag(self, tag, attrs):
    if tag in self._INVISIBLE:
      self._hidden_depth += 1
    elif tag in self._BREAKS:
      self._chunks.append('\n')

  def handle_endtag(self, tag):
    if tag in self._INVISIBLE and self._hidden_depth:
      self._hidden_depth -= 1

  def handle_data(self, data):
    if not self._hidden_depth:
      self._chunks.append(data)

  def text(self):
    return ''.join(self._chunks)


def html_to_text(markup: str) -> str:
  parser = _HtmlToText()
  try:
    parser.feed(markup)
    parser.close()
  except Exception:  # pylint: disable=broad-except
    pass  # keep what was parsed before the markup went bad
  return parser.text()


def _decode(payload: bytes, charset: str) -> str:
  try:
    return payload.decode(charset, 'replace')
  except LookupError:  # a charset Python does not know
    return payload.decode('utf-8', 'replace')


def _part_text(part) -> str:
  # decode=True undoes base64 / quoted-printable and never raises.
  payload = part.get_payload(decode=True) or b''
  text = _decode(payload, part.get_content_charset() or 'utf-8')
  if part.get_content_subtype() == 'html':
    text = html_to_text(text)
  return text


def _header_text(value) -> str:
  """An RFC 2047 header (=?charset?b?...?=) as text."""
  try:
    return ''.join(
        _decode(chunk, charset or 'utf-8') if isinstance(chunk, bytes) else chunk
        for chunk, charset in email.header.decode_header(str(value)))
  except Exception:  # pylint: disable=broad-except
    return str(value)


def _body_texts(part):
  if part.is_multipart():
    children = part.get_payload()
    if part.get_content_subtype() == 'alternative':
      # The same content several ways: take the plain one if offered, else
      # the last (by RFC 2046 the richest).
      plain = [c for c in children if c.get_content_type() == 'text/plain']
      children = plain[:1] or children[-1:]
    for child in children:
      yield from _body_texts(child)
  elif (part.get_content_maintype() == 'text' and
        part.get_content_disposition() != 'attachment'):
    yield _part_text(part)


def email_to_text(raw: bytes) -> str:
  """Subject and text bodies of one raw email, HTML reduced to text."""
  return email_text_and_header(raw, None)[0]


def email_text_and_header(raw: bytes,
                          header: Optional[str]) -> Tuple[str, Optional[str]]:
  """``email_to_text`` and the decoded value of ``header`` (None when the
  email has none, or cannot be parsed), from one parse."""
  try:
    # compat32 parses several times faster than policy.default and we only
    # need what it gives: raw headers and transfer-decoded payloads.
    message = email.message_from_bytes(raw, policy=email.policy.compat32)
    subject = _header_text(message.get('subject', ''))
    value = message.get(header) if header else None
    bodies = list(_body_texts(message))
  except Exception:  # pylint: disable=broad-except
    return raw.decode('utf-8', 'replace'), None
  text = '\n'.join([subject] + bodies)
  value = _header_text(value).strip() if value is not None else None
  return _BLANK_RUNS.sub('\n\n', text).strip(), value or None
