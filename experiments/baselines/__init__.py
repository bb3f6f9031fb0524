"""Baselines on GARLIC's saved splits: severity scores, summary-feature classifiers and recurrent models.

``python -m experiments.baselines`` runs them all and prints the table (see ``experiments.baselines.run``).
"""
