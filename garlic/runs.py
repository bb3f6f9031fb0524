"""Tracked training runs: dataset -> fixed splits -> fit on train, select on validation, test once -> MLflow.

One MLflow run per training; with several splits or model seeds (a whole protocol, ``garlic.splits.PROTOCOLS``),
a parent run holds one nested run per split and seed, and the mean +/- std of their test metrics. What a run
records about its data is ``garlic.run_contract``'s.

After every epoch the state of the fit is saved to ``STORE/checkpoints/SPLIT_RUN_ID/training.pt`` (atomically;
deleted once the split run has finished), so that ``resume`` continues a killed run in the same MLflow run and ends
as the uninterrupted run would have. Under ``torchrun`` every rank fits; only rank 0 logs and writes checkpoints.
"""
from __future__ import annotations

import shutil
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mlflow
import numpy as np
import pandas as pd

from garlic import distributed, plots, run_contract
from garlic.checkpoint import TrainedModel
from garlic.config import Config
from garlic.data import IrregularDataset
from garlic.datasets import DEFAULT_DATA_ROOT, ensure_processed
from garlic.explanation_report import log_explanations
from garlic.metrics import binary_metrics
from garlic.reference_model import EXPLANATION_UNSUPPORTED
from garlic.splits import Split, load_splits
from garlic.tracking import (
    DEFAULT_STORE,
    claim_run,
    get_run,
    load_run_model,
    log_model,
    use_experiment,
    use_store,
    was_claimed,
)
from garlic.train import (
    EpochRecord,
    FitResult,
    load_training_state,
    make_trainer,
    predict_proba,
    save_training_state,
)
from preprocessing.tables import read_manifest
from preprocessing.tensors import IrregularTensors, load_tensors

TEST_METRICS = ("auroc", "auprc", "brier", "ece")
CHECKPOINT = "training.pt"


@dataclass
class SplitResult:
    run_id: str
    split: str  # the run's name: the split's, with ``/seed_<s>`` where a protocol trains several seeds
    best_epoch: int
    test: dict[str, float]


def _datasets(tensors: IrregularTensors, split: Split) -> dict[str, IrregularDataset]:
    return {
        part: IrregularDataset(tensors.subset(split.positions(tensors, part)), split.normalisation)
        for part in ("train", "validation", "test")
    }


def _log_predictions(name: str, dataset: IrregularDataset, probabilities: np.ndarray) -> None:
    table = pd.DataFrame({"stay_id": dataset.stay_ids, "label": dataset.labels.numpy(), "risk": probabilities})
    mlflow.log_text(table.to_csv(index=False), run_contract.predictions(name))


def checkpoint_path(store: Path, run_id: str) -> Path:
    return Path(store) / "checkpoints" / run_id / CHECKPOINT


def fit_split(
    config: Config,
    tensors: IrregularTensors,
    parts: dict[str, IrregularDataset],
    resume: dict | None,
    checkpoint: Path | None = None,
    on_epoch: Callable[[EpochRecord], None] | None = None,
) -> FitResult:
    """Fit on one split (every rank does), from the saved state ``resume`` or afresh, saving to ``checkpoint``."""
    trainer = make_trainer(config, len(tensors.variables), len(tensors.static_features))

    def save(state: dict) -> None:  # called on every rank: gathering the state takes them all
        if checkpoint is not None:
            save_training_state(checkpoint, state)

    return trainer.fit(parts["train"], parts["validation"], on_epoch=on_epoch, on_checkpoint=save, resume=resume)


