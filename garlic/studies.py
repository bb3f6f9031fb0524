"""What the studies (fidelity, ablations, baselines, the comparison table) share around
``garlic.evaluation.fit_and_test`` (the one path that fits, selects, tests and logs a method on a split): the common
arguments, the cohort and its splits, resumable MLflow runs, mean +/- std tables, the queries that find a GARLIC
unit's runs in the stores (``finished_unit``, ``interrupted_unit``, ``stored_runs``) and the registered methods on a
cohort's splits (``Baselines``). The scripts of ``experiments/`` import it, never one another.

Resuming: every unit of work (one condition on one split) is an MLflow run tagged with what identifies it (study,
condition, split, ... and a digest of its settings). Before a unit runs, the experiment is searched for a FINISHED
run with the same tags; if there is one, its metrics are reused and nothing is retrained. A crashed or interrupted
run is left FAILED/RUNNING and so is redone.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import pandas as pd  # noqa: E402

import pyarrow.parquet as pq  # noqa: E402

from garlic.config import CONFIG_DIR, Config  # noqa: E402
from garlic.data.datasets import DATASETS, DEFAULT_DATA_ROOT, ensure_processed, processed_folder  # noqa: E402
from garlic.data.splits import Split, chosen_splits, load_splits, protocol  # noqa: E402
from garlic.evaluation.fit_and_test import TEST_METRICS, fit_and_test, split_parts  # noqa: E402
from garlic.methods import registry  # noqa: E402
from garlic.methods.contract import Method  # noqa: E402
from garlic.metrics import METRICS  # noqa: E402
from garlic.tracking import run_contract  # noqa: E402
from garlic.tracking.store import DEFAULT_STORE, use_experiment, use_store  # noqa: E402
from garlic.tracking.archive import (check_probabilities, check_unique, dataset_outcomes, read_risks,  # noqa: E402
                                     write_risks)
from garlic.evaluation.stats import mean_std  # noqa: E402
from garlic.io.tables import LABELS, read_manifest  # noqa: E402
from garlic.io.tensors import IrregularTensors, load_tensors  # noqa: E402

log = logging.getLogger("experiments")


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", choices=DATASETS, default="synthetic")
    parser.add_argument("--splits", type=int, nargs="+", metavar="K", help="split indices (default: all five)")
    parser.add_argument("--preset", help="a shipped preset (garlic/configs/NAME.json; default: the dataset's)")
    parser.add_argument("--max-epochs", type=int, help="cap on training epochs, for quick looks")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT, help="where processed datasets live")
    parser.add_argument("--mlruns", type=Path, default=DEFAULT_STORE, help="the local MLflow store")
    parser.add_argument("--out", type=Path, help="also write the final tables (CSV, Markdown) into this folder")
    parser.add_argument("-v", "--verbose", action="store_true")


def preset_config(name: str, dataset: str, overrides: list[str]) -> Config:
    """The shipped preset ``garlic/configs/NAME.json`` for ``dataset``, ``overrides`` applied; a preset made for
    another dataset is refused."""
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
        raise ValueError(f"no preset {name!r} in {CONFIG_DIR}; known: {known}")
    config = Config.load(path, dataset=dataset).override(overrides)
    named = json.loads(path.read_text()).get("dataset", Config().dataset)
    if named not in (dataset, dataset.partition("-")[0]):  # a source's preset (physionet2019) fits all its cohorts
        raise ValueError(f"preset {name!r} is for dataset {named!r}, not {dataset!r}")
    return config


def study_config(args: argparse.Namespace) -> Config:
    """``--preset`` (default: the dataset's own config) with ``--set``, ``--max-epochs`` and ``--device`` applied."""
    overrides = [*args.set]
    if args.max_epochs is not None:
        overrides.append(f"max_epochs={args.max_epochs}")
    if args.device:
        overrides.append(f"device={args.device}")
    if args.preset:
        return preset_config(args.preset, args.dataset, overrides)
    return Config.for_dataset(args.dataset).override([f"dataset={args.dataset}", *overrides])


@dataclass
class Cohort:
    tensors: IrregularTensors
    splits: list[Split]  # the chosen ones, read from the saved split files
    planted: list[dict] | None  # the synthetic cohort's planted graph


def load_cohort(dataset: str, data_root: Path, protocol: str, indices: list[int] | None) -> Cohort:
    folder = ensure_processed(dataset, data_root)
    tensors = load_tensors(folder)
    splits = load_splits(folder, tensors, protocol, dataset)
    indices = list(range(len(splits))) if indices is None else indices
    return Cohort(tensors, chosen_splits(splits, indices, protocol), read_manifest(folder).get("ground_truth_graph"))


def open_experiment(name: str, store: Path) -> str:
    use_store(store)
    return use_experiment(name, store)


def existing_experiment(name: str, store: Path) -> str | None:
    """The id of experiment ``name`` in ``store``, or None where it has none (nothing is created: a store read only
    for its runs is left as it was)."""
    use_store(store)
    experiment = mlflow.MlflowClient().get_experiment_by_name(name)
    return None if experiment is None else experiment.experiment_id


def test_predictions(store: Path, run_id: str) -> pd.DataFrame:
    """The test predictions (``stay_id, label, risk``) a run logged (``garlic.evaluation.fit_and_test.fit_and_test``)."""
    use_store(store)
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=run_contract.predictions("test"))
    return pd.read_csv(local)


