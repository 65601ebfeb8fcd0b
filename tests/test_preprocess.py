"""The preprocessing job on small data the tests write, and its failure modes."""
import collections
import errno
import importlib
import json
import os
import unicodedata

from apache_beam.io import filesystem
import pytest
import tensorflow_transform as tft

import cli
import outputs
from pipeline import preprocess
from pipeline import readers
from pipeline.preprocessing import settings as preprocess_settings
from schemas import raw
from schemas import rejected
from schemas import transformed
from tests.conftest import beam_pipeline
from tests.conftest import dead_letters
from tests.conftest import main_in_process
from tests.conftest import read_examples
from tests.conftest import synthetic_reviews
from tests.conftest import write_jsonl


def good_rows(count, split):
  words = ['great', 'awful', 'plot', 'acting', 'boring', 'superb']
  return [{'id': f'{split}{i}', 'split': split,
           'label': 'pos' if i % 2 else 'neg',
           'text': ' '.join(words[(i + j) % 6] for j in range(3 + i % 5))}
          for i in range(count)]


BAD_ROWS = {
    'empty': ({'id': 'empty', 'text': '', 'label': 'pos', 'split': 'train'},
              rejected.EMPTY_TEXT),
    'blank': ({'id': 'blank', 'text': ' \t\n ', 'label': 'pos',
               'split': 'train'}, rejected.EMPTY_TEXT),
    'nolabel': ({'id': 'nolabel', 'text': 'words', 'split': 'train'},
                rejected.MISSING_LABEL),
    'emptylabel': ({'id': 'emptylabel', 'text': 'words', 'label': ' ',
                    'split': 'train'}, rejected.MISSING_LABEL),
    'notext': ({'id': 'notext', 'label': 'pos', 'split': 'train'},
               rejected.MISSING_TEXT),
    'wrongtype': ({'id': 'wrongtype', 'text': ['a', 'list'], 'label': 'pos',
                   'split': 'train'}, rejected.WRONG_TYPE),
    'giant': ({'id': 'giant', 'text': 'word ' * 2000, 'label': 'pos',
               'split': 'train'}, rejected.TEXT_TOO_LONG),
    'badsplit': ({'id': 'badsplit', 'text': 'words', 'label': 'pos',
                  'split': 'holdout'}, rejected.UNKNOWN_SPLIT),
    'nosplit': ({'id': 'nosplit', 'text': 'words', 'label': 'pos'},
                rejected.MISSING_SPLIT),
    'newlabel': ({'id': 'newlabel', 'text': 'words', 'label': 'meh',
                  'split': 'test'}, rejected.LABEL_NOT_IN_TRAIN),
    'newvalidationlabel': ({'id': 'newvalidationlabel', 'text': 'words',
                            'label': 'meh', 'split': 'valid'},
                           rejected.LABEL_NOT_IN_TRAIN),
    # TFT's vocabulary files are newline-delimited: it drops such a label,
    # and its examples would carry label_id -1.
    'newlinelabel': ({'id': 'newlinelabel', 'text': 'words', 'label': 'x\ny',
                      'split': 'train'}, rejected.BAD_LABEL),
    'crlabel': ({'id': 'crlabel', 'text': 'words', 'label': 'pos\r',
                 'split': 'train'}, rejected.BAD_LABEL),
    'tablabel': ({'id': 'tablabel', 'text': 'words', 'label': 'a\tb',
                  'split': 'train'}, rejected.BAD_LABEL),
    'nullabel': ({'id': 'nullabel', 'text': 'words', 'label': 'n\x00g',
                  'split': 'train'}, rejected.BAD_LABEL),
    'separatorlabel': ({'id': 'separatorlabel', 'text': 'words',
                        'label': 'a\u2028b', 'split': 'train'},
                       rejected.BAD_LABEL),
    'spacedlabel': ({'id': 'spacedlabel', 'text': 'words', 'label': ' pos',
                     'split': 'train'}, rejected.BAD_LABEL),
    'spacedevallabel': ({'id': 'spacedevallabel', 'text': 'words',
                         'label': 'neg ', 'split': 'test'},
                        rejected.BAD_LABEL),
}


