"""What a method is: any object used as scikit-learn estimators and PyPOTS models are, so that the one evaluation
path (``garlic.evaluation.fit_and_test``) fits, selects and tests every model of the registry the same way:

    fit(train: IrregularDataset, validation: IrregularDataset) -> the method     selection on validation only
    predict_proba(dataset: IrregularDataset) -> np.ndarray [N]                  risk per stay, in dataset order
    at_prediction_times = True                                                  optional: predict_proba gives a risk
                                                                                at each of the dataset's prediction
                                                                                times ([M]: dataset.prediction_times)
                                                                                and the method trains on them
    learns_score = "sepsis-utility"                                             optional: it learns what a task's
                                                                                score rewards (its prediction
                                                                                times' ``score``), so it runs only
                                                                                on tasks scored so
    log_fitted(parts: dict[str, IrregularDataset]) -> dict[str, float]          optional: log what the fitted
                                                                                method shows beyond its risks
                                                                                (settings chosen, graph, model),
                                                                                return its metrics
    set_training_hooks(on_epoch, on_state, resume) -> None                      optional: the method resumes; it
                                                                                reports each epoch, hands out the
                                                                                state of its fit after each and
                                                                                within long ones, and continues
                                                                                from such a state
    save_fitted(folder: Path) -> None                                           optional, both or neither: write
    restore_fitted(folder: Path) -> None                                        what was fitted into a folder
                                                                                (tensors loaded weights-only, JSON,
                                                                                scikit-learn models in skops's
                                                                                format; never pickle), and read it
                                                                                back into a method built with the
                                                                                same settings
    explains = True, model -> torch.nn.Module                                   optional: the method explains its
                                                                                risks; ``model`` is its fitted
                                                                                GARLIC network, which
                                                                                ``garlic.explain`` and the
                                                                                dashboard read
    contributions(dataset) -> np.ndarray [M, D]                                 optional: the method explains each
    explanation_unavailable -> str | None                                       risk by its variables: each one's
                                                                                additive share of the risk's
                                                                                log-odds (gradient boosting's
                                                                                exact tree SHAP values, logistic
                                                                                regression's coefficient x value);
                                                                                ``explanation_unavailable`` says
                                                                                why it cannot here (a package
                                                                                missing), None when it can;
                                                                                ``explained_by`` (optional) says
                                                                                how, as a page shows it

The live ward, ``garlic predict`` and the dashboard ask a method for its drivers by these capabilities
(``explains``, ``explains_rows``), never by its class: the top variables of an alert that raised its risk.

A method that can be saved (``can_be_saved``) is saved with its run by ``garlic train --method``
(``garlic.methods.saved``), as GARLIC is, so that ``garlic predict`` and the dashboard use any of them alike. Its
``fitted.json`` records its ``name`` and the inputs it was fitted on (``fitted_inputs``), which reading the folder
back checks against the folder's description: a variable order edited there would read every value into another
variable's column, and a method renamed there would read what another method fitted.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from garlic.data.batches import IrregularDataset


class Method(Protocol):
    """scikit-learn's conventions: the constructor's arguments are the method's settings, each kept as an attribute of
    the same name (``sklearn.base.BaseEstimator`` makes ``get_params`` of them; ``garlic.methods.registry`` reads its
    settings from the constructor), ``fit`` returns the method, what it learns goes in attributes ending in ``_``, and
    using it before ``fit`` raises ``NotFittedError`` (``check_fitted``). ``garlic/methods/template.py`` is one to
    copy; ``tests/test_method_conformance.py`` holds every registered method to this."""

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "Method": ...

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray: ...


def check_fitted(method: Method) -> None:
    """Raise scikit-learn's ``NotFittedError`` unless ``method`` holds a fitted attribute (a name ending in ``_``).
    scikit-learn's own ``check_is_fitted`` asks for its estimator tags, which these methods do not carry."""
    if not any(name.endswith("_") and not name.startswith("__") for name in vars(method)):
        # Here, not above: importing scikit-learn takes seconds that a saved GARLIC scoring one stay never needs.
        from sklearn.exceptions import NotFittedError

        raise NotFittedError(f"This {type(method).__name__} instance is not fitted yet: call fit first")


def answers_prediction_times(method: Method) -> bool:
    """Whether ``method`` gives a risk at every prediction time of a dataset with a tasks table (an hourly task)."""
    return getattr(method, "at_prediction_times", False)


def check_answers_prediction_times(method: Method, name: str) -> None:
    """Refuse ``method`` (called ``name`` in the message) for a task of prediction times unless it answers them."""
    if not answers_prediction_times(method):
        raise ValueError(
            f"{name} gives one risk per stay, but this dataset asks for a risk at each of its prediction "
            "times; use a method that answers them (hourly_gbm, hourly_logreg, alarm_after_hour, "
            "GARLIC's compact architecture)"
        )


def check_learns_score(method: Method, score: str, name: str) -> None:
    """Refuse ``method`` (called ``name``) on a task scored by ``score`` ("" for its labels alone) unless it learns
    no score, or that one."""
    learned = getattr(method, "learns_score", None)
    if learned and learned != score:
        raise ValueError(
            f"{name} learns the {learned} score, but this dataset's task is scored by {score or 'its labels alone'}"
        )


def can_resume(method: Method) -> bool:
    """Whether ``method`` continues a killed fit from its last training state (``set_training_hooks``)."""
    return hasattr(method, "set_training_hooks")


def fitted_inputs(dataset: IrregularDataset) -> dict[str, list[str]]:
    """The inputs a method is fitted on, in their order: the variables and the static features."""
    tensors = dataset.tensors
    return {"variables": list(tensors.variables), "static_features": list(tensors.static_features)}


def can_be_saved(method: Method) -> bool:
    """Whether ``method`` writes what it fitted to a folder and reads it back (``save_fitted``/``restore_fitted``)."""
    return hasattr(method, "save_fitted") and hasattr(method, "restore_fitted")


def explains(method: Method) -> bool:
    """Whether ``method`` explains its risks through its fitted network (``model``): GARLIC's built-in explanations,
    or integrated gradients where its architecture has none."""
    return getattr(method, "explains", False)


def explains_rows(method: Method) -> bool:
    """Whether ``method`` explains each of its risks by its variables here (``contributions``): it has them and
    nothing it needs is missing (``explanation_unavailable`` is None)."""
    return hasattr(method, "contributions") and getattr(method, "explanation_unavailable", None) is None


def unexplained_reason(method: Method) -> str | None:
    """Why ``method``, which could explain its risks by its variables, does not here (None otherwise): what a
    command or page says once, in place of drivers."""
    return getattr(method, "explanation_unavailable", None) if hasattr(method, "contributions") else None
