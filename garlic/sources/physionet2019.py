"""PhysioNet/Computing in Cardiology Challenge 2019 (early prediction of sepsis) -> the processed tables.

Source format. The training data come as ``training_setA`` and ``training_setB`` (hospital systems A and B), each
a folder of ``pNNNNNN.psv`` files or a ``.zip`` / ``.tar.gz`` archive of that folder; any subset works. A file is
one ICU stay, pipe-separated, one row per ICU hour, with the 41 columns of ``COLUMNS``: 34 vital signs and labs,
the static descriptors Age, Gender, Unit1, Unit2 and HospAdmTime, then ICULOS (hours since ICU admission) and
SepsisLabel. ``NaN`` marks a missing value. ICULOS does not always start at 1 (about a third of set A starts
later): the true hour is kept as the observation time. Stay ids are the file name's number (p000001 -> 1).

SepsisLabel is the challenge's *shifted* label: it is 1 from six hours before the clinical onset time
(Sepsis-3) onward, and 0 before. Every cohort below counts a stay as septic when it has a row with SepsisLabel 1.

Cohorts (``COHORTS``; each rule is copied into the manifest with its counts):

- ``garlic``: the reference implementation's. Input: the rows with ICULOS <= 48 (the first 48 ICU hours).
  Label: SepsisLabel is 1 at any time in the stay, including after hour 48 and inside the input window (so the
  input may show the patient already septic: this cohort is for comparison with the paper, not for real use).
  Stays with no time-series value in the window are dropped.
- ``raindrop``: Raindrop's (Zhang et al., ICLR 2022), exactly: the 38,803 stays of its published P19 splits.
  Input: the rows before the stay's first SepsisLabel 1 (all rows of a stay never labelled), so the model never
  sees a labelled hour. Kept: stays with 1 to 60 such rows and a known HospAdmTime. Label: SepsisLabel ever 1.
  Stays with no time-series value in any row are dropped; the 65 whose input rows hold none are kept, as Raindrop
  keeps them, and a model sees only their static features.
- ``hourly``: the Challenge's own task, every stay of the sets read. Input: every row; a prediction time at every
  ICU hour (row), whose input is the rows up to it and whose label is that row's SepsisLabel (the tasks table,
  ``garlic.io.tables.TASKS``); scored by the Challenge's utility. The stay's label (``labels.label``) is
  SepsisLabel ever 1, which the splits stratify on with the hospital system. Stays with no time-series value in
  any row are dropped.
- ``early``: leakage-free, for real use. Prediction is made at the end of ICU hour 48 for patients still in the
  ICU. Input: rows with ICULOS <= 48. Excluded: stays with SepsisLabel 1 at some ICULOS <= 48 (already septic, or
  within six hours of onset, inside the window) and stays with no row after hour 48 (discharged or dead before
  the prediction time: their length would reveal the label). Label: SepsisLabel 1 at some ICULOS > 48. Stays
  with no time-series value in the window are dropped.

Speed: every file of a set is parsed in one pyarrow CSV pass, each line prefixed with its file's index. Files
whose lines break a rule are re-read line by line, so that each skipped line is reported with its file and line.
"""

from __future__ import annotations

import io
import logging
import re
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from garlic.io.tables import read_manifest, sha256_of, write_processed
from garlic.sources import Source
from garlic.sources.raw import (
    MAX_MEASUREMENT,
    LeftOut,
    Record,
    Skip,
    SourceBudget,
    folder_records,
    header_differs,
    line_too_long,
    log_skips,
    member_stay_id,
    parse_value,
    prefixed_rows,
    records_digest,
    records_from_files,
    records_with_observations,
    tar_records,
    too_large,
)

log = logging.getLogger(__name__)

