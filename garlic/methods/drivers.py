"""What drove a model's risk at each prediction time: a method's variable contributions (``contract.explains_rows``:
gradient boosting's exact tree SHAP values, logistic regression's coefficient x value), or, for GARLIC, the
integrated gradients of its logit at that time, summed per variable (``row_gradients``). The live ward, ``garlic
predict --hourly`` and the faithfulness measurement (``garlic.evaluation.faithfulness``) all read it here.

Why gradients for GARLIC and not its built-in signal importance (``row_signal_importance``, what the dashboard draws
for an hour): at P19's hourly alerts, removing the top half of the variables by the built-in importance lowered
GARLIC's risk less than removing a random half, and the bottom half most; by integrated gradients, top > random >
bottom, as for the boosting and the regression (``docs/results/alert-faithfulness.md``). A ward's drivers must be
what the alarm needs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from garlic.data.batches import Batch, IrregularDataset, collate
from garlic.explain.contributions import top_drivers
from garlic.methods.contract import Method, explains, explains_rows, unexplained_reason

CHUNK_ROWS = 256  # prediction times whose cut records ([rows, steps, variables]) are held at once


def has_row_importance(method: Method) -> bool:
    """Whether ``method`` says here what drove each of its risks (``row_importance``)."""
    if explains_rows(method):
        return True
    return explains(method) and getattr(method.model, "explanation_unavailable", None) is None


def row_importance(method: Method, dataset: IrregularDataset) -> np.ndarray:
    """[M, D] how much each variable drove the risk at each of the dataset's prediction times: the method's
    contributions (gradient boosting, logistic regression), or GARLIC's integrated gradients (``row_gradients``)."""
    if explains_rows(method):
        return method.contributions(dataset)
    if has_row_importance(method):
        return row_gradients(method, dataset)
    name = getattr(method, "name", type(method).__name__)
    raise ValueError(
        f"{name} does not explain its risks" + (f": {unexplained_reason(method)}" if unexplained_reason(method) else "")
    )


def row_signal_importance(method: Method, dataset: IrregularDataset) -> np.ndarray:
    """[M, D] GARLIC's built-in signal importance of the record cut at each prediction time (as the dashboard explains
    an hour): measured beside ``row_gradients``, not the bedside's drivers (the module's docstring)."""
    from garlic.explain.built_in import explain

    variables = list(dataset.tensors.variables)
    return _per_cut_record(dataset, lambda batch: explain(method.model, batch, variables).signal.numpy())


def row_gradients(method: Method, dataset: IrregularDataset) -> np.ndarray:
    """[M, D] a network method's signed integrated gradients at each prediction time, per variable: the
    attribution of the logit of the record cut at that time to each observed cell (its value and observed flag
    together, from the record with nothing observed; ``garlic.explain.integrated_gradients``), summed over the
    cell's variable: GARLIC's drivers (``row_importance``), in log-odds as the contributions of gradient boosting and
    logistic regression are."""
    return _per_cut_record(dataset, lambda batch: gradient_contributions(method.model, batch))


def gradient_contributions(model, batch: Batch) -> np.ndarray:
    """[B, D] each stay's integrated gradients of its logit (``garlic.explain.integrated_gradients``) summed per
    variable: the drivers of ``row_gradients`` for records already batched (the dashboard's hour)."""
    from garlic.explain.integrated_gradients import integrated_gradients

    return integrated_gradients(model, batch).sum(1).numpy()


def _per_cut_record(dataset: IrregularDataset, per_variable: Callable[[Batch], np.ndarray]) -> np.ndarray:
    """[M, D] ``per_variable`` of batches of the records cut at each prediction time, ``CHUNK_ROWS`` at a time."""
    cut = dataset.tensors.cut_at_prediction_times()
    rows = []
    for start in range(0, len(cut), CHUNK_ROWS):
        part = IrregularDataset(cut.subset(np.arange(start, min(start + CHUNK_ROWS, len(cut)))), dataset.normalisation)
        rows.append(per_variable(collate([part[position] for position in range(len(part))])))
    return np.concatenate(rows) if rows else np.zeros((0, len(cut.variables)))


def drivers(method: Method, dataset: IrregularDataset, variables: list[str], top: int) -> list[list[str]]:
    """At each of the dataset's prediction times, the ``top`` of ``variables`` that drove the risk most (a
    contribution: that raised it), highest first."""
    return [top_drivers(row, variables, top) for row in row_importance(method, dataset)]
