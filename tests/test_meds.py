"""MEDS in and out (``garlic export meds``, ``garlic preprocess meds``): a dataset goes out as MEDS and comes back to
the same tensors, stay by stay; the variable rule; bad MEDS input named by file, row and column."""

import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from garlic.io.meds import MedsError, write_meds
from garlic.io.tables import read_processed, write_processed
from garlic.io.tensors import load_tensors
from garlic.sources import synthetic
from garlic.sources.meds import preprocess
from helpers import HAVE_P12, SHARED, garlic_here

TENSOR_ARRAYS = ("stay_ids", "values", "mask", "times", "lengths", "static", "labels")


def assert_same_tensors(native: Path, back: Path) -> None:
    """The tensors of ``back`` equal those of ``native``, array by array (so stay by stay), NaN for NaN."""
    expected, found = load_tensors(native), load_tensors(back)
    assert expected.mask.any() and 0 < expected.labels.sum() < len(expected)  # a slice with both outcomes
    assert found.variables == expected.variables and found.static_features == expected.static_features
    for name in TENSOR_ARRAYS:
        want, got = getattr(expected, name), getattr(found, name)
        assert got.shape == want.shape, name
        assert np.array_equal(got, want, equal_nan=True), name
    assert (found.task is None) == (expected.task is None)
    if expected.task is not None:
        for name in ("stay", "time", "label"):
            assert np.array_equal(getattr(found.task, name), getattr(expected.task, name)), name


def code_lists(dataset, folder: Path) -> tuple[Path, Path]:
    """The dataset's variables and static features as list files, as a user gives ``--variables`` and ``--static``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "variables.txt").write_text("\n".join(dataset.variables) + "\n")
    (folder / "static.txt").write_text("\n".join(dataset.static_features) + "\n")
    return folder / "variables.txt", folder / "static.txt"


def round_trip(native: Path, tmp: Path, name: str) -> Path:
    """``native`` out to MEDS and back through ``garlic.sources.meds``, with its own variable and static lists."""
    dataset = read_processed(native)
    written = write_meds(tmp / "meds", dataset, name, rows_per_shard=50_000)
    variables, static = code_lists(dataset, tmp / "lists")
    preprocess(tmp / "meds", tmp / "back", tmp / "meds" / "labels", written["window_hours"], str(variables), static)
    return tmp / "back"


# ---------------------------------------------------------------------------------------------------------------
# Synthetic: the commands end to end


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("meds")
    synthetic.generate(root / "data" / "processed" / "synthetic", n_stays=300, seed=3)
    done = garlic_here("export", "meds", "--dataset", "synthetic", "--to", str(root / "meds"), root=root)
    assert done.returncode == 0, done.stderr
    return root, done.stdout


def test_export_writes_meds_data_codes_labels_and_the_saved_split(exported):
    root, said = exported
    tables = read_processed(root / "data" / "processed" / "synthetic")
    data = pq.read_table(root / "meds" / "data").to_pandas()
    assert len(data) == len(tables.observations) + tables.static[tables.static_features].notna().sum().sum()
    one = tables.observations[tables.observations["stay_id"] == 100_007].iloc[3]
    event = data[
        (data["subject_id"] == 100_007) & (data["code"] == one["variable"]) & (data["numeric_value"] == one["value"])
    ]
    assert (event["time"] - pd.Timestamp("2000-01-01")).dt.total_seconds().div(3600).round(4).tolist() == [
        round(float(one["time"]), 4)
    ]
    labels = pq.read_table(root / "meds" / "labels" / "labels.parquet").to_pandas()
    assert labels["boolean_value"].sum() == tables.labels["label"].sum()
    assert (labels["prediction_time"] == pd.Timestamp("2000-01-03")).all()  # 48 h after every admission
    splits = pq.read_table(root / "meds" / "metadata" / "subject_splits.parquet").to_pandas()
    saved = json.loads(
        (root / "data" / "processed" / "synthetic" / "splits" / "five-split" / "split_0.json").read_text()
    )
    assert sorted(splits.loc[splits["split"] == "held_out", "subject_id"]) == saved["test"]
    assert set(pq.read_table(root / "meds" / "metadata" / "codes.parquet")["code"].to_pylist()) == set(
        tables.variables
    ) | set(tables.static_features)
    assert "garlic preprocess meds" in said


def test_the_printed_next_command_reads_the_export_back_in_the_same_column_order(exported):
    import shlex

    root, said = exported
    command = shlex.split(re.search(r"^next: garlic (preprocess meds .*)$", said, re.MULTILINE).group(1))
    assert "--variables" in command and "--static" in command
    done = garlic_here(*command, "--name", "next", root=root)
    assert done.returncode == 0, done.stderr
    assert_same_tensors(root / "data" / "processed" / "synthetic", root / "data" / "processed" / "meds-next")


@pytest.fixture(scope="module")
def imported(exported):
    """The exported folder preprocessed back as the dataset ``meds-back`` (``--name back``), with the native variable
    and static lists."""
    root, _ = exported
    variables, static = code_lists(read_processed(root / "data" / "processed" / "synthetic"), root / "lists")
    done = garlic_here(
        "preprocess",
        "meds",
        "--source",
        str(root / "meds"),
        "--labels",
        str(root / "meds" / "labels" / "labels.parquet"),
        "--window-hours",
        "48",
        "--variables",
        str(variables),
        "--static",
        str(static),
        "--name",
        "back",
        root=root,
    )
    assert done.returncode == 0, done.stderr
    return root


def test_export_replaces_its_own_folder_and_refuses_any_other(exported, tmp_path):
    root, _ = exported
    dataset = read_processed(root / "data" / "processed" / "synthetic")
    write_meds(tmp_path / "out", dataset, "synthetic")
    assert write_meds(tmp_path / "out", dataset, "synthetic")["labels"] == 300  # written again over its own export
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    with pytest.raises(MedsError, match=r"mine exists and is not a MEDS folder that garlic export wrote"):
        write_meds(tmp_path / "mine", dataset, "synthetic")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "kept"


def test_the_meds_folder_comes_back_to_the_same_tensors(imported):
    assert_same_tensors(imported / "data" / "processed" / "synthetic", imported / "data" / "processed" / "meds-back")


@pytest.fixture(scope="module")
def meds_run(imported) -> str:
    """GARLIC trained on the MEDS dataset, on the folder's own subject splits (one epoch of a small model)."""
    done = garlic_here(
        "train",
        "--dataset",
        "meds-back",
        "--protocol",
        "subject-splits",
        "--set",
        "max_epochs=1",
        "--set",
        "hidden_dim=16",
        "--set",
        "feature_dim=4",
        root=imported,
    )
    assert done.returncode == 0, done.stderr
    return re.search(r"^run ([0-9a-f]{32})", done.stdout, re.MULTILINE).group(1)


