"""The device a run asks for (``auto``, ``cpu``, ``cuda``), checked against what torch sees."""
from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA device; use --device cpu or auto")
    return torch.device(name)
