"""The PhysioNet 2012 parser, on the real release (checked against the raw text) and on small hand-made releases."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from garlic.sources.physionet2012 import NAMELESS_PARAMETER as NAMELESS, PhysioNet2012Error, preprocess
from garlic.io.tables import MANIFEST, DatasetNotFoundError, read_manifest, read_processed
from garlic.io.tensors import load_tensors
from helpers import P12, P12_TIME_SERIES, assert_frames_equal, raw_series, requires_p12

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------------------
# The real release
# --------------------------------------------------------------------------------------------------------------


@requires_p12
def test_known_record_132539_matches_its_raw_text(p12_dataset):
    with tarfile.open(P12 / "set-a.tar.gz", "r:gz") as archive:
        text = archive.extractfile("set-a/132539.txt").read().decode()
    lines = text.splitlines()
    # What the raw file says, read here by hand.
    assert lines[0] == "Time,Parameter,Value"
    assert lines[1:7] == [
        "00:00,RecordID,132539",
        "00:00,Age,54",
        "00:00,Gender,0",
        "00:00,Height,-1",
        "00:00,ICUType,4",
        "00:00,Weight,-1",
    ]
    first_hr = next(line for line in lines if line.split(",")[1] == "HR")
    assert first_hr == "00:07,HR,73"

    static = p12_dataset.static.set_index("stay_id").loc[132539]
    assert static["Age"] == 54 and static["Gender"] == 0 and static["ICUType"] == 4
    assert np.isnan(static["Height"]) and np.isnan(static["Weight"])  # -1 means unknown

    obs = p12_dataset.observations[p12_dataset.observations["stay_id"] == 132539]
    hr = obs[obs["variable"] == "HR"].sort_values("time", kind="stable")
    assert hr["time"].iloc[0] == np.float32(7 / 60) and hr["value"].iloc[0] == 73
    # Every time-series row of the raw file within 48 h, and nothing else.
    expected = sorted((np.float32(t), v, np.float32(x)) for t, v, x in raw_series(text))
    got = sorted(zip(obs["time"], obs["variable"].astype(str), obs["value"]))
    assert got == expected

    outcome = pd.read_csv(P12 / "Outcomes-a.txt").set_index("RecordID").loc[132539]
    label = p12_dataset.labels.set_index("stay_id").loc[132539]
    assert label["label"] == outcome["In-hospital_death"] == 0
    assert label["SAPS-I"] == outcome["SAPS-I"] == 6


@requires_p12
def test_counts_of_stays_and_deaths(p12_dataset, p12_raw):
    counts = p12_dataset.manifest["counts"]
    assert len(p12_raw.texts) == 12_000 and counts["records_read"] == 12_000
    assert len(p12_raw.outcomes) == 12_000 and counts["outcomes_read"] == 12_000
    deaths = sum(int(row["In-hospital_death"]) for row in p12_raw.outcomes.values())
    assert deaths == 1_707 and counts["deaths_in_outcomes"] == 1_707
    assert len(p12_dataset.labels) == len(p12_dataset.static) == counts["stays"] == 11_988
    assert set(p12_dataset.observations["stay_id"].unique()) == set(p12_dataset.labels["stay_id"])
    kept = set(p12_dataset.labels["stay_id"])
    assert counts["positives"] == sum(int(p12_raw.outcomes[s]["In-hospital_death"]) for s in kept)
    labels = p12_dataset.labels.set_index("stay_id")["label"]
    assert all(labels[s] == int(p12_raw.outcomes[s]["In-hospital_death"]) for s in list(kept)[::97])


@requires_p12
def test_dropped_stays_are_those_without_series_in_48h(p12_dataset, p12_raw):
    empty = sorted(s for s, rows in p12_raw.in_window.items() if not rows)
    assert len(empty) == 12
    dropped = p12_dataset.manifest["dropped_stays"]
    assert sorted(d["stay_id"] for d in dropped) == empty
    assert all("no time-series observation" in d["reason"] for d in dropped)
    assert not set(empty) & set(p12_dataset.labels["stay_id"])
    assert not set(empty) & set(p12_dataset.static["stay_id"])


@requires_p12
def test_set_c_nameless_parameter_lines_are_counted_with_file_and_line(p12_dataset, p12_raw):
    assert len(p12_raw.nameless) == 2_403
    assert all(origin.startswith("set-c.tar.gz:set-c/") for origin, _ in p12_raw.nameless)
    expected = sorted(f"{origin} line {line}: unknown parameter ''" for origin, line in p12_raw.nameless)
    assert sorted(p12_dataset.manifest["skipped_lines"]) == expected
    assert p12_dataset.manifest["counts"]["skipped_lines"] == 2_403


@requires_p12
def test_observations_of_sampled_stays_equal_the_raw_rows(p12_dataset, p12_raw):
    obs = p12_dataset.observations
    assert obs["time"].between(0, 48).all()
    assert set(obs["variable"].astype(str).unique()) <= P12_TIME_SERIES
    assert np.isfinite(obs["value"]).all()
    by_stay = obs.groupby("stay_id", observed=True)
    stays = np.random.default_rng(0).choice(p12_dataset.labels["stay_id"].to_numpy(), 150, replace=False)
    for stay in stays:
        part = by_stay.get_group(stay)
        got = sorted(zip(part["time"], part["variable"].astype(str), part["value"]))
        expected = sorted((np.float32(t), v, np.float32(x)) for t, v, x in p12_raw.in_window[stay])
        assert got == expected, stay
    assert len(obs) == sum(len(rows) for rows in p12_raw.in_window.values())


@requires_p12
def test_static_descriptors_match_raw_for_sampled_stays(p12_dataset, p12_raw):
    static = p12_dataset.static.set_index("stay_id")
    for stay in static.index[::211]:
        descriptors = {}
        for line in p12_raw.texts[stay][1].splitlines()[1:]:
            time, name, value = line.split(",")
            if time == "00:00" and name in static.columns and name not in descriptors:
                descriptors[name] = float(value)
        for name in static.columns:
            value = descriptors.get(name, -1)
            if value == -1:
                assert np.isnan(static.loc[stay, name]), (stay, name)
            else:
                assert static.loc[stay, name] == np.float32(value), (stay, name)


@pytest.fixture(scope="module")
def set_a_only(tmp_path_factory):
    """Set a alone, from the archive and from an extracted folder."""
    if not (P12 / "set-a.tar.gz").is_file():
        pytest.skip(f"the PhysioNet 2012 release is not at {P12}")
    root = tmp_path_factory.mktemp("set_a")
    source = root / "source"
    source.mkdir()
    with tarfile.open(P12 / "set-a.tar.gz", "r:gz") as archive:
        archive.extractall(source, filter="data")
    shutil.copy(P12 / "Outcomes-a.txt", source)
    assert (source / "set-a" / "132539.txt").is_file()
    preprocess(P12, root / "from_archive", sets=["a"])
    preprocess(source, root / "from_folder")
    return read_processed(root / "from_archive"), read_processed(root / "from_folder")


@requires_p12
def test_extracted_folder_gives_the_same_tables_as_the_archive(set_a_only):
    from_archive, from_folder = set_a_only
    for name in ("observations", "static", "labels"):
        assert_frames_equal(getattr(from_archive, name), getattr(from_folder, name))
    assert from_archive.manifest["counts"] == from_folder.manifest["counts"]
    # Both name what they read: the archive by its checksum, the folder by a digest of its records.
    assert "set-a.tar.gz" in from_archive.manifest["source"]["files_sha256"]
    assert "set-a/" in from_folder.manifest["source"]["files_sha256"]


@requires_p12
def test_set_a_alone_equals_the_full_run_restricted_to_set_a(set_a_only, p12_dataset, p12_raw):
    from_archive, _ = set_a_only
    set_a = {s for s, (letter, _) in p12_raw.texts.items() if letter == "a"}
    assert from_archive.manifest["source"]["sets"] == ["a"]
    assert from_archive.manifest["counts"]["records_read"] == len(set_a) == 4_000
    assert set(from_archive.labels["stay_id"]) <= set_a
    for name in ("observations", "static", "labels"):
        full = getattr(p12_dataset, name)
        full = full[full["stay_id"].isin(set_a)].reset_index(drop=True)
        assert_frames_equal(getattr(from_archive, name).reset_index(drop=True), full)


# --------------------------------------------------------------------------------------------------------------
# Small hand-made releases
# --------------------------------------------------------------------------------------------------------------

OUTCOME_HEADER = "RecordID,SAPS-I,SOFA,Length_of_stay,Survival,In-hospital_death"
GOOD_BODY = ["00:10,HR,80", "01:00,HR,82", "01:00,Temp,37.1"]


def record_text(stay: int, body: list[str] | None = None) -> str:
    """Header (line 1), RecordID (2), five descriptors (3-7), then ``body`` from line 8."""
    head = [
        f"00:00,RecordID,{stay}",
        "00:00,Age,60",
        "00:00,Gender,1",
        "00:00,Height,170",
        "00:00,ICUType,2",
        "00:00,Weight,80",
    ]
    return "\n".join(["Time,Parameter,Value", *head, *(GOOD_BODY if body is None else body)]) + "\n"


def write_archive(path: Path, members: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as archive:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def make_release(
    root: Path,
    records: dict[int, str],
    outcomes: dict[int, int] | None = None,
    as_folder: bool = False,
    letter: str = "a",
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if as_folder:
        folder = root / f"set-{letter}"
        folder.mkdir(exist_ok=True)
        for stay, text in records.items():
            (folder / f"{stay}.txt").write_text(text)
    else:
        write_archive(root / f"set-{letter}.tar.gz", {f"set-{letter}/{s}.txt": t for s, t in records.items()})
    outcomes = {s: 0 for s in records} if outcomes is None else outcomes
    rows = [f"{s},10,2,5,-1,{label}" for s, label in outcomes.items()]
    (root / f"Outcomes-{letter}.txt").write_text("\n".join([OUTCOME_HEADER, *rows]) + "\n")
    return root


BAD_LINES = [
    ("00:20,HR", "expected 3 comma-separated fields"),
    ("00:20,HR,80,1", "expected 3 comma-separated fields"),
    ("00:20,Foo,80", "unknown parameter 'Foo'"),
    ("0x:20,HR,80", "unparseable time '0x:20'"),
    ("00:61,HR,80", "unparseable time '00:61'"),
    ("00:20,HR,abc", "unparseable value 'abc'"),
    ("00:20,HR,nan", "non-finite value"),
    # Inside float32, so it would reach the tensors; no heart rate (no measurement of the releases) is that large.
    ("00:20,HR,3e38", "value '3e38' for HR is beyond +-100,000"),
    ("00:20,Weight,-200000", "value '-200000' for Weight is beyond +-100,000"),
    # A stray quote must not open a field that swallows the following lines, the next record's included.
    ('00:20,"HR,80', "unknown parameter '\"HR'"),
]


@pytest.mark.parametrize("bad, reason", BAD_LINES, ids=[b for b, _ in BAD_LINES])
def test_bad_line_is_a_counted_skip_naming_file_and_line(tmp_path, bad, reason):
    records = {1001: record_text(1001, ["00:10,HR,80", bad, "01:00,HR,82"]), 1002: record_text(1002)}
    source = make_release(tmp_path / "source", records)
    manifest = preprocess(source, tmp_path / "out")
    assert manifest["counts"]["skipped_lines"] == 1
    assert len(manifest["skipped_lines"]) == 1
    skipped = manifest["skipped_lines"][0]
    assert skipped.startswith("set-a.tar.gz:set-a/1001.txt line 9: "), skipped
    assert reason in skipped
    obs = read_processed(tmp_path / "out").observations
    got = {s: sorted(zip(g["time"], g["variable"].astype(str), g["value"])) for s, g in obs.groupby("stay_id")}
    f = np.float32
    assert got[1001] == [(f(10 / 60), "HR", f(80)), (f(1), "HR", f(82))]
    assert got[1002] == [(f(10 / 60), "HR", f(80)), (f(1), "HR", f(82)), (f(1), "Temp", f(37.1))]

    with pytest.raises(PhysioNet2012Error, match=r"set-a/1001\.txt line 9"):
        preprocess(source, tmp_path / "strict", strict=True)
    assert not (tmp_path / "strict").exists()


def test_strict_lets_the_releases_nameless_parameter_lines_through(tmp_path):
    # set-c's own quirk: ``HH:MM,,value`` lines whose parameter name is lost. Skipped and counted, strict or not.
    records = {1001: record_text(1001, ["00:10,HR,80", "10:45,,1.9"]), 1002: record_text(1002)}
    source = make_release(tmp_path / "source", records, letter="c")
    manifest = preprocess(source, tmp_path / "strict", strict=True)
    assert manifest["skipped_lines"] == ["set-c.tar.gz:set-c/1001.txt line 9: unknown parameter ''"]
    assert read_processed(tmp_path / "strict").labels["stay_id"].tolist() == [1001, 1002]
    records[1002] = record_text(1002, ["00:20,HR,abc"])
    with pytest.raises(PhysioNet2012Error, match=r"set-c/1002\.txt line 8: unparseable value 'abc'"):
        preprocess(make_release(tmp_path / "damaged", records, letter="c"), tmp_path / "damaged-out", strict=True)


def test_nameless_lines_are_skipped_alike_in_a_clean_record_and_in_one_read_line_by_line(tmp_path):
    # 1001 has no other fault (its nameless lines are dropped from the one-pass parse); 1002 also has a bad time,
    # so it is read line by line. Both report every skipped line, in the order of the records and their lines.
    records = {
        1001: record_text(1001, ["10:45,,1.9", "00:10,HR,80", "11:00,,abc"]),
        1002: record_text(1002, ["00:20,,5", "0x:20,HR,80", "00:30,HR,81"]),
    }
    manifest = preprocess(make_release(tmp_path / "source", records, letter="c"), tmp_path / "out")
    origin = "set-c.tar.gz:set-c/{}.txt line {}: "
    assert manifest["skipped_lines"] == [
        origin.format(1001, 8) + NAMELESS,
        origin.format(1001, 10) + NAMELESS,
        origin.format(1002, 8) + NAMELESS,
        origin.format(1002, 9) + "unparseable time '0x:20' (expected HH:MM)",
    ]
    obs = read_processed(tmp_path / "out").observations
    hr = obs[obs["variable"] == "HR"].groupby("stay_id")["value"].apply(list).to_dict()
    assert hr == {1001: [80], 1002: [81]}


def test_urine_at_one_time_is_summed_and_other_repeats_keep_the_later_reading(tmp_path):
    body = ["00:30,Urine,400", "00:30,HR,80", "00:30,Urine,0", "00:30,HR,90", "01:00,Urine,50"]
    source = make_release(tmp_path / "source", {1001: record_text(1001, body), 1002: record_text(1002)})
    manifest = preprocess(source, tmp_path / "out")
    assert manifest["summed_variables"] == ["Urine"]
    obs = read_processed(tmp_path / "out").observations.query("stay_id == 1001")
    urine = obs[obs["variable"] == "Urine"].sort_values("time")
    assert urine["value"].tolist() == [400, 50]  # 400 mL then 0 at one time: 400 mL, not the later 0
    assert sorted(obs[obs["variable"] == "HR"]["value"]) == [80, 90]  # kept as read
    tensors = load_tensors(tmp_path / "out")
    stay = tensors.stay_ids.tolist().index(1001)
    column = {name: i for i, name in enumerate(tensors.variables)}
    assert tensors.values[stay, 0, column["Urine"]] == 400 and tensors.values[stay, 0, column["HR"]] == 90
    assert tensors.values[stay, 1, column["Urine"]] == 50


def test_bad_header_is_a_skip_and_the_stay_is_dropped(tmp_path):
    records = {1001: "Time;Parameter;Value\n00:10,HR,80\n", 1002: record_text(1002)}
    manifest = preprocess(make_release(tmp_path / "source", records), tmp_path / "out")
    assert manifest["skipped_lines"][0].startswith("set-a.tar.gz:set-a/1001.txt line 1: expected header")
    assert [d["stay_id"] for d in manifest["dropped_stays"]] == [1001]
    # A release with no readable line at all is a clear error, not a crash inside the CSV reader nor an empty dataset.
    with pytest.raises(
        ValueError,
        match=r"no usable stay in the source \(1 read, dropped: no time-series "
        r"observation in the first 48 h: 1\); nothing was written",
    ):
        preprocess(make_release(tmp_path / "empty", {1001: "Time,Parameter,Value\n"}), tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_hourly_cohort_asks_every_whole_hour_from_the_first_observation(tmp_path):
    records = {1001: record_text(1001, ["02:30,HR,80", "47:10,HR,82"]), 1002: record_text(1002)}
    source = make_release(tmp_path / "source", records, outcomes={1001: 1, 1002: 0})
    preprocess(source, tmp_path / "per-stay")
    per_stay = read_processed(tmp_path / "per-stay")
    manifest = preprocess(source, tmp_path / "hourly", cohort="hourly")
    hourly = read_processed(tmp_path / "hourly")
    assert per_stay.tasks is None and "task" not in read_manifest(tmp_path / "per-stay")
    assert manifest["task"]["score"] == "auroc" and manifest["counts"]["prediction_times"] == 46 + 48
    tasks = hourly.tasks.groupby("stay_id")
    assert tasks["time"].agg(["min", "max", "count"]).to_dict("index") == {
        1001: {"min": 3.0, "max": 48.0, "count": 46},
        1002: {"min": 1.0, "max": 48.0, "count": 48},
    }
    assert tasks["label"].unique().to_dict() == {1001: [1], 1002: [0]}
    assert_frames_equal(hourly.observations, per_stay.observations)  # the same stays and tables, another task
    with pytest.raises(PhysioNet2012Error, match="unknown cohort 'daily'; choose one of mortality, hourly"):
        preprocess(source, tmp_path / "daily", cohort="daily")


def test_hourly_cohort_is_its_own_dataset_beside_the_plain_one():
    from garlic.data.datasets import DATASETS, SOURCES

    assert SOURCES["physionet2012"].datasets == ("physionet2012", "physionet2012-hourly")
    assert {"physionet2012", "physionet2012-hourly"} <= set(DATASETS) and "physionet2012-mortality" not in DATASETS


def test_truncated_archive_raises_naming_the_archive(tmp_path):
    rng = np.random.default_rng(0)
    records = {}
    for stay in range(2000, 2300):
        body = [
            f"{h:02d}:{m:02d},HR,{v}" for h, m, v in zip(range(48), rng.integers(0, 60, 48), rng.integers(40, 160, 48))
        ]
        records[stay] = record_text(stay, body)
    source = make_release(tmp_path / "source", records)
    archive = source / "set-a.tar.gz"
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    with pytest.raises(PhysioNet2012Error, match=r"set-a\.tar\.gz.*truncated or corrupt"):
        preprocess(source, tmp_path / "out")
    archive.write_bytes(b"this is not a gzip file\n" * 10)
    with pytest.raises(PhysioNet2012Error, match=r"set-a\.tar\.gz"):
        preprocess(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("member", ["../evil.txt", "set-a/../../evil.txt", "/tmp/evil.txt"])
def test_archive_member_escaping_its_folder_is_refused(tmp_path, member):
    source = tmp_path / "source"
    make_release(source, {1001: record_text(1001)})
    write_archive(source / "set-a.tar.gz", {"set-a/1001.txt": record_text(1001), member: record_text(1)})
    with pytest.raises(PhysioNet2012Error, match="escapes its folder"):
        preprocess(source, tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out").exists()


def test_outcome_without_record_is_counted_and_record_without_outcome_is_dropped(tmp_path):
    records = {1001: record_text(1001), 1002: record_text(1002), 1003: record_text(1003)}
    outcomes = {1001: 1, 1002: 0, 9999: 1}  # 1003 has no outcome; 9999 has no record
    manifest = preprocess(make_release(tmp_path / "source", records, outcomes), tmp_path / "out")
    assert manifest["outcomes_without_record"] == [9999]
    assert manifest["counts"]["outcomes_without_record"] == 1
    assert manifest["dropped_stays"] == [{"stay_id": 1003, "reason": "record has no row in the outcomes file"}]
    dataset = read_processed(tmp_path / "out")
    assert dataset.labels[["stay_id", "label"]].values.tolist() == [[1001, 1], [1002, 0]]
    assert set(dataset.observations["stay_id"]) == set(dataset.static["stay_id"]) == {1001, 1002}


def test_missing_outcomes_file_is_a_clear_error(tmp_path):
    source = make_release(tmp_path / "source", {1001: record_text(1001)})
    (source / "Outcomes-a.txt").unlink()
    with pytest.raises(PhysioNet2012Error, match=r"set-a\.tar\.gz.*Outcomes-a\.txt"):
        preprocess(source, tmp_path / "out")


def test_requesting_an_absent_set_is_a_clear_error(tmp_path):
    source = make_release(tmp_path / "source", {1001: record_text(1001)})
    with pytest.raises(PhysioNet2012Error, match=r"\['b'\]"):
        preprocess(source, tmp_path / "out", sets=["a", "b"])


def test_any_subset_of_sets_in_mixed_layouts(tmp_path):
    source = make_release(tmp_path / "source", {1001: record_text(1001)}, letter="a")
    make_release(source, {3001: record_text(3001, ["00:05,HR,70"])}, {3001: 1}, as_folder=True, letter="c")
    manifest = preprocess(source, tmp_path / "out")
    assert manifest["source"]["sets"] == ["a", "c"]
    labels = read_processed(tmp_path / "out").labels
    assert labels[["stay_id", "label"]].values.tolist() == [[1001, 0], [3001, 1]]
    assert preprocess(source, tmp_path / "only_c", sets=["c"])["counts"]["stays"] == 1


# --------------------------------------------------------------------------------------------------------------
# Crashes and caches
# --------------------------------------------------------------------------------------------------------------


def _crash_after_first_table(monkeypatch):
    original = pq.write_table
    calls = []

    def write_table(*args, **kwargs):
        calls.append(args)
        if len(calls) > 1:
            raise RuntimeError("simulated crash while writing")
        return original(*args, **kwargs)

    monkeypatch.setattr(pq, "write_table", write_table)
    return calls


def test_crash_while_writing_keeps_the_previous_dataset(tmp_path, monkeypatch):
    old = make_release(tmp_path / "old", {1001: record_text(1001)})
    new = make_release(tmp_path / "new", {1001: record_text(1001), 1002: record_text(1002)})
    destination = tmp_path / "data" / "processed"
    preprocess(old, destination)
    before = read_processed(destination)
    manifest_bytes = (destination / MANIFEST).read_bytes()

    calls = _crash_after_first_table(monkeypatch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        preprocess(new, destination)
    assert len(calls) == 2  # the crash came after one table was really written
    monkeypatch.undo()

    assert (destination / MANIFEST).read_bytes() == manifest_bytes
    after = read_processed(destination)
    for name in ("observations", "static", "labels"):
        assert_frames_equal(getattr(after, name), getattr(before, name))
    assert sorted(p.name for p in destination.parent.iterdir()) == ["processed"]  # no staging folder left

    preprocess(new, destination)  # a re-run after the crash succeeds
    assert read_processed(destination).labels["stay_id"].tolist() == [1001, 1002]


def test_crash_on_first_write_leaves_nothing_readable(tmp_path, monkeypatch):
    source = make_release(tmp_path / "source", {1001: record_text(1001)})
    destination = tmp_path / "data" / "processed"
    _crash_after_first_table(monkeypatch)
    with pytest.raises(RuntimeError):
        preprocess(source, destination)
    monkeypatch.undo()
    assert not destination.exists()
    with pytest.raises(DatasetNotFoundError):
        read_processed(destination)
    with pytest.raises(DatasetNotFoundError):
        load_tensors(destination)


KILL_MIDWAY = """
import os, sys
import pyarrow.parquet as pq
original = pq.write_table
def write_table(*args, **kwargs):
    original(*args, **kwargs)
    os._exit(9)  # the process dies after the first table: no clean-up runs
