"""The device a run asks for (``auto``, ``cpu``, ``cuda``), checked against what torch sees."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        device = torch.device(name)
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} was asked for, but torch sees no CUDA device; use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name!r} was asked for, but torch sees {torch.cuda.device_count()} CUDA "
                f"device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}"
            )
        return device
    return torch.device(name)
