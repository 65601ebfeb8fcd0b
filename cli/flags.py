"""Flags every entry point parses the same way: typed, range-checked, and
nothing unknown let through.

``Parser`` is argparse with ``@FILE`` argument files (one flag a line), no
abbreviations (``--keep`` is not ``--keep_fields``), each flag's default in
``--help``, and every error as one ``error: …`` line and exit status 2,
before any work. ``parse`` refuses a flag that the entry point does not
know, naming the closest one it does, before it says that a required one is
missing (``--ouput_dir`` is a misspelt ``--output_dir``); a Beam job passes
the flags it leaves to Beam through a check of Beam's own
(``pipeline.jobs``). The ``type=`` helpers below refuse a value out of its
range, ``nan`` and ``inf`` included, with the flag's name.
"""
import argparse
import contextlib
import difflib
import math
import os
import re
import sys
from typing import (Callable, Iterable, List, NoReturn, Optional, Sequence,
                    Tuple)

EXIT_USAGE = 2


# The console scripts pip installs (setup.py): textclf-<job> runs the job's
# module, as python -m does.
SCRIPT_PREFIX = 'textclf-'


def command(module: str) -> str:
  """What the user typed to run ``module``: the console script that started
  this process, else ``python -m module``."""
  script = os.path.basename(sys.argv[0]) if sys.argv else ''
  return script if script.startswith(SCRIPT_PREFIX) else (
      f'python -m {module}')


# The --help of a Beam job, after its own flags.
BEAM_OPTIONS_HELP = (
    'Any other flag is one of Beam\'s pipeline options, passed through to '
    'Beam and checked by it before any work: --runner (default: {runner}), '
    '--direct_num_workers, --direct_running_mode, and each runner\'s own '
    '(Dataflow\'s --project, --region, --temp_location; Flink\'s '
    '--flink_master; ...). The runners and their options: docs/runners.md.')


def default_text(action: argparse.Action) -> Optional[str]:
  """What a flag is when it is not given, as a user would type it; None
  where there is nothing to say (no default, or a switch that is off)."""
  if action.default in (None, argparse.SUPPRESS) or action.required:
    return None
  if isinstance(action, argparse.BooleanOptionalAction):
    return action.option_strings[0 if action.default else 1]
  if action.nargs == 0:
    return None  # store_true and the like: off unless given
  return str(action.default)


class _HelpWithDefaults(argparse.HelpFormatter):
  """argparse's help, with each flag's default after its help text."""

  def _get_help_string(self, action):
    text = default_text(action)
    if text is None:
      return action.help
    # The help is %-formatted after this: a % of the default stays one.
    return f'{action.help} (default: {text.replace("%", "%%")})'


class Parser(argparse.ArgumentParser):
  """An ArgumentParser whose errors are one line and exit status 2, whose
  usage line names the command the user typed to run ``module``, and whose
  help shows each flag's default."""

  def __init__(self, description: Optional[str] = None, *,
               module: Optional[str] = None, **kwargs):
    if module:
      kwargs.setdefault('prog', command(module))
    kwargs.setdefault('fromfile_prefix_chars', '@')
    kwargs.setdefault('formatter_class', _HelpWithDefaults)
    super().__init__(description=description, allow_abbrev=False, **kwargs)
    self._reading = []
    # Read by cli.main before the flags are parsed.
    self.add_argument('--verbose', action='store_true',
                      help='Log at DEBUG level, with the traceback of any '
                      'failure.')

  def _read_args_from_files(self, arg_strings):
    """argparse's @FILE expansion (a line an argument), each file read as
    UTF-8 whatever the locale; a file that cannot be read, is not UTF-8 or
    includes itself (directly or through another, which would recurse until
    Python gives up) is a usage error."""
    return [word for word, _ in self.words_and_files(arg_strings)]

  def words_and_files(self, arg_strings) -> List[Tuple[str, Optional[str]]]:
    """(word, the @FILE it came from, None for the command line) of each
    argument, the @FILEs expanded."""
    words = []
    for arg in arg_strings:
      if not (arg and self.fromfile_prefix_chars and
              arg[0] in self.fromfile_prefix_chars):
        words.append((arg, self._reading[-1] if self._reading else None))
        continue
      path = arg[1:]
      if path in self._reading:
        self.error(f'{arg!r} includes itself (through '
                   f'{" -> ".join(repr(f) for f in self._reading)})')
      try:
        with open(path, encoding='utf-8') as handle:
          lines = handle.read().splitlines()
      except OSError as error:
        self.error(str(error))
      except UnicodeDecodeError as error:
        self.error(f'{arg!r} is not UTF-8 text ({error.reason} at byte '
                   f'{error.start})')
      self._reading.append(path)
      try:
        words.extend(self.words_and_files(
            [word for line in lines
             for word in self.convert_arg_line_to_args(line)]))
      finally:
        self._reading.pop()
    return words

  def error(self, message: str) -> NoReturn:
    print(f'error: {message} (see --help)', file=sys.stderr)
    sys.exit(EXIT_USAGE)

  def format_usage(self) -> str:
    with _required_shown(self):
      return super().format_usage()

  def format_help(self) -> str:
    with _required_shown(self):
      return super().format_help()

  def flag_names(self) -> List[str]:
    """Every flag of this parser and of its subcommands."""
    names = []
    for action in self._actions:
      names.extend(action.option_strings)
      if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
        for subparser in action.choices.values():
          names.extend(subparser.flag_names())
    return names


