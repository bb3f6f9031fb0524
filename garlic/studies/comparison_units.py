"""The units of the comparison table (``garlic.studies.comparison``): every method of ``--methods`` and every GARLIC
preset of ``--presets`` on each split (and model seed) of each protocol, each gathered from the stores, else from the
table's run archive, else trained (``python -m experiments.compare``, whose help says how).

A source's table (``physionet2019``, ``TABLE_COHORTS``) runs each protocol on its own cohort (``protocol_dataset``).
A unit is found by its identity (``garlic.tracking.run_contract.UnitIdentity``) in any experiment of any store given,
whichever command trained it. A GARLIC unit is trained through ``garlic.runs.train`` (in this process, or in
``garlic train`` worker processes: ``train_in_workers``), a registered method's through ``garlic.studies.Baselines``,
both into the dataset's experiment and fitted as every unit is (``garlic.runs.fit_and_test_resuming``); either is
kept in the run archive as soon as it has finished.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pandas as pd

from garlic import runs, studies
from garlic.config import CONFIG_DIR, Config
from garlic.data.datasets import ensure_processed, is_dataset
from garlic.data.splits import protocol, published_for
from garlic.io.locks import LockHeld, acquire, release
from garlic.io.tables import read_manifest
from garlic.methods import registry
from garlic.metrics import METRICS
from garlic.studies import preset_config
from garlic.tracking import queries, run_contract
from garlic.tracking.archive import RunArchive, Unit
from garlic.tracking.store import use_store
from garlic.training.workers import Job, run_jobs

log = logging.getLogger("experiments")

BASELINES = ("saps", "sofa", *registry.simple_baselines())  # the default ``--methods``
# A source's table (``--dataset physionet2019``) runs each protocol on its own cohort: a published one on the cohort it
# was published for (``garlic-reference`` on ``physionet2019-garlic``), any other on this one.
TABLE_COHORTS = {"physionet2019": "physionet2019-raindrop"}


def protocol_dataset(table: str, protocol_name: str) -> str:
    """The dataset a protocol of the table ``table`` (a dataset, or a source of ``TABLE_COHORTS``) runs on."""
    if is_dataset(table):
        return table
    chosen = protocol(protocol_name)
    cohorts = [d for d in published_for(chosen.published) if d.startswith(f"{table}-")] if chosen.published else []
    return cohorts[0] if cohorts else TABLE_COHORTS[table]


@dataclass(frozen=True)
class Pending:
    """A unit without a finished run: the GARLIC preset (or baseline), the protocol, the split and the model seed
    (None for a baseline: one run per split)."""

    preset: str
    protocol: str
    split: int
    seed: int | None
    dataset: str | None = None  # a GARLIC unit's, which a source's preset (physionet2019) does not name

    def __str__(self) -> str:
        seed = "" if self.seed is None else f" seed {self.seed}"
        return f"{self.preset} {self.protocol}/split_{self.split}{seed}"


def garlic_units(
    name: str,
    config: Config,
    protocol_name: str,
    stores: list[Path],
    data_root: Path,
    train: bool,
    archive: RunArchive | None = None,
    seeds: list[int] | None = None,
    carry: Path | None = None,
    splits: list[int] | None = None,
) -> tuple[list[Unit], list[Pending]]:
    """The preset's units on the protocol, one per split and model seed (``seeds``, else the protocol's, else the
    config's), from the stores, else from ``archive``, else trained (unless not ``train``, or the split is not one
    of ``splits``; ``carry``: where their training states are carried beyond the store, ``garlic.tracking.carry``);
    and what is missing."""
    chosen = protocol(protocol_name)
    digest = run_contract.manifest_digest(read_manifest(ensure_processed(config.dataset, data_root)))
    units, missing = [], []
    for index in chosen.splits:
        for seed in queries.model_seeds(protocol_name, config, seeds):
            unit_config = config.override({"split_protocol": protocol_name, "seed": seed})
            settings = queries.config_digest(unit_config)
            split_name = f"{protocol_name}/split_{index}"
            found = finished_preset(stores, unit_config, split_name, digest)
            if found is None and archive is not None:
                kept = archive.find(name, protocol_name, index, seed, settings)
                if kept is not None:
                    units.append(kept)
                    continue
            if found is None and train and (splits is None or index in splits):
                try:
                    claim = acquire(unit_lock(stores[0], name, protocol_name, index, seed), wait=False)
                except LockHeld:
                    log.warning("%s on %s, seed %d: another process is training it; left out", name, split_name, seed)
                else:
                    try:  # it may have finished while this process waited for it
                        found = finished_preset(stores[:1], unit_config, split_name, digest)
                        interrupted = queries.interrupted_unit(stores[0], unit_config, split_name, digest)
                        if found is None and interrupted is not None:
                            log.info("resuming %s on %s, seed %d (run %s)", name, split_name, seed, interrupted)
                            runs.resume(interrupted, data_root, stores[0], carry=carry)
                        elif found is None:
                            log.info("training %s on %s, seed %d", name, split_name, seed)
                            runs.train(unit_config, [index], data_root, stores[0], preset=name, carry=carry)
                        found = finished_preset(stores[:1], unit_config, split_name, digest)
                    finally:
                        release(claim)
            if found is None:
                missing.append(Pending(name, protocol_name, index, seed, config.dataset))
                continue
            units.append(finished_unit(name, protocol_name, index, seed, settings, *found))
            if archive is not None:  # now, not after the call's last unit: the machine may not last that long
                archive.keep(units[-1:])
    return units, missing


def finished_preset(
    stores: list[Path], config: Config, split_name: str, data_digest: str
) -> tuple[Path, mlflow.entities.Run] | None:
    """A finished run of the GARLIC unit of ``config`` (a preset's, its protocol and model seed set) on
    ``split_name`` in any of ``stores``, with its store: found by the unit's identity (``runs.unit_identity``), whichever
    path trained it in whichever experiment, else, a run that ``garlic train`` finished before units were tagged, by
    its logged params (``queries.finished_unit``)."""
    unit = runs.unit_identity(
        registry.method(run_contract.GARLIC), registry.MethodContext(config, pd.DataFrame()), split_name, data_digest
    )
    return queries.finished_unit_run(stores, unit) or queries.finished_unit(stores, config, split_name, data_digest)


def finished_unit(name: str, protocol_name: str, index: int, seed: int, settings: str, store: Path, run) -> Unit:
    """The unit that the finished MLflow ``run`` of ``store`` trained: its test metrics and risks."""
    metrics = {k.removeprefix("test_"): v for k, v in run.data.metrics.items() if k.startswith("test_")}
    return Unit(
        name,
        protocol_name,
        index,
        seed,
        run.info.run_id,
        settings,
        metrics,
        queries.test_predictions(store, run.info.run_id),
    )


def pending_config(unit: Pending, data_root: Path, overrides: list[str]) -> tuple[Config, str]:
    """A pending GARLIC unit's config (its preset's, on its protocol, with its seed) and its data's digest."""
    config = preset_config(unit.preset, unit.dataset, overrides).override(
        {"split_protocol": unit.protocol, "seed": unit.seed}
    )
    return config, run_contract.manifest_digest(read_manifest(ensure_processed(unit.dataset, data_root)))


