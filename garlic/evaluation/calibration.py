"""Calibration: temperature scaling fitted on the validation split, and the before/after report on the test split.

Temperature scaling divides every logit by one positive number T, chosen to minimise the validation negative
log-likelihood. It leaves the ranking of stays unchanged (AUROC and AUPRC do not move); only calibration (Brier
score, expected calibration error) can change. The test split is used only to report the result.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit, log_expit

from garlic.metrics import binary_metrics

# exp(+-4): a temperature outside [0.018, 55] means the model is broken, not miscalibrated.
LOG_TEMPERATURE_BOUNDS = (-4.0, 4.0)
PROBABILITY_FLOOR = 1e-7


def logits_from_probabilities(probabilities: np.ndarray) -> np.ndarray:
    """log(p / (1 - p)), with p kept inside [1e-7, 1 - 1e-7] so that a saturated sigmoid gives a finite logit."""
    p = np.clip(np.asarray(probabilities, dtype=float), PROBABILITY_FLOOR, 1 - PROBABILITY_FLOOR)
    return np.log(p) - np.log1p(-p)


def negative_log_likelihood(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy of ``labels`` under ``sigmoid(logits)``, computed stably in log space."""
    logits, labels = np.asarray(logits, dtype=float), np.asarray(labels, dtype=float)
    return float(-np.mean(labels * log_expit(logits) + (1 - labels) * log_expit(-logits)))


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The T > 0 minimising the NLL of ``sigmoid(logits / T)``: a bounded 1-D search over log T (deterministic)."""
    result = minimize_scalar(
        lambda log_t: negative_log_likelihood(np.asarray(logits) / np.exp(log_t), labels),
        bounds=LOG_TEMPERATURE_BOUNDS,
        method="bounded",
        options={"xatol": 1e-6},
    )
    return float(np.exp(result.x))


def scale(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Probabilities after temperature scaling."""
    return expit(np.asarray(logits, dtype=float) / temperature)


def temperature_report(
    validation_probabilities: np.ndarray,
    validation_labels: np.ndarray,
    test_probabilities: np.ndarray,
    test_labels: np.ndarray,
) -> dict[str, float]:
    """Fit T on validation; test Brier and ECE before and after scaling, and T itself.

    Keys: ``temperature``, ``brier``, ``ece`` (before), ``brier_scaled``, ``ece_scaled`` (after).
    """
    temperature = fit_temperature(logits_from_probabilities(validation_probabilities), validation_labels)
    before = binary_metrics(test_labels, test_probabilities)
    after = binary_metrics(test_labels, scale(logits_from_probabilities(test_probabilities), temperature))
    return {
        "temperature": temperature,
        "brier": before["brier"],
        "ece": before["ece"],
        "brier_scaled": after["brier"],
        "ece_scaled": after["ece"],
    }