def unknown(flags: Sequence[str], known: Iterable[str]) -> Optional[str]:
  """The error for the first of ``flags`` (command-line words) that is no
  known flag, naming the closest known one; None when all are known."""
  known = sorted(set(known))
  for word in flags:
    name = word.split('=', 1)[0]
    if name in known:
      continue
    if not name.startswith('-'):
      return f'unexpected argument {word!r}'
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f'; did you mean {close[0]}?' if close else ''
    return f'unknown flag {name}{hint}'
  return None


def flag_words(words: Sequence[str]) -> List[str]:
  """The flag words of a list of leftover arguments: a word that follows a
  flag given without ``=`` is that flag's value, not a flag."""
  return [word for index, word in enumerate(words)
          if word.startswith('-') or index == 0 or
          not words[index - 1].startswith('-') or '=' in words[index - 1]]


def _actions(parser: argparse.ArgumentParser) -> List[argparse.Action]:
  """The actions of ``parser`` and of its subcommands."""
  found = []
  for action in parser._actions:  # pylint: disable=protected-access
    found.append(action)
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      for subparser in action.choices.values():
        found.extend(_actions(subparser))
  return found


def given_twice(parser: Parser, argv: Sequence[str]) -> Optional[str]:
  """The error for a flag of ``parser`` that takes a value and is given
  twice, which argparse would settle silently by keeping the last
  (--input=a --input=b reads b alone): twice on the command line, twice in
  the @FILEs (in one, or in two), or on the command line before an @FILE
  that gives it too. Only a flag on the command line after an @FILE that
  gives it is no error: it overrides the file's, as in
  ``@configs/imdb_best/train.args --epochs=3``."""
  valued = {option: action.dest for action in _actions(parser)
            if action.option_strings and action.nargs != 0
            for option in action.option_strings}
  given_in = {}  # dest -> the @FILE that gave it, None: the command line
  for word, source in parser.words_and_files(argv):
    if word == '--':
      break
    name = word.split('=', 1)[0]
    dest = valued.get(name)
    if not dest:
      continue
    if dest in given_in and not (source is None and
                                 given_in[dest] is not None):
      return _twice(name, given_in[dest], source)
    given_in[dest] = source
  return None


def _twice(name: str, first: Optional[str], second: Optional[str]) -> str:
  """The error for flag ``name`` given in ``first``, then in ``second``
  (@FILEs; None: the command line)."""
  if first is None and second is None:
    return f'{name} given twice: give it once'
  if first is None:
    return (f'{name} given on the command line, then in {second!r}: give it '
            'once, or after the @FILE to override the file\'s')
  where = (f'twice in {first!r}' if first == second else
           f'in {first!r} and in {second!r}')
  return f'{name} given {where}: give it once'


@contextlib.contextmanager
def _required_checked_after(parser: Parser):
  """``parser``'s required flags (its subcommands' too) made optional while
  it parses, so that a misspelt one (``--ouput_dir``) is found as an
  unknown flag with its closest name, not reported as missing; yields them,
  for the caller to check once the unknown flags are."""
  required = [action for action in _actions(parser)
              if action.option_strings and action.required]
  for action in required:
    action.required, action.shown_required = False, True
  try:
    yield required
  finally:
    for action in required:
      action.required = True


@contextlib.contextmanager
def _required_shown(parser: argparse.ArgumentParser):
  """The flags ``_required_checked_after`` made optional shown required
  again while ``--help`` (printed in the middle of parsing) or a usage line
  is written."""
  hidden = [action for action in _actions(parser)
            if getattr(action, 'shown_required', False) and
            not action.required]
  for action in hidden:
    action.required = True
  try:
    yield
  finally:
    for action in hidden:
      action.required = False


