"""Properties of the reading layer, on inputs Hypothesis makes up: arbitrary
bytes, JSON values and nesting, CSV quoting and line ends, file names.

Whatever a file holds, every record in it is one output (a record or a dead
letter), nothing raises, reading it in byte ranges gives what reading it
whole gives, and every file a pattern matches is read once. Examples are
derandomized and no example database is kept, so that every run, here or
in CI, tries the same inputs.
"""
import contextlib
import glob
import json
import os
import re
import struct
import tempfile

from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import tensorflow as tf

from pipeline import readers
from pipeline import records
from pipeline.readers import matching
from pipeline.readers import ranges
from pipeline.readers import rows
from pipeline.readers import sources
from pipeline.readers import tfrecord_frames
from schemas import raw
from tests.conftest import run_and_collect


def examples(count):
  """Hypothesis settings of a test that tries ``count`` inputs."""
  return settings(max_examples=count, deadline=None, database=None,
                  derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow,
                                         HealthCheck.data_too_large])


@contextlib.contextmanager
def written(name, data: bytes):
  """The path of a file ``name`` holding ``data``, in a folder of its own
  for the example."""
  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, name)
    with open(path, 'wb') as handle:
      handle.write(data)
    yield path


def read(path, fmt, desired_bytes=None, **config):
  """What the jobs' reader yields for ``path``: its ranges (of about
  ``desired_bytes``; whole when None), each read by its path."""
  config = readers.ReadConfig(format=fmt, **config)
  source_from_file = sources.source_factory(fmt, config)
  found = []
  for entry in matching.entries(path):
    parts = (ranges.split(entry, True, 'auto', desired_bytes)
             if desired_bytes else [ranges.FileRange(entry.path)])
    for part in parts:
      found.extend(ranges.read(part, source_from_file))
  return found


def assert_well_formed(outputs):
  """Every output is a record with text or a dead letter with a reason,
  and can be written as the jobs write them."""
  for output in outputs:
    if output.get(raw.REASON):
      letter = records.dead_letter(output, output[raw.REASON])
      json.dumps(letter, ensure_ascii=False).encode('utf-8')
    else:
      assert isinstance(output[raw.TEXT], str)
      json.dumps([output[raw.ID], output[raw.TEXT], output[raw.LABEL],
                  output[raw.SPLIT]], ensure_ascii=False).encode('utf-8')


def as_multiset(outputs):
  return sorted(json.dumps(output, sort_keys=True) for output in outputs)


_BLANK = b' \t\n\r\x0b\x0c'


def line_count(data: bytes) -> int:
  """The records of a UTF-8 line file, counted without the reader: lines
  that end at \\n, \\r\\n or \\r and are not blank, or do not decode."""
  count = 0
  for index, line in enumerate(re.split(rb'\r\n|\r|\n', data)):
    if index == 0:
      line = line.removeprefix(b'\xef\xbb\xbf')
    try:
      count += bool(line.decode('utf-8').strip(_BLANK.decode()))
    except UnicodeDecodeError:
      count += 1
  return count


# Bytes that make lines, JSON, CSV and escapes likelier than chance would.
_TEXTY_BYTES = st.binary(max_size=300) | st.lists(
    st.sampled_from([b'\n', b'\r', b'\r\n', b'{', b'}', b'[', b']', b'"',
                     b',', b'\\', b':', b' ', b'\x00', b'\xff', b'\xc3',
                     b'\xef\xbb\xbf', b'text', b'{"text": "a"}', b'1e999']),
    max_size=80).map(b''.join)


@examples(100)
@given(data=_TEXTY_BYTES, fmt=st.sampled_from(['jsonl', 'text']),
       desired_bytes=st.integers(1, 64))
def test_any_bytes_in_a_line_file_are_one_output_a_line(data, fmt,
                                                         desired_bytes):
  with written(f'data.{fmt}', data) as path:
    whole = read(path, fmt)
    split = read(path, fmt, desired_bytes)
  assert_well_formed(whole)
  assert len(whole) == line_count(data)
  assert as_multiset(split) == as_multiset(whole)


