"""Classify text on the command line with an exported model.

    python -m trainer.predict --model_dir=DIR "some text" ["more text" ...]
    cat texts.txt | python -m trainer.predict --model_dir=DIR

Prints one line a text: the predicted label, its confidence and the
probability of every class (``--json`` for one JSON object a line).

Texts are read as bytes (standard input's lines without their ``\\n`` or
``\\r\\n``; the arguments as the command line gave them) and must be UTF-8: a
text that is not, or is blank, gets a warning on standard error with its
number and is not classified, and the others are. Exit status 0 when every
text was classified, 3 when some were skipped, 2 when none could be.
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from cli import quiet  # pylint: disable=unused-import,g-bad-import-order
import json
import os
import sys
from typing import Dict, Iterable, List, Tuple

import cli
from cli import flags
from schemas import serving
from serving import exports


def predict(signature, label_names: List[str],
            texts: List[str]) -> List[Dict]:
  """The seed article's predict(text), for a batch of texts."""
  outputs = signature(text=[t.encode('utf-8') for t in texts])
  results = []
  for index, text in enumerate(texts):
    probabilities = outputs[serving.PROBABILITIES][index].numpy().tolist()
    results.append({
        'text': text,
        'label': outputs[serving.LABEL][index].numpy().decode('utf-8'),
        'confidence': float(outputs[serving.CONFIDENCE][index].numpy()),
        'probabilities': dict(zip(label_names, probabilities)),
    })
  return results


def given_texts(arguments: List[str]) -> List[Tuple[str, bytes]]:
  """(how a warning names it, its bytes) of each text: the arguments, else
  standard input's lines. Python decodes the command line with
  surrogateescape; os.fsencode gives its bytes back."""
  if arguments:
    return [(f'argument {number}', os.fsencode(text))
            for number, text in enumerate(arguments, 1)]
  return [(f'line {number}', _without_line_end(line))
          for number, line in enumerate(sys.stdin.buffer, 1)]


def _without_line_end(line: bytes) -> bytes:
  for end in (b'\r\n', b'\n'):
    if line.endswith(end):
      return line[:-len(end)]
  return line


def readable(texts: Iterable[Tuple[str, bytes]]) -> List[str]:
  """The texts that can be classified; a warning for each one that cannot.

  A text that is not UTF-8 is skipped, not classified with replacement
  characters: its prediction would be of another text.
  """
  kept = []
  for name, data in texts:
    try:
      text = data.decode('utf-8')
    except UnicodeDecodeError:
      print(f'warning: {name} is not UTF-8 text, skipped', file=sys.stderr)
      continue
    if not text.strip():
      print(f'warning: {name} is blank, skipped', file=sys.stderr)
      continue
    kept.append(text)
  return kept


def _line(result: Dict, as_json: bool) -> str:
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


def run(argv=None):
  parser = flags.Parser(__doc__.split('\n\n')[0], fromfile_prefix_chars=None)
  parser.add_argument('--model_dir', required=True,
                      help='The trainer\'s model folder or one export folder.')
  parser.add_argument('--json', action='store_true')
  parser.add_argument('texts', nargs='*',
                      help='Texts to classify; without any, one a line '
                      'from standard input.')
  args, _ = flags.parse(parser, argv)
  # A label or text that standard output's encoding lacks is printed
  # escaped, not a crash.
  sys.stdout.reconfigure(errors='backslashreplace')
  given = given_texts(args.texts)
  if not given:
    raise cli.JobError('no text given')
  texts = readable(given)
  if not texts:
    raise cli.JobError(f'none of the {len(given)} texts given could be '
                       'classified (see the warnings)')
  try:
    signature, metadata = exports.load(args.model_dir)
  except exports.ExportError as error:
    raise cli.JobError(str(error)) from error
  for result in predict(signature, metadata['label_names'], texts):
    print(_line(result, args.json))
  if len(texts) < len(given):
    raise cli.IncompleteInput(
        f'{len(given) - len(texts)} of the {len(given)} texts given were '
        'skipped (see the warnings); the others were classified')


if __name__ == '__main__':
  cli.main(run)
