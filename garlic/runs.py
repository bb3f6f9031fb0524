"""Tracked training runs: dataset -> fixed splits -> fit on train, select on validation, test once -> MLflow.

One MLflow run per training; with several splits or model seeds (a whole protocol, ``garlic.data.splits.PROTOCOLS``),
a parent run holds one nested run per split and seed, and the mean +/- std of their test metrics. What a run
records about its data is ``garlic.tracking.run_contract``'s.

Each split run is ``garlic.evaluation.fit_and_test.fit_and_test`` of a ``garlic.methods.garlic.GarlicEstimator`` (``train``), or of
another registered method (``train_method``, ``garlic.methods.registry``). After every epoch the
state of the fit (``garlic.training.state``) is saved to ``run_contract.training_state_path`` (atomically; deleted
once the split run has finished), so that ``resume`` continues a killed run in the same MLflow run and ends as the
uninterrupted run would have. Under ``torchrun`` every rank fits; only rank 0 logs and writes the training state.
"""
from __future__ import annotations

import shutil
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mlflow
import numpy as np
import pyarrow.parquet as pq

from garlic.config import Config
from garlic.data.datasets import DEFAULT_DATA_ROOT, ensure_processed, processed_folder
from garlic.data.splits import Split, chosen_splits, load_splits
from garlic.evaluation.fit_and_test import fit_and_test, split_parts
from garlic.methods import registry
from garlic.methods.contract import can_be_saved
from garlic.methods.garlic import GarlicEstimator
from garlic.methods.saved import SavedMethod, load_predictor, save_method
from garlic.metrics import METRICS, binary_metrics
from garlic.tracking import run_contract
from garlic.tracking.store import (DEFAULT_STORE, claim_run, get_run, log_model_folder,
                                   use_experiment, use_store, was_claimed)  # fmt: skip
from garlic.training import distributed
from garlic.training.state import load_training_state, save_training_state
from garlic.training.threads import adapt_threads
from garlic.training.trainer import EpochRecord
from garlic.io.tables import LABELS, read_manifest
from garlic.io.tensors import IrregularTensors, load_tensors


@dataclass
class SplitResult:
    run_id: str
    split: str  # the run's name: the split's, with ``/seed_<s>`` where a protocol trains several seeds
    best_epoch: int | None  # None for a method without epochs
    test: dict[str, float]


def train_split(
    config: Config,
    tensors: IrregularTensors,
    split: Split,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    planted_graph: list[dict] | None = None,
    state_path: Path | None = None,
    data_record: dict[str, str] | None = None,
) -> SplitResult:
    """Train, select and test on one split inside the active MLflow run (``planted_graph``: a known truth), through
    ``garlic.evaluation.fit_and_test.fit_and_test``.

    With ``state_path``, the fit's state is saved there after every epoch, and a state found there is continued.
    ``data_record`` (``run_contract.split_params``) ties the run to the stays it used.
    """
    resume = load_training_state(state_path) if state_path is not None and state_path.is_file() else None
    distributed.broadcast_state({"resume": resume})
    if resume is None:
        mlflow.log_params(data_record or {run_contract.SPLIT: split.name})

    def save(state: dict) -> None:  # called on every rank: gathering the state takes them all
        if state_path is not None:
            save_training_state(state_path, state)

    estimator = GarlicEstimator(config, planted_graph, on_epoch=on_epoch, on_state=save, resume=resume)
    metrics = fit_and_test(estimator, split_parts(tensors, split))
    if state_path is not None:
        shutil.rmtree(state_path.parent, ignore_errors=True)
    run = mlflow.active_run().info
    return SplitResult(run.run_id, run.run_name, estimator.fit_result_.best_epoch,
                       {metric: metrics[f"test_{metric}"] for metric in METRICS})  # fmt: skip


