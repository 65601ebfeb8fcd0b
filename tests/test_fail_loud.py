"""A run that did not do its job never ends in exit 0 or ``_SUCCESS``: an
unknown flag, a wrong field, format or encoding, too many rejections, a
broken model."""
import importlib
import os
import shutil

import pytest
import tensorflow as tf

import cli
from cli import flags
import outputs
from pipeline import filesystems
from pipeline import preprocess
from pipeline import score
from pipeline.scoring import inference
from schemas import rejected
from schemas import serving
from tests.conftest import BrokenHandler
from tests.conftest import main_in_process
from tests.conftest import POISON
from tests.conftest import PoisonedHandler
from tests.conftest import run_module
from tests.conftest import synthetic_reviews
from tests.conftest import write_jsonl
from tests.conftest import tree
from trainer import predict
from trainer import train

# Each entry point, its required flags, and a misspelled flag of its own.
ENTRY_POINTS = {
    'pipeline.score': (['--input=x', '--model_dir=m', '--output_dir=o'],
                       '--keep_feilds=label:true_label', '--keep_fields'),
    'pipeline.preprocess': (['--input=x', '--output_dir=o'],
                            '--vocab_sise=100', '--vocab_size'),
    'trainer.train': (['--data_dir=d', '--model_dir=m'], '--epohcs=3',
                      '--epochs'),
    'trainer.predict': (['--model_dir=m'], '--jsonn', '--json'),
    'pipeline.datasets': (['fetch', 'imdb', '--dest=d'], '--cahce=c',
                          '--cache'),
}


@pytest.mark.parametrize('module', sorted(ENTRY_POINTS))
def test_an_unknown_flag_ends_every_entry_point_naming_the_closest(module):
  required, typo, meant = ENTRY_POINTS[module]
  process = run_module(module, *required, typo, timeout=120)
  assert process.returncode == cli.EXIT_JOB_ERROR
  errors = [line for line in process.stderr.splitlines()
            if line.startswith('error:')]
  assert errors == [f'error: unknown flag {typo.split("=")[0]}; did you '
                    f'mean {meant}? (see --help)']


@pytest.mark.parametrize('module', sorted(ENTRY_POINTS))
def test_help_shows_the_required_flags_as_required(module, capsys):
  """Made optional while the flags are parsed (so that a misspelt one is
  named as unknown), they are still shown required in --help's usage."""
  required, _, _ = ENTRY_POINTS[module]
  with pytest.raises(SystemExit) as exited:
    importlib.import_module(module).run(
        [word for word in required if not word.startswith('--')] + ['--help'])
  assert exited.value.code == 0
  usage = ' '.join(capsys.readouterr().out.split('\n\n')[0].split())
  for flag in (word.split('=')[0] for word in required
               if word.startswith('--')):
    assert f' {flag} {flag[2:].upper()}' in usage, usage
    assert f'[{flag} ' not in usage, usage


@pytest.mark.parametrize('module', sorted(ENTRY_POINTS))
def test_a_misspelt_required_flag_is_named_with_the_closest(
    module, monkeypatch, capsys):
  """Misspelt, a required flag is an unknown one, named with the flag
  meant, not only a missing one."""
  required, _, _ = ENTRY_POINTS[module]
  flag, value = required[-1].split('=')
  misspelt = flag[:3] + flag[4:]  # --output_dir: --otput_dir
  status, stderr = main_in_process(
      monkeypatch, capsys, importlib.import_module(module).run,
      *required[:-1], f'{misspelt}={value}')
  assert status == cli.EXIT_JOB_ERROR
  assert stderr.splitlines() == [f'error: unknown flag {misspelt}; did you '
                                 f'mean {flag}? (see --help)']
  # Left out, it is missing.
  status, stderr = main_in_process(
      monkeypatch, capsys, importlib.import_module(module).run,
      *required[:-1])
  assert stderr.splitlines() == [
      f'error: the following arguments are required: {flag} (see --help)']


