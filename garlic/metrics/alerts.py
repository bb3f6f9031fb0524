"""Hourly alarms scored per alert, as a ward and the studies of deployed sepsis alerts count them.

A stay's hours are its prediction times in order; ``alarms`` says at which of them the alarm is on (after the alert
policy, ``garlic.metrics.alert_policy``). The definitions:

- **onset**: a septic stay's first hour labelled 1, plus 6 (the Challenge's ``SepsisLabel`` starts 6 h before onset;
  ``garlic.metrics.utility.DT_OPTIMAL``). A stay with no hour labelled 1 is not septic.
- **alert**: a run of consecutive alarmed hours of one stay (hours counted by position in the stay: the first hour
  is 0).
- **true alert**: an alert of a septic stay that overlaps the window [onset - 12, onset + 3] (both ends included);
  every other alert is false, among them every alert of a stay that is not septic and every one that ends before
  onset - 12 or starts after onset + 3. An alert that starts before the window and runs into it is true.
- **sensitivity**: septic stays with a true alert / septic stays.
- **PPV**: true alerts / all alerts.
- **lead time**: onset minus the first hour of the stay's first true alert, in hours, uncapped (negative: the alert
  came after onset); reported as the median and the quartiles over the septic stays with a true alert.
- **alerts per 100 patient-days**: all alerts / (all hours / 2,400).
- **share of stays alerted**: stays with at least one alert / all stays.

Per stay (``alert_parts``) the counts these are sums of, so that a table keeps those and not every hour, and a
bootstrap over stays redraws rows (``alert_scores`` with ``weights``). Every count is a few array passes over the
flat hours of all stays.
"""

from __future__ import annotations

import numpy as np

from garlic.metrics.utility import DT_OPTIMAL

WINDOW_BEFORE, WINDOW_AFTER = 12, 3  # a true alert overlaps [onset - 12, onset + 3]
HOURS_PER_100_DAYS = 2400
ALERT_PARTS = ("hours", "septic", "alerts", "true_alerts", "detected", "lead_hours")


def _stay_positions(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each hour's stay (its position in ``lengths``) and its hour within the stay."""
    stay = np.repeat(np.arange(len(lengths)), lengths)
    hour = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return stay, hour


def _checked(labels, alarms, lengths) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    labels, alarms, lengths = np.asarray(labels), np.asarray(alarms), np.asarray(lengths)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer) or (lengths < 0).any():
        raise ValueError("expected the stays' lengths as non-negative integers")
    hours = int(lengths.sum())
    if labels.shape != (hours,) or not np.isin(labels, (0, 1)).all():
        raise ValueError(f"expected a label 0 or 1 for each of the {hours} hours")
    if alarms.shape[-1:] != (hours,) or not np.isin(alarms, (0, 1)).all():
        raise ValueError(f"expected an alarm 0 or 1 for each of the {hours} hours")
    return labels.astype(bool), alarms.astype(bool), lengths.astype(np.int64)


def onsets(labels, lengths) -> np.ndarray:
    """Each stay's onset hour (its first labelled hour + 6), NaN for a stay never labelled."""
    labels, lengths = np.asarray(labels).astype(bool), np.asarray(lengths, dtype=np.int64)
    stay, hour = _stay_positions(lengths)
    labelled = np.flatnonzero(labels)
    septic, first = np.unique(stay[labelled], return_index=True)
    onset = np.full(len(lengths), np.nan)
    onset[septic] = hour[labelled[first]] - DT_OPTIMAL
    return onset


def alert_parts(labels, alarms, lengths) -> dict[str, np.ndarray]:
    """Per stay (``ALERT_PARTS``): its hours; whether it is septic; its alerts, and how many are true; whether it
    has a true alert; its lead time (NaN without a true alert). ``alarms`` may hold several alarm sequences over
    the same hours ([K, hours], each a policy at another threshold): then every part but ``hours`` and ``septic``
    is [K, stays]."""
    single = np.ndim(alarms) == 1
    labels, alarms, lengths = _checked(labels, alarms, lengths)
    stays = len(lengths)
    stay, hour = _stay_positions(lengths)
    onset = onsets(labels, lengths)
    sequences = alarms.shape[0] if alarms.ndim == 2 else 1
    alarms = alarms.reshape(sequences, len(hour))
    first_hour = hour == 0
    last_hour = np.r_[hour[1:] == 0, True] if len(hour) else hour.astype(bool)
    previous = np.concatenate([np.zeros_like(alarms[..., :1]), alarms[..., :-1]], axis=-1) & ~first_hour
    following = np.concatenate([alarms[..., 1:], np.zeros_like(alarms[..., :1])], axis=-1) & ~last_hour
    starts, ends = alarms & ~previous, alarms & ~following  # the first and the last hour of each alert
    # An alert's first and last hour pair up in order: the k-th start of the flat hours with the k-th end.
    (sequence, start_at), (_, end_at) = np.nonzero(starts), np.nonzero(ends)
    alert_stay = stay[start_at]
    window_onset = onset[alert_stay]
    true = (hour[start_at] <= window_onset + WINDOW_AFTER) & (hour[end_at] >= window_onset - WINDOW_BEFORE)
    shape = (sequences, stays)
    where = sequence * stays + alert_stay
    alerts = np.bincount(where, minlength=shape[0] * stays).reshape(shape)
    true_alerts = np.bincount(where[true], minlength=shape[0] * stays).reshape(shape)
    lead = np.full(shape[0] * stays, np.nan)
    # Alerts come in hour order, so the first true one of each (sequence, stay) is its first occurrence.
    first_true, at = np.unique(where[true], return_index=True)
    lead[first_true] = window_onset[true][at] - hour[start_at[true]][at]
    lead = lead.reshape(shape)
    parts = {
        "hours": lengths.astype(np.float64),
        "septic": ~np.isnan(onset),
        "alerts": alerts.astype(np.float64),
        "true_alerts": true_alerts.astype(np.float64),
        "detected": true_alerts > 0,
        "lead_hours": lead,
    }
    if single:
        parts.update({name: parts[name][0] for name in ("alerts", "true_alerts", "detected", "lead_hours")})
    return parts


def alert_scores(parts: dict[str, np.ndarray], weights: np.ndarray | None = None) -> dict[str, float]:
    """The per-alert scores of stays whose ``alert_parts`` are ``parts`` (each stay counted ``weights`` times, as a
    bootstrap resample counts it): ``sensitivity``, ``ppv``, ``lead_median`` with ``lead_q1`` and ``lead_q3``,
    ``alerts_per_100_days`` and ``share_alerted``. A ratio with nothing to divide is NaN."""
    weights = np.ones(len(parts["hours"])) if weights is None else np.asarray(weights, dtype=np.float64)
    septic, alerts = weights @ parts["septic"], weights @ parts["alerts"]
    hours, stays = weights @ parts["hours"], weights.sum()
    detected = parts["detected"] & (weights > 0)
    leads = np.repeat(parts["lead_hours"][detected], weights[detected].astype(np.int64))
    q1, median, q3 = np.percentile(leads, [25, 50, 75]) if len(leads) else (np.nan,) * 3

    def ratio(a: float, b: float) -> float:
        return float(a / b) if b else float("nan")

    return {
        "sensitivity": ratio(weights @ parts["detected"], septic),
        "ppv": ratio(weights @ parts["true_alerts"], alerts),
        "lead_median": float(median),
        "lead_q1": float(q1),
        "lead_q3": float(q3),
        "alerts_per_100_days": ratio(HOURS_PER_100_DAYS * alerts, hours),
        "share_alerted": ratio(weights @ (parts["alerts"] > 0), stays),
    }