def train_split(
    config: Config,
    tensors: IrregularTensors,
    split: Split,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    planted_graph: list[dict] | None = None,
    checkpoint: Path | None = None,
    data_record: dict[str, str] | None = None,
) -> SplitResult:
    """Train, select and test on one split inside the active MLflow run (``planted_graph``: a known truth).

    With ``checkpoint``, the fit's state is saved there after every epoch, and a state found there is continued.
    ``data_record`` (``run_contract.split_params``) ties the run to the stays it used.
    """
    parts = _datasets(tensors, split)
    resume = load_training_state(checkpoint) if checkpoint is not None and checkpoint.is_file() else None
    distributed.broadcast_state({"resume": resume})
    if resume is None:
        mlflow.log_params({**(data_record or {run_contract.SPLIT: split.name}), "n_train": len(parts["train"]),
                           "n_validation": len(parts["validation"]), "n_test": len(parts["test"])})  # fmt: skip

    def log_epoch(record: EpochRecord) -> None:
        mlflow.log_metrics({**record.metrics(), "stage_is_prediction": float(record.stage == "prediction")},
                           step=record.epoch)  # fmt: skip
        if on_epoch is not None:
            on_epoch(record)

    fitted = fit_split(config, tensors, parts, resume, checkpoint, log_epoch)
    validation = predict_proba(fitted.model, parts["validation"])
    test = predict_proba(fitted.model, parts["test"])  # the one look at the test split
    labels = parts["test"].labels.numpy()
    scores = binary_metrics(labels, test)
    mlflow.log_metrics({f"test_{k}": v for k, v in scores.items()} | {"best_epoch": fitted.best_epoch})
    _log_predictions("validation", parts["validation"], validation)
    _log_predictions("test", parts["test"], test)

    adjacency = fitted.model.graph.adjacency.detach().cpu().numpy()
    graph = pd.DataFrame(adjacency, index=tensors.variables, columns=tensors.variables)
    mlflow.log_text(graph.to_csv(), run_contract.GRAPH)
    for name, figure in (
        ("roc_pr.png", plots.roc_pr_figure(labels, test)),
        ("calibration.png", plots.reliability_figure(labels, test)),
        ("graph.png", plots.graph_figure(adjacency, tensors.variables)),
    ):
        mlflow.log_figure(figure, run_contract.plot(name))
        plots.plt.close(figure)
    trained = TrainedModel(fitted.model, tensors.variables, tensors.static_features, split.normalisation)
    log_model(trained)
    if config.architecture == "compact":
        log_explanations(trained, parts["test"], planted=planted_graph)
    else:  # the run and its model are kept; what the explanation cannot say is said instead
        mlflow.set_tag("explanations", EXPLANATION_UNSUPPORTED)
    if checkpoint is not None:
        shutil.rmtree(checkpoint.parent, ignore_errors=True)
    return SplitResult(mlflow.active_run().info.run_id, mlflow.active_run().info.run_name, fitted.best_epoch, scores)


def train(
    config: Config,
    split_indices: list[int] | None = None,
    data_root: Path = DEFAULT_DATA_ROOT,
    store: Path = DEFAULT_STORE,
    on_epoch: Callable[[str, EpochRecord], None] | None = None,
    resume_run: str | None = None,
    seeds: list[int] | None = None,
) -> tuple[str | None, list[SplitResult]]:
    """Train on the chosen splits (default: the first) of the config's dataset, each with every one of ``seeds``
    (default: the config's seed); returns the run id and results.

    ``resume_run`` continues that run (see ``resume``). Inside ``distributed.process_group`` (``garlic train``
    under ``torchrun``), ranks other than 0 help fit and return ``(None, [])``.
    """
    with distributed.main_first():  # rank 0 builds the caches (tensors, splits) that the others then read
        folder = ensure_processed(config.dataset, data_root)
        tensors = load_tensors(folder)
        splits = load_splits(folder, tensors, config.split_protocol)
    indices = [0] if split_indices is None else split_indices
    unknown = [k for k in indices if not 0 <= k < len(splits)]
    if unknown:
        raise ValueError(f"protocol {config.split_protocol!r} has splits 0..{len(splits) - 1}; got {unknown}")
    seeds = seeds or [config.seed]
    if len(seeds) == 1:
        config = config.override({"seed": seeds[0]})
    units = [(splits[k], config.override({"seed": seed})) for k in indices for seed in seeds]
    if not distributed.is_main():
        for split, unit_config in units:
            _help_fit(unit_config, tensors, split)
        return None, []
    return _tracked_train(config, tensors, units, seeds, folder, store, on_epoch, resume_run)


