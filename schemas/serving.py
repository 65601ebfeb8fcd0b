"""The exported model's signature: what the trainer serves and the scorer calls.

A SavedModel whose ``serving_default`` takes a batch of raw strings and
answers, for each, the names below.
"""
from schemas import raw

SIGNATURE = 'serving_default'
# The one input: raw text, as the preprocessing job read it.
TEXT = raw.TEXT

# Outputs. The predicted label has the name the true one has in raw input.
LABEL = raw.LABEL
LABEL_ID = 'label_id'
CONFIDENCE = 'confidence'      # the predicted label's probability
PROBABILITIES = 'probabilities'  # one per label, in the metadata's order
