"""Replay of one stay hour by hour: at hour h the model sees only the observations made up to h.

The risk curve (the risk after every whole hour) comes out of one forward pass. GARLIC is causal: every layer up
to and including the GRU computes step t from steps <= t only, and only the temporal attention pooling (over a
stay's real steps) and the classifier look at the stay as a whole. So the step states of the whole stay, computed
once, are the step states of each of its hourly prefixes; each prefix then only needs its own pooling over its
first steps, and all prefixes are pooled as one batch. That is one pass over the stay instead of one per hour
(48 times less work for a 48-hour stay); a test checks every hour against the model run on the stay cut there.

The explanation of an hour is computed for that hour alone, on the stay really cut at that hour: the model's
built-in one, or integrated gradients for a model without one (the reference architecture); for a method that
explains each risk by its variables (``contract.explains_rows``: gradient boosting's exact tree SHAP values,
logistic regression's coefficient x value), its variables' contributions to the risk at that hour, asked as its
risk curve asks it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from garlic.app.summary import value_direction
from garlic.data.batches import Batch, IrregularDataset
from garlic.explain.built_in import Explanation, explain
from garlic.explain.integrated_gradients import gradient_explanation
from garlic.explain.report import observation_table
from garlic.models.compact import Garlic, at_last_step, step_mask
from garlic.methods.saved import SavedMethod
from garlic.io.tensors import IrregularTensors, PredictionTimes
from garlic.methods.contract import answers_prediction_times, explains_rows
from garlic.methods.drivers import gradient_contributions

Stay = dict[str, torch.Tensor]  # one stay as an IrregularDataset item: values, mask, times, lengths, static, labels


@dataclass
class Replay:
    """One stay's risk at every whole hour. H hours.

    hours  [H] 1, 2, ... up to the first whole hour at or after the stay's last observation
    risk   [H] predicted risk from the data up to each hour; NaN while nothing has been observed
    stay   the whole stay, normalised as the model sees it
    """

    stay_id: int
    hours: np.ndarray
    risk: np.ndarray
    stay: Stay
    record: IrregularTensors | None = None  # the stay as recorded (one stay), which a method other than GARLIC reads


@dataclass
class Hour:
    """What the model had seen by one hour of a replay, and why it gave its risk (both as batches of one); no
    explanation for a method that gives none (``SavedMethod.explains``). ``contributions``: for a method that
    explains each risk by its variables, each variable's contribution to the hour's log-odds (else None)."""

    stay_id: int
    hour: float
    batch: Batch
    explanation: Explanation | None
    contributions: pd.Series | None = None

    @property
    def explained(self) -> bool:
        """Whether the hour has a why: an explanation of the model's or its variables' contributions."""
        return self.explanation is not None or self.contributions is not None


def replay_hours(last_time: float) -> np.ndarray:
    """Whole hours 1 .. the first whole hour at or after the last observation."""
    return np.arange(1, max(math.ceil(last_time), 1) + 1, dtype=np.float32)


def prefix_batch(stay: Stay, hours: np.ndarray) -> Batch:
    """A batch whose row k holds only the stay's observations at time <= hours[k] (later cells zeroed)."""
    steps = int(stay["lengths"])
    times = stay["times"][:steps]
    lengths = torch.searchsorted(times, torch.as_tensor(hours, dtype=times.dtype), right=True)
    kept = torch.arange(steps)[None, :] < lengths[:, None]  # [H, T]
    return Batch(
        values=stay["values"][:steps][None] * kept[..., None],
        mask=stay["mask"][:steps][None] * kept[..., None],
        times=times[None] * kept,
        lengths=lengths,
        static=stay["static"].expand(len(hours), -1),
        labels=stay["labels"].expand(len(hours)),
    )