# How a study reads a run's test predictions (``stay_id, label, risk``) by its run id.
Predictions = Callable[[str], pd.DataFrame]


class StudyArchive:
    """A study's runs kept beside its tables (``--out``), so that the tables can be made again without the MLflow store
    that trained them: a store lives on one machine, the repository outlives it.

    - ``<out>/<runs_table>.csv``: the study's table of every run, which it writes anyway, with each run's
      ``settings`` digest and the processed data's ``data_digest`` (``run_contract.manifest_digest``): a run made with
      other settings or on other data is never read back;
    - ``<out>/risks/<run_id>.csv.gz``: the run's test risks, ``stay_id, risk``. No outcomes: they stay in the dataset
      and are joined back from its label table.

    Without a folder (no ``--out``) it keeps nothing and every prediction comes from the store.
    """

    def __init__(self, folder: Path | None, runs_table: str, dataset: str, data_root: Path):
        self.folder = None if folder is None else Path(folder)
        self.data_digest, self.labels = dataset_outcomes(dataset, data_root)
        runs_path = None if self.folder is None else self.folder / f"{runs_table}.csv"
        # read once: the study writes its runs table only after every lookup
        runs = pd.DataFrame()
        if runs_path is not None and runs_path.is_file():
            runs = pd.read_csv(runs_path, dtype={"run_id": str, "settings": str, "data_digest": str},
                               skip_blank_lines=False)  # fmt: skip
            # checked as the comparison's archive is (``garlic.tracking.archive``): a run counted twice or a test
            # metric that is no probability would make wrong tables
            if "run_id" in runs:
                check_unique(runs_path, runs, ["run_id"])
            check_probabilities(runs_path, runs, [f"test_{name}" for name in METRICS if f"test_{name}" in runs])
        self._archived = runs if {"settings", "data_digest"} <= set(runs.columns) else pd.DataFrame()

    def archived(self) -> pd.DataFrame:
        """Every archived run (none without a folder, or in a table older than the archive)."""
        return self._archived

    def runs(self) -> pd.DataFrame:
        """The archived runs made on this data."""
        runs = self.archived()
        return runs if runs.empty else runs[runs["data_digest"] == self.data_digest].reset_index(drop=True)

    def predictions(self, store: Path, run_id: str) -> pd.DataFrame:
        """A run's test predictions (``stay_id, label, risk``) as the archive keeps them, taken from the store into it
        the first time; from the store alone without a folder."""
        if self.folder is None:
            return test_predictions(store, run_id)
        path = self.folder / "risks" / f"{run_id}.csv.gz"
        if not path.is_file():
            write_risks(path, test_predictions(store, run_id))
        # always what the archive holds, so that a table made from the store equals the one made from the archive
        return read_risks(path, self.labels)

    def find(self, **unit) -> dict | None:
        """The archived run of ``unit`` (its identifying columns, ``settings`` among them), or None."""
        runs = self.runs()
        if runs.empty or not set(unit) <= set(runs.columns):
            return None
        found = runs[(runs[list(unit)] == pd.Series(unit)).all(axis=1)]
        return None if found.empty else found.iloc[-1].drop("data_digest").dropna().to_dict()

    def runs_table(self, records: pd.DataFrame, unit: list[str]) -> pd.DataFrame:
        """The runs table to write: ``records`` with the data digest they were made on, after the archived runs of
        other units (``unit``: the columns that identify one; on other data too), which a narrower call must not
        drop."""
        records = records.assign(data_digest=self.data_digest)
        runs = self.archived()
        if runs.empty:
            return records
        others = runs.merge(records[unit].drop_duplicates(), on=unit, how="left", indicator=True)
        others = others[others["_merge"] == "left_only"].drop(columns="_merge")
        return pd.concat([others, records], ignore_index=True)


