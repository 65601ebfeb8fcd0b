"""Loads TensorFlow without its CUDA noise; every entry point imports it first.

On a machine without a GPU, TensorFlow's C++ side logs, while it loads and
while it first looks for devices::

    WARNING: All log messages before absl::InitializeLog() is called are ...
    I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine...
    E0000 ... cuda_platform.cc:52] failed call to cuInit: INTERNAL: ...

Those lines go through absl's logging before TensorFlow applies
``TF_CPP_MIN_LOG_LEVEL``, so the variable cannot hide them, and
``CUDA_VISIBLE_DEVICES`` does not either. So, where no GPU is present, this
module loads TensorFlow and lets it look for devices with the process's
standard error captured, then passes on every line but those about CUDA
and absl's INFO lines (``I0000 … oneDNN custom operations are on``), which
the level below hides from then on. With a GPU nothing is filtered: there
such a line says why it goes unused.

It also makes ``TF_CPP_MIN_LOG_LEVEL`` default to 1 (TensorFlow's INFO lines
off, its warnings and errors kept). A level the user set wins; at 0 nothing
is filtered at all.
"""
import contextlib
import glob
import os
import re
import signal
import sys
import tempfile
from typing import Callable

_LEVEL = 'TF_CPP_MIN_LOG_LEVEL'
# TensorFlow's search for CUDA, and absl's notice before its first line.
_CUDA_NOISE = re.compile(r'cuda|absl::InitializeLog', re.IGNORECASE)
# An INFO line of absl's (oneDNN's notice among them), which TensorFlow
# writes while it loads, before it applies TF_CPP_MIN_LOG_LEVEL.
_INFO_LINE = re.compile(r'I\d{4} \d\d:\d\d:\d\d')


def has_gpu() -> bool:
  """Whether an NVIDIA GPU is present: its driver makes /dev/nvidia<N>, also
  inside a container given the GPU; WSL 2 makes /dev/dxg."""
  return bool(glob.glob('/dev/nvidia[0-9]*')) or os.path.exists('/dev/dxg')


@contextlib.contextmanager
def _stderr_without(drop: Callable[[str], bool]):
  """Captures file descriptor 2, where C++ logs, during the block; then
  writes out the captured lines but those ``drop`` matches."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      text = captured.read().decode('utf-8', 'replace')
      sys.stderr.write(''.join(line for line in text.splitlines(keepends=True)
                               if not drop(line)))
      sys.stderr.flush()


def _noise(line: str) -> bool:
  return bool(_CUDA_NOISE.search(line) or _INFO_LINE.match(line))


def load_tensorflow() -> None:
  os.environ.setdefault(_LEVEL, '1')
  if os.environ[_LEVEL] == '0' or has_gpu() or 'tensorflow' in sys.modules:
    return
  with _stderr_without(_noise):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    # Makes TensorFlow try CUDA now rather than at its first operation.
    tf.config.list_physical_devices('GPU')


def _entry_point() -> bool:
  """Whether this process runs one of the jobs, as a console script or as
  ``python -m`` (read from the command line: ``__main__`` is not yet the
  job's module while Python imports the job's package)."""
  argv = getattr(sys, 'orig_argv', [])
  module = argv[argv.index('-m') + 1] if '-m' in argv[:-1] else ''
  script = os.path.basename(sys.argv[0]) if sys.argv else ''
  # textclf-*: the console scripts (cli.flags.SCRIPT_PREFIX), spelled out
  # here, where nothing of ours may load before TensorFlow.
  return (module.split('.')[0] in ('pipeline', 'trainer') or
          script.startswith('textclf-'))


def _standard_error() -> None:
  """Gives a process started with standard error closed (``2>&-``) one that
  goes nowhere: what the job would say there is lost, not the job."""
  try:
    os.fstat(2)
  except OSError:
    devnull = os.open(os.devnull, os.O_WRONLY)
    if devnull != 2:
      os.dup2(devnull, 2)
      os.close(devnull)
  if sys.stderr is None:
    sys.stderr = open(2, 'w', encoding='utf-8', errors='backslashreplace',
                      closefd=False)


# The signals that stop a job (cli.STOP_SIGNALS, spelled out here, where
# nothing of ours may load before TensorFlow).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _stop_while_loading() -> None:
  """Makes SIGINT, SIGTERM and SIGHUP, until ``cli.main`` sets its own
  handlers, end the process with one line and the signal's status: the
  seconds an entry point spends importing TensorFlow and Beam would
  otherwise end in a KeyboardInterrupt traceback, or silently. Nothing has
  been done yet to undo. A signal the process was started ignoring (nohup)
  stays ignored."""
  stream = os.dup(2)  # fd 2 is captured while TensorFlow loads

  def stop(signum, frame):
    del frame
    os.write(stream, f'error: stopped by {signal.Signals(signum).name} '
             'while starting; nothing was done\n'.encode())
    os._exit(128 + signum)  # pylint: disable=protected-access

  for signum in _STOP_SIGNALS:
    if signal.getsignal(signum) is not signal.SIG_IGN:
      signal.signal(signum, stop)


_standard_error()
if _entry_point():
  _stop_while_loading()
load_tensorflow()
