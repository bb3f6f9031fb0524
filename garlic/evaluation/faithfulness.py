"""Are an alert's drivers what the model needs? Feature removal at each alerted hour, the same for every model that
explains its risks.

At an alerted prediction time (a stay's record up to hour t), rank the variables the record has observed by up to t
by the model's own importance at that hour (``garlic.methods.drivers.row_importance``: a method's contributions,
or GARLIC's integrated gradients of its logit at t), then remove ``fraction`` of them (rounded half up,
as ``garlic.explain.removal.keep_count`` counts) and ask the model again at t:

- ``top``: the highest-ranked ones (the drivers), ``bottom``: the lowest, ``random``: a seeded random choice.

Removing a variable makes every observation of it up to t missing (the record's empty steps dropped, as the
per-stay fidelity study does, ``garlic.explain.removal.reduce``): one act on the record, not on any model's feature
table, so that gradient boosting, logistic regression and GARLIC are measured alike, each from its own features of
what is left. The drop is the risk before minus after. Faithful drivers give top > random > bottom: removing what
raised the risk lowers it most. Only observed variables count: removing one never measured changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd

from garlic.data.batches import IrregularDataset
from garlic.methods.drivers import CHUNK_ROWS, row_importance
from garlic.explain.removal import CONDITIONS, keep_count, reduce
from garlic.io.tensors import IrregularTensors, PredictionTimes
from garlic.methods.contract import Method


def removed_variables(observed: np.ndarray, scores: np.ndarray, fraction: float) -> np.ndarray:
    """[R, D] bool: per row, the ``keep_count(fraction)`` observed variables of highest ``scores`` (ties: the
    earlier variable)."""
    count = keep_count(observed[:, None, :], fraction)
    ranked = np.where(observed, -np.asarray(scores, dtype="float64"), np.inf)
    order = np.argsort(ranked, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(order.shape[1])[None, :], axis=1)
    return (rank < count[:, None]) & observed


def _asked_at(tensors: IrregularTensors, times: PredictionTimes) -> IrregularTensors:
    """Each cut record (one stay per row) asked once, at its row's time; arrays of at least one step, so that
    records all emptied by a removal still have the shape the models read (their padding: nothing observed)."""
    asked = PredictionTimes(np.arange(len(times)), times.time, times.label, times.score)
    if tensors.mask.shape[1] == 0:
        one = (len(tensors), 1)
        tensors = replace(
            tensors,
            values=np.zeros((*one, tensors.values.shape[2]), tensors.values.dtype),
            mask=np.zeros((*one, tensors.mask.shape[2]), bool),
            times=np.zeros(one, tensors.times.dtype),
        )
    return replace(tensors, task=asked)


def removal_drops(
    method: Method,
    dataset: IrregularDataset,
    rows: np.ndarray,
    fraction: float = 0.5,
    seed: int = 0,
    importance: np.ndarray | None = None,
) -> pd.DataFrame:
    """Per prediction time at positions ``rows`` (of ``dataset.prediction_times``): its stay position and time, the
    variables observed by then, its risk, and the drop in risk when ``fraction`` of them are removed by each
    condition (``drop_top``, ``drop_random``, ``drop_bottom``; the module's docstring). ``importance`` [M, D]: the
    method's ``row_importance`` of the dataset, computed here when not given."""
    rows = np.sort(np.asarray(rows, dtype="int64"))
    if importance is None:
        importance = row_importance(method, dataset)
    times = dataset.prediction_times
    rng = np.random.default_rng(seed)
    tables = []
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[start : start + CHUNK_ROWS]
        asked = PredictionTimes(times.stay[chunk], times.time[chunk], times.label[chunk], times.score)
        cut = replace(dataset.tensors, task=asked).cut_at_prediction_times()
        observed = cut.mask.any(axis=1)  # [R, D]
        risk = method.predict_proba(IrregularDataset(_asked_at(cut, asked), dataset.normalisation))
        table = {"stay": asked.stay, "time": asked.time, "observed": observed.sum(axis=1), "risk": risk}
        scores = {"top": importance[chunk], "bottom": -importance[chunk], "random": rng.random(observed.shape)}
        for condition in CONDITIONS:
            removed = removed_variables(observed, scores[condition], fraction)
            reduced = reduce(cut, np.broadcast_to(~removed[:, None, :], cut.mask.shape))
            after = method.predict_proba(IrregularDataset(_asked_at(reduced, asked), dataset.normalisation))
            table[f"drop_{condition}"] = risk - after
        tables.append(pd.DataFrame(table))
    columns = ["stay", "time", "observed", "risk", *(f"drop_{condition}" for condition in CONDITIONS)]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=columns)


def alert_faithfulness(
    method: Method,
    dataset: IrregularDataset,
    threshold: float,
    fraction: float = 0.5,
    seed: int = 0,
    max_alerts: int | None = None,
    explain: Callable[[Method, IrregularDataset], np.ndarray] = row_importance,
) -> pd.Series:
    """The mean drop in risk at the alerted prediction times (risk >= ``threshold``) when the top, a random or the
    bottom ``fraction`` of their variables are removed (``removal_drops``), ranked by ``explain`` (default: the
    method's drivers; ``garlic.methods.drivers.row_signal_importance``: GARLIC's built-in one), with how many were
    measured: at most ``max_alerts`` of them, drawn at random (seeded) where there are more."""
    risk = method.predict_proba(dataset)
    alerted = np.flatnonzero(risk >= threshold)
    rng = np.random.default_rng(seed)
    if max_alerts is not None and len(alerted) > max_alerts:
        alerted = np.sort(rng.choice(alerted, max_alerts, replace=False))
    asked = _rows_of(dataset, alerted)
    drops = removal_drops(method, asked, np.arange(len(alerted)), fraction, seed, explain(method, asked))
    means = drops[[f"drop_{condition}" for condition in CONDITIONS]].mean()
    return pd.concat([pd.Series({"alerts": len(drops), "risk": drops["risk"].mean()}), means])


def _rows_of(dataset: IrregularDataset, rows: np.ndarray) -> IrregularDataset:
    """The dataset asked only at the prediction times at ``rows`` (its stays kept), so that explaining it explains
    those alone."""
    times = dataset.prediction_times
    asked = PredictionTimes(times.stay[rows], times.time[rows], times.label[rows], times.score)
    return IrregularDataset(replace(dataset.tensors, task=asked), dataset.normalisation)
