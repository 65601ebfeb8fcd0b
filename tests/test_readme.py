"""Every command block of the README runs, as a reader would type it.

The blocks are read from README.md itself, so the README cannot drift from
the code: ``sh`` blocks line by line with bash in a scratch folder holding
the files the README says the reader has (``make`` targets as a dry run, in
the repository: the suite cannot run itself), ``python`` blocks with this
interpreter in the same folder, after the commands before them.
"""
import csv
import os
import random
import re
import subprocess
import sys

from tests.conftest import REPO

_BLOCK = re.compile(r'```(sh|python)\n(.*?)```', re.DOTALL)
_CUES = {'billing': ['charged', 'invoice', 'refund', 'payment', 'card'],
         'outage': ['down', 'error', 'timeout', 'offline', 'crash']}
_WORDS = ['the', 'my', 'account', 'since', 'today', 'please', 'help',
          'again', 'service', 'app', 'this', 'morning', 'still']


def readme_blocks():
  return _BLOCK.findall((REPO / 'README.md').read_text(encoding='utf-8'))


def _commands(block: str):
  """The commands of an sh block: continuation lines joined, comments and
  blank lines dropped."""
  joined = block.replace('\\\n', ' ')
  for line in joined.splitlines():
    command = re.sub(r'\s+#.*$', '', line).strip()
    if command:
      yield command


def _write_tickets(folder, count, labelled, seed):
  rng = random.Random(seed)
  with open(folder / ('tickets.csv' if labelled else 'new_tickets.csv'), 'w',
            newline='', encoding='utf-8') as handle:
    out = csv.writer(handle)
    out.writerow(['id', 'text', 'label'] if labelled else ['id', 'text'])
    for index in range(count):
      label = sorted(_CUES)[index % 2]
      words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 16))]
      words.insert(rng.randrange(len(words)), rng.choice(_CUES[label]))
      row = [f't{seed}-{index}', ' '.join(words)]
      out.writerow(row + [label] if labelled else row)


def test_every_command_block_of_the_readme_runs(tmp_path):
  _write_tickets(tmp_path, 400, True, 0)
  _write_tickets(tmp_path, 60, False, 1)
  # The console scripts beside this interpreter, as in an activated .venv.
  env = {**os.environ, 'PATH': os.path.dirname(sys.executable) + os.pathsep +
         os.environ['PATH']}
  ran = []
  for language, block in readme_blocks():
    if language == 'python':
      commands = [[sys.executable, '-c', block]]
    else:
      commands = [['make', '-n', *command.split()[1:]]
                  if command.startswith('make ') else ['bash', '-c', command]
                  for command in _commands(block)]
    for command in commands:
      result = subprocess.run(
          command, cwd=REPO if command[0] == 'make' else tmp_path, env=env,
          capture_output=True, text=True, timeout=900, check=False)
      assert result.returncode == 0, (command, result.stderr[-3000:])
      ran.append((command, result.stdout))
  typed = [command[-1] for command, _ in ran if command[0] == 'bash']
  assert [command.split()[0] for command in typed] == [
      'textclf-preprocess', 'textclf-train', 'textclf-score',
      'textclf-predict']
  predicted = [out for command, out in ran if 'textclf-predict' in
               command[-1]][0]
  assert predicted.split('\t')[0] == 'billing'
  python = [out for command, out in ran if command[0] == sys.executable]
  api, counts = python[0], python[1:]
  assert api.splitlines()[0] == 'billing'
  assert 'prediction' in api and 'confidence' in api
  assert 'outage' in counts[0] and 'billing' in counts[1]
