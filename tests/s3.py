"""A real S3-compatible server on 127.0.0.1 (moto), for Beam's S3 filesystem."""
import contextlib
import functools
import logging
from unittest import mock
import urllib.request

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
import boto3
from botocore import loaders
from botocore import session as botocore_session
from moto.server import ThreadedMotoServer

BUCKET = 'bucket'


@contextlib.contextmanager
def s3_server():
  """Starts the server with an empty ``BUCKET``; yields the pipeline options
  that point Beam's S3 filesystem at it, already set for code that uses
  FileSystems outside a pipeline."""
  # One log line a request would bury a failing test's own output.
  logging.getLogger('werkzeug').setLevel(logging.WARNING)
  server = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)
  server.start()
  host, port = server.get_host_and_port()
  endpoint = f'http://{host}:{port}'
  # moto keeps its buckets in the process, across servers: start empty.
  urllib.request.urlopen(urllib.request.Request(
      f'{endpoint}/moto-api/reset', method='POST')).close()
  options = [f'--s3_endpoint_url={endpoint}', '--s3_access_key_id=x',
             '--s3_secret_access_key=x', '--s3_region_name=us-east-1']
  boto3.client('s3', endpoint_url=endpoint, aws_access_key_id='x',
               aws_secret_access_key='x',
               region_name='us-east-1').create_bucket(Bucket=BUCKET)
  FileSystems.set_options(PipelineOptions(options))
  # Beam's S3 filesystem makes a boto3 session for every call, and every
  # session parses botocore's JSON models again: in a test of hundreds of
  # calls, most of its time. Sessions that share one loader parse each
  # model once; every request still goes to the server.
  shared_loader = functools.lru_cache(maxsize=None)(loaders.create_loader)
  try:
    with mock.patch.object(botocore_session, 'create_loader', shared_loader):
      yield options
  finally:
    FileSystems.set_options(None)
    server.stop()