def interrupted_pending(unit: Pending, store: Path, data_root: Path, overrides: list[str]) -> str | None:
    """``queries.interrupted_unit`` of a pending unit in ``store`` (None while the store has no database yet)."""
    if not queries.has_database(store):
        return None
    config, digest = pending_config(unit, data_root, overrides)
    return queries.interrupted_unit(store, config, f"{unit.protocol}/split_{unit.split}", digest)


def unit_lock(store: Path, preset: str, protocol_name: str, split: int, seed: int) -> Path:
    """The lock a process holds while it trains the unit into ``store``, so that no other process trains it too."""
    locks = Path(store) / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    return locks / f"unit-{preset}-{protocol_name}-split_{split}-seed_{seed}"


def train_in_workers(
    pending: list[Pending],
    workers: int,
    store: Path,
    data_root: Path,
    overrides: list[str],
    minutes: float | None = None,
    carry: Path | None = None,
    archives: dict[str, RunArchive] | None = None,
) -> None:
    """Train ``pending`` in ``workers`` parallel ``garlic train`` processes (``garlic.training.workers``: the CPU threads
    shared out evenly, each unit claimed by its ``unit_lock``, output in ``store/logs/``), all into ``store``, each
    carrying its training state in ``carry`` (``garlic train --carry``). A unit is kept in its dataset's run archive
    (``archives``) as soon as its process ends, while the others train. A unit whose process fails is reported and
    stays missing; after ``minutes`` (``--deadline``) no unit starts any more and the running ones are stopped, their
    runs FAILED, to be resumed by a later call."""
    jobs, by_name = [], {str(unit): unit for unit in pending}
    for unit in pending:
        settings = [item for value in [*overrides, f"seed={unit.seed}"] for item in ("--set", value)]
        interrupted = interrupted_pending(unit, store, data_root, overrides)
        command = [sys.executable, "-m", "garlic.cli", "--data-root", str(data_root), "--mlruns", str(store), "train"]
        if interrupted is not None:  # a run stopped half-way (its machine gone) goes on from its last epoch
            command += ["--resume", interrupted]
        else:
            command += [
                "--config",
                str(CONFIG_DIR / f"{unit.preset}.json"),
                "--dataset",
                unit.dataset,
                "--protocol",
                unit.protocol,
                "--split",
                str(unit.split),
                *settings,
            ]
        if carry is not None:
            command += ["--carry", str(carry)]
        log_name = f"{unit.preset}-{unit.protocol}-split_{unit.split}-seed_{unit.seed}.log"
        jobs.append(
            Job(
                str(unit),
                command,
                unit_lock(store, unit.preset, unit.protocol, unit.split, unit.seed),
                Path(store) / "logs" / log_name,
            )
        )
    use_store(store)  # made once, here, rather than by the first worker while the deadline's clock runs

    def keep(job: Job) -> None:
        unit = by_name[job.name]
        archive = (archives or {}).get(unit.dataset)
        if archive is None:
            return
        config, digest = pending_config(unit, data_root, overrides)
        found = finished_preset([store], config, f"{unit.protocol}/split_{unit.split}", digest)
        if found is not None:
            archive.keep(
                [
                    finished_unit(
                        unit.preset, unit.protocol, unit.split, unit.seed, queries.config_digest(config), *found
                    )
                ]
            )

    run_jobs(jobs, workers, minutes, keep)


