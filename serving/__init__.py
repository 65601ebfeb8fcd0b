"""Serving the trainer's export: what both jobs need of a model, Beam-free.

``exports`` finds and loads an export, ``length_groups`` calls it in small
length-grouped XLA calls, ``drift`` compares its predictions with the test
split's. The trainer imports it to evaluate what it exported, the scoring
job to score; neither job is imported from here.
"""
