"""Each input's additive share of a scikit-learn model's risk: the explanation of the baselines on feature tables
(``garlic.methods.summary.ChosenClassifier``: gradient boosting and logistic regression, per stay or at every hour).

A contribution is in log-odds, and a row's contributions plus the model's base value sum to its raw log-odds
exactly, so that "HR raised the risk most" is a statement about this model's own output, not about a surrogate:

- gradient boosting (scikit-learn's ``HistGradientBoostingClassifier``): exact tree SHAP values (Lundberg et al.,
  2020) from the ``shap`` package's ``TreeExplainer`` on the fitted model itself. scikit-learn gives no
  contributions of its own, and refitting in a library that does (LightGBM) would change the models whose numbers
  are published; TreeSHAP reads the fitted trees as they are. ``shap`` is the optional extra ``explain`` (it
  brings numba): without it a boosting model explains nothing and says so (``SHAP_MISSING``), it never fails.
- logistic regression (median imputation with missingness indicators, standardisation, the linear model):
  coefficient x standardised value, each column's term of the linear score, measured from the training mean. A
  missingness indicator's term is given to the column it marks, so "Lactate not measured" counts for Lactate.

``fold`` sums a table's columns into the model's variables (``HR_last``, ``HR_mean_6h`` ... into ``HR``): a
driver is named as GARLIC names its signals, so that the ward reads "HR, Temp, Lactate" whatever model it runs.
"""

from __future__ import annotations

import importlib.util

import numpy as np

SHAP_MISSING = (
    "gradient boosting's drivers need the shap package, not installed here: "
    "pip install -e '.[explain]' (or bin/setup explain)"
)


def shap_installed() -> bool:
    return importlib.util.find_spec("shap") is not None


def tree_contributions(model, features: np.ndarray) -> tuple[np.ndarray, float]:
    """[M, K] exact tree SHAP values in log-odds of a fitted ``HistGradientBoostingClassifier`` on ``features``
    [M, K], and its base value (the expected raw score over its training data's tree paths)."""
    import shap  # here, not at the top: it loads numba, seconds that a command without a boosting model never needs

    explainer = shap.TreeExplainer(model)
    values = explainer.shap_values(np.asarray(features, dtype="float64"), check_additivity=False)
    base = np.ravel(explainer.expected_value)[0]
    return np.asarray(values, dtype="float64").reshape(len(features), -1), float(base)


def linear_contributions(pipeline, features: np.ndarray) -> tuple[np.ndarray, float]:
    """[M, K] coefficient x standardised value of a fitted imputer -> scaler -> logistic regression pipeline on
    ``features`` [M, K], each missingness indicator's term added to the column it marks; and the intercept."""
    imputer, linear = pipeline[0], pipeline[-1]
    terms = pipeline[:-1].transform(features) * linear.coef_[0]  # [M, K + indicators]
    columns = features.shape[1]
    contributions = terms[:, :columns].copy()
    indicator = getattr(imputer, "indicator_", None)
    if indicator is not None:
        np.add.at(contributions.T, indicator.features_, terms[:, columns:].T)
    return contributions, float(linear.intercept_[0])


def fold(contributions: np.ndarray, groups: np.ndarray, count: int) -> np.ndarray:
    """[M, count] the columns' ``contributions`` [M, K] summed by ``groups`` [K] (the index of each column's
    variable, -1 for a column of none: it is left out)."""
    folded = np.zeros((len(contributions), count + 1))
    np.add.at(folded.T, np.where(groups >= 0, groups, count), contributions.T)
    return folded[:, :count]


def top_drivers(contributions: np.ndarray, names: list[str], top: int) -> list[str]:
    """The ``top`` names of one row's ``contributions`` [D] that raised its risk (above zero), highest first."""
    order = np.argsort(-np.asarray(contributions), kind="stable")[:top]
    return [str(names[i]) for i in order if contributions[i] > 0]