# Words of the held-out splits only, more frequent there than any train
# word is in train: were they analyzed, they would be in the vocabulary.
HELD_OUT_WORDS = {'dev': 'zebra', 'eval': 'yak'}


def held_out_rows():
  """Five rows a held-out split, named by aliases, of one word seven times."""
  return [{'id': f'{split}{i}', 'split': split, 'label': 'pos',
           'text': ' '.join([word] * 7)}
          for split, word in HELD_OUT_WORDS.items() for i in range(5)]


@pytest.fixture(scope='module')
def small_job(tmp_path_factory):
  """One run of the job over good rows, every kind of bad row, held-out
  rows of words train never has, and a long single-token document that must
  pass. The data names every split (--validation_fraction=0)."""
  folder = tmp_path_factory.mktemp('small')
  long_token = {'id': 'longtoken', 'text': 'z' * 3000 + ' great',
                'label': 'pos', 'split': 'train'}
  write_jsonl(folder / 'a.jsonl', good_rows(30, 'train') + [long_token] +
              [row for row, _ in BAD_ROWS.values()])
  write_jsonl(folder / 'b.jsonl', good_rows(12, 'test') + held_out_rows() + [
      b'{"id": "broken", "text": ', b'\xff\xfe not utf-8'])
  output = folder / 'out'
  stats = preprocess.run([
      f'--input={folder}/*.jsonl', f'--output_dir={output}',
      '--split_field=split', '--max_len=6', '--vocab_size=6',
      '--max_text_bytes=5000', '--validation_fraction=0',
      # Every kind of bad row, on purpose.
      '--max_rejected_fraction=1'])
  return folder, output, stats


def test_counts_reconcile_and_every_bad_row_is_a_dead_letter(small_job):
  _, output, stats = small_job
  expected = {}
  for _, reason in BAD_ROWS.values():
    expected[reason] = expected.get(reason, 0) + 1
  expected[rejected.MALFORMED_RECORD] = 1
  expected[rejected.UNDECODABLE_TEXT] = 1
  assert stats['rejected_by_reason'] == expected
  records = stats['records']
  assert records['written'] == {'train': 31, 'validation': 5, 'test': 17}
  assert records['read'] == 31 + 5 + 17 + sum(expected.values())
  dead = dead_letters(output)
  assert len(dead) == records['rejected']
  by_id = {row['id']: row for row in dead}
  for record_id, (row, reason) in BAD_ROWS.items():
    assert by_id[record_id]['reason'] == reason
    assert by_id[record_id]['source'].endswith('a.jsonl')
  # A letter about the label shows it, escaped: 'x\ny' read as "x\ny".
  assert by_id['newlinelabel']['snippet'] == 'label "x\\ny": words'
  assert by_id['newlabel']['snippet'] == 'label "meh": words'
  assert by_id['nolabel']['snippet'] == 'label null: words'
  assert by_id['empty']['snippet'] == ''
  assert len(by_id['giant']['snippet']) == rejected.SNIPPET_CHARS
  assert set(dead[0]) == set(rejected.FIELDS)
  on_disk = json.loads((output / transformed.STATS_FILE).read_text())
  assert on_disk == stats


def test_runner_counters_show_each_record_once(tmp_path):
  # The input is read twice, to learn and then to write; one pass counts.
  empty_row, reason = BAD_ROWS['empty']
  write_jsonl(tmp_path / 'a.jsonl', good_rows(20, 'train') +
              good_rows(6, 'test') + [empty_row])
  args, _ = preprocess.parse_args([
      f'--input={tmp_path}/a.jsonl', f'--output_dir={tmp_path}/out',
      '--split_field=split', '--validation_fraction=0'])
  pipeline = beam_pipeline()
  preprocess.build_pipeline(
      pipeline, preprocess_settings.settings_from_args(args),
      str(tmp_path / 'staging'))
  result = pipeline.run()
  result.wait_until_finish()
  counters = collections.Counter()
  for counter in result.metrics().query()['counters']:  # one a step
    if counter.key.metric.namespace == 'preprocess':
      counters[counter.key.metric.name] += counter.committed
  assert counters == {'read': 27, 'written_train': 20, 'written_test': 6,
                      f'rejected_{reason}': 1}


