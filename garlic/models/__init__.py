"""The GARLIC networks: our compact reading of the paper (``compact``), the reference code's computation
(``reference``), what every architecture offers its callers (``architectures``), and risk per stay from any of them
in length-sorted batches (``predict``)."""
