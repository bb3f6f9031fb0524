"""Bring your own data: a MEDS folder (``garlic.io.meds``) and its label files -> the processed tables.

Every labelled subject becomes one stay (``stay_id`` = ``subject_id``). Its input window opens ``window_hours``
before its first prediction time and closes at its last one, both ends included; its hours count from the window's
opening. A subject with one label row asks for one risk, from its whole window, with that label; when a subject
has several, the dataset gets a tasks table (``garlic.io.tables.TASKS``): one prediction time per label row, each
reading the window up to it, and the stay's label is 1 when any of its rows is.

The time-series variables are numeric codes with a time, chosen by one rule: the codes of a list file (one a line,
in its order), or the N most frequent among the training subjects' timed numeric events (``metadata/
subject_splits.parquet``'s ``train`` subjects when the folder has that file, else every labelled subject), most
frequent first. The static features are numeric codes with a null time: those of a list file, or every one found,
in alphabetical order. An event without a numeric value is not read, nor one whose value is not finite or beyond
+-100,000 (``garlic.sources.raw.MAX_MEASUREMENT``: corruption, not a clinical outlier, as the record readers have it):
those are counted in the manifest and the first is named in the log. A static code recorded with several values
keeps the one recorded most often, the largest of equally frequent ones, whatever the rows' order; a variable
recorded twice at one time keeps the later row, as the tensors do; a warning names either, as it names rows not
sorted by subject and time and a subject found in several shards (read all the same). A subject with static
features but no event of the variables in its window is kept, as a stay of one empty step (Raindrop's P19 cohort
keeps such stays); one with neither is dropped, counted in the manifest.

When the folder has ``metadata/subject_splits.parquet``, the manifest records its parts (``train``, ``tuning`` as
the validation part, ``held_out`` as the test part) for the protocol ``subject-splits`` (``garlic.data.splits``).

The shards are read one at a time, in batches, row group by row group (``garlic.io.meds.iter_events``): memory
holds one row group and what is kept, never a whole shard. With the N most frequent codes they are read twice
(count, then keep).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from garlic.io.meds import (
    MICROSECONDS_PER_HOUR,
    SPLIT_NAMES,
    MedsError,
    code_counts,
    code_positions,
    iter_events,
    read_labels,
    read_subject_splits,
    shards,
    times_to_hours,
)
from garlic.io.tables import read_manifest, sha256_of, write_processed
from garlic.sources import Source
from garlic.sources.raw import MAX_MEASUREMENT

log = logging.getLogger(__name__)

DEFAULT_WINDOW_HOURS = 48.0
DEFAULT_VARIABLES = 40  # the N most frequent numeric codes when no list file is given


def read_code_list(path: Path) -> list[str]:
    """One code a line (blank lines and ``#`` comments skipped); a code listed twice is refused, naming its line."""
    if not Path(path).is_file():
        raise MedsError(f"{path}: no such file (a list of codes, one a line; --variables also takes a number N)")
    codes: list[str] = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        code = line.strip()
        if not code or code.startswith("#"):
            continue
        if code in codes:
            raise MedsError(f"{path}: line {number}: code {code!r} is listed twice")
        codes.append(code)
    if not codes:
        raise MedsError(f"{path}: no code listed (expected one code a line)")
    return codes


def most_frequent_codes(paths: list[Path], subjects: np.ndarray, count: int) -> list[str]:
    """The ``count`` codes most often found with a time and a number among ``subjects`` (ties: alphabetical)."""
    counts: Counter[str] = Counter()
    for path in paths:
        for batch in iter_events(path, subjects):
            counts.update(code_counts(batch.code, batch.timed))
    return [code for code, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:count]]


def _prediction_windows(labels: pd.DataFrame, span: float) -> pd.DataFrame:
    """Per subject (sorted): the window's opening and closing (microseconds) and its number of label rows."""
    grouped = labels.groupby("subject_id", sort=True)["prediction_time"]
    return pd.DataFrame(
        {
            "opens": grouped.min() - int(round(span * MICROSECONDS_PER_HOUR)),
            "closes": grouped.max(),
            "rows": grouped.size(),
        }
    )