pq.write_table = write_table
from garlic.sources.physionet2012 import preprocess
preprocess(sys.argv[1], sys.argv[2])
"""


def test_killed_process_leaves_no_partial_dataset_where_readers_look(tmp_path):
    source = make_release(tmp_path / "source", {1001: record_text(1001)})
    destination = tmp_path / "data" / "processed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", KILL_MIDWAY, str(source), str(destination)], env=env, cwd=REPO)
    assert done.returncode == 9
    assert not destination.exists()
    leftovers = [p for p in destination.parent.iterdir()]
    assert leftovers and all(p.name.startswith(".processed.") for p in leftovers)  # hidden staging folder
    for partial in leftovers:
        assert not (partial / MANIFEST).exists()
        with pytest.raises(DatasetNotFoundError):
            read_processed(partial)
    with pytest.raises(DatasetNotFoundError):
        read_manifest(destination)
    preprocess(source, destination)  # the re-run succeeds despite the leftover
    assert read_processed(destination).labels["stay_id"].tolist() == [1001]


def test_stale_tensor_cache_is_rebuilt_when_the_records_change(tmp_path):
    source = make_release(tmp_path / "source", {1001: record_text(1001), 1002: record_text(1002)}, as_folder=True)
    destination = tmp_path / "processed"
    preprocess(source, destination)
    first = load_tensors(destination)
    hr = first.variables.index("HR")
    assert first.values[0, 0, hr] == 80
    stale = (destination / "tensors.npz").read_bytes()

    # One value changes; the counts (stays, rows, skips) stay the same.
    record = source / "set-a" / "1001.txt"
    record.write_text(record.read_text().replace("00:10,HR,80", "00:10,HR,95"))
    preprocess(source, destination)
    (destination / "tensors.npz").write_bytes(stale)  # e.g. a cache copied back from elsewhere
    second = load_tensors(destination)
    assert second.values[0, 0, hr] == 95
    assert load_tensors(destination).values[0, 0, hr] == 95  # and the rebuilt cache is what is reused
    with np.load(destination / "tensors.npz", allow_pickle=False) as stored:
        assert stored["values"][0, 0, hr] == 95


def test_manifest_is_json_with_provenance(tmp_path):
    source = make_release(tmp_path / "source", {1001: record_text(1001)})
    preprocess(source, tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    files = manifest["source"]["files_sha256"]
    import hashlib

    assert files["set-a.tar.gz"] == hashlib.sha256((source / "set-a.tar.gz").read_bytes()).hexdigest()
    assert files["Outcomes-a.txt"] == hashlib.sha256((source / "Outcomes-a.txt").read_bytes()).hexdigest()


def test_a_source_of_records_without_a_value_leaves_the_dataset_there_as_it_was(tmp_path):
    from garlic.sources import synthetic

    destination = tmp_path / "processed"
    synthetic.generate(destination, n_stays=20, seed=0)
    before = (destination / MANIFEST).read_bytes()
    (tmp_path / "source" / "set-a").mkdir(parents=True)
    (tmp_path / "source" / "set-a" / "132539.txt").write_text("Time,Parameter,Value\n")
    (tmp_path / "source" / "Outcomes-a.txt").write_text(
        "RecordID,SAPS-I,SOFA,Length_of_stay,Survival,In-hospital_death\n132539,1,1,5,-1,0\n"
    )
    with pytest.raises(
        ValueError,
        match=r"no usable stay in the source \(1 read, dropped: no time-series observation "
        r"in the first 48 h: 1\); nothing was written: .*processed is left as it "
        r"was",
    ):
        preprocess(tmp_path / "source", destination)
    assert (destination / MANIFEST).read_bytes() == before and len(read_processed(destination).labels) == 20