def train(
    config: Config,
    split_indices: list[int] | None = None,
    data_root: Path = DEFAULT_DATA_ROOT,
    store: Path = DEFAULT_STORE,
    on_epoch: Callable[[str, EpochRecord], None] | None = None,
    resume_run: str | None = None,
    seeds: list[int] | None = None,
    preset: str | None = None,
) -> tuple[str | None, list[SplitResult]]:
    """Train on the chosen splits (default: the first) of the config's dataset, each with every one of ``seeds``
    (default: the config's seed); returns the run id and results. ``preset`` names the config file the config came
    from (``run_contract.PRESET``).

    ``resume_run`` continues that run (see ``resume``). Inside ``distributed.process_group`` (``garlic train``
    under ``torchrun``), ranks other than 0 help fit and return ``(None, [])``.
    """
    with distributed.main_first():  # rank 0 builds the caches (tensors, splits) that the others then read
        folder = ensure_processed(config.dataset, data_root)
        tensors = load_tensors(folder)
        splits = load_splits(folder, tensors, config.split_protocol, config.dataset)
    chosen = chosen_splits(splits, [0] if split_indices is None else split_indices, config.split_protocol)
    seeds = seeds or [config.seed]
    if len(seeds) == 1:
        config = config.override({"seed": seeds[0]})
    units = [(split, config.override({"seed": seed})) for split in chosen for seed in seeds]
    if not distributed.is_main():
        for split, unit_config in units:
            _help_fit(unit_config, tensors, split)
        return None, []
    return _tracked_train(config, tensors, units, seeds, folder, store, on_epoch, resume_run, preset)


def train_method(
    name: str,
    config: Config,
    split_indices: list[int] | None = None,
    data_root: Path = DEFAULT_DATA_ROOT,
    store: Path = DEFAULT_STORE,
) -> tuple[str, list[SplitResult]]:
    """A registered method other than GARLIC (``garlic.methods.registry``) on the chosen splits (default: the first) of the
    config's dataset and protocol, through ``fit_and_test`` as GARLIC is: one MLflow run tagged with the method, its
    settings as params, a nested run per split (one split: the run itself) and the mean and std of their test
    metrics. These methods fit in minutes, so a killed run is started again rather than resumed. A method that can
    be saved (``garlic.methods.contract.can_be_saved``) logs its fitted model with each split run, for ``garlic
    predict``, ``garlic evaluate`` and the dashboard (``load_predictor``). Returns the run id and results."""
    spec = registry.method(name)
    spec.check_installed()  # before any data is read
    folder = ensure_processed(config.dataset, data_root)
    tensors = load_tensors(folder)
    splits = load_splits(folder, tensors, config.split_protocol, config.dataset)
    chosen = chosen_splits(splits, [0] if split_indices is None else split_indices, config.split_protocol)
    context = registry.MethodContext(config, pq.read_table(folder / LABELS).to_pandas())
    if not spec.available(context.labels):
        raise ValueError(f"method {name} needs the {spec.needs_column} column, which {config.dataset} does not have")
    use_store(store)
    use_experiment(config.dataset, store)
    manifest = read_manifest(folder)
    with mlflow.start_run(run_name=f"{name}-{config.dataset}", tags={run_contract.METHOD: name}) as parent:
        mlflow.log_params({run_contract.DATASET: config.dataset, "split_protocol": config.split_protocol,
                           run_contract.METHOD: name, **spec.settings(context)})  # fmt: skip
        mlflow.log_dict(manifest, run_contract.DATA_MANIFEST)
        results = []
        for split in chosen:
            nested = {"run_name": split.name, "nested": True, "tags": {run_contract.METHOD: name}}
            with mlflow.start_run(**nested) if len(chosen) > 1 else nullcontext():
                mlflow.log_params(run_contract.split_params(split, folder, manifest))
                method = spec.create(context)
                metrics = fit_and_test(method, split_parts(tensors, split))
                if can_be_saved(method):
                    saved = SavedMethod(name, method, config, list(tensors.variables), list(tensors.static_features),
                                        split.normalisation)  # fmt: skip
                    log_model_folder(lambda folder: save_method(folder, saved))
                results.append(SplitResult(mlflow.active_run().info.run_id, split.name, None,
                                           {metric: metrics[f"test_{metric}"] for metric in METRICS}))  # fmt: skip
        if len(chosen) > 1:
            _log_mean_and_std(results)
    return parent.info.run_id, results