def test_garlic_trains_on_a_meds_dataset_on_the_folders_own_subject_splits(imported, meds_run):
    assert garlic_here("evaluate", "--run", meds_run, root=imported).returncode == 0
    from garlic.app.replay import replay_stay
    from garlic.app.sources import load_run, test_split

    trained, run = load_run(imported / "mlruns", meds_run)  # what the dashboard replays: a test stay, hour by hour
    replay = replay_stay(trained, test_split(trained, run, imported / "data"), 0)
    assert np.isfinite(replay.risk[-1]) and 0 < replay.risk[-1] < 1
    used = json.loads(
        (imported / "data" / "processed" / "meds-back" / "splits" / "subject-splits" / "split_0.json").read_text()
    )
    splits = pq.read_table(imported / "meds" / "metadata" / "subject_splits.parquet").to_pandas()
    for part, name in (("train", "train"), ("validation", "tuning"), ("test", "held_out")):
        assert used[part] == sorted(splits.loc[splits["split"] == name, "subject_id"])


def test_predict_scores_meds_label_rows_in_the_meds_prediction_schema(imported, meds_run, tmp_path):
    from garlic.app.sources import predictions
    from garlic.io.meds import PREDICTION_SCHEMA

    labels = pq.read_table(imported / "meds" / "labels" / "labels.parquet").to_pandas()
    held_out = labels[
        labels["subject_id"].isin(
            pq.read_table(imported / "meds" / "metadata" / "subject_splits.parquet")
            .to_pandas()
            .query("split == 'held_out'")["subject_id"]
        )
    ]
    held_out.to_parquet(tmp_path / "held_out.parquet", index=False)
    done = garlic_here(
        "predict",
        "--run",
        meds_run,
        "--input",
        str(imported / "meds"),
        "--labels",
        str(tmp_path / "held_out.parquet"),
        "--output",
        str(tmp_path / "predictions.parquet"),
        root=imported,
    )
    assert done.returncode == 0, done.stderr
    written = pq.read_table(tmp_path / "predictions.parquet")
    assert written.schema.equals(PREDICTION_SCHEMA)
    scored = written.to_pandas()
    assert scored["prediction_time"].tolist() == held_out["prediction_time"].tolist()
    assert scored["boolean_value"].tolist() == held_out["boolean_value"].tolist()
    # The risks are those the run logged for its test stays: the same model on the same input.
    logged = predictions(imported / "mlruns", meds_run, "test").set_index("stay_id")["risk"]
    assert np.allclose(
        scored.set_index("subject_id")["predicted_boolean_probability"].sort_index(), logged.sort_index(), atol=1e-6
    )


def test_the_live_ward_scores_a_meds_runs_beds_as_their_readings_arrive(imported, meds_run):
    pytest.importorskip("fhir.resources", reason="the live ward's FHIR library is not installed (bin/setup live)")
    import os
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monitor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "garlic.cli",
            "--data-root",
            str(imported / "data"),
            "--mlruns",
            str(imported / "mlruns"),
            "monitor",
            "--run",
            meds_run,
            "--port",
            base.rsplit(":", 1)[1],
            "--store",
            f"sqlite:///{imported / 'ward.sqlite'}",
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def health() -> dict | None:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as answer:
                return json.loads(answer.read())
        except OSError:
            return None

    try:
        deadline = time.monotonic() + 60
        while health() is None and monitor.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert health() is not None, monitor.stderr.read() if monitor.poll() is not None else "no answer in 60 s"
        fed = garlic_here("feed", "--run", meds_run, "--beds", "3", "--speed", "1e7", "--url", base, root=imported)
        assert fed.returncode == 0, fed.stderr
        sent, stored = map(int, re.search(r"readings sent (\d+), stored (\d+)", fed.stdout + fed.stderr).groups())
        while (counts := health())["pending"] and time.monotonic() < deadline + 60:
            time.sleep(0.2)
        assert sent == stored == counts["readings"] == counts["scored"] > 0  # the MEDS codes reach the model by name
        with urllib.request.urlopen(f"{base}/ward", timeout=5) as answer:
            ward = json.loads(answer.read())
        assert len(ward) == 3 and all(0 < bed["risk"] < 1 for bed in ward)
    finally:
        monitor.terminate()
        monitor.wait(30)


def test_subject_splits_is_refused_for_a_dataset_without_them(exported):
    root, _ = exported
    done = garlic_here("train", "--dataset", "synthetic", "--protocol", "subject-splits", root=root)
    assert done.returncode == 2 and "'synthetic' has none" in done.stderr, done.stderr


