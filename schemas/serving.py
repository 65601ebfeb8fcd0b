"""The exported model's signatures: what the trainer serves and the scorer
calls.

A SavedModel whose ``serving_default`` takes a batch of raw strings and
answers, for each, the names below. Exports since the length-grouped scorer
also have two signatures that split it in two, for callers that batch
documents by length (``pipeline.score``): ``TOKENIZE`` (raw strings in, token
ids padded to max_len out) and ``CLASSIFY_TOKEN_IDS`` (token ids cut to any
length in, the numeric outputs out), whose model is compiled with XLA.
"""
import re
from typing import Optional

from schemas import raw
from schemas import transformed

SIGNATURE = 'serving_default'
TOKENIZE = 'tokenize'
CLASSIFY_TOKEN_IDS = 'classify_token_ids'
# The one input: raw text, as the preprocessing job read it.
TEXT = raw.TEXT
# TOKENIZE's output and CLASSIFY_TOKEN_IDS's input: int64 [batch, length],
# the real tokens first, then PAD_ID.
TOKEN_IDS = transformed.TOKEN_IDS

# Outputs. The predicted label has the name the true one has in raw input.
LABEL = raw.LABEL
LABEL_ID = 'label_id'
CONFIDENCE = 'confidence'      # the predicted label's probability
PROBABILITIES = 'probabilities'  # one per label, in the metadata's order

# Where the trainer puts an export and what it holds beside the graph:
# ``<model_dir>/EXPORT_DIR/<version>/`` with ``METADATA_FILE`` (version,
# label names, parameters, data stats, calibration, the drift reference).
EXPORT_DIR = 'export'
# TensorFlow's name for a SavedModel's graph, at the top of every export.
SAVED_MODEL_FILE = 'saved_model.pb'
METADATA_FILE = 'assets.extra/metadata.json'
# The version's evaluation report (metrics.json, report.md and its plots),
# published with it; the model folder's top holds a copy of the newest's.
REPORT_DIR = 'assets.extra/report'

# A version folder's name: a whole number in ASCII digits, without leading
# zeros (so that one number has one folder), below 2^63 (TF Serving's int64).
_VERSION_NAME = re.compile(r'0|[1-9][0-9]*')
MAX_VERSION = 2**63 - 1


def version_number(name: str) -> Optional[int]:
  """The version a folder named ``name`` holds; None if it is no version's
  name."""
  name = name.rstrip('/')
  if _VERSION_NAME.fullmatch(name) and int(name) <= MAX_VERSION:
    return int(name)
  return None
