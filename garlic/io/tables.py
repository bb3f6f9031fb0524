"""The on-disk contract every preprocessor writes and every later stage reads.

A processed dataset is one folder holding:

- ``observations.parquet``: the long table, one row per measurement:
  ``stay_id`` (int64), ``time`` (float32, hours since ICU admission), ``variable`` (dictionary string),
  ``value`` (float32).
- ``static.parquet``: one row per stay, ``stay_id`` then one float32 column per static feature (null = unknown).
- ``labels.parquet``: one row per stay, ``stay_id``, ``label`` (int8, the prediction target: 0/1, or a class's
  index into the manifest's ``classes`` for a dataset of several classes, ``multiclass``) and any reference columns
  the source provides (for example SAPS-I for baselines).
  Volumes (``manifest["summed_variables"]``: P12 ``Urine``, MIMIC-III output events) recorded more than once at
  one time are one row holding their sum (``sum_simultaneous``): two outputs charted together are both output.
  Any other variable may repeat at one time; the tensors keep its later row (see ``tensors``).
- ``tasks.parquet`` (optional): the prediction times, one row per (stay, time) at which a risk is asked for, as
  MEDS label files have them: ``stay_id`` (int64), ``time`` (float32, hours since ICU admission: the input is the
  stay's observations up to that time) and ``label`` (int8). Sorted by stay, then time. Without it a dataset asks
  for one risk per stay, from its whole input, with the stay's ``labels.label`` (``tensors.PredictionTimes``).
  With it, the manifest's ``task`` says what the rows are and how they are scored.
- further tables a source keeps beside these (``write_processed``'s ``extra``: the UEA source's ``dropped.parquet``,
  the observations it removed), written with them.
- ``manifest.json``: what was read (files and SHA-256), the preprocessing version, the variable list, counts and
  every dropped stay or skipped row with its reason. It is written last: a folder without it is incomplete.

Folders are written beside their destination and renamed into place, so a crash never leaves a half-written
dataset where a reader would find it; what a killed writer leaves beside it is cleaned up or put back by the next
writer or reader (``recover``).
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from garlic.io.atomic import write_json_atomic
from garlic.io.locks import acquire, is_held, locked, release

log = logging.getLogger(__name__)

PREPROCESSING_VERSION = "1"

OBSERVATIONS = "observations.parquet"
STATIC = "static.parquet"
LABELS = "labels.parquet"
TASKS = "tasks.parquet"
MANIFEST = "manifest.json"

OBSERVATION_SCHEMA = pa.schema(
    [
        ("stay_id", pa.int64()),
        ("time", pa.float32()),
        ("variable", pa.dictionary(pa.int32(), pa.string())),
        ("value", pa.float32()),
    ]
)


class NoUsableStayError(ValueError):
    """A source whose records all were dropped: nothing is written (``write_processed``)."""


class DatasetNotFoundError(FileNotFoundError):
    """A processed dataset folder is missing or incomplete."""


@dataclass
class ProcessedDataset:
    """The three tables of a processed dataset and its manifest.

    ``variables`` fixes the order of the time-series variables in every tensor built from these tables.
    """

    observations: pd.DataFrame
    static: pd.DataFrame
    labels: pd.DataFrame
    variables: list[str]
    manifest: dict = field(default_factory=dict)
    tasks: pd.DataFrame | None = None

    @property
    def static_features(self) -> list[str]:
        return [c for c in self.static.columns if c != "stay_id"]


def sha256_of(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def _observation_table(observations: pd.DataFrame, variables: list[str]) -> pa.Table:
    unknown = set(observations["variable"].unique()) - set(variables)
    if unknown:
        raise ValueError(f"observations name variables outside the dataset's variable list: {sorted(unknown)}")
    codes = pd.Categorical(observations["variable"], categories=variables).codes.astype("int32")
    variable = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(variables, pa.string()))
    return pa.Table.from_arrays(
        [
            pa.array(observations["stay_id"].to_numpy("int64")),
            pa.array(observations["time"].to_numpy("float32")),
            variable,
            pa.array(observations["value"].to_numpy("float32")),
        ],
        schema=OBSERVATION_SCHEMA,
    )


def atomic_directory(destination: Path) -> "_AtomicDirectory":
    """Context manager yielding a temporary folder that replaces ``destination`` only on success.

    The staging folder (``.NAME.XXXX`` beside ``destination``) stays locked while its process lives, and the
    replacement (two renames: the old folder to ``.NAME.retired-PID``, the staging folder into place) happens under
    the lock file ``.NAME.lock``. What a killed process left there is undone on the next use (``recover``).
    """
    return _AtomicDirectory(Path(destination))


def _publish_lock(destination: Path) -> Path:
    return destination.with_name(f".{destination.name}.lock")


def _leftovers(destination: Path) -> list[Path]:
    """Staging and retired folders of ``destination``: ``.NAME.*`` folders beside it (not the lock file)."""
    pattern = f".{glob.escape(destination.name)}.*"
    return sorted(p for p in destination.parent.glob(pattern) if p.is_dir() and not p.is_symlink())


def recover(destination: Path) -> None:
    """Undo what a process killed while writing ``destination`` left beside it.

    A retired folder is put back when ``destination`` is missing (the process died between the two renames: the
    dataset that was there comes back) and deleted otherwise; a staging folder whose process is dead is deleted.
    A live process's staging is left alone.
    """
    destination = Path(destination)
    if not destination.parent.is_dir() or not _leftovers(destination):
        return  # the usual case: nothing to lock (and the folder may be read-only)
    with locked(_publish_lock(destination), remove=True):
        _recover_locked(destination)


def _recover_locked(destination: Path) -> None:
    for folder in _leftovers(destination):
        if ".retired-" in folder.name:
            if not destination.exists() and (folder / MANIFEST).is_file():
                os.replace(folder, destination)
                log.warning(
                    "%s: restored from %s, left by a process killed while replacing it", destination, folder.name
                )
            else:
                shutil.rmtree(folder, ignore_errors=True)
        elif not is_held(folder):
            log.warning("%s: removing %s, left by a process killed while writing it", destination, folder.name)
            shutil.rmtree(folder, ignore_errors=True)


class _AtomicDirectory:
    def __init__(self, destination: Path):
        self.destination = destination

    def __enter__(self) -> Path:
        self.destination.parent.mkdir(parents=True, exist_ok=True)
        with locked(_publish_lock(self.destination), remove=True):
            _recover_locked(self.destination)
            self.staging = Path(tempfile.mkdtemp(prefix=f".{self.destination.name}.", dir=self.destination.parent))
            self.staging.chmod(0o755)  # mkdtemp's private 0700 would hide the dataset from other users
            self.held = acquire(self.staging)  # taken before the publish lock is let go: never seen unlocked
        return self.staging

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None:
                shutil.rmtree(self.staging, ignore_errors=True)
                return
            with locked(_publish_lock(self.destination), remove=True):
                retired = None
                if self.destination.exists():
                    retired = self.destination.with_name(f".{self.destination.name}.retired-{os.getpid()}")
                    os.replace(self.destination, retired)
                os.replace(self.staging, self.destination)
                if retired is not None:
                    shutil.rmtree(retired, ignore_errors=True)
        finally:
            release(self.held)


def write_processed(
    destination: Path,
    observations: pd.DataFrame,
    static: pd.DataFrame,
    labels: pd.DataFrame,
    variables: list[str],
    manifest: dict,
    tasks: pd.DataFrame | None = None,
    extra: dict[str, pd.DataFrame] | None = None,
) -> Path:
    """Write the three tables (four with ``tasks``) and the manifest into ``destination``, atomically; a dataset
    without a stay is refused, so that a source with no usable record never replaces a good dataset (nor its saved
    splits).

    ``observations`` needs columns stay_id, time, variable, value; ``static`` and ``labels`` need ``stay_id``,
    and ``labels`` a ``label`` column: 0/1, or with the manifest's ``classes`` (their names, at least two) each
    stay's class index. Every stay in ``observations`` must have a label and a static row. ``tasks``, when given,
    needs stay_id, time and a 0/1 label, and every labelled stay at least one row. ``extra``: further tables by file
    name (``dropped.parquet``), written beside the others.
    """
    if labels.empty:
        raise NoUsableStayError(
            f"no usable stay in the source ({_what_was_dropped(manifest)}); nothing was written: "
            f"{destination} is left as it was"
        )
    for name, frame in (("static", static), ("labels", labels)):
        if not frame["stay_id"].is_unique:
            raise ValueError(f"{name} table has repeated stay_id values")
    for name, frame in (("label", labels), ("static", static)):
        missing = set(observations["stay_id"].unique()) - set(frame["stay_id"])
        if missing:
            raise ValueError(f"{len(missing)} stays have observations but no {name} row, e.g. {sorted(missing)[:5]}")
    classes = manifest.get("classes")
    if classes is not None and len(classes) < 2:
        raise ValueError(f"manifest classes {classes}: a dataset of classes needs at least two")
    if not labels["label"].isin(range(len(classes)) if classes else [0, 1]).all():
        raise ValueError(
            "labels.label must be 0 or 1"
            if classes is None
            else f"labels.label must be a class index 0..{len(classes) - 1}"
        )

    if tasks is not None:
        tasks = _checked_tasks(tasks, labels)
    static = static.astype({c: "float32" for c in static.columns if c != "stay_id"})
    labels = labels.astype({"label": "int8"})
    manifest = {
        **manifest,
        "preprocessing_version": PREPROCESSING_VERSION,
        "variables": list(variables),
        "static_features": [c for c in static.columns if c != "stay_id"],
        "counts": {
            **manifest.get("counts", {}),
            "stays": int(labels["stay_id"].nunique()),
            "observations": int(len(observations)),
            **(
                {"positives": int(labels["label"].sum())}
                if classes is None
                else {"per_class": {name: int((labels["label"] == k).sum()) for k, name in enumerate(classes)}}
            ),
            **(
                {}
                if tasks is None
                else {"prediction_times": len(tasks), "positive_prediction_times": int(tasks["label"].sum())}
            ),
        },
    }
    destination = Path(destination)
    with atomic_directory(destination) as staging:
        pq.write_table(_observation_table(observations, variables), staging / OBSERVATIONS)
        pq.write_table(pa.Table.from_pandas(static, preserve_index=False), staging / STATIC)
        pq.write_table(pa.Table.from_pandas(labels, preserve_index=False), staging / LABELS)
        if tasks is not None:
            pq.write_table(pa.Table.from_pandas(tasks, preserve_index=False), staging / TASKS)
        for name, table in (extra or {}).items():
            pq.write_table(pa.Table.from_pandas(table, preserve_index=False), staging / name)
        write_json_atomic(staging / MANIFEST, manifest)
    return destination


def _checked_tasks(tasks: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """``tasks`` as stored (stay_id int64, time float32, label int8, sorted by stay and time), or a ValueError
    naming the first row that breaks the contract."""
    missing = [c for c in ("stay_id", "time", "label") if c not in tasks]
    if missing:
        raise ValueError(f"tasks table lacks column(s) {missing}")
    tasks = tasks[["stay_id", "time", "label"]].astype({"stay_id": "int64", "time": "float32"})
    for what, bad in (
        ("label is not 0 or 1", ~tasks["label"].isin([0, 1])),
        ("time is not a finite number of hours", ~np.isfinite(tasks["time"].to_numpy())),
        ("stay has no row in the labels table", ~tasks["stay_id"].isin(labels["stay_id"])),
        ("repeats a (stay_id, time) pair", tasks.duplicated(["stay_id", "time"])),
    ):
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise ValueError(f"tasks table row {row} (stay {tasks['stay_id'].iloc[row]}): {what}")
    without = np.setdiff1d(labels["stay_id"].to_numpy(), tasks["stay_id"].to_numpy())
    if len(without):
        raise ValueError(
            f"{len(without)} stays have no prediction time in the tasks table, e.g. {without[:5].tolist()}"
        )
    return tasks.astype({"label": "int8"}).sort_values(["stay_id", "time"], kind="stable", ignore_index=True)


def _what_was_dropped(manifest: dict) -> str:
    """'N read, dropped: reason: count; ...' from a source's manifest (stays by reason, or a plain list of stays)."""
    counts = manifest.get("counts", {})
    read = counts.get("stays_read", counts.get("records_read"))
    dropped = manifest.get("dropped_stays", [])  # {reason: [stay id, ...]} or [{"stay_id": ..., "reason": ...}, ...]
    if isinstance(dropped, dict):
        reasons = {reason: len(ids) for reason, ids in dropped.items()}
    else:
        reasons = Counter(stay.get("reason", "dropped") for stay in dropped)
    shown = "; ".join(f"{reason}: {count}" for reason, count in reasons.items() if count) or "none"
    return ("" if read is None else f"{read} read, ") + f"dropped: {shown}"


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise DatasetNotFoundError(
            f"{folder} holds no processed dataset (no {MANIFEST}); run `garlic preprocess` for it first"
        )
    try:
        manifest = json.loads(path.read_text())
    except ValueError as damage:  # not UTF-8 or not JSON
        manifest = damage
    if not isinstance(manifest, dict):
        raise ValueError(
            f"{path}: not a processed dataset's manifest ({manifest!s:.200}); run `garlic preprocess` for it again"
        )
    return manifest


