"""Exports: the newest complete version found, the newest blessed one
chosen (one named served as asked), and the metadata every job checks
against its graph before it uses an export."""
import json
import logging
import os
import pathlib
import re
import shutil

import pytest

import cli
from schemas import metadata as metadata_lib
from schemas import serving
from serving import exports
from tests.conftest import main_in_process
from tests.conftest import tiny_export
from trainer import predict


def fake_version(model_dir, version, saved_model=True, metadata=True):
  folder = model_dir / serving.EXPORT_DIR / str(version)
  folder.mkdir(parents=True)
  if saved_model:
    (folder / 'saved_model.pb').write_bytes(b'')
  if metadata:
    (folder / 'assets.extra').mkdir()
    (folder / serving.METADATA_FILE).write_text('{}')
  return folder


def test_resolve_skips_incomplete_newer_versions_with_a_warning(tmp_path,
                                                                caplog):
  fake_version(tmp_path, 50)
  complete = fake_version(tmp_path, 100)
  incomplete = [fake_version(tmp_path, 200, saved_model=False, metadata=False),
                fake_version(tmp_path, 300, metadata=False),
                fake_version(tmp_path, 400, saved_model=False)]
  with caplog.at_level(logging.WARNING):
    assert exports.resolve(str(tmp_path)) == str(complete)
  for folder in incomplete:
    assert str(folder) in caplog.text
  shutil.rmtree(tmp_path / serving.EXPORT_DIR / '50')
  shutil.rmtree(complete)
  with pytest.raises(exports.ExportError, match='no exported model'):
    exports.resolve(str(tmp_path))


def test_metadata_without_label_names_is_an_export_error(tmp_path):
  tiny_export(tmp_path / serving.EXPORT_DIR / '1', {'version': 1})
  with pytest.raises(exports.ExportError, match='label_names'):
    exports.load(str(tmp_path))
  with pytest.raises(cli.JobError, match='label_names'):
    predict.run([f'--model_dir={tmp_path}', 'some text'])


@pytest.mark.parametrize('edit, message', [
    (lambda m: {**m, 'label_names': m['label_names'][::-1]},
     'label vocabulary is'),
    # Its drift reference, with no share for the extra label, says so
    # first.
    (lambda m: {**m, 'label_names': m['label_names'] + ['meh']},
     'label vocabulary is|label_shares'),
    (lambda m: {**m, 'label_names': [m['label_names'][0]] * 2},
     'names a label twice'),
    (lambda m: {**m, 'version': str(m['version'])}, 'no version'),
    (lambda m: {**m, 'version': 2**63}, 'no version'),
    (lambda m: {**m, 'version': True}, 'no version'),
])
def test_metadata_that_does_not_describe_its_graph_is_refused(
    trained, tmp_path, edit, message, monkeypatch, capsys):
  """Every job that loads an export checks its metadata against the graph:
  one error line and exit 2, not labels flipped or a traceback later."""
  _, export_dir, _ = trained
  copy = pathlib.Path(shutil.copytree(export_dir, tmp_path / 'export'))
  metadata = json.loads((copy / serving.METADATA_FILE).read_text())
  (copy / serving.METADATA_FILE).write_text(json.dumps(edit(metadata)))
  with pytest.raises(exports.ExportError, match=message):
    exports.load(str(copy))
  status, stderr = main_in_process(monkeypatch, capsys, predict.run,
                                   f'--model_dir={copy}', 'superb')
  assert status == cli.EXIT_JOB_ERROR
  assert stderr.splitlines()[-1].startswith('error: ') and (
      re.search(message, stderr)), stderr[-2000:]


def test_a_version_folder_whose_metadata_names_another_version_is_refused(
    tmp_path):
  # Every score would name a model that did not make it.
  tiny_export(tmp_path / serving.EXPORT_DIR / '1',
              {'version': 7, 'label_names': ['neg', 'pos']})
  with pytest.raises(exports.ExportError,
                     match='says version 7, but it is the metadata of '
                     'version folder 1'):
    exports.load(str(tmp_path))


def test_a_graph_whose_labels_contradict_the_metadata_is_refused(tmp_path):
  """No vocabulary file to compare with: the graph's own answers are."""
  tiny_export(tmp_path / serving.EXPORT_DIR / '1',
              {'version': 1, 'label_names': ['pos', 'neg']})
  with pytest.raises(exports.ExportError, match='most probable'):
    exports.load(str(tmp_path))


