"""Two multivariate classification sets of the UEA archive (Bagnall et al. 2018), beyond the ICU, made irregular as
Raindrop (Zhang et al., ICLR 2022) made PAM irregular: a share of the observations removed at random.

- ``basicmotions``: a smart watch's 3D accelerometer and 3D gyroscope (``dim_0`` .. ``dim_5``, the archive's order)
  over 10 seconds at 10 Hz, 100 samples; 4 activities (Standing, Running, Walking, Badminton); 40 + 40 series.
- ``japanesevowels``: 12 linear-prediction coefficients (``coefficient_1`` .. ``coefficient_12``) of 7 to 29 frames
  of a spoken vowel; 9 speakers; 270 + 370 series.

Both ship in the ``aeon`` package (``aeon/datasets/data/<Name>/<Name>_TRAIN.ts`` and ``_TEST.ts``), which is read
when ``--source`` is not given; ``--source DIR`` reads the same files from any folder holding them (the archive's
download). Only the files are read, by the parser here, not aeon's code.

A series is a stay: ids 1.. in the archive's order, its training file first. ``time`` is the sample's index in its
series (the archive has no time stamps; the network reads these gaps as it reads hours), ``label`` the index of
its class in the file's ``@classLabel`` list, whose names are the manifest's ``classes``. There are no static
features.

Made irregular, seeded by ``--seed`` (default 0):
- ``--drop-sensors K`` (default 0): K of each series' variables, drawn at random, lose every value (Raindrop's
  leave-sensors-out, here in every part);
- ``--drop-share S`` (default 0.6, Raindrop's share on PAM): of each series' values left, round(S x their count)
  are removed, drawn without replacement, so that every series keeps 1 - S of them; a sample left with no value
  leaves the series, which is what makes the steps irregular.
The removed values are kept in ``dropped.parquet`` (``stay_id, time, variable, value, reason``: ``sensor`` or
``share``), so that the complete series can be put back together.

The split is the archive's: its test file is the test part, and a stratified fifth of its training series
(``VALIDATION_SHARE`` of each class, drawn with the seed) the validation part. The manifest records it as
``subject_splits``, which the ``subject-splits`` protocol takes (saved there, with the normalisation fitted on the
training part, on first use).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

from garlic.io.tables import read_manifest, sha256_of, write_processed
from garlic.sources import Source

ARCHIVE_NAMES = {"basicmotions": "BasicMotions", "japanesevowels": "JapaneseVowels"}
VARIABLE_PREFIX = {"basicmotions": ("dim_", 0), "japanesevowels": ("coefficient_", 1)}
DROP_SHARE = 0.6
VALIDATION_SHARE = 0.2
DROPPED = "dropped.parquet"
MISSING = "?"  # the archive's mark of a missing value


def aeon_data() -> Path:
    """The folder of the datasets that ship in the ``aeon`` package (found without importing it), or a ValueError
    saying how to install it or where else the files may come from."""
    spec = importlib.util.find_spec("aeon")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the uea source reads the UEA archive's files from the aeon package, which is not installed "
            "(bin/setup installs it: pip install --no-deps aeon==1.6.0); or give --source DIR holding NAME_TRAIN.ts and "
            "NAME_TEST.ts"
        )
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data"


def archive_files(source: Path | None, cohort: str) -> dict[str, Path]:
    """The cohort's TRAIN and TEST files: in ``source`` (or its ``<Name>/`` subfolder), else in aeon's data."""
    name = ARCHIVE_NAMES[cohort]
    folder = Path(source) if source is not None else aeon_data() / name
    if source is not None and not (folder / f"{name}_TRAIN.ts").is_file() and (folder / name).is_dir():
        folder = folder / name
    files = {part: folder / f"{name}_{part}.ts" for part in ("TRAIN", "TEST")}
    missing = [path.name for path in files.values() if not path.is_file()]
    if missing:
        raise ValueError(f"{folder}: no {' or '.join(missing)}; expected the UEA archive's {name} files")
    return files


def read_ts(path: Path, dimensions: int | None = None) -> tuple[list[np.ndarray], list[str], list[str]]:
    """A ``.ts`` file of the archive: each series as [T, D] float64 (NaN where missing), its class label, and the
    header's class names. A line that breaks the format is refused, naming the file and the line."""
    header, series, labels = {}, [], []
    lines = Path(path).read_text(encoding="utf-8", errors="strict").splitlines()
    in_data = False
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not in_data:
            if not line.startswith("@"):
                raise ValueError(f"{path}: line {number}: expected a @ header line or @data before the series")
            key, _, value = line[1:].partition(" ")
            key = key.lower()
            if key == "data":
                in_data = True
            else:
                header[key] = value.strip()
            continue
        series_values, label = _data_line(path, number, line, header)
        if dimensions is not None and series_values.shape[1] != dimensions:
            raise ValueError(f"{path}: line {number} has {series_values.shape[1]} dimensions, the others {dimensions}")
        dimensions = series_values.shape[1]
        series.append(series_values)
        labels.append(label)
    if not in_data:
        raise ValueError(f"{path}: no @data line; not a .ts file of the UEA archive")
    if not series:
        raise ValueError(f"{path}: no series after @data")
    return series, labels, _class_names(path, header)