def parse(parser: Parser, argv: Optional[Sequence[str]],
          passes: Callable[[List[str]], Optional[str]] = None):
  """``parser``'s flags from ``argv``, and the rest: each left-over flag
  must be one ``passes`` accepts (it returns None, else the error), or the
  run ends with one ``error:`` line. Without ``passes`` nothing is left
  over. An unknown flag is reported before a missing required one, which
  it may be misspelt from."""
  twice = given_twice(parser, sys.argv[1:] if argv is None else argv)
  if twice:
    parser.error(twice)
  with _required_checked_after(parser) as required:
    args, rest = parser.parse_known_args(argv)
  problem = (passes(rest) if passes else
             unknown(flag_words(rest), parser.flag_names()) if rest else None)
  if problem:
    parser.error(problem)
  # A required flag's default is None; one of a subcommand that was not
  # chosen has no value at all.
  missing = ['/'.join(action.option_strings) for action in required
             if hasattr(args, action.dest) and
             getattr(args, action.dest) is None]
  if missing:
    parser.error(
        f'the following arguments are required: {", ".join(missing)}')
  return args, rest


def _number(kind: Callable, text: str):
  try:
    value = kind(text)
  except ValueError:
    raise argparse.ArgumentTypeError(
        f'{text!r} is not {"an integer" if kind is int else "a number"}'
    ) from None
  if not math.isfinite(value):
    raise argparse.ArgumentTypeError(f'{text!r} is not a finite number')
  return value


def _bounds(low, high, low_open: bool, high_open: bool) -> str:
  """An interval in words: '>= 1', '> 0', 'in [0, 1)'."""
  if high is None:
    return f'{">" if low_open else ">="} {low}'
  if low is None:
    return f'{"<" if high_open else "<="} {high}'
  return (f'in {"(" if low_open else "["}{low}, {high}'
          f'{")" if high_open else "]"}')


# The largest integer a flag takes unless it says otherwise: TensorFlow's
# shapes and lengths, and much of what they reach in C, are 32-bit.
INT32_MAX = 2**31 - 1


def integer(minimum: int = None,
            maximum: int = INT32_MAX) -> Callable[[str], int]:
  """An int ``type=`` within [minimum, maximum] (either bound optional; the
  maximum INT32_MAX unless given)."""
  def checked(text: str) -> int:
    value = _number(int, text)
    if (minimum is not None and value < minimum) or (
        maximum is not None and value > maximum):
      raise argparse.ArgumentTypeError(
          f'must be {_bounds(minimum, maximum, False, False)}, not {text}')
    return value
  checked.__name__ = 'integer'
  checked.values = f'integer {_bounds(minimum, maximum, False, False)}'
  return checked


def number(low: float = None, high: float = None, *, low_open: bool = False,
           high_open: bool = False) -> Callable[[str], float]:
  """A finite float ``type=`` within the interval from ``low`` to ``high``,
  each end closed unless ``*_open``."""
  def checked(text: str) -> float:
    value = _number(float, text)
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (
        value >= high if high_open else value > high)
    if too_low or too_high:
      raise argparse.ArgumentTypeError(
          f'must be {_bounds(low, high, low_open, high_open)}, not {text}')
    return value
  checked.__name__ = 'number'
  checked.values = ('number' + (f' {_bounds(low, high, low_open, high_open)}'
                                if low is not None or high is not None
                                else ''))
  return checked


def regex(text: str) -> str:
  """A ``type=`` for a Python regular expression: the text, once it compiles,
  so that a bad pattern is a usage error before any work."""
  try:
    re.compile(text)
  except re.error as error:
    raise argparse.ArgumentTypeError(
        f'{text!r} is not a regular expression: {error}') from None
  if not text:
    raise argparse.ArgumentTypeError('an empty pattern matches every id')
  return text


# What Beam's file systems (the finalize step of its file sinks) and
# TensorFlow's (loading a SavedModel's variables) read as a file pattern even
# in the name of a folder: such a folder cannot be written or loaded as
# itself.
PATTERN_CHARACTERS = '[]*?\\'


def folder(text: str) -> str:
  """A ``type=`` for a folder a job reads or writes: named, and without
  PATTERN_CHARACTERS."""
  if not text.strip():
    raise argparse.ArgumentTypeError('an empty folder name')
  found = ''.join(sorted(set(text) & set(PATTERN_CHARACTERS)))
  if found:
    raise argparse.ArgumentTypeError(
        f'{text!r} has {found!r}, which Beam and TensorFlow read as a file '
        'pattern even in a folder\'s name; choose a folder without '
        f'{PATTERN_CHARACTERS!r}')
  return text


folder.values = f'folder, without {PATTERN_CHARACTERS!r}'
regex.values = 'Python regular expression'
