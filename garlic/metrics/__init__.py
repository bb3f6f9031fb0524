"""Evaluation metrics for a binary outcome: discrimination and calibration."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score


def expected_calibration_error(labels: np.ndarray, probabilities: np.ndarray, bins: int = 10) -> float:
    """Sum over equal-width probability bins of (bin share of stays) * |mean label - mean probability|."""
    labels, probabilities = np.asarray(labels, dtype=float), np.asarray(probabilities, dtype=float)
    which = np.minimum((probabilities * bins).astype(int), bins - 1)
    count = np.bincount(which, minlength=bins)
    gap = np.abs(np.bincount(which, labels, bins) - np.bincount(which, probabilities, bins))
    return float(gap.sum() / max(count.sum(), 1))


# What every test look reports (``binary_metrics``' keys, in its order); runs, the run archive and the tables read it.
METRICS = ("auroc", "auprc", "brier", "ece")


def binary_metrics(
    labels: np.ndarray, probabilities: np.ndarray, weights: np.ndarray | None = None
) -> dict[str, float]:
    """AUROC, AUPRC, Brier score and expected calibration error (AUROC/AUPRC are NaN with one class only); with
    ``weights``, AUROC and AUPRC weigh each row by its weight (a row of weight 0 counts for nothing)."""
    labels, probabilities = np.asarray(labels, dtype=float), np.asarray(probabilities, dtype=float)
    both_classes = 0 < labels.sum() < len(labels)
    return {
        "auroc": float(roc_auc_score(labels, probabilities, sample_weight=weights)) if both_classes else float("nan"),
        # scikit-learn's sum of precisions can pass 1 by a rounding (1.0000000000000002 for a perfect ranking)
        "auprc": (
            min(1.0, float(average_precision_score(labels, probabilities, sample_weight=weights)))
            if both_classes
            else float("nan")
        ),
        "brier": float(np.mean((probabilities - labels) ** 2)),
        "ece": expected_calibration_error(labels, probabilities),
    }
