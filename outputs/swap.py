"""Swapping two local folders in one step, where the operating system can."""
import ctypes
import os
import sys

# renameat2's flag and the directory file descriptor for paths relative to
# the working directory (Linux); renamex_np's flag (macOS).
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
_RENAME_SWAP = 2


def exchange(first: str, second: str) -> bool:
  """Atomically swaps two local folders; False where the OS cannot."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    if sys.platform.startswith('linux'):
      result = libc.renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD,
                              os.fsencode(second), _RENAME_EXCHANGE)
    elif sys.platform == 'darwin':
      result = libc.renamex_np(os.fsencode(first), os.fsencode(second),
                               _RENAME_SWAP)
    else:
      return False
  except (AttributeError, OSError):  # no such call in this C library
    return False
  return result == 0
