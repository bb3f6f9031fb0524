"""The data a model sees: the datasets the project knows (``datasets``), their fixed splits and the protocols that
name them (``splits``), and batches over the cached tensors, normalised with training statistics only
(``batches``). Reads ``garlic.io``'s tables and tensors and ``garlic.sources``' datasets; imports nothing later of
``garlic``."""