def test_prediction_times_come_back_as_the_tasks_table_read_row_group_by_row_group(tmp_path):
    # Two prediction times per stay, at 24 h and 48 h: a window of 24 h before the first opens at admission.
    observations, static, labels = synthetic.simulate(60, seed=5)
    tasks = pd.DataFrame(
        {
            "stay_id": np.repeat(labels["stay_id"].to_numpy(), 2),
            "time": np.tile([24.0, 48.0], 60),
            "label": np.repeat(labels["label"].to_numpy(), 2) * np.tile([0, 1], 60),
        }
    )
    write_processed(tmp_path / "native", observations, static, labels, synthetic.VARIABLES, {}, tasks)
    dataset = read_processed(tmp_path / "native")
    write_meds(tmp_path / "meds", dataset, "tasks")
    shard = tmp_path / "meds" / "data" / "0.parquet"  # read in row groups of 1,000 rows: the same tables
    pq.write_table(pq.read_table(shard), shard, row_group_size=1000)
    assert pq.ParquetFile(shard).num_row_groups > 10
    variables, static_list = code_lists(dataset, tmp_path)
    manifest = preprocess(
        tmp_path / "meds", tmp_path / "back", tmp_path / "meds" / "labels", 24.0, str(variables), static_list
    )
    assert manifest["counts"]["prediction_times"] == 120
    assert_same_tensors(tmp_path / "native", tmp_path / "back")


def test_exported_times_are_exact_to_the_microsecond_and_come_back_as_the_same_hours(tmp_path):
    from garlic.io.meds import ADMISSION, hours_to_times, times_to_hours

    rng = np.random.default_rng(0)
    for grid, count in ((60_000_000, 200 * 60), (1_000_000, 50 * 3600), (1_000, 3_600_000)):
        recorded = np.arange(count, dtype="int64") * grid  # every minute of 200 h, second of 50 h, ms of an hour
        hours = times_to_hours(recorded, 0)  # as the tables hold them: float32 hours
        assert np.array_equal((hours_to_times(hours) - ADMISSION).astype("int64"), recorded), grid
    assert hours_to_times(np.float32(7 / 60)) == np.datetime64("2000-01-01T00:07")  # one time, as an array of them
    anything = rng.uniform(0, 5_000, 100_000).astype("float32")
    assert np.array_equal(times_to_hours((hours_to_times(anything) - ADMISSION).astype("int64"), 0), anything)
    # A whole export: every event of a cohort charted to the minute lies on its minute.
    observations, static, labels = synthetic.simulate(30, seed=6)
    observations["time"] = (np.round(observations["time"] * 60) / 60).astype("float32")
    write_processed(tmp_path / "native", observations, static, labels, synthetic.VARIABLES, {})
    write_meds(tmp_path / "meds", read_processed(tmp_path / "native"), "minutes")
    times = pq.read_table(tmp_path / "meds" / "data").column("time").drop_null().cast(pa.int64()).to_numpy()
    assert len(times) == len(observations) and (times % 60_000_000 == 0).all()