def _read_events(paths: list[Path], windows: pd.DataFrame, variables: list[str], static: list[str] | None):
    """The variables' events inside each subject's window, as observations, and the static events of the ``static``
    codes (None: every numeric code with a null time) as rows of stay_id, code and value; one batch at a time."""
    subjects = windows.index.to_numpy("int64")
    opens, closes = windows["opens"].to_numpy("int64"), windows["closes"].to_numpy("int64")
    parts: dict[str, list[np.ndarray]] = {key: [] for key in ("stay", "time", "code", "value")}
    static_rows: list[pd.DataFrame] = []
    left_out, seen, layout = LeftOut(), Seen(np.zeros(len(variables), "int64")), Layout(np.full(len(subjects), -1))
    for number, path in enumerate(paths):
        for batch in iter_events(path, subjects):
            where = np.searchsorted(subjects, batch.subject_id)
            layout.check(number, path, batch, where)
            code = code_positions(batch.code, variables)
            usable = np.abs(batch.value) <= MAX_MEASUREMENT  # False for NaN and inf too
            seen.count(code, batch.time[batch.timed & (code >= 0) & usable], batch.timed & (code >= 0) & usable)
            inside = batch.timed & (code >= 0) & (batch.time >= opens[where]) & (batch.time <= closes[where])
            untimed = ~batch.timed
            if static is not None:
                untimed &= code_positions(batch.code, static) >= 0
            unknown = np.isnan(batch.value)  # a static NaN is a feature not known: it stays missing
            left_out.count(path, batch, (inside & ~usable) | (untimed & ~usable & ~unknown))
            inside &= usable
            untimed &= usable | unknown
            parts["stay"].append(batch.subject_id[inside])
            parts["time"].append(times_to_hours(batch.time[inside], opens[where[inside]]))
            parts["code"].append(code[inside].astype("int32"))
            parts["value"].append(batch.value[inside])
            if untimed.any():
                codes = batch.code.filter(pa.array(untimed)).cast(pa.string()).to_numpy(zero_copy_only=False)
                static_rows.append(
                    pd.DataFrame({"stay_id": batch.subject_id[untimed], "code": codes, "value": batch.value[untimed]})
                )
    arrays = {key: np.concatenate(chunks) if chunks else np.zeros(0) for key, chunks in parts.items()}
    observations = pd.DataFrame(
        {
            "stay_id": arrays["stay"].astype("int64"),
            "time": arrays["time"].astype("float32"),
            "variable": pd.Categorical.from_codes(arrays["code"].astype("int32"), categories=variables),
            "value": arrays["value"].astype("float32"),
        }
    )
    static_events = (
        pd.concat(static_rows, ignore_index=True)
        if static_rows
        else pd.DataFrame({"stay_id": [], "code": [], "value": []})
    )
    return observations, static_events, left_out, seen, layout


