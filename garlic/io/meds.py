"""The MEDS on-disk contract (Medical Event Data Standard, https://medical-event-data-standard.github.io): what
``garlic export meds`` writes and ``garlic preprocess meds`` (``garlic.sources.meds``) reads, checked against the
``meds`` package's schemas.

A MEDS folder holds:

- ``data/**/*.parquet``: shards of events, ``subject_id`` (int64), ``time`` (timestamp[us], null for a static
  measurement), ``code`` (string), ``numeric_value`` (float32, may be null) and optional extra columns. A subject's
  events lie in one shard, contiguous and sorted by time.
- ``metadata/codes.parquet``: one row per code (``code``, ``description``, ``parent_codes``).
- ``metadata/subject_splits.parquet`` (optional): ``subject_id``, ``split`` (``train``, ``tuning``, ``held_out``).
- ``metadata/dataset.json``: the dataset's name and the ETL that made it.
- label files anywhere (here ``labels/*.parquet``): ``subject_id``, ``prediction_time``, ``boolean_value``; the
  input of a prediction is the subject's data up to and including its prediction time.

A processed dataset goes out as one MEDS subject per stay (``subject_id`` = ``stay_id``), admitted at ``ADMISSION``
(a fixed date: MEDS holds datetimes, the tables hours since admission): each observation is an event whose code
is the variable's name, at the admission plus its hours, each known static feature a static event (null time) whose
code is the feature's name. A dataset with a tasks table gives one label row per prediction time; one without, one
label row per stay, at the end of a window as long as the longest stay's input (``window_hours``), so that
``garlic preprocess meds --window-hours`` with that span reads every stay back from its admission.

Shards are read one at a time, by Parquet row groups, with pyarrow (``iter_events``): it is already the tables'
library, and it streams row groups with the columns asked for, which polars and DuckDB would add a dependency for.
Every folder and file is written beside its destination and renamed into place (``atomic_directory``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from garlic.io.atomic import atomic_file, write_json_atomic
from garlic.io.tables import ProcessedDataset, atomic_directory

ADMISSION = np.datetime64("2000-01-01T00:00:00", "us")  # every exported stay's hour 0
MICROSECONDS_PER_HOUR = 3_600_000_000
ROWS_PER_SHARD = 1_000_000  # a shard ends at the first stay boundary past this many events
LABELS_FOLDER = "labels"
LABELS_FILE = "labels.parquet"
# The dataset's variables and static features in their order, as --variables and --static take them (one a line),
# beside the MEDS metadata: ``garlic preprocess meds`` with them reads the export back in the same column order.
VARIABLES_LIST = "metadata/garlic_variables.txt"
STATIC_LIST = "metadata/garlic_static.txt"
# The meds package's names (meds.data_subdirectory, ...; tests/test_meds.py checks them), spelled here so that
# importing this module does not import meds: its schemas pull in jsonschema, 60 ms at every garlic start.
DATA = "data"
CODES = "metadata/codes.parquet"
SUBJECT_SPLITS = "metadata/subject_splits.parquet"
DATASET_METADATA = "metadata/dataset.json"
SPLIT_NAMES = {"train": "train", "validation": "tuning", "test": "held_out"}
DATA_COLUMNS = ("subject_id", "time", "code", "numeric_value")
LABEL_COLUMNS = ("subject_id", "prediction_time", "boolean_value")
log = logging.getLogger(__name__)


def _meds():
    """The ``meds`` package, imported where a MEDS file is checked or written."""
    import meds

    return meds


class MedsError(ValueError):
    """A MEDS folder or label file that breaks the contract; the message names the file, row and column."""


# ---------------------------------------------------------------------------------------------------------------
# Writing


# The grids an exported time is put on, coarsest first: a recorded time is a whole minute (P12, MIMIC-III's chart
# times) or second far more often than not, and float32 hours hold it only to within a step (13.7 ms at 48 h).
GRIDS_US = (60_000_000, 1_000_000, 1_000, 1)


def hours_to_times(hours: np.ndarray) -> np.ndarray:
    """Hours since admission (float32) -> datetime64[us] from ``ADMISSION``: each on the coarsest grid (a whole
    minute, second, millisecond, else microsecond) whose time ``times_to_hours`` reads back as the same float32, so
    that a time recorded to the minute goes out to the minute exactly (00:07, not 00:07:00.000002, which the plain
    product of the float32 gives) and every time comes back as the hours it left as. Where no grid gives the float32
    back (before 8.4 s, 0.0023 h, a microsecond is more than a float32 step), the nearest microsecond."""
    hours = np.asarray(hours, dtype="float32")
    flat = hours.ravel()
    exact = flat.astype("float64") * MICROSECONDS_PER_HOUR
    offsets = np.rint(exact).astype("int64")
    left = np.arange(flat.size)  # the times not yet placed: each grid tries only those the coarser ones did not fit
    for grid in GRIDS_US[:-1]:
        candidate = np.rint(exact[left] / grid).astype("int64") * grid
        fits = times_to_hours(candidate, 0) == flat[left]
        offsets[left[fits]] = candidate[fits]
        left = left[~fits]
    return ADMISSION + offsets.reshape(hours.shape).astype("timedelta64[us]")


def times_to_hours(microseconds: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """Microseconds since the epoch, minus each row's ``origin`` (microseconds), in hours (float32)."""
    return ((np.asarray(microseconds, "int64") - origin) / MICROSECONDS_PER_HOUR).astype("float32")


