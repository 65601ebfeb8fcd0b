"""The RFC-822 parser: subject plus text bodies, never fatal."""
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

import pytest

from pipeline.email_text import email_to_text
from pipeline.email_text import html_to_text


def test_plain_message_gives_subject_and_body():
  raw = b'Subject: Hello there\nFrom: a@b.c\n\nFirst line.\nSecond line.\n'
  assert email_to_text(raw) == 'Hello there\nFirst line.\nSecond line.'


def test_encoded_subject_and_quoted_printable_latin1_body():
  raw = (b'Subject: =?iso-8859-1?q?Caf=E9_cr=E8me?=\n'
         b'Content-Type: text/plain; charset=iso-8859-1\n'
         b'Content-Transfer-Encoding: quoted-printable\n\n'
         b'Cr=E8me br=FBl=E9e =3D dessert\n')
  assert email_to_text(raw) == 'Café crème\nCrème brûlée = dessert'


def test_alternative_prefers_plain_and_skips_attachments():
  message = MIMEMultipart('mixed')
  message['Subject'] = 'Report'
  alternative = MIMEMultipart('alternative')
  alternative.attach(MIMEText('plain version', 'plain'))
  alternative.attach(MIMEText('<p>html version</p>', 'html'))
  message.attach(alternative)
  attachment = MIMEText('secret attached text', 'plain')
  attachment.add_header('Content-Disposition', 'attachment', filename='a.txt')
  message.attach(attachment)
  message.attach(MIMEApplication(b'\x00\x01binary'))
  text = email_to_text(message.as_bytes())
  assert text == 'Report\nplain version'


def test_html_only_base64_body_is_reduced_to_visible_text():
  body = MIMEText('<html><head><style>p{color:red}</style></head><body>'
                  '<p>Buy&nbsp;now &amp; save</p><script>x()</script>'
                  '</body></html>', 'html', 'utf-8')  # base64 encoded
  body['Subject'] = 'Offer'
  text = email_to_text(body.as_bytes())
  assert 'Buy\xa0now & save' in text
  assert 'color' not in text and 'x()' not in text


def test_unknown_charset_and_invalid_bytes_are_replaced_not_fatal():
  raw = (b'Subject: odd\nContent-Type: text/plain; charset=x-no-such-charset\n'
         b'\n\xff\xfe caf\xc3\xa9 \x80\n')
  text = email_to_text(raw)
  assert text.startswith('odd\n')
  assert 'café' in text and '\ufffd' in text


@pytest.mark.parametrize('raw, expected', [
    (b'', ''),
    # No header line: all of it is the body of a default text/plain message.
    (b'\x00\x01\x02', '\x00\x01\x02'),
    # A multipart without a boundary cannot be split into parts and is no
    # text part itself: there is no body to keep.
    (b'Content-Type: multipart/mixed\n\n--', ''),
    # An encoded word whose base64 is invalid decodes to nothing; the body
    # is still kept.
    (b'Subject: =?utf-8?b?!!!?=\n\nbody', 'body'),
])
def test_garbage_degrades_to_what_can_be_read(raw, expected):
  assert email_to_text(raw) == expected


def test_html_to_text_survives_broken_markup():
  assert 'kept' in html_to_text('<p>kept<div <<< unterminated')
