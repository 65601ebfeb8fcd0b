"""Classify text on the command line with an exported model.

    python -m trainer.predict --model_dir=DIR "some text" ["more text" ...]
    cat texts.txt | python -m trainer.predict --model_dir=DIR

Prints one line a text: the predicted label, its confidence and the
probability of every class (``--json`` for one JSON object a line).
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from cli import quiet  # pylint: disable=unused-import,g-bad-import-order
import json
import sys
from typing import Dict, List

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


def run(argv=None):
  parser = flags.Parser(__doc__.split('\n\n')[0], fromfile_prefix_chars=None)
  parser.add_argument('--model_dir', required=True,
                      help='The trainer\'s model folder or one export folder.')
  parser.add_argument('--json', action='store_true')
  parser.add_argument('texts', nargs='*',
                      help='Texts to classify; without any, one a line '
                      'from standard input.')
  args, _ = flags.parse(parser, argv)
  texts = args.texts or [line.rstrip('\n') for line in sys.stdin if line.strip()]
  if not texts:
    raise cli.JobError('no text given')
  try:
    signature, metadata = exports.load(args.model_dir)
  except exports.ExportError as error:
    raise cli.JobError(str(error)) from error
  for result in predict(signature, metadata['label_names'], texts):
    if args.json:
      print(json.dumps(result, ensure_ascii=False))
    else:
      probabilities = ' '.join(f'{k}={v:.4f}'
                               for k, v in result['probabilities'].items())
      print(f'{result["label"]}\t{result["confidence"]:.4f}\t{probabilities}\t'
            f'{result["text"][:80]}')


if __name__ == '__main__':
  cli.main(run)