def _class_names(path: Path, header: dict) -> list[str]:
    """The header's ``@classLabel true NAME ...`` names, in their order."""
    words = header.get("classlabel", "").split()
    if not words or words[0].lower() != "true" or len(words) < 3:
        raise ValueError(f"{path}: the header names no classes (@classLabel true NAME NAME ...)")
    return words[1:]


def _data_line(path: Path, number: int, line: str, header: dict) -> tuple[np.ndarray, str]:
    """One series line: dimensions separated by ':', values by ',', the class label last -> [T, D], label."""
    *fields, label = line.split(":")
    declared = header.get("dimensions")
    if not fields or (declared is not None and declared.isdigit() and len(fields) != int(declared)):
        raise ValueError(f"{path}: line {number} has {len(fields)} dimensions, the header says {declared}")
    columns = []
    for dimension, field in enumerate(fields):
        try:
            columns.append([np.nan if value.strip() == MISSING else float(value) for value in field.split(",")])
        except ValueError:
            raise ValueError(f"{path}: line {number}, dimension {dimension}: not a list of numbers") from None
    steps = max(len(column) for column in columns)
    values = np.full((steps, len(columns)), np.nan)
    for dimension, column in enumerate(columns):  # a shorter dimension ends early: its later samples are missing
        values[: len(column), dimension] = column
    return values, label.strip()


