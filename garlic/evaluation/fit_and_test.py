"""The one path from a split to a tracked result: fit a method on the training part (it selects on the validation
part), predict the validation and test parts (the one look at the test part), score and log, in the active MLflow
run. ``garlic train`` (``garlic.runs``), the comparison table, the baselines, the ablations and the fidelity study
all go through ``fit_and_test``.

A method is what ``garlic.methods.contract.Method`` writes down (``fit`` selecting on validation, ``predict_proba``,
an optional ``log_fitted``): every model of the registry, ``garlic.methods.registry``.

What ``fit_and_test`` logs (names of ``garlic.tracking.run_contract``): the part sizes (``n_train``, ``n_validation``,
``n_test``); the metrics ``test_auroc``, ``test_auprc``, ``test_brier``, ``test_ece``, a temperature fitted on
validation (``temperature``) and the test Brier and ECE after it (``test_brier_scaled``, ``test_ece_scaled``), and
what ``log_fitted`` returns; ``predictions/validation.csv`` and ``predictions/test.csv`` (``stay_id, label, risk``);
the plots ``roc_pr.png``, ``calibration.png`` and ``calibration_scaled.png``.

On a dataset with prediction times (a tasks table: ``garlic.io.tables.TASKS``) the method must answer a risk at each
(``at_prediction_times``), the metrics are over prediction times and the prediction files have a ``time`` column;
on a task scored by the Sepsis Challenge's utility, the alarm threshold is the one that maximises it on validation
(``threshold``) and the test look adds ``test_utility`` and the warning counts of ``garlic.metrics.utility``;
and the alert policy (``garlic.metrics.alert_policy``: its ``alert_*`` settings, the threshold chosen on validation
by the utility of the policy's alarms) with the test look's per-alert scores under it (``test_alert_*``).
"""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd

from garlic.data.batches import IrregularDataset
from garlic.data.splits import Normalisation, Split
from garlic.evaluation.calibration import logits_from_probabilities, scale, temperature_report
from garlic.methods.contract import Method, check_answers_prediction_times
from garlic.metrics import binary_metrics
from garlic.evaluation import alerting
from garlic.metrics.utility import SEPSIS_UTILITY, choose_threshold, stay_lengths, warning_report
from garlic.tracking import plots, run_contract
from garlic.io.tensors import IrregularTensors, PredictionTimes

PARTS = ("train", "validation", "test")
# Every test look's metrics (``log_fitted`` may add its own).
TEST_METRICS = (
    "test_auroc",
    "test_auprc",
    "test_brier",
    "test_ece",
    "test_brier_scaled",
    "test_ece_scaled",
    "temperature",
)


def split_parts(
    tensors: IrregularTensors, split: Split, normalisation: Normalisation | None = None
) -> dict[str, IrregularDataset]:
    """The split's three parts of ``tensors``, normalised with ``normalisation`` (default: the split's own, fitted
    on its training part)."""
    normalisation = split.normalisation if normalisation is None else normalisation
    return {part: IrregularDataset(tensors.subset(split.positions(tensors, part)), normalisation) for part in PARTS}


def fit_and_test(method: Method, parts: dict[str, IrregularDataset]) -> dict[str, float]:
    """Fit ``method`` on ``parts["train"]`` (selecting on ``parts["validation"]``), test it once on ``parts["test"]``,
    and log sizes, metrics, predictions and plots to the active MLflow run; returns the logged metrics."""
    timed = parts["train"].tensors.task is not None
    if timed:
        check_answers_prediction_times(method, type(method).__name__)
    mlflow.log_params({f"n_{part}": len(parts[part]) for part in PARTS})
    method.fit(parts["train"], parts["validation"])
    times = {part: parts[part].prediction_times for part in ("validation", "test")}
    # float64 before anything reads them: the predictions CSV then holds exactly the risks the threshold and the
    # metrics were computed on (a float32 is written in its own shortest digits, which read back as another float64)
    risks = {part: np.asarray(method.predict_proba(parts[part]), dtype=np.float64) for part in ("validation", "test")}
    labels = {part: times[part].label for part in ("validation", "test")}
    predictions = {}
    for part, risk in risks.items():
        stay_ids = parts[part].stay_ids[times[part].stay]
        at = {"time": times[part].time} if timed else {}
        predictions[part] = pd.DataFrame({"stay_id": stay_ids, **at, "label": labels[part], "risk": risk})
        mlflow.log_text(predictions[part].to_csv(index=False), run_contract.predictions(part))
    metrics = test_metrics(labels, risks)
    if times["test"].score == SEPSIS_UTILITY:
        metrics |= warning_metrics(times, risks) | alert_metrics(predictions)
    if hasattr(method, "log_fitted"):
        metrics |= method.log_fitted(parts)
    mlflow.log_metrics(metrics)
    return metrics


def warning_metrics(times: dict[str, PredictionTimes], risks: dict[str, np.ndarray]) -> dict[str, float]:
    """The alarm threshold that maximises the Sepsis Challenge's utility on validation, and the test look's
    utility and warning counts at it (``garlic.metrics.utility.warning_report``)."""
    validation, test = times["validation"], times["test"]
    threshold = choose_threshold(validation.label, risks["validation"], stay_lengths(validation.stay)).threshold
    report = warning_report(test.label, risks["test"] >= threshold, stay_lengths(test.stay))
    return {"threshold": threshold, **{f"test_{key}": value for key, value in report.items()}}


def alert_metrics(predictions: dict[str, pd.DataFrame]) -> dict[str, float]:
    """The alert policy chosen on validation by the utility of its alarms (its settings, ``alert_*``), and the test
    look's per-alert scores under it (``test_alert_*``: ``garlic.metrics.alerts``)."""
    policy = alerting.choose(predictions["validation"]).policy
    scored = alerting.scores(alerting.as_parts(alerting.stay_alerts(policy, predictions["test"])))
    return {
        **{f"alert_{name}": value for name, value in policy.settings().items()},
        **{f"test_alert_{name}": value for name, value in scored.items()},
    }


def test_metrics(labels: dict[str, np.ndarray], risks: dict[str, np.ndarray]) -> dict[str, float]:
    """Test discrimination and calibration, before and after a temperature fitted on validation; logs the ROC/PR
    curves and the reliability diagrams before and after scaling."""
    test = binary_metrics(labels["test"], risks["test"])
    calibration = temperature_report(risks["validation"], labels["validation"], risks["test"], labels["test"])
    scaled = scale(logits_from_probabilities(risks["test"]), calibration["temperature"])
    figures = {
        "roc_pr.png": plots.roc_pr_figure(labels["test"], risks["test"]),
        "calibration.png": plots.reliability_figure(labels["test"], risks["test"]),
        "calibration_scaled.png": plots.reliability_figure(labels["test"], scaled),
    }
    for name, figure in figures.items():
        mlflow.log_figure(figure, run_contract.plot(name))
        plots.plt.close(figure)
    return {
        **{f"test_{key}": value for key, value in test.items()},
        "temperature": calibration["temperature"],
        "test_brier_scaled": calibration["brier_scaled"],
        "test_ece_scaled": calibration["ece_scaled"],
    }