def window_hours(dataset: ProcessedDataset) -> float:
    """The span a stay's label row closes: the manifest's ``window_hours``, or more when a stay's input is longer
    (whole hours, so that the span is easy to type)."""
    latest = float(dataset.observations["time"].max()) if len(dataset.observations) else 0.0
    return float(max(dataset.manifest.get("window_hours", 0.0), np.ceil(latest)))


def _events(dataset: ProcessedDataset) -> pd.DataFrame:
    """Every static feature known and every observation as MEDS events, by stay, static ones first, then by time;
    rows at one time keep the tables' order (so that the later of two readings still wins)."""
    static = dataset.static.melt(
        id_vars="stay_id", value_vars=dataset.static_features, var_name="code", value_name="numeric_value"
    ).dropna(subset=["numeric_value"])
    observations = dataset.observations
    events = pd.concat(
        [
            pd.DataFrame(
                {
                    "subject_id": static["stay_id"].to_numpy("int64"),
                    "hours": np.nan,
                    "code": static["code"].to_numpy(str),
                    "numeric_value": static["numeric_value"].to_numpy("float32"),
                }
            ),
            pd.DataFrame(
                {
                    "subject_id": observations["stay_id"].to_numpy("int64"),
                    "hours": observations["time"].to_numpy("float32").astype("float64"),
                    "code": observations["variable"].astype(str).to_numpy(),
                    "numeric_value": observations["value"].to_numpy("float32"),
                }
            ),
        ],
        ignore_index=True,
    )
    return events.sort_values(["subject_id", "hours"], kind="stable", na_position="first", ignore_index=True)


def _data_table(events: pd.DataFrame) -> pa.Table:
    hours = events["hours"].to_numpy()
    static = np.isnan(hours)
    times = hours_to_times(np.where(static, 0.0, hours).astype("float32"))
    table = pa.table(
        {
            "subject_id": pa.array(events["subject_id"].to_numpy("int64")),
            "time": pa.array(times, pa.timestamp("us"), mask=static),
            "code": pa.array(events["code"].to_numpy(str), pa.string()),
            "numeric_value": pa.array(events["numeric_value"].to_numpy("float32")),
        }
    )
    return _meds().DataSchema.align(table)


def _label_table(dataset: ProcessedDataset, span: float) -> pa.Table:
    if dataset.tasks is not None:
        subjects, hours, labels = (dataset.tasks[c].to_numpy() for c in ("stay_id", "time", "label"))
    else:
        subjects = dataset.labels["stay_id"].to_numpy()
        hours, labels = np.full(len(subjects), span, "float32"), dataset.labels["label"].to_numpy()
    return _meds().LabelSchema.align(
        pa.table(
            {
                "subject_id": pa.array(subjects.astype("int64")),
                "prediction_time": pa.array(hours_to_times(hours), pa.timestamp("us")),
                "boolean_value": pa.array(labels.astype(bool)),
            }
        )
    )


