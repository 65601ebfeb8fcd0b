"""Argument files: every job reads flags from @FILE, and the configurations
under configs/ are flag sets the jobs accept."""
import importlib.util

import pytest

from pipeline import preprocess
from pipeline import score
from tests.conftest import REPO
from trainer import model as model_lib
from trainer import settings as settings_lib
from trainer import train

CONFIGS = REPO / 'configs'
NAMES = sorted(path.name for path in CONFIGS.iterdir() if path.is_dir())
# The flags no configuration holds: where the data is and the output goes.
REQUIRED = {
    'preprocess': ['--input=in.jsonl', '--output_dir=out'],
    'train': ['--data_dir=data', '--model_dir=model'],
}


def parse(job, argv):
  """The job's parsed flags; a flag it does not know fails the test (the
  preprocessing job would hand it to Beam)."""
  if job == 'train':
    return train.parse_args(argv)
  args, unknown = preprocess.parse_args(argv)
  assert not unknown, unknown
  return args


def test_each_job_reads_flags_from_an_argument_file(tmp_path):
  flags = tmp_path / 'flags.args'
  flags.write_text('--max_len=7\n--no-drop_punctuation\n--test_fraction=0.3\n')
  args = parse('preprocess', [f'@{flags}', *REQUIRED['preprocess'],
                              '--max_len=9'])
  # A flag after the file overrides it.
  assert (args.max_len, args.drop_punctuation, args.test_fraction) == (
      9, False, 0.3)
  flags.write_text('--epochs=5\n--no-decay\n--model=nbsvm\n')
  args = parse('train', [*REQUIRED['train'], f'@{flags}'])
  assert (args.epochs, args.decay, args.model) == (5, False, 'nbsvm')
  flags.write_text('--batch_size=64\n--partition=dt=2026-11-23\n')
  args, unknown = score.parse_args(['--input=in.jsonl', '--model_dir=m',
                                    '--output_dir=out', f'@{flags}'])
  assert not unknown
  assert (args.batch_size, args.partition) == (64, 'dt=2026-11-23')


def test_the_documented_configurations_exist():
  assert {'imdb_seed', 'imdb_best', 'spamassassin', 'sms'} <= set(NAMES)


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('job', ['preprocess', 'train'])
def test_every_configuration_is_a_valid_flag_set(name, job):
  config = CONFIGS / name / f'{job}.args'
  lines = config.read_text().splitlines()
  # argparse takes each line as one argument, comments and blanks included.
  assert lines and all(line.startswith('--') and line == line.strip()
                       for line in lines), config
  args = parse(job, [*REQUIRED[job], f'@{config}'])
  if job == 'train':
    settings_lib.model_params(args)  # a ValueError for values the model refuses


def test_the_defaults_are_the_hybrid_and_imdb_seed_the_keras_io_model():
  defaults = settings_lib.model_params(parse('train', REQUIRED['train']))
  assert (defaults.model, defaults.ngram_min_count) == ('hybrid', 0)
  assert parse('train', REQUIRED['train']).epochs is None  # from the data
  # imdb_seed stays the keras.io model whatever the defaults.
  seed = parse('train', [*REQUIRED['train'],
                         f'@{CONFIGS / "imdb_seed" / "train.args"}'])
  assert settings_lib.model_params(seed) == model_lib.ModelParams(
      model='transformer', transformer_vocab=0, transformer_len=0)
  assert (seed.epochs, seed.monitor, seed.bucket_width) == (2, 'val_loss', 0)
  seed = parse('preprocess', [*REQUIRED['preprocess'],
                              f'@{CONFIGS / "imdb_seed" / "preprocess.args"}'])
  assert (seed.vocab_size, seed.max_len, seed.drop_punctuation) == (
      20000, 200, True)


def test_the_training_benchmark_runs_every_configuration():
  spec = importlib.util.spec_from_file_location('bench_train',
                                                REPO / 'bench' / 'train.py')
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  assert {run.split(':')[0] for run in bench.RUNS} == {*NAMES, bench.DEFAULTS}
  assert {f'{bench.DEFAULTS}:{corpus}' for corpus in bench.CORPORA} <= set(
      bench.RUNS)
  assert bench.config_flags('sms', 'train') == (
      CONFIGS / 'sms' / 'train.args').read_text().splitlines()