@pytest.mark.parametrize('module', sorted(ENTRY_POINTS))
def test_a_flag_given_twice_ends_every_entry_point(module, tmp_path,
                                                   monkeypatch, capsys):
  """Given twice, on the command line or in @FILEs, a flag is an error,
  not its last value; on the command line after an @FILE it overrides the
  file's (tests/test_configs.py)."""
  required, _, _ = ENTRY_POINTS[module]
  flag = required[-1].split('=')[0]
  run = importlib.import_module(module).run
  status, stderr = main_in_process(monkeypatch, capsys, run, *required,
                                   f'{flag}=again')
  assert status == cli.EXIT_JOB_ERROR
  assert stderr.splitlines() == [
      f'error: {flag} given twice: give it once (see --help)']
  if module == 'trainer.predict':
    return  # its texts come from the command line, not @FILEs
  looping = tmp_path / 'loop.args'
  looping.write_text(f'@{looping}\n')
  status, stderr = main_in_process(monkeypatch, capsys, run, *required,
                                   f'@{looping}')
  assert status == cli.EXIT_JOB_ERROR
  assert 'includes itself' in stderr.splitlines()[-1]
  # Twice in the @FILEs, or before an @FILE that gives it too: an error.
  first, second = tmp_path / 'a.args', tmp_path / 'b.args'
  first.write_text(f'{flag}=a\n')
  second.write_text(f'{flag}=b\n')
  for words, where in (
      ([f'@{first}', f'@{second}'], f"in '{first}' and in '{second}'"),
      ([f'@{first}', f'@{first}'], f"twice in '{first}'"),
      ([f'{flag}=c', f'@{first}'], f"on the command line, then in '{first}'")):
    status, stderr = main_in_process(monkeypatch, capsys, run,
                                     *required[:-1], *words)
    assert status == cli.EXIT_JOB_ERROR
    assert stderr.splitlines()[-1].startswith(f'error: {flag} given {where}')
  # An @FILE that is not UTF-8 is a usage error too, not a crash.
  latin1 = tmp_path / 'latin1.args'
  latin1.write_bytes(f'{flag}=caf\xe9\n'.encode('latin-1'))
  status, stderr = main_in_process(monkeypatch, capsys, run, *required[:-1],
                                   f'@{latin1}')
  assert status == cli.EXIT_JOB_ERROR
  assert stderr.splitlines() == [
      f"error: '@{latin1}' is not UTF-8 text (invalid continuation byte at "
      f'byte {len(flag) + 4}) (see --help)']


def test_beam_options_pass_and_bad_ones_are_refused():
  args = ['--input=x', '--model_dir=m', '--output_dir=o']
  _, pipeline_args = score.parse_args(args + [
      '--runner=DirectRunner', '--direct_num_workers=2', '--project=p',
      '--s3_endpoint_url=http://127.0.0.1:9', '--dask_client_address=h:1'])
  assert len(pipeline_args) == 5
  for bad in ('--direct_running_mode=bogus', '--runner=NoSuchRunner',
              'stray', '--direct_num_workerz=2', '--direct_num_workers=-1'):
    with pytest.raises(SystemExit) as exit_info:
      score.parse_args(args + [bad])
    assert exit_info.value.code == cli.EXIT_JOB_ERROR


@pytest.fixture(scope='module')
def scored_once(trained, tmp_path_factory):
  """An output folder with a partition dt=1 scored once."""
  model_dir, _, _ = trained
  folder = tmp_path_factory.mktemp('published')
  corpus = write_jsonl(folder / 'good.jsonl', synthetic_reviews(40, 21))
  output = folder / 'scores'
  score.run([f'--input={corpus}', f'--model_dir={model_dir}',
             f'--output_dir={output}', '--partition=dt=1'])
  return output


@pytest.fixture
def published(scored_once, tmp_path):
  """A copy of that output folder, and its files: what a failed rerun must
  leave byte for byte."""
  output = tmp_path / 'scores'
  shutil.copytree(scored_once, output)
  return output, tree(output)


def rerun(monkeypatch, capsys, trained, published, corpus, *extra):
  """Scores ``corpus`` into the published partition as ``python -m``
  would; returns (status, the error lines)."""
  model_dir, _, _ = trained
  status, stderr = main_in_process(
      monkeypatch, capsys, score.run, f'--input={corpus}',
      f'--model_dir={model_dir}', f'--output_dir={published[0]}',
      '--partition=dt=1', *extra)
  return status, [line for line in stderr.splitlines()
                  if line.startswith('error:')]