def settings_digest(settings: dict) -> str:
    """A short digest of the settings a result depends on, so that changed settings are never mistaken for done.

    Where a unit was trained does not change what it is: a ``device`` counts as the default one, so that a unit
    trained on a GPU is found by the same command on a CPU (and units archived before keep their digests)."""
    if "device" in settings:
        settings = settings | {"device": Config.device}
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def finished_run(experiment_id: str, tags: dict[str, str]) -> mlflow.entities.Run | None:
    """The newest FINISHED run of the experiment carrying all of ``tags``, or None."""
    conditions = [f"tags.{key} = '{value}'" for key, value in tags.items()] + ["attributes.status = 'FINISHED'"]
    found = mlflow.search_runs(experiment_ids=[experiment_id], filter_string=" and ".join(conditions),
                               order_by=["attributes.start_time DESC"], max_results=1,
                               output_format="list")  # fmt: skip
    return found[0] if found else None


def resumable(
    experiment_id: str, tags: dict, run_name: str, work: Callable[[], dict[str, float]]
) -> tuple[dict[str, float], str, bool]:
    """Run ``work`` inside a new MLflow run of the experiment, tagged ``tags``, unless a finished one exists.

    Returns (metrics, run id, reused). ``work`` logs what it likes, its metrics included (as
    ``garlic.evaluation.fit_and_test.fit_and_test`` does), and returns the metrics to report.
    """
    tags = {key: str(value) for key, value in tags.items()}
    found = finished_run(experiment_id, tags)
    if found is not None:
        log.info("reusing finished run %s (%s)", found.info.run_id, run_name)
        return dict(found.data.metrics), found.info.run_id, True
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags) as run:
        metrics = work()
    return metrics, run.info.run_id, False


def results_table(records: pd.DataFrame, by: list[str], metrics=TEST_METRICS) -> pd.DataFrame:
    """Mean +/- std over splits of each metric, one row per ``by`` group (in first-seen order), with split counts."""
    rows = []
    for key, group in records.groupby(by, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key)) | {"splits": len(group)}
        row |= {metric.removeprefix("test_"): mean_std(group[metric]) for metric in metrics if metric in group}
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    """A pipe table (pandas' own ``to_markdown`` needs an extra package)."""
    cells = table.astype(object).where(table.notna(), "").astype(str)
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(row) + " |" for row in cells.to_numpy().tolist()]
    return "\n".join(lines)