@examples(60)
@given(data=_TEXTY_BYTES | st.binary(max_size=300),
       name=st.sampled_from(['data.csv', 'data.tsv', 'data.tfrecord',
                             'data.parquet', 'data.jsonl.gz',
                             'data.csv.bz2']))
def test_any_bytes_in_any_format_never_raise_nor_vanish(data, name):
  fmt = readers.format_of(name)
  with written(name, data) as path:
    outputs = read(path, fmt, desired_bytes=16)
  assert_well_formed(outputs)
  assert bool(outputs) or not data or fmt in ('csv', 'tsv')


def _leaves():
  return (st.none() | st.booleans() | st.integers(-2**70, 2**70) |
          st.floats() | st.text(max_size=8))


_JSON = st.recursive(_leaves(), lambda children: st.lists(
    children, max_size=3) | st.dictionaries(st.text(max_size=4), children,
                                            max_size=3), max_leaves=12)
_ROWS = st.fixed_dictionaries({}, optional={
    'id': _JSON, 'text': st.text() | st.text() | _JSON,
    'label': st.text(max_size=4) | _JSON})
# JSON nested far deeper than Python's recursion limit, alone or as a field.
_DEEP = st.tuples(st.sampled_from([1, 900, 10_000, 100_000]) |
                  st.integers(1, 100_000), st.booleans()).map(
                      lambda deep: (b'{"id": "deep", "text": %s}' if deep[1]
                                    else b'%s') % (b'[' * deep[0] +
                                                   b']' * deep[0]))


def expected_id(row, default_id):
  """The documented id rule, written again: a string is the id, a number
  or boolean its JSON text; anything else, the file and position."""
  value = row.get('id') if isinstance(row, dict) else None
  if isinstance(value, str) and value and not re.search(
      '[\ud800-\udfff]', value):
    return value, False
  if isinstance(value, (bool, int)) or (
      isinstance(value, float) and abs(value) != float('inf') and
      value == value):
    return json.dumps(value), False
  return default_id, isinstance(row, dict) and 'id' in row


@examples(80)
@given(values=st.lists(_ROWS | _JSON, min_size=1, max_size=8),
       ascii_only=st.booleans(),
       deep_lines=st.lists(_DEEP, max_size=2))
def test_any_json_value_is_one_record_or_one_letter(values, ascii_only,
                                                    deep_lines):
  lines = [json.dumps(value, ensure_ascii=ascii_only).encode(
      'utf-8', 'surrogatepass') for value in values] + deep_lines
  with written('data.jsonl', b'\n'.join(lines) + b'\n') as path:
    outputs = read(path, 'jsonl')
    assert_well_formed(outputs)
    assert len(outputs) == len(lines)
    offset = 0
    for value, line, output in zip(values, lines, outputs):
      default_id = f'{path}:{offset}'
      offset += len(line) + 1
      try:
        line.decode('utf-8')
      except UnicodeDecodeError:  # a lone surrogate written raw
        assert output[raw.ID] == default_id
        continue
      assert (output[raw.ID], bool(output.get(raw.ID_REPLACED))) == (
          expected_id(value, default_id))


# Joined from a list: text() leaves surrogates out of almost every example.
_SURROGATE_PRONE_TEXT = st.lists(st.sampled_from(
    ['a', '\x00', '\xe9', '\u0436', '\U0001f600', '\ud800', '\ud83d',
     '\ude00', '\udfff']) | st.characters(blacklist_categories=()),
                                 max_size=20).map(''.join)


@examples(300)
@given(text=_SURROGATE_PRONE_TEXT)
def test_a_surrogate_is_found_wherever_it_is(text):
  # The rule written again, as a regex: any code point of the surrogate
  # range, which no UTF-8 output can hold.
  assert raw.has_surrogates(text) == bool(re.search('[\ud800-\udfff]',
                                                     text))


