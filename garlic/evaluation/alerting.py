"""The alert policy on a run's hourly predictions: chosen on its validation stays, applied to any others, and what
the alerts score per stay, so that a table keeps stays, not hours (``garlic.metrics.alert_policy``,
``garlic.metrics.alerts``).

Predictions are what ``fit_and_test`` logs on a task of prediction times and ``garlic predict --hourly`` writes:
``stay_id, time, risk`` and, where known, ``label``; a stay's rows together, in time order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from garlic.io.atomic import atomic_file
from garlic.metrics.alert_policy import AlertPolicy, AlertPolicyError, PolicyChoice, choose_policy
from garlic.metrics.alerts import ALERT_PARTS, HOURS_PER_100_DAYS, alert_parts, alert_scores
from garlic.metrics.utility import stay_lengths, stay_parts

UTILITY_PARTS = ("observed", "inaction", "best")  # of ``garlic.metrics.utility.stay_parts``
STAY_ALERT_COLUMNS = ("stay_id", *UTILITY_PARTS, *ALERT_PARTS)
# A burden curve's thresholds: the same for every run, so that curves of several splits add up.
CURVE_THRESHOLDS = np.unique(np.r_[np.geomspace(1e-3, 1, 91), 1.0])
CURVE_COLUMNS = ("threshold", "stays", "hours", "septic", "alerts", "true_alerts", "detected", "alerted")


def hours_of(predictions: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(risks, times, lengths) of hourly predictions, a stay's rows together in time order (refused otherwise)."""
    stay, time = predictions["stay_id"].to_numpy(), predictions["time"].to_numpy(dtype=np.float64)
    lengths = stay_lengths(stay)
    if len(np.unique(stay)) != len(lengths):
        raise ValueError("hourly predictions must hold each stay's rows together")
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    later = np.diff(time) > 0
    later[starts[1:] - 1] = True  # a new stay may start at any time
    if not later.all():
        raise ValueError("hourly predictions must be in time order within each stay")
    return predictions["risk"].to_numpy(dtype=np.float64), time, lengths


def choose(predictions: pd.DataFrame, **settings) -> PolicyChoice:
    """``choose_policy`` on these predictions (their labels, where they have a ``label`` column)."""
    risks, times, lengths = hours_of(predictions)
    labels = predictions["label"].to_numpy() if "label" in predictions else None
    return choose_policy(risks, times, lengths, labels, **settings)


def stay_alerts(policy: AlertPolicy, predictions: pd.DataFrame) -> pd.DataFrame:
    """Per stay of labelled hourly predictions, what ``policy``'s alarms score (``STAY_ALERT_COLUMNS``): the
    Challenge's utility parts and the per-alert parts."""
    risks, times, lengths = hours_of(predictions)
    labels = predictions["label"].to_numpy()
    alarms = policy.alarms(risks, times, lengths)
    utility = stay_parts(labels, alarms, lengths)
    alerts = alert_parts(labels, alarms, lengths)
    first = np.r_[0, np.cumsum(lengths)[:-1]]
    return pd.DataFrame(
        {
            "stay_id": predictions["stay_id"].to_numpy()[first],
            **{name: utility[name] for name in UTILITY_PARTS},
            **alerts,
        }
    )


