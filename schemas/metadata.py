"""The export's metadata (``serving.METADATA_FILE``): what the trainer
writes beside the graph, and what every reader of an export learns from it,
parsed once into an ``ExportMetadata``.

A JSON object: ``label_names`` (the classes, in the order of the
probabilities), ``version`` (the version folder's number; absent while the
export is staged, before its evaluation), ``reference`` (the test split's
predictions, which drift is measured against, ``serving.drift``), and what
the trainer records of itself: ``training``, ``preprocessing``,
``data_stats``, ``calibration``, ``evaluation``,
``preprocessing_fingerprint``.
"""
import dataclasses
from typing import Any, Dict, Optional, Tuple

from schemas import serving

LABEL_NAMES = 'label_names'
VERSION = 'version'
REFERENCE = 'reference'


@dataclasses.dataclass(frozen=True)
class ExportMetadata:
  """An export's metadata, checked: ``document`` is all of it, as read."""
  label_names: Tuple[str, ...]
  version: Optional[int]  # None: a staged export, not yet a version
  reference: Optional[Dict[str, Any]]
  document: Dict[str, Any]

  @classmethod
  def parse(cls, document: Any) -> 'ExportMetadata':
    """The metadata a JSON document holds; a ValueError that says what is
    wrong, the file its subject ("has no label_names ..."), unless it names
    its classes, each once, and, if it has one, a version that can be a
    version folder's (bool is no int here, as in JSON)."""
    names = document.get(LABEL_NAMES) if isinstance(document, dict) else None
    if not (isinstance(names, list) and names and
            all(isinstance(name, str) for name in names)):
      raise ValueError('has no label_names (a list of the class names)')
    if len(set(names)) != len(names):
      raise ValueError(f'names a label twice: {names}')
    version = document.get(VERSION)
    whole = isinstance(version, int) and not isinstance(version, bool)
    if VERSION in document and not (
        whole and 0 <= version <= serving.MAX_VERSION):
      raise ValueError('has no version (a whole number below 2^63, as '
                       f'the version folders are named): {version!r}')
    return cls(tuple(names), version, document.get(REFERENCE), document)
