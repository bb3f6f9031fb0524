"""Runs kept beside the tables and studies they make, so that those can be made again without the MLflow stores
that trained them: a store lives on one machine, the repository outlives it. One class, ``RunArchive``, in two
layouts (``Layout``):

- a table's (``TABLE``, ``garlic.studies.comparison``; ``open_archive``), under ``docs/results/<dataset>-runs/``:
  ``runs.csv``, one row per unit, ``method, protocol, split, seed, run_id, settings, data_digest, auroc, auprc,
  brier, ece`` (test metrics; ``seed`` empty for a deterministic baseline); the unit's test risks in
  ``<method>/<protocol>-split_<k>[-seed_<s>].csv.gz``;
- a study's (``study_layout``: ablations, fidelity; ``study_archive``), under the study's ``--out``: its table of
  every run ``<name>.csv``, which the study writes anyway (``RunArchive.runs_table``), and each run's test risks in
  ``risks/<run_id>.csv.gz``.

``settings`` is a digest of what the unit was trained with and ``data_digest`` the processed data's
(``run_contract.manifest_digest``): a unit made with other settings or on other data is never read back. Risks are
kept as ``stay_id, risk``, without outcomes: they stay in the dataset and are joined back from its label table when
a unit is read.

Every file is written atomically (``garlic.io.atomic``): a killed write leaves the previous record whole. Every
file is checked as it is read (``DamagedArchiveError``): a risk or a metric that is not a number in [0, 1], a stay
repeated in a risks file or a unit repeated in a runs table is refused, naming the file and line, rather than read
into a wrong table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from garlic.data.datasets import ensure_processed
from garlic.io.atomic import atomic_file
from garlic.io.locks import locked
from garlic.io.tables import LABELS, read_manifest
from garlic.metrics import METRICS
from garlic.tracking import run_contract
from garlic.tracking.queries import test_predictions

RUNS = "runs.csv"
RUN_COLUMNS = ["method", "protocol", "split", "seed", "run_id", "settings", "data_digest", *METRICS]
GZIP = {"method": "gzip", "mtime": 0}  # the same risks give the same bytes, so git sees no change


class DamagedArchiveError(ValueError):
    """A file of a run archive that does not hold what it must: refused, rather than read into wrong numbers."""


def _line(position: int) -> int:
    """The line of a CSV file holding row ``position`` (the header is line 1; read with ``skip_blank_lines=False``,
    so that the count holds)."""
    return position + 2


def check_probabilities(path: Path, table: pd.DataFrame, columns) -> None:
    """Refuse a value of ``columns`` that is not a number in [0, 1] (NaN, infinite, text, out of range)."""
    for column in columns:
        outside = ~pd.to_numeric(table[column], errors="coerce").between(0, 1)
        if outside.any():
            position = int(np.flatnonzero(outside.to_numpy())[0])
            raise DamagedArchiveError(
                f"{path}, line {_line(position)}: {column} {table[column].iloc[position]} is not a number in [0, 1]"
            )


def check_unique(path: Path, table: pd.DataFrame, key: list[str]) -> None:
    """Refuse a row repeating the ``key`` of an earlier one: it would be counted twice."""
    repeats = table.duplicated(key)
    if repeats.any():
        position = int(np.flatnonzero(repeats.to_numpy())[0])
        groups = table.groupby(key, dropna=False, sort=False).ngroup().to_numpy()  # a baseline's seed is NA
        first = int(np.flatnonzero(groups == groups[position])[0])
        named = ", ".join(f"{column} {table[column].iloc[position]}" for column in key)
        raise DamagedArchiveError(f"{path}, line {_line(position)} repeats line {_line(first)} ({named})")


@dataclass
class Unit:
    """One test look: a method on one split (and model seed), with its test predictions."""

    method: str
    protocol: str
    split: int
    seed: int | None
    run_id: str
    settings: str  # digest of what it was trained with
    metrics: dict[str, float]
    predictions: pd.DataFrame  # stay_id, label, risk

    @property
    def key(self) -> tuple[str, str, int, int | None]:
        return self.method, self.protocol, self.split, self.seed


def dataset_outcomes(dataset: str, data_root: Path) -> tuple[str, pd.Series]:
    """The processed dataset's digest (what an archived unit must have been made on) and its outcomes by stay id
    (what archived risks are joined back to)."""
    folder = ensure_processed(dataset, data_root)
    labels = pq.read_table(folder / LABELS, columns=["stay_id", "label"]).to_pandas().set_index("stay_id")["label"]
    return run_contract.manifest_digest(read_manifest(folder)), labels


def write_risks(path: Path, predictions: pd.DataFrame) -> None:
    """A unit's test risks (``stay_id, risk``: no outcomes), atomically and the same bytes for the same risks."""
    with atomic_file(path) as out:
        predictions[["stay_id", "risk"]].to_csv(out, index=False, float_format="%.7g", compression=GZIP)


