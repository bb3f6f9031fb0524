"""The baselines table: every registered method (``garlic.methods.registry``; the models are in ``garlic.methods``) on
GARLIC's saved splits.

``python -m experiments.baselines`` runs them all and prints the table (see ``experiments.baselines.run``).
"""
