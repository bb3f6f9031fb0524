"""A bed's alert: on when its risk reaches the threshold, off only once the risk falls a band below it
(hysteresis), so that a risk wavering at the threshold does not raise and clear the alert at every reading.

The threshold is the run's: the alarm threshold it chose on validation (an hourly run's, by the Sepsis
Challenge's utility), else the one at the dashboard's default sensitivity on the run's validation predictions;
``garlic monitor --threshold`` sets another.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BAND = 0.1  # off below 90% of the threshold


@dataclass(frozen=True)
class Hysteresis:
    threshold: float
    band: float = DEFAULT_BAND

    def __post_init__(self):
        if not 0 < self.threshold <= 1 or not 0 <= self.band < 1:
            raise ValueError(f"an alert threshold must be in (0, 1] and its band in [0, 1), got {self.threshold} "
                             f"and {self.band}")  # fmt: skip

    @property
    def release(self) -> float:
        """The risk under which a raised alert clears."""
        return self.threshold * (1 - self.band)

    def next(self, alert: bool, risk: float | None) -> bool:
        """The alert after a new ``risk`` (None or NaN: no risk yet, the alert stays as it was)."""
        if risk is None or math.isnan(risk):
            return alert
        return risk >= self.release if alert else risk >= self.threshold


def run_alarm(run_id: str, store: Path, given: float | None = None) -> tuple[float, str, bool]:
    """The alarm threshold (``given``, else the run's: see the module's docstring), how it was chosen, and whether
    the run is an hourly one: only a run trained on a task of prediction times chooses its threshold by the
    utility (``garlic.evaluation.fit_and_test``)."""
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from garlic.metrics.threshold import DEFAULT_SENSITIVITY, threshold_at_sensitivity
    from garlic.tracking import run_contract
    from garlic.tracking.store import get_run, use_store

    use_store(store)
    chosen = get_run(run_id).data.metrics.get("threshold")
    hourly = chosen is not None
    if given is not None:
        return given, "--threshold", hourly
    if hourly:
        return chosen, "the alarm threshold of highest utility on validation", True
    try:
        local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=run_contract.predictions("validation"))
    except (MlflowException, OSError):
        raise ValueError(f"run {run_id} logged neither an alarm threshold nor validation predictions to set one "
                         "on; give one with --threshold") from None  # fmt: skip
    validation = pd.read_csv(local)
    threshold = threshold_at_sensitivity(validation["label"], validation["risk"], DEFAULT_SENSITIVITY)
    return threshold, f"{DEFAULT_SENSITIVITY:.0%} sensitivity on the run's validation stays", False
