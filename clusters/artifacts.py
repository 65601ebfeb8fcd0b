"""Every jar and binary the cluster runners need, each fetched by its
registry's own client with its version pinned and its checksum verified,
and cached outside the repository, so that a second fetch downloads
nothing:

- Beam's Flink and Spark job servers: Maven (``-C``: every artifact checked
  against Central's checksums) builds each from ``jobservers/*/pom.xml``; the
  Beam runner jar inside is checked against the sha256 pinned below.
- Flink's and Spark's distributions: pip downloads them with the hashes of
  ``requirements.txt`` (``--require-hashes``) and they are unpacked.
- Prism: ``go install`` at the Beam SDK's version (the module proxy's
  checksum database verifies every module), the Beam module's hash checked
  against the one pinned below, then put where Beam looks for its download.

The cache is ``$RUNNER_CACHE``, else ``~/.cache/beam-text-classifier``.
Each artifact's folder there holds a manifest of its files (size, mtime,
sha256), written when it was fetched and checked whenever it is used: a
jar cut short, a file gone or changed is an error naming it and the command
that fetches it again (``fetch`` does so by itself).
"""
import hashlib
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

import apache_beam
from apache_beam.runners.portability import prism_runner

HERE = pathlib.Path(__file__).resolve().parent
CACHE = pathlib.Path(os.environ.get('RUNNER_CACHE') or (
    pathlib.Path.home() / '.cache' / 'beam-text-classifier'))

# Maven Central as this project reaches it serves no Beam job server jar and
# no Beam runner newer than 2.70 with all its dependencies; 2.62.0 is the
# newest whose Flink and Spark runners resolve whole. Its job servers run
# the 2.77 SDK's pipelines (tests/test_cluster_flink.py,
# tests/test_cluster_spark.py).
JOB_SERVERS = {
    'flink': ('org/apache/beam/beam-runners-flink-1.19/2.62.0/'
              'beam-runners-flink-1.19-2.62.0.jar',
              '1068e860e50ca258e300ac88116b6013f753383eae0e48fd5d787dbb9dcd6205'),
    'spark': ('org/apache/beam/beam-runners-spark-3/2.62.0/'
              'beam-runners-spark-3-2.62.0.jar',
              '1bee3f5e15c4e2918418a61ff5ec9753bab2c45c6d0e8c5dc45f111d4ef6b150'),
}
# The PyPI packages of requirements.txt that hold each cluster's jars.
DISTRIBUTIONS = {'flink': 'apache-flink-libraries', 'spark': 'pyspark'}
PRISM_PACKAGE = 'github.com/apache/beam/sdks/v2/go/cmd/prism'
PRISM_MODULE = 'github.com/apache/beam/sdks/v2'
# The go.sum hash of the Beam module at the SDK's version.
PRISM_MODULE_HASHES = {
    '2.77.0': 'h1:RsC61pHEvtySEHAURQyP/+CVOJm/hy5hewuG9JF0+Ow=',
}


class FetchError(Exception):
  """An artifact could not be had, was not the one pinned, or is damaged
  in the cache."""


# Every file of an artifact's folder, as fetched: {path: [size, mtime_ns,
# sha256]}.
MANIFEST = '.verified.json'


def _files(folder: pathlib.Path):
  return sorted(path for path in folder.rglob('*')
                if path.is_file() and path.name != MANIFEST)


def _record(folder: pathlib.Path) -> None:
  """Writes ``folder``'s manifest."""
  entries = {}
  for path in _files(folder):
    status = path.stat()
    entries[str(path.relative_to(folder))] = [
        status.st_size, status.st_mtime_ns, sha256(path)]
  (folder / MANIFEST).write_text(json.dumps(entries, indent=0))