def test_names_that_are_no_versions_are_skipped_by_their_own_path(
    tmp_path, caplog):
  export_root = tmp_path / serving.EXPORT_DIR
  for name in ('7', '007', '\u00b2', '\u0667', str(2**63)):
    (export_root / name).mkdir(parents=True)
    (export_root / name / 'saved_model.pb').write_bytes(b'')
    exports.write_metadata(str(export_root / name), {'label_names': ['a']})
  with caplog.at_level(logging.WARNING):
    assert exports.resolve(str(tmp_path)) == str(export_root / '7')
  for name in ('007', '\u00b2', '\u0667', str(2**63)):
    assert f'skipping {export_root / name}: not a version' in caplog.text


def _version(model_dir, number, blessing_section=None):
  folder = fake_version(model_dir, number)
  document = {'label_names': ['neg', 'pos'], 'version': number}
  if blessing_section is not None:
    document[metadata_lib.BLESSING] = blessing_section
  exports.write_metadata(str(folder), document)
  return str(folder)


def test_the_newest_blessed_version_is_chosen_and_one_named_as_asked(
    tmp_path):
  before_the_gate = _version(tmp_path, 100)
  blessed = _version(tmp_path, 200, {'blessed': True, 'reason': 'better'})
  refused = _version(tmp_path, 300, {'blessed': False, 'reason': 'worse'})
  fake_version(tmp_path, 400, metadata=False)  # incomplete
  chosen = exports.choose(str(tmp_path))
  assert (chosen.folder, chosen.why, chosen.passed_over) == (
      blessed, exports.NEWEST_BLESSED, ((300, 'worse'),))
  assert exports.resolve(str(tmp_path), blessed_only=False) == refused
  assert exports.choose(refused) == exports.Chosen(refused, exports.AS_ASKED)

  os.rename(blessed, blessed + '-kept-aside')
  # Made before the gate: blessed.
  assert exports.resolve(str(tmp_path)) == before_the_gate
  os.rename(before_the_gate, before_the_gate + '-kept-aside')
  with pytest.raises(exports.ExportError,
                     match=f'no blessed export in {tmp_path}: version 300 is '
                     f'not blessed: worse; name its version folder '
                     rf'\({refused}\)'):
    exports.resolve(str(tmp_path))


def test_the_metadata_says_whether_an_export_is_blessed():
  parse = metadata_lib.ExportMetadata.parse
  assert parse({'label_names': ['a']}).blessed
  assert parse({'label_names': ['a'], 'blessing': {'blessed': True}}).blessed
  assert not parse({'label_names': ['a'],
                    'blessing': {'blessed': False}}).blessed
  for wrong in ({'blessed': 'no'}, {'reason': 'why'}, True):
    with pytest.raises(ValueError, match='does not say whether it is blessed'):
      parse({'label_names': ['a'], 'blessing': wrong})


def test_a_lent_export_answers_its_own_folder_only_while_lent(tmp_path):
  folders = [tiny_export(tmp_path / name / serving.EXPORT_DIR / '1',
                         {'version': 1, 'label_names': ['neg', 'pos'],
                          'trained_by': name})
             for name in ('lent', 'other')]
  lent, metadata = exports.load(str(folders[0]))
  other_metadata = exports.load_metadata(str(folders[1]))
  with pytest.raises(RuntimeError, match='the job failed'):
    with exports.lending(str(folders[0]), lent, metadata):
      assert exports.load(str(folders[0]))[0] is lent
      assert exports.load(str(folders[0]), metadata)[0] is lent
      # The model folder names the same version.
      assert exports.load(str(tmp_path / 'lent'))[0] is lent
      # Another export, or other metadata, is loaded from its files.
      assert exports.load(str(folders[1]))[0] is not lent
      assert exports.load(str(folders[0]), other_metadata)[0] is not lent
      with exports.lending(str(folders[0]), 'inner', metadata):
        assert exports.load(str(folders[0]))[0] == 'inner'
      assert exports.load(str(folders[0]))[0] is lent
      raise RuntimeError('the job failed')
  assert exports.load(str(folders[0]))[0] is not lent
