"""A bed's risk at each time it had a reading, from its readings up to then, and what drove it.

The risk at time t is the run's model on the bed's record up to t, exactly as ``garlic predict`` would score that
record cut at t (``garlic.inference``): a per-stay GARLIC of the compact architecture takes each bed's new steps
from the bed's step state (``garlic.live.steps``: a new reading costs a step, not the stay again), any other
per-stay model sees each asked cut as one stay, all cuts of a scoring round as one batch (one pass each); an hourly
model (the early-warning task's) is asked at each time, as ``garlic predict --hourly`` asks it at each hour. Static
descriptors (age, sex ...) are readings too: a bed's newest value of each is its static feature. A cut with no
reading of a time-varying input has no risk (None).

The drivers are the inputs that the model's own explanation ranks highest at that time: GARLIC's built-in one (the
compact architecture, per stay; an hourly GARLIC's by integrated gradients of the record cut at each asked time,
``garlic.methods.drivers``), or the variables whose
contributions raised the risk most for a model that explains each risk by its variables (``contract.explains_rows``:
gradient boosting's exact tree SHAP values, logistic regression's coefficient x value, per stay or at each hour;
``garlic.methods.drivers``). A model without one (the reference architecture, the floor, gradient boosting without
the shap package) gives none; ``unexplained`` says why where it could.
Risk and drivers from a step state are the one pass's on the cut to float rounding.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from garlic.data.batches import collate
from garlic.explain.built_in import explain
from garlic.inference import TOP_DRIVERS, driver_lists, predict_hourly, tensors_for_model
from garlic.live.steps import STEP_MEMORY, WardSteps
from garlic.methods.drivers import has_row_importance
from garlic.methods.contract import unexplained_reason
from garlic.methods.saved import SavedMethod


def record_tables(
    readings: pd.DataFrame, static_features: list[str], stay_id: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One bed's readings (variable, time, value) as the tables of one stay ``stay_id`` (``garlic.io.tables``): its
    observations, and its static row (the newest value of each static feature)."""
    is_static = readings["variable"].isin(static_features).to_numpy()
    observations = readings[~is_static][["time", "variable", "value"]].assign(stay_id=stay_id)
    newest = readings[is_static].groupby("variable")["value"].last()
    static = pd.DataFrame({"stay_id": [stay_id], **{name: [newest.get(name, np.nan)] for name in static_features}})
    columns = {"time": "float32", "value": "float32"}
    return observations[["stay_id", "time", "variable", "value"]].astype(columns), static