_ANY_JSON = st.recursive(
    _leaves() | _SURROGATE_PRONE_TEXT | st.integers(-2**200, 2**200) |
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1,
                     1e19, 2.0**64, 1e308]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        _SURROGATE_PRONE_TEXT, children, max_size=3), max_leaves=12)


def reading(parse, line):
  """What ``parse`` reads in a line, as JSON text (NaN, -0.0, 1 and 1.0 all
  told apart), or the type of the error it raises."""
  try:
    return json.dumps(parse(line))
  except (ValueError, RecursionError) as error:
    return type(error)


@examples(300)
@given(line=_ANY_JSON.flatmap(lambda value: st.sampled_from([
    json.dumps(value), json.dumps(value, ensure_ascii=False),
    json.dumps(value, indent=1)])) | _TEXTY_BYTES.map(
        lambda data: data.decode('utf-8', 'surrogateescape')) |
       st.lists(st.sampled_from(['1', '0', '-', '.', 'e', 'E', '+', '[',
                                 ']', ' ', '"', 'NaN', 'Infinity']),
                max_size=30).map(''.join))
# Where orjson reads otherwise, whatever the examples above happen to hold.
@example(line='{"id": -9223372036854775809, "ids": [18446744073709551616]}')
@example(line='{"id": 18446744073709551615, "score": NaN, "big": 1e400}')
@example(line='{"text": "\\ud800"}')
def test_a_json_line_reads_as_json_reads_it(line):
  assert reading(sources.json_value, line) == reading(json.loads, line)


def test_a_json_line_nested_past_the_recursion_limit_reads_as_json_reads_it():
  # Outside Hypothesis, which raises the recursion limit while a test runs.
  line = '{"k": ' + '[' * 600 + '0.5, 18446744073709551616' + ']' * 600 + '}'
  assert reading(sources.json_value, line) == reading(json.loads, line)


_CELL = st.text(st.characters(blacklist_categories=('Cs',)) |
                st.sampled_from(',"\r\n\t '), max_size=12)
_LINE_ENDS = st.sampled_from(['\n', '\r\n', '\r'])


def csv_line(cells, quoted, line_end):
  """One CSV record: each cell quoted when it must be or when ``quoted``
  says, so that any quoting the csv module reads is tried."""
  return ','.join(
      '"' + cell.replace('"', '""') + '"'
      if wants or re.search('[,"\r\n]', cell) else cell
      for cell, wants in zip(cells, quoted)) + line_end


@examples(80)
@given(rows=st.lists(st.tuples(st.tuples(_CELL, _CELL, _CELL),
                               st.tuples(*[st.booleans()] * 3), _LINE_ENDS),
                     min_size=1, max_size=6),
       header_end=_LINE_ENDS)
def test_csv_of_any_quoting_and_line_ends_reads_back_each_row(rows,
                                                              header_end):
  text = 'id,text,label' + header_end + ''.join(
      csv_line(*row) for row in rows)
  with written('data.csv', text.encode('utf-8')) as path:
    outputs = read(path, 'csv')
  assert_well_formed(outputs)
  assert len(outputs) == len(rows)
  for ((row_id, row_text, label), _, _), output in zip(rows, outputs):
    if '\x00' in row_text:
      assert output[raw.REASON] == 'undecodable_text'
    else:
      assert (output[raw.TEXT], output[raw.LABEL]) == (row_text, label)
      assert (output[raw.ID] == row_id) == bool(row_id)


def tfrecord_frame(data: bytes) -> bytes:
  length = struct.pack('<Q', len(data))
  return b''.join([length, struct.pack('<I', tfrecord_frames.masked_crc(
      length)), data, struct.pack('<I', tfrecord_frames.masked_crc(data))])


def example_bytes(features):
  return tf.train.Example(features=tf.train.Features(feature={
      name: tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
      for name, values in features.items()})).SerializeToString()


