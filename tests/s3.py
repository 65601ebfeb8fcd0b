"""A real S3-compatible server on 127.0.0.1 (moto), for Beam's S3 filesystem."""
import contextlib
import logging
import urllib.request

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
import boto3
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
  try:
    yield options
  finally:
    FileSystems.set_options(None)
    server.stop()