def as_parts(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """A ``stay_alerts`` frame (read back from a file too) as arrays."""
    parts = {name: frame[name].to_numpy(dtype=np.float64) for name in STAY_ALERT_COLUMNS[1:]}
    parts["septic"], parts["detected"] = parts["septic"].astype(bool), parts["detected"].astype(bool)
    return parts


def scores(parts: dict[str, np.ndarray], weights: np.ndarray | None = None) -> dict[str, float]:
    """The utility of the policy's alarms and its per-alert scores, over stays whose parts are ``parts`` (each
    counted ``weights`` times)."""
    weights = np.ones(len(parts["hours"])) if weights is None else np.asarray(weights, dtype=np.float64)
    observed, inaction, best = (weights @ parts[name] for name in UTILITY_PARTS)
    with np.errstate(divide="ignore", invalid="ignore"):  # no septic stay: as the Challenge
        utility = float((observed - inaction) / (best - inaction))
    return {"utility": utility, **alert_scores(parts, weights)}


def burden_curve(
    template: AlertPolicy, predictions: pd.DataFrame, thresholds: np.ndarray = CURVE_THRESHOLDS
) -> pd.DataFrame:
    """What ``template`` scores at each of ``thresholds`` on labelled hourly predictions, as counts that add up over
    splits (``CURVE_COLUMNS``): sensitivity = detected / septic, PPV = true_alerts / alerts, alerts per 100
    patient-days = 2,400 alerts / hours."""
    risks, times, lengths = hours_of(predictions)
    alarms = template.alarms(risks, times, lengths, thresholds)
    parts = alert_parts(predictions["label"].to_numpy(), alarms, lengths)
    return pd.DataFrame(
        {
            "threshold": thresholds,
            "stays": len(lengths),
            "hours": lengths.sum(),
            "septic": parts["septic"].sum(),
            "alerts": parts["alerts"].sum(axis=1),
            "true_alerts": parts["true_alerts"].sum(axis=1),
            "detected": parts["detected"].sum(axis=1),
            "alerted": (parts["alerts"] > 0).sum(axis=1),
        }
    )


def curve_scores(curve: pd.DataFrame) -> pd.DataFrame:
    """Sensitivity, PPV and alerts per 100 patient-days at each threshold of a (summed) burden curve."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return pd.DataFrame(
            {
                "threshold": curve["threshold"],
                "sensitivity": curve["detected"] / curve["septic"],
                "ppv": curve["true_alerts"] / curve["alerts"],
                "alerts_per_100_days": HOURS_PER_100_DAYS * curve["alerts"] / curve["hours"],
            }
        )


# ---------------------------------------------------------------------------------------------------------------
# A run's policy, and a site's


@dataclass(frozen=True)
class RunPolicy:
    policy: AlertPolicy
    chosen_by: str  # how, in words
    hourly: bool  # whether the run was trained on a task of prediction times


def run_policy(run_id: str, store: Path) -> RunPolicy:
    """The alert policy of run ``run_id``: the one it chose on validation (its ``alert_*`` metrics); for an hourly
    run that predates policies, the policy of highest utility on its validation predictions, chosen now; for a
    per-stay run, the default policy at the threshold that flags ``DEFAULT_SENSITIVITY`` of its positive
    validation stays."""
    from mlflow.exceptions import MlflowException

    from garlic.metrics.threshold import DEFAULT_SENSITIVITY, threshold_at_sensitivity
    from garlic.tracking import queries
    from garlic.tracking.store import get_run, use_store

    use_store(store)
    metrics = get_run(run_id).data.metrics
    hourly = "threshold" in metrics
    if "alert_threshold" in metrics:
        settings = {name: metrics[f"alert_{name}"] for name in ("threshold", "band", "quiet_hours", "margin")}
        return RunPolicy(AlertPolicy(**settings), "the run's, chosen on its validation stays by utility", hourly)
    try:
        validation = queries.test_predictions(store, run_id, "validation")
    except (MlflowException, OSError):
        raise AlertPolicyError(
            f"run {run_id} logged neither an alert policy nor validation predictions to choose "
            "one on; give a threshold (--threshold)"
        ) from None
    if hourly:
        return RunPolicy(choose(validation).policy, "highest utility on the run's validation stays", True)
    threshold = threshold_at_sensitivity(validation["label"], validation["risk"], DEFAULT_SENSITIVITY)
    return RunPolicy(
        AlertPolicy(threshold), f"{DEFAULT_SENSITIVITY:.0%} sensitivity on the run's validation stays", False
    )


PROFILE_VERSION = 1


def write_profile(path: Path, run_id: str, site: str, choice: PolicyChoice, stays: int, hours: int) -> Path:
    """A site profile: the policy set on a site's own stays for ``run_id`` (``garlic calibrate``), which
    ``garlic monitor``, ``garlic predict --hourly`` and the dashboard read with ``--profile``. Written whole or not
    at all."""
    profile = {
        "version": PROFILE_VERSION,
        "run": run_id,
        "site": site,
        "policy": choice.policy.settings(),
        "chosen_by": choice.chosen_by,
        "stays": int(stays),
        "hours": int(hours),
        "scores_on_site": {name: float(value) for name, value in choice.scores.items()},
    }
    with atomic_file(Path(path), mode="w", suffix=".json") as handle:
        json.dump(profile, handle, indent=2)
    return Path(path)


def read_profile(path: Path, run_id: str) -> tuple[AlertPolicy, str]:
    """The policy of a site profile made for ``run_id``; refused, naming the file and the field, when it is not
    one, is damaged, or was made for another run (its threshold means nothing for another model's risks)."""
    path = Path(path)
    try:
        profile = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such site profile (garlic calibrate writes one)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AlertPolicyError(f"{path}: not a site profile ({exc})") from None
    if not isinstance(profile, dict) or profile.get("version") != PROFILE_VERSION:
        raise AlertPolicyError(f"{path}: not a site profile of version {PROFILE_VERSION} (garlic calibrate writes one)")
    if profile.get("run") != run_id:
        raise AlertPolicyError(
            f"{path}: a site profile for run {profile.get('run')!r}, not for run {run_id}; its "
            "threshold is on another model's risks"
        )
    settings = profile.get("policy")
    if not isinstance(settings, dict) or set(settings) != {"threshold", "band", "quiet_hours", "margin"}:
        raise AlertPolicyError(f"{path}: field 'policy' must hold threshold, band, quiet_hours and margin")
    try:
        policy = AlertPolicy(**settings)
    except AlertPolicyError as exc:
        raise AlertPolicyError(f"{path}: {exc}") from None
    return policy, f"site profile {path.name}: {profile.get('chosen_by')} on {profile.get('site')}'s stays"


def policy_for(run_id: str, store: Path, profile: Path | None = None, **given: float | None) -> RunPolicy:
    """The policy a run alerts with: its own (``run_policy``), or a site profile's (``profile``), with any setting
    ``given`` (threshold, band, quiet_hours, margin; None: not given) put in its place."""
    given = {name: value for name, value in given.items() if value is not None}
    try:
        found = run_policy(run_id, store)
    except AlertPolicyError:
        if "threshold" not in given:
            raise
        from garlic.tracking.store import get_run

        found = RunPolicy(AlertPolicy(given["threshold"]), "", "threshold" in get_run(run_id).data.metrics)
    policy, chosen_by = read_profile(profile, run_id) if profile is not None else (found.policy, found.chosen_by)
    if given:
        policy = AlertPolicy(**(policy.settings() | given))
        chosen_by = ", ".join(
            [
                *([chosen_by] if chosen_by and set(given) != {"threshold"} else []),
                *(f"--{name.replace('_', '-')} {value:g}" for name, value in given.items()),
            ]
        )
    return RunPolicy(policy, chosen_by, found.hourly)
