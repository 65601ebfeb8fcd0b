"""trainer.predict on the input a command line meets: bytes that are not
UTF-8 on standard input or in an argument, CRLF line ends, blank lines, and
a standard output that cannot encode a label; its parity with the
signature; no CUDA lines without a GPU."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

import cli
from schemas import serving
from serving import exports
from tests.conftest import float32_approx
from tests.conftest import REPO
from tests.conftest import run_module
from tests.conftest import tiny_export
from trainer import predict as predict_lib


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


def test_each_input_line_gets_its_output_line(model_dir):
  """A blank line is answered by an empty one (null in JSON), a line that
  is not UTF-8 or holds a NUL the same way with a warning, and exit 3 says
  some text was not classified; the output lines still pair with the
  input's."""
  status, out, err = predict(
      model_dir, stdin=b'superb film\r\n\xff\xfe bad bytes\r\n\r\n \t \n'
      b'caf\xc3\xa9 dull\nbinary\x00data\nno line end')
  printed = [json.loads(line) for line in out]
  assert [p['text'] for p in printed] == [
      'superb film', '\\xff\\xfe bad bytes', '', ' \t ', 'café dull',
      'binary\x00data', 'no line end']
  assert [p['label'] for p in printed] == ['pós', None, None, None, 'pós',
                                           None, 'pós']
  assert [line for line in err if line.startswith('warning:')] == [
      'warning: line 2 is not UTF-8 text, not classified',
      'warning: line 6 holds a NUL byte, not text, not classified']
  assert err[-1] == ('error: 2 of the 7 texts given were not UTF-8 text and '
                     'not classified (see the warnings); the others were')
  assert status == cli.EXIT_INCOMPLETE_INPUT
  status, out, err = predict(model_dir, stdin=b'superb\n\ndull\n',
                             json_lines=False)
  assert status == 0, err
  assert [line.split('\t')[0] for line in out] == ['pós', '', 'pós']


def test_standard_input_is_classified_as_it_streams(model_dir):
  """The first batch is printed before the input ends: the reader writes a
  batch, waits for its answers, then writes the next."""
  process = subprocess.Popen(
      [sys.executable, '-m', 'trainer.predict', f'--model_dir={model_dir}',
       '--batch_size=2'], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, cwd=REPO)
  try:
    for batch in range(3):
      process.stdin.write(b'superb film\ndull film\n')
      process.stdin.flush()
      answers = [process.stdout.readline() for _ in range(2)]
      assert all(line.startswith('pós\t'.encode()) for line in answers), (
          batch, answers)
    process.stdin.close()
    assert process.wait(timeout=60) == 0
  finally:
    process.kill()


def test_a_reader_that_stops_ends_it_quietly(model_dir):
  """`trainer.predict | head -1`: no error line, SIGPIPE's status."""
  result = subprocess.run(
      f'yes "superb film" | head -5000 | {sys.executable} -m trainer.predict '
      f'--model_dir={model_dir} | head -1; echo "status ${{PIPESTATUS[2]}}"',
      shell=True, cwd=REPO, capture_output=True, timeout=300,
      executable='/bin/bash')
  first, status = result.stdout.decode().splitlines()
  assert first.startswith('pós\t')
  assert status == f'status {cli.EXIT_BROKEN_PIPE}'
  assert 'Error' not in result.stderr.decode(), result.stderr.decode()[-2000:]


def test_it_runs_with_standard_error_closed(model_dir):
  """`2>&-`, as some daemons start a program: what it would say there is
  lost, not its work."""
  result = subprocess.run(
      f'{sys.executable} -m trainer.predict --model_dir={model_dir} '
      '"superb film" 2>&-', shell=True, cwd=REPO, capture_output=True,
      timeout=300, executable='/bin/bash')
  assert result.returncode == 0
  assert result.stdout.decode().startswith('pós\t')


def test_crlf_lines_are_classified_without_their_carriage_return(model_dir):
  status, out, err = predict(model_dir, stdin=b'superb film\r\ndull\r\n')
  assert status == 0, err
  assert [json.loads(line)['text'] for line in out] == ['superb film', 'dull']


def test_an_argument_that_is_not_utf8_is_skipped_and_the_others_scored(
    model_dir):
  status, out, err = predict(model_dir, b'superb film', b'caf\xe9 latin-1')
  assert [json.loads(line)['label'] for line in out] == ['pós', None]
  assert 'warning: argument 2 is not UTF-8 text, not classified' in err
  assert status == cli.EXIT_INCOMPLETE_INPUT


def test_nothing_to_classify_is_a_job_error(model_dir):
  status, out, err = predict(model_dir, stdin=b'\xff\n\n')
  assert status == cli.EXIT_JOB_ERROR
  assert [json.loads(line)['label'] for line in out] == [None, None]
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


def test_predict_cli_matches_the_signature(trained):
  model_dir, _, _ = trained
  texts = ['superb wonderful film', 'dull waste of a plot']
  signature, metadata = exports.load(str(model_dir))
  direct = predict_lib.predict(signature, metadata.label_names, texts)
  result = run_module('trainer.predict', f'--model_dir={model_dir}', '--json',
                      *texts)
  assert result.returncode == 0, result.stderr[-2000:]
  printed = [json.loads(line) for line in result.stdout.splitlines()]
  assert [p['label'] for p in printed] == [d['label'] for d in direct]
  for printed_row, direct_row in zip(printed, direct):
    for label, probability in direct_row['probabilities'].items():
      assert printed_row['probabilities'][label] == float32_approx(
          probability)


def test_predict_prints_no_cuda_lines_on_a_machine_without_a_gpu(tmp_path):
  if glob.glob('/dev/nvidia[0-9]*'):
    pytest.skip('a GPU is present, and lines about CUDA may matter')
  tiny_export(tmp_path / serving.EXPORT_DIR / '1',
              {'version': 1, 'label_names': ['neg', 'pos']})
  env = {name: value for name, value in os.environ.items()
         if name != 'TF_CPP_MIN_LOG_LEVEL'}
  result = subprocess.run(
      [sys.executable, '-m', 'trainer.predict', f'--model_dir={tmp_path}',
       'some text'], capture_output=True, text=True, env=env, cwd=REPO,
      timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.startswith('pos\t0.7500\t')
  lines = (result.stdout + result.stderr).splitlines()
  assert not [line for line in lines
              if re.search(r'cuda|absl::InitializeLog', line, re.IGNORECASE)]