def test_examples_are_padded_truncated_and_labelled(small_job):
  _, output, stats = small_job
  train = read_examples(str(output), raw.TRAIN)
  validation = read_examples(str(output), raw.VALIDATION)
  evaluation = read_examples(str(output), raw.TEST)
  assert len(train) == 31 and len(validation) == 5 and len(evaluation) == 17
  assert stats['vocabulary_size'] == 6
  assert stats['labels']['names'] == ['pos', 'neg']  # pos is more frequent
  assert stats['labels']['counts'] == {'train': {'pos': 16, 'neg': 15},
                                       'validation': {'pos': 5},
                                       'test': {'pos': 11, 'neg': 6}}
  for example in train + validation + evaluation:
    assert 0 <= example[transformed.LABEL_ID] < len(stats['labels']['names'])
    ids = example[transformed.TOKEN_IDS]
    assert len(ids) == 6 and ids.max() < 6 and ids.min() >= 0
    kept = min(example[transformed.LENGTH], 6)
    assert (ids[:kept] != transformed.PAD_ID).all()
    assert (ids[kept:] == transformed.PAD_ID).all()
  names = stats['labels']['names']
  by_id = {e[transformed.ID].decode(): e for e in evaluation}
  assert names[by_id['test1'][transformed.LABEL_ID]] == 'pos'
  assert by_id['test1'][transformed.TEXT].decode() == 'awful plot acting boring'
  long_token = [e for e in train if e[transformed.ID] == b'longtoken'][0]
  assert long_token[transformed.LENGTH] == 2
  assert stats['token_length']['max'] == 7
  assert 0 < stats['token_length']['truncated_share'] < 1


def test_the_vocabulary_is_learned_on_train_alone(small_job):
  _, output, _ = small_job
  vocabulary = tft.TFTransformOutput(str(output)).vocabulary_by_name(
      transformed.TOKEN_VOCABULARY)
  assert b'great' in vocabulary
  for word in HELD_OUT_WORDS.values():
    assert word.encode() not in vocabulary
  validation = read_examples(str(output), raw.VALIDATION)
  assert {e[transformed.ID].decode() for e in validation} == {
      f'dev{i}' for i in range(5)}
  for example in validation:
    assert list(example[transformed.TOKEN_IDS]) == [transformed.OOV_ID] * 6


# "café" as the same text in two spellings: é as one code point (NFC), and
# as e and a combining acute accent (NFD, as macOS spells file names).
CAFE_NFC, CAFE_NFD = 'caf\u00e9', 'cafe\u0301'


def test_a_label_in_two_unicode_spellings_is_one_class(
    tmp_path, monkeypatch, capsys):
  rows = [{'id': f'r{index}', 'split': ('train', 'test')[index % 5 == 0],
           'label': (CAFE_NFC, CAFE_NFD, 'tea')[index % 3],
           'text': ('bitter roast', 'milky froth', 'green leaves')[
               index % 3] + f' number {index}'}
          for index in range(60)]
  write_jsonl(tmp_path / 'in.jsonl', rows)
  output = tmp_path / 'out'
  status, stderr = main_in_process(
      monkeypatch, capsys, preprocess.run, f'--input={tmp_path}/in.jsonl',
      f'--output_dir={output}', '--split_field=split',
      '--validation_fraction=0')
  assert status == 0, stderr
  vocabulary = tft.TFTransformOutput(str(output)).vocabulary_by_name(
      transformed.LABEL_VOCABULARY)
  assert sorted(vocabulary) == sorted([CAFE_NFC.encode(), b'tea'])
  stats = json.loads((output / transformed.STATS_FILE).read_text())
  assert stats['records']['rejected'] == 0
  assert stats['labels']['counts']['train'] == {CAFE_NFC: 32, 'tea': 16}
  names = stats['labels']['names']
  for example in read_examples(str(output), raw.TEST):
    row = rows[int(example[transformed.ID][1:])]
    assert names[example[transformed.LABEL_ID]] == unicodedata.normalize(
        'NFC', row['label'])