def write_lines(path, lines, encoding='utf-8'):
  with open(path, 'w', encoding=encoding) as out:
    out.writelines(line + '\n' for line in lines)
  return path


@pytest.mark.parametrize('corpus, flags, message', [
    (lambda d: write_jsonl(d / 'in.jsonl', synthetic_reviews(30, 22)),
     ['--text_field=body'], 'is --text_field=text meant?'),
    (lambda d: write_jsonl(d / 'in.jsonl', synthetic_reviews(30, 22)),
     ['--format=csv'], 'is --format=jsonl meant?'),
    (lambda d: write_lines(d / 'in.jsonl', [
        '{"id": "u%d", "text": "a fine film"}' % i for i in range(30)],
                           encoding='utf-16'),
     [], 'is --encoding=utf-16 meant?'),
    (lambda d: write_lines(d / 'in.csv', ['id,body'] + [
        f'{i},a fine film' for i in range(30)]),
     [], 'the records have fields id, body — is --text_field=body meant?'),
    # The records would be accepted, with positions for ids.
    (lambda d: write_jsonl(d / 'in.jsonl', synthetic_reviews(30, 22)),
     ['--id_field=ident'], 'has the field ident (--id_field), so the job did '
     'not start; the records have fields id, text, label, split — is '
     '--id_field=id meant?'),
], ids=['wrong-field', 'wrong-format', 'wrong-encoding', 'csv-no-column',
        'wrong-id-field'])
def test_input_nothing_of_which_is_accepted_stops_before_the_pipeline(
    trained, published, tmp_path, monkeypatch, capsys, corpus, flags,
    message):
  status, errors = rerun(monkeypatch, capsys, trained, published,
                         corpus(tmp_path), *flags)
  assert status == cli.EXIT_JOB_ERROR
  assert len(errors) == 1 and 'so the job did not start' in errors[0]
  assert message in errors[0]
  assert tree(published[0]) == published[1]


def test_a_preprocessing_run_with_a_wrong_field_stops_before_the_pipeline(
    tmp_path, monkeypatch, capsys):
  from pipeline import preprocess  # pylint: disable=import-outside-toplevel
  corpus = write_jsonl(tmp_path / 'in.jsonl', synthetic_reviews(30, 23))
  status, stderr = main_in_process(
      monkeypatch, capsys, preprocess.run, f'--input={corpus}',
      f'--output_dir={tmp_path}/out', '--label_field=sentiment')
  assert status == cli.EXIT_JOB_ERROR
  assert 'missing_label 30' in stderr
  assert 'is --label_field=label meant?' in stderr
  assert not (tmp_path / 'out').exists()


def test_every_field_no_record_has_is_named_in_one_error_line(
    tmp_path, monkeypatch, capsys):
  corpus = write_jsonl(tmp_path / 'in.jsonl', synthetic_reviews(30, 23))
  status, stderr = main_in_process(
      monkeypatch, capsys, preprocess.run, f'--input={corpus}',
      f'--output_dir={tmp_path}/out', '--text_field=body',
      '--label_field=sentiment', '--id_field=ident')
  assert status == cli.EXIT_JOB_ERROR
  (error,) = stderr.splitlines()
  assert error.startswith(
      f'error: none of the first 30 records of {corpus} would be accepted, '
      'so the job did not start (missing_text 30, e.g. ')
  assert error.endswith(
      '; no record has the field body (--text_field), sentiment '
      '(--label_field) or ident (--id_field); the records have fields id, '
      'text, label, split — is --text_field=text --label_field=label '
      '--id_field=id meant?)')
  assert not (tmp_path / 'out').exists()


def some_empty(count, empty, seed):
  """``count`` reviews, the first ``empty`` of them blank: rejected, but
  not enough of the first hundred to stop the preflight."""
  rows = synthetic_reviews(count, seed)
  for row in rows[:empty]:
    row['text'] = ' '
  return rows


