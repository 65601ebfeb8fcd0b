"""cli.quiet: TensorFlow's CUDA and INFO lines held back, every other line
kept."""
import os
import sys

from cli import quiet


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