def log_summary(
    experiment_id: str, name: str, tables: dict[str, pd.DataFrame], figures: dict[str, plt.Figure], tags: dict
) -> str:
    """A summary run holding the final tables (CSV and Markdown) and figures; returns its run id."""
    tags = {key: str(value) for key, value in tags.items()}
    with mlflow.start_run(experiment_id=experiment_id, run_name=name, tags=tags) as run:
        for table_name, table in tables.items():
            mlflow.log_text(table.to_csv(index=False), f"{table_name}.csv")
            mlflow.log_text(markdown(table), f"{table_name}.md")
        for figure_name, figure in figures.items():
            mlflow.log_figure(figure, figure_name)
            plt.close(figure)
    return run.info.run_id


def write_tables(folder: Path | None, tables: dict[str, pd.DataFrame]) -> None:
    """Also keep the tables as plain files (optional ``--out``)."""
    if folder is None:
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for table_name, table in tables.items():
        table.to_csv(folder / f"{table_name}.csv", index=False)
        (folder / f"{table_name}.md").write_text(markdown(table) + "\n")


# Run queries: which runs of a store are a GARLIC unit's (a preset on a split and seed, on the same data).
IGNORED_PARAMS = {"device"}  # where a run was trained does not change what it is
# Config keys added after units were archived, with the value that trains as before: at that value they stay out of
# the settings digest, so that the archived units of unchanged presets are still found.
LATER_KEYS = {"lr_schedule": "plateau"}



def matches(params: dict[str, str], config: Config) -> bool:
    """Whether a run's logged params are ``config`` (keys the run predates must be at their default)."""
    defaults = Config().to_dict()
    for key, value in config.to_dict().items():
        if key in IGNORED_PARAMS:
            continue
        if key not in params:
            if value != defaults[key]:
                return False
        elif params[key] != str(value):
            return False
    return True


def unit_runs(store: Path, config: Config, split_name: str, data_digest: str, finished: bool) -> list:
    """GARLIC's runs of ``config`` on ``split_name`` of the data ``data_digest`` in ``store``, the newest first: the
    FINISHED ones, or (``finished`` False) those that stopped before the end."""
    if not (Path(store) / "mlflow.db").is_file():
        return []
    use_store(store)
    status = "=" if finished else "!="
    query = (f"params.split = '{split_name}' and params.{run_contract.DATA_DIGEST} = '{data_digest}' "
             f"and params.seed = '{config.seed}' and attributes.status {status} 'FINISHED'")  # fmt: skip
    found = mlflow.search_runs(search_all_experiments=True, filter_string=query, output_format="list",
                               order_by=["attributes.start_time DESC"])  # fmt: skip
    # a run tagged with a method is another method's (garlic train --method), not GARLIC's
    return [run for run in found if run_contract.METHOD not in run.data.tags and matches(run.data.params, config)]


def interrupted_unit(store: Path, config: Config, split_name: str, data_digest: str) -> str | None:
    """The newest run of ``config`` on ``split_name`` in ``store`` that stopped before it finished (killed, failed,
    or left RUNNING by a process that died with its machine) and kept its training state, to be resumed where it
    stopped rather than trained from its first epoch; None when there is none."""
    for run in unit_runs(store, config, split_name, data_digest, finished=False):
        if ("mlflow.parentRunId" not in run.data.tags
                and run_contract.training_state_path(store, run.info.run_id).is_file()):  # fmt: skip
            return run.info.run_id
    return None


def finished_unit(
    stores: list[Path], config: Config, split_name: str, data_digest: str
) -> tuple[Path, mlflow.entities.Run] | None:
    """A FINISHED split run of ``config`` on ``split_name`` of the data ``data_digest`` in any of ``stores`` (the
    newest), or None."""
    for store in stores:
        for run in unit_runs(store, config, split_name, data_digest, finished=True):
            if "test_auroc" in run.data.metrics:
                return Path(store), run
    return None


def model_seeds(protocol_name: str, config: Config, seeds: list[int] | None = None) -> tuple[int, ...]:
    """The model seeds a preset trains on each split of the protocol: ``seeds`` if given, else the protocol's, else
    the config's one."""
    return tuple(seeds or protocol(protocol_name).seeds or (config.seed,))