def _help_fit(config: Config, tensors: IrregularTensors, split: Split) -> None:
    """A rank other than 0: fit beside rank 0, from the state it sends, unless it says the split is done."""
    plan = distributed.broadcast_state(None)
    if not plan.get("finished"):
        parts = split_parts(tensors, split)
        # Every rank takes part in gathering the epoch's state (``AlternatingTrainer.state``); rank 0 writes it.
        estimator = GarlicEstimator(config, resume=plan["resume"], on_state=lambda state: None)
        estimator.fit(parts["train"], parts["validation"])


def _tracked_train(
    config: Config,
    tensors: IrregularTensors,
    units: list[tuple[Split, Config]],
    seeds: list[int],
    folder: Path,
    store: Path,
    on_epoch: Callable[[str, EpochRecord], None] | None,
    resume_run: str | None,
    preset: str | None = None,
) -> tuple[str, list[SplitResult]]:
    """The parent run's life: started (or resumed) and claimed, described, each unit trained in it (one split: in the
    parent itself; several: each in a nested run), and the mean and std of the units' test metrics logged."""
    use_store(store)
    use_experiment(config.dataset, store)
    manifest = read_manifest(folder)
    tags = {run_contract.PRESET: preset} if preset else None
    begin = {"run_id": resume_run} if resume_run else {"run_name": f"garlic-{config.dataset}", "tags": tags}
    # A new run is claimed as it starts (``resume`` holds the claim on a resumed run already).
    with mlflow.start_run(**begin) as parent, nullcontext() if resume_run else claim_run(store, parent.info.run_id):
        if resume_run is None:  # what ``resume`` reads first: a run killed after it can be resumed
            _describe(config, tensors, units, seeds, folder, manifest)
        nested = len(units) > 1
        earlier = _split_runs(parent.info.run_id) if nested and resume_run else {}
        results = []
        for split, unit_config in units:
            name = split.name if len(seeds) == 1 else f"{split.name}/seed_{unit_config.seed}"
            report = (lambda record, name=name: on_epoch(name, record)) if on_epoch else None
            results.append(_train_unit(unit_config, tensors, split, folder, manifest, store, parent.info.run_id,
                                       nested, earlier.get(name), resume_run is not None, name, tags, report))  # fmt: skip
        if nested:
            _log_mean_and_std(results)
    return parent.info.run_id, results


def _log_mean_and_std(results: list[SplitResult]) -> None:
    """The units' mean and std of each test metric, in the active (parent) run."""
    for metric in METRICS:
        values = np.array([r.test[metric] for r in results])
        mlflow.log_metrics({f"test_{metric}_mean": float(values.mean()), f"test_{metric}_std": float(values.std())})


def _describe(config: Config, tensors: IrregularTensors, units: list[tuple[Split, Config]], seeds: list[int],
              folder: Path, manifest: dict) -> None:  # fmt: skip
    """Log what the parent run trains on: the config, the data (size, folder, manifest), its splits and seeds."""
    mlflow.log_dict(config.to_dict(), run_contract.CONFIG)
    mlflow.log_params(config.to_dict())
    indices = list(dict.fromkeys(split.index for split, _ in units))
    mlflow.log_params({"n_stays": len(tensors), "n_variables": len(tensors.variables),
                       run_contract.DATA_FOLDER: str(folder),
                       run_contract.SPLIT_INDICES: ",".join(map(str, indices)),
                       run_contract.SEEDS: ",".join(map(str, seeds))})  # fmt: skip
    mlflow.log_dict(manifest, run_contract.DATA_MANIFEST)