@dataclass
class Layout:
    """Where the labelled subjects' rows break MEDS's layout (a subject's events in one shard, sorted by time): the
    first row out of order, and the subjects found in more than one shard. The read does not depend on either (the
    events are sorted as they are read), but an ETL that writes so may have meant another thing: it is said."""

    shard_of: np.ndarray  # each subject's first shard, -1 before any
    unsorted: str | None = None
    split: int = 0
    first_split: str | None = None
    _last: tuple[int, int] | None = None  # the previous kept row's subject and time, across batches

    def check(self, number: int, path: Path, batch, where: np.ndarray) -> None:
        if not len(where):
            return
        subject = batch.subject_id
        time = np.where(batch.timed, batch.time, np.iinfo("int64").min)  # a static event sorts first
        carried = self._last is not None
        if carried:
            subject, time = np.r_[self._last[0], subject], np.r_[self._last[1], time]
        if self.unsorted is None:
            back = (subject[1:] < subject[:-1]) | ((subject[1:] == subject[:-1]) & (time[1:] < time[:-1]))
            if back.any():
                at = int(np.flatnonzero(back)[0])  # rows at and at + 1 of these arrays: the later is out of order
                row, now, before = int(batch.row[at + 1 - carried]), int(subject[at + 1]), int(subject[at])
                self.unsorted = (
                    f"{path}: row {row}, subject {now} after subject {before}"
                    if now != before
                    else f"{path}: row {row}, subject {now}: {_shown_time(time[at + 1])} after {_shown_time(time[at])}"
                )
        self._last = (int(subject[-1]), int(time[-1]))
        first = self.shard_of[where]
        elsewhere = (first >= 0) & (first != number)
        if elsewhere.any():
            moved = np.unique(where[elsewhere])
            self.split += int((self.shard_of[moved] >= 0).sum())
            self.first_split = self.first_split or (
                f"subject {int(batch.subject_id[elsewhere][0])} in "
                f"{Path(path).name} and shard {int(first[elsewhere][0])}"
            )
            self.shard_of[moved] = -2  # counted once
        self.shard_of[where[first == -1]] = number

    def warn(self) -> None:
        if self.unsorted:
            log.warning(
                "meds: rows not sorted by subject and time, as MEDS writes them (read all the same; where one "
                "code has two values at one time, the later row is kept): the first, %s",
                self.unsorted,
            )
        if self.split:
            log.warning(
                "meds: %d subject(s) have events in more than one shard (MEDS keeps a subject in one; read as "
                "one subject): the first, %s",
                self.split,
                self.first_split,
            )


@dataclass
class Seen:
    """The variables' usable events of the labelled subjects at any time, in their windows or not: how many of each
    variable, and the first and last time (microseconds; None before any), to say why a window holds none."""

    events: np.ndarray
    first: int | None = None
    last: int | None = None

    def count(self, code: np.ndarray, times: np.ndarray, among: np.ndarray) -> None:
        self.events += np.bincount(code[among], minlength=len(self.events))
        if len(times):
            self.first = int(times.min()) if self.first is None else min(self.first, int(times.min()))
            self.last = int(times.max()) if self.last is None else max(self.last, int(times.max()))


@dataclass
class LeftOut:
    """The events left out for their value (not finite, or beyond +-MAX_MEASUREMENT): how many, and the first."""

    events: int = 0
    first: str | None = None

    def count(self, path: Path, batch, bad: np.ndarray) -> None:
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            self.events += int(bad.sum())
            self.first = self.first or (
                f"{path}: row {int(batch.row[at])}, column numeric_value: "
                f"{float(batch.value[at])!r} (code {batch.code[at].as_py()!r})"
            )


@dataclass
class MedsTables:
    """What a MEDS folder holds for its labelled subjects, as the processed tables have it (``garlic.io.tables``):
    the stays with an event of the variables in their window, and ``label_rows``, their MEDS label rows."""

    observations: pd.DataFrame
    static: pd.DataFrame
    labels: pd.DataFrame
    tasks: pd.DataFrame | None
    label_rows: pd.DataFrame
    left_out: LeftOut
    seen: Seen


def read_tables(
    paths: list[Path], label_rows: pd.DataFrame, window_hours: float, variables: list[str], static: list[str] | None
) -> MedsTables:
    """The shards ``paths`` read for the subjects of ``label_rows`` (``garlic.io.meds.read_labels``): the
    ``variables`` inside each window, the ``static`` codes (None: every numeric code with a null time, in
    alphabetical order); a tasks table when a subject has several label rows."""
    windows = _prediction_windows(label_rows, window_hours)
    observations, static_events, left_out, seen, layout = _read_events(paths, windows, variables, static)
    layout.warn()
    _warn_of_two_values(observations)
    features = static if static is not None else sorted(static_events["code"].unique())
    # A subject with static features but no event in its window is a stay of one empty step, as Raindrop's P19
    # cohort keeps them (garlic.io.tensors); one with neither is not.
    observed = np.union1d(
        observations["stay_id"].to_numpy("int64"),
        static_events["stay_id"].to_numpy("int64")[static_events["value"].notna().to_numpy()],
    )
    kept = windows.loc[observed]
    static_table = (
        _static_values(static_events)
        .pivot(index="stay_id", columns="code", values="value")
        .reindex(index=observed, columns=features)
        .rename_axis(index="stay_id", columns=None)
        .reset_index()
    )
    kept_rows = label_rows[label_rows["subject_id"].isin(observed)]
    label_table = kept_rows.groupby("subject_id", sort=True)["label"].max().rename_axis("stay_id").reset_index()
    tasks = None
    if (kept["rows"] > 1).any():
        opens = kept["opens"].reindex(kept_rows["subject_id"]).to_numpy("int64")
        tasks = pd.DataFrame(
            {
                "stay_id": kept_rows["subject_id"].to_numpy("int64"),
                "time": times_to_hours(kept_rows["prediction_time"].to_numpy(), opens),
                "label": kept_rows["label"].to_numpy("int8"),
            }
        )
    return MedsTables(observations, static_table, label_table, tasks, kept_rows, left_out, seen)