@torch.no_grad()
def risk_curve(model: Garlic, stay: Stay, hours: np.ndarray) -> np.ndarray:
    """Risk after each of ``hours`` from the data up to it [H], in one pass; NaN before the first observation."""
    model.eval()
    # Every step's state depends only on earlier steps, so one pass over the whole stay serves every prefix.
    steps = int(stay["lengths"])
    encoded = model.encode(stay["values"][None, :steps], stay["mask"][None, :steps], stay["times"][None, :steps])
    lengths = torch.searchsorted(stay["times"][:steps], torch.as_tensor(hours, dtype=torch.float32), right=True)
    prefixes = len(hours)
    real = step_mask(lengths, steps)
    summary = None if encoded.summaries is None else at_last_step(encoded.summaries.expand(prefixes, -1, -1), real)
    logits, _ = model.classify(
        encoded.states.expand(prefixes, -1, -1),
        real,
        stay["static"].expand(prefixes, -1),
        summary,
        torch.as_tensor(hours, dtype=torch.float32),
    )
    risk = torch.sigmoid(logits).numpy().astype(float)
    risk[lengths.numpy() == 0] = np.nan
    return risk


def method_risk_curve(trained: SavedMethod, tensors: IrregularTensors, hours: np.ndarray) -> np.ndarray:
    """Risk after each of ``hours`` [H] from a method other than GARLIC, which need not be causal step by step: a
    method that answers prediction times (an hourly one) is asked at each hour of the stay (``tensors``, one stay,
    as recorded); another scores the stay cut at each hour, all cuts as one dataset. NaN before the first
    observation."""
    asked, seen = method_input(trained, tensors, hours)
    risk = np.full(len(hours), np.nan)
    if len(seen):
        risk[seen] = trained.predict_proba(asked)
    return risk


def method_input(
    trained: SavedMethod, tensors: IrregularTensors, hours: np.ndarray
) -> tuple[IrregularDataset, np.ndarray]:
    """The one stay of ``tensors`` as a method other than GARLIC is asked at ``hours``, and the positions of the
    hours it is asked at (those from the first observation on): an hourly method at each hour of the stay as
    recorded, another on the stay cut at each hour."""
    if answers_prediction_times(trained.method):
        seen = np.flatnonzero(hours >= tensors.times[0, 0])
        asked = replace(
            tensors,
            task=PredictionTimes(
                np.zeros(len(seen), np.int64), hours[seen].astype("float32"), np.zeros(len(seen), "float32")
            ),
        )
        return IrregularDataset(asked, trained.normalisation), seen
    prefixes = prefix_tensors(tensors, hours)
    seen = np.flatnonzero(prefixes.lengths > 0)
    return IrregularDataset(prefixes.subset(seen), trained.normalisation), seen


def prefix_tensors(tensors: IrregularTensors, hours: np.ndarray) -> IrregularTensors:
    """The one stay of ``tensors`` as H stays, the k-th holding only its observations at time <= hours[k]."""
    asked = PredictionTimes(
        np.zeros(len(hours), np.int64),
        np.asarray(hours, "float32"),
        np.repeat(tensors.labels, len(hours)).astype("float32"),
    )
    return replace(tensors, task=asked).cut_at_prediction_times()


def replay_stay(trained: SavedMethod, dataset: IrregularDataset, position: int) -> Replay:
    """The risk curve of the stay at ``position`` in ``dataset``: GARLIC's in one pass (``risk_curve``), another
    method's from the stay cut at every hour (``method_risk_curve``)."""
    stay = dataset[position]
    steps = int(stay["lengths"])
    if steps == 0:
        raise ValueError(f"stay {dataset.stay_ids[position]} has no observation to replay")
    hours = replay_hours(float(stay["times"][steps - 1]))
    if trained.explains:
        return Replay(int(dataset.stay_ids[position]), hours, risk_curve(trained.model, stay, hours), stay)
    record = dataset.tensors.subset(np.array([position]))
    return Replay(int(dataset.stay_ids[position]), hours, method_risk_curve(trained, record, hours), stay, record)


