"""Beam jobs of beam-text-classifier: preprocess (and, later, score)."""
