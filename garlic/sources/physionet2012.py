"""PhysioNet/Computing in Cardiology Challenge 2012 records -> the processed tables (see ``tables``).

The release holds ``set-a``, ``set-b`` and ``set-c`` (as ``.tar.gz`` archives or extracted folders) with one
``RECORDID.txt`` per stay (``Time,Parameter,Value``, time ``HH:MM`` since ICU admission, descriptors first), and
``Outcomes-{a,b,c}.txt``. Any subset of the three sets works.

Cohorts (``garlic preprocess physionet2012 --cohort NAME``):
- ``mortality`` (default, the dataset ``physionet2012``): in-hospital death, one prediction per stay from its first
  48 hours.
- ``hourly`` (``physionet2012-hourly``): the same stays, tables and label, with a prediction time at every whole
  ICU hour from the first observation to hour 48 (``garlic.io.tables.TASKS``): the risk the dashboard shows as a
  stay unfolds, for methods trained on every hour's prefix and scored hour by hour. P12's stays were all in the
  ICU for at least 48 hours, so every stay is still there at each of its prediction times.

Speed comes from parsing every record of a set in one pyarrow CSV pass: each record's lines are prefixed with the
record's index, so the whole set is one table. Records whose lines break a rule are re-read line by line, so that
each skipped line is reported with its file and line number.
"""

from __future__ import annotations

import io
import logging
import re
import tarfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from garlic.io.tables import read_manifest, sha256_of, sum_simultaneous, write_processed
from garlic.sources import Source
from garlic.sources.raw import (
    FLOAT32_MAX,
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
    refuse_repeated_stays,
    tar_records,
)

log = logging.getLogger(__name__)

SETS = ("a", "b", "c")
WINDOW_HOURS = 48.0
TIME_SERIES = [
    "ALP",
    "ALT",
    "AST",
    "Albumin",
    "BUN",
    "Bilirubin",
    "Cholesterol",
    "Creatinine",
    "DiasABP",
    "FiO2",
    "GCS",
    "Glucose",
    "HCO3",
    "HCT",
    "HR",
    "K",
    "Lactate",
    "MAP",
    "MechVent",
    "Mg",
    "NIDiasABP",
    "NIMAP",
    "NISysABP",
    "Na",
    "PaCO2",
    "PaO2",
    "Platelets",
    "RespRate",
    "SaO2",
    "SysABP",
    "Temp",
    "TroponinI",
    "TroponinT",
    "Urine",
    "WBC",
    "pH",
]
STATIC = ["Age", "Gender", "Height", "ICUType", "Weight"]
VOLUMES = ["Urine"]  # mL since the last reading: two readings at one time are summed
# Weight is both a descriptor and a series; the P12 benchmark keeps only the descriptor.
KNOWN_PARAMETERS = frozenset(TIME_SERIES) | {"RecordID", *STATIC}
LABEL = "In-hospital_death"
COHORTS = ("mortality", "hourly")
# What the ``hourly`` cohort's manifest says of its task (``garlic.io.tables.TASKS``).
HOURLY_TASK = {
    "prediction_times": f"every whole ICU hour from the first observation to hour {WINDOW_HOURS:g}",
    "label": f"the stay's {LABEL}",
    "score": "auroc",
}
OUTCOME_COLUMNS = ["RecordID", "SAPS-I", "SOFA", "Length_of_stay", "Survival", LABEL]
HEADER = b"Time,Parameter,Value"
# set-c holds 2,403 lines like ``10:45,,1.9``: a value whose parameter name the release lost. They are skipped
# and counted like any bad line, but ``strict`` does not stop on them: they are the release's own, not damage.
NAMELESS_PARAMETER = "unknown parameter ''"
_TIME = re.compile(r"^(\d+):([0-5]\d)$")
_RECORD_NAME = re.compile(r"^(\d+)\.txt$")


class PhysioNet2012Error(ValueError):
    """Input that cannot be read as the PhysioNet 2012 release; the message names the file (and line)."""


def _record_id(member_name: str, origin: str) -> int | None:
    return member_stay_id(member_name, origin, _RECORD_NAME, PhysioNet2012Error)


def iter_records(set_path: Path, skipped: list[Skip]) -> Iterator[Record]:
    """Yield the records of one set, from a ``.tar.gz`` archive or an extracted folder, in name order; a file or
    member that cannot be a record (``raw.read_record_file``, ``raw.too_large``) is added to ``skipped``."""
    set_path = Path(set_path)
    if set_path.is_dir():
        yield from folder_records(set_path, "*.txt", _record_id, skipped)
        return
    try:
        yield from tar_records(set_path, _record_id, skipped)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise PhysioNet2012Error(f"{set_path}: truncated or corrupt archive ({exc})") from exc


