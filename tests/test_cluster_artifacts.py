"""The runners' jars and binaries, once fetched (make test-runners fetches
them first), come from the cache: a second fetch runs no registry client."""
import pytest

from clusters import artifacts

pytestmark = pytest.mark.runners


def test_a_second_fetch_downloads_nothing(monkeypatch):
  def no_client(command, **kwargs):
    raise AssertionError(f'ran {command}')

  monkeypatch.setattr(artifacts, '_run', no_client)
  artifacts.fetch('all')


def test_every_artifact_is_pinned():
  """Each job server's runner jar, each distribution and Prism's module
  have a checksum the fetch verifies."""
  assert set(artifacts.JOB_SERVERS) == set(artifacts.DISTRIBUTIONS) == {
      'flink', 'spark'}
  for package in artifacts.DISTRIBUTIONS.values():
    assert '--hash=sha256:' in artifacts._requirement(package)  # pylint: disable=protected-access
  assert artifacts.apache_beam.__version__ in artifacts.PRISM_MODULE_HASHES