def _codes_table(dataset: ProcessedDataset) -> pa.Table:
    """The variables in their order, then the static features not among them; ``description`` says which."""
    described = {name: "time-series variable" for name in dataset.variables}
    for name in dataset.static_features:
        described[name] = "time-series variable and static feature" if name in described else "static feature"
    return _meds().CodeMetadataSchema.align(
        pa.table(
            {
                "code": pa.array(list(described), pa.string()),
                "description": pa.array(list(described.values()), pa.string()),
                "parent_codes": pa.array([[] for _ in described], pa.list_(pa.string())),
            }
        )
    )


ETL_NAME = "garlic export meds"


def _refuse_to_replace(destination: Path) -> None:
    """A MedsError unless ``destination`` is new, empty or a MEDS folder this export wrote: replacing it as a whole
    must never take a user's other files with it."""
    if not destination.exists() or (destination.is_dir() and not any(destination.iterdir())):
        return
    metadata = destination / DATASET_METADATA
    try:
        written_here = json.loads(metadata.read_text()).get("etl_name") == ETL_NAME
    except (OSError, ValueError, AttributeError):
        written_here = False
    if not written_here:
        raise MedsError(
            f"{destination} exists and is not a MEDS folder that garlic export wrote; it would be replaced "
            "as a whole: give a new or empty folder"
        )