def test_a_run_over_its_rejection_budget_publishes_nothing(
    trained, published, tmp_path, monkeypatch, capsys):
  corpus = write_jsonl(tmp_path / 'in.jsonl', some_empty(50, 10, 24))
  status, errors = rerun(monkeypatch, capsys, trained, published, corpus)
  assert status == cli.EXIT_TOO_MANY_REJECTED
  assert len(errors) == 1
  assert errors[0].startswith(
      'error: 10 of 50 records rejected, more than '
      '--max_rejected_fraction=0.1 allows (empty_text 10, e.g. ')
  kept = errors[0].rsplit('the dead letters are in ', 1)[1]
  letters = []
  for name in os.listdir(kept):
    with open(os.path.join(kept, name), encoding='utf-8') as handle:
      letters.extend(handle)
  assert len(letters) == 10
  assert tree(published[0]) == published[1]
  # Exactly its share is within the budget; the next publish clears what
  # the failed run kept.
  status, errors = rerun(monkeypatch, capsys, trained, published, corpus,
                         '--max_rejected_fraction=0.2')
  assert (status, errors) == (0, [])
  assert os.path.exists(published[0] / 'dt=1' / outputs.SUCCESS_MARKER)
  assert not os.path.exists(kept)


def test_a_model_that_fails_on_every_batch_stops_the_job(
    trained, published, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(inference, 'RawTextModelHandler', BrokenHandler)
  corpus = write_jsonl(tmp_path / 'in.jsonl', synthetic_reviews(60, 25))
  status, errors = rerun(monkeypatch, capsys, trained, published, corpus,
                         '--batch_size=20')
  assert status == cli.EXIT_MODEL_FAILED
  assert errors == [
      f'error: {inference.MODEL_FAILED} 9 documents of a batch, each alone '
      '(more than the 8 a poison document explains): ValueError: poisoned '
      'batch']
  assert tree(published[0]) == published[1]


def test_one_poison_document_is_one_dead_letter_of_a_successful_run(
    trained, published, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(inference, 'RawTextModelHandler', PoisonedHandler)
  rows = synthetic_reviews(60, 26)
  rows[17]['text'] += f' {POISON}'
  corpus = write_jsonl(tmp_path / 'in.jsonl', rows)
  status, errors = rerun(monkeypatch, capsys, trained, published, corpus,
                         '--batch_size=20')
  assert (status, errors) == (0, [])
  manifest = filesystems.read_json(
      str(published[0] / 'dt=1' / '_manifest.json'))
  assert manifest['counts']['rejected_by_reason'] == {
      rejected.INFERENCE_FAILED: 1}


class RaisingClassifier(tf.Module):
  """An export's serving signature that fails on any input."""

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.string, name=serving.TEXT)])
  def classify(self, text):
    tf.debugging.assert_equal(tf.size(text), -1, message='broken export')
    return {serving.PROBABILITIES: tf.zeros([tf.size(text), 2])}


def test_an_export_that_fails_on_every_document_stops_before_the_pipeline(
    trained, published, tmp_path, monkeypatch, capsys):
  export, module = tmp_path / 'broken', RaisingClassifier()
  tf.saved_model.save(module, str(export),
                      signatures={serving.SIGNATURE: module.classify})
  (export / 'assets.extra').mkdir()
  (export / serving.METADATA_FILE).write_text(
      '{"label_names": ["neg", "pos"], "version": 1}')
  corpus = write_jsonl(tmp_path / 'in.jsonl', synthetic_reviews(30, 27))
  status, stderr = main_in_process(
      monkeypatch, capsys, score.run, f'--input={corpus}',
      f'--model_dir={export}', f'--output_dir={published[0]}',
      '--partition=dt=1')
  assert status == cli.EXIT_MODEL_FAILED
  assert 'each of the first 9 documents of the input, so the job did not '\
      'start' in stderr and 'broken export' in stderr
  assert tree(published[0]) == published[1]


