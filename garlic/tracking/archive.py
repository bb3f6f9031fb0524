"""The comparison's record of its units, kept beside its table so that the table can be made again without the
MLflow stores that trained them: a store lives on one machine, the repository outlives it.

Under ``FOLDER`` (``docs/results/<dataset>-runs/``):

- ``runs.csv``: one row per unit, ``method, protocol, split, seed, run_id, settings, data_digest, auroc, auprc,
  brier, ece`` (test metrics; ``seed`` empty for a deterministic baseline). ``settings`` is a digest of what the
  unit was trained with and ``data_digest`` the processed data's (``run_contract.manifest_digest``): a unit made with
  other settings or on other data is never read back.
- ``<method>/<protocol>-split_<k>[-seed_<s>].csv.gz``: the unit's test risks, ``stay_id, risk``. No outcomes: they
  stay in the dataset and are joined back from its label table when a unit is read.

Every file is written atomically (``garlic.io.atomic``): a killed write leaves the previous record whole. Every
file is checked as it is read (``DamagedArchiveError``): a risk or a metric that is not a number in [0, 1], a stay
repeated in a risks file or a unit repeated in ``runs.csv`` is refused, naming the file and line, rather than read
into a wrong table.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from garlic.data.datasets import ensure_processed
from garlic.io.atomic import atomic_file
from garlic.io.tables import LABELS, read_manifest
from garlic.metrics import METRICS
from garlic.tracking import run_contract

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
            raise DamagedArchiveError(f"{path}, line {_line(position)}: {column} {table[column].iloc[position]} is "
                                      "not a number in [0, 1]")  # fmt: skip


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


class RunArchive:
    """The units of one dataset kept under ``folder``; ``labels`` (indexed by stay id) joins outcomes back."""

    def __init__(self, folder: Path, data_digest: str, labels: pd.Series):
        self.folder, self.data_digest, self.labels = Path(folder), data_digest, labels
        index = self.folder / RUNS
        # a digest of digits alone would otherwise read as a number
        text = dict.fromkeys(["method", "protocol", "run_id", "settings", "data_digest"], str)
        runs = pd.read_csv(index, dtype=text, skip_blank_lines=False) if index.is_file() else pd.DataFrame(
            columns=RUN_COLUMNS)
        missing = set(RUN_COLUMNS) - set(runs.columns)
        if missing:
            raise DamagedArchiveError(f"{index}: no column(s) {sorted(missing)}; expected {RUN_COLUMNS}")
        check_probabilities(index, runs, METRICS)
        runs["seed"] = runs["seed"].astype("Int64")
        check_unique(index, runs, ["method", "protocol", "split", "seed"])
        self.runs = runs.astype({name: float for name in METRICS})

    def _row(self, method: str, protocol: str, split: int, seed: int | None) -> pd.Series | None:
        runs = self.runs
        same_seed = runs["seed"].isna() if seed is None else runs["seed"].eq(seed).fillna(False)
        found = runs[runs["method"].eq(method) & runs["protocol"].eq(protocol) & runs["split"].eq(split) & same_seed]
        return None if found.empty else found.iloc[-1]

    def find(self, method: str, protocol: str, split: int, seed: int | None, settings: str) -> Unit | None:
        """The kept unit made with ``settings`` on this archive's data, or None."""
        row = self._row(method, protocol, split, seed)
        if row is None or row["settings"] != settings or row["data_digest"] != self.data_digest:
            return None
        path = self.folder / risks_path(method, protocol, split, seed)
        if not path.is_file():
            raise FileNotFoundError(f"{self.folder / RUNS} names {method} {protocol}/split_{split} seed {seed}, "
                                    f"but its risks {path} are missing")  # fmt: skip
        predictions = read_risks(path, self.labels)
        metrics = {name: float(row[name]) for name in METRICS}
        return Unit(method, protocol, split, seed, str(row["run_id"]), settings, metrics, predictions)

    def keep(self, units: list[Unit]) -> None:
        """Record ``units`` (replacing a kept unit of the same method, protocol, split and seed)."""
        if not units:
            return
        for unit in units:
            write_risks(self.folder / risks_path(*unit.key), unit.predictions)
        new = pd.DataFrame([{"method": u.method, "protocol": u.protocol, "split": u.split, "seed": u.seed,
                             "run_id": u.run_id, "settings": u.settings, "data_digest": self.data_digest,
                             **{name: u.metrics[name] for name in METRICS}} for u in units])  # fmt: skip
        new["seed"] = new["seed"].astype("Int64")
        kept = pd.concat([self.runs, new], ignore_index=True) if len(self.runs) else new
        self.runs = kept.drop_duplicates(["method", "protocol", "split", "seed"], keep="last")[RUN_COLUMNS]
        with atomic_file(self.folder / RUNS, "w") as out:
            self.runs.to_csv(out, index=False)


def open_archive(out: Path, dataset: str, data_root: Path) -> RunArchive:
    return RunArchive(out / f"{dataset}-runs", *dataset_outcomes(dataset, data_root))


def archived(archive: RunArchive, method: str, protocol: str) -> list[Unit]:
    """Every unit of ``method`` on ``protocol`` that the archive keeps for its data, with its test risks."""
    rows = archive.runs[archive.runs["method"].eq(method) & archive.runs["protocol"].eq(protocol)]
    units = [archive.find(method, protocol, int(row.split), None if pd.isna(row.seed) else int(row.seed),
                          row.settings) for row in rows.itertuples()]  # fmt: skip
    return [unit for unit in units if unit is not None]
