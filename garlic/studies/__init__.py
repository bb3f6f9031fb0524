"""What the studies (fidelity, ablations, baselines, the comparison table) share around
``garlic.evaluation.fit_and_test`` (the one path that fits, selects, tests and logs a method on a split): the common
arguments, the presets, the cohort and its splits, resumable MLflow runs, mean +/- std tables and the registered
methods on a cohort's splits (``Baselines``). Which runs the stores hold is asked of ``garlic.tracking.queries``, and
the runs kept beside the tables are ``garlic.tracking.archive``'s. The comparison table is this package's too:
``comparison`` (the table, its paired differences and report) made from the units ``comparison_units`` gathers or
trains. The scripts of ``experiments/`` import it, never one another.

Resuming: every unit of work is an MLflow run tagged with what identifies it: a registered method's unit with its
``run_contract.UnitIdentity`` (``Baselines``, through ``runs.run_unit``, found in any experiment of the store), a
study's own unit (one condition on one split) with the study's tags (``resumable``, found in the study's experiment).
Before a unit runs, a FINISHED run with the same tags is looked for; if there is one, its metrics are reused and
nothing is retrained. A crashed or interrupted run is left FAILED/RUNNING; a method that resumes
(``contract.can_resume``) saved the state of its fit under the store as it trained (``runs.fit_and_test_resuming``),
and the unit goes on from that state in its own run; any other is redone.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import pandas as pd  # noqa: E402

import pyarrow.parquet as pq  # noqa: E402

from garlic.config import CONFIG_DIR, Config  # noqa: E402
from garlic.data.datasets import DEFAULT_DATA_ROOT, dataset_name, ensure_processed, processed_folder  # noqa: E402
from garlic.data.splits import Split, chosen_splits, load_splits  # noqa: E402
from garlic.evaluation.fit_and_test import TEST_METRICS, split_parts  # noqa: E402
from garlic.methods import registry  # noqa: E402
from garlic import runs  # noqa: E402
from garlic.methods.contract import Method  # noqa: E402
from garlic.tracking import carry, queries, run_contract  # noqa: E402
from garlic.tracking.archive import RunArchive, study_archive  # noqa: E402
from garlic.tracking.queries import finished_run, interrupted_run, stored_runs  # noqa: E402
from garlic.tracking.store import DEFAULT_STORE, use_experiment, use_store  # noqa: E402
from garlic.evaluation.stats import mean_std  # noqa: E402
from garlic.training.workers import add_worker_arguments, check_worker_arguments, die_with_parent  # noqa: E402
from garlic.io.tables import LABELS, check_binary, read_manifest  # noqa: E402
from garlic.io.tensors import IrregularTensors, load_tensors  # noqa: E402

log = logging.getLogger("experiments")


def folder(text: str) -> Path:
    """An argument naming a folder, made later if absent: one that names a file is refused by the parser, in one
    line, where every later step would fail deep inside with a traceback."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a file, not a folder")
    return path


def count(text: str) -> int:
    """An argument that counts from 0: a split index, a model seed."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", type=dataset_name, default="synthetic")
    parser.add_argument("--splits", type=count, nargs="+", metavar="K", help="split indices (default: all five)")
    parser.add_argument("--preset", help="a shipped preset (garlic/configs/NAME.json; default: the dataset's)")
    parser.add_argument("--max-epochs", type=int, help="cap on training epochs, for quick looks")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--data-root", type=folder, default=DEFAULT_DATA_ROOT, help="where processed datasets live")
    parser.add_argument("--mlruns", type=folder, default=DEFAULT_STORE, help="the local MLflow store")
    parser.add_argument("--out", type=folder, help="also write the final tables (CSV, Markdown) into this folder")
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


def add_preset_runs_arguments(parser: argparse.ArgumentParser, reads: str) -> None:
    """The arguments of a study of the finished GARLIC runs of one preset on one protocol (``preset_runs``); ``reads``
    says what of them it reads ("runs", "runs' models")."""
    parser.add_argument("--dataset", type=dataset_name, required=True)
    parser.add_argument("--protocol", required=True)
    parser.add_argument("--preset", required=True, help=f"the GARLIC preset whose {reads} are read")
    parser.add_argument("--mlruns", type=folder, nargs="+", required=True, help="the stores holding the runs")
    parser.add_argument("--data-root", type=folder, default=DEFAULT_DATA_ROOT)


def preset_runs(args: argparse.Namespace) -> list[tuple[int, int, Path, mlflow.entities.Run]]:
    """(split, seed, store, run) of every finished run of ``--preset`` on ``--protocol`` in the ``--mlruns`` stores
    (``add_preset_runs_arguments``); none is an error naming them."""
    found = stored_runs(preset_config(args.preset, args.dataset, []), args.protocol, args.mlruns, args.data_root)
    if not found:
        raise SystemExit(
            f"no finished run of {args.preset} on {args.protocol} ({args.dataset}) in "
            f"{', '.join(map(str, args.mlruns))}"
        )
    return found


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
    manifest = read_manifest(folder)
    check_binary(manifest, dataset)
    tensors = load_tensors(folder)
    splits = load_splits(folder, tensors, protocol, dataset)
    indices = list(range(len(splits))) if indices is None else indices
    return Cohort(tensors, chosen_splits(splits, indices, protocol), manifest.get("ground_truth_graph"))


def open_experiment(name: str, store: Path) -> str:
    use_store(store)
    return use_experiment(name, store)


def add_worker_study_arguments(parser: argparse.ArgumentParser, units: str) -> None:
    """A study's ``--workers`` and ``--deadline`` (``garlic.training.workers``), and the hidden ``--train-only`` its
    worker processes run with: their units, no tables."""
    add_worker_arguments(parser, units)
    parser.add_argument("--train-only", action="store_true", help=argparse.SUPPRESS)


def add_carry_argument(parser: argparse.ArgumentParser) -> None:
    """``--carry DIR`` (``garlic.tracking.carry``), for a command that trains units, in its process or its workers'."""
    parser.add_argument(
        "--carry",
        type=Path,
        metavar="DIR",
        help="also keep each unfinished unit's training state in this folder, beyond the store, and "
        "go on from it in a store that has none (storage that outlives the store's machine)",
    )