def _damage(folder: pathlib.Path) -> str:
  """What is wrong with ``folder`` against its manifest; '' when it is
  whole: every file listed, none more, each as fetched. A file of the
  recorded size and mtime is taken as it was (a check costs a stat a
  file); one whose mtime changed is hashed again, and its mtime recorded
  anew when its bytes are the same (where the cache can be written)."""
  try:
    entries = json.loads((folder / MANIFEST).read_text())
    listed = {relative: (int(size), int(mtime), str(digest))
              for relative, (size, mtime, digest) in entries.items()}
  except (OSError, ValueError, TypeError, AttributeError):
    return f'{folder} has no readable manifest ({MANIFEST}) of its files'
  present = {str(path.relative_to(folder)) for path in _files(folder)}
  missing, more = sorted(set(listed) - present), sorted(present - set(listed))
  if not listed:
    return f'the manifest of {folder} lists no file'
  if missing:
    return f'{folder / missing[0]} is missing'
  if more:
    return f'{folder / more[0]} is no file fetched (not in the manifest)'

  changed = False
  for relative, (size, mtime, digest) in listed.items():
    path = folder / relative
    status = path.stat()
    if status.st_size != size:
      return f'{path} has {status.st_size:,} bytes, not {size:,}'
    if status.st_mtime_ns != mtime:
      if sha256(path) != digest:
        return f'{path} is not the file fetched (its sha256 differs)'
      entries[relative][1] = status.st_mtime_ns
      changed = True
  if changed:
    try:
      (folder / MANIFEST).write_text(json.dumps(entries, indent=0))
    except OSError:
      pass  # a read-only cache: checked again, by hash, next time
  return ''


def _whole(folder: pathlib.Path, what: str, repair: bool) -> bool:
  """Whether ``folder`` holds artifact ``what`` whole: False where it is
  missing, or damaged and ``repair`` (it is removed, to be fetched again);
  a FetchError where it is damaged otherwise."""
  if not folder.is_dir():
    return False
  damage = _damage(folder)
  if not damage:
    return True
  if not repair:
    raise FetchError(f'the runner cache is damaged: {damage}; run '
                     f'`python -m clusters fetch {what}` to fetch it again')
  print(f'{what}: fetching again: {damage}', flush=True)
  shutil.rmtree(folder)
  return False


def _run(command, **kwargs):
  done = subprocess.run(command, capture_output=True, text=True, **kwargs)
  if done.returncode:
    raise FetchError(f'{" ".join(map(str, command))} failed '
                     f'({done.returncode}):\n{done.stdout[-3000:]}'
                     f'{done.stderr[-3000:]}')
  return done.stdout


def sha256(path) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as handle:
    for block in iter(lambda: handle.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def _requirement(package: str) -> str:
  """The pinned line of requirements.txt for ``package``."""
  for line in (HERE / 'requirements.txt').read_text().splitlines():
    if line.split('==')[0] == package:
      return line
  raise FetchError(f'{package} is not pinned in clusters/requirements.txt')


def home(cluster: str) -> pathlib.Path:
  """The distribution's deps/ folder, as its own scripts know it: Flink's
  lib/, opt/, bin/; Spark's bin/ and jars/."""
  (found,) = distribution(cluster).glob('*/deps')
  return found


def distribution(cluster: str, repair: bool = False) -> pathlib.Path:
  """The unpacked PyPI distribution that holds the cluster's jars."""
  line = _requirement(DISTRIBUTIONS[cluster])
  name, version = line.split()[0].split('==')
  folder = CACHE / 'dist' / f'{name}-{version}'
  if _whole(folder, cluster, repair):
    return folder
  (CACHE / 'dist').mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=CACHE / 'dist') as scratch:
    pinned = pathlib.Path(scratch, 'requirements.txt')
    pinned.write_text(line + '\n')
    # --no-build-isolation: an sdist's metadata needs no build environment
    # of its own (nothing is installed).
    _run([sys.executable, '-m', 'pip', 'download', '--quiet', '--no-deps',
          '--no-build-isolation', '--require-hashes', '-r', pinned, '-d',
          scratch])
    (archive,) = [path for path in pathlib.Path(scratch).iterdir()
                  if path.name != 'requirements.txt']
    unpacked = pathlib.Path(scratch, 'unpacked')
    if zipfile.is_zipfile(archive):
      with zipfile.ZipFile(archive) as opened:
        opened.extractall(unpacked)
    else:
      with tarfile.open(archive) as opened:
        opened.extractall(unpacked, filter='tar')
    _record(unpacked)
    unpacked.rename(folder)
  return folder