def read_risks(path: Path, labels: pd.Series) -> pd.DataFrame:
    """The risks written at ``path`` with their outcomes joined back from ``labels``: ``stay_id, label, risk``."""
    risks = pd.read_csv(path, skip_blank_lines=False)
    if list(risks.columns) != ["stay_id", "risk"]:
        raise DamagedArchiveError(f"{path}: columns {list(risks.columns)}, expected ['stay_id', 'risk']")
    check_probabilities(path, risks, ["risk"])
    check_unique(path, risks, ["stay_id"])
    risks = risks.astype({"stay_id": labels.index.dtype, "risk": float})
    unknown = ~risks["stay_id"].isin(labels.index)
    if unknown.any():
        raise DamagedArchiveError(f"{path}: stay {risks['stay_id'][unknown].iloc[0]} is not in the dataset's labels")
    return risks.assign(label=labels.loc[risks["stay_id"]].to_numpy())[["stay_id", "label", "risk"]]


def risks_path(method: str, protocol: str, split: int, seed: int | None) -> Path:
    return Path(method) / f"{protocol}-split_{split}{'' if seed is None else f'-seed_{seed}'}.csv.gz"


@dataclass(frozen=True)
class Layout:
    """How an archive keeps its runs: the runs table's file name in its folder, the columns it must have, the columns
    that tell one unit from another (no two rows share them), its test metrics' columns (checked where present),
    and whether a unit's risks are kept under its run id (a study's) or under its unit (a table's: ``risks_path``)."""

    table: str
    required: tuple[str, ...]
    key: tuple[str, ...]
    metrics: tuple[str, ...]
    risks_by_run: bool

    def risks(self, row: Mapping) -> Path:
        """Where, in the archive's folder, the unit of ``row`` (a row of the runs table) keeps its test risks."""
        if self.risks_by_run:
            return Path("risks") / f"{row['run_id']}.csv.gz"
        return risks_path(row["method"], row["protocol"], row["split"], row["seed"])


TABLE = Layout(RUNS, tuple(RUN_COLUMNS), ("method", "protocol", "split", "seed"), METRICS, risks_by_run=False)
# a digest of digits alone would otherwise read as a number
TEXT_COLUMNS = dict.fromkeys(["method", "protocol", "run_id", "settings", "data_digest"], str)


def study_layout(table: str) -> Layout:
    """A study's layout: its runs table ``<table>.csv`` (any columns: the study's own), one row per run."""
    return Layout(f"{table}.csv", (), ("run_id",), tuple(f"test_{name}" for name in METRICS), risks_by_run=True)


