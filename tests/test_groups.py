"""Held out by group: --group_field and --group_pattern keep every record of
a group (a movie, a thread, a sender) in one split."""
import collections
import json
import logging
import re

import pytest

import cli
from pipeline import datasets
from pipeline import preprocess
from pipeline.preprocessing import settings as settings_lib
from pipeline.preprocessing import splits as split_lib
from schemas import raw
from schemas import transformed
from tests.conftest import REPO
from tests.conftest import main_in_process
from tests.conftest import read_examples
from tests.conftest import write_jsonl
from trainer import evaluate

GROUPS = 30
PER_GROUP = 6
WORDS = ['great', 'awful', 'plot', 'acting', 'boring', 'superb', 'dull']


def grouped_rows():
  """GROUPS movies of PER_GROUP reviews, each review's text its own; the
  first review of every fifth movie has no group (no movie field, an id the
  pattern does not match)."""
  rows = []
  for movie in range(GROUPS):
    for review in range(PER_GROUP):
      ungrouped = review == 0 and movie % 5 == 0
      rows.append({
          'id': f'loose{movie}' if ungrouped else f'm{movie}-r{review}',
          'movie': None if ungrouped else f'movie {movie}',
          'label': 'pos' if review % 2 else 'neg',
          'split': 'test' if movie % 4 == 0 else 'train',
          'text': ' '.join(WORDS[(movie + review * j) % 7] for j in range(5))
                  + f' {movie} {review}'})
  return rows


def split_ids(output):
  return {split: {example[transformed.ID].decode() for example in
                  read_examples(str(output), split)} for split in raw.SPLITS}


def group_of_id(record_id):
  return None if record_id.startswith('loose') else record_id.split('-')[0]


@pytest.mark.parametrize('flags', [
    ['--group_field=movie'],
    [r'--group_pattern=^(m\d+)-'],
    ['--group_field=movie', '--split_field=split'],
])
def test_the_records_of_a_group_share_their_split(tmp_path, flags):
  write_jsonl(tmp_path / 'in.jsonl', grouped_rows())
  output = tmp_path / 'out'
  stats = preprocess.run([f'--input={tmp_path}/in.jsonl',
                          f'--output_dir={output}', '--max_len=8',
                          '--test_fraction=0.3', '--validation_fraction=0.3',
                          *flags])
  by_group = collections.defaultdict(set)
  for split, ids in split_ids(output).items():
    for record_id in ids:
      if group_of_id(record_id):
        by_group[group_of_id(record_id)].add(split)
  assert all(len(splits) == 1 for splits in by_group.values()), by_group
  assert {split for splits in by_group.values() for split in splits} == set(
      raw.SPLITS)
  made = stats[transformed.SPLITS_STATS]
  assert made['grouped_by'] == ' '.join(flags[:1])
  named_test = '--split_field=split' in flags
  # The data's test records keep their split: their groups are not counted,
  # nor are those without one.
  hashed = [m for m in range(GROUPS) if not (named_test and m % 4 == 0)]
  assert made['ungrouped'] == len([m for m in hashed if m % 5 == 0])
  assert sum(made['groups'].values()) == len(hashed)
  assert made['chosen_by'][raw.VALIDATION][split_lib.BY_GROUP] > 0
  assert (split_lib.BY_DATA in made['chosen_by'][raw.TEST]) == named_test


def test_a_group_flag_that_groups_no_record_publishes_nothing(
    tmp_path, monkeypatch, capsys):
  # An id the pattern never matches; a field every record leaves empty.
  write_jsonl(tmp_path / 'in.jsonl', [{**row, 'none': None}
                                      for row in grouped_rows()])
  for flag in (r'--group_pattern=^movie(\d+)', '--group_field=none'):
    status, stderr = main_in_process(
        monkeypatch, capsys, preprocess.run, f'--input={tmp_path}/in.jsonl',
        f'--output_dir={tmp_path}/out', flag)
    assert status == cli.EXIT_JOB_ERROR, stderr
    assert stderr.strip().splitlines()[-1].startswith(
        f'error: {flag} gave none of the {GROUPS * PER_GROUP} records it was '
        'to split a group')
    assert not (tmp_path / 'out').exists()