def check_carry_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a ``--carry`` that is a file."""
    try:
        carry.check_folder(args.carry)
    except ValueError as refused:
        parser.error(str(refused))


class StudyStart(NamedTuple):
    config: Config
    cohort: Cohort
    experiment_id: str
    archive: RunArchive


def start_study(
    parser: argparse.ArgumentParser, args: argparse.Namespace, experiment: str, runs_table: str
) -> StudyStart:
    """What a study that trains in workers (``add_worker_study_arguments``) starts from, once ``args`` are checked:
    its config, cohort, MLflow experiment (``experiment-DATASET``) and the archive of its runs table. A worker
    (``--train-only``) dies with its parent."""
    check_worker_arguments(parser, args, worker=args.train_only)
    if args.train_only:
        die_with_parent()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    config = study_config(args)
    return StudyStart(
        config,
        load_cohort(args.dataset, args.data_root, config.split_protocol, args.splits),
        open_experiment(f"{experiment}-{args.dataset}", args.mlruns),
        study_archive(args.out, runs_table, args.dataset, args.data_root),
    )


# How a study reads a run's test predictions (``stay_id, label, risk``) by its run id.
Predictions = Callable[[str], pd.DataFrame]


def resumable(
    experiment_id: str, tags: dict, run_name: str, work: Callable[[], dict[str, float]], store: Path | None = None
) -> tuple[dict[str, float], str, bool]:
    """A study's own unit (an ablation's variant, a fidelity condition), found in its experiment by ``tags``: its
    finished run reused, else ``work`` run inside the run of those tags that stopped with a training state in
    ``store`` (``queries.interrupted_run``), else in a new run tagged ``tags`` (``runs.resumable_run``).

    Returns (metrics, run id, reused). ``work`` logs what it likes, its metrics included (as
    ``garlic.evaluation.fit_and_test.fit_and_test`` does), and returns the metrics to report.
    """
    tags = {key: str(value) for key, value in tags.items()}
    return runs.resumable_run(
        finished_run(experiment_id, tags),
        None if store is None else interrupted_run(experiment_id, tags, store),
        {"experiment_id": experiment_id, "run_name": run_name, "tags": tags},
        work,
        store,
    )


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


BASELINE_STUDY = "baseline"  # the study tag of the baselines' summary run


class Baselines:
    """The registered methods (``garlic.methods.registry``) on a cohort's splits, each unit a resumable MLflow run
    (``runs.run_unit``), found by its identity in any experiment of the store, and trained into the dataset's
    experiment, where ``garlic train`` puts its runs too."""

    def __init__(self, config: Config, cohort: Cohort, data_root, store: Path, carried: Path | None = None):
        """``store``: the MLflow store the units' runs and training states are kept in; ``carried``, a folder where
        the states are also carried beyond it (``garlic.tracking.carry``)."""
        self.config, self.cohort, self.store, self.carried = config, cohort, Path(store), carried
        self.experiment_id = open_experiment(config.dataset, store)
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

    def unit(self, method: str, split: Split) -> run_contract.UnitIdentity:
        """The unit of ``method`` on ``split`` (``runs.unit_identity``)."""
        return runs.unit_identity(registry.method(method), self.context, split.name, self.data_digest)

    def method(self, name: str) -> Method:
        """A fresh, unfitted ``name`` (a method of ``garlic.evaluation.fit_and_test``)."""
        return registry.method(name).create(self.context)

    def run(
        self,
        methods: list[str],
        train: bool = True,
        skip: set[tuple[str, int]] = frozenset(),
        finished: Callable[[dict], None] | None = None,
    ) -> pd.DataFrame:
        """One record per method and split: reused from a finished run of the store, else fitted and tested
        (with ``train`` False, left out); a (method, split index) in ``skip`` (found elsewhere) is left out. Each
        record is also given to ``finished`` as soon as it is made (e.g. to archive it before the next is trained)."""
        records = []
        for method in self.available(methods):
            for split in self.cohort.splits:
                if (method, split.index) in skip:
                    continue

                unit = self.unit(method, split)

                def work(method=method, split=split, unit=unit) -> dict[str, float]:
                    mlflow.log_params(self.settings(method) | {"split_name": split.name})
                    return runs.fit_and_test_resuming(
                        self.method(method),
                        split_parts(self.cohort.tensors, split),
                        self.config,
                        self.store,
                        carry.unit_state(self.carried, unit),
                    )

                if not train and queries.finished_unit_run([self.store], unit) is None:
                    continue
                metrics, run_id, _ = runs.run_unit(
                    unit, self.experiment_id, f"{method}/split_{split.index}", work, self.store
                )
                records.append({"method": method, "split": split.index, "run_id": run_id, **metrics})
                if finished is not None:
                    finished(records[-1])
        return pd.DataFrame(records)
