"""trainer.predict on the input a command line meets: bytes that are not
UTF-8 on standard input or in an argument, CRLF line ends, blank lines, and
a standard output that cannot encode a label."""
import json
import os
import subprocess
import sys

import pytest

import cli
from schemas import serving
from tests.conftest import REPO
from tests.test_trainer import tiny_export


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
  """An export that answers 'pós' (not ASCII) at 0.75 to any text."""
  folder = tmp_path_factory.mktemp('predict')
  tiny_export(folder / serving.EXPORT_DIR / '1',
              {'version': 1, 'label_names': ['neg', 'pós']}, label='pós')
  return folder


def predict(model_dir, *texts, stdin=b'', encoding='utf-8', json_lines=True):
  """Runs trainer.predict with ``texts`` (bytes) as arguments and ``stdin``
  on standard input; returns (exit status, stdout lines, stderr lines)."""
  flags = [f'--model_dir={model_dir}'.encode()] + (
      [b'--json'] if json_lines else [])
  result = subprocess.run(
      [sys.executable.encode(), b'-m', b'trainer.predict', *flags, *texts],
      input=stdin, capture_output=True, cwd=REPO, timeout=300,
      env={**os.environ, 'PYTHONIOENCODING': encoding})
  return (result.returncode, result.stdout.decode(encoding).splitlines(),
          result.stderr.decode('utf-8', 'replace').splitlines())


def test_bad_lines_are_warned_and_skipped_and_the_good_ones_classified(
    model_dir):
  status, out, err = predict(
      model_dir, stdin=b'superb film\r\n\xff\xfe bad bytes\r\n\r\n \t \n'
      b'caf\xc3\xa9 dull\nno line end')
  assert [json.loads(line)['text'] for line in out] == [
      'superb film', 'café dull', 'no line end']
  assert [line for line in err if line.startswith('warning:')] == [
      'warning: line 2 is not UTF-8 text, skipped',
      'warning: line 3 is blank, skipped',
      'warning: line 4 is blank, skipped']
  assert err[-1] == ('error: 3 of the 6 texts given were skipped (see the '
                     'warnings); the others were classified')
  assert status == cli.EXIT_INCOMPLETE_INPUT


def test_crlf_lines_are_classified_without_their_carriage_return(model_dir):
  status, out, err = predict(model_dir, stdin=b'superb film\r\ndull\r\n')
  assert status == 0, err
  assert [json.loads(line)['text'] for line in out] == ['superb film', 'dull']


def test_an_argument_that_is_not_utf8_is_skipped_and_the_others_scored(
    model_dir):
  status, out, err = predict(model_dir, b'superb film', b'caf\xe9 latin-1')
  assert [json.loads(line)['text'] for line in out] == ['superb film']
  assert 'warning: argument 2 is not UTF-8 text, skipped' in err
  assert status == cli.EXIT_INCOMPLETE_INPUT


def test_nothing_to_classify_is_a_job_error(model_dir):
  status, out, err = predict(model_dir, stdin=b'\xff\n\n')
  assert status == cli.EXIT_JOB_ERROR
  assert not out
  assert err[-1] == ('error: none of the 2 texts given could be classified '
                     '(see the warnings)')


def test_a_label_standard_output_cannot_encode_is_printed_escaped(model_dir):
  status, out, err = predict(model_dir, stdin='café\n'.encode(),
                             encoding='ascii', json_lines=False)
  assert status == 0, err
  assert out == ['p\\xf3s\t0.7500\tneg=0.2500 p\\xf3s=0.7500\tcaf\\xe9']
  status, out, err = predict(model_dir, stdin='café\n'.encode(),
                             encoding='ascii')
  assert status == 0, err
  (line,) = out
  assert json.loads(line)['label'] == 'pós'
  assert json.loads(line)['text'] == 'café'