def test_an_empty_input_publishes_nothing(trained, published, tmp_path,
                                          monkeypatch, capsys):
  corpus = tmp_path / 'empty.jsonl'
  corpus.write_text('\n\n')
  status, errors = rerun(monkeypatch, capsys, trained, published, corpus)
  assert status == cli.EXIT_JOB_ERROR
  assert errors == [f'error: no record in {corpus}: the files it matches '
                    'are empty, so the job did not start']
  assert tree(published[0]) == published[1]


class _Parsed(Exception):
  pass


def _parser_of(parse_args, monkeypatch):
  """The flags.Parser an entry point's parse_args builds."""
  built = []

  def capture(parser, *_, **__):
    built.append(parser)
    raise _Parsed

  monkeypatch.setattr(flags, 'parse', capture)
  with pytest.raises(_Parsed):
    parse_args([])
  monkeypatch.undo()
  return built[0]


@pytest.mark.parametrize('module', ['pipeline.preprocess', 'pipeline.score',
                                    'trainer.train', 'trainer.predict'])
def test_no_integer_flag_takes_a_value_beyond_32_bits(module, monkeypatch,
                                                      capsys):
  parse_args = {'pipeline.preprocess': preprocess.parse_args,
                'pipeline.score': score.parse_args,
                'trainer.train': train.parse_args,
                'trainer.predict': predict.parse_args}[module]
  required = ENTRY_POINTS[module][0]
  parser = _parser_of(parse_args, monkeypatch)
  integer_flags = [action.option_strings[0] for action in parser._actions  # pylint: disable=protected-access
                   if getattr(action.type, '__name__', '') == 'integer']
  assert integer_flags
  for flag in integer_flags:
    with pytest.raises(SystemExit) as exit_info:
      parser.parse_args([*required, f'{flag}={2**32}'])
    assert exit_info.value.code == cli.EXIT_JOB_ERROR
    assert f'argument {flag}: must be' in capsys.readouterr().err


def test_a_dataflow_run_without_its_options_names_every_one_missing(
    tmp_path, monkeypatch, capsys):
  corpus = write_jsonl(tmp_path / 'in.jsonl', synthetic_reviews(10, 0))
  status, stderr = main_in_process(
      monkeypatch, capsys, preprocess.run, f'--input={corpus}',
      f'--output_dir={tmp_path / "out"}', '--runner=DataflowRunner')
  assert status == cli.EXIT_JOB_ERROR
  line = stderr.strip().splitlines()[-1]
  for option in ('temp_location', 'project', 'region'):
    assert option in line
  assert sorted(os.listdir(tmp_path)) == ['in.jsonl']


def test_the_trainer_refuses_batches_larger_than_the_train_split(
    tmp_path, monkeypatch, capsys, synthetic_preprocessed):
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={synthetic_preprocessed}',
      f'--model_dir={tmp_path / "model"}', '--batch_size=100000')
  assert status == cli.EXIT_JOB_ERROR
  assert 'examples of the train split' in stderr.splitlines()[-1]
  assert not (tmp_path / 'model').exists()


@pytest.mark.parametrize('under', ['', 'sub'])
def test_the_trainer_refuses_a_file_as_its_model_folder(
    tmp_path, monkeypatch, capsys, synthetic_preprocessed, under):
  (tmp_path / 'afile').write_text('kept')
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, f'--data_dir={synthetic_preprocessed}',
      f'--model_dir={tmp_path / "afile" / under}', '--epochs=1')
  assert status == cli.EXIT_JOB_ERROR
  assert 'is a file' in stderr.splitlines()[-1]
  assert (tmp_path / 'afile').read_text() == 'kept'


@pytest.mark.parametrize('module', ['pipeline.preprocess', 'pipeline.score'])
def test_a_progress_interval_beyond_a_day_is_a_usage_error(module,
                                                          monkeypatch, capsys):
  parse_args = {'pipeline.preprocess': preprocess.parse_args,
                'pipeline.score': score.parse_args}[module]
  with pytest.raises(SystemExit) as exit_info:
    parse_args([*ENTRY_POINTS[module][0], '--progress_seconds=1e10'])
  assert exit_info.value.code == cli.EXIT_JOB_ERROR
  assert 'argument --progress_seconds: must be' in capsys.readouterr().err
