"""The preprocessing job on slices of the real corpora, read via the fetch code."""
import glob
import os

from pipeline import preprocess
from tests.conftest import dead_letters
from tests.test_preprocess import read_examples


def test_imdb_slice_keeps_the_official_split(corpora, tmp_path):
  root = corpora('imdb')
  stats = preprocess.run([
      f'--input={root}/*/*/1??_0.txt', '--format=files',
      f'--output_dir={tmp_path}/out', '--vocab_size=2000'])
  assert stats['records'] == {'read': 400, 'rejected': 0,
                              'written': {'train': 200, 'eval': 200}}
  assert stats['labels']['counts'] == {'train': {'neg': 100, 'pos': 100},
                                       'eval': {'neg': 100, 'pos': 100}}
  assert stats['vocabulary_size'] == 2000
  evaluation = read_examples(f'{tmp_path}/out', 'eval')
  assert all(b'/test/' in e['id'] for e in evaluation)
  # Reviews are long: the median is around 170-230 tokens.
  assert 120 < stats['token_length']['p50'] < 300


def test_spamassassin_slice_parses_every_email(corpora, tmp_path):
  root = corpora('spamassassin')
  pattern = f'{root}/*/*.00[0-4]??.*'
  files = glob.glob(pattern)
  stats = preprocess.run([
      f'--input={pattern}', '--format=email', f'--output_dir={tmp_path}/out',
      '--eval_fraction=0.2'])
  records = stats['records']
  assert records['read'] == len(files) > 400
  assert records['read'] == sum(records['written'].values()) + records[
      'rejected']
  assert records['rejected'] == len(dead_letters(f'{tmp_path}/out'))
  # Non-UTF-8 and multipart mail is decoded, not rejected.
  assert records['rejected'] <= 2
  assert set(stats['labels']['names']) == {'ham', 'spam'}
  assert 0.1 < records['written']['eval'] / records['read'] < 0.3
  assert os.path.exists(f'{tmp_path}/out/transform_fn/saved_model.pb')
