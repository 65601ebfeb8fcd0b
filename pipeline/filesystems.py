"""Beam's ``FileSystems`` as the outputs layer's file access (``outputs``),
and the JSON files the Beam jobs write beside their data."""
import json
import os
import re
from typing import BinaryIO, Callable, List, Optional, Sequence

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

import outputs
from outputs import files as files_lib
from pipeline.readers import matching


class BeamFiles(files_lib.Files):
  """Any file system Beam reaches (local disks, ``gs://``, ``s3://``)."""

  def is_local(self, path: str) -> bool:
    return isinstance(FileSystems.get_filesystem(path), LocalFileSystem)

  def exists(self, path: str) -> bool:
    return FileSystems.exists(path) or bool(FileSystems.match(
        [path.rstrip('/') + '/*'], [1])[0].metadata_list)

  def is_file(self, path: str) -> bool:
    if self.is_local(path):
      return os.path.isfile(path)
    return FileSystems.exists(path)  # an object, not a prefix

  def files(self, folder: str) -> List[files_lib.FileInfo]:
    return [files_lib.FileInfo(m.path, m.last_updated_in_seconds)
            for m in FileSystems.match([folder.rstrip('/') + '/**'])[
                0].metadata_list]

  def makedirs(self, path: str) -> None:
    FileSystems.mkdirs(path)

  def write(self, path: str, data: bytes) -> None:
    with FileSystems.create(path) as handle:
      handle.write(data)

  def open(self, path: str) -> BinaryIO:
    return FileSystems.open(path,
                            compression_type=CompressionTypes.UNCOMPRESSED)

  def delete(self, paths: Sequence[str]) -> None:
    FileSystems.delete(list(paths))

  def rename(self, sources: Sequence[str], targets: Sequence[str]) -> None:
    if self.is_local(sources[0]):
      for target in targets:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    FileSystems.rename(list(sources), list(targets))


FILES = BeamFiles()


def write_json(path: str, value) -> None:
  with FileSystems.create(path, mime_type='application/json') as handle:
    handle.write(json.dumps(value, indent=2, sort_keys=True).encode('utf-8'))
    handle.write(b'\n')


def read_json(path: str):
  with FileSystems.open(path) as handle:
    return json.loads(handle.read().decode('utf-8'))


def reads(pattern: str) -> Callable[[str], bool]:
  """Whether the input pattern reads a path, compared as the outputs layer
  compares output paths: with the pattern's literal folder resolved."""
  if FILES.is_local(pattern):
    pattern = os.path.abspath(pattern)
    folder = os.path.dirname(re.match(r'[^[*?]*', pattern).group(0))
    pattern = os.path.realpath(folder) + pattern[len(folder):]
  return re.compile(matching.translate(pattern)).fullmatch


def claim(output_dir: str, input_pattern: str, layout: outputs.Layout,
          overwrite: bool, partition: str = '',
          beside: Optional[Callable[[str], None]] = None
          ) -> outputs.StagedOutput:
  """A Beam job's output, claimed (``outputs.claim``) for a job that reads
  ``input_pattern``."""
  return outputs.claim(FILES, output_dir, layout=layout, partition=partition,
                       overwrite=overwrite, input_pattern=input_pattern,
                       reads=reads(input_pattern), beside=beside)