def test_the_folder_layout_is_the_meds_packages_and_garlic_starts_without_it():
    import meds

    from garlic.io import meds as layout

    assert (layout.DATA, layout.CODES, layout.SUBJECT_SPLITS, layout.DATASET_METADATA) == (
        meds.data_subdirectory,
        meds.code_metadata_filepath,
        meds.subject_splits_filepath,
        meds.dataset_metadata_filepath,
    )
    assert list(layout.SPLIT_NAMES.values()) == [meds.train_split, meds.tuning_split, meds.held_out_split]
    probe = (
        "import sys, garlic.cli; garlic.cli.parser()\n"
        "print(sorted(m for m in ('meds', 'jsonschema') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------------------------
# The variable rule and the input window, on a MEDS folder written by hand


def write_shard(path: Path, rows: list[tuple]) -> Path:
    """Events (subject, hours after 2000-01-01 or None, code, value) as a MEDS shard."""
    path.parent.mkdir(parents=True, exist_ok=True)
    time = [None if h is None else pd.Timestamp("2000-01-01") + pd.Timedelta(hours=h) for _, h, _, _ in rows]
    pq.write_table(
        pa.table(
            {
                "subject_id": pa.array([r[0] for r in rows], pa.int64()),
                "time": pa.array(time, pa.timestamp("us")),
                "code": pa.array([r[2] for r in rows], pa.string()),
                "numeric_value": pa.array([r[3] for r in rows], pa.float32()),
            }
        ),
        path,
    )
    return path


def write_labels(path: Path, rows: list[tuple]) -> Path:
    """Label rows (subject, hours after 2000-01-01, boolean) as a MEDS label file."""
    pq.write_table(
        pa.table(
            {
                "subject_id": pa.array([r[0] for r in rows], pa.int64()),
                "prediction_time": pa.array(
                    [pd.Timestamp("2000-01-01") + pd.Timedelta(hours=r[1]) for r in rows], pa.timestamp("us")
                ),
                "boolean_value": pa.array([r[2] for r in rows], pa.bool_()),
            }
        ),
        path,
    )
    return path


def test_most_frequent_codes_of_training_subjects_and_the_window_both_ends_included(tmp_path):
    write_shard(
        tmp_path / "meds" / "data" / "0.parquet",
        [
            (1, None, "AGE", 70.0),
            (1, 1.0, "HR", 80.0),
            (1, 10.0, "HR", 81.0),
            (1, 10.0, "NA", 140.0),
            (1, 34.0, "HR", 82.0),
            (1, 35.0, "NOTE", None),
            (2, 0.0, "HR", 90.0),
            (2, 5.0, "K", 4.0),
            (2, 5.0, "HR", 95.0),
        ],
    )
    write_shard(
        tmp_path / "meds" / "data" / "1.parquet",
        [(3, 1.0, "K", 3.9), (3, 2.0, "K", 4.1), (3, 3.0, "K", 4.2), (4, None, "AGE", 50.0), (5, 1.0, "NOTE", None)],
    )
    pq.write_table(
        pa.table({"subject_id": pa.array([1, 2, 3], pa.int64()), "split": ["train", "train", "held_out"]}),
        (tmp_path / "meds" / "metadata").mkdir(parents=True)
        or tmp_path / "meds" / "metadata" / "subject_splits.parquet",
    )
    labels = write_labels(
        tmp_path / "labels.parquet",
        [(1, 34.0, True), (2, 24.0, False), (3, 24.0, False), (4, 24.0, False), (5, 24.0, True)],
    )
    manifest = preprocess(tmp_path / "meds", tmp_path / "out", labels, window_hours=24.0, variables="2")
    # K is most frequent over all subjects, but subject 3 is held out: among the training subjects HR leads.
    assert manifest["variables"] == ["HR", "K"]
    assert manifest["static_features"] == ["AGE"]
    tables = read_processed(tmp_path / "out")
    one = tables.observations[tables.observations["stay_id"] == 1]
    # Subject 1's window is 10 h to 34 h: the reading at 1 h is before it, those at 10 h and 34 h are in it.
    assert one["time"].tolist() == [0.0, 24.0] and one["value"].tolist() == [81.0, 82.0]
    age = tables.static.set_index("stay_id")["AGE"]
    assert age.loc[1] == 70.0 and np.isnan(age.loc[2]) and np.isnan(age.loc[3]) and age.loc[4] == 50.0
    # Subject 4 has an age and nothing else: a stay without input; subject 5 has neither: dropped.
    assert tables.labels["stay_id"].tolist() == [1, 2, 3, 4] and tables.tasks is None
    assert 4 not in set(tables.observations["stay_id"]) and manifest["counts"]["stays_without_input"] == 1
    assert manifest["dropped_stays"] == {"no event of the variables in the input window and no static feature": [5]}


def _other_layouts(folder: Path, to: Path) -> None:
    """The MEDS folder ``folder`` copied to ``to`` in the layouts polars writes: strings as ``large_string``, the codes
    of every other shard as a dictionary, ``numeric_value`` as ``double``, ``parent_codes`` as a ``large_list``."""
    for number, path in enumerate(sorted(folder.rglob("*.parquet"))):
        table = pq.read_table(path)
        fields = []
        for field in table.schema:
            kind = field.type
            if pa.types.is_string(kind):
                kind = (
                    pa.large_string()
                    if number % 2 or field.name != "code"
                    else pa.dictionary(pa.uint32(), pa.large_string())
                )
            elif pa.types.is_list(kind):
                kind = pa.large_list(pa.large_string())
            elif field.name == "numeric_value":
                kind = pa.float64()
            fields.append(field.with_type(kind))
        (to / path.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.cast(pa.schema(fields)), to / path.relative_to(folder))


def test_a_meds_folder_in_polars_layouts_reads_as_the_pyarrow_written_one(tmp_path):
    observations, static, labels = synthetic.simulate(40, seed=2)
    write_processed(tmp_path / "native", observations, static, labels, synthetic.VARIABLES, {})
    dataset = read_processed(tmp_path / "native")
    write_meds(
        tmp_path / "meds",
        dataset,
        "layouts",
        rows_per_shard=2_000,
        splits={
            "train": labels["stay_id"][:30].to_numpy(),
            "validation": labels["stay_id"][30:35].to_numpy(),
            "test": labels["stay_id"][35:].to_numpy(),
        },
    )
    _other_layouts(tmp_path / "meds", tmp_path / "large")
    assert pq.read_schema(tmp_path / "large" / "data" / "1.parquet").field("code").type == pa.large_string()
    variables, static_list = code_lists(dataset, tmp_path)
    for name in ("meds", "large"):
        preprocess(
            tmp_path / name, tmp_path / f"{name}-back", tmp_path / name / "labels", 48.0, str(variables), static_list
        )
    assert_same_tensors(tmp_path / "meds-back", tmp_path / "large-back")
    assert (
        read_processed(tmp_path / "large-back").manifest["subject_splits"]
        == read_processed(tmp_path / "meds-back").manifest["subject_splits"]
    )
    polars = pytest.importorskip("polars", reason="polars is not installed (the test extra)")
    (tmp_path / "polars" / "data").mkdir(parents=True)
    for path in sorted((tmp_path / "meds" / "data").glob("*.parquet")):  # as a polars ETL writes its shards
        polars.read_parquet(path).with_columns(polars.col("numeric_value").cast(polars.Float64)).write_parquet(
            tmp_path / "polars" / "data" / path.name
        )
    polars.read_parquet(tmp_path / "meds" / "labels" / "labels.parquet").write_parquet(tmp_path / "labels.parquet")
    preprocess(
        tmp_path / "polars", tmp_path / "polars-back", tmp_path / "labels.parquet", 48.0, str(variables), static_list
    )
    assert_same_tensors(tmp_path / "meds-back", tmp_path / "polars-back")


def test_times_in_another_unit_read_as_microseconds_and_a_finer_one_is_named(tmp_path):
    rows = [(1, None, "AGE", 70.0), (1, 1.0, "HR", 80.0), (1, 2.5, "HR", 81.0), (2, 0.25, "HR", 90.0)]
    write_shard(tmp_path / "meds" / "data" / "0.parquet", rows)
    labels = write_labels(tmp_path / "labels.parquet", [(1, 24.0, True), (2, 24.0, False)])
    preprocess(tmp_path / "meds", tmp_path / "back", labels, window_hours=24.0, variables="1")
    for unit in ("ns", "ms"):  # pandas writes nanoseconds, some tools milliseconds
        folder = tmp_path / unit
        (folder / "data").mkdir(parents=True)
        table = pq.read_table(tmp_path / "meds" / "data" / "0.parquet")
        pq.write_table(
            table.set_column(1, "time", table.column("time").cast(pa.timestamp(unit))), folder / "data" / "0.parquet"
        )
        written = pq.read_table(labels)
        pq.write_table(
            written.set_column(1, "prediction_time", written.column("prediction_time").cast(pa.timestamp(unit))),
            folder / "labels.parquet",
        )
        assert pq.read_schema(folder / "data" / "0.parquet").field("time").type == pa.timestamp(unit)
        preprocess(folder, tmp_path / f"{unit}-back", folder / "labels.parquet", window_hours=24.0, variables="1")
        assert_same_tensors(tmp_path / "back", tmp_path / f"{unit}-back")
    table = pq.read_table(tmp_path / "ns" / "data" / "0.parquet")
    nanoseconds = table.column("time").cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).copy()
    nanoseconds[2] += 1
    pq.write_table(
        table.set_column(
            1,
            "time",
            pa.array(nanoseconds, pa.int64(), mask=table.column("time").is_null().to_numpy(zero_copy_only=False)).cast(
                pa.timestamp("ns")
            ),
        ),
        tmp_path / "ns" / "data" / "0.parquet",
    )
    with pytest.raises(MedsError, match=r"0\.parquet: row 2, column time: a time finer than a microsecond"):
        preprocess(tmp_path / "ns", tmp_path / "finer", tmp_path / "ns" / "labels.parquet", 24.0, "1")


