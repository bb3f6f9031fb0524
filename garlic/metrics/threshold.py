"""The alert threshold: the highest risk cut-off that still flags a target share of the positive stays."""

from __future__ import annotations

import math

import numpy as np

DEFAULT_SENSITIVITY = 0.8


def threshold_at_sensitivity(labels: np.ndarray, risk: np.ndarray, sensitivity: float = DEFAULT_SENSITIVITY) -> float:
    """The largest threshold t with sensitivity(risk >= t) >= ``sensitivity`` on these (validation) stays.

    The highest such t flags the fewest negatives, so it is the least noisy alarm that meets the target.
    """
    if not 0 < sensitivity <= 1:
        raise ValueError(f"sensitivity must be in (0, 1], got {sensitivity}")
    positives = np.sort(np.asarray(risk, dtype=float)[np.asarray(labels) == 1])[::-1]
    if len(positives) == 0:
        raise ValueError("no positive stay to set a threshold on")
    flagged = math.ceil(sensitivity * len(positives) - 1e-9)  # the tolerance keeps 0.8 * 10 at 8, not 9
    return float(positives[flagged - 1])