@pytest.mark.parametrize('fmt', ['jsonl', 'csv', 'files'])
def test_every_reader_gives_labels_in_nfc(tmp_path, fmt):
  """The folder name of a document is its label too: both spellings of one
  name can be folders side by side."""
  if fmt == 'files':
    for index, label in enumerate((CAFE_NFC, CAFE_NFD)):
      (tmp_path / label).mkdir()
      (tmp_path / label / f'{index}.txt').write_text('a fine cup')
    pattern = f'{tmp_path}/*/*.txt'
  else:
    pattern = str(tmp_path / f'in.{fmt}')
    with open(pattern, 'w', encoding='utf-8', newline='') as handle:
      if fmt == 'csv':
        handle.write(f'text,label\nfine,{CAFE_NFC}\nfine,{CAFE_NFD}\n')
      else:
        handle.write(f'{{"text": "fine", "label": "{CAFE_NFC}"}}\n'
                     f'{{"text": "fine", "label": "{CAFE_NFD}"}}\n')
  read = readers.sample(readers.resolve_input(pattern, fmt),
                        readers.ReadConfig(format=fmt), 10)
  assert [record[raw.LABEL] for record in read] == [CAFE_NFC, CAFE_NFC]


def test_parameters_are_saved_for_the_trainer_and_scorer(small_job):
  _, output, _ = small_job
  params = json.loads((output / transformed.PARAMS_FILE).read_text())
  assert params['transform'] == {'vocab_size': 6, 'min_frequency': 1,
                                 'max_len': 6, 'max_token_chars': 50,
                                 'truncation': 'head_tail',
                                 'keep_punctuation': True}
  assert params['test_fraction'] is None  # the data names the splits
  assert params['validation_fraction'] == 0.0
  assert params['read_config']['format'] == 'jsonl'
  assert params['read_config']['split_field'] == 'split'
  assert not os.path.exists(outputs.staging_root(str(output)))


def test_rerun_replaces_the_output_and_hash_split_repeats(tmp_path):
  rows = [{'text': f'text {i} ' + 'good' * (i % 3), 'label': 'ab'[i % 2]}
          for i in range(60)]
  write_jsonl(tmp_path / 'in.jsonl', rows)
  output = tmp_path / 'out'
  args = [f'--input={tmp_path}/in.jsonl', f'--output_dir={output}',
          '--test_fraction=0.3', '--validation_fraction=0.2']
  first = preprocess.run(args)
  first_splits = {split: {e[transformed.ID] for e in read_examples(
      str(output), split)} for split in raw.SPLITS}
  (output / 'train-99999-of-99999.tfrecord.gz').write_text('stale')
  second = preprocess.run(args + ['--direct_running_mode=multi_processing',
                                  '--direct_num_workers=2'])
  assert not (output / 'train-99999-of-99999.tfrecord.gz').exists()
  assert first == second
  assert first_splits == {split: {e[transformed.ID] for e in read_examples(
      str(output), split)} for split in raw.SPLITS}
  assert 8 < len(first_splits[raw.TEST]) < 30
  assert 2 < len(first_splits[raw.VALIDATION]) < 16