def _help_fit(config: Config, tensors: IrregularTensors, split: Split) -> None:
    """A rank other than 0: fit beside rank 0, from the state it sends, unless it says the split is done."""
    plan = distributed.broadcast_state(None)
    if not plan.get("finished"):
        fit_split(config, tensors, _datasets(tensors, split), plan["resume"])


def _tracked_train(
    config: Config,
    tensors: IrregularTensors,
    units: list[tuple[Split, Config]],
    seeds: list[int],
    folder: Path,
    store: Path,
    on_epoch: Callable[[str, EpochRecord], None] | None,
    resume_run: str | None,
) -> tuple[str, list[SplitResult]]:
    use_store(store)
    use_experiment(config.dataset, store)
    manifest = read_manifest(folder)
    results = []
    begin = {"run_id": resume_run} if resume_run else {"run_name": f"garlic-{config.dataset}"}
    # A new run is claimed as it starts (``resume`` holds the claim on a resumed run already).
    with mlflow.start_run(**begin) as parent, nullcontext() if resume_run else claim_run(store, parent.info.run_id):
        if resume_run is None:  # what ``resume`` reads first: a run killed after it can be resumed
            mlflow.log_dict(config.to_dict(), run_contract.CONFIG)
            mlflow.log_params(config.to_dict())
            indices = list(dict.fromkeys(split.index for split, _ in units))
            mlflow.log_params({"n_stays": len(tensors), "n_variables": len(tensors.variables),
                               run_contract.DATA_FOLDER: str(folder),
                               run_contract.SPLIT_INDICES: ",".join(map(str, indices)),
                               run_contract.SEEDS: ",".join(map(str, seeds))})  # fmt: skip
            mlflow.log_dict(manifest, run_contract.DATA_MANIFEST)
        nested = len(units) > 1
        earlier = _split_runs(parent.info.run_id) if nested and resume_run else {}
        for split, unit_config in units:
            name = split.name if len(seeds) == 1 else f"{split.name}/seed_{unit_config.seed}"
            report = (lambda record, name=name: on_epoch(name, record)) if on_epoch else None
            record = run_contract.split_params(split, folder, manifest)
            previous = earlier.get(name)
            if previous is not None and previous.info.status == "FINISHED":
                distributed.broadcast_state({"finished": True})
                results.append(_finished_result(previous))
                continue
            resumed = parent.info.run_id if not nested else previous.info.run_id if previous is not None else None
            if resume_run is not None and resumed is not None:
                run_contract.verify_unchanged(resumed, get_run(resumed).data.params, record)
            if not nested:
                checkpoint = checkpoint_path(store, parent.info.run_id)
                results.append(train_split(unit_config, tensors, split, report, manifest.get("ground_truth_graph"),
                                           checkpoint, record))  # fmt: skip
                continue
            begin = {"run_id": previous.info.run_id} if previous is not None else {"run_name": name}
            with mlflow.start_run(**begin, nested=True) as child:
                if previous is None:
                    mlflow.log_params(unit_config.to_dict())
                checkpoint = checkpoint_path(store, child.info.run_id)
                results.append(train_split(unit_config, tensors, split, report, manifest.get("ground_truth_graph"),
                                           checkpoint, record))  # fmt: skip
        if nested:
            for metric in TEST_METRICS:
                values = np.array([r.test[metric] for r in results])
                mlflow.log_metrics({f"test_{metric}_mean": float(values.mean()), f"test_{metric}_std": float(values.std())})
    return parent.info.run_id, results


