"""Explanations as tidy tables, figures and MLflow artifacts, and the learned graph scored against a known one."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterator

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from garlic.data.batches import IrregularDataset, collate  # noqa: E402
from garlic.data.splits import Normalisation  # noqa: E402
from garlic.explain.built_in import Explanation, explain  # noqa: E402
from garlic.models.compact import Garlic  # noqa: E402
from garlic.tracking import plots, run_contract  # noqa: E402


def explain_dataset(model: Garlic, dataset: IrregularDataset, batch_size: int = 256) -> Iterator[tuple]:
    """(positions, batch, explanation) for consecutive batches of ``dataset``, as ``model``'s input, one batch at a
    time: a whole test part's explanations at once would not fit in memory (P19's hourly cohort: gigabytes)."""
    for start in range(0, len(dataset), batch_size):
        positions = np.arange(start, min(start + batch_size, len(dataset)))
        batch = collate([dataset[int(i)] for i in positions])
        yield positions, batch, explain(model, batch, list(dataset.tensors.variables))


def observation_table(
    explanation: Explanation, batch, stay_ids: np.ndarray, normalisation: Normalisation
) -> pd.DataFrame:
    """One row per observed value: stay_id, time (h), variable, value (original units, clipped to the training
    range as the model saw it, un-done with the ``normalisation`` it was normalised with), importance."""
    b, t, d = torch.nonzero(batch.mask > 0, as_tuple=True)
    mean, std = normalisation.value_mean[d.numpy()], normalisation.value_std[d.numpy()]
    return pd.DataFrame(
        {
            "stay_id": stay_ids[b.numpy()],
            "time": batch.times[b, t].numpy(),
            "variable": np.asarray(explanation.variables)[d.numpy()],
            "value": batch.values[b, t, d].numpy() * std + mean,
            "importance": explanation.observation[b, t, d].numpy(),
        }
    )


def signal_table(explanation: Explanation, stay_ids: np.ndarray) -> pd.DataFrame:
    """One row per stay and variable: stay_id, variable, importance."""
    signal = explanation.signal.numpy()
    return pd.DataFrame(
        {
            "stay_id": np.repeat(stay_ids, signal.shape[1]),
            "variable": np.tile(explanation.variables, len(stay_ids)),
            "importance": signal.ravel(),
        }
    )


def edge_table(explanation: Explanation, stay_ids: np.ndarray, top: int = 10) -> pd.DataFrame:
    """Each stay's ``top`` strongest edges: stay_id, source, target, importance."""
    edges = explanation.edges.flatten(1)
    values, index = edges.topk(min(top, edges.shape[1]), dim=1)
    d = len(explanation.variables)
    names = np.asarray(explanation.variables)
    return pd.DataFrame(
        {
            "stay_id": np.repeat(stay_ids, values.shape[1]),
            "source": names[(index // d).numpy().ravel()],
            "target": names[(index % d).numpy().ravel()],
            "importance": values.numpy().ravel(),
        }
    )


def graph_table(graph: np.ndarray, variables: list[str]) -> pd.DataFrame:
    """The summary graph as an edge list: source, target, weight (normalised over sources per target)."""
    source, target = np.meshgrid(np.arange(len(variables)), np.arange(len(variables)), indexing="ij")
    names = np.asarray(variables)
    return pd.DataFrame(
        {"source": names[source.ravel()], "target": names[target.ravel()], "weight": np.asarray(graph).ravel()}
    )


def edge_recovery_auroc(graph: np.ndarray, variables: list[str], planted: list[dict]) -> float:
    """How well the learned weights rank the planted (source -> target) edges above all other pairs (no self-loops)."""
    position = {name: i for i, name in enumerate(variables)}
    truth = np.zeros_like(graph, dtype=bool)
    for edge in planted:
        truth[position[edge["source"]], position[edge["target"]]] = True
    off_diagonal = ~np.eye(len(variables), dtype=bool)
    return float(roc_auc_score(truth[off_diagonal], np.asarray(graph)[off_diagonal]))


def heatmap_figure(explanation: Explanation, batch, row: int, title: str) -> plt.Figure:
    """Time x variable map of one stay's observation importance (observed cells only)."""
    steps = int(batch.lengths[row])
    importance = explanation.observation[row, :steps].numpy().T
    shown = np.where(batch.mask[row, :steps].numpy().T > 0, importance, np.nan)
    figure, axis = plt.subplots(figsize=(10, 0.25 * len(explanation.variables) + 1.5))
    image = axis.imshow(shown, aspect="auto", cmap="magma_r", interpolation="nearest")
    hours = batch.times[row, :steps].numpy()
    ticks = np.linspace(0, steps - 1, min(steps, 8)).astype(int)
    axis.set_xticks(ticks, [f"{hours[i]:.0f}h" for i in ticks])
    axis.set_yticks(range(len(explanation.variables)), explanation.variables, fontsize=7)
    axis.set(title=title, xlabel="time since admission")
    figure.colorbar(image, ax=axis, label="importance")
    figure.tight_layout()
    return figure


def signal_figure(importance: pd.Series, top: int = 20) -> plt.Figure:
    shown = importance.head(top)[::-1]
    figure, axis = plt.subplots(figsize=(5, 0.25 * len(shown) + 1.2))
    axis.barh(shown.index, shown.values, color="tab:blue")
    axis.set(xlabel="mean importance", title="Signal importance")
    figure.tight_layout()
    return figure


def strongest_edges_figure(graph: np.ndarray, variables: list[str], top: int = 15) -> plt.Figure:
    """The ``top`` strongest off-diagonal edges on a circle; line width follows the weight."""
    weights = np.asarray(graph, dtype=float).copy()
    np.fill_diagonal(weights, 0.0)
    order = np.argsort(weights, axis=None)[::-1][:top]
    strongest = weights.ravel()[order].max() or 1.0
    edges = [(*divmod(int(flat), len(variables)), 0.5 + 3 * weights.ravel()[flat] / strongest) for flat in order]
    return plots.edges_figure(variables, edges, f"Strongest {top} learned edges (source -> target)")


def log_explanations(model: Garlic, dataset: IrregularDataset, planted: list[dict] | None = None) -> dict:
    """Explain ``model``'s risk of every stay of ``dataset`` (its input: the training variables, normalised as in
    training) and log tables and figures under ``explanations/`` of the active run; a batch of stays at a time, each
    batch's rows appended to the tables' files as it is explained."""
    stay_ids, variables = dataset.stay_ids, list(dataset.tensors.variables)
    summary, first, totals = {}, None, []
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        writers: dict[str, pq.ParquetWriter] = {}

        def append(name: str, table: pd.DataFrame) -> None:
            rows = pa.Table.from_pandas(table, preserve_index=False)
            writers.setdefault(name, pq.ParquetWriter(folder / f"{name}.parquet", rows.schema)).write_table(rows)

        try:
            for positions, batch, explanation in explain_dataset(model, dataset):
                first = first or (positions, batch, explanation)
                signals = signal_table(explanation, stay_ids[positions])
                totals.append(signals.groupby("variable")["importance"].agg(["sum", "count"]))
                append(
                    "observation_importance",
                    observation_table(explanation, batch, stay_ids[positions], dataset.normalisation),
                )
                append("signal_importance", signals)
                append("edge_importance", edge_table(explanation, stay_ids[positions]))
        finally:
            for writer in writers.values():
                writer.close()
        graph = first[2].graph.numpy()
        summed = pd.concat(totals).groupby(level=0).sum()
        cohort = (summed["sum"] / summed["count"]).rename_axis("variable").sort_values(ascending=False)
        graph_table(graph, variables).to_csv(folder / "summary_graph.csv", index=False)
        cohort.rename("importance").to_csv(folder / "cohort_signal_importance.csv")
        mlflow.log_artifacts(str(folder), run_contract.EXPLANATIONS)
    positions, batch, explanation = first
    figures = {
        "heatmap_first_test_stay.png": heatmap_figure(explanation, batch, 0, f"Stay {stay_ids[positions[0]]}"),
        "signal_importance.png": signal_figure(cohort),
        "strongest_edges.png": strongest_edges_figure(graph, variables),
    }
    for name, figure in figures.items():
        mlflow.log_figure(figure, run_contract.explanation(name))
        plt.close(figure)
    if planted:
        summary["edge_recovery_auroc"] = edge_recovery_auroc(graph, variables, planted)
        mlflow.log_metric("edge_recovery_auroc", summary["edge_recovery_auroc"])
    return summary
