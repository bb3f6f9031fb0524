"""The baselines table: every registered method (``garlic.methods``; the models are in ``garlic.baselines``) on
GARLIC's saved splits.

``python -m experiments.baselines`` runs them all and prints the table (see ``experiments.baselines.run``).
"""