class BedScorer:
    """Risks of cuts of beds' records for one saved method."""

    def __init__(
        self,
        trained: SavedMethod,
        hourly: bool = False,
        top: int = TOP_DRIVERS,
        beds: int | None = None,
        step_memory: int = STEP_MEMORY,
    ):
        """``hourly``: the run was trained on a task of prediction times (the early-warning task); ``beds``: how many
        beds keep a step state, where the model has them (default: as many as ``step_memory`` bytes hold)."""
        self.trained, self.hourly, self.top = trained, hourly, top
        self.explains = (
            not self.hourly and trained.explains and getattr(trained.model, "explanation_unavailable", None) is None
        )
        # Any other model that says what drove each risk (garlic.methods.drivers): by its variables' contributions,
        # or an hourly GARLIC by integrated gradients of the record cut at each asked time
        self.contributes = not self.explains and has_row_importance(trained.method)
        self.unexplained = unexplained_reason(trained.method)  # why a model that could explain does not here
        # asked of the model, not its class: one whose layers go on one step at a time (garlic.models.steps)
        has_steps = not hourly and trained.explains and getattr(trained.model, "takes_steps", False)
        self.steps = WardSteps(trained, self.explains, beds, step_memory) if has_steps else None

    @property
    def static_features(self) -> list[str]:
        """The descriptors the model reads (readings too: each bed's newest value of each)."""
        return self.trained.static_features

    def forget(self, beds: set[str]) -> None:
        """Drop the step states of ``beds`` (a reading of theirs was withdrawn): they are made again from the store."""
        if self.steps is not None:
            self.steps.forget(beds)

    def reads_after(self, earliest: dict[str, float]) -> dict[str, float]:
        """The beds (asked from ``earliest[bed]`` on) whose readings ``score`` needs only after a time, and that
        time: those that go on from their step state. Every other bed needs all its readings."""
        return {} if self.steps is None else self.steps.reads_after(earliest)

    def score(
        self, readings: pd.DataFrame, asked: pd.DataFrame, partial: set[str] = frozenset()
    ) -> tuple[np.ndarray, list[list[str]]]:
        """The risk (NaN where none) and the drivers at each row (bed, time) of ``asked``, from ``readings`` (bed,
        variable, time, value) up to that time: every reading of a bed, or for the beds in ``partial`` those after
        its ``reads_after`` time (and every static descriptor)."""
        risk = np.full(len(asked), np.nan)
        drivers: list[list[str]] = [[] for _ in range(len(asked))]
        static_names = self.trained.static_features
        is_static = readings["variable"].isin(static_names).to_numpy()
        series, descriptors = readings[~is_static], readings[is_static]
        static = descriptors.groupby(["bed", "variable"], sort=False)["value"].last().unstack("variable")
        static = static.reindex(columns=static_names)
        if self.hourly:
            scored = self._hourly(series, static, asked, drivers)
        elif self.steps is not None:
            scored, importance = self.steps.score(series, static, asked, partial)
            for row, bed_importance in importance.items():
                drivers[row] = self._drivers(bed_importance)
        else:
            scored = self._per_cut(series, static, asked, drivers)
        risk[scored.index.to_numpy()] = scored.to_numpy()
        return risk, drivers

    def _cuts(self, series: pd.DataFrame, asked: pd.DataFrame) -> pd.DataFrame:
        """The readings of each asked cut, as the observations of a stay numbered by its row in ``asked``."""
        cuts = asked[["bed", "time"]].rename(columns={"time": "until"}).rename_axis("stay_id").reset_index()
        joined = series.merge(cuts, on="bed")
        return joined[joined["time"] <= joined["until"]][["stay_id", "time", "variable", "value"]]

    def _per_cut(self, series, static, asked, drivers) -> pd.Series:
        observations = self._cuts(series, asked)
        if observations.empty:
            return pd.Series(dtype=float)
        stays = np.unique(observations["stay_id"].to_numpy())
        cut_static = static.reindex(asked["bed"].to_numpy()[stays]).reset_index(drop=True)
        cut_static.insert(0, "stay_id", stays)
        tensors = tensors_for_model(
            self.trained, observations.astype({"time": "float32", "value": "float32"}), cut_static
        )
        dataset = self.trained.dataset(tensors)
        if self.explains:  # the explanation's pass gives the risk too
            risk = self._explained(dataset, tensors.stay_ids, drivers)
        else:
            risk = self.trained.predict_proba(dataset)
            if self.contributes:
                for row, names in zip(tensors.stay_ids, driver_lists(self.trained, dataset, self.top)):
                    drivers[row] = names
        return pd.Series(risk, index=tensors.stay_ids)

    @torch.no_grad()
    def _explained(self, dataset, rows: np.ndarray, drivers: list[list[str]]) -> np.ndarray:
        """The risk of each stay of ``dataset``, and its drivers written at its ``rows``, from one explained pass."""
        batch = collate([dataset[position] for position in range(len(dataset))])
        explanation = explain(self.trained.model, batch, self.trained.variables)
        for row, importance in zip(rows, explanation.signal.numpy()):
            drivers[row] = self._drivers(importance)
        return explanation.risk.numpy().astype(float)

    def _drivers(self, importance: np.ndarray) -> list[str]:
        """The ``top`` variables of a signal importance [D] that have any, highest first."""
        order = np.argsort(importance)[::-1][: self.top]
        return [str(name) for name in np.asarray(self.trained.variables)[order[importance[order] > 0]]]

    def _hourly(self, series, static, asked, drivers) -> pd.Series:
        beds = sorted(set(series["bed"]) & set(asked["bed"]))
        if not beds:
            return pd.Series(dtype=float)
        number = {bed: index for index, bed in enumerate(beds)}
        observations = series[series["bed"].isin(number)].assign(stay_id=lambda t: t["bed"].map(number))
        rows = asked[asked["bed"].isin(number)]
        tasks = pd.DataFrame(
            {
                "stay_id": rows["bed"].map(number).to_numpy(),
                "time": rows["time"].to_numpy(),
                "label": 0,
                "row": rows.index.to_numpy(),
            }
        ).sort_values(["stay_id", "time"])
        stay_static = static.reindex(beds).reset_index(drop=True)
        stay_static.insert(0, "stay_id", np.arange(len(beds)))
        observations = observations[["stay_id", "time", "variable", "value"]].astype(
            {"time": "float32", "value": "float32"}
        )
        asked_times = tasks[["stay_id", "time", "label"]].astype({"time": "float32", "label": "int8"})
        risks = predict_hourly(
            self.trained, observations, stay_static, asked_times, self.top if self.contributes else 0
        )
        if self.contributes:
            for row, names in zip(tasks["row"].to_numpy(), risks["drivers"]):
                drivers[row] = names
        return pd.Series(risks["risk"].to_numpy(), index=tasks["row"].to_numpy())