@pytest.mark.parametrize('make_args, message', [
    (lambda d: [f'--input={d}/none-*.jsonl', f'--output_dir={d}/out'],
     'no input file matches'),
    (lambda d: [f'--input={d}/in.jsonl', '--format=xml',
                f'--output_dir={d}/out'], 'invalid choice'),
    (lambda d: [f'--input={d}/in.jsonl', f'--output_dir={d}/in.jsonl/out'],
     'in.jsonl is a file, where --output_dir needs a folder'),
    (lambda d: [f'--input={d}/in.jsonl', f'--output_dir={d}/out',
                '--vocab_size=1'], 'argument --vocab_size: must be in [3, '),
    (lambda d: [f'--input={d}/**', '--format=jsonl', f'--output_dir={d}/out'],
     'is inside the input'),
])
def test_job_level_faults_exit_non_zero_with_one_line(
    tmp_path, make_args, message, monkeypatch, capsys):
  write_jsonl(tmp_path / 'in.jsonl', [{'text': 'x', 'label': 'a'}])
  (tmp_path / 'out').mkdir()
  (tmp_path / 'out' / 'previous').write_text('kept')
  status, stderr = main_in_process(monkeypatch, capsys, preprocess.run,
                                   *make_args(tmp_path))
  assert status == 2
  last = stderr.strip().splitlines()[-1]
  assert message in last
  assert (tmp_path / 'out' / 'previous').read_text() == 'kept'
  assert not os.path.exists(outputs.staging_root(str(tmp_path / 'out')))


def test_an_output_it_did_not_write_or_would_read_is_refused(tmp_path):
  (tmp_path / 'data').mkdir()
  write_jsonl(tmp_path / 'data' / 'in.jsonl', [{'text': 'x', 'label': 'a'}])
  (tmp_path / 'out').mkdir()
  (tmp_path / 'out' / 'notes.txt').write_text('kept')
  with pytest.raises(cli.JobError, match='files this job does not write.*'
                     '--overwrite'):
    preprocess.run([f'--input={tmp_path}/data/in.jsonl',
                    f'--output_dir={tmp_path}/out'])
  # Its dead letters (*.jsonl) would be read back by every rerun.
  with pytest.raises(cli.JobError, match='is inside the input'):
    preprocess.run([f'--input={tmp_path}/**/*.jsonl',
                    f'--output_dir={tmp_path}/preprocessed'])
  assert (tmp_path / 'out' / 'notes.txt').read_text() == 'kept'
  assert sorted(os.listdir(tmp_path)) == ['data', 'out']


def test_no_train_records_is_a_job_error(tmp_path, monkeypatch, capsys):
  write_jsonl(tmp_path / 'in.jsonl', good_rows(5, 'test'))
  status, stderr = main_in_process(
      monkeypatch, capsys, preprocess.run, f'--input={tmp_path}/in.jsonl',
      f'--output_dir={tmp_path}/out', '--split_field=split')
  assert status == 2
  assert 'no record reached the train split' in stderr
  assert not (tmp_path / 'out').exists()


def test_labels_clashing_as_score_columns_are_a_job_error(tmp_path):
  # Scores give each class a column probability_<label>, lower-cased with
  # runs of other characters as '_'.
  labels = ['a-b', 'a_b', 'Pos', 'pos', 'other']
  write_jsonl(tmp_path / 'in.jsonl', [
      {'text': f'text number {i}', 'label': labels[i % 5]} for i in range(30)])
  output = tmp_path / 'out'
  output.mkdir()
  (output / 'previous').write_text('kept')
  with pytest.raises(cli.JobError) as error:
    # --overwrite: the folder would be replaced, were the job to publish.
    preprocess.run([f'--input={tmp_path}/in.jsonl', f'--output_dir={output}',
                    '--overwrite'])
  assert "'a-b' and 'a_b'" in str(error.value)
  assert "'Pos' and 'pos'" in str(error.value)
  assert os.listdir(output) == ['previous']
  assert not [p for p in os.listdir(tmp_path) if 'staging' in p]