def _limit(parameter: str) -> float:
    """The largest magnitude ``parameter`` may have: a measurement's, or for ``RecordID`` (an id, checked against
    the file name) what a float32 table holds."""
    return FLOAT32_MAX if parameter == "RecordID" else MAX_MEASUREMENT


def _parse_line(line: bytes) -> tuple[float, str, float] | str:
    """One data line -> (hours, parameter, value), or the reason it is rejected."""
    fields = line.decode("utf-8", errors="replace").strip().split(",")
    if len(fields) != 3:
        return f"expected 3 comma-separated fields (Time,Parameter,Value), got {len(fields)}: {line[:80]!r}"
    time_text, parameter, value_text = fields
    match = _TIME.match(time_text)
    if not match:
        return f"unparseable time {time_text!r} (expected HH:MM)"
    if parameter not in KNOWN_PARAMETERS:
        return f"unknown parameter {parameter!r}"
    value = parse_value(value_text, parameter, _limit(parameter))
    if isinstance(value, str):
        return value
    return int(match.group(1)) + int(match.group(2)) / 60.0, parameter, value


def _parse_record_slowly(index: int, record: Record, skips: list[Skip]) -> list[tuple[int, float, str, float]]:
    """Line-by-line parse of one record that broke a rule, reporting each rejected line; its rows as tuples (one
    frame for all such records is made by the caller: a frame per record cost more than the parsing)."""
    rows = []
    lines = record.text.replace(b"\r\n", b"\n").split(b"\n")
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        parsed = line_too_long(line) or _parse_line(line)
        if isinstance(parsed, str):
            skips.append(Skip(record.origin, number, parsed))
        else:
            rows.append((index, *parsed))
    return rows


