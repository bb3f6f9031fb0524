"""What drove a model's risk at each prediction time, by the model's own explanation, whichever it is: a method's
variable contributions (``contract.explains_rows``: gradient boosting's exact tree SHAP values, logistic
regression's coefficient x value), or GARLIC's built-in signal importance of the record cut at that time (as the
dashboard explains an hour). The live ward, ``garlic predict --hourly`` and the faithfulness measurement
(``garlic.evaluation.faithfulness``) all read it here.
"""

from __future__ import annotations

import numpy as np

from garlic.data.batches import IrregularDataset, collate
from garlic.explain.contributions import top_drivers
from garlic.methods.contract import Method, explains, explains_rows, unexplained_reason

CHUNK_ROWS = 256  # prediction times whose cut records ([rows, steps, variables]) are held at once


def has_row_importance(method: Method) -> bool:
    """Whether ``method`` says here what drove each of its risks (``row_importance``)."""
    if explains_rows(method):
        return True
    return explains(method) and getattr(method.model, "explanation_unavailable", None) is None


def row_importance(method: Method, dataset: IrregularDataset) -> np.ndarray:
    """[M, D] how much each variable drove the risk at each of the dataset's prediction times, by the method's own
    explanation: its contributions (gradient boosting, logistic regression), or GARLIC's built-in signal importance
    of the record cut at that time (as the dashboard explains an hour)."""
    if explains_rows(method):
        return method.contributions(dataset)
    if has_row_importance(method):
        from garlic.explain.built_in import explain

        cut = dataset.tensors.cut_at_prediction_times()
        importance = []
        for start in range(0, len(cut), CHUNK_ROWS):
            part = IrregularDataset(
                cut.subset(np.arange(start, min(start + CHUNK_ROWS, len(cut)))), dataset.normalisation
            )
            batch = collate([part[position] for position in range(len(part))])
            importance.append(explain(method.model, batch, list(cut.variables)).signal.numpy())
        return np.concatenate(importance) if importance else np.zeros((0, len(cut.variables)))
    name = getattr(method, "name", type(method).__name__)
    raise ValueError(
        f"{name} does not explain its risks" + (f": {unexplained_reason(method)}" if unexplained_reason(method) else "")
    )


def row_gradients(method: Method, dataset: IrregularDataset) -> np.ndarray:
    """[M, D] a network method's signed integrated gradients at each prediction time, per variable: the
    attribution of the logit of the record cut at that time to each observed cell (its value and observed flag
    together, from the record with nothing observed; ``garlic.explain.integrated_gradients``), summed over the
    cell's variable. A gradient's drivers, beside a network's own (``row_importance``); in log-odds, as the
    contributions of gradient boosting and logistic regression are."""
    from garlic.explain.integrated_gradients import integrated_gradients

    cut = dataset.tensors.cut_at_prediction_times()
    attributions = []
    for start in range(0, len(cut), CHUNK_ROWS):
        part = IrregularDataset(cut.subset(np.arange(start, min(start + CHUNK_ROWS, len(cut)))), dataset.normalisation)
        batch = collate([part[position] for position in range(len(part))])
        attributions.append(integrated_gradients(method.model, batch).sum(1).numpy())
    return np.concatenate(attributions) if attributions else np.zeros((0, len(cut.variables)))


def drivers(method: Method, dataset: IrregularDataset, variables: list[str], top: int) -> list[list[str]]:
    """At each of the dataset's prediction times, the ``top`` of ``variables`` that drove the risk most (a
    contribution: that raised it), highest first."""
    return [top_drivers(row, variables, top) for row in row_importance(method, dataset)]
