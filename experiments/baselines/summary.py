"""Classical baselines: per-stay summary features with logistic regression and gradient boosting, and the
admission severity scores of the outcomes file (SAPS-I, SOFA).

Every model is fitted on the training part, its few settings chosen by validation AUROC, and tested once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from preprocessing.tensors import IrregularTensors

STATISTICS = ("first", "last", "min", "max", "mean", "count")
LOGISTIC_C = (0.01, 0.1, 1.0)
BOOSTING_SETTINGS = (
    {"learning_rate": 0.05, "max_iter": 200, "max_leaf_nodes": 15},
    {"learning_rate": 0.1, "max_iter": 100, "max_leaf_nodes": 31},
)


def summary_features(tensors: IrregularTensors) -> tuple[np.ndarray, list[str]]:
    """[N, 6 D] first, last, min, max, mean and count of each variable's observed values (NaN where never observed)."""
    mask, values = tensors.mask, tensors.values
    steps = mask.shape[1]
    count = mask.sum(axis=1)
    first_step = mask.argmax(axis=1)  # argmax finds the first True
    last_step = steps - 1 - mask[:, ::-1].argmax(axis=1)
    first = np.take_along_axis(values, first_step[:, None, :], axis=1)[:, 0]
    last = np.take_along_axis(values, last_step[:, None, :], axis=1)[:, 0]
    low = np.where(mask, values, np.inf).min(axis=1)
    high = np.where(mask, values, -np.inf).max(axis=1)
    mean = np.where(mask, values, 0.0).sum(axis=1) / np.maximum(count, 1)
    never = count == 0
    columns = [np.where(never, np.nan, statistic) for statistic in (first, last, low, high, mean)]
    features = np.concatenate([*columns, count.astype("float64")], axis=1)
    names = [f"{variable}_{statistic}" for statistic in STATISTICS for variable in tensors.variables]
    return features, names


@dataclass
class Fitted:
    """A fitted classifier's validation and test risks and the setting validation chose."""

    probabilities: dict[str, np.ndarray]
    chosen: dict


def _select(candidates, features: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> Fitted:
    """Fit every (setting, model) candidate on train; keep the best validation AUROC (first one on ties)."""
    best, best_score = None, -np.inf
    for setting, model in candidates:
        model.fit(features["train"], labels["train"])
        score = roc_auc_score(labels["validation"], model.predict_proba(features["validation"])[:, 1])
        if score > best_score:
            best, best_score = (setting, model), score
    setting, model = best
    return Fitted({part: model.predict_proba(features[part])[:, 1] for part in ("validation", "test")},
                  setting | {"validation_auroc": best_score})  # fmt: skip


def logistic_regression(features: dict[str, np.ndarray], labels: dict[str, np.ndarray], seed: int = 0) -> Fitted:
    """Median imputation (with missingness indicators), standardisation, L2 logistic regression; C by validation."""
    def pipeline(c: float):
        imputer = SimpleImputer(strategy="median", add_indicator=True, keep_empty_features=True)
        return make_pipeline(imputer, StandardScaler(), LogisticRegression(C=c, max_iter=2000, random_state=seed))

    candidates = [({"C": c}, pipeline(c)) for c in LOGISTIC_C]
    return _select(candidates, features, labels)


def gradient_boosting(features: dict[str, np.ndarray], labels: dict[str, np.ndarray], seed: int = 0) -> Fitted:
    """Histogram gradient boosting (missing values handled natively); the setting by validation."""
    candidates = [(dict(setting), HistGradientBoostingClassifier(**setting, early_stopping=False, random_state=seed))
                  for setting in BOOSTING_SETTINGS]  # fmt: skip
    return _select(candidates, features, labels)


def severity_score(scores: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> Fitted:
    """A severity score turned into a risk by a one-variable logistic regression fitted on the training part.

    The mapping is monotone, so AUROC and AUPRC are the raw score's; it only makes Brier and ECE meaningful.
    Unknown scores (NaN, or negative: the outcomes file writes -1) take the training median.
    """
    known = {part: np.where(np.isfinite(s) & (s >= 0), s, np.nan) for part, s in scores.items()}
    median = float(np.nanmedian(known["train"]))
    filled = {part: np.where(np.isnan(s), median, s)[:, None] for part, s in known.items()}
    model = LogisticRegression(C=1e6, max_iter=1000).fit(filled["train"], labels["train"])
    unknown = int(np.isnan(known["test"]).sum())
    return Fitted({part: model.predict_proba(filled[part])[:, 1] for part in ("validation", "test")},
                  {"train_median": median, "test_unknown": unknown})  # fmt: skip