def _static_values(static_events: pd.DataFrame) -> pd.DataFrame:
    """One value per subject and static code, whatever the rows' order: where a code was recorded with several
    values, the one recorded most often, the largest of equally frequent ones (a warning names the first such
    subject); a NaN (not known) only where no value is."""
    known = static_events.dropna(subset=["value"])
    counted = known.groupby(["stay_id", "code", "value"], sort=False).size().rename("times").reset_index()
    chosen = counted.sort_values(
        ["stay_id", "code", "times", "value"], ascending=[True, True, False, False]
    ).drop_duplicates(["stay_id", "code"])
    several = counted.duplicated(["stay_id", "code"], keep=False)
    if several.any():
        first = counted[several].sort_values(["stay_id", "code", "value"])
        stay, code = first.iloc[0]["stay_id"], first.iloc[0]["code"]
        values = first[(first["stay_id"] == stay) & (first["code"] == code)]["value"].tolist()
        pairs = counted.loc[several, ["stay_id", "code"]].drop_duplicates()
        log.warning(
            "meds: %d subject(s) have a static code recorded with different values; each keeps the value "
            "recorded most often, the largest of equally frequent ones: the first, subject %d, code %r: %s",
            len(pairs),
            int(stay),
            code,
            ", ".join(f"{v:g}" for v in values),
        )
    unknown = static_events[static_events["value"].isna()].drop_duplicates(["stay_id", "code"])
    unknown = unknown.merge(chosen[["stay_id", "code"]], how="left", indicator=True)
    return pd.concat(
        [
            chosen[["stay_id", "code", "value"]],
            unknown.loc[unknown["_merge"] == "left_only", ["stay_id", "code", "value"]],
        ],
        ignore_index=True,
    )


def _warn_of_two_values(observations: pd.DataFrame) -> None:
    """A warning when a variable has two values at one time of a subject: the later row is kept (as the tensors
    keep it), so the rows' order decides."""
    keys = ["stay_id", "time", "variable"]
    twice = observations.duplicated(keys, keep=False)
    if not twice.any():
        return
    differ = observations[twice].groupby(keys, observed=True)["value"].nunique()
    differ = differ[differ > 1]
    if len(differ):
        stay, time, variable = differ.index[0]
        log.warning(
            "meds: at %d time(s) of a subject, a variable has two values (the later row is kept, so the rows' "
            "order decides): the first, subject %d, code %r, %g h into its window",
            len(differ),
            int(stay),
            variable,
            time,
        )


def _shown_time(microseconds: int) -> str:
    if microseconds == np.iinfo("int64").min:
        return "no time (a static event)"
    return str(pd.Timestamp(int(microseconds), unit="us"))