def _fast_parse(records: list[Record]) -> tuple[pd.DataFrame, set[int], list[tuple[int, int]]]:
    """Parse all records in one pyarrow pass; return the rows, the indices of records needing a slow look, and the
    (record index, line number) of each nameless line (``NAMELESS_PARAMETER``) left out of the rows.

    A nameless line is the one fault read here: in a record with no other fault, every line is one row in order,
    so a row's line number is its place in its record plus 2 (the header is line 1)."""
    data, suspicious = prefixed_rows(records, HEADER, b",")
    if not data:  # every record is empty or was set aside: nothing for the CSV reader
        columns = {"record": np.zeros(0, "int64"), "time": np.zeros(0), "parameter": np.zeros(0, object)}
        return pd.DataFrame({**columns, "value": np.zeros(0)}), suspicious, []

    def on_invalid_row(row) -> str:
        suspicious.add(int(row.text.split(",", 1)[0]))
        return "skip"

    table = pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=["record", "time", "parameter", "value"]),
        # No quoting: a stray '"' must not open a field that swallows the following lines (of other records too).
        parse_options=pacsv.ParseOptions(quote_char=False, invalid_row_handler=on_invalid_row),
        convert_options=pacsv.ConvertOptions(
            column_types={"record": pa.int64(), "time": pa.string(), "parameter": pa.string(), "value": pa.string()},
            strings_can_be_null=False,
        ),
    )
    record = table["record"].to_numpy()
    bad = np.zeros(len(table), dtype=bool)

    try:
        value = pc.cast(table["value"], pa.float64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        value = pd.to_numeric(table["value"].to_pandas(), errors="coerce").to_numpy(dtype="float64")
    is_id = pc.equal(table["parameter"], "RecordID").to_numpy(zero_copy_only=False)
    bad |= ~(np.abs(value) <= np.where(is_id, FLOAT32_MAX, MAX_MEASUREMENT))  # also NaN and inf

    time_parts = pc.split_pattern(table["time"], ":")
    well_formed = pc.and_(
        pc.equal(pc.list_value_length(time_parts), 2),
        pc.match_substring_regex(table["time"], _TIME.pattern),
    ).to_numpy(zero_copy_only=False)
    bad |= ~well_formed
    hours = np.zeros(len(table))
    if well_formed.any():
        parts = pc.list_flatten(pc.filter(time_parts, pa.array(well_formed)))
        # float64, not int64: an absurd hour (20 digits) must not overflow; it falls outside the window anyway.
        clock = pc.cast(parts, pa.float64()).to_numpy().reshape(-1, 2)
        hours[well_formed] = clock[:, 0] + clock[:, 1] / 60.0

    bad |= ~pc.is_in(table["parameter"], value_set=pa.array(sorted(KNOWN_PARAMETERS))).to_numpy(zero_copy_only=False)
    # A nameless line as the line-by-line parse reads it: a good time, then no name (its value is never read).
    nameless = well_formed & pc.equal(table["parameter"], "").to_numpy(zero_copy_only=False)
    bad &= ~nameless
    suspicious.update(np.unique(record[bad]).tolist())

    starts, first_row = np.unique(record, return_index=True)  # the rows are in record order
    line = np.arange(len(record)) - first_row[np.searchsorted(starts, record)] + 2
    dropped = nameless & ~np.isin(record, list(suspicious))
    rows = pd.DataFrame(
        {
            "record": record,
            "time": hours,
            "parameter": table["parameter"].to_pandas(),
            "value": value,
        }
    )[~nameless].reset_index(drop=True)
    return rows, suspicious, list(zip(record[dropped].tolist(), line[dropped].tolist()))


def parse_records(records: list[Record], strict: bool = False) -> tuple[pd.DataFrame, list[Skip]]:
    """All records -> one long frame (record index, time in hours, parameter, value) and the skipped lines."""
    rows, suspicious, nameless = _fast_parse(records)
    found = [(index, Skip(records[index].origin, line, NAMELESS_PARAMETER)) for index, line in nameless]
    if suspicious:
        slow = []
        for index in sorted(suspicious):
            record, skips = records[index], []
            header = record.text.replace(b"\r\n", b"\n").partition(b"\n")[0]
            if header.strip() != HEADER:
                # Not quoted: the file may be anything (a link to a system file), and its text is not ours to show.
                skips.append(Skip(record.origin, 1, header_differs(header, "Time,Parameter,Value")))
            else:
                slow += _parse_record_slowly(index, record, skips)
            found += [(index, skip) for skip in skips]
        # Typed even when every line was rejected: an empty untyped frame would turn the record column into objects.
        slow = pd.DataFrame(slow, columns=["record", "time", "parameter", "value"])
        slow = slow.astype({"record": "int64", "time": "float64", "value": "float64"})
        rows = pd.concat([rows[~rows["record"].isin(suspicious)], slow], ignore_index=True)
        rows = rows.sort_values("record", kind="stable", ignore_index=True)
    # In the order of the records and their lines, however each was read.
    skips = [skip for _, skip in sorted(found, key=lambda pair: (pair[0], pair[1].line or 0))]
    damage = [skip for skip in skips if skip.reason != NAMELESS_PARAMETER]
    if damage and strict:
        raise PhysioNet2012Error(str(damage[0]))
    log_skips(skips, log)
    return rows, skips


def records_to_tables(records: list[Record], strict: bool = False) -> tuple[pd.DataFrame, pd.DataFrame, list[Skip]]:
    """Records -> observations (the 36 series, first 48 h, simultaneous ``VOLUMES`` summed), static descriptors
    (-1 -> null), skipped lines."""
    record_ids = np.array([r.stay_id for r in records], dtype=np.int64)
    rows, skips = parse_records(records, strict=strict)
    rows["stay_id"] = record_ids[rows["record"].to_numpy()]

    descriptors = rows[rows["parameter"].isin(["RecordID", *STATIC])]
    first = descriptors.drop_duplicates(["record", "parameter"], keep="first")
    declared = first[first["parameter"] == "RecordID"]
    mismatched = declared["value"].to_numpy() != record_ids[declared["record"].to_numpy()]
    if mismatched.any():
        origin = records[int(declared["record"].to_numpy()[mismatched][0])].origin
        raise PhysioNet2012Error(f"{origin}: the RecordID row does not match the file name")
    static = (
        first[first["parameter"].isin(STATIC)]
        .pivot(index="stay_id", columns="parameter", values="value")
        .reindex(index=record_ids, columns=STATIC)
    )
    static = static.mask(static == -1).rename_axis("stay_id").reset_index()

    series = rows[rows["parameter"].isin(TIME_SERIES) & (rows["time"] <= WINDOW_HOURS)]
    observations = series.rename(columns={"parameter": "variable"})[["stay_id", "time", "variable", "value"]]
    return sum_simultaneous(observations, VOLUMES), static, skips


def read_record_files(
    paths: list[Path], strict: bool = True, left_out: list[LeftOut] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stand-alone record files (``RECORDID.txt``, as uploaded or given to ``garlic predict``) -> tables; a record
    without an observation in the window is refused, or added to ``left_out`` when given
    (``records_with_observations``)."""
    records = records_from_files(paths, _RECORD_NAME, PhysioNet2012Error, "RECORDID.txt (e.g. 132539.txt)")
    observations, static, _ = records_to_tables(records, strict=strict)
    window = f"the first {WINDOW_HOURS:g} h"
    kept = records_with_observations(records, observations["stay_id"].unique(), window, PhysioNet2012Error, left_out)
    return observations, static[static["stay_id"].isin(kept)].reset_index(drop=True)


def format_record(stay_id: int, observations: pd.DataFrame, static: dict[str, float]) -> str:
    """One stay in the release's text format: descriptors first (-1 when unknown), then ``HH:MM,Parameter,Value``."""
    lines = ["Time,Parameter,Value", f"00:00,RecordID,{stay_id}"]
    for name in STATIC:
        value = static.get(name)
        lines.append(f"00:00,{name},{-1 if value is None or np.isnan(value) else value:g}")
    minutes = np.round(observations["time"].to_numpy() * 60).astype(int)
    for minute, variable, value in zip(minutes, observations["variable"].astype(str), observations["value"]):
        lines.append(f"{minute // 60:02d}:{minute % 60:02d},{variable},{value:.6g}")
    return "\n".join(lines) + "\n"


def read_outcomes(path: Path) -> pd.DataFrame:
    try:
        outcomes = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise PhysioNet2012Error(f"{path}: not a readable outcomes table ({exc})") from exc
    missing = [c for c in OUTCOME_COLUMNS if c not in outcomes.columns]
    if missing:
        raise PhysioNet2012Error(f"{path}: missing column(s) {missing}; expected {OUTCOME_COLUMNS}")
    for column in OUTCOME_COLUMNS:
        numeric = pd.to_numeric(outcomes[column], errors="coerce")
        broken = numeric.isna()
        if broken.any():
            line = int(np.flatnonzero(broken)[0]) + 2
            raise PhysioNet2012Error(
                f"{path} line {line}: {column} is {outcomes[column].iloc[line - 2]!r}, expected a number"
            )
        outcomes[column] = numeric
    if not outcomes[LABEL].isin([0, 1]).all():
        line = int(np.flatnonzero(~outcomes[LABEL].isin([0, 1]))[0]) + 2
        raise PhysioNet2012Error(f"{path} line {line}: {LABEL} must be 0 or 1")
    duplicated = outcomes["RecordID"].duplicated()
    if duplicated.any():
        line = int(np.flatnonzero(duplicated)[0]) + 2
        raise PhysioNet2012Error(f"{path} line {line}: RecordID {outcomes['RecordID'].iloc[line - 2]} repeats")
    return outcomes.astype({"RecordID": "int64"})


def locate_sets(source: Path) -> dict[str, tuple[Path, Path]]:
    """Find each available set's records (archive or folder) and its outcomes file."""
    source = Path(source)
    if not source.is_dir():
        raise PhysioNet2012Error(f"{source}: no such folder (expected the PhysioNet 2012 release)")
    found = {}
    for name in SETS:
        folder, archive = source / f"set-{name}", source / f"set-{name}.tar.gz"
        records = folder if folder.is_dir() else archive if archive.is_file() else None
        if records is None:
            continue
        outcomes = source / f"Outcomes-{name}.txt"
        if not outcomes.is_file():
            raise PhysioNet2012Error(f"{source}: found {records.name} but not its labels {outcomes.name}")
        found[name] = (records, outcomes)
    if not found:
        raise PhysioNet2012Error(
            f"{source}: found none of set-a, set-b, set-c (as .tar.gz or folder) with Outcomes-{{a,b,c}}.txt"
        )
    return found


def hourly_tasks(observations: pd.DataFrame, labels: pd.DataFrame, last_hour: int = int(WINDOW_HOURS)) -> pd.DataFrame:
    """The ``hourly`` cohort's prediction times: (stay_id, h, the stay's label) for every whole hour h from the first
    at or after the stay's first time-series observation (at least 1) to ``last_hour``."""
    first_hour = np.ceil(observations.groupby("stay_id")["time"].min().reindex(labels["stay_id"]).to_numpy())
    first_hour = np.maximum(first_hour, 1).astype(int)
    counts = last_hour - first_hour + 1
    stay = np.repeat(np.arange(len(labels)), counts)
    hour = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + first_hour[stay]
    return pd.DataFrame(
        {
            "stay_id": labels["stay_id"].to_numpy()[stay],
            "time": hour.astype("float32"),
            "label": labels["label"].to_numpy()[stay].astype("int8"),
        }
    )


def preprocess(
    source: Path, destination: Path, sets: list[str] | None = None, strict: bool = False, cohort: str = COHORTS[0]
) -> dict:
    """Read the release in ``source``, build ``cohort`` and write the processed tables to ``destination``; return
    the manifest."""
    if cohort not in COHORTS:
        raise PhysioNet2012Error(f"unknown cohort {cohort!r}; choose one of {', '.join(COHORTS)}")
    located = locate_sets(source)
    if sets:
        absent = [s for s in sets if s not in located]
        if absent:
            raise PhysioNet2012Error(f"{source}: set(s) {absent} requested but not found")
        located = {s: located[s] for s in sets}

    records: list[Record] = []
    skipped_files: list[Skip] = []
    budget = SourceBudget(PhysioNet2012Error)
    outcome_tables = []
    files = {}
    for name, (records_path, outcomes_path) in located.items():
        set_records = list(budget(iter_records(records_path, skipped_files)))
        records.extend(set_records)
        outcome_tables.append(read_outcomes(outcomes_path))
        for path in (records_path, outcomes_path):
            if path.is_file():
                files[path.name] = sha256_of(path)
        if records_path.is_dir():  # an extracted folder: one digest over its record files' names and bytes
            files[f"{records_path.name}/"] = records_digest(set_records)
    outcomes = pd.concat(outcome_tables, ignore_index=True)
    repeated = outcomes["RecordID"][outcomes["RecordID"].duplicated()]
    if len(repeated):
        raise PhysioNet2012Error(f"{source}: RecordID {repeated.iloc[0]} appears in more than one outcomes file")

    if skipped_files and strict:
        raise PhysioNet2012Error(str(skipped_files[0]))
    log_skips(skipped_files, log)
    refuse_repeated_stays(records, PhysioNet2012Error)
    record_ids = np.array([r.stay_id for r in records], dtype=np.int64)
    observations, static, skips = records_to_tables(records, strict=strict)
    skips = [*skipped_files, *skips]  # a file that is not read counts as a skipped line of its own

    dropped = []
    no_outcome = sorted(set(record_ids) - set(outcomes["RecordID"]))
    dropped += [{"stay_id": int(s), "reason": "record has no row in the outcomes file"} for s in no_outcome]
    outcome_without_record = sorted(set(outcomes["RecordID"]) - set(record_ids))
    for stay in outcome_without_record:
        log.warning("outcomes row for RecordID %d has no record file; ignored", stay)
    no_series = sorted(set(record_ids) - set(observations["stay_id"]) - set(no_outcome))
    dropped += [
        {"stay_id": int(s), "reason": f"no time-series observation in the first {WINDOW_HOURS:g} h"} for s in no_series
    ]
    kept = np.setdiff1d(record_ids, [d["stay_id"] for d in dropped])

    labels = (
        outcomes[outcomes["RecordID"].isin(kept)]
        .rename(columns={"RecordID": "stay_id", LABEL: "label"})
        .sort_values("stay_id", ignore_index=True)
    )
    static = static[static["stay_id"].isin(kept)].sort_values("stay_id", ignore_index=True)
    observations = observations[observations["stay_id"].isin(kept)]

    manifest = {
        "dataset": "physionet2012",
        "source": {"sets": sorted(located), "files_sha256": files},
        "window_hours": WINDOW_HOURS,
        "summed_variables": VOLUMES,
        "label": LABEL,
        "counts": {
            "records_read": len(records),
            "outcomes_read": int(len(outcomes)),
            "deaths_in_outcomes": int(outcomes[LABEL].sum()),
            "dropped_stays": len(dropped),
            "skipped_lines": len(skips),
            "outcomes_without_record": len(outcome_without_record),
        },
        "dropped_stays": dropped,
        "skipped_lines": [str(s) for s in skips],
        "outcomes_without_record": [int(s) for s in outcome_without_record],
    }
    tasks = None
    if cohort == "hourly":  # the default cohort's manifest stays as it was, so its runs keep their data digest
        tasks = hourly_tasks(observations, labels)
        manifest |= {"cohort": cohort, "task": HOURLY_TASK}
    write_processed(destination, observations, static, labels, TIME_SERIES, manifest, tasks)
    log.info("physionet2012: %d stays kept, %d dropped, %d lines skipped", len(kept), len(dropped), len(skips))
    return read_manifest(destination)  # as written, with the counts and variable list that write_processed adds


SOURCE = Source(
    "physionet2012",
    lambda destination, source, cohort, strict=False: preprocess(source, destination, strict=strict, cohort=cohort),
    options=frozenset({"source", "strict"}),
    required=frozenset({"source"}),
    cohorts=COHORTS,
    plain_default=True,
    source_help="the folder with set-a/b/c and Outcomes-a/b/c.txt",
    record_suffix=".txt",
    read_record_files=read_record_files,
)