def long_table(series: list[np.ndarray], stay_ids: np.ndarray, variables: list[str]) -> pd.DataFrame:
    """Every finite value of every series as an observation row (stay_id, time = sample index, variable, value)."""
    frames = []
    for stay_id, values in zip(stay_ids, series):
        step, dimension = np.nonzero(np.isfinite(values))
        frames.append(
            pd.DataFrame(
                {
                    "stay_id": np.int64(stay_id),
                    "time": step.astype("float32"),
                    "variable": np.asarray(variables)[dimension],
                    "value": values[step, dimension],
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def irregular(
    observations: pd.DataFrame, variables: list[str], drop_share: float, drop_sensors: int, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kept, dropped) rows of ``observations``: per stay, ``drop_sensors`` of its variables drawn whole, then
    round(``drop_share`` x the values left) of the others, drawn without replacement; ``dropped`` says which way
    (``reason``). One generator seeded by ``seed`` draws every stay in id order."""
    rng = np.random.default_rng(seed)
    reason = np.full(len(observations), "", dtype=object)
    stays = observations["stay_id"].to_numpy()
    names = observations["variable"].to_numpy()
    bounds = np.flatnonzero(np.r_[True, stays[1:] != stays[:-1], True])  # rows are grouped by stay
    for start, stop in zip(bounds[:-1], bounds[1:]):
        removed = rng.choice(variables, size=drop_sensors, replace=False)
        rows = np.arange(start, stop)
        sensor = np.isin(names[rows], removed)
        reason[rows[sensor]] = "sensor"
        left = rows[~sensor]
        reason[rng.choice(left, size=round(drop_share * len(left)), replace=False)] = "share"
    dropped = reason != ""
    return (
        observations[~dropped].reset_index(drop=True),
        observations[dropped].assign(reason=reason[dropped]).reset_index(drop=True),
    )


def validation_ids(train_ids: np.ndarray, train_labels: np.ndarray, seed: int) -> np.ndarray:
    """A stratified ``VALIDATION_SHARE`` of the archive's training series: round(share x count) of each class,
    drawn without replacement (classes in index order, one generator seeded by ``seed``)."""
    rng = np.random.default_rng(seed)
    chosen = [
        rng.choice(
            train_ids[train_labels == k], size=round(VALIDATION_SHARE * (train_labels == k).sum()), replace=False
        )
        for k in np.unique(train_labels)
    ]
    return np.sort(np.concatenate(chosen))


def check_options(drop_share: float, drop_sensors: int, variables: int) -> None:
    if not 0 <= drop_share < 1:
        raise ValueError(f"--drop-share must be at least 0 and below 1, got {drop_share}")
    if not 0 <= drop_sensors < variables:
        raise ValueError(
            f"--drop-sensors must be from 0 to {variables - 1} (the set has {variables}), got {drop_sensors}"
        )


def preprocess(
    destination: Path,
    cohort: str,
    source: Path | None = None,
    seed: int = 0,
    drop_share: float = DROP_SHARE,
    drop_sensors: int = 0,
) -> dict:
    """Read the cohort's two archive files, make them irregular, record the split and write the tables."""
    files = archive_files(source, cohort)
    train_series, train_classes, classes = read_ts(files["TRAIN"])
    test_series, test_classes, test_names = read_ts(files["TEST"], train_series[0].shape[1])
    if test_names != classes:
        raise ValueError(f"{files['TEST']}: classes {test_names}, but {files['TRAIN'].name} has {classes}")
    prefix, first = VARIABLE_PREFIX[cohort]
    variables = [f"{prefix}{first + d}" for d in range(train_series[0].shape[1])]
    check_options(drop_share, drop_sensors, len(variables))
    index = {name: k for k, name in enumerate(classes)}
    for path, found in ((files["TRAIN"], train_classes), (files["TEST"], test_classes)):
        unknown = sorted(set(found) - set(index))
        if unknown:
            raise ValueError(f"{path}: class {unknown[0]!r} is not one of the header's {classes}")
    series = train_series + test_series
    stay_ids = np.arange(1, len(series) + 1, dtype="int64")
    labels = np.array([index[name] for name in train_classes + test_classes], dtype="int64")
    complete = long_table(series, stay_ids, variables)
    observations, dropped = irregular(complete, variables, drop_share, drop_sensors, seed)
    train = stay_ids[: len(train_series)]
    validation = validation_ids(train, labels[: len(train_series)], seed)
    parts = {
        "train": np.setdiff1d(train, validation),
        "validation": validation,
        "test": stay_ids[len(train_series) :],
    }
    kept = np.unique(observations["stay_id"])
    manifest = {
        "dataset": f"uea-{cohort}",
        "cohort": cohort,
        "source": {"files_sha256": {path.name: sha256_of(path) for path in files.values()}},
        "label": f"the class of the series ({ARCHIVE_NAMES[cohort]}, UEA archive)",
        "classes": classes,
        "time_unit": "sample index",
        "irregular": {
            "seed": seed,
            "drop_share": drop_share,
            "drop_sensors": drop_sensors,
            "values_read": len(complete),
            "values_dropped": {reason: int((dropped["reason"] == reason).sum()) for reason in ("sensor", "share")},
        },
        "subject_splits": {part: ids.tolist() for part, ids in parts.items()},
        "counts": {"stays_read": len(series), "archive_train": len(train_series), "archive_test": len(test_series)},
        "dropped_stays": {"every value dropped": np.setdiff1d(stay_ids, kept).tolist()},
    }
    on_kept = np.isin(stay_ids, kept)
    write_processed(
        destination,
        observations,
        pd.DataFrame({"stay_id": stay_ids[on_kept]}),
        pd.DataFrame({"stay_id": stay_ids[on_kept], "label": labels[on_kept]}),
        variables,
        manifest,
        extra={DROPPED: dropped},
    )
    return read_manifest(destination)


SOURCE = Source(
    "uea",
    lambda destination, cohort, source=None, seed=0, drop_share=DROP_SHARE, drop_sensors=0: preprocess(
        destination, cohort, source, seed, drop_share, drop_sensors
    ),
    options=frozenset({"source", "seed", "drop_share", "drop_sensors"}),
    cohorts=tuple(ARCHIVE_NAMES),
    source_help="a folder with the set's NAME_TRAIN.ts and NAME_TEST.ts (default: the files in the aeon package)",
)
