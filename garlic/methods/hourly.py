"""Baselines that give a risk at any prediction time (``IrregularDataset.prediction_times``), as the Sepsis
Challenge's winners did: features of each stay's record up to that time, then gradient boosting or logistic
regression over all the prediction times of the training part; and a floor that learns nothing about the patient.

``hourly_features`` makes, per prediction time and variable, from the observations up to it: the last value, the
hours since it, how many values so far, the last change (last minus the one before), and the mean over the last
6 and 24 hours with the standard deviation over the last 24; then the static features and the prediction time
itself (ICU hours so far). Vectorised over stays, steps and variables, a bounded chunk of stays at a time.

A model's target is each prediction time's label, or (``target='utility'``, on a task scored by the Sepsis
Challenge's utility) what alarming there is worth (``garlic.metrics.utility.utility_targets``): the utility is a sum
over hours of what each hour's alarm or silence earns, so the alarm that maximises its expectation at an hour is the
one whose expected gain, alarmed minus silent, is positive. A classifier of "the gain is positive", each hour
weighted by the size of its gain, learns that decision (cost-sensitive learning): hours 6 to 12 before onset, whose
label is still 0, count as the hours to alarm at, and the hours more than 3 after onset, whose label is 1 but whose
alarm earns nothing, count for nothing.

Every method here answers one risk per prediction time; on a dataset without a tasks table that is one per stay at
the end of its input, so they also run on the per-stay tasks.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
from sklearn.base import BaseEstimator

from garlic.data.batches import IrregularDataset
from garlic.io.atomic import write_json_atomic
from garlic.io.tensors import IrregularTensors, PredictionTimes
from garlic.metrics.utility import SEPSIS_UTILITY, choose_threshold, stay_lengths, utility_targets
from garlic.methods.contract import check_fitted, check_learns_score, fitted_inputs
from garlic.methods.model_files import FITTED, ModelFileError, read_fitted
from garlic.methods.summary import CANDIDATES, ChosenClassifier

STATISTICS = ("last", "hours_since", "count", "change", "mean_6h", "mean_24h", "std_24h")
TARGETS = ("label", "utility")
CHUNK_STAYS = 512  # stays whose [steps, variables] arrays are held at once: about 100 MB at P19's longest stays


def feature_names(tensors: IrregularTensors) -> list[str]:
    per_variable = [f"{variable}_{statistic}" for statistic in STATISTICS for variable in tensors.variables]
    return [*per_variable, *tensors.static_features, "hours"]


def hourly_features(tensors: IrregularTensors, times: PredictionTimes | None = None) -> np.ndarray:
    """[M, len(feature_names)] float32 features of each prediction time (default: the tensors' own), NaN where a
    statistic has no value (a variable not yet measured, a window without a value)."""
    times = tensors.prediction_times() if times is None else times
    d = len(tensors.variables)
    out = np.full((len(times), len(STATISTICS) * d + len(tensors.static_features) + 1), np.nan, dtype="float32")
    bounds = np.searchsorted(times.stay, np.arange(0, len(tensors) + CHUNK_STAYS, CHUNK_STAYS))
    for chunk, (first, last) in enumerate(zip(bounds[:-1], bounds[1:])):
        if first < last:
            start = chunk * CHUNK_STAYS
            stays = slice(start, min(start + CHUNK_STAYS, len(tensors)))
            out[first:last, : len(STATISTICS) * d] = _chunk_features(
                tensors, stays, times.stay[first:last] - start, times.time[first:last]
            )
    out[:, len(STATISTICS) * d : -1] = tensors.static[times.stay]
    out[:, -1] = times.time
    return out


def _chunk_features(tensors: IrregularTensors, stays: slice, stay: np.ndarray, time: np.ndarray) -> np.ndarray:
    """The per-variable statistics for prediction times of the stays ``stays`` (``stay``: position within them)."""
    lengths = tensors.lengths[stays]
    steps = max(int(lengths.max()), 1)
    values = tensors.values[stays, :steps].astype("float64")
    mask = tensors.mask[stays, :steps]
    real = np.arange(steps)[None, :] < lengths[:, None]
    step_times = np.where(real, tensors.times[stays, :steps], np.inf)  # padding never counts as "up to"

    def steps_up_to(limit: np.ndarray) -> np.ndarray:
        """Per prediction time, the number of its stay's steps at or before ``limit`` hours."""
        return (step_times[stay] <= limit[:, None]).sum(axis=1)

    at = steps_up_to(time) - 1  # the last step a prediction time sees (-1: none yet)
    seen = at >= 0
    at = np.maximum(at, 0)
    step_index = np.where(mask, np.arange(steps)[None, :, None], -1)
    last_step = np.maximum.accumulate(step_index, axis=1)  # [n, T, D] the last observed step up to each step
    before = np.concatenate([np.full_like(last_step[:, :1], -1), last_step[:, :-1]], axis=1)
    count = np.cumsum(mask, axis=1)
    total = np.cumsum(np.where(mask, values, 0.0), axis=1)
    squares = np.cumsum(np.where(mask, values**2, 0.0), axis=1)

    last = last_step[stay, at]  # [M, D]
    last = np.where(seen[:, None], last, -1)
    has_last = last >= 0
    rows = stay[:, None]
    column = np.arange(values.shape[-1])[None, :]
    last_value = np.where(has_last, values[rows, np.maximum(last, 0), column], np.nan)
    hours_since = np.where(has_last, time[:, None] - tensors.times[stays][rows, np.maximum(last, 0)], np.nan)
    previous = np.where(has_last, before[rows, np.maximum(last, 0), column], -1)
    change = np.where(previous >= 0, last_value - values[rows, np.maximum(previous, 0), column], np.nan)
    seen_count = np.where(seen[:, None], count[stay, at], 0)

    def window(hours: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Count, sum and sum of squares of the values in (time - hours, time]."""
        start = steps_up_to(time - hours) - 1  # the last step outside the window (-1: none)
        outside = [
            np.where((start >= 0)[:, None], cumulative[stay, np.maximum(start, 0)], 0)
            for cumulative in (count, total, squares)
        ]
        inside = [np.where(seen[:, None], cumulative[stay, at], 0) for cumulative in (count, total, squares)]
        return tuple(a - b for a, b in zip(inside, outside))

    with np.errstate(invalid="ignore", divide="ignore"):
        n6, sum6, _ = window(6.0)
        n24, sum24, squares24 = window(24.0)
        mean6 = np.where(n6 > 0, sum6 / n6, np.nan)
        mean24 = np.where(n24 > 0, sum24 / n24, np.nan)
        std24 = np.where(n24 > 0, np.sqrt(np.maximum(squares24 / n24 - mean24**2, 0.0)), np.nan)
    return np.concatenate([last_value, hours_since, seen_count, change, mean6, mean24, std24], axis=1)


class HourlyModel(ChosenClassifier):
    """A ``garlic.methods.summary.ChosenClassifier`` on ``hourly_features`` over every prediction time of the
    training part: ``kind`` 'gbm' (scikit-learn's histogram gradient boosting) or 'logreg' (logistic regression after
    median imputation with missingness indicators), the best validation AUROC over prediction times kept; ``target``
    each time's label, or 'utility': whether alarming there gains utility, weighted by how much (the module's
    docstring).

    Its drivers fold every statistic of a variable (``HR_last``, ``HR_hours_since``, ``HR_mean_6h`` ...) into the
    variable (``HR``); the static features and the hour are left out of them (``ChosenClassifier``)."""

    at_prediction_times = True
    COLUMNS = "hourly feature"
    STATISTICS_PER_VARIABLE = len(STATISTICS)

    def __init__(self, kind: str, seed: int = 0, target: str = "label"):
        if kind not in CANDIDATES:
            raise ValueError(f"kind must be one of {', '.join(CANDIDATES)}, got {kind!r}")
        if target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
        self.kind, self.seed, self.target = kind, seed, target

    @property
    def name(self) -> str:
        """As the registry names it (what fitted.json records)."""
        return f"hourly_{self.kind}" + ("_utility" if self.target == "utility" else "")

    def features(self, dataset: IrregularDataset) -> np.ndarray:
        return hourly_features(dataset.tensors)

    def targets(self, dataset: IrregularDataset) -> np.ndarray:
        if self.target == "label":
            return dataset.prediction_times.label
        return self._utility_targets(dataset)[0].astype(np.int8)

    def sample_weights(self, dataset: IrregularDataset) -> np.ndarray | None:
        return None if self.target == "label" else self._utility_targets(dataset)[1]

    @property
    def learns_score(self) -> str | None:
        return SEPSIS_UTILITY if self.target == "utility" else None

    def _utility_targets(self, dataset: IrregularDataset) -> tuple[np.ndarray, np.ndarray]:
        times = dataset.prediction_times
        check_learns_score(self, times.score, self.name)
        return utility_targets(times.label, stay_lengths(times.stay))

    def columns(self, inputs: dict) -> int:
        return len(STATISTICS) * len(inputs["variables"]) + len(inputs["static_features"]) + 1


class AlarmAfterHour(BaseEstimator):
    """The floor: a risk of 1 at every prediction time from hour ``after_`` on and 0 before, the hour chosen on the
    training part: on a task scored by the Sepsis Challenge's utility, the one of highest utility; on another, the
    one whose alarms best part the outcomes (highest AUROC of the 0/1 alarm, on a per-stay task the input's length).
    It learns nothing about the patient: what it scores comes free from the task's timing (the utility rewards late
    alarms in long stays)."""

    at_prediction_times = True
    name = "alarm_after_hour"

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "AlarmAfterHour":
        self.inputs_ = fitted_inputs(train)
        times = train.prediction_times
        if times.score == SEPSIS_UTILITY:
            # Alarming from hour k on is alarming where time / longest >= k / longest: the utility's best threshold
            # over these "probabilities" is the best hour, found exactly by one sort (``choose_threshold``).
            longest = max(float(times.time.max()), 1.0)
            choice = choose_threshold(times.label, np.clip(times.time / longest, 0, 1), stay_lengths(times.stay))
            alarmed = times.time[times.time / longest >= choice.threshold]
            self.after_ = float(alarmed.min()) if len(alarmed) else np.inf
            self.train_score_ = choice.normalised_utility
        else:
            hours = np.unique(times.time)
            positive, negative = np.sort(times.time[times.label == 1]), np.sort(times.time[times.label == 0])
            alarmed = [1 - np.searchsorted(group, hours) / max(len(group), 1) for group in (positive, negative)]
            auroc = (alarmed[0] + 1 - alarmed[1]) / 2  # the AUROC of a 0/1 risk: the mean of its TPR and TNR
            self.after_, self.train_score_ = float(hours[np.argmax(auroc)]), float(np.max(auroc))
        return self

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return (dataset.prediction_times.time >= self.after_).astype("float64")

    def log_fitted(self, parts: dict[str, IrregularDataset]) -> dict[str, float]:
        check_fitted(self)
        mlflow.log_params({"chosen_after_hour": self.after_, "chosen_train_score": self.train_score_})
        return {}

    def save_fitted(self, folder: Path) -> None:
        """Its hour (none: JSON's null, never alarming) and training score, beside the inputs it was fitted on."""
        check_fitted(self)
        after = None if np.isinf(self.after_) else self.after_
        write_json_atomic(
            folder / FITTED,
            {"method": self.name, **self.inputs_, "after_hour": after, "train_score": self.train_score_},
        )

    def restore_fitted(self, folder: Path) -> None:
        fitted = read_fitted(folder)
        after = fitted.get("after_hour", "missing")
        if after is not None and (isinstance(after, bool) or not isinstance(after, (int, float)) or after < 0):
            raise ModelFileError(f"{folder / FITTED}: 'after_hour' must be an hour >= 0 or null, got {after!r}")
        self.inputs_ = {key: fitted[key] for key in ("variables", "static_features")}
        self.after_ = np.inf if after is None else float(after)
        self.train_score_ = float(fitted.get("train_score", np.nan))
