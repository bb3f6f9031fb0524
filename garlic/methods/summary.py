"""Classical baselines, as methods of ``garlic.evaluation.fit_and_test`` (fit / predict_proba): per-stay summary features with
logistic regression and gradient boosting, the admission severity scores of the outcomes file (SAPS-I, SOFA), and
the length of the input alone (``InputHours``: what a protocol's windows give away before any value is read).

Every model is fitted on the training part, its few settings chosen by validation AUROC, and tested once.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from garlic.data.batches import IrregularDataset
from garlic.explain.contributions import SHAP_MISSING, fold, linear_contributions, shap_installed, tree_contributions
from garlic.methods.contract import check_fitted, fitted_inputs
from garlic.methods.model_files import FITTED, ModelFileError, read_fitted
from garlic.io.atomic import atomic_file, write_json_atomic
from garlic.io.tensors import IrregularTensors

STATISTICS = ("first", "last", "min", "max", "mean", "count")
LOGISTIC_C = (0.01, 0.1, 1.0)
BOOSTING_SETTINGS = (
    {"learning_rate": 0.05, "max_iter": 200, "max_leaf_nodes": 15},
    {"learning_rate": 0.1, "max_iter": 100, "max_leaf_nodes": 31},
)
# A fitted model is kept in skops's format (scikit-learn's own objects, no pickle): loading builds only the types
# skops trusts by default and these, which the two model kinds hold; a file naming any other type is refused.
SKOPS_FILE = "model.skops"
SKOPS_TRUSTED = ("numpy.dtype", "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor")


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


def save_skops(path: Path, model) -> None:
    """The scikit-learn ``model`` into ``path`` in skops's format, atomically (``load_skops`` reads it back)."""
    import skops.io  # here, not at the top: importing it costs about a second, which every command would pay

    with atomic_file(path) as out:
        out.write(skops.io.dumps(model))


def load_skops(path: Path):
    """The scikit-learn model in ``path``, refused unless every type it would build is trusted (``SKOPS_TRUSTED``)."""
    import skops.io  # here, not at the top: importing it costs about a second, which every command would pay

    unreadable = (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile)  # a skops file is a zip archive
    try:
        data = Path(path).read_bytes()
        untrusted = set(skops.io.get_untrusted_types(data=data)) - set(SKOPS_TRUSTED)
    except unreadable as exc:
        raise ModelFileError(f"{path}: not a readable skops model ({type(exc).__name__})") from None
    if untrusted:
        raise ModelFileError(f"{path}: names types this project does not load: {', '.join(sorted(untrusted))}")
    try:
        return skops.io.loads(data, trusted=list(SKOPS_TRUSTED))
    except unreadable as exc:
        raise ModelFileError(f"{path}: not a readable skops model ({type(exc).__name__})") from None


def _logistic_candidates(seed: int) -> list[tuple[dict, object]]:
    """Median imputation (with missingness indicators), standardisation, L2 logistic regression, one per C."""

    def pipeline(c: float):
        imputer = SimpleImputer(strategy="median", add_indicator=True, keep_empty_features=True)
        return make_pipeline(imputer, StandardScaler(), LogisticRegression(C=c, max_iter=2000, random_state=seed))

    return [({"C": c}, pipeline(c)) for c in LOGISTIC_C]


def _boosting_candidates(seed: int) -> list[tuple[dict, object]]:
    """Histogram gradient boosting (missing values handled natively), one per setting."""
    return [
        (dict(setting), HistGradientBoostingClassifier(**setting, early_stopping=False, random_state=seed))
        for setting in BOOSTING_SETTINGS
    ]


CANDIDATES = {"logreg": _logistic_candidates, "gbm": _boosting_candidates}


def _fit_weighted(model, features: np.ndarray, targets: np.ndarray, weights: np.ndarray | None) -> None:
    """Fit a candidate, its rows weighted by ``weights`` where given (a pipeline's last step takes them)."""
    if weights is None:
        model.fit(features, targets)
    elif isinstance(model, Pipeline):
        model.fit(features, targets, **{f"{model.steps[-1][0]}__sample_weight": weights})
    else:
        model.fit(features, targets, sample_weight=weights)