def test_a_bad_group_flag_exits_2_before_the_pipeline(
    tmp_path, monkeypatch, capsys):
  write_jsonl(tmp_path / 'in.jsonl', grouped_rows())
  (tmp_path / 'in.txt').write_text('a line\n')
  for flags, message in [
      (['--input=in.jsonl', '--group_pattern=(m\\d+'],
       'argument --group_pattern: '),
      (['--input=in.jsonl', '--group_pattern='], 'argument --group_pattern: '),
      (['--input=in.txt', '--group_field=movie'], 'text records have no'),
  ]:
    flags[0] = f'--input={tmp_path}/{flags[0].split("=")[1]}'
    status, stderr = main_in_process(
        monkeypatch, capsys, preprocess.run, *flags,
        f'--output_dir={tmp_path}/out')
    assert status == 2
    assert message in stderr.strip().splitlines()[-1]
    assert not (tmp_path / 'out').exists()


def test_a_header_is_the_group_of_an_email(tmp_path):
  for index in range(40):
    sender = f'sender{index % 8}@example.com'
    folder = tmp_path / 'mail' / ('spam' if index % 2 else 'ham')
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f'{index}.eml').write_text(
        f'From: {sender}\nSubject: note {index}\n\nbody {index} '
        f'{WORDS[index % 7]} {WORDS[index % 5]}\n')
  output = tmp_path / 'out'
  stats = preprocess.run([f'--input={tmp_path}/mail/*/*', '--format=email',
                          f'--output_dir={output}', '--group_field=From',
                          '--test_fraction=0.3', '--validation_fraction=0.3'])
  senders = collections.defaultdict(set)
  for split, ids in split_ids(output).items():
    for record_id in ids:
      index = int(record_id.rsplit('/', 1)[1].split('.')[0])
      senders[index % 8].add(split)
  assert all(len(splits) == 1 for splits in senders.values()), senders
  assert sum(stats[transformed.SPLITS_STATS]['groups'].values()) == 8


@pytest.mark.parametrize('pattern, value, group', [
    (r'/((?:pos|neg)/)(\d+)_', 'a/pos/17_3.txt', 'pos/17'),
    (r'thread-\d+', 'x thread-12 y', 'thread-12'),  # no capture: the match
    (r'(a)?(b)', 'b', 'b'),  # an empty capture is left out
    (r'(a)?', 'zzz', None),  # a match of '' is no group
    (r'q(\d)', 'none', None),
])
def test_a_pattern_takes_the_group_from_its_captures(pattern, value, group):
  assert raw.group_from(value, re.compile(pattern)) == group


def test_imdb_groups_are_blocks_of_100_ids_of_a_label_folder():
  pattern = re.compile(datasets.IMDB_GROUP_PATTERN)
  groups = {file_id: raw.group_from(
      f'/data/aclImdb/train/pos/{file_id}_0.txt', pattern)
            for file_id in datasets.imdb_file_ids()}
  assert groups[12345] == 'pos/123' and groups[7] == groups[99] == 'pos/'
  assert groups[100] == groups[199] == 'pos/1' != groups[200]
  assert len(set(groups.values())) == 125
  assert raw.group_from('/d/aclImdb/train/neg/5_0.txt', pattern) == (
      'neg/')
  # Where the IMDB corpus is named, the pattern is this one.
  makefile = (REPO / 'Makefile').read_text()
  assert f'IMDB_GROUP_PATTERN := {datasets.IMDB_GROUP_PATTERN}\n' in makefile
  for page in ('preprocessing.md', 'splits-and-evaluation.md'):
    assert datasets.IMDB_GROUP_PATTERN in (REPO / 'docs' / page).read_text()