def _check_events_read(
    tables: MedsTables,
    variables: list[str],
    static: list[str] | None,
    variables_given: str | None,
    static_given: Path | None,
    labels: Path,
    window_hours: float,
) -> None:
    """A MedsError when no window holds an event of the variables (the label file and the events' times named, or the
    list of codes that none matched), and a warning for each listed code that nothing matched: never a dataset
    that is empty without a word."""
    listed = variables_given is not None and not str(variables_given).isdigit()
    if not len(tables.observations):
        if not tables.seen.events.any():
            given = f"the codes listed in {variables_given}" if listed else "the variables"
            raise MedsError(
                f"{labels}: its subjects have no timed numeric event of {given} ({', '.join(variables[:5])}"
                f"{', ...' if len(variables) > 5 else ''}) in the MEDS folder"
            )
        times = tables.label_rows["prediction_time"]
        raise MedsError(
            f"{labels}: no event of the variables falls in any input window ({window_hours:g} h up to "
            f"each prediction time): the prediction times run from {_shown_time(times.min())} to "
            f"{_shown_time(times.max())}, the subjects' {int(tables.seen.events.sum())} events of the "
            f"variables from {_shown_time(tables.seen.first)} to {_shown_time(tables.seen.last)}; check "
            "prediction_time and --window-hours"
        )
    if listed:
        kept = tables.observations["variable"].value_counts().reindex(variables).fillna(0).to_numpy()
        absent = [code for code, n in zip(variables, tables.seen.events) if n == 0]
        outside = [code for code, n, k in zip(variables, tables.seen.events, kept) if n and not k]
        if absent:
            log.warning(
                "meds: %s: %s: no timed numeric event of the labelled subjects has this code; its column stays empty",
                variables_given,
                ", ".join(map(repr, absent)),
            )
        if outside:
            log.warning(
                "meds: %s: %s: every event of this code lies outside the input windows; its column stays empty",
                variables_given,
                ", ".join(map(repr, outside)),
            )
    if static is not None:
        found = set(tables.static.columns[tables.static.notna().any()])
        absent = [code for code in static if code not in found]
        if absent:
            log.warning(
                "meds: %s: %s: no static numeric event of the labelled subjects has this code; its column stays empty",
                static_given,
                ", ".join(map(repr, absent)),
            )


def _check_both_outcomes(labels: Path, label_rows: pd.DataFrame, tables: MedsTables) -> None:
    """A MedsError unless what is kept (the stays, or the label rows of a tasks table) has both outcomes: a model of
    one outcome learns nothing (and most fail on it), so the label file is named with its counts."""
    kept, unit = (
        (tables.labels["label"], "subjects kept")
        if tables.tasks is None
        else (tables.tasks["label"], "label rows kept")
    )
    true, kept_true = int(label_rows["label"].sum()), int(kept.sum())
    if 0 < kept_true < len(kept):
        return
    raise MedsError(
        f"{labels}: {len(label_rows)} label rows, {true} true and {len(label_rows) - true} false "
        f"({len(kept)} {unit}: {kept_true} true, {len(kept) - kept_true} false): a model learns from both "
        "outcomes; give label rows of both"
    )


