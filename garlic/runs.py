"""Tracked training runs: dataset -> fixed splits -> fit on train, select on validation, test once -> MLflow.

One MLflow run per training; with several splits or model seeds (a whole protocol, ``garlic.data.splits.PROTOCOLS``),
a parent run holds one nested run per split and seed, and the mean +/- std of their test metrics. What a run
records about its data is ``garlic.tracking.run_contract``'s.

Every method of the registry (``garlic.methods.registry``), GARLIC included, goes through the one ``train``: each split
run is ``garlic.evaluation.fit_and_test.fit_and_test`` of the method, which is then saved with the run where it can be
(``garlic.methods.saved``: GARLIC and every method that writes what it fitted). A method that can resume
(``garlic.methods.contract.can_resume``: GARLIC, the recurrent baselines, PyPOTS's models) saves the state of its fit
(``garlic.training.state``) after every epoch, and every ``Trainer.checkpoint_seconds`` (10 minutes) within one, to
``run_contract.training_state_path`` (atomically; deleted once the split run has finished), so that ``resume`` continues
a killed run in the same MLflow run and ends as the uninterrupted run would have; another method's unfinished split
starts again, its finished splits kept. Ctrl-C ends the runs KILLED (``tracked_run``). Under ``torchrun`` every rank
fits; only rank 0 logs and writes the training state.
"""

from __future__ import annotations

import logging
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
from garlic.methods.contract import (
    Method,
    can_be_saved,
    can_resume,
    check_answers_prediction_times,
    check_learns_score,
)
from garlic.methods.saved import fitted_on, load_predictor, log_method
from garlic.metrics import METRICS, binary_metrics
from garlic.tracking import carry, queries, run_contract
from garlic.tracking.store import DEFAULT_STORE, claim_run, get_run, tracked_run, use_experiment, use_store, was_claimed
from garlic.training import distributed
from garlic.training.state import load_training_state, save_training_state
from garlic.training.trainer import EpochRecord
from garlic.io.tables import LABELS, check_binary, read_manifest
from garlic.io.tensors import IrregularTensors, load_tensors

log = logging.getLogger("experiments")


@dataclass
class SplitResult:
    run_id: str
    split: str  # the run's name: the split's, with ``/seed_<s>`` where a protocol trains several seeds
    best_epoch: int | None  # None for a method without epochs
    test: dict[str, float]


def train(
    config: Config,
    split_indices: list[int] | None = None,
    data_root: Path = DEFAULT_DATA_ROOT,
    store: Path = DEFAULT_STORE,
    on_epoch: Callable[[str, EpochRecord], None] | None = None,
    resume_run: str | None = None,
    seeds: list[int] | None = None,
    preset: str | None = None,
    method: str = "garlic",
    method_settings: dict | None = None,
    carry: Path | None = None,
) -> tuple[str | None, list[SplitResult]]:
    """Train the registered ``method`` (default GARLIC of ``config``) on the chosen splits (default: the first) of the
    config's dataset, each with every one of ``seeds`` (default: the config's seed); returns the run id and results.
    ``preset`` names the config file the config came from (``run_contract.PRESET``); ``method_settings``, the
    method's own settings where they are not its defaults (``MethodSpec.own_settings``); ``carry``, a folder where
    each unit's training state is also carried beyond the store, and taken up from (``garlic.tracking.carry``).

    ``resume_run`` continues that run (see ``resume``). Inside ``distributed.process_group`` (``garlic train``
    under ``torchrun``), ranks other than 0 help fit and return ``(None, [])``.
    """
    spec = registry.method(method)
    spec.check_installed()  # before any data is read
    with distributed.main_first():  # rank 0 builds the caches (tensors, splits) that the others then read
        folder = ensure_processed(config.dataset, data_root)
        manifest = read_manifest(folder)
        check_binary(manifest, config.dataset)
        tensors = load_tensors(folder)
        splits = load_splits(folder, tensors, config.split_protocol, config.dataset)
    chosen = chosen_splits(splits, [0] if split_indices is None else split_indices, config.split_protocol)
    for split in chosen:  # before any run opens: a fit on one outcome fails deep inside a method, or learns nothing
        _check_both_outcomes(tensors, split, config.dataset)
    labels, settings = pq.read_table(folder / LABELS).to_pandas(), spec.checked_settings(method_settings or {})
    if not spec.available(labels):
        raise ValueError(f"method {method} needs the {spec.needs_column} column, which {config.dataset} does not have")
    seeds = seeds or [config.seed]
    # A unit per split and seed: the method's context (the run's config with the unit's seed) and the method built
    # from it, each built once, before any run starts.
    units = []
    for split in chosen:
        for seed in seeds:
            context = registry.MethodContext(
                config.override({"seed": seed}), labels, manifest.get("ground_truth_graph"), settings
            )
            units.append((split, context, spec.create(context)))
    # before any run opens
    if tensors.task is not None:
        check_answers_prediction_times(units[0][2], f"method {method}")
    check_learns_score(units[0][2], "" if tensors.task is None else tensors.task.score, f"method {method}")
    if not distributed.is_main():
        for split, _, unit_method in units:
            _help_fit(unit_method, tensors, split)
        return None, []
    # The parent run describes the run's config: with its seed where it trains one, as it was where it trains several.
    described = units[0][1] if len(seeds) == 1 else units[0][1].with_config(config)
    return _Run(spec, tensors, folder, manifest, store, resume_run, preset, carry).train(
        described, units, seeds, on_epoch
    )


