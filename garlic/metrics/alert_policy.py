"""The alert policy: when a bed's alert goes on, when it clears and when it may come back. One object, applied alike
by the offline scores (``experiments.early_warning``, ``garlic score-alerts``), ``garlic predict --hourly``, the
dashboard's replay and the live ward, so that the numbers a table publishes are the alerts a bed sees.

At each time a risk is known, in time order, from the state before it (the alert on or off, and the last time it
was on):

- an alert that is off goes **on** when the risk reaches ``threshold`` and either more than ``quiet_hours`` have
  passed since the alert was last on (or it never was), or the risk reaches ``rearm = threshold * (1 + margin)``;
- an alert that is on stays on while the risk stays at or above ``release = threshold * (1 - band)`` (hysteresis:
  a risk wavering at the threshold neither raises nor clears it at every reading), and **clears** below it;
- a time without a risk (NaN, None) leaves the alert as it was (on or off; on, it was on at that time).

``band`` 0, ``quiet_hours`` 0 and ``margin`` 0 give the bare threshold the Sepsis Challenge scores (an alarm at
every hour with risk >= threshold). The threshold is chosen on validation stays (``choose_policy``): by the
Challenge's utility of the policy's alarms, for a burden (at most so many alerts per patient-day, which needs no
labels: a new hospital's own stays set it) or for a sensitivity (per alert, ``garlic.metrics.alerts``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from garlic.metrics.alerts import HOURS_PER_100_DAYS, alert_parts, alert_scores
from garlic.metrics.utility import hour_worth

# Chosen on validation stays only (docs/results/alert-policy-screen.md: 30 settings on a gradient boosting run's
# validation stays): of the settings within 0.005 of the best validation utility, the one raising the fewest alerts.
DEFAULT_BAND = 0.25  # clears below 75% of the threshold
DEFAULT_QUIET_HOURS = 24.0  # a cleared alert stays quiet for a day ...
DEFAULT_MARGIN = 0.25  # ... unless the risk reaches 1.25 times the threshold
MAX_QUIET_HOURS = 168.0
MAX_MARGIN = 10.0
CANDIDATES = 160  # thresholds tried by ``choose_policy``: quantiles of the risks, denser towards the highest


class AlertPolicyError(ValueError):
    """A policy setting out of its range, or a target no threshold meets; the message names the value."""


@dataclass(frozen=True)
class AlertState:
    """A bed's alert after its latest risk: on or off, and the last time it was on (-inf: never)."""

    on: bool = False
    last_on: float = -math.inf