def check_binary(manifest: dict, dataset: str) -> None:
    """Refuse a dataset of several classes (the manifest's ``classes``) where a method predicts the risk of a 0/1
    outcome, as every method of ``garlic.methods.registry`` does: it would read class indices as outcomes."""
    classes = manifest.get("classes")
    if classes is not None:
        raise ValueError(
            f"{dataset} has {len(classes)} classes ({', '.join(map(str, classes))}), and the project's methods predict "
            "the risk of a 0/1 outcome; its comparison is python -m experiments.uea"
        )


def read_processed(folder: Path) -> ProcessedDataset:
    folder = Path(folder)
    manifest = read_manifest(folder)
    return ProcessedDataset(
        # ``variable`` comes back as a pandas Categorical: cheap to hold and to turn into codes.
        observations=pq.read_table(folder / OBSERVATIONS).to_pandas(),
        static=pq.read_table(folder / STATIC).to_pandas(),
        labels=pq.read_table(folder / LABELS).to_pandas(),
        variables=manifest["variables"],
        manifest=manifest,
        tasks=pq.read_table(folder / TASKS).to_pandas() if (folder / TASKS).is_file() else None,
    )


def sum_simultaneous(observations: pd.DataFrame, summed: list[str]) -> pd.DataFrame:
    """Rows of a ``summed`` variable (a volume) that share stay, time and variable -> one row holding their sum.

    Other rows are left as they are, in their order (so "the later row wins" still holds for them).
    """
    is_summed = observations["variable"].isin(summed).to_numpy()
    key = ["stay_id", "time", "variable"]
    volumes = observations[is_summed]
    if not volumes.duplicated(key).any():
        return observations
    totals = volumes.groupby(key, observed=True, sort=False)["value"].sum().reset_index()
    return pd.concat([observations[~is_summed], totals[observations.columns]], ignore_index=True)
