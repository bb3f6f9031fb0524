"""A short plain-language reading of the risk at one hour: its level, its trend and what drives it.

For example: "risk 0.72, rising; driven by falling GCS and rising BUN".
"""
from __future__ import annotations

import numpy as np

RISING, FALLING, STEADY = "rising", "falling", "steady"
RISK_LOOKBACK_HOURS = 6
RISK_TOLERANCE = 0.02  # a change in risk smaller than this over the look-back reads as steady
VALUE_WINDOW_HOURS = 24.0  # labs are drawn every 4-12 hours: a day holds a few
VALUE_TOLERANCE = 0.25  # in training standard deviations


def risk_trend(risk: np.ndarray, now: int, lookback: int = RISK_LOOKBACK_HOURS) -> str:
    """rising / falling / steady: the risk at position ``now`` against ``lookback`` hours earlier."""
    history = np.asarray(risk[max(now - lookback, 0) : now + 1], dtype=float)
    history = history[np.isfinite(history)]
    if len(history) < 2:
        return STEADY
    change = history[-1] - history[0]
    return RISING if change > RISK_TOLERANCE else FALLING if change < -RISK_TOLERANCE else STEADY


def value_direction(
    times: np.ndarray, values: np.ndarray, now: float, window: float = VALUE_WINDOW_HOURS
) -> str | None:
    """rising / falling / steady over the last ``window`` hours up to ``now``; None with fewer than two readings.

    ``values`` are in units of the variable's training standard deviation (as the model sees them), so one
    tolerance fits every variable.
    """
    recent = (times > now - window) & (times <= now)
    times, values = times[recent], values[recent]
    if len(values) < 2:
        return None
    change = values[np.argmax(times)] - values[np.argmin(times)]
    return RISING if change > VALUE_TOLERANCE else FALLING if change < -VALUE_TOLERANCE else STEADY


def plain_summary(risk: float, trend: str, drivers: list[tuple[str, str | None]]) -> str:
    """'risk 0.72, rising; driven by falling GCS and rising BUN' from the risk, its trend and (variable, direction)."""
    if not np.isfinite(risk):
        return "no observation yet: no risk to report"
    text = f"risk {risk:.2f}, {trend}"
    named = [f"{direction} {name}" if direction else name for name, direction in drivers]
    if not named:
        return text
    listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    return f"{text}; driven by {listed}"
