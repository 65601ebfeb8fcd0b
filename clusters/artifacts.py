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
"""
import hashlib
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
# the 2.77 SDK's pipelines (tests/test_clusters.py).
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
  """An artifact could not be had, or was not the one pinned."""


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


def distribution(cluster: str) -> pathlib.Path:
  """The unpacked PyPI distribution that holds the cluster's jars."""
  line = _requirement(DISTRIBUTIONS[cluster])
  name, version = line.split()[0].split('==')
  folder = CACHE / 'dist' / f'{name}-{version}'
  if folder.is_dir():
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
    unpacked.rename(folder)
  return folder


def job_server_jar(runner: str) -> pathlib.Path:
  """Beam's job server for ``runner`` ('flink' or 'spark'), built by Maven
  from its pom once per version of the pom."""
  pom = HERE / 'jobservers' / runner / 'pom.xml'
  folder = CACHE / 'jobservers' / f'{runner}-{sha256(pom)[:12]}'
  found = sorted(folder.glob('beam-runners-*-job-server-*.jar'))
  if found:
    return found[0]
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
    folder.mkdir(parents=True, exist_ok=True)
    shutil.move(jar, folder / jar.name)
  return folder / jar.name


def _go_environment() -> dict:
  return dict(os.environ, GOMODCACHE=str(CACHE / 'go' / 'mod'),
              GOCACHE=str(CACHE / 'go' / 'build'), GOPATH=str(CACHE / 'go'),
              GOFLAGS='-modcacherw -trimpath')


def prism_binary(version: str = apache_beam.__version__) -> pathlib.Path:
  """Beam's Prism runner at the SDK's version, built from the Go module
  proxy; installed where Beam looks for the release it would download
  (``install_prism``)."""
  binary = CACHE / 'prism' / version / 'prism'
  if not binary.exists():
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
      binary.parent.mkdir(parents=True, exist_ok=True)
      shutil.move(built, binary)
  install_prism(binary, version)
  return binary


def install_prism(binary: pathlib.Path, version: str) -> pathlib.Path:
  """Puts ``binary`` where Beam looks for its Prism download, as the zip
  Beam's release holds, so that ``--runner=PrismRunner`` and DirectRunner
  use it without a network."""
  # pylint: disable-next=protected-access
  url = prism_runner.PrismJobServer._construct_download_url(
      f'v{version}', f'v{version}', platform.system(), platform.machine())
  target = pathlib.Path(prism_runner.PrismJobServer.BIN_CACHE,
                        url.rsplit('/', 1)[1])
  member = target.name[:-len('.zip')]
  archive = _zip_of(binary, member)
  if not target.exists() or sha256(target) != sha256(archive):
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive, target)
    # Beam unpacks the zip beside it once, then runs what it unpacked.
    pathlib.Path(target.parent, member).unlink(missing_ok=True)
  return target


def _zip_of(binary: pathlib.Path, member: str) -> pathlib.Path:
  archive = binary.with_suffix('.zip')
  if not archive.exists():
    with zipfile.ZipFile(archive.with_suffix('.tmp'), 'w',
                         zipfile.ZIP_DEFLATED) as written:
      written.write(binary, member)
    archive.with_suffix('.tmp').rename(archive)
  return archive


def fetch(what: str) -> None:
  """``what``: flink, spark, prism or all."""
  for cluster in ('flink', 'spark'):
    if what in (cluster, 'all'):
      print(f'{cluster}: {distribution(cluster)}', flush=True)
      print(f'{cluster}: {job_server_jar(cluster)}', flush=True)
  if what in ('prism', 'all'):
    print(f'prism: {prism_binary()}', flush=True)