class ChosenClassifier(BaseEstimator):
    """A classifier on a feature table of each input (``features``, with ``targets`` its labels): ``kind`` 'logreg'
    (logistic regression) or 'gbm' (gradient boosting). ``fit`` fits every candidate setting (``CANDIDATES``) on the
    training part and keeps the best validation AUROC (the first one on ties). ``SummaryModel`` and
    ``garlic.methods.hourly.HourlyModel`` are its two feature tables.

    A column with no value in the training part (a variable never observed there, such as P19 set A's EtCO2) says
    nothing the model could learn, and scikit-learn's gradient boosting fails on it (``window shape cannot be larger
    than input array shape``): such columns are left out, ``kept_`` marks the others. Saved as the model in skops's
    format and ``kept_`` and the chosen setting in fitted.json.

    It explains each risk by the model's variables (``contributions``, ``garlic.methods.contract``): exact tree SHAP
    values for boosting, coefficient x standardised value for logistic regression (``garlic.explain.contributions``),
    each variable's feature columns summed into it. The static features' columns (and the hour's, for an hourly
    model) are no variable's: they stay out of the drivers, as GARLIC's signals leave out what is not a time
    series."""

    COLUMNS = "feature"  # what the error of a saved ``kept_`` of the wrong length calls the columns
    STATISTICS_PER_VARIABLE = len(STATISTICS)  # the table's first columns: each statistic of every variable in turn

    def features(self, dataset: IrregularDataset) -> np.ndarray:
        raise NotImplementedError

    def targets(self, dataset: IrregularDataset) -> np.ndarray:
        raise NotImplementedError

    def columns(self, inputs: dict) -> int:
        """How many columns ``features`` gives for ``inputs`` (``fitted_inputs``: variables and static features)."""
        raise NotImplementedError

    def sample_weights(self, dataset: IrregularDataset) -> np.ndarray | None:
        """What each row of ``targets`` weighs in fitting and in the validation AUROC (None: all alike)."""
        return None

    def feature_groups(self, inputs: dict) -> np.ndarray:
        """[columns] the index of each feature column's variable in ``inputs["variables"]``, -1 for a column of
        none (a static feature, the hour)."""
        variables = len(inputs["variables"])
        groups = np.full(self.columns(inputs), -1)
        per_variable = self.STATISTICS_PER_VARIABLE * variables
        groups[:per_variable] = np.arange(per_variable) % max(variables, 1)
        return groups

    @property
    def explanation_unavailable(self) -> str | None:
        """Why this model gives no contributions here (None: it gives them): boosting's need the shap package."""
        return SHAP_MISSING if self.kind == "gbm" and not shap_installed() else None

    @property
    def explained_by(self) -> str:
        """How its contributions are computed, as a page says it."""
        return (
            "exact tree SHAP values of the gradient boosting"
            if self.kind == "gbm"
            else "coefficient x standardised value of the logistic regression"
        )

    def column_contributions(self, dataset: IrregularDataset) -> tuple[np.ndarray, float]:
        """[M, kept columns] each kept feature column's contribution to each risk's log-odds, and the base value:
        a row's contributions plus the base are its raw log-odds (``garlic.explain.contributions``)."""
        check_fitted(self)
        if self.explanation_unavailable is not None:
            raise RuntimeError(self.explanation_unavailable)
        features = self.features(dataset)[:, self.kept_]
        if self.kind == "gbm":
            return tree_contributions(self.model_, features)
        return linear_contributions(self.model_, features)

    def contributions(self, dataset: IrregularDataset) -> np.ndarray:
        """[M, D] each variable's contribution to each risk's log-odds: its feature columns' summed."""
        columns, _ = self.column_contributions(dataset)
        groups = self.feature_groups(self.inputs_)[self.kept_]
        return fold(columns, groups, len(self.inputs_["variables"]))

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "ChosenClassifier":
        features = self.features(train)
        self.inputs_ = fitted_inputs(train)
        self.kept_ = ~np.isnan(features).all(axis=0)
        features, held_out = features[:, self.kept_], self.features(validation)[:, self.kept_]
        weights, held_out_weights = self.sample_weights(train), self.sample_weights(validation)
        best_score = -np.inf
        for setting, model in CANDIDATES[self.kind](self.seed):
            _fit_weighted(model, features, self.targets(train), weights)
            score = roc_auc_score(
                self.targets(validation), model.predict_proba(held_out)[:, 1], sample_weight=held_out_weights
            )
            if score > best_score:
                self.model_, self.chosen_, best_score = model, setting | {"validation_auroc": score}, score
        return self

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return self.model_.predict_proba(self.features(dataset)[:, self.kept_])[:, 1]

    def save_fitted(self, folder: Path) -> None:
        check_fitted(self)
        save_skops(folder / SKOPS_FILE, self.model_)
        write_json_atomic(
            folder / FITTED, {"method": self.name, **self.inputs_, "kept": self.kept_.tolist(), "chosen": self.chosen_}
        )

    def restore_fitted(self, folder: Path) -> None:
        fitted = read_fitted(folder)
        self.model_ = load_skops(folder / SKOPS_FILE)
        self.inputs_ = {key: fitted[key] for key in ("variables", "static_features")}
        self.kept_, self.chosen_ = np.asarray(fitted["kept"], dtype=bool), fitted["chosen"]
        # 'kept' marks which feature columns of the inputs the model reads: one of another length scores nothing
        columns = self.columns(self.inputs_)
        if len(self.kept_) != columns or self.kept_.sum() != self.model_.n_features_in_:
            raise ModelFileError(
                f"{folder / FITTED}: 'kept' marks {self.kept_.sum()} of {len(self.kept_)} columns, "
                f"but the model reads {self.model_.n_features_in_} of the {columns} {self.COLUMNS} "
                "columns of its inputs"
            )

    def log_fitted(self, parts: dict[str, IrregularDataset]) -> dict[str, float]:
        check_fitted(self)
        mlflow.log_params({f"chosen_{key}": value for key, value in self.chosen_.items()})
        mlflow.log_param("chosen_empty_columns", int((~self.kept_).sum()))
        return {}