# ---------------------------------------------------------------------------------------------------------------
# Bad input: the file, the row, the column


def test_a_shard_breaking_the_meds_schema_is_named_with_its_column(tmp_path):
    labels = write_labels(tmp_path / "labels.parquet", [(1, 24.0, True)])
    shard = tmp_path / "meds" / "data" / "0.parquet"
    shard.parent.mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "subject_id": ["one"],
                "time": pa.array([pd.Timestamp("2000-01-01")], pa.timestamp("us")),
                "code": ["HR"],
                "numeric_value": pa.array([80.0], pa.float32()),
            }
        ),
        shard,
    )
    with pytest.raises(MedsError, match=r"0\.parquet: column subject_id: expected int64, found string"):
        preprocess(tmp_path / "meds", tmp_path / "out", labels, variables="5")
    write_shard(shard, [(1, 1.0, "HR", 80.0), (1, 2.0, None, 81.0)])
    with pytest.raises(MedsError, match=r"0\.parquet: row 1, column code: null"):
        preprocess(tmp_path / "meds", tmp_path / "out", labels, variables="5")


def test_a_value_not_finite_or_past_any_measurement_is_left_out_counted_and_its_row_named(tmp_path, caplog):
    write_shard(
        tmp_path / "meds" / "data" / "0.parquet",
        [
            (1, None, "AGE", float("inf")),
            (1, None, "WEIGHT", float("nan")),
            (1, 1.0, "HR", 80.0),
            (1, 2.0, "HR", float("nan")),
            (1, 3.0, "HR", float("-inf")),
            (1, 4.0, "HR", 3e38),
            (1, 5.0, "HR", -2e5),
            (1, 6.0, "HR", 1e5),
            (2, 1.0, "HR", 70.0),
            (2, None, "AGE", 60.0),
        ],
    )
    labels = write_labels(tmp_path / "labels.parquet", [(1, 24.0, True), (2, 24.0, False)])
    with caplog.at_level("WARNING", logger="garlic.sources.meds"):
        manifest = preprocess(tmp_path / "meds", tmp_path / "out", labels, variables="5")
    tables = read_processed(tmp_path / "out")
    assert tables.observations["value"].tolist() == [80.0, 1e5, 70.0]
    assert tables.static.set_index("stay_id")["AGE"].isna().tolist() == [True, False]
    assert tables.static.set_index("stay_id")["WEIGHT"].isna().all()  # a static NaN: not known, not counted
    assert manifest["counts"]["events_left_out_for_their_value"] == 5
    assert "0.parquet: row 0, column numeric_value: inf (code 'AGE')" in caplog.text


def test_a_label_file_without_boolean_value_a_repeated_label_row_or_a_doubled_code_is_named(tmp_path):
    write_shard(tmp_path / "meds" / "data" / "0.parquet", [(1, 1.0, "HR", 80.0)])
    pq.write_table(
        pa.table(
            {
                "subject_id": pa.array([1], pa.int64()),
                "prediction_time": pa.array([pd.Timestamp("2000-01-02")], pa.timestamp("us")),
            }
        ),
        tmp_path / "no-value.parquet",
    )
    with pytest.raises(MedsError, match=r"no-value\.parquet: no column boolean_value"):
        preprocess(tmp_path / "meds", tmp_path / "out", tmp_path / "no-value.parquet")
    twice = write_labels(tmp_path / "twice.parquet", [(1, 24.0, True), (2, 24.0, False), (1, 24.0, False)])
    with pytest.raises(MedsError, match=r"twice\.parquet: row 2: subject 1 is labelled twice at one prediction_time"):
        preprocess(tmp_path / "meds", tmp_path / "out", twice)
    (tmp_path / "variables.txt").write_text("HR\nK\nHR\n")
    labels = write_labels(tmp_path / "labels.parquet", [(1, 24.0, True)])
    with pytest.raises(MedsError, match=r"variables\.txt: line 3: code 'HR' is listed twice"):
        preprocess(tmp_path / "meds", tmp_path / "out", labels, variables=str(tmp_path / "variables.txt"))
    assert not (tmp_path / "out").exists()