def stored_runs(name: str, dataset: str, protocol_name: str, stores: list[Path],
                data_root: Path) -> list[tuple[int, int, Path, mlflow.entities.Run]]:  # fmt: skip
    """(split, seed, store, run) of every finished run of preset ``name`` on the protocol's splits and seeds that
    ``stores`` hold, found as the table finds them: for the studies that read the trained models."""
    config = preset_config(name, dataset, [])
    chosen = protocol(protocol_name)
    digest = run_contract.manifest_digest(read_manifest(ensure_processed(dataset, data_root)))
    found = []
    for index in chosen.splits:
        for seed in model_seeds(protocol_name, config):
            unit = config.override({"split_protocol": protocol_name, "seed": seed})
            held = finished_unit(stores, unit, f"{protocol_name}/split_{index}", digest)
            if held is not None:
                found.append((index, seed, *held))
    return found


def config_digest(config: Config) -> str:
    """The settings digest of a GARLIC config (``settings_digest``), as the run archive keys its units: keys that
    do not change what a run is (``IGNORED_PARAMS``) and later keys at their old value (``LATER_KEYS``) left out."""
    settings = config.to_dict().items()
    return settings_digest({k: v for k, v in settings
                                  if k not in IGNORED_PARAMS and not (k in LATER_KEYS and LATER_KEYS[k] == v)})


BASELINE_STUDY = "baseline"  # the study tag of ``Baselines``' runs


class Baselines:
    """The registered methods (``garlic.methods.registry``) on a cohort's splits, each unit a resumable MLflow run."""

    def __init__(self, config: Config, cohort: Cohort, experiment_id: str, data_root):
        self.config, self.cohort, self.experiment_id = config, cohort, experiment_id
        folder = processed_folder(config.dataset, data_root)
        self.context = registry.MethodContext(config, pq.read_table(folder / LABELS).to_pandas())
        self.data_digest = run_contract.manifest_digest(read_manifest(folder))  # a run on other data is never reused

    def available(self, methods: list[str]) -> list[str]:
        """``methods`` less those the dataset cannot feed (the severity scores: only PhysioNet 2012 ships them)."""
        missing = [m for m in methods if not registry.method(m).available(self.context.labels)]
        if missing:
            logging.getLogger("experiments").warning("%s has no column for %s; skipped", self.config.dataset, missing)
        return [m for m in methods if m not in missing]

    def settings(self, method: str) -> dict:
        return registry.method(method).settings(self.context)

    def method(self, name: str) -> Method:
        """A fresh, unfitted ``name`` (a method of ``garlic.evaluation.fit_and_test``)."""
        return registry.method(name).create(self.context)

    def run(self, methods: list[str], train: bool = True, skip: set[tuple[str, int]] = frozenset()) -> pd.DataFrame:
        """One record per method and split: reused from a finished run of the experiment, else fitted and tested
        (with ``train`` False, left out); a (method, split index) in ``skip`` (found elsewhere) is left out."""
        records = []
        for method in self.available(methods):
            for split in self.cohort.splits:
                if (method, split.index) in skip:
                    continue
                def work(method=method, split=split) -> dict[str, float]:
                    mlflow.log_params(self.settings(method) | {"split_name": split.name})
                    return fit_and_test(self.method(method), split_parts(self.cohort.tensors, split))

                tags = {"study": BASELINE_STUDY, "dataset": self.config.dataset, "data_digest": self.data_digest,
                        "method": method, "split": split.name,
                        "settings": settings_digest(self.settings(method))}  # fmt: skip
                if not train and finished_run(self.experiment_id, tags) is None:
                    continue
                metrics, run_id, _ = resumable(self.experiment_id, tags, f"{method}/split_{split.index}", work)
                records.append({"method": method, "split": split.index, "run_id": run_id, **metrics})
        return pd.DataFrame(records)
