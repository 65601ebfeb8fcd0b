"""Classify text on the command line with an exported model.

    python -m trainer.predict --model_dir=DIR "some text" ["more text" ...]
    cat texts.txt | python -m trainer.predict --model_dir=DIR

Prints one line a text, in the order given: the predicted label, its
confidence and the probability of every class (``--json`` for one JSON
object a line). Standard input is classified as it streams, --batch_size
lines at a time, each batch printed as soon as it is classified: memory
stays flat however long the input.

Texts are read as bytes (standard input's lines without their ``\\n`` or
``\\r\\n``; the arguments as the command line gave them). A blank text
has nothing to classify: its line is empty (``--json``: its object has
``label``, ``confidence`` and ``probabilities`` null), so that output line
N still answers input line N. A text that is not UTF-8, or holds a NUL
byte (binary data: the scoring job rejects it), gets the same line and a
warning on standard error with its number. Exit status 0 when every
text that was not blank was classified, 3 when some were not text, 2 when
nothing could be classified.
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from cli import quiet  # pylint: disable=unused-import,g-bad-import-order
import json
import os
import sys
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import cli
from cli import flags
from schemas import raw
from serving import exports
from serving import predictions
# The rows it prints, still importable from here as before.
from serving.predictions import predict  # pylint: disable=unused-import

# Texts classified together: the model's batch, and how much of standard
# input is held at once.
BATCH_SIZE = 256


def given_texts(arguments: List[str]) -> Iterator[Tuple[str, bytes]]:
  """(how a warning names it, its bytes) of each text: the arguments, else
  standard input's lines, read as they come. Python decodes the command
  line with surrogateescape; os.fsencode gives its bytes back."""
  if arguments:
    for number, text in enumerate(arguments, 1):
      yield f'argument {number}', os.fsencode(text)
    return
  for number, line in enumerate(sys.stdin.buffer, 1):
    yield f'line {number}', _without_line_end(line)


def _without_line_end(line: bytes) -> bytes:
  for end in (b'\r\n', b'\n'):
    if line.endswith(end):
      return line[:-len(end)]
  return line


def decoded(name: str, data: bytes) -> Tuple[Optional[str], bool]:
  """(the text, whether it was UTF-8 text): None for one that is not UTF-8
  (classified with replacement characters, its prediction would be of
  another text) or holds a NUL (``raw.is_undecodable``: binary data, which
  the scoring job rejects), with a warning."""
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError:
    wrong = 'is not UTF-8 text'
  else:
    if not raw.is_undecodable(text):
      return text, True
    wrong = 'holds a NUL byte, not text'
  print(f'warning: {name} {wrong}, not classified', file=sys.stderr)
  return None, False


def _unclassified(data: bytes) -> Dict:
  return {'text': data.decode('utf-8', 'backslashreplace'), 'label': None,
          'confidence': None, 'probabilities': None}


def _line(result: Dict, as_json: bool) -> str:
  if not as_json and result['label'] is None:
    return ''
  if not as_json:
    probabilities = ' '.join(f'{k}={v:.4f}'
                             for k, v in result['probabilities'].items())
    return (f'{result["label"]}\t{result["confidence"]:.4f}\t'
            f'{probabilities}\t{result["text"][:80]}')
  line = json.dumps(result, ensure_ascii=False)
  try:
    line.encode(sys.stdout.encoding or 'utf-8')
  except UnicodeEncodeError:
    line = json.dumps(result)  # \u escapes: still JSON where text is not
  return line


def classify_in_batches(signature, label_names: List[str],
                        given: Iterable[Tuple[str, bytes]],
                        batch_size: int) -> Iterator[Tuple[Dict, bool]]:
  """(result, whether the text was UTF-8) of each given text, in order, a
  batch of ``batch_size`` texts at a time; a text that cannot be classified
  gets ``_unclassified``."""
  for batch in _batches(given, batch_size):
    texts = [decoded(name, data) for name, data in batch]
    rows = predictions.predict_batch(signature, label_names,
                                     [text for text, _ in texts])
    for (_, data), (_, utf8), row in zip(batch, texts, rows):
      yield row or _unclassified(data), utf8


def _batches(items: Iterable, size: int) -> Iterator[List]:
  batch = []
  for item in items:
    batch.append(item)
    if len(batch) == size:
      yield batch
      batch = []
  if batch:
    yield batch


def build_parser() -> flags.Parser:
  parser = flags.Parser(__doc__.split('\n\n')[0], module='trainer.predict',
                        fromfile_prefix_chars=None)
  parser.add_argument('--model_dir', required=True, type=flags.folder,
                      help='The trainer\'s model folder (its newest blessed '
                      'export is used) or one export folder (used as asked, '
                      'blessed or not).')
  parser.add_argument('--json', action='store_true',
                      help='One JSON object a line: text, label, confidence, '
                      'probabilities.')
  parser.add_argument('--batch_size', type=flags.integer(1, 100_000),
                      default=BATCH_SIZE,
                      help='Texts classified together; each batch is printed '
                      'as soon as it is classified.')
  parser.add_argument('texts', nargs='*',
                      help='Texts to classify; without any, one a line '
                      'from standard input.')
  return parser


def parse_args(argv):
  return flags.parse(build_parser(), argv)[0]


def run(argv=None):
  args = parse_args(argv)
  # A label or text that standard output's encoding lacks is printed
  # escaped, not a crash.
  sys.stdout.reconfigure(errors='backslashreplace')
  try:
    signature, metadata = exports.load(args.model_dir)
  except exports.ExportError as error:
    raise cli.JobError(str(error)) from error
  given = classified = not_utf8 = 0
  for result, utf8 in classify_in_batches(
      signature, metadata.label_names, given_texts(args.texts),
      args.batch_size):
    given += 1
    classified += result['label'] is not None
    not_utf8 += not utf8
    print(_line(result, args.json))
    if given % args.batch_size == 0:
      sys.stdout.flush()
  if not given:
    raise cli.JobError('no text given')
  if not classified:
    raise cli.JobError(f'none of the {given} texts given could be '
                       'classified (see the warnings)')
  if not_utf8:
    raise cli.IncompleteInput(
        f'{not_utf8} of the {given} texts given were not UTF-8 text and not '
        'classified (see the warnings); the others were')


def main():
  """The console script's entry point."""
  cli.main(run)


if __name__ == '__main__':
  main()
