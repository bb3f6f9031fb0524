"""GARLIC-ICU: outcome prediction from irregular ICU time series (``garlic`` command: ``garlic.cli``)."""
import os

# OpenMP's threads (torch's CPU threads) wait for work passively, unless the user chose: a waiting thread that spins
# holds a CPU that another process, or torch's other thread, needs. Beside one busy process the first 40 batches of
# an epoch took 13.4 s spinning and 6.9 s waiting passively, and a one-stay prediction's GRU 0.7-1.5 s against a few
# milliseconds (issue #56). OpenMP reads this once, as torch loads it: here, before any module of garlic imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