def _check_both_outcomes(tensors: IrregularTensors, split: Split, dataset: str) -> None:
    """A ValueError, naming the dataset, the split and the counts, when ``split``'s training part holds one outcome
    (its stays, or its prediction times on a dataset with a tasks table)."""
    train = split.positions(tensors, "train")  # the labels alone: a subset would copy the part's arrays
    task = tensors.task
    labels = tensors.labels[train] if task is None else task.label[np.isin(task.stay, train)]
    positive = int((labels == 1).sum())
    if 0 < positive < len(labels):
        return
    unit = "stays" if tensors.task is None else "prediction times"
    raise ValueError(
        f"{dataset}: the training part of {split.name} has {positive} positive and "
        f"{len(labels) - positive} negative {unit}: a model learns from both outcomes; preprocess the "
        "dataset with labels of both"
    )


def _help_fit(method: Method, tensors: IrregularTensors, split: Split) -> None:
    """A rank other than 0: fit ``method`` beside rank 0, from the state it sends, unless it says the split is done."""
    plan = distributed.broadcast_state(None)
    if not plan.get("finished"):
        parts = split_parts(tensors, split)
        # Every rank takes part in gathering the epoch's state (``AlternatingTrainer.state``); rank 0 writes it.
        method.set_training_hooks(on_state=lambda state: None, resume=plan["resume"])
        method.fit(parts["train"], parts["validation"])