def test_labels_of_one_outcome_are_refused_at_preprocess_and_at_train_in_one_line(tmp_path):
    write_shard(
        tmp_path / "meds" / "data" / "0.parquet", [(s, h, "HR", 80.0 + h) for s in range(1, 41) for h in (1.0, 2.0)]
    )
    labels = write_labels(tmp_path / "labels.parquet", [(s, 24.0, False) for s in range(1, 41)])
    done = garlic_here("preprocess", "meds", "--source", str(tmp_path / "meds"), "--labels", str(labels), root=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"garlic: error: {labels}: 40 label rows, 0 true and 40 false (40 subjects kept: 0 true, 40 false): a model "
        "learns from both outcomes; give label rows of both"
    )
    assert not (tmp_path / "data" / "processed" / "meds").exists()
    # A dataset of one outcome made otherwise: garlic train says so before any run starts, naming the part.
    observations, static, stays = synthetic.simulate(40, seed=4)
    write_processed(
        tmp_path / "data" / "processed" / "meds",
        observations,
        static,
        stays.assign(label=0),
        synthetic.VARIABLES,
        {"dataset": "meds"},
    )
    done = garlic_here("train", "--dataset", "meds", "--method", "logreg", root=tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith(
        "garlic: error: meds: the training part of five-split/split_0 has 0 positive and 32 negative stays"
    ), done.stderr
    assert not (tmp_path / "mlruns").exists()  # refused before the store is made


def test_an_empty_read_is_named_never_silent(tmp_path, caplog):
    write_shard(
        tmp_path / "meds" / "data" / "0.parquet",
        [
            (1, None, "AGE", 70.0),
            (1, 1.0, "HR", 80.0),
            (1, 30.0, "K", 4.0),
            (2, None, "AGE", 50.0),
            (2, 2.0, "HR", 90.0),
            (3, 1.0, "HR", 85.0),
        ],
    )
    both = [(1, 24.0, True), (2, 24.0, False), (3, 24.0, True)]
    # Every prediction time before any event (a label file of 1900): no window holds one.
    early = write_labels(tmp_path / "early.parquet", [(s, -876_600.0 + h, b) for s, h, b in both])
    with pytest.raises(
        MedsError,
        match=r"early\.parquet: no event of the variables falls in any input window \(48 h "
        r"up to each prediction time\): the prediction times run from 1900-01-01 00:00:00 to "
        r"1900-01-01 00:00:00, the subjects' 4 events of the variables from 2000-01-01 01:00:00 to "
        r"2000-01-02 06:00:00; check prediction_time and --window-hours",
    ):
        preprocess(tmp_path / "meds", tmp_path / "out", early, variables="5")
    labels = write_labels(tmp_path / "labels.parquet", both)
    (tmp_path / "absent.txt").write_text("GLUCOSE\n")
    with pytest.raises(
        MedsError,
        match=r"labels\.parquet: its subjects have no timed numeric event of the codes "
        r"listed in .*absent\.txt \(GLUCOSE\) in the MEDS folder",
    ):
        preprocess(tmp_path / "meds", tmp_path / "out", labels, variables=str(tmp_path / "absent.txt"))
    with pytest.raises(MedsError, match=r"^--variables 0: give N of at least 1"):
        preprocess(tmp_path / "meds", tmp_path / "out", labels, variables="0")
    assert not (tmp_path / "out").exists()
    (tmp_path / "some.txt").write_text("HR\nGLUCOSE\nK\n")
    (tmp_path / "static.txt").write_text("AGE\nSEX\n")
    with caplog.at_level("WARNING", logger="garlic.sources.meds"):
        manifest = preprocess(
            tmp_path / "meds",
            tmp_path / "out",
            labels,
            window_hours=24.0,
            variables=str(tmp_path / "some.txt"),
            static=tmp_path / "static.txt",
        )
    assert manifest["counts"]["observations_per_variable"] == {"HR": 3, "GLUCOSE": 0, "K": 0}
    assert "some.txt: 'GLUCOSE': no timed numeric event of the labelled subjects has this code" in caplog.text
    assert "some.txt: 'K': every event of this code lies outside the input windows" in caplog.text
    assert "static.txt: 'SEX': no static numeric event of the labelled subjects has this code" in caplog.text


def test_row_order_decides_nothing_silently(tmp_path, caplog):
    rows = [
        (1, None, "AGE", 70.0),
        (1, None, "AGE", 71.0),
        (1, None, "SEX", float("nan")),
        (1, None, "SEX", 1.0),
        (1, 1.0, "HR", 80.0),
        (1, 2.0, "HR", 81.0),
        (1, 2.0, "HR", 82.0),
        (2, None, "AGE", 50.0),
        (2, 1.0, "HR", 90.0),
        (3, None, "AGE", 40.0),
        (3, 1.0, "HR", 60.0),
    ]
    labels = write_labels(tmp_path / "labels.parquet", [(1, 24.0, True), (2, 24.0, False), (3, 24.0, True)])
    read = {}
    for name, order in (("sorted", rows), ("reversed", rows[::-1])):
        write_shard(tmp_path / name / "data" / "0.parquet", order)
        with caplog.at_level("WARNING", logger="garlic.sources.meds"):
            caplog.clear()
            preprocess(tmp_path / name, tmp_path / f"{name}-out", labels, window_hours=24.0, variables="1")
        read[name] = read_processed(tmp_path / f"{name}-out").static.set_index("stay_id")
        assert (
            "1 subject(s) have a static code recorded with different values; each keeps the value recorded most "
            "often, the largest of equally frequent ones: the first, subject 1, code 'AGE': 70, 71"
        ) in caplog.text
        assert "at 1 time(s) of a subject, a variable has two values" in caplog.text
        assert ("not sorted" in caplog.text) == (name == "reversed")
    assert read["sorted"].equals(read["reversed"])  # whatever the rows' order
    assert read["sorted"].loc[1, "AGE"] == 71.0 and read["sorted"].loc[1, "SEX"] == 1.0
    assert "0.parquet: row 1, subject 3: no time (a static event) after 2000-01-01 01:00:00" in caplog.text
    # A subject in two shards is read as one, and said; a label file's other columns are said not to be read.
    write_shard(tmp_path / "split" / "data" / "0.parquet", rows[:9])
    write_shard(tmp_path / "split" / "data" / "1.parquet", rows[9:] + [(2, 3.0, "HR", 91.0)])
    pq.write_table(
        pq.read_table(labels).append_column("integer_value", pa.array([1, 0, 2], pa.int64())),
        tmp_path / "extra.parquet",
    )
    with caplog.at_level("WARNING"):
        caplog.clear()
        preprocess(tmp_path / "split", tmp_path / "split-out", tmp_path / "extra.parquet", 24.0, "1")
    assert "1 subject(s) have events in more than one shard" in caplog.text and "subject 2 in 1.parquet" in caplog.text
    assert "extra.parquet: column(s) integer_value not read: the label is boolean_value" in caplog.text
    assert read_processed(tmp_path / "split-out").observations.query("stay_id == 2")["value"].tolist() == [90.0, 91.0]


# ---------------------------------------------------------------------------------------------------------------
# Real data: P12, the P19 raindrop cohort and the MIMIC-III demo, native tables out to MEDS and back

P12 = SHARED / "physionet2012"
P19 = SHARED / "physionet2019"
DEMO = SHARED / "mimic3-demo"
SLICE = 300  # stays: enough for every variable, both labels and the cohort rules' drops to show up


def first_members(archive: Path, folder: Path, count: int) -> None:
    """The first ``count`` record files of a release archive (.tar.gz or .zip) extracted into ``folder``."""
    folder.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as opened:
            for name in [n for n in opened.namelist() if n.endswith(".psv")][:count]:
                (folder / Path(name).name).write_bytes(opened.read(name))
        return
    with tarfile.open(archive) as opened:
        taken = 0
        for member in opened:
            if member.isfile() and member.name.endswith(".txt") and taken < count:
                (folder / Path(member.name).name).write_bytes(opened.extractfile(member).read())
                taken += 1


@pytest.mark.skipif(not HAVE_P12, reason=f"the PhysioNet 2012 release is not at {P12}")
def test_physionet2012_round_trip(tmp_path):
    from garlic.sources import physionet2012

    first_members(P12 / "set-a.tar.gz", tmp_path / "release" / "set-a", SLICE)
    shutil.copy(P12 / "Outcomes-a.txt", tmp_path / "release")
    physionet2012.preprocess(tmp_path / "release", tmp_path / "native")
    assert_same_tensors(tmp_path / "native", round_trip(tmp_path / "native", tmp_path, "physionet2012"))


@pytest.mark.skipif(not (P19 / "training_setA.zip").is_file(), reason=f"PhysioNet 2019 data not found at {P19}")
def test_physionet2019_raindrop_round_trip(tmp_path):
    from garlic.sources import physionet2019

    # 600 stays: among them p000384 and p000584, which the cohort keeps without an input row (one empty step).
    first_members(P19 / "training_setA.zip", tmp_path / "release" / "training_setA", 2 * SLICE)
    physionet2019.preprocess(tmp_path / "release", tmp_path / "native", cohort="raindrop")
    native = read_processed(tmp_path / "native")
    assert len(np.setdiff1d(native.labels["stay_id"], native.observations["stay_id"])) > 0
    assert_same_tensors(tmp_path / "native", round_trip(tmp_path / "native", tmp_path, "physionet2019-raindrop"))


@pytest.mark.skipif(not (DEMO / "CHARTEVENTS.csv.gz").is_file(), reason=f"MIMIC-III demo not found at {DEMO}")
def test_mimic3_demo_round_trip(tmp_path):
    from garlic.sources import mimic3

    mimic3.preprocess(DEMO, tmp_path / "native")
    assert_same_tensors(tmp_path / "native", round_trip(tmp_path / "native", tmp_path, "mimic3-benchmark"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["preprocess", "meds", "--source", "."], "--labels is required for meds"),
        (["preprocess", "synthetic", "--window-hours", "24"], "--window-hours does not apply to synthetic"),
        (
            ["export", "meds", "--dataset", "meds", "--to", "out"],
            "run `garlic preprocess meds --source PATH_TO_RAW_DATA --labels LABELS` first",
        ),
        (
            ["preprocess", "meds", "--source", ".", "--labels", "l", "--name", "../up"],
            "--name '../up': expected letters",
        ),
        (
            ["preprocess", "meds", "--source", ".", "--labels", "l", "--variables", "ten"],
            "ten: no such file (a list of",
        ),
        (
            ["preprocess", "synthetic", "--name", "mine"],
            "--name does not apply to synthetic: its datasets are synthetic",
        ),
        (["train", "--dataset", "meds-"], "unknown dataset 'meds-'; choose one of meds, mimic3-benchmark"),
    ],
)
def test_a_missing_or_misplaced_meds_option_is_one_line_naming_its_flag(argv, message, tmp_path):
    done = garlic_here(*argv, root=tmp_path)
    assert done.returncode == 2 and message in done.stderr.strip().splitlines()[-1], done.stderr