def preprocess(
    source: Path,
    destination: Path,
    labels: Path,
    window_hours: float = DEFAULT_WINDOW_HOURS,
    variables: str | None = None,
    static: Path | None = None,
) -> dict:
    """Read the MEDS folder ``source`` and the label file(s) ``labels``, write the processed tables to
    ``destination``; return the manifest. ``variables``: a list file of codes, or a number N (the N most frequent);
    ``static``: a list file of static codes (default: every numeric code with a null time)."""
    source = Path(source)
    if not window_hours > 0:
        raise MedsError(f"--window-hours must be a positive number of hours, got {window_hours}")
    counted = variables is None or str(variables).isdigit()
    if counted and variables is not None and int(variables) == 0:
        raise MedsError(
            "--variables 0: give N of at least 1 (the N most frequent timed numeric codes), or a file of codes"
        )
    listed = None if counted else read_code_list(Path(variables))  # the lists first: before any long read
    static_codes = None if static is None else read_code_list(Path(static))
    paths = shards(source)
    label_rows = read_labels(labels)
    splits = read_subject_splits(source)
    if counted:
        training = np.unique(label_rows["subject_id"].to_numpy("int64"))
        if splits is not None:
            training = np.intersect1d(training, splits.loc[splits["split"] == "train", "subject_id"].to_numpy())
        chosen = most_frequent_codes(paths, training, int(variables or DEFAULT_VARIABLES))
        rule = f"the {int(variables or DEFAULT_VARIABLES)} most frequent timed numeric codes of the training subjects"
    else:
        chosen, rule = listed, f"the codes listed in {Path(variables).name}"
    if not chosen:
        raise MedsError(f"{source}: no timed numeric event of a labelled subject; nothing to use as a variable")

    tables = read_tables(paths, label_rows, float(window_hours), chosen, static_codes)
    _check_events_read(tables, chosen, static_codes, variables, static, Path(labels), float(window_hours))
    _check_both_outcomes(Path(labels), label_rows, tables)
    observed = tables.labels["stay_id"].to_numpy("int64")
    subjects = np.unique(label_rows["subject_id"].to_numpy("int64"))
    dropped = {
        "no event of the variables in the input window and no static feature": np.setdiff1d(subjects, observed).tolist()
    }
    labels_path = Path(labels)
    if splits is not None:  # the protocol subject-splits takes it (garlic.data.splits)
        parts = {
            part: np.intersect1d(splits.loc[splits["split"] == name, "subject_id"].to_numpy("int64"), observed)
            for part, name in SPLIT_NAMES.items()
        }
    manifest = {
        "dataset": "meds",
        "source": {
            "folder": str(source),
            "shards_bytes": {str(p.relative_to(source)): p.stat().st_size for p in paths},
            "labels": str(labels_path),
            "labels_sha256": {
                p.name: sha256_of(p)
                for p in (sorted(labels_path.rglob("*.parquet")) if labels_path.is_dir() else [labels_path])
            },
        },
        "window_hours": float(window_hours),
        "variable_rule": rule,
        "label": "boolean_value of the MEDS label rows",
        "counts": {
            "label_rows": int(len(label_rows)),
            "subjects_labelled": int(len(subjects)),
            "dropped_stays": {reason: len(ids) for reason, ids in dropped.items()},
            "stays_without_input": int(len(observed) - tables.observations["stay_id"].nunique()),
            "events_left_out_for_their_value": tables.left_out.events,
            "observations_per_variable": tables.observations["variable"]
            .value_counts()
            .reindex(chosen)
            .astype(int)
            .to_dict(),
        },
        "dropped_stays": {reason: [int(s) for s in ids] for reason, ids in dropped.items()},
        **({} if splits is None else {"subject_splits": {part: ids.tolist() for part, ids in parts.items()}}),
        **(
            {}
            if tables.tasks is None
            else {
                "task": {
                    "prediction_times": "the MEDS label rows' prediction times",
                    "label": "their boolean_value",
                    "score": "",
                }
            }
        ),
    }
    write_processed(destination, tables.observations, tables.static, tables.labels, chosen, manifest, tables.tasks)
    if tables.left_out.events:
        log.warning(
            "meds: %d events left out for a value not finite or beyond +-%s; the first: %s",
            tables.left_out.events,
            f"{MAX_MEASUREMENT:,.0f}",
            tables.left_out.first,
        )
    without_input = manifest["counts"]["stays_without_input"]
    if without_input:
        log.warning(
            "meds: %d of %d stays kept have no event of the variables in their input window (static features alone)",
            without_input,
            len(observed),
        )
    if len(subjects) > len(observed):
        log.warning(
            "meds: %d of %d labelled subjects dropped: neither an event of the variables in the input window "
            "nor a static feature (the manifest's dropped_stays)",
            len(subjects) - len(observed),
            len(subjects),
        )
    log.info("meds: %d stays kept, %d dropped", len(observed), len(subjects) - len(observed))
    return read_manifest(destination)


SOURCE = Source(
    "meds",
    lambda destination, source, labels, window_hours=DEFAULT_WINDOW_HOURS, variables=None, static=None: preprocess(
        source, destination, labels, window_hours, variables, static
    ),
    options=frozenset({"source", "labels", "window_hours", "variables", "static"}),
    required=frozenset({"source", "labels"}),
    source_help="the MEDS folder (data/*.parquet, metadata/) and --labels, its label file or folder",
    named=True,
)