def write_meds(
    destination: Path,
    dataset: ProcessedDataset,
    name: str,
    splits: dict[str, np.ndarray] | None = None,
    rows_per_shard: int = ROWS_PER_SHARD,
) -> dict:
    """Write ``dataset`` as a MEDS folder ``destination`` (replaced atomically): data shards, codes, label file,
    the variable and static lists (``VARIABLES_LIST``, ``STATIC_LIST`` where there are static features), and, given
    ``splits`` (``train``/``validation``/``test`` -> stay ids), the subject splits. Returns what it wrote: the shard,
    event and label counts, the label rows' ``window_hours`` and the ``preprocess_options`` that read it back
    (``--labels``, ``--window-hours``, ``--variables``, ``--static``)."""
    _refuse_to_replace(Path(destination))
    span = window_hours(dataset)
    events = _events(dataset)
    subjects = events["subject_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, subjects[1:] != subjects[:-1]])  # first row of each subject
    cuts = [0]
    for start in starts[1:]:
        if start - cuts[-1] >= rows_per_shard:
            cuts.append(int(start))
    cuts.append(len(events))
    labels = _label_table(dataset, span)
    with atomic_directory(Path(destination)) as staging:
        (staging / DATA).mkdir()
        for shard, (first, end) in enumerate(zip(cuts[:-1], cuts[1:])):
            shard_path = staging / DATA / f"{shard}.parquet"
            pq.write_table(_data_table(events.iloc[first:end]), shard_path)
        (staging / "metadata").mkdir()
        pq.write_table(_codes_table(dataset), staging / CODES)
        if splits is not None:
            subject_ids = np.concatenate([splits[part] for part in SPLIT_NAMES]).astype("int64")
            table = pa.table(
                {
                    "subject_id": pa.array(subject_ids),
                    "split": pa.array([SPLIT_NAMES[part] for part in SPLIT_NAMES for _ in splits[part]], pa.string()),
                }
            )
            pq.write_table(_meds().SubjectSplitSchema.align(table), staging / SUBJECT_SPLITS)
        (staging / VARIABLES_LIST).write_text("".join(f"{name}\n" for name in dataset.variables))
        if dataset.static_features:
            (staging / STATIC_LIST).write_text("".join(f"{name}\n" for name in dataset.static_features))
        (staging / LABELS_FOLDER).mkdir()
        pq.write_table(labels, staging / LABELS_FOLDER / LABELS_FILE)
        write_json_atomic(
            staging / DATASET_METADATA,
            {"dataset_name": name, "etl_name": ETL_NAME, "meds_version": _meds().__version__},
        )
    destination = Path(destination)
    options = [
        "--labels",
        str(destination / LABELS_FOLDER / LABELS_FILE),
        "--window-hours",
        f"{span:g}",
        "--variables",
        str(destination / VARIABLES_LIST),
    ]
    if dataset.static_features:
        options += ["--static", str(destination / STATIC_LIST)]
    return {
        "shards": len(cuts) - 1,
        "events": len(events),
        "labels": labels.num_rows,
        "window_hours": span,
        "preprocess_options": options,
    }


PREDICTION_SCHEMA = pa.schema(
    [  # meds-evaluation's binary classification schema
        ("subject_id", pa.int64()),
        ("prediction_time", pa.timestamp("us")),
        ("boolean_value", pa.bool_()),
        ("predicted_boolean_value", pa.bool_()),
        (
            "predicted_boolean_probability",
            pa.float32(),
        ),  # float32, as meds_evaluation.schema.PredictionSchema checks it
    ]
)


def write_predictions(path: Path, rows: pd.DataFrame, threshold: float | None) -> None:
    """Risks as MEDS predictions (``PREDICTION_SCHEMA``, as ``meds-evaluation`` reads them), atomically: ``rows``
    has ``subject_id``, ``prediction_time`` (microseconds since the epoch), ``label`` (the label row's 0/1) and
    ``risk``. ``predicted_boolean_value`` is ``risk >= threshold`` (the risk as the model gave it, before it is
    stored as float32); null throughout without a threshold."""
    risk = rows["risk"].to_numpy("float64")
    alarm = pa.array(risk >= threshold) if threshold is not None else pa.nulls(len(rows), pa.bool_())
    table = pa.table(
        {
            "subject_id": pa.array(rows["subject_id"].to_numpy("int64")),
            "prediction_time": pa.array(rows["prediction_time"].to_numpy("int64"), pa.int64()).cast(pa.timestamp("us")),
            "boolean_value": pa.array(rows["label"].to_numpy().astype(bool)),
            "predicted_boolean_value": alarm,
            "predicted_boolean_probability": pa.array(risk.astype("float32")),
        },
        schema=PREDICTION_SCHEMA,
    )
    with atomic_file(Path(path), suffix=".parquet") as out:
        pq.write_table(table, out)


# ---------------------------------------------------------------------------------------------------------------
# Reading


def read_as(data_type: pa.DataType) -> pa.DataType:
    """The type a column of ``data_type`` is read as: the layouts of one logical type (polars writes ``large_string``
    and ``large_list``, a categorical as a dictionary, some writers ``string_view``) as one (``string``, ``list``),
    and a ``double`` as the ``float`` its values are read into (the tables hold float32); any other type as it is."""
    if pa.types.is_dictionary(data_type):
        return read_as(data_type.value_type)
    if pa.types.is_large_string(data_type) or pa.types.is_string_view(data_type):
        return pa.string()
    if pa.types.is_large_list(data_type) or pa.types.is_list_view(data_type):
        return pa.list_(read_as(data_type.value_type))
    if pa.types.is_float64(data_type):
        return pa.float32()
    if pa.types.is_timestamp(data_type) and data_type.tz is None:  # pandas writes nanoseconds: read as microseconds
        return pa.timestamp("us")
    return data_type


def _microseconds(values: pa.Array | pa.ChunkedArray, path: Path, column: str, offset: int = 0) -> np.ndarray:
    """A timestamp column in microseconds since the epoch (int64, 0 for a null), from any unit; a MedsError naming
    the first row with a finer part than a microsecond (MEDS times are microseconds)."""
    if values.type != pa.timestamp("us"):
        try:
            values = values.cast(pa.timestamp("us"))  # safe: refuses to drop a nanosecond
        except pa.ArrowInvalid:
            nanoseconds = values.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
            row = offset + int(np.flatnonzero(nanoseconds % 1000)[0])
            raise MedsError(
                f"{path}: row {row}, column {column}: a time finer than a microsecond, where MEDS "
                "times are whole microseconds"
            ) from None
    return values.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)