@dataclass
class _Run:
    """One ``train`` call on rank 0: the registered method (``spec``), the data it reads, the store it logs to, the
    run it resumes (``resume_run``) and the preset it names; ``train`` starts the parent run and trains its units."""

    spec: registry.MethodSpec
    tensors: IrregularTensors
    folder: Path
    manifest: dict
    store: Path
    resume_run: str | None
    preset: str | None
    carry: Path | None = None

    def train(
        self,
        described: registry.MethodContext,
        units: list[tuple[Split, registry.MethodContext, Method]],
        seeds: list[int],
        on_epoch: Callable[[str, EpochRecord], None] | None,
    ) -> tuple[str, list[SplitResult]]:
        """The parent run's life: started (or resumed) and claimed, described (``described``: the run's config), each
        unit trained in it (one unit: in the parent itself; several: each in a nested run), and the mean and std of
        the units' test metrics logged."""
        dataset = described.config.dataset
        use_store(self.store)
        use_experiment(dataset, self.store)
        tags = run_contract.method_tags(self.spec.name) | ({run_contract.PRESET: self.preset} if self.preset else {})
        begin = (
            {"run_id": self.resume_run}
            if self.resume_run
            else {"run_name": f"{self.spec.name}-{dataset}", "tags": tags}
        )
        claimed = self.resume_run is not None  # ``resume`` holds the claim on a resumed run; a new one is claimed here
        with tracked_run(**begin) as parent, nullcontext() if claimed else claim_run(self.store, parent.info.run_id):
            if self.resume_run is None:  # what ``resume`` reads first: a run killed after it can be resumed
                self.describe(described, units, seeds)
            nested = len(units) > 1
            earlier = _split_runs(parent.info.run_id) if nested and self.resume_run else {}
            results = []
            for split, context, method in units:
                name = split.name if len(seeds) == 1 else f"{split.name}/seed_{context.config.seed}"
                report = (lambda record, name=name: on_epoch(name, record)) if on_epoch else None
                where = _UnitRun(parent.info.run_id, nested, earlier.get(name), name, tags)
                results.append(self.train_unit(split, context, method, where, report))
            if nested:
                _log_mean_and_std(results)
        return parent.info.run_id, results

    def describe(
        self,
        described: registry.MethodContext,
        units: list[tuple[Split, registry.MethodContext, Method]],
        seeds: list[int],
    ) -> None:
        """Log what the parent run trains: the config, the method's settings, the data (size, folder, manifest), its
        splits and seeds."""
        config = described.config
        mlflow.log_dict(config.to_dict(), run_contract.CONFIG)
        mlflow.log_params(run_contract.method_params(self.spec.name, config.to_dict(), self.spec.settings(described)))
        indices = list(dict.fromkeys(split.index for split, _, _ in units))
        mlflow.log_params(
            {
                "n_stays": len(self.tensors),
                "n_variables": len(self.tensors.variables),
                run_contract.DATA_FOLDER: str(self.folder),
                run_contract.SPLIT_INDICES: ",".join(map(str, indices)),
                run_contract.SEEDS: ",".join(map(str, seeds)),
            }
        )
        mlflow.log_dict(self.manifest, run_contract.DATA_MANIFEST)

    def train_unit(
        self,
        split: Split,
        context: registry.MethodContext,
        method: Method,
        where: "_UnitRun",
        report: Callable[[EpochRecord], None] | None,
    ) -> SplitResult:
        """One split and seed of the parent run: reused when its nested run finished before, else fitted, selected and
        tested (``garlic.evaluation.fit_and_test.fit_and_test``) in the parent itself or in its nested run (resumed
        where one was started), and the fitted method logged where it can be saved.

        The unit's run carries its identity's tags (``run_contract.UnitIdentity``), so that every other path finds it,
        and is fitted as every unit is (``fit_and_test_resuming``: resumed from its own or its carried training
        state); the run's ``split_params`` tie it to the stays it used."""
        record = run_contract.split_params(split, self.folder, self.manifest)
        previous = where.previous
        if previous is not None and queries.is_finished(previous):
            distributed.broadcast_state({"finished": True})
            return _finished_result(previous)
        resumed = where.parent_id if not where.nested else previous.info.run_id if previous is not None else None
        if self.resume_run is not None and resumed is not None:
            run_contract.verify_unchanged(resumed, get_run(resumed).data.params, record)
        begin = (
            {"run_id": previous.info.run_id} if previous is not None else {"run_name": where.name, "tags": where.tags}
        )
        unit = unit_identity(self.spec, context, split.name, run_contract.manifest_digest(self.manifest))
        with tracked_run(**begin, nested=True) if where.nested else nullcontext():
            run = mlflow.active_run().info  # the nested run, or the parent itself
            mlflow.set_tags(unit.tags())  # a run started before units were tagged gets them as it goes on
            logged = get_run(run.run_id).data.params
            if where.nested and previous is None:
                mlflow.log_params(
                    run_contract.method_params(self.spec.name, context.config.to_dict(), self.spec.settings(context))
                )
            # a new run, even where it goes on from its unit's carried state; a resumed one said it when it began
            mlflow.log_params({key: value for key, value in record.items() if key not in logged})
            parts = split_parts(self.tensors, split)

            def save_method() -> None:
                log_method(fitted_on(self.spec.name, method, context.config, parts["train"], context.settings))

            metrics = fit_and_test_resuming(
                method,
                parts,
                context.config,
                self.store,
                carry.unit_state(self.carry, unit),
                report,
                save_method if can_be_saved(method) else None,
            )
            best_epoch = metrics.get("best_epoch")
            return SplitResult(
                run.run_id,
                run.run_name,
                None if best_epoch is None else int(best_epoch),
                {metric: metrics[f"test_{metric}"] for metric in METRICS},
            )


def unit_identity(
    spec: registry.MethodSpec, context: registry.MethodContext, split_name: str, data_digest: str
) -> run_contract.UnitIdentity:
    """The unit that ``spec`` built from ``context`` is on the split ``split_name`` of the data of ``data_digest``,
    whichever path trains it."""
    seed = context.config.seed if spec.seeded else None
    settings = queries.settings_digest(spec.settings(context))
    return run_contract.UnitIdentity(spec.name, context.config.dataset, split_name, seed, settings, data_digest)


