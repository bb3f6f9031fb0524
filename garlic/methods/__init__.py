"""Every model the project trains, as a method (``contract``: ``fit`` selecting on validation, ``predict_proba``):
GARLIC (``garlic``), severity scores and summary-feature classifiers (``summary``), GRU-D and decay + GRU
(``recurrent``), the field's models from PyPOTS (``field``), and the registry that names them (``registry``)."""
