"""The models the comparison sets beside GARLIC, as methods of ``garlic.pipeline``: severity scores and
summary-feature classifiers (``summary``), GRU-D and decay + GRU (``recurrent``). ``garlic.methods`` names them."""