SETS = ("A", "B")
TIME_SERIES = [
    "HR",
    "O2Sat",
    "Temp",
    "SBP",
    "MAP",
    "DBP",
    "Resp",
    "EtCO2",
    "BaseExcess",
    "HCO3",
    "FiO2",
    "pH",
    "PaCO2",
    "SaO2",
    "AST",
    "BUN",
    "Alkalinephos",
    "Calcium",
    "Chloride",
    "Creatinine",
    "Bilirubin_direct",
    "Glucose",
    "Lactate",
    "Magnesium",
    "Phosphate",
    "Potassium",
    "Bilirubin_total",
    "TroponinI",
    "Hct",
    "Hgb",
    "PTT",
    "WBC",
    "Fibrinogen",
    "Platelets",
]
STATIC = ["Age", "Gender", "Unit1", "Unit2", "HospAdmTime"]
HOUR, LABEL = "ICULOS", "SepsisLabel"
COLUMNS = [*TIME_SERIES, *STATIC, HOUR, LABEL]
HEADER = "|".join(COLUMNS).encode()
MISSING = {"", "NaN", "nan"}
WINDOW_HOURS = 48
RAINDROP_MAX_ROWS = 60
_RECORD_NAME = re.compile(r"^p(\d+)\.psv$")
SET_B_FIRST_ID = 100_001  # the release numbers set A's stays p000001-p020643 and set B's p100001-p120000


def hospital_systems(stay_ids: np.ndarray) -> np.ndarray:
    """The hospital system ("A" or "B") of each stay, read off its id as the release numbers them."""
    return np.where(np.asarray(stay_ids) >= SET_B_FIRST_ID, "B", "A")


class PhysioNet2019Error(ValueError):
    """Input that cannot be read as the PhysioNet 2019 training data; the message names the file (and line)."""


# ---------------------------------------------------------------------------------------------------------------
# Reading the files


def _member_stay_id(member_name: str, origin: str) -> int | None:
    return member_stay_id(member_name, origin, _RECORD_NAME, PhysioNet2019Error)


def _iter_zip(archive_path: Path, skipped: list[Skip]) -> Iterator[Record]:
    with zipfile.ZipFile(archive_path) as archive:
        for member in sorted(archive.infolist(), key=lambda m: m.filename):
            stay_id = _member_stay_id(member.filename, archive_path.name)
            if stay_id is None or member.is_dir():
                continue
            origin = f"{archive_path.name}:{member.filename}"
            if reason := too_large(member.file_size):  # zipfile stops reading at the declared size
                skipped.append(Skip(origin, None, reason))
                continue
            yield Record(origin, stay_id, archive.read(member))


def iter_records(set_path: Path, skipped: list[Skip]) -> Iterator[Record]:
    """Yield the stays of one set, from a folder, a ``.zip`` or a ``.tar.gz`` archive; a file or member that cannot
    be a record (``raw.read_record_file``, ``raw.too_large``) is added to ``skipped``."""
    set_path = Path(set_path)
    if set_path.is_dir():
        yield from folder_records(set_path, "*.psv", _member_stay_id, skipped)
        return
    try:
        if set_path.name.endswith(".zip"):
            yield from _iter_zip(set_path, skipped)
        else:
            yield from tar_records(set_path, _member_stay_id, skipped)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise PhysioNet2019Error(f"{set_path}: truncated or corrupt archive ({exc})") from exc


def locate_sets(source: Path) -> dict[str, Path]:
    """Find each available set as ``training_setX`` (folder), ``training_setX.zip`` or ``training_setX.tar.gz``."""
    source = Path(source)
    if not source.is_dir():
        raise PhysioNet2019Error(f"{source}: no such folder (expected the PhysioNet 2019 training data)")
    found = {}
    for name in SETS:
        stem = f"training_set{name}"
        for candidate in (source / stem, source / f"{stem}.zip", source / f"{stem}.tar.gz"):
            if candidate.exists():
                found[name] = candidate
                break
    if not found:
        raise PhysioNet2019Error(
            f"{source}: found neither training_setA nor training_setB (as a folder, .zip or .tar.gz)"
        )
    return found


# ---------------------------------------------------------------------------------------------------------------
# Parsing: one fast pyarrow pass, then a slow line-by-line look at the files that broke a rule


def _parse_line(line: bytes, previous_hour: float) -> list[float] | str:
    """One data line -> its 41 values, or the reason it is rejected."""
    fields = line.decode("utf-8", errors="replace").strip().split("|")
    if len(fields) != len(COLUMNS):
        return f"expected {len(COLUMNS)} pipe-separated fields, got {len(fields)}: {line[:80]!r}"
    values = []
    for column, text in zip(COLUMNS, fields):
        if text in MISSING:
            values.append(np.nan)
            continue
        value = parse_value(text, column)
        if isinstance(value, str):
            return value
        values.append(value)
    hour, label = values[-2], values[-1]
    if not np.isfinite(hour) or hour != int(hour) or hour < 0:
        return f"{HOUR} must be a whole number of hours >= 0, got {fields[-2]!r}"
    if label not in (0.0, 1.0):
        return f"{LABEL} must be 0 or 1, got {fields[-1]!r}"
    if hour <= previous_hour:
        return f"{HOUR} {hour:g} does not increase (previous kept row has {previous_hour:g})"
    return values