def test_the_benchmark_writes_a_valid_synthetic_meds_folder_of_n_rows_and_measures_it(tmp_path, capsys):
    from experiments import benchmark_meds

    lines = benchmark_meds.main(["--rows", "30000", "--work", str(tmp_path)])
    assert pq.read_table(tmp_path / "synthetic-meds" / "data").num_rows == 30_000
    manifest = read_processed(tmp_path / "synthetic-back").manifest
    assert len(manifest["variables"]) == 20 and manifest["static_features"] == ["AGE", "HEIGHT", "WEIGHT"]
    assert manifest["counts"]["stays"] == 30
    assert lines[-1].startswith("| synthetic MEDS, 30,000 rows |") and " MB |" in lines[-1]


# ---------------------------------------------------------------------------------------------------------------
# Several prediction times per subject (the usual MEDS label file): train, evaluate, predict, meds-evaluation


@pytest.fixture(scope="module")
def timed_meds(tmp_path_factory):
    """A MEDS folder of 80 synthetic stays with two prediction times each (24 h and 48 h after admission), read as
    the dataset ``meds-timed`` (a tasks table) and trained on with ``hourly_logreg``: the root and the run."""
    root = tmp_path_factory.mktemp("timed")
    observations, static, labels = synthetic.simulate(80, seed=11)
    tasks = pd.DataFrame(
        {
            "stay_id": np.repeat(labels["stay_id"].to_numpy(), 2),
            "time": np.tile([24.0, 48.0], 80),
            "label": np.repeat(labels["label"].to_numpy(), 2) * np.tile([0, 1], 80),
        }
    )
    write_processed(root / "native", observations, static, labels, synthetic.VARIABLES, {}, tasks)
    write_meds(root / "meds", read_processed(root / "native"), "timed")
    done = garlic_here(
        "preprocess",
        "meds",
        "--source",
        str(root / "meds"),
        "--labels",
        str(root / "meds" / "labels"),
        "--window-hours",
        "24",
        "--name",
        "timed",
        root=root,
    )
    assert done.returncode == 0, done.stderr
    done = garlic_here("train", "--dataset", "meds-timed", "--method", "hourly_logreg", root=root)
    assert done.returncode == 0, done.stderr
    return root, re.search(r"^run ([0-9a-f]{32})", done.stdout, re.MULTILINE).group(1)


