"""The preprocessing job's parts; ``pipeline.preprocess`` wires them.

``settings``: the flags, checked. ``splits``: each record to its split or
the dead letters. ``examples``: records to TFT's Arrow batches, transformed
batches to tf.Examples. ``stats``: stats.json, the parameters and the
summary.
"""