def _parse_record_slowly(index: int, record: Record, skips: list[Skip]) -> pd.DataFrame:
    lines = record.text.replace(b"\r\n", b"\n").split(b"\n")
    header = lines[0].strip()
    if header != HEADER:
        # Not quoted: the file may be anything (a link to a system file), and its text is not ours to show.
        reason = header_differs(header, "HR|O2Sat|...|ICULOS|SepsisLabel")  # the 41 PSV columns
        skips.append(Skip(record.origin, 1, f"{reason}; the whole file is skipped"))
        return pd.DataFrame(columns=["record", *COLUMNS])
    rows, previous_hour = [], -np.inf
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        parsed = line_too_long(line) or _parse_line(line, previous_hour)
        if isinstance(parsed, str):
            skips.append(Skip(record.origin, number, parsed))
            continue
        previous_hour = parsed[-2]
        rows.append([index, *parsed])
    return pd.DataFrame(rows, columns=["record", *COLUMNS])


def _read_prefixed(data: bytes, as_text: bool, suspicious: set[int]) -> pa.Table:
    def on_invalid_row(row) -> str:
        suspicious.add(int(row.text.split("|", 1)[0]))
        return "skip"

    value_type = pa.string() if as_text else pa.float64()
    return pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=["record", *COLUMNS]),
        parse_options=pacsv.ParseOptions(delimiter="|", invalid_row_handler=on_invalid_row),
        convert_options=pacsv.ConvertOptions(
            column_types={"record": pa.int64(), **{c: value_type for c in COLUMNS}},
            null_values=sorted(MISSING),
            strings_can_be_null=True,
        ),
    )


def _records_with_unparseable_cells(table: pa.Table) -> set[int]:
    """Only reached when a cell is not a number: find the records holding such cells, vectorised per column."""
    record = table["record"].to_numpy()
    bad = np.zeros(len(table), dtype=bool)
    for column in COLUMNS:
        text = table[column].to_pandas()
        bad |= text.notna().to_numpy() & pd.to_numeric(text, errors="coerce").isna().to_numpy()
    return set(np.unique(record[bad]).tolist())


def _fast_parse(records: list[Record]) -> tuple[pd.DataFrame, set[int]]:
    """Parse all records in one pyarrow pass; return the rows and the indices of records needing a slow look."""
    data, suspicious = prefixed_rows(records, HEADER, b"|")
    if not data:  # every record is empty or was set aside: nothing for the CSV reader
        empty = pd.DataFrame(columns=["record", *COLUMNS])
        return empty.astype({"record": "int64", **dict.fromkeys(COLUMNS, "float64")}), suspicious
    try:
        table = _read_prefixed(data, as_text=False, suspicious=suspicious)
    except pa.ArrowInvalid:
        table = _read_prefixed(data, as_text=True, suspicious=suspicious)
        suspicious |= _records_with_unparseable_cells(table)
        table = table.filter(pa.array(~np.isin(table["record"].to_numpy(), sorted(suspicious))))
        table = table.cast(pa.schema([("record", pa.int64()), *[(c, pa.float64()) for c in COLUMNS]]))
    rows = table.to_pandas()
    suspicious |= _records_breaking_row_rules(rows)
    return rows, suspicious


def _records_breaking_row_rules(rows: pd.DataFrame) -> set[int]:
    """Records with a non-finite value or one beyond ``MAX_MEASUREMENT``, a bad ICULOS or SepsisLabel, or hours that
    do not increase."""
    record = rows["record"].to_numpy()
    values = rows[COLUMNS].to_numpy()
    hour, label = rows[HOUR].to_numpy(), rows[LABEL].to_numpy()
    bad = (np.abs(values) > MAX_MEASUREMENT).any(axis=1)  # inf too; NaN (missing) compares false
    bad |= ~np.isfinite(hour) | (hour != np.floor(hour)) | (hour < 0)
    bad |= ~np.isin(label, [0.0, 1.0])
    same_record = np.zeros(len(rows), dtype=bool)
    same_record[1:] = record[1:] == record[:-1]
    not_increasing = np.zeros(len(rows), dtype=bool)
    not_increasing[1:] = hour[1:] <= hour[:-1]
    bad |= same_record & not_increasing
    return set(np.unique(record[bad]).tolist())