def baseline_units(
    methods: list[str],
    dataset: str,
    protocol_name: str,
    stores: list[Path],
    data_root: Path,
    overrides: list[str],
    archive: RunArchive | None = None,
    train: bool = True,
    carry: Path | None = None,
    splits: list[int] | None = None,
) -> tuple[list[Unit], list[Pending]]:
    """The registered methods on the protocol's splits (one unit per split, whatever the protocol's seeds): a split's
    unit kept in ``archive`` is read from it, else its finished run in any experiment of ``stores`` (found by its
    identity: the table's, ``garlic train --method``'s or a study's) is gathered, else, with ``train``, it runs in
    the first store's experiment of the dataset (``studies.Baselines``; carrying its training state in ``carry``;
    only the splits of ``splits`` when given); returns the units and the method and split of each that has none."""
    if not methods:
        return [], []
    config = Config.for_dataset(dataset).override([*overrides, f"split_protocol={protocol_name}"])
    cohort = studies.load_cohort(dataset, data_root, protocol_name, None)
    runner = studies.Baselines(config, cohort, data_root, stores[0], carry)
    units, available = [], runner.available(methods)

    def gather(unit: Unit) -> None:
        units.append(unit)
        if archive is not None:  # now, not after the call's last unit: the machine may not last that long
            archive.keep([unit])

    for method in available:
        for split in cohort.splits:
            unit = runner.unit(method, split)
            kept = None if archive is None else archive.find(method, protocol_name, split.index, None, unit.settings)
            if kept is not None:
                units.append(kept)
            elif (found := queries.finished_unit_run(stores, unit)) is not None:
                gather(finished_unit(method, protocol_name, split.index, None, unit.settings, *found))
    held = {(unit.method, unit.split) for unit in units}
    to_run = [
        (method, split)
        for method in available
        for split in cohort.splits
        if (method, split.index) not in held and (splits is None or split.index in splits)
    ]
    if train and to_run:
        use_store(stores[0])
        skip = {(method, split.index) for method in methods for split in cohort.splits} - {
            (method, split.index) for method, split in to_run
        }

        def trained(record: dict) -> None:
            settings = queries.settings_digest(runner.settings(record["method"]))
            predictions = queries.test_predictions(stores[0], record["run_id"])
            metrics = {metric: record[f"test_{metric}"] for metric in METRICS}
            gather(
                Unit(
                    record["method"],
                    protocol_name,
                    record["split"],
                    None,
                    record["run_id"],
                    settings,
                    metrics,
                    predictions,
                )
            )

        runner.run(list(dict.fromkeys(method for method, _ in to_run)), True, skip=skip, finished=trained)
    done = {(unit.method, unit.split) for unit in units}
    missing = [
        Pending(method, protocol_name, split.index, None)
        for method in available
        for split in cohort.splits
        if (method, split.index) not in done
    ]
    order = {method: position for position, method in enumerate(methods)}
    return sorted(units, key=lambda unit: (order[unit.method], unit.split)), missing
