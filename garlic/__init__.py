"""GARLIC-ICU: outcome prediction from irregular ICU time series (``garlic`` command: ``garlic.cli``)."""