def parse_records(records: list[Record], strict: bool = False) -> tuple[pd.DataFrame, list[Skip]]:
    """All records -> one frame (record index, the 41 columns), sorted by record and hour, and the skipped lines."""
    rows, suspicious = _fast_parse(records)
    skips: list[Skip] = []
    if suspicious:
        slow = [_parse_record_slowly(index, records[index], skips) for index in sorted(suspicious)]
        rows = pd.concat([rows[~rows["record"].isin(suspicious)], *slow], ignore_index=True)
        rows = rows.astype({"record": "int64", **{c: "float64" for c in COLUMNS}})
        rows = rows.sort_values("record", kind="stable", ignore_index=True)
    if skips and strict:
        raise PhysioNet2019Error(str(skips[0]))
    log_skips(skips, log)
    return rows, skips


# ---------------------------------------------------------------------------------------------------------------
# Cohorts


@dataclass(frozen=True)
class Cohort:
    """A named cohort: which rows are input, which stays are kept, and the label.

    ``select`` takes the per-row frame (stay_id, ICULOS, SepsisLabel, ...) and the per-stay summary and returns
    (a boolean mask of input rows, the label per stay, a dict reason -> boolean mask of excluded stays). A stay
    whose input rows hold no time-series value is dropped, unless ``keeps_empty_input``: then only a stay without
    a value in any row is (the kept one becomes a single empty step: its static features are all a model sees).
    """

    name: str
    rule: str
    select: Callable[[pd.DataFrame, pd.DataFrame], tuple[np.ndarray, pd.Series, dict[str, pd.Series]]]
    keeps_empty_input: bool = False
    hourly: bool = False  # a prediction time at every input row, labelled with that row's SepsisLabel


def stay_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per stay: hourly rows, first and last ICULOS, and when SepsisLabel is 1 (first hour, inside the window)."""
    hour = rows[HOUR]
    septic_hour = hour.where(rows[LABEL] == 1)
    grouped = pd.DataFrame({"stay_id": rows["stay_id"], "hour": hour, "septic_hour": septic_hour}).groupby(
        "stay_id", sort=True
    )
    return pd.DataFrame(
        {
            "rows": grouped["hour"].size(),
            "first_hour": grouped["hour"].min(),
            "last_hour": grouped["hour"].max(),
            "first_septic_hour": grouped["septic_hour"].min(),
        }
    )


def _within_window(rows: pd.DataFrame) -> np.ndarray:
    return (rows[HOUR] <= WINDOW_HOURS).to_numpy()


def _select_garlic(rows, summary):
    label = summary["first_septic_hour"].notna()
    return _within_window(rows), label, {}


def _before_onset(rows: pd.DataFrame, summary: pd.DataFrame) -> np.ndarray:
    """Rows recorded before the stay's first SepsisLabel 1 (every row of a stay never labelled)."""
    onset = summary["first_septic_hour"].reindex(rows["stay_id"]).to_numpy()
    return ~(rows[HOUR].to_numpy() >= onset)  # NaN onset compares false: every row is before it


def _select_raindrop(rows, summary):
    before = _before_onset(rows, summary)
    length = pd.Series(before).groupby(rows["stay_id"].to_numpy()).sum().reindex(summary.index)
    admitted = rows.groupby("stay_id", sort=True)["HospAdmTime"].first().reindex(summary.index)
    excluded = {
        f"not 1 to {RAINDROP_MAX_ROWS} hourly rows before SepsisLabel 1": ~length.between(1, RAINDROP_MAX_ROWS),
        "HospAdmTime missing": admitted.isna(),
    }
    label = summary["first_septic_hour"].notna()
    return before, label, excluded


