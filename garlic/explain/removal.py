"""Feature removal on the cached tensors: keep a fraction of each stay's observed values, the rest become missing.

Per stay with n observed values, ``keep_count`` = round(fraction * n), rounding halves up (floor(fraction * n + 0.5),
so a stay with 3 values keeps 2 at 50%, and one with 1 value keeps 1). Which ones are kept:

- ``top``: the highest-importance observed values; ``bottom``: the lowest. Ties are broken by position (earlier
  time step first, then variable order), so the same importance always keeps the same cells.
- ``random``: a uniformly random subset, drawn from a seeded generator.

After removal, time steps left with no observed value are dropped and the remaining steps packed to the front, so
that the time grid does not reveal when a removed value was measured.
"""

from __future__ import annotations

import numpy as np

from garlic.io.tensors import IrregularTensors

CONDITIONS = ("top", "random", "bottom")


def keep_count(mask: np.ndarray, fraction: float) -> np.ndarray:
    """[N, T, D] mask -> [N] number of observed values each stay keeps (rounded half up)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must lie in [0, 1], got {fraction}")
    observed = mask.reshape(len(mask), -1).sum(axis=1)
    return np.floor(fraction * observed + 0.5).astype("int64")


def keep_highest(mask: np.ndarray, scores: np.ndarray, fraction: float) -> np.ndarray:
    """[N, T, D] bool: per stay, the ``keep_count`` observed cells with the highest ``scores`` (ties: earlier cell)."""
    n = len(mask)
    flat_mask = mask.reshape(n, -1)
    # Unobserved cells sort after every observed one, whatever their score.
    ranked = np.where(flat_mask, -np.asarray(scores, dtype="float64").reshape(n, -1), np.inf)
    order = np.argsort(ranked, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(order.shape[1])[None, :], axis=1)
    keep = (rank < keep_count(mask, fraction)[:, None]) & flat_mask
    return keep.reshape(mask.shape)


def keep_mask(
    mask: np.ndarray, importance: np.ndarray | None, fraction: float, condition: str, seed: int | list[int] = 0
) -> np.ndarray:
    """The cells ``condition`` ('top', 'random' or 'bottom') keeps; ``importance`` is ignored for 'random'."""
    if condition == "top":
        return keep_highest(mask, importance, fraction)
    if condition == "bottom":
        return keep_highest(mask, -np.asarray(importance, dtype="float64"), fraction)
    if condition == "random":
        return keep_highest(mask, np.random.default_rng(seed).random(mask.shape), fraction)
    raise ValueError(f"unknown removal condition {condition!r}; choose one of {CONDITIONS}")


def reduce(tensors: IrregularTensors, keep: np.ndarray) -> IrregularTensors:
    """``tensors`` with only the ``keep`` cells observed, empty steps dropped and the rest packed to the front."""
    mask = tensors.mask & keep
    real = np.arange(mask.shape[1])[None, :] < tensors.lengths[:, None]
    occupied = mask.any(axis=2) & real
    lengths = occupied.sum(axis=1).astype("int64")
    stay, step = np.nonzero(occupied)
    new_step = (np.cumsum(occupied, axis=1) - 1)[stay, step]
    steps = int(lengths.max(initial=0))
    values = np.zeros((len(tensors), steps, mask.shape[2]), dtype=tensors.values.dtype)
    new_mask = np.zeros((len(tensors), steps, mask.shape[2]), dtype=bool)
    times = np.zeros((len(tensors), steps), dtype=tensors.times.dtype)
    values[stay, new_step] = np.where(mask, tensors.values, 0)[stay, step]
    new_mask[stay, new_step] = mask[stay, step]
    times[stay, new_step] = tensors.times[stay, step]
    return IrregularTensors(
        stay_ids=tensors.stay_ids,
        values=values,
        mask=new_mask,
        times=times,
        lengths=lengths,
        static=tensors.static,
        labels=tensors.labels,
        variables=tensors.variables,
        static_features=tensors.static_features,
    )
