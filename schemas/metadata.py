"""The export's metadata (``serving.METADATA_FILE``): what the trainer
writes beside the graph, and what every reader of an export learns from it,
parsed once into an ``ExportMetadata``.

A JSON object: ``label_names`` (the classes, in the order of the
probabilities), ``version`` (the version folder's number; absent while the
export is staged, before its evaluation), ``reference`` (the test split's
predictions, which drift is measured against, ``serving.drift``), and what
the trainer records of itself: ``training``, ``preprocessing``,
``data_stats``, ``calibration``, ``evaluation``,
``preprocessing_fingerprint``, and ``blessing``: whether the trainer's gate
let the version be served by default (``blessed``, a bool) and why
(``reason``). An export made before the gate has no ``blessing`` and
counts as blessed.
"""
import dataclasses
from typing import Any, Dict, Optional, Tuple

from schemas import serving

LABEL_NAMES = 'label_names'
VERSION = 'version'
REFERENCE = 'reference'
BLESSING = 'blessing'
BLESSED = 'blessed'


@dataclasses.dataclass(frozen=True)
class ExportMetadata:
  """An export's metadata, checked: ``document`` is all of it, as read."""
  label_names: Tuple[str, ...]
  version: Optional[int]  # None: a staged export, not yet a version
  reference: Optional[Dict[str, Any]]
  document: Dict[str, Any]

  @property
  def blessing(self) -> Optional[Dict[str, Any]]:
    """The trainer's gate's verdict; None for an export made before it."""
    return self.document.get(BLESSING)

  @property
  def blessed(self) -> bool:
    """Whether a job naming the model folder may take this version; an
    export made before the gate counts as blessed."""
    return self.blessing is None or self.blessing[BLESSED]

  @classmethod
  def parse(cls, document: Any) -> 'ExportMetadata':
    """The metadata a JSON document holds; a ValueError that says what is
    wrong, the file its subject ("has no label_names ..."), unless it names
    its classes, each once, if it has one, a version that can be a
    version folder's (bool is no int here, as in JSON), and, if it has
    one, a blessing that says whether it is blessed."""
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
    blessing = document.get(BLESSING)
    if BLESSING in document and not (
        isinstance(blessing, dict) and isinstance(blessing.get(BLESSED), bool)):
      raise ValueError(f'has a {BLESSING} that does not say whether it is '
                       f'{BLESSED} (true or false): {blessing!r}')
    return cls(tuple(names), version, document.get(REFERENCE), document)