def _select_early(rows, summary):
    first_septic = summary["first_septic_hour"]
    excluded = {
        f"SepsisLabel 1 within the first {WINDOW_HOURS} ICU hours": first_septic <= WINDOW_HOURS,
        f"no ICU row after hour {WINDOW_HOURS}": summary["last_hour"] <= WINDOW_HOURS,
    }
    label = first_septic > WINDOW_HOURS
    return _within_window(rows), label, excluded


def _select_hourly(rows, summary):
    return np.ones(len(rows), dtype=bool), summary["first_septic_hour"].notna(), {}


COHORTS = {
    "garlic": Cohort(
        "garlic",
        f"input: rows with ICULOS <= {WINDOW_HOURS} (time = ICULOS hours); label: SepsisLabel 1 at any time in "
        "the stay; dropped: stays with no time-series value in the window",
        _select_garlic,
    ),
    "raindrop": Cohort(
        "raindrop",
        f"input: the rows before the stay's first SepsisLabel 1 (all rows if never labelled; time = ICULOS hours); "
        f"kept: stays with 1 to {RAINDROP_MAX_ROWS} such rows and a known HospAdmTime; label: SepsisLabel 1 at "
        "any time in the stay; dropped: stays with no time-series value in any row (a stay whose input rows hold "
        "none is kept, as Raindrop keeps it)",
        _select_raindrop,
        keeps_empty_input=True,
    ),
    "early": Cohort(
        "early",
        f"input: rows with ICULOS <= {WINDOW_HOURS} (time = ICULOS hours); excluded: stays with SepsisLabel 1 at "
        f"ICULOS <= {WINDOW_HOURS} and stays with no row after ICULOS {WINDOW_HOURS}; label: SepsisLabel 1 at "
        f"some ICULOS > {WINDOW_HOURS}; dropped: stays with no time-series value in the window",
        _select_early,
    ),
    "hourly": Cohort(
        "hourly",
        "input: every row (time = ICULOS hours); a prediction time at every row, labelled with its SepsisLabel, "
        "its input the rows up to it; stay label: SepsisLabel 1 at any time; dropped: stays with no time-series "
        "value in any row",
        _select_hourly,
        hourly=True,
    ),
}
# What the ``hourly`` cohort's manifest says of its task (``garlic.io.tables.TASKS``) and of its splits.
HOURLY_TASK = {
    "prediction_times": "every ICU hour (each row of the record, at its ICULOS)",
    "label": f"that row's {LABEL} (1 from 6 h before the clinical onset)",
    "score": "sepsis-utility",
}
HOURLY_STRATA = ["label", "hospital_system"]


def hourly_tasks(rows: pd.DataFrame, kept: np.ndarray) -> pd.DataFrame:
    """One prediction time per row of the ``kept`` stays: (stay_id, ICULOS, SepsisLabel)."""
    taken = rows["stay_id"].isin(kept).to_numpy()
    return pd.DataFrame(
        {
            "stay_id": rows["stay_id"].to_numpy()[taken],
            "time": rows[HOUR].to_numpy()[taken],
            "label": rows[LABEL].to_numpy()[taken].astype("int8"),
        }
    )


def long_observations(rows: pd.DataFrame) -> pd.DataFrame:
    """Wide hourly rows -> one row per observed (stay, hour, variable) value, vectorised."""
    values = rows[TIME_SERIES].to_numpy()
    row, column = np.nonzero(~np.isnan(values))
    return pd.DataFrame(
        {
            "stay_id": rows["stay_id"].to_numpy()[row],
            "time": rows[HOUR].to_numpy()[row],
            "variable": pd.Categorical.from_codes(column, categories=TIME_SERIES),
            "value": values[row, column],
        }
    )


def static_table(rows: pd.DataFrame, stay_ids: np.ndarray) -> pd.DataFrame:
    """The descriptors are repeated on every row; the first known value of each is the stay's."""
    first = rows.groupby("stay_id", sort=True)[STATIC].first()
    return first.reindex(stay_ids).rename_axis("stay_id").reset_index()


# ---------------------------------------------------------------------------------------------------------------
# Stand-alone record files