def _split_runs(parent_id: str) -> dict[str, mlflow.entities.Run]:
    """The split runs already nested under ``parent_id``, by split name."""
    children = mlflow.search_runs(experiment_ids=[get_run(parent_id).info.experiment_id], output_format="list",
                                  filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")  # fmt: skip
    return {child.info.run_name: child for child in children}


def _finished_result(run: mlflow.entities.Run) -> SplitResult:
    metrics = run.data.metrics
    return SplitResult(run.info.run_id, run.info.run_name, int(metrics["best_epoch"]),
                       {k: metrics[f"test_{k}"] for k in TEST_METRICS})  # fmt: skip


def resume(
    run_id: str,
    data_root: Path = DEFAULT_DATA_ROOT,
    store: Path = DEFAULT_STORE,
    on_epoch: Callable[[str, EpochRecord], None] | None = None,
    device: str | None = None,
) -> tuple[str | None, list[SplitResult]]:
    """Continue the unfinished run ``run_id``, with its own config and splits; returns what ``train`` returns.

    Finished split runs are kept; an unfinished one goes on from its last epoch checkpoint (from its start when it
    was stopped in its first epoch), in the same MLflow run. Epochs done after the last checkpoint are done again,
    with the same result, and their metrics logged once more at the same steps. ``device`` may differ from the
    run's (resuming on another machine). Under ``torchrun`` only rank 0 reads the store and sends the others the
    config. A run that a live process is training is refused (``RunInUseError``); a dead one's claim is taken over.
    """
    main = distributed.is_main()
    if main:  # asked before the claim below makes a claim file for the run
        use_store(store)
        get_run(run_id)  # an unknown id fails here
        started_by_train = was_claimed(store, run_id)
    with claim_run(store, run_id) if main else nullcontext():
        plan = _resume_plan(run_id, store, started_by_train) if main else None
        plan = distributed.broadcast_state(plan)
        config = Config().override(plan["config"])
        if device is not None:
            config = config.override({"device": device})
        return train(config, plan["split_indices"], data_root, store, on_epoch, resume_run=run_id,
                     seeds=plan["seeds"])  # fmt: skip


def _resume_plan(run_id: str, store: Path, started_by_train: bool) -> dict:
    use_store(store)
    run = get_run(run_id)
    if run.info.status == "FINISHED":
        raise ValueError(f"run {run_id} has finished; there is nothing to resume")
    parent = run.data.tags.get("mlflow.parentRunId")
    if parent:
        raise ValueError(f"run {run_id} is one split of run {parent}; resume that one")
    if "split_indices" not in run.data.params:
        if not started_by_train:
            raise ValueError(f"run {run_id} was not started by `garlic train` (it has no split_indices parameter)")
        mlflow.MlflowClient().set_terminated(run_id, status="FAILED")
        raise ValueError(f"run {run_id} was killed before it logged its config and splits, so it cannot be resumed; "
                         "it is now marked FAILED: start a new run")  # fmt: skip
    config = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/{run_contract.CONFIG}")
    seeds = run.data.params.get(run_contract.SEEDS)
    return {"config": config, "split_indices": [int(k) for k in run.data.params["split_indices"].split(",")],
            "seeds": [int(s) for s in seeds.split(",")] if seeds else None}  # fmt: skip


def evaluate_run(run_id: str, store: Path = DEFAULT_STORE) -> dict:
    """Re-compute a finished split run's test metrics from its logged model and its saved split.

    Refuses (``run_contract.StaleRunDataError``) a split or dataset that is not the one the run was trained on.
    """
    trained = load_run_model(run_id, store)
    params = get_run(run_id).data.params
    folder = Path(params[run_contract.DATA_FOLDER])
    split = run_contract.verify_split(run_id, params, folder, read_manifest(folder))
    tensors = load_tensors(folder)
    test = trained.dataset(tensors.subset(split.positions(tensors, "test")))
    probabilities = predict_proba(trained.model, test)
    return {"run": run_id, "split": params["split"], "n_test": len(test),
            **binary_metrics(test.labels.numpy(), probabilities)}  # fmt: skip