class RunArchive:
    """The runs of one dataset kept under ``folder`` in ``layout``; ``labels`` (indexed by stay id) joins outcomes
    back. Without a folder (a study without ``--out``) it keeps nothing and every prediction comes from the store."""

    def __init__(self, folder: Path | None, data_digest: str, labels: pd.Series, layout: Layout = TABLE):
        self.folder, self.data_digest, self.labels = None if folder is None else Path(folder), data_digest, labels
        self.layout = layout
        self.runs = self._read()  # every archived run, on any data; read again by ``keep``

    def _read(self) -> pd.DataFrame:
        index = None if self.folder is None else self.folder / self.layout.table
        if index is None or not index.is_file():
            return pd.DataFrame(columns=list(self.layout.required))
        runs = pd.read_csv(index, dtype=TEXT_COLUMNS, skip_blank_lines=False)
        missing = set(self.layout.required) - set(runs.columns)
        if missing:
            raise DamagedArchiveError(f"{index}: no column(s) {sorted(missing)}; expected {list(self.layout.required)}")
        metrics = [name for name in self.layout.metrics if name in runs]
        check_probabilities(index, runs, metrics)
        if "seed" in self.layout.key:
            runs["seed"] = runs["seed"].astype("Int64")  # a baseline's unit has none
        if set(self.layout.key) <= set(runs.columns):
            check_unique(index, runs, list(self.layout.key))
        if not {"settings", "data_digest"} <= set(runs.columns):  # a study's table older than the archive
            return pd.DataFrame()
        return runs.astype({name: float for name in metrics})

    def on_this_data(self) -> pd.DataFrame:
        """The archived runs made on this archive's data."""
        runs = self.runs
        return runs if runs.empty else runs[runs["data_digest"] == self.data_digest].reset_index(drop=True)

    def row(self, **unit) -> dict | None:
        """The archived run of ``unit`` (columns of the runs table, ``settings`` among them; None for an empty
        value) made on this data, or None: its row, less the data digest and the columns it leaves empty."""
        runs = self.on_this_data()
        if runs.empty or not set(unit) <= set(runs.columns):
            return None
        chosen = pd.Series(True, index=runs.index)
        for column, value in unit.items():
            chosen &= runs[column].isna() if value is None else runs[column].eq(value).fillna(False).astype(bool)
        found = runs[chosen]
        return None if found.empty else found.iloc[-1].drop("data_digest").dropna().to_dict()

    def find(self, method: str, protocol: str, split: int, seed: int | None, settings: str) -> Unit | None:
        """The kept unit of a table made with ``settings`` on this archive's data, with its test risks, or None."""
        row = self.row(method=method, protocol=protocol, split=split, seed=seed, settings=settings)
        if row is None:
            return None
        path = self.folder / self.layout.risks(row | {"seed": seed})
        if not path.is_file():
            raise FileNotFoundError(
                f"{self.folder / self.layout.table} names {method} {protocol}/split_{split} seed "
                f"{seed}, but its risks {path} are missing"
            )
        metrics = {name: float(row[name]) for name in METRICS}
        return Unit(method, protocol, split, seed, str(row["run_id"]), settings, metrics, read_risks(path, self.labels))

    def predictions(self, store: Path, run_id: str) -> pd.DataFrame:
        """A run's test predictions (``stay_id, label, risk``) as a study's archive keeps them, taken from the store
        into it the first time; from the store alone without a folder."""
        if self.folder is None:
            return test_predictions(store, run_id)
        path = self.folder / self.layout.risks({"run_id": run_id})
        if not path.is_file():
            write_risks(path, test_predictions(store, run_id))
        # always what the archive holds, so that a table made from the store equals the one made from the archive
        return read_risks(path, self.labels)

    def runs_table(self, records: pd.DataFrame, unit: list[str]) -> pd.DataFrame:
        """The runs table to write: ``records`` with the data digest they were made on, after the archived runs of
        other units (``unit``: the columns that identify one; on other data too), which a narrower call must not
        drop."""
        records = records.assign(data_digest=self.data_digest)
        runs = self.runs
        if runs.empty:
            return records
        others = runs.merge(records[unit].drop_duplicates(), on=unit, how="left", indicator=True)
        others = others[others["_merge"] == "left_only"].drop(columns="_merge")
        return pd.concat([others, records], ignore_index=True)

    def keep(self, units: list[Unit]) -> None:
        """Record ``units`` in a table's archive (replacing a kept unit of the same method, protocol, split and
        seed), merged with what other processes kept in it since it was read: two calls training other methods of
        one table into one archive keep each other's units."""
        if not units:
            return
        for unit in units:
            write_risks(self.folder / risks_path(*unit.key), unit.predictions)
        new = pd.DataFrame(
            [
                {
                    "method": u.method,
                    "protocol": u.protocol,
                    "split": u.split,
                    "seed": u.seed,
                    "run_id": u.run_id,
                    "settings": u.settings,
                    **{name: u.metrics[name] for name in METRICS},
                }
                for u in units
            ]
        )
        new["seed"] = new["seed"].astype("Int64")
        self.keep_rows(new, list(self.layout.key), RUN_COLUMNS)

    def keep_rows(self, records: pd.DataFrame, unit: list[str], columns: list[str] | None = None) -> None:
        """Merge ``records`` (rows of the runs table, a unit told by the columns ``unit``; in the order ``columns``)
        into the runs table on disk, with what other processes kept there since it was read (under the folder's
        lock); nothing without a folder. A study keeps each unit so as it finishes, its risks first
        (``predictions``)."""
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        with locked(self.folder):
            self.runs = self._read()
            runs = self.runs_table(records, unit)
            self.runs = runs if columns is None else runs[columns]
            with atomic_file(self.folder / self.layout.table, "w") as out:
                self.runs.to_csv(out, index=False)


def open_archive(out: Path, dataset: str, data_root: Path) -> RunArchive:
    """The archive of the table at ``out`` for ``dataset``'s units."""
    return RunArchive(out / f"{dataset}-runs", *dataset_outcomes(dataset, data_root))


def study_archive(out: Path | None, table: str, dataset: str, data_root: Path) -> RunArchive:
    """The archive of a study writing its runs table ``table`` into ``out`` (``--out``; None: none kept)."""
    return RunArchive(out, *dataset_outcomes(dataset, data_root), study_layout(table))


def archived(archive: RunArchive, method: str, protocol: str) -> list[Unit]:
    """Every unit of ``method`` on ``protocol`` that the archive keeps for its data, with its test risks."""
    rows = archive.runs[archive.runs["method"].eq(method) & archive.runs["protocol"].eq(protocol)]
    units = [
        archive.find(method, protocol, int(row.split), None if pd.isna(row.seed) else int(row.seed), row.settings)
        for row in rows.itertuples()
    ]
    return [unit for unit in units if unit is not None]
