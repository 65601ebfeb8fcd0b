"""Beam jobs of beam-text-classifier: preprocess and score.

Imports ``cli.quiet`` before anything else: a runner's worker process (the
multi-process DirectRunner's, a cluster's SDK worker) imports this package
first when it unpickles the jobs' transforms, and then loads TensorFlow
without its CUDA and INFO noise too.
"""
from cli import quiet  # pylint: disable=unused-import