def fit_and_test_resuming(
    method: Method,
    parts: dict,
    config: Config,
    store: Path,
    carried: Path | None = None,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    fitted: Callable[[], None] | None = None,
) -> dict[str, float]:
    """``fit_and_test`` of one unit in the active run, the one way every path fits a unit: a method that resumes
    (``contract.can_resume``) saves the state of its fit (``garlic.training.state``, checked against ``config``) at
    ``run_contract.training_state_path`` of ``store`` after every epoch and within long ones, and goes on from the
    state a stopped fit of this run left there, else from the unit's ``carried`` state (``garlic.tracking.carry``:
    also kept there at every save). ``on_epoch`` hears each epoch; ``fitted`` (logging what was fitted) is called
    once the method is tested, before its states are removed. Under ``torchrun`` the state gone on from is sent to
    the other ranks (``_help_fit``)."""
    path = run_contract.training_state_path(store, mlflow.active_run().info.run_id)
    resumes = can_resume(method)
    source = carry.resume_from(carried, path) if resumes else None
    resume = load_training_state(source, config) if source is not None else None
    distributed.broadcast_state({"resume": resume})

    def save(state: dict) -> None:  # called on every rank: gathering the state takes them all
        save_training_state(path, state, config)
        carry.carry(carried, path)

    if resumes:
        method.set_training_hooks(on_epoch=on_epoch, on_state=save, resume=resume)
    metrics = fit_and_test(method, parts)
    if fitted is not None:
        fitted()
    if resumes:
        shutil.rmtree(path.parent, ignore_errors=True)
        carry.finish(carried)
    return metrics


def resumable_run(
    finished: mlflow.entities.Run | None,
    stopped: str | None,
    begin: dict,
    work: Callable[[], dict[str, float]],
    store: Path | None,
) -> tuple[dict[str, float], str, bool]:
    """A unit's run, in one of three ways: the ``finished`` run's metrics reused; else ``work`` run inside the run
    ``stopped`` with a training state kept in ``store`` (``work`` goes on from it: ``fit_and_test_resuming``); else
    ``work`` inside a new run (``mlflow.start_run(**begin)``). A run is held (``claim_run``) while it trains: a second
    process never continues it at the same time. Returns (metrics, run id, reused)."""
    if finished is not None:
        log.info("reusing finished run %s (%s)", finished.info.run_id, finished.info.run_name)
        return dict(finished.data.metrics), finished.info.run_id, True
    if stopped is not None:
        log.info("resuming run %s from its training state", stopped)
        with claim_run(store, stopped), mlflow.start_run(run_id=stopped) as run:
            return work(), run.info.run_id, False
    log.info("training %s", begin.get("run_name"))
    with mlflow.start_run(**begin) as run:
        with claim_run(store, run.info.run_id) if store is not None else nullcontext():
            metrics = work()
    return metrics, run.info.run_id, False


def run_unit(
    unit: run_contract.UnitIdentity,
    experiment_id: str,
    run_name: str,
    work: Callable[[], dict[str, float]],
    store: Path,
) -> tuple[dict[str, float], str, bool]:
    """``resumable_run`` of ``unit`` in ``store``: its finished run in any experiment of the store reused, else its
    stopped run with a training state gone on with, else a new run of ``experiment_id`` tagged as the unit."""
    return resumable_run(
        None if (found := queries.finished_unit_run([store], unit)) is None else found[1],
        queries.interrupted_unit_run(store, unit),
        {"experiment_id": experiment_id, "run_name": run_name, "tags": unit.tags()},
        work,
        store,
    )


@dataclass(frozen=True)
class _UnitRun:
    """Where a unit runs: in the parent run ``parent_id`` itself, or (``nested``) in a nested run named ``name``,
    tagged ``tags``; ``previous``, that nested run where an earlier call started it."""

    parent_id: str
    nested: bool
    previous: mlflow.entities.Run | None
    name: str
    tags: dict


def _log_mean_and_std(results: list[SplitResult]) -> None:
    """The units' mean and std of each test metric, in the active (parent) run."""
    for metric in METRICS:
        values = np.array([r.test[metric] for r in results])
        mlflow.log_metrics({f"test_{metric}_mean": float(values.mean()), f"test_{metric}_std": float(values.std())})


def _split_runs(parent_id: str) -> dict[str, mlflow.entities.Run]:
    """The split runs already nested under ``parent_id``, by split name."""
    return {child.info.run_name: child for child in queries.split_runs(get_run(parent_id))}


def _finished_result(run: mlflow.entities.Run) -> SplitResult:
    metrics = run.data.metrics
    best_epoch = int(metrics["best_epoch"]) if "best_epoch" in metrics else None
    return SplitResult(run.info.run_id, run.info.run_name, best_epoch, {k: metrics[f"test_{k}"] for k in METRICS})