def _checked_schema(schema_class, arrow_schema: pa.Schema, path: Path, required: tuple[str, ...]) -> None:
    """``arrow_schema`` against ``schema_class`` of the ``meds`` package, a column of another layout of the type it
    wants (``read_as``) as that type: a MedsError naming the file and column."""
    absent = [column for column in required if column not in arrow_schema.names]
    if absent:
        raise MedsError(
            f"{path}: no column {', '.join(absent)}; a MEDS {schema_class.__name__} file has {', '.join(required)}"
        )
    from flexible_schema.exceptions import SchemaValidationError  # with meds, only where a file is checked

    wanted = schema_class.schema()
    found = [arrow_schema.field(name) for name in arrow_schema.names if name in wanted.names]
    try:  # a column read as the schema's type is read alike: checked as that type
        schema_class.validate(
            pa.schema(
                [
                    field.with_type(wanted.field(field.name).type)
                    if read_as(field.type) == read_as(wanted.field(field.name).type)
                    else field
                    for field in found
                ]
            )
        )
    except SchemaValidationError as error:
        mistyped = ", ".join(
            f"column {column}: expected {want}, found {got}" for column, want, got in error.mistyped_cols or []
        )
        raise MedsError(f"{path}: {mistyped or error}") from None


def _first_null(table: pa.Table | pa.RecordBatch, columns: tuple[str, ...], path: Path, offset: int) -> None:
    for column in columns:
        values = table.column(column)
        if values.null_count:
            row = offset + int(pc.index(pc.is_null(values), True).as_py())
            raise MedsError(f"{path}: row {row}, column {column}: null, where MEDS requires a value")


def shards(folder: Path) -> list[Path]:
    """The data shards of a MEDS folder, in path order; a MedsError when there is none."""
    data = Path(folder) / DATA
    found = sorted(data.rglob("*.parquet")) if data.is_dir() else []
    if not found:
        raise MedsError(f"{data}: no .parquet shard; a MEDS folder holds its events in {DATA}/")
    return found


@dataclass
class EventBatch:
    """One batch of a shard's events that have a number: subject ids, times (microseconds since the epoch, 0 where
    ``timed`` is False: a static event), codes (dictionary-encoded: ``code_positions`` maps them to a vocabulary),
    values, and each event's row in its shard (counted from 0), to name it."""

    subject_id: np.ndarray
    time: np.ndarray
    timed: np.ndarray
    code: pa.DictionaryArray
    value: np.ndarray
    row: np.ndarray


def code_positions(codes: pa.DictionaryArray, vocabulary: list[str]) -> np.ndarray:
    """Each code's position in ``vocabulary``, -1 for a code outside it: looked up once per distinct code."""
    positions = pc.index_in(codes.dictionary, value_set=pa.array(vocabulary, pa.string())).fill_null(-1)
    return positions.to_numpy(zero_copy_only=False)[codes.indices.to_numpy(zero_copy_only=False)]


def code_counts(codes: pa.DictionaryArray, among: np.ndarray) -> dict[str, int]:
    """How often each code occurs in the rows ``among`` (a boolean mask)."""
    counts = np.bincount(codes.indices.to_numpy(zero_copy_only=False)[among], minlength=len(codes.dictionary))
    return {code: int(n) for code, n in zip(codes.dictionary.to_pylist(), counts) if n}


