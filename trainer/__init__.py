"""Trainer of beam-text-classifier: the transformer classifier and its export."""