def resume(
    run_id: str,
    data_root: Path = DEFAULT_DATA_ROOT,
    store: Path = DEFAULT_STORE,
    on_epoch: Callable[[str, EpochRecord], None] | None = None,
    device: str | None = None,
    carry: Path | None = None,
) -> tuple[str | None, list[SplitResult]]:
    """Continue the unfinished run ``run_id``, with its own config and splits; returns what ``train`` returns.

    Finished split runs are kept; an unfinished one goes on from its last epoch's training state (from its start when it
    was stopped in its first epoch), in the same MLflow run. Epochs done after the last saved state are done again,
    with the same result, and their metrics logged once more at the same steps. ``device`` may differ from the
    run's (resuming on another machine); ``carry`` as for ``train``. Under ``torchrun`` only rank 0 reads the store
    and sends the others the config. A run that a live process is training is refused (``RunInUseError``); a dead
    one's claim is taken over.
    """
    main = distributed.is_main()
    if main:  # asked before the claim below makes a claim file for the run
        use_store(store)
        started_by_train = was_claimed(store, run_id)
        # Every refusal that needs no claim comes before it: a claim file would mark another process's run as one
        # that `garlic train` holds, and the next `garlic train` would then judge that live run dead.
        _refuse_unresumable(get_run(run_id), started_by_train)  # an unknown id fails here
    with claim_run(store, run_id) if main else nullcontext():
        plan = _resume_plan(run_id, store, started_by_train) if main else None
        plan = distributed.broadcast_state(plan)
        config = Config().override(plan["config"])
        if device is not None:
            config = config.override({"device": device})
        return train(
            config,
            plan["split_indices"],
            data_root,
            store,
            on_epoch,
            resume_run=run_id,
            seeds=plan["seeds"],
            preset=plan["preset"],
            method=plan["method"],
            method_settings=plan["method_settings"],
            carry=carry,
        )


def _refuse_unresumable(run: mlflow.entities.Run, started_by_train: bool) -> None:
    """Refuse a run that is not one ``resume`` continues: finished, a split run, or one ``garlic train`` never started."""
    run_id = run.info.run_id
    if queries.is_finished(run):
        raise ValueError(f"run {run_id} has finished; there is nothing to resume")
    parent = run.data.tags.get("mlflow.parentRunId")
    if parent:
        raise ValueError(f"run {run_id} is one split of run {parent}; resume that one")
    if "split_indices" not in run.data.params and not started_by_train:
        raise ValueError(f"run {run_id} was not started by `garlic train` (it has no split_indices parameter)")


def _resume_plan(run_id: str, store: Path, started_by_train: bool) -> dict:
    use_store(store)
    run = get_run(run_id)
    _refuse_unresumable(run, started_by_train)  # again, now that the run is held: it may have finished meanwhile
    if "split_indices" not in run.data.params:  # started by `garlic train`, which is gone (the claim was free)
        mlflow.MlflowClient().set_terminated(run_id, status="FAILED")
        raise ValueError(
            f"run {run_id} was killed before it logged its config and splits, so it cannot be resumed; "
            "it is now marked FAILED: start a new run"
        )
    config = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/{run_contract.CONFIG}")
    params, method = run.data.params, run_contract.method_of(run)
    seeds = params.get(run_contract.SEEDS)
    # the method's own settings are among its params (``run_contract.method_params``): the splits trained again
    # take the ones the finished splits took
    own = {key: params[key] for key in registry.method(method).own_settings() if key in params}
    return {
        "config": config,
        "split_indices": [int(k) for k in params["split_indices"].split(",")],
        "seeds": [int(s) for s in seeds.split(",")] if seeds else None,
        "preset": run.data.tags.get(run_contract.PRESET),
        "method": method,
        "method_settings": own,
    }


def evaluate_run(
    run_id: str,
    store: Path = DEFAULT_STORE,
    data_root: Path = DEFAULT_DATA_ROOT,
    say: Callable[[str], None] = lambda message: None,
) -> dict:
    """Re-compute a finished split run's test metrics from its logged model and its saved split, read from the run's
    dataset under ``data_root`` (as training and the dashboard find it, from any folder); ``say`` is told each step
    before it is taken (reading the model, reading the stays, scoring them).

    On a dataset with prediction times (a tasks table) the metrics are over them, as the run's test look had them
    (``n_prediction_times``). Refuses (``run_contract.StaleRunDataError``) a split or dataset that is not the one the
    run was trained on.
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
    times = test.prediction_times  # one per stay, or the tasks table's: the rows the run was tested on
    timed = test.tensors.task is not None
    say(
        f"scoring the {len(test)} test stays of {params['split']}"
        + (f" at their {len(times)} prediction times ..." if timed else " ...")
    )
    probabilities = trained.predict_proba(test)
    return {
        "run": run_id,
        "split": params["split"],
        "n_test": len(test),
        **({"n_prediction_times": len(times)} if timed else {}),
        **binary_metrics(times.label, probabilities),
    }