def iter_events(path: Path, subjects: np.ndarray | None = None) -> Iterator[EventBatch]:
    """The events of one shard in batches of at most 65,536 rows, read row group by row group (memory bounded by a
    row group, whatever the file's size), checked against ``meds.DataSchema``; only the subjects in ``subjects``
    (sorted) when given."""
    try:
        _checked_schema(_meds().DataSchema, pq.read_schema(path), path, DATA_COLUMNS)
        parquet = pq.ParquetFile(path, read_dictionary=["code"])  # each distinct code decoded once per row group
    except (OSError, pa.ArrowInvalid) as error:
        raise MedsError(f"{path}: not a readable Parquet file ({error})") from None
    row = 0
    for batch in parquet.iter_batches(columns=list(DATA_COLUMNS)):
        _first_null(batch, ("subject_id", "code"), path, row)
        keep = pc.is_valid(batch.column("numeric_value")).to_numpy(zero_copy_only=False)
        subject_id = batch.column("subject_id").to_numpy()
        if subjects is not None and len(subjects):
            where = np.minimum(np.searchsorted(subjects, subject_id), len(subjects) - 1)
            keep &= subjects[where] == subject_id
        elif subjects is not None:
            keep[:] = False
        kept = batch.filter(pa.array(keep))
        time = kept.column("time")
        code = kept.column("code")
        if time.type != pa.timestamp("us"):  # another unit (pandas writes nanoseconds): a finer time named by its row
            _microseconds(batch.column("time"), path, "time", row)
        yield EventBatch(
            subject_id=subject_id[keep],
            time=_microseconds(time, path, "time", row),
            timed=pc.is_valid(time).to_numpy(zero_copy_only=False),
            code=_string_codes(code),
            value=kept.column("numeric_value").to_numpy(zero_copy_only=False).astype("float32"),
            row=row + np.flatnonzero(keep),
        )
        row += batch.num_rows


def _string_codes(code: pa.Array) -> pa.DictionaryArray:
    """A batch's codes as a dictionary of ``string`` (``code_positions`` looks them up as such), whatever string
    layout the shard has."""
    if not isinstance(code, pa.DictionaryArray):
        code = code.dictionary_encode()
    if code.dictionary.type != pa.string():
        code = pa.DictionaryArray.from_arrays(code.indices, code.dictionary.cast(pa.string()))
    return code


def read_labels(source: Path) -> pd.DataFrame:
    """A label file, or every ``.parquet`` file of a folder: ``subject_id``, ``prediction_time`` (microseconds since
    the epoch) and ``label`` (0/1 from ``boolean_value``), checked against ``meds.LabelSchema``."""
    source = Path(source)
    paths = sorted(source.rglob("*.parquet")) if source.is_dir() else [source]
    if not paths or not paths[0].is_file():
        raise MedsError(f"{source}: no MEDS label file (.parquet with {', '.join(LABEL_COLUMNS)})")
    frames = []
    for path in paths:
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowInvalid) as error:
            raise MedsError(f"{path}: not a readable Parquet file ({error})") from None
        _checked_schema(_meds().LabelSchema, table.schema, path, LABEL_COLUMNS)
        _first_null(table, LABEL_COLUMNS, path, 0)
        unread = [
            name
            for name in table.column_names
            if name not in LABEL_COLUMNS and table.column(name).null_count < table.num_rows
        ]
        if unread:  # another task's values (integer_value, float_value, ...): not this binary task's label
            log.warning("meds: %s: column(s) %s not read: the label is boolean_value", path, ", ".join(unread))
        frame = pd.DataFrame(
            {
                "subject_id": table.column("subject_id").to_numpy(),
                "prediction_time": _microseconds(table.column("prediction_time"), path, "prediction_time"),
                "label": table.column("boolean_value").to_numpy(zero_copy_only=False).astype("int8"),
            }
        )
        frames.append(frame.assign(file=str(path), row=np.arange(len(frame))))
    rows = pd.concat(frames, ignore_index=True)
    repeated = rows.duplicated(["subject_id", "prediction_time"])
    if repeated.any():
        again = rows[repeated].iloc[0]
        raise MedsError(
            f"{again['file']}: row {again['row']}: subject {again['subject_id']} is labelled twice at "
            "one prediction_time; a label file has one row per subject and time"
        )
    return rows.drop(columns=["file", "row"])


def read_subject_splits(folder: Path) -> pd.DataFrame | None:
    """``metadata/subject_splits.parquet`` (``subject_id``, ``split``) when the folder has one, checked."""
    path = Path(folder) / SUBJECT_SPLITS
    if not path.is_file():
        return None
    table = pq.read_table(path)
    _checked_schema(_meds().SubjectSplitSchema, table.schema, path, ("subject_id", "split"))
    _first_null(table, ("subject_id", "split"), path, 0)
    return table.select(["subject_id", "split"]).to_pandas()