def test_the_report_says_which_split_chose_what():
  stats = {transformed.SPLITS_STATS: {
      'grouped_by': '--group_pattern=x(\\d+)',
      'chosen_by': {raw.TRAIN: {'group': 2200, 'text': 10},
                    raw.VALIDATION: {'group': 290},
                    raw.TEST: {'data': 2500}},
      'groups': {raw.TRAIN: 220, raw.VALIDATION: 29, raw.TEST: 0},
      'ungrouped': 10}}
  lines = evaluate.choice_lines({'on': raw.VALIDATION}, stats)
  assert lines[0] == (
      'The validation split chose the epoch (early stopping), the temperature '
      'and any branch weights. Its records: 290 by a hash of their group '
      '(--group_pattern=x(\\d+): 29 groups).')
  assert lines[-1] == ('The test split chose nothing and is reported once, '
                       'here. Its records: 2,500 named by the data.')
  stats[transformed.SPLITS_STATS]['chosen_by'][raw.TEST] = {'text': 5}
  stats[transformed.SPLITS_STATS]['grouped_by'] = None
  assert lines[-1] != evaluate.choice_lines({'on': raw.VALIDATION}, stats)[-1]
  assert evaluate.choice_lines({'on': raw.VALIDATION}, stats)[-1].endswith(
      '5 by a hash of their text.')


CONFIGS = sorted(path.name for path in (REPO / 'configs').iterdir()
                 if path.is_dir())


def config_args(tmp_path, name):
  # A configuration may name a format; the corpus's format wins.
  return [f'--input={tmp_path}/in.jsonl', f'--output_dir={tmp_path}/out',
          f'@{REPO / "configs" / name / "preprocess.args"}', '--format=jsonl',
          '--split_field=split']


@pytest.mark.parametrize('name', CONFIGS)
def test_every_configuration_takes_the_split_the_data_names(tmp_path, name):
  # The configurations differ in transform flags only, so each is checked
  # where its flags resolve and route, and one runs the pipeline below.
  rows = grouped_rows()
  write_jsonl(tmp_path / 'in.jsonl', rows)
  settings = settings_lib.settings_from_args(
      preprocess.parse_args(config_args(tmp_path, name))[0])
  assert settings.read_config.format == 'jsonl'
  assert settings.test_fraction is None
  decided = [settings.routing.decide(row) for row in rows]
  assert [(split, chosen) for split, _, chosen, _ in decided
          if split == raw.TEST] == [(raw.TEST, split_lib.BY_DATA)] * sum(
              row['split'] == 'test' for row in rows)


def test_a_configurations_run_leaves_the_data_named_test_split_whole(
    tmp_path, caplog):
  rows = grouped_rows()
  write_jsonl(tmp_path / 'in.jsonl', rows)
  caplog.set_level(logging.INFO)
  stats = preprocess.run(config_args(tmp_path, CONFIGS[0]))
  named_test = sum(row['split'] == 'test' for row in rows)
  assert stats['records']['written'][raw.TEST] == named_test
  assert stats[transformed.SPLITS_STATS]['chosen_by'][raw.TEST] == {
      split_lib.BY_DATA: named_test}
  assert '--test_fraction=0.2 is not used' in caplog.text
  assert json.loads((tmp_path / 'out' / transformed.PARAMS_FILE).read_text())[
      'test_fraction'] is None


def test_folds_cannot_follow_a_group_field_the_records_do_not_keep(
    tmp_path, monkeypatch, capsys):
  from trainer import train  # pylint: disable=import-outside-toplevel
  write_jsonl(tmp_path / 'in.jsonl', grouped_rows())
  output = tmp_path / 'out'
  preprocess.run([f'--input={tmp_path}/in.jsonl', f'--output_dir={output}',
                  '--max_len=8', '--group_field=movie'])
  flags = [f'--data_dir={output}', '--model=nbsvm', '--ngram_epochs=1',
           '--batch_size=8']
  # Asked for, they are refused before anything is written...
  status, stderr = main_in_process(
      monkeypatch, capsys, train.run, *flags, '--folds=2',
      f'--model_dir={tmp_path / "asked"}')
  assert status == 2
  (line,) = [line for line in stderr.splitlines() if 'error' in line]
  assert 'was split by --group_field=movie, which its records do not keep' in (
      line)
  assert not (tmp_path / 'asked').exists()
  # ...and by default the validation split, held out by group, chooses.
  metrics, _ = train.run([*flags, f'--model_dir={tmp_path / "auto"}'])
  assert metrics['selected_on'] == raw.VALIDATION