def read_record_files(
    paths: list[Path], strict: bool = True, left_out: list[LeftOut] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stand-alone ``pNNNNNN.psv`` files (as uploaded or given to ``garlic predict``) -> observations, static.

    The input rows are those of the ``garlic`` and ``early`` cohorts: ICULOS <= 48, time = ICULOS hours. A record
    without an observation there is refused, or added to ``left_out`` when given (``records_with_observations``).
    """
    records = records_from_files(paths, _RECORD_NAME, PhysioNet2019Error, "pNNNNNN.psv (e.g. p000001.psv)")
    stay_ids = np.array([r.stay_id for r in records], dtype=np.int64)
    # A few files at a time: the line-by-line reader is quick enough, and unlike the one-pass reader it also
    # copes with files that hold no readable row at all.
    skips: list[Skip] = []
    frames = [_parse_record_slowly(index, record, skips) for index, record in enumerate(records)]
    if skips and strict:
        raise PhysioNet2019Error(str(skips[0]))
    log_skips(skips, log)
    rows = pd.concat(frames, ignore_index=True).astype({"record": "int64", **{c: "float64" for c in COLUMNS}})
    rows.insert(0, "stay_id", stay_ids[rows["record"].to_numpy()])
    observations = long_observations(rows[_within_window(rows)])
    window = f"the first {WINDOW_HOURS} ICU hours (ICULOS <= {WINDOW_HOURS})"
    kept = records_with_observations(records, observations["stay_id"].unique(), window, PhysioNet2019Error, left_out)
    return observations, static_table(rows, np.sort(kept))


def read_hourly_record_files(paths: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Stand-alone ``pNNNNNN.psv`` files -> observations, static and tasks as the ``hourly`` cohort has them: every row
    is input, and every row a prediction time (its ICULOS) labelled with its SepsisLabel. A file or line that cannot
    be read is refused, naming it (a prediction file needs a row for every row of its record)."""
    records = records_from_files(paths, _RECORD_NAME, PhysioNet2019Error, "pNNNNNN.psv (e.g. p000001.psv)")
    skips: list[Skip] = []
    frames = [_parse_record_slowly(index, record, skips) for index, record in enumerate(records)]
    if skips:
        raise PhysioNet2019Error(str(skips[0]))
    rows = pd.concat(frames, ignore_index=True).astype({"record": "int64", **{c: "float64" for c in COLUMNS}})
    stay_ids = np.array([r.stay_id for r in records], dtype=np.int64)
    rows.insert(0, "stay_id", stay_ids[rows["record"].to_numpy()])
    kept = np.unique(rows["stay_id"].to_numpy())
    return long_observations(rows), static_table(rows, kept), hourly_tasks(rows, kept)


# ---------------------------------------------------------------------------------------------------------------
# Entry point


def read_sets(
    located: dict[str, Path], strict: bool
) -> tuple[pd.DataFrame, list[Skip], dict[str, int], dict[str, str], np.ndarray]:
    """Parse every located set; return the rows (with stay_id), the skips, stays per set, file hashes, stay ids."""
    records: list[Record] = []
    skipped_files: list[Skip] = []
    budget = SourceBudget(PhysioNet2019Error)
    stays_per_set, files = {}, {}
    for name, path in located.items():
        before = len(records)
        records.extend(budget(iter_records(path, skipped_files)))
        stays_per_set[name] = len(records) - before
        if path.is_file():
            files[path.name] = sha256_of(path)
        else:  # an extracted folder: one digest over its record files' ids and bytes
            files[f"{path.name}/"] = records_digest(records[before:])
    if skipped_files and strict:
        raise PhysioNet2019Error(str(skipped_files[0]))
    log_skips(skipped_files, log)
    if not records:
        unread = f" ({len(skipped_files)} not read; the first: {skipped_files[0]})" if skipped_files else ""
        raise PhysioNet2019Error(f"no pNNNNNN.psv file found in {', '.join(str(p) for p in located.values())}{unread}")
    stay_ids = np.array([r.stay_id for r in records], dtype=np.int64)
    unique, counts = np.unique(stay_ids, return_counts=True)
    if (counts > 1).any():
        repeated = int(unique[counts > 1][0])
        origins = [r.origin for r in records if r.stay_id == repeated]
        raise PhysioNet2019Error(f"stay p{repeated:06d} appears more than once: {origins}")
    rows, skips = parse_records(records, strict=strict)
    skips = [*skipped_files, *skips]  # a file that is not read counts as a skipped line of its own
    rows.insert(0, "stay_id", stay_ids[rows["record"].to_numpy()])
    rows = rows.drop(columns="record")
    return rows, skips, stays_per_set, files, stay_ids


def preprocess(
    source: Path,
    destination: Path,
    cohort: str = "garlic",
    sets: list[str] | None = None,
    strict: bool = False,
) -> dict:
    """Read the training sets in ``source``, build ``cohort`` and write the processed tables; return the manifest."""
    if cohort not in COHORTS:
        raise PhysioNet2019Error(f"unknown cohort {cohort!r}; choose one of {sorted(COHORTS)}")
    located = locate_sets(source)
    if sets:
        absent = [s for s in sets if s not in located]
        if absent:
            raise PhysioNet2019Error(f"{source}: set(s) {absent} requested but not found")
        located = {s: located[s] for s in sets}
    rows, skips, stays_per_set, files, stay_ids = read_sets(located, strict)

    summary = stay_summary(rows).reindex(np.sort(stay_ids))
    input_rows, label, excluded = COHORTS[cohort].select(rows, summary)
    dropped: dict[str, list[int]] = {}
    no_rows = summary["rows"].isna()
    if no_rows.any():
        dropped["file has no valid hourly row"] = summary.index[no_rows].tolist()
    taken = no_rows.copy()
    for reason, mask in excluded.items():
        mask = mask.fillna(False) & ~taken
        dropped[reason] = summary.index[mask].tolist()
        taken |= mask
    candidates = summary.index[~taken].to_numpy()

    observations = long_observations(rows[input_rows & rows["stay_id"].isin(candidates).to_numpy()])
    observed = np.unique(observations["stay_id"].to_numpy())
    if COHORTS[cohort].keeps_empty_input:
        observed = np.unique(rows["stay_id"].to_numpy()[rows[TIME_SERIES].notna().any(axis=1).to_numpy()])
        kept = np.intersect1d(candidates, observed)
        dropped["no time-series value in any row"] = np.setdiff1d(candidates, observed).tolist()
    else:
        kept = observed
        dropped["no time-series value in the input rows"] = np.setdiff1d(candidates, observed).tolist()

    labels = pd.DataFrame(
        {
            "stay_id": kept,
            "label": label.reindex(kept).to_numpy().astype("int8"),
            "first_septic_hour": summary["first_septic_hour"].reindex(kept).to_numpy(),
            "last_hour": summary["last_hour"].reindex(kept).to_numpy(),
        }
    )
    positives = int(labels["label"].sum())
    manifest = {
        "dataset": "physionet2019",
        "cohort": cohort,
        "cohort_rule": COHORTS[cohort].rule,
        "source": {"sets": sorted(located), "files_sha256": files},
        "window_hours": WINDOW_HOURS,
        "label": f"{LABEL} (shifted: 1 from 6 h before clinical sepsis onset)",
        "counts": {
            "stays_read": int(len(stay_ids)),
            "stays_read_per_set": stays_per_set,
            "rows_read": int(len(rows)),
            "stays_ever_septic_read": int(summary["first_septic_hour"].notna().sum()),
            "dropped_stays": {reason: len(ids) for reason, ids in dropped.items()},
            "skipped_lines": len(skips),
            "prevalence": round(positives / max(len(kept), 1), 6),
        },
        "dropped_stays": {reason: [int(s) for s in ids] for reason, ids in dropped.items()},
        "skipped_lines": [str(s) for s in skips],
    }
    tasks = None
    if COHORTS[cohort].hourly:
        tasks = hourly_tasks(rows, kept)
        manifest |= {"task": HOURLY_TASK, "split_strata": HOURLY_STRATA}
    write_processed(destination, observations, static_table(rows, kept), labels, TIME_SERIES, manifest, tasks)
    log.info("physionet2019/%s: %d stays kept (%d septic), %d lines skipped", cohort, len(kept), positives, len(skips))
    return read_manifest(destination)  # as written: with the stay, observation and positive counts


SOURCE = Source(
    "physionet2019",
    lambda destination, source, cohort, strict=False: preprocess(source, destination, cohort=cohort, strict=strict),
    options=frozenset({"source", "strict"}),
    required=frozenset({"source"}),
    cohorts=tuple(COHORTS),
    source_help="the folder with training_setA and/or training_setB (folders, .zip or .tar.gz)",
    record_suffix=".psv",
    read_record_files=read_record_files,
    hospital_systems=hospital_systems,
)
