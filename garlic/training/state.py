"""The state of an unfinished fit (weights, optimisers, schedules, sampler, random state, progress), saved after every
epoch and within long epochs (with how far the epoch has come) so that a killed run goes on where it stopped. Not the
trained model: that is ``garlic.methods.model_files``'s.

A state records the config it was made under; a state of another run's config (copied into this run's folder, or
left by another version of the run) or a file of another structure is refused in one line naming the file, before
it is loaded into the model."""

from __future__ import annotations

import pickle  # for its exception type only: torch.load(weights_only=True) refuses content with UnpicklingError
from pathlib import Path

import torch

from garlic.config import Config
from garlic.io.atomic import atomic_file

# The parts of a state (``garlic.training.trainer.Trainer.state``, and the config beside it) and their types.
PARTS = {
    "progress": dict,
    "model": dict,
    "best_model": dict,
    "optimisers": dict,
    "schedulers": dict,
    "sampler_epoch": int,
    "rng": list,
    "cuda_rng": list,
    "config": dict,
}
# A state taken within an epoch has one more part, how far that epoch has come (``EpochPass.underway``); a state
# without it (after an epoch, or written before there were states within epochs) goes on from the next epoch. Under
# torchrun the pass also keeps each rank's tally (``tallies``, a list in rank order; ``tally`` is then rank 0's).
WITHIN_EPOCH = "epoch_pass"
PASS_PARTS = {"batches_done": int, "tally": dict, "seconds": float}
RANK_TALLIES = "tallies"
ELSEWHERE = {"device"}  # config keys a run may resume with another value of (on another machine)


def save_training_state(path: Path, state: dict, config: Config) -> None:
    """Write ``state`` of a fit of ``config`` to ``path`` atomically: a reader (or a resumed run) sees the previous
    state or this one."""
    with atomic_file(path) as out:
        torch.save({**state, "config": config.to_dict()}, out)


def _read(path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise ValueError(f"{path}: not a readable training state ({exc})") from exc


def progress_of(path: Path) -> dict:
    """How far the fit saved in ``path`` has come, whatever config it was made under: its ``progress``
    (``garlic.training.trainer.Progress``'s fields: ``epoch``, ``best_epoch`` ...); ``ValueError`` naming the file
    where it holds none."""
    state = _read(path)
    if not isinstance(state, dict) or not isinstance(state.get("progress"), dict):
        raise ValueError(f"{path}: not a training state (lacks or garbles progress)")
    return state["progress"]


def load_training_state(path: Path, config: Config) -> dict:
    """The state in ``path``, refused (``ValueError`` naming the file) unless it is one, made under ``config``."""
    state = _read(path)
    garbled = [
        key for key, kind in PARTS.items() if not isinstance(state, dict) or not isinstance(state.get(key), kind)
    ]
    if not garbled and WITHIN_EPOCH in state:
        underway = state[WITHIN_EPOCH]
        garbled = [
            f"{WITHIN_EPOCH}.{key}"
            for key, kind in PASS_PARTS.items()
            if not isinstance(underway, dict) or not isinstance(underway.get(key), kind)
        ]
        if not garbled and underway["batches_done"] < 0:
            garbled = [f"{WITHIN_EPOCH}.batches_done"]
        tallies = underway.get(RANK_TALLIES, []) if isinstance(underway, dict) else []
        if not garbled and not (isinstance(tallies, list) and all(isinstance(t, dict) for t in tallies)):
            garbled = [f"{WITHIN_EPOCH}.{RANK_TALLIES}"]
    if garbled:
        raise ValueError(
            f"{path}: not a training state (lacks or garbles {', '.join(garbled)}); remove it to train "
            "this split from its first epoch"
        )
    # A key the state predates trained as its default did: the state of an unchanged config resumes after a new key.
    recorded, expected = Config().to_dict() | state.pop("config"), config.to_dict()
    differing = [key for key in expected if key not in ELSEWHERE and recorded.get(key) != expected[key]]
    if differing:
        shown = ", ".join(f"{key} {recorded.get(key)!r} there, {expected[key]!r} in this run" for key in differing)
        raise ValueError(
            f"{path}: a training state of another configuration ({shown}); it is not this run's: remove "
            "it to train this split from its first epoch"
        )
    return state