def job_server_jar(runner: str, repair: bool = False) -> pathlib.Path:
  """Beam's job server for ``runner`` ('flink' or 'spark'), built by Maven
  from its pom once per version of the pom."""
  pom = HERE / 'jobservers' / runner / 'pom.xml'
  folder = CACHE / 'jobservers' / f'{runner}-{sha256(pom)[:12]}'
  if _whole(folder, runner, repair):
    (found,) = folder.glob('beam-runners-*-job-server-*.jar')
    return found
  repository = CACHE / 'm2'
  with tempfile.TemporaryDirectory(dir=CACHE) as build:
    _run(['mvn', '-B', '-q', '-C', '-f', pom,
          f'-Dmaven.repo.local={repository}', f'-Djobserver.build={build}',
          'package'])
    runner_jar, pinned = JOB_SERVERS[runner]
    if sha256(repository / runner_jar) != pinned:
      raise FetchError(f'{runner_jar} is not the jar pinned in '
                       f'{__name__}.JOB_SERVERS')
    (jar,) = pathlib.Path(build).glob('beam-runners-*-job-server-*.jar')
    built = pathlib.Path(build, 'verified')
    built.mkdir()
    shutil.move(jar, built / jar.name)
    _record(built)
    folder.parent.mkdir(parents=True, exist_ok=True)
    built.rename(folder)
  return folder / jar.name


def _go_environment() -> dict:
  return dict(os.environ, GOMODCACHE=str(CACHE / 'go' / 'mod'),
              GOCACHE=str(CACHE / 'go' / 'build'), GOPATH=str(CACHE / 'go'),
              GOFLAGS='-modcacherw -trimpath')


def prism_binary(version: str = apache_beam.__version__,
                 repair: bool = False) -> pathlib.Path:
  """Beam's Prism runner at the SDK's version, built from the Go module
  proxy; installed where Beam looks for the release it would download
  (``install_prism``)."""
  binary = CACHE / 'prism' / version / 'prism'
  if not _whole(binary.parent, 'prism', repair):
    pinned = PRISM_MODULE_HASHES.get(version)
    if pinned is None:
      raise FetchError(f'no Prism module hash is pinned for Beam {version}')
    with tempfile.TemporaryDirectory(dir=CACHE) as build:
      environment = dict(_go_environment(), GOBIN=build)
      _run(['go', 'install', f'{PRISM_PACKAGE}@v{version}'], env=environment,
           cwd=build)
      built = pathlib.Path(build, 'prism')
      modules = _run(['go', 'version', '-m', built], env=environment)
      if f'{PRISM_MODULE}\tv{version}\t{pinned}' not in modules:
        raise FetchError(f'{PRISM_MODULE} v{version} was not built from the '
                         f'module pinned ({pinned}):\n{modules}')
      verified = pathlib.Path(build, 'verified')
      verified.mkdir()
      shutil.move(built, verified / binary.name)
      with zipfile.ZipFile(verified / _PRISM_ZIP, 'w',
                           zipfile.ZIP_DEFLATED) as archive:
        archive.write(verified / binary.name, _prism_release(version).stem)
      _record(verified)
      binary.parent.parent.mkdir(parents=True, exist_ok=True)
      verified.rename(binary.parent)
  install_prism(binary.parent / _PRISM_ZIP, version)
  return binary


# Beside the binary: the zip of it that Beam's release would be.
_PRISM_ZIP = 'prism.zip'


def _prism_release(version: str) -> pathlib.Path:
  """Where Beam looks for the zip of its Prism release."""
  # pylint: disable-next=protected-access
  url = prism_runner.PrismJobServer._construct_download_url(
      f'v{version}', f'v{version}', platform.system(), platform.machine())
  return pathlib.Path(prism_runner.PrismJobServer.BIN_CACHE,
                      url.rsplit('/', 1)[1])


def install_prism(archive: pathlib.Path, version: str) -> pathlib.Path:
  """Puts ``archive``, the zip of the binary, where Beam looks for its Prism
  download, so that ``--runner=PrismRunner`` and DirectRunner use it
  without a network. Beam unpacks it beside it once, then runs what it
  unpacked: a copy that is not the binary's is removed, to be unpacked
  again."""
  target = _prism_release(version)
  unpacked = target.with_suffix('')
  if not target.exists() or sha256(target) != sha256(archive):
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive, target)
    unpacked.unlink(missing_ok=True)
  if unpacked.exists():
    with zipfile.ZipFile(archive) as opened:
      inside = hashlib.sha256(opened.read(unpacked.name)).hexdigest()
    if sha256(unpacked) != inside:
      unpacked.unlink()
  return target


def fetch(what: str) -> None:
  """``what``: flink, spark, prism or all; what is cached and whole is not
  fetched again, what is damaged is."""
  for cluster in ('flink', 'spark'):
    if what in (cluster, 'all'):
      print(f'{cluster}: {distribution(cluster, repair=True)}', flush=True)
      print(f'{cluster}: {job_server_jar(cluster, repair=True)}', flush=True)
  if what in ('prism', 'all'):
    print(f'prism: {prism_binary(repair=True)}', flush=True)