_EXAMPLES = st.fixed_dictionaries(
    {'text': st.lists(st.binary(max_size=6), min_size=1, max_size=2)},
    optional={name: st.lists(st.binary(max_size=6), max_size=2)
              for name in ('label', 'other')}).map(example_bytes)


@examples(50)
@given(payloads=st.lists(_EXAMPLES | st.binary(max_size=40), min_size=1,
                         max_size=6))
def test_any_tfrecord_frame_is_one_record_or_one_letter(payloads):
  data = b''.join(tfrecord_frame(payload) for payload in payloads)
  with written('data.tfrecord', data) as path:
    outputs = read(path, 'tfrecord')
  assert_well_formed(outputs)
  assert [output[raw.ID].rsplit(':', 1)[1] for output in outputs] == [
      str(index) for index in range(len(payloads))]


# File names with what globs, shells and encodings trip over.
_NAMES = st.text(st.sampled_from('*?[]!{}^-, é文\u00a0ab') |
                 st.characters(blacklist_categories=('Cs',),
                               blacklist_characters='/\x00'),
                 min_size=1, max_size=12).filter(
                     lambda name: name not in ('.', '..'))


def literal(path):
  """A pattern that matches ``path`` alone: its glob characters in
  classes."""
  return re.sub(r'([*?[])', r'[\1]', path)


@examples(60)
@given(names=st.lists(_NAMES, min_size=1, max_size=6, unique=True))
def test_any_file_name_is_matched_once_and_literally(names):
  with tempfile.TemporaryDirectory() as folder:
    paths = sorted(os.path.join(folder, name) for name in names)
    for path in paths:
      with open(path, 'wb') as handle:
        handle.write(b'{"text": "x"}\n')
    assert matching.files(os.path.join(folder, '*')) == paths
    assert matching.files(os.path.join(folder, '**')) == paths
    for path in paths:
      assert matching.files(literal(path)) == [path]


@examples(8)
@given(names=st.lists(_NAMES, min_size=1, max_size=5, unique=True))
def test_a_pipeline_reads_any_named_file_once(names):
  with tempfile.TemporaryDirectory() as folder:
    for index, name in enumerate(names):
      os.makedirs(os.path.join(folder, str(index % 2)), exist_ok=True)
      with open(os.path.join(folder, str(index % 2), name), 'w',
                encoding='utf-8') as handle:
        handle.write(json.dumps({'id': name, 'text': 'x'}) + '\n')
    matched = readers.resolve_input(f'{folder}/**/*', 'jsonl')
    transform = readers.ReadRecords(matched.pattern,
                                    readers.ReadConfig(format=matched.format))
    outputs = run_and_collect(lambda pipeline: pipeline | transform)
  assert sorted(output[raw.ID] for output in outputs) == sorted(names)


_SEGMENTS = st.sampled_from(['a', 'b', 'ab', '*', '?', 'a*', '[ab]', '[!a]',
                             '*b', '**'])


@examples(150)
@given(files=st.lists(st.lists(st.sampled_from(['a', 'b', 'ab', 'ba']),
                               min_size=1, max_size=4), min_size=1,
                      max_size=8),
       segments=st.lists(_SEGMENTS, min_size=1, max_size=4))
def test_patterns_match_what_python_glob_matches(files, segments):
  with tempfile.TemporaryDirectory() as folder:
    for parts in files:
      path = os.path.join(folder, *parts[:-1], parts[-1] + '.f')
      with contextlib.suppress(OSError):  # a file where a folder is wanted
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'wb'):
          pass
    pattern = os.path.join(folder, *segments[:-1], segments[-1] + (
        '' if segments[-1] == '**' else '.f'))
    # Python's glob yields a path once for each way **/** reaches it.
    globbed = sorted({path for path in glob.glob(pattern, recursive=True)
                      if os.path.isfile(path)})
    assert matching.files(pattern) == globbed