def test_a_run_on_several_prediction_times_per_subject_evaluates_as_it_was_tested(timed_meds):
    root, run = timed_meds
    done = garlic_here("evaluate", "--run", run, root=root)
    assert done.returncode == 0, done.stderr
    from garlic.tracking.store import get_run, use_store

    use_store(root / "mlruns")
    logged = get_run(run).data.metrics
    evaluated = json.loads(done.stdout[done.stdout.index("{") :])
    assert (evaluated["n_test"], evaluated["n_prediction_times"]) == (8, 16)  # 8 test stays, two times each
    assert evaluated["auroc"] == pytest.approx(logged["test_auroc"], abs=1e-9)


@pytest.fixture(scope="module")
def timed_predictions(timed_meds, tmp_path_factory):
    """``garlic predict --labels`` of the timed run on its test subjects' label rows (alarm at 0.5): the label rows
    asked, the run's logged test predictions and the predictions file."""
    from garlic.app.sources import predictions

    root, run = timed_meds
    folder = tmp_path_factory.mktemp("timed-predictions")
    logged = predictions(root / "mlruns", run, "test")  # stay_id, time, label, risk: a row per prediction time
    labels = pq.read_table(root / "meds" / "labels" / "labels.parquet").to_pandas()
    held_out = labels[labels["subject_id"].isin(logged["stay_id"])].reset_index(drop=True)
    held_out.to_parquet(folder / "held_out.parquet", index=False)
    done = garlic_here(
        "predict",
        "--run",
        run,
        "--input",
        str(root / "meds"),
        "--labels",
        str(folder / "held_out.parquet"),
        "--output",
        str(folder / "predictions.parquet"),
        "--threshold",
        "0.5",
        root=root,
    )
    assert done.returncode == 0, done.stderr
    return held_out, logged, folder / "predictions.parquet"


def test_predict_scores_every_prediction_time_of_a_subject(timed_predictions):
    held_out, logged, written = timed_predictions
    scored = pq.read_table(written).to_pandas()
    assert len(scored) == len(held_out) == 16
    assert scored[["subject_id", "prediction_time", "boolean_value"]].equals(
        held_out[["subject_id", "prediction_time", "boolean_value"]]
    )
    assert np.allclose(scored["predicted_boolean_probability"], logged["risk"], atol=1e-6)
    assert (scored["predicted_boolean_value"] == (scored["predicted_boolean_probability"] >= 0.5)).all()


def test_predictions_pass_meds_evaluations_strict_schema_and_are_scored_by_it(timed_predictions):
    from garlic.io.meds import PREDICTION_SCHEMA

    _, _, written = timed_predictions
    table = pq.read_table(written)
    assert table.schema.equals(PREDICTION_SCHEMA)
    assert table.schema.field("predicted_boolean_probability").type == pa.float32()  # as meds-evaluation has it
    pytest.importorskip(
        "meds_evaluation", reason="meds-evaluation is not installed (pip install meds-evaluation: the test extra)"
    )
    from meds_evaluation.evaluate import evaluate_binary_classification
    from meds_evaluation.schema import PredictionSchema

    PredictionSchema.validate(table)  # strict: no cast first
    import polars

    scores = evaluate_binary_classification(polars.from_arrow(table))
    assert 0 <= scores["samples_equally_weighted"]["binary_accuracy"] <= 1


def test_predict_split_answers_only_that_splits_subjects_and_names_a_missing_splits_file(timed_meds, tmp_path):
    root, run = timed_meds
    folder = tmp_path / "meds"
    shutil.copytree(root / "meds", folder)
    labels = folder / "labels" / "labels.parquet"
    asked = ["predict", "--run", run, "--input", str(folder), "--labels", str(labels), "--split", "held_out"]
    done = garlic_here(*asked, "--output", str(tmp_path / "none.parquet"), root=root)
    assert done.returncode != 0 and not (tmp_path / "none.parquet").exists()
    errors = [line for line in done.stderr.splitlines() if line.startswith("garlic: error:")]
    assert len(errors) == 1 and errors[0].endswith("metadata/subject_splits.parquet is absent")

    subjects = pq.read_table(labels).column("subject_id").to_numpy()
    held_out = np.unique(subjects)[::4]
    splits = pa.table(
        {
            "subject_id": np.unique(subjects),
            "split": np.where(np.isin(np.unique(subjects), held_out), "held_out", "train"),
        }
    )
    pq.write_table(splits, folder / "metadata" / "subject_splits.parquet")
    done = garlic_here(*asked, "--output", str(tmp_path / "held_out.parquet"), "--threshold", "0.5", root=root)
    assert done.returncode == 0, done.stderr
    scored = pq.read_table(tmp_path / "held_out.parquet").to_pandas()
    assert set(scored["subject_id"]) == set(held_out) and len(scored) == 2 * len(held_out)  # both of each's times
