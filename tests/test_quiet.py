"""cli.quiet: TensorFlow's CUDA and INFO lines held back, every other line
kept."""
import os
import signal
import subprocess
import sys
import time

import pytest

from cli import quiet
from tests.conftest import REPO
from tests.conftest import run_module
from tests.conftest import synthetic_reviews
from tests.conftest import write_jsonl


def test_only_cuda_and_info_lines_are_held_back(capfd):
  # pylint: disable=protected-access
  with quiet._stderr_without(quiet._noise):
    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is '
             b'called are written to STDERR\n'
             b'I0000 cudart_stub.cc:31] Could not find cuda drivers\n'
             b'I0000 00:00:1795483900.538817    6978 port.cc:153] oneDNN '
             b'custom operations are on.\n'
             b'E0000 op_kernel.cc:1] a real error\n')
    print('a Python warning', file=sys.stderr)
  assert sorted(capfd.readouterr().err.splitlines()) == [
      'E0000 op_kernel.cc:1] a real error', 'a Python warning']


def _wait_for_tensorflow_loading(process):
  """Until TensorFlow's library is mapped into ``process``: it is then
  importing TensorFlow, which cli.quiet does after setting its handlers."""
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline and process.poll() is None:
    with open(f'/proc/{process.pid}/maps', encoding='utf-8') as maps:
      if 'libtensorflow' in maps.read():
        return
    time.sleep(0.005)
  raise AssertionError('the entry point never loaded TensorFlow')


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_an_entry_point_loads_is_one_line(signum):
  process = subprocess.Popen(
      [sys.executable, '-m', 'pipeline.score', '--input=x.jsonl',
       '--model_dir=m', '--output_dir=o'], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  _wait_for_tensorflow_loading(process)
  process.send_signal(signum)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 128 + signum
  assert stderr.strip().splitlines() == [
      f'error: stopped by {signal.Signals(signum).name} while starting; '
      'nothing was done']
  assert 'Traceback' not in stderr


def test_multi_process_workers_load_tensorflow_quietly(tmp_path, trained):
  corpus = write_jsonl(tmp_path / 'in.jsonl', synthetic_reviews(20, 5))
  result = run_module('pipeline.score', f'--input={corpus}',
                      f'--model_dir={trained[0]}',
                      f'--output_dir={tmp_path / "out"}',
                      '--direct_num_workers=2',
                      '--direct_running_mode=multi_processing')
  assert result.returncode == 0, result.stderr
  assert not [line for line in result.stderr.splitlines()
              if quiet._noise(line)]  # pylint: disable=protected-access
