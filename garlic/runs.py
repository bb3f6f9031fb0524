"""Tracked training runs: dataset -> fixed splits -> fit on train, select on validation, test once -> MLflow.

One MLflow run per training; with several splits, a parent run holds one nested run per split and the
mean +/- std of the test metrics.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mlflow
import numpy as np
import pandas as pd

from garlic import plots
from garlic.checkpoint import TrainedModel
from garlic.config import Config
from garlic.data import IrregularDataset
from garlic.datasets import DEFAULT_DATA_ROOT, ensure_processed
from garlic.explanation_report import log_explanations
from garlic.metrics import binary_metrics
from garlic.splits import Split, load_splits
from garlic.tracking import DEFAULT_STORE, get_run, load_run_model, log_model, use_experiment, use_store
from garlic.train import AlternatingTrainer, EpochRecord, evaluate
from preprocessing.tables import read_manifest
from preprocessing.tensors import IrregularTensors, load_tensors

TEST_METRICS = ("auroc", "auprc", "brier", "ece")


@dataclass
class SplitResult:
    run_id: str
    split: str
    best_epoch: int
    test: dict[str, float]


def _datasets(tensors: IrregularTensors, split: Split) -> dict[str, IrregularDataset]:
    return {
        part: IrregularDataset(tensors.subset(split.positions(tensors, part)), split.normalisation)
        for part in ("train", "validation", "test")
    }


def _log_predictions(name: str, dataset: IrregularDataset, probabilities: np.ndarray) -> None:
    table = pd.DataFrame({"stay_id": dataset.stay_ids, "label": dataset.labels.numpy(), "risk": probabilities})
    mlflow.log_text(table.to_csv(index=False), f"predictions/{name}.csv")


def train_split(
    config: Config,
    tensors: IrregularTensors,
    split: Split,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    planted_graph: list[dict] | None = None,
) -> SplitResult:
    """Train, select and test on one split inside the active MLflow run (``planted_graph``: a known truth)."""
    parts = _datasets(tensors, split)
    mlflow.log_params({"split": split.name, "n_train": len(parts["train"]), "n_validation": len(parts["validation"]),
                       "n_test": len(parts["test"])})  # fmt: skip

    def log_epoch(record: EpochRecord) -> None:
        mlflow.log_metrics({**record.metrics(), "stage_is_prediction": float(record.stage == "prediction")},
                           step=record.epoch)  # fmt: skip
        if on_epoch is not None:
            on_epoch(record)

    trainer = AlternatingTrainer(config, len(tensors.variables), len(tensors.static_features))
    fitted = trainer.fit(parts["train"], parts["validation"], on_epoch=log_epoch)
    validation = evaluate(fitted.model, parts["validation"], config)["probabilities"]
    test = evaluate(fitted.model, parts["test"], config)["probabilities"]  # the one look at the test split
    labels = parts["test"].labels.numpy()
    scores = binary_metrics(labels, test)
    mlflow.log_metrics({f"test_{k}": v for k, v in scores.items()} | {"best_epoch": fitted.best_epoch})
    _log_predictions("validation", parts["validation"], validation)
    _log_predictions("test", parts["test"], test)

    adjacency = fitted.model.graph.adjacency.detach().cpu().numpy()
    graph = pd.DataFrame(adjacency, index=tensors.variables, columns=tensors.variables)
    mlflow.log_text(graph.to_csv(), "graph/adjacency.csv")
    for name, figure in (
        ("roc_pr.png", plots.roc_pr_figure(labels, test)),
        ("calibration.png", plots.reliability_figure(labels, test)),
        ("graph.png", plots.graph_figure(adjacency, tensors.variables)),
    ):
        mlflow.log_figure(figure, f"plots/{name}")
        plots.plt.close(figure)
    trained = TrainedModel(fitted.model, tensors.variables, tensors.static_features, split.normalisation)
    log_model(trained)
    log_explanations(trained, parts["test"], planted=planted_graph)
    return SplitResult(mlflow.active_run().info.run_id, split.name, fitted.best_epoch, scores)


def train(
    config: Config,
    split_indices: list[int] | None = None,
    data_root: Path = DEFAULT_DATA_ROOT,
    store: Path = DEFAULT_STORE,
    on_epoch: Callable[[str, EpochRecord], None] | None = None,
) -> tuple[str, list[SplitResult]]:
    """Train on the chosen splits (default: the first) of the config's dataset; returns the run id and results."""
    folder = ensure_processed(config.dataset, data_root)
    tensors = load_tensors(folder)
    splits = load_splits(folder, tensors, config.split_protocol)
    indices = [0] if split_indices is None else split_indices
    unknown = [k for k in indices if not 0 <= k < len(splits)]
    if unknown:
        raise ValueError(f"protocol {config.split_protocol!r} has splits 0..{len(splits) - 1}; got {unknown}")

    use_store(store)
    use_experiment(config.dataset, store)
    results = []
    with mlflow.start_run(run_name=f"garlic-{config.dataset}") as parent:
        mlflow.log_params(config.to_dict())
        mlflow.log_dict(config.to_dict(), "config.json")
        manifest = read_manifest(folder)
        mlflow.log_dict(manifest, "data_manifest.json")
        mlflow.log_params({"data_folder": str(folder), "n_stays": len(tensors), "n_variables": len(tensors.variables)})
        nested = len(indices) > 1
        for index in indices:
            split = splits[index]
            child = mlflow.start_run(run_name=split.name, nested=True) if nested else contextlib.nullcontext()
            with child:
                if nested:
                    mlflow.log_params(config.to_dict())
                report = (lambda record, name=split.name: on_epoch(name, record)) if on_epoch else None
                results.append(train_split(config, tensors, split, report, manifest.get("ground_truth_graph")))
        if nested:
            for metric in TEST_METRICS:
                values = np.array([r.test[metric] for r in results])
                mlflow.log_metrics({f"test_{metric}_mean": float(values.mean()), f"test_{metric}_std": float(values.std())})
    return parent.info.run_id, results


def evaluate_run(run_id: str, store: Path = DEFAULT_STORE) -> dict:
    """Re-compute a finished split run's test metrics from its logged model and its saved split."""
    trained = load_run_model(run_id, store)
    params = get_run(run_id).data.params
    folder = Path(params["data_folder"])
    tensors = load_tensors(folder)
    protocol, _, index = params["split"].partition("/split_")
    split = load_splits(folder, tensors, protocol)[int(index)]
    test = trained.dataset(tensors.subset(split.positions(tensors, "test")))
    probabilities = evaluate(trained.model, test, trained.config)["probabilities"]
    return {"run": run_id, "split": params["split"], "n_test": len(test),
            **binary_metrics(test.labels.numpy(), probabilities)}  # fmt: skip