class SummaryModel(ChosenClassifier):
    """A ``ChosenClassifier`` on per-stay summaries (``summary_features``; with ``with_static``, the static features
    beside them)."""

    COLUMNS = "summary"

    def __init__(self, kind: str, with_static: bool = False, seed: int = 0):
        if kind not in CANDIDATES:
            raise ValueError(f"kind must be one of {', '.join(CANDIDATES)}, got {kind!r}")
        self.kind, self.with_static, self.seed = kind, with_static, seed

    @property
    def name(self) -> str:
        """As the registry names it."""
        return f"{self.kind}_static" if self.with_static else self.kind

    def features(self, dataset: IrregularDataset) -> np.ndarray:
        tensors = dataset.tensors
        features, _ = summary_features(tensors)
        return np.concatenate([features, tensors.static.astype("float64")], axis=1) if self.with_static else features

    def targets(self, dataset: IrregularDataset) -> np.ndarray:
        return dataset.labels.numpy()

    def columns(self, inputs: dict) -> int:
        return len(STATISTICS) * len(inputs["variables"]) + (len(inputs["static_features"]) if self.with_static else 0)


class SeverityScore(BaseEstimator):
    """A severity score (``scores``: by stay id) turned into a risk by a one-variable logistic regression fitted on
    the training part (``seed``: its random state, which its solver does not draw on).

    The mapping is monotone, so AUROC and AUPRC are the raw score's; it only makes Brier and ECE meaningful.
    Unknown scores (NaN, or negative: the outcomes file writes -1) take the training median.
    """

    def __init__(self, scores: pd.Series, seed: int = 0):
        self.scores, self.seed = scores, seed

    def known(self, dataset: IrregularDataset) -> np.ndarray:
        score = self.scores.reindex(dataset.stay_ids).to_numpy(float)
        return np.where(np.isfinite(score) & (score >= 0), score, np.nan)

    def _filled(self, dataset: IrregularDataset) -> np.ndarray:
        score = self.known(dataset)
        return np.where(np.isnan(score), self.median_, score)[:, None]

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "SeverityScore":
        self.median_ = float(np.nanmedian(self.known(train)))
        self.model_ = LogisticRegression(C=1e6, max_iter=1000, random_state=self.seed)
        self.model_.fit(self._filled(train), train.labels.numpy())
        return self

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return self.model_.predict_proba(self._filled(dataset))[:, 1]

    def log_fitted(self, parts: dict[str, IrregularDataset]) -> dict[str, float]:
        check_fitted(self)
        unknown = int(np.isnan(self.known(parts["test"])).sum())
        mlflow.log_params({"chosen_train_median": self.median_, "chosen_test_unknown": unknown})
        return {}


class InputHours(BaseEstimator):
    """Logistic regression on one number: the hours of input a stay shows the model (the time of its last step).

    Not a model to use but a check of a protocol: where the window's length depends on the label (P19 ``raindrop``
    cuts a septic stay before its onset and keeps a negative one whole), this alone scores above chance; where every
    stay has the same window (P12's 48 hours) it should score about 0.5.
    """

    def __init__(self, seed: int = 0):
        self.seed = seed

    @staticmethod
    def hours(dataset: IrregularDataset) -> np.ndarray:
        """[N, 1] the time of each stay's last step, in hours (0 for a stay without one)."""
        tensors = dataset.tensors
        last = np.maximum(tensors.lengths - 1, 0)
        hours = np.take_along_axis(tensors.times, last[:, None], axis=1)
        return np.where(tensors.lengths[:, None] > 0, hours, 0.0).astype("float64")

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "InputHours":
        self.model_ = make_pipeline(StandardScaler(), LogisticRegression(random_state=self.seed))
        self.model_.fit(self.hours(train), train.labels.numpy())
        return self

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return self.model_.predict_proba(self.hours(dataset))[:, 1]