def _train_unit(config: Config, tensors: IrregularTensors, split: Split, folder: Path, manifest: dict, store: Path,
                parent_id: str, nested: bool, previous: mlflow.entities.Run | None, resuming: bool, name: str,
                tags: dict | None, report: Callable[[EpochRecord], None] | None) -> SplitResult:  # fmt: skip
    """One split and seed of the parent run: reused when its nested run finished before, else trained (resuming its
    run where one was started), in the parent itself or in its nested run, with its training state beside it."""
    record = run_contract.split_params(split, folder, manifest)
    if previous is not None and previous.info.status == "FINISHED":
        distributed.broadcast_state({"finished": True})
        return _finished_result(previous)
    resumed = parent_id if not nested else previous.info.run_id if previous is not None else None
    if resuming and resumed is not None:
        run_contract.verify_unchanged(resumed, get_run(resumed).data.params, record)
    graph = manifest.get("ground_truth_graph")
    if not nested:
        return train_split(config, tensors, split, report, graph, run_contract.training_state_path(store, parent_id),
                           record)  # fmt: skip
    begin = {"run_id": previous.info.run_id} if previous is not None else {"run_name": name, "tags": tags}
    with mlflow.start_run(**begin, nested=True) as child:
        if previous is None:
            mlflow.log_params(config.to_dict())
        state_path = run_contract.training_state_path(store, child.info.run_id)
        return train_split(config, tensors, split, report, graph, state_path, record)


def _split_runs(parent_id: str) -> dict[str, mlflow.entities.Run]:
    """The split runs already nested under ``parent_id``, by split name."""
    children = mlflow.search_runs(experiment_ids=[get_run(parent_id).info.experiment_id], output_format="list",
                                  filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")  # fmt: skip
    return {child.info.run_name: child for child in children}


def _finished_result(run: mlflow.entities.Run) -> SplitResult:
    metrics = run.data.metrics
    return SplitResult(run.info.run_id, run.info.run_name, int(metrics["best_epoch"]),
                       {k: metrics[f"test_{k}"] for k in METRICS})  # fmt: skip


def resume(
    run_id: str,
    data_root: Path = DEFAULT_DATA_ROOT,
    store: Path = DEFAULT_STORE,
    on_epoch: Callable[[str, EpochRecord], None] | None = None,
    device: str | None = None,
) -> tuple[str | None, list[SplitResult]]:
    """Continue the unfinished run ``run_id``, with its own config and splits; returns what ``train`` returns.

    Finished split runs are kept; an unfinished one goes on from its last epoch's training state (from its start when it
    was stopped in its first epoch), in the same MLflow run. Epochs done after the last saved state are done again,
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
                     seeds=plan["seeds"], preset=plan["preset"])  # fmt: skip


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
            "seeds": [int(s) for s in seeds.split(",")] if seeds else None,
            "preset": run.data.tags.get(run_contract.PRESET)}  # fmt: skip


def evaluate_run(run_id: str, store: Path = DEFAULT_STORE, data_root: Path = DEFAULT_DATA_ROOT,
                 say: Callable[[str], None] = lambda message: None) -> dict:  # fmt: skip
    """Re-compute a finished split run's test metrics from its logged model and its saved split, read from the run's
    dataset under ``data_root`` (as training and the dashboard find it, from any folder); ``say`` is told each step
    before it is taken (reading the model, reading the stays, scoring them).

    Refuses (``run_contract.StaleRunDataError``) a split or dataset that is not the one the run was trained on.
    """
    use_store(store)
    say(f"reading run {run_id}'s model ...")
    trained = load_predictor(run_id, store)
    params = get_run(run_id).data.params
    folder = processed_folder(params[run_contract.DATASET], data_root)
    split = run_contract.verify_split(run_id, params, folder, read_manifest(folder))
    say(f"reading the {params[run_contract.DATASET]} stays in {folder} ...")
    tensors = load_tensors(folder)
    test = trained.dataset(tensors.subset(split.positions(tensors, "test")))
    say(f"scoring the {len(test)} test stays of {params['split']} ...")
    adapt_threads()
    probabilities = trained.predict_proba(test)
    return {"run": run_id, "split": params["split"], "n_test": len(test),
            **binary_metrics(test.labels.numpy(), probabilities)}  # fmt: skip
