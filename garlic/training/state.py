"""The state of an unfinished fit (weights, optimisers, schedules, sampler, random state, progress), saved after every
epoch so that a killed run goes on where it stopped. Not the trained model: that is ``garlic.tracking.saved_model``'s."""
from __future__ import annotations

import pickle  # for its exception type only: torch.load(weights_only=True) refuses content with UnpicklingError
from pathlib import Path

import torch

from garlic.io.atomic import atomic_file


def save_training_state(path: Path, state: dict) -> None:
    """Write ``state`` to ``path`` atomically: a reader (or a resumed run) sees the previous state or this one."""
    with atomic_file(path) as out:
        torch.save(state, out)


def load_training_state(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise ValueError(f"{path}: not a readable training state ({exc})") from exc