@pytest.mark.parametrize('flag', ['--test_fraction', '--validation_fraction'])
def test_a_zero_fraction_is_refused_unless_splits_come_from_the_data(
    tmp_path, flag):
  write_jsonl(tmp_path / 'in.jsonl', good_rows(4, 'train'))
  with pytest.raises(cli.JobError, match=flag):
    preprocess.run([f'--input={tmp_path}/in.jsonl',
                    f'--output_dir={tmp_path}/out', f'{flag}=0'])
  assert not (tmp_path / 'out').exists()
  # Split folders (train/, test/) of a folder input decide the split.
  (tmp_path / 'docs' / 'train' / 'pos').mkdir(parents=True)
  (tmp_path / 'docs' / 'train' / 'pos' / '1.txt').write_text('fine')
  args, _ = preprocess.parse_args([f'--input={tmp_path}/docs',
                                   f'--output_dir={tmp_path}/out',
                                   f'{flag}=0'])
  settings = preprocess_settings.settings_from_args(args)
  assert getattr(settings, flag.lstrip('-')) == 0.0


@pytest.mark.parametrize('job', ['preprocess', 'score'])
def test_a_bad_csv_delimiter_is_a_job_error_before_the_pipeline(tmp_path, job):
  (tmp_path / 'in.csv').write_text('text,label\nfine,pos\n')
  args = [f'--input={tmp_path}/in.csv', f'--output_dir={tmp_path}/out',
          '--csv_delimiter=ab']
  if job == 'score':
    args.append(f'--model_dir={tmp_path}/model')
  with pytest.raises(cli.JobError, match='--csv_delimiter'):
    importlib.import_module(f'pipeline.{job}').run(args)
  assert not (tmp_path / 'out').exists()
  for delimiter in (';', r'\t', '|'):
    args, _ = preprocess.parse_args([
        f'--input={tmp_path}/in.csv', f'--output_dir={tmp_path}/out',
        f'--csv_delimiter={delimiter}'])
    settings = preprocess_settings.settings_from_args(args)
    assert settings.read_config.csv_delimiter == (
        delimiter)


def test_a_full_disk_is_one_error_line_and_keeps_the_previous_output(
    tmp_path, monkeypatch, capsys):
  write_jsonl(tmp_path / 'in.jsonl', good_rows(6, 'train') +
              good_rows(4, 'test'))
  output = tmp_path / 'out'
  output.mkdir()
  (output / 'previous').write_text('kept')

  def disk_full(self, data):
    del self, data
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), 'train-00000')
  # The gzip stream under the TFRecord files, written on its own thread.
  monkeypatch.setattr(filesystem.CompressedFile, 'write', disk_full)
  status, stderr = main_in_process(
      monkeypatch, capsys, preprocess.run, f'--input={tmp_path}/in.jsonl',
      f'--output_dir={output}', '--split_field=split', '--overwrite')
  assert status == cli.EXIT_JOB_ERROR
  last = stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and 'No space left on device' in last
  assert os.listdir(output) == ['previous']
  assert not [p for p in os.listdir(tmp_path) if 'staging' in p]


def test_a_file_where_the_output_folder_goes_is_never_replaced(tmp_path):
  write_jsonl(tmp_path / 'in.jsonl', good_rows(6, 'train'))
  report = tmp_path / 'report.csv'
  report.write_text('a user file')
  for extra in ((), ('--overwrite',)):
    with pytest.raises(cli.JobError, match='is a file'):
      preprocess.run([f'--input={tmp_path}/in.jsonl',
                      f'--output_dir={report}', *extra])
  assert report.read_text() == 'a user file'


def test_an_empty_vocabulary_is_a_job_error(tmp_path):
  """--min_frequency above every token's count would write examples of
  out-of-vocabulary ids alone, with exit 0: the job refuses, publishing
  nothing."""
  corpus = write_jsonl(tmp_path / 'reviews.jsonl', synthetic_reviews(40, 0))
  with pytest.raises(cli.JobError, match='token vocabulary is empty'):
    preprocess.run([f'--input={corpus}', f'--output_dir={tmp_path / "out"}',
                    '--min_frequency=100000'])
  assert not (tmp_path / 'out').exists()