@dataclass(frozen=True)
class AlertPolicy:
    threshold: float
    band: float = DEFAULT_BAND
    quiet_hours: float = DEFAULT_QUIET_HOURS
    margin: float = DEFAULT_MARGIN

    def __post_init__(self):
        checks = (
            ("threshold", self.threshold, 0, 1, "a risk in (0, 1]", lambda v: 0 < v <= 1),
            ("band", self.band, 0, 1, "a share of the threshold in [0, 1)", lambda v: 0 <= v < 1),
            (
                "quiet_hours",
                self.quiet_hours,
                0,
                MAX_QUIET_HOURS,
                f"hours in [0, {MAX_QUIET_HOURS:g}]",
                lambda v: 0 <= v <= MAX_QUIET_HOURS,
            ),
            (
                "margin",
                self.margin,
                0,
                MAX_MARGIN,
                f"a share of the threshold in [0, {MAX_MARGIN:g}]",
                lambda v: 0 <= v <= MAX_MARGIN,
            ),
        )
        for name, value, _, _, expected, allowed in checks:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not allowed(float(value)):
                raise AlertPolicyError(f"alert policy: {name} must be {expected}, got {value!r}")

    @property
    def release(self) -> float:
        """The risk under which a raised alert clears."""
        return self.threshold * (1 - self.band)

    @property
    def rearm(self) -> float:
        """The risk at which a cleared alert comes back before its quiet hours have passed."""
        return self.threshold * (1 + self.margin)

    def next(self, state: AlertState, time: float, risk: float | None) -> AlertState:
        """The state after a ``risk`` at ``time`` (None or NaN: no risk, the alert as it was)."""
        if risk is None or math.isnan(risk):
            on = state.on
        elif state.on:
            on = risk >= self.release
        else:
            on = risk >= self.threshold and (time - state.last_on > self.quiet_hours or risk >= self.rearm)
        return AlertState(on, time if on else state.last_on)

    def alarms(self, risks, times, lengths, thresholds=None) -> np.ndarray:
        """Whether the alert is on at each time of stays of ``lengths`` times (``risks`` and ``times`` flat over
        the stays, each stay's in time order): what ``next`` gives, applied to every stay at once. With
        ``thresholds`` ([K]), the policy at each of them (the rest of it kept): [K, times]."""
        risks, times = np.asarray(risks, dtype=np.float64), np.asarray(times, dtype=np.float64)
        lengths = np.asarray(lengths, dtype=np.int64)
        if risks.shape != times.shape or risks.ndim != 1 or lengths.sum() != len(risks):
            raise ValueError(f"expected a risk and a time for each of the {lengths.sum()} times of the stays")
        threshold = np.atleast_1d(np.asarray(self.threshold if thresholds is None else thresholds, np.float64))
        threshold = threshold[:, None]  # [K, 1]
        release, rearm = threshold * (1 - self.band), threshold * (1 + self.margin)
        stay = np.repeat(np.arange(len(lengths)), lengths)
        position = np.arange(len(risks)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        order = np.argsort(position, kind="stable")  # every stay's first time, then every second one ...
        bounds = np.searchsorted(position[order], np.arange(int(lengths.max(initial=0)) + 1))
        on = np.zeros((len(threshold), len(lengths)), dtype=bool)
        last_on = np.full(on.shape, -np.inf)
        out = np.zeros((len(threshold), len(risks)), dtype=bool)
        for first, last in zip(bounds[:-1], bounds[1:]):  # a step of every stay at once: at most one row a stay
            rows = order[first:last]
            where, risk, time = stay[rows], risks[rows], times[rows]
            was = on[:, where]
            with np.errstate(invalid="ignore"):  # NaN compares False, and is kept out below
                starts = (risk >= threshold) & ((time - last_on[:, where] > self.quiet_hours) | (risk >= rearm))
                now = np.where(np.isnan(risk), was, np.where(was, risk >= release, starts))
            on[:, where] = now
            last_on[:, where] = np.where(now, time, last_on[:, where])
            out[:, rows] = now
        return out if thresholds is not None else out[0]

    def settings(self) -> dict[str, float]:
        return {name: float(value) for name, value in asdict(self).items()}

    def describe(self) -> str:
        return (
            f"alert at risk >= {self.threshold:.4g}, cleared below {self.release:.4g}; once cleared, quiet for "
            f"{self.quiet_hours:g} h unless the risk reaches {self.rearm:.4g}"
        )


@dataclass(frozen=True)
class PolicyChoice:
    policy: AlertPolicy
    chosen_by: str  # what the threshold was chosen for, in words
    scores: dict[str, float]  # on the stays it was chosen on: the utility (with labels) and the per-alert scores


def candidate_thresholds(risks: np.ndarray, count: int = CANDIDATES) -> np.ndarray:
    """Thresholds to try, lowest first: the risks' quantiles, denser towards the highest (alarms are rare), and
    one just above the highest risk (no alert) where that is still a risk."""
    known = risks[~np.isnan(risks)]
    if not len(known):
        raise AlertPolicyError("no risk to set an alert threshold on")
    levels = 1 - np.geomspace(1, 1e-4, count)
    values = np.quantile(known, levels)
    above = np.nextafter(known.max(), np.inf)
    values = np.unique(np.r_[values, above if above <= 1 else 1.0])
    return values[(values > 0) & (values <= 1)]


def choose_policy(
    risks,
    times,
    lengths,
    labels=None,
    *,
    band: float = DEFAULT_BAND,
    quiet_hours: float = DEFAULT_QUIET_HOURS,
    margin: float = DEFAULT_MARGIN,
    alerts_per_day: float | None = None,
    sensitivity: float | None = None,
) -> PolicyChoice:
    """The policy with these settings and the threshold chosen on these stays (``risks`` at ``times``, flat over
    stays of ``lengths``; ``labels`` their hours' labels where known):

    - ``alerts_per_day`` X: the lowest candidate threshold whose alerts, per patient-day, are at most X (the most
      alerts a ward takes; needs no labels);
    - ``sensitivity`` S: the highest one whose per-alert sensitivity is at least S (needs labels);
    - neither: the one of highest Challenge utility (needs labels; of thresholds that tie, the highest).
    """
    template = AlertPolicy(1.0, band, quiet_hours, margin)  # checks the settings before anything is computed
    if alerts_per_day is not None and sensitivity is not None:
        raise AlertPolicyError("choose the threshold for a burden (alerts per day) or for a sensitivity, not both")
    if alerts_per_day is not None and not (isinstance(alerts_per_day, (int, float)) and 0 < alerts_per_day < 24):
        raise AlertPolicyError(f"alerts per patient-day must be a number in (0, 24), got {alerts_per_day!r}")
    if sensitivity is not None and not (isinstance(sensitivity, (int, float)) and 0 < sensitivity <= 1):
        raise AlertPolicyError(f"the sensitivity must be in (0, 1], got {sensitivity!r}")
    risks, lengths = np.asarray(risks, dtype=np.float64), np.asarray(lengths, dtype=np.int64)
    if labels is None and alerts_per_day is None:
        raise AlertPolicyError("without labels a threshold can only be set for a burden: give alerts per day")
    thresholds = candidate_thresholds(risks)
    alarms = template.alarms(risks, times, lengths, thresholds)  # [K, times]
    # Counting alerts needs no labels: unlabelled stays are counted as never septic, their other scores unused.
    parts = alert_parts(np.zeros(len(risks), np.int8) if labels is None else np.asarray(labels), alarms, lengths)
    scores = [
        alert_scores({name: value[k] if np.ndim(value) == 2 else value for name, value in parts.items()})
        for k in range(len(thresholds))
    ]
    if labels is None:
        scores = [{"alerts_per_100_days": score["alerts_per_100_days"]} for score in scores]
    per_day = np.array([score["alerts_per_100_days"] for score in scores]) * 24 / HOURS_PER_100_DAYS
    utility = None
    if labels is not None:
        worth = hour_worth(labels, lengths)
        inaction, best = worth.silent.sum(), worth.total(worth.best)
        if best > inaction:
            gain = worth.alarmed - worth.silent  # a threshold's row at a time: a [K, hours] float copy is GBs
            utility = np.array([gain[row].sum() for row in alarms]) / (best - inaction)
        for k, score in enumerate(scores):
            score["utility"] = float(utility[k]) if utility is not None else float("nan")
    if alerts_per_day is not None:
        meeting = np.flatnonzero(per_day <= alerts_per_day)
        if not len(meeting):
            raise AlertPolicyError(
                f"no threshold in (0, 1] gives at most {alerts_per_day:g} alerts per patient-day "
                f"on these stays: the fewest is {per_day.min():.3g}, at threshold "
                f"{thresholds[np.argmin(per_day)]:.4g}"
            )
        k, chosen_by = int(meeting[0]), f"at most {alerts_per_day:g} alerts per patient-day"
    elif sensitivity is not None:
        reaching = np.flatnonzero(np.array([s["sensitivity"] for s in scores]) >= sensitivity - 1e-12)
        if not len(reaching):
            raise AlertPolicyError(
                f"no threshold reaches a sensitivity of {sensitivity:g} on these stays (the "
                f"highest is {max(s['sensitivity'] for s in scores):.3g})"
            )
        k, chosen_by = int(reaching[-1]), f"a sensitivity of at least {sensitivity:g}"
    else:
        if utility is None:
            raise AlertPolicyError("no septic stay among these: the utility cannot choose a threshold")
        k = int(len(utility) - 1 - np.argmax(utility[::-1]))  # the highest of the thresholds that tie
        chosen_by = "the highest Challenge utility"
    policy = AlertPolicy(float(thresholds[k]), band, quiet_hours, margin)
    return PolicyChoice(policy, chosen_by, scores[k])
