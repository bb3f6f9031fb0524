"""Files on disk: atomic writes and locks (``atomic``, ``locks``), verified downloads (``download``), the processed
tables every source writes (``tables``, the on-disk contract) and the tensor cache built from them (``tensors``).
Imports nothing else of ``garlic``."""
