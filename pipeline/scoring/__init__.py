"""The scoring job's parts; ``pipeline.score`` wires them together.

``settings``: the flags, checked. ``inference``: the model step, Beam's
RunInference with our model handler. ``rows``: the steps around it.
``report``: the manifest, the drift report and the summary. ``kept_fields``:
the types of ``--keep_fields``.
"""