def explain_hour(trained: SavedMethod, replay: Replay, index: int, hourly: bool = False) -> Hour:
    """Observation-, signal- and edge-level importance of the risk at hour ``hours[index]``: the model's built-in
    explanation, integrated gradients (no edges) for a GARLIC model without one; for another method, its variables'
    contributions where it explains each risk by them (none before the first observation), else nothing. For an
    ``hourly`` run's GARLIC, also its variables' integrated gradients at the hour as contributions: the drivers the
    ward and ``garlic predict`` name for its alerts (``garlic.methods.drivers``)."""
    batch = prefix_batch(replay.stay, replay.hours[index : index + 1])
    if not trained.explains:
        contributions = None
        if explains_rows(trained.method) and replay.record is not None:
            asked, seen = method_input(trained, replay.record, replay.hours[index : index + 1])
            if len(seen):
                contributions = pd.Series(
                    trained.method.contributions(asked)[0], index=trained.variables, name="contribution"
                )
        return Hour(replay.stay_id, float(replay.hours[index]), batch, None, contributions)
    if trained.model.explanation_unavailable is None:
        explanation = explain(trained.model, batch, trained.variables)
    else:
        explanation = gradient_explanation(trained.model, batch, trained.variables)
    gradients = None
    if hourly:
        attribution = gradient_contributions(trained.model, batch)[0]
        gradients = pd.Series(attribution, index=trained.variables, name="contribution")
    return Hour(replay.stay_id, float(replay.hours[index]), batch, explanation, gradients)


def observations_at(hour: Hour, trained: SavedMethod) -> pd.DataFrame:
    """What the model had seen by the hour: time, variable, value (original units), importance."""
    table = observation_table(hour.explanation, hour.batch, np.array([hour.stay_id]), trained.normalisation)
    return table.drop(columns="stay_id")


def signals_at(hour: Hour) -> pd.Series:
    """Signal-level importance at the hour, largest first."""
    signal = hour.explanation.signal[0].numpy()
    return pd.Series(signal, index=hour.explanation.variables, name="importance").sort_values(ascending=False)


def signal_bars(hour: Hour, top: int = 10) -> pd.DataFrame:
    """The ``top`` most important variables at the hour with importance above zero (a zero would be an empty bar):
    variable, importance."""
    signals = signals_at(hour)
    return signals[signals > 0].head(top).rename_axis("variable").reset_index()


def edges_at(hour: Hour, top: int = 8) -> pd.DataFrame:
    """The ``top`` strongest edges between different variables for this stay at the hour.

    Self-loops (a variable's messages from its own past) are left out: the point is which variables drive which.
    """
    if hour.explanation.edges is None:  # integrated gradients: importance of values, none of edges
        return pd.DataFrame(columns=["source", "target", "importance"])
    edges = hour.explanation.edges[0].numpy().copy()
    np.fill_diagonal(edges, 0.0)
    order = np.argsort(edges, axis=None)[::-1][:top]
    source, target = np.unravel_index(order, edges.shape)
    names = np.asarray(hour.explanation.variables)
    table = pd.DataFrame({"source": names[source], "target": names[target], "importance": edges.ravel()[order]})
    return table[table["importance"] > 0].reset_index(drop=True)


def contribution_bars(hour: Hour, top: int = 10) -> pd.DataFrame:
    """The ``top`` variables whose contributions raised the risk at the hour most (above zero): variable,
    contribution."""
    raised = hour.contributions[hour.contributions > 0].sort_values(ascending=False, kind="stable")
    return raised.head(top).rename_axis("variable").reset_index()


def drivers_at(hour: Hour, top: int = 2) -> list[tuple[str, str | None]]:
    """The ``top`` variables that drove the risk at the hour (by contributions where the hour has them: those that
    raised the risk most; else the most important signals) and which way each has moved lately (none without an
    explanation)."""
    if hour.contributions is not None:
        names, variables = contribution_bars(hour, top)["variable"], list(hour.contributions.index)
    elif hour.explanation is not None:
        signals = signals_at(hour)
        names, variables = signals[signals > 0].index[:top], hour.explanation.variables
    else:
        return []
    drivers = []
    for name in names:
        column = variables.index(name)
        observed = hour.batch.mask[0, :, column] > 0
        times, values = hour.batch.times[0][observed].numpy(), hour.batch.values[0, :, column][observed].numpy()
        drivers.append((name, value_direction(times, values, hour.hour)))
    return drivers


def alert_start(hours: np.ndarray, alarms: np.ndarray, now: int) -> float | None:
    """While the policy's alert is on at position ``now``: the hour this alert began."""
    if not alarms[now]:
        return None
    off = np.flatnonzero(~alarms[: now + 1])
    return float(hours[off[-1] + 1 if len(off) else 0])
