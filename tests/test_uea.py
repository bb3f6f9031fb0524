"""The UEA source (``garlic.sources.uea``): the archive's files read as they are, made irregular by a seeded, stated
share (and whole sensors), the dropped values kept, the archive's split recorded and saved, and bad input refused
in one line. The real sets are read from the ``aeon`` package (installed by ``bin/setup``, without its dependencies), skipped where it is absent;
the rest runs on small ``.ts`` files written here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from garlic.data.splits import Normalisation, load_splits, split_path
from garlic.io.tables import read_manifest, read_processed, write_processed
from garlic.io.tensors import load_tensors
from garlic.sources import uea
from helpers import error_line, garlic_here

HAVE_AEON = importlib.util.find_spec("aeon") is not None
needs_aeon = pytest.mark.skipif(
    not HAVE_AEON, reason="aeon, whose wheel holds the UEA files, is not installed (bin/setup installs it)"
)

HEADER = "#a test set\n@problemName Tiny\n@timeStamps false\n@univariate false\n@dimensions 2\n@classLabel true a b c\n@data\n"


def write_tiny(folder: Path, series: int = 10, steps: int = 20, seed: int = 0, lines: list[str] | None = None) -> Path:
    """Tiny_TRAIN.ts and Tiny_TEST.ts in ``folder`` (as the basicmotions cohort's files: BasicMotions_*.ts): two
    dimensions, classes a, b, c in turn; returns the folder."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for part in ("TRAIN", "TEST"):
        rows = lines or [
            ":".join(",".join(f"{v:.4f}" for v in rng.normal(size=steps)) for _ in range(2)) + f":{'abc'[i % 3]}"
            for i in range(series)
        ]
        (folder / f"BasicMotions_{part}.ts").write_text(HEADER + "\n".join(rows) + "\n")
    return folder


def tiny(tmp_path: Path, name: str = "tiny", **options) -> tuple[Path, dict]:
    destination = tmp_path / "processed" / name
    manifest = uea.preprocess(destination, "basicmotions", write_tiny(tmp_path / "raw"), **options)
    return destination, manifest


@pytest.fixture(scope="module")
def basicmotions(tmp_path_factory) -> Path:
    if not HAVE_AEON:
        pytest.skip("aeon, whose wheel holds the UEA files, is not installed (bin/setup installs it)")
    destination = tmp_path_factory.mktemp("data") / "processed" / "uea-basicmotions"
    uea.preprocess(destination, "basicmotions")
    return destination


@needs_aeon
def test_basicmotions_is_read_from_aeons_files_value_for_value(basicmotions):
    raw = uea.aeon_data() / "BasicMotions"
    first_line = next(
        line for line in (raw / "BasicMotions_TRAIN.ts").read_text().splitlines() if line and line[0] not in "#@"
    )
    first_values = [float(v) for v in first_line.split(":")[3].split(",")]  # dim_3 of the first series
    tables, manifest = read_processed(basicmotions), read_manifest(basicmotions)
    dropped = pd.read_parquet(basicmotions / uea.DROPPED)
    both = pd.concat([tables.observations.astype({"variable": str}), dropped.drop(columns="reason")])
    series = both[(both["stay_id"] == 1) & (both["variable"] == "dim_3")].sort_values("time")
    np.testing.assert_allclose(series["value"], np.float32(first_values))
    np.testing.assert_array_equal(series["time"], np.arange(100))
    assert manifest["classes"] == ["Standing", "Running", "Walking", "Badminton"]
    assert first_line.rsplit(":", 1)[1] == manifest["classes"][int(tables.labels["label"].iloc[0])]
    assert manifest["counts"]["per_class"] == {name: 20 for name in manifest["classes"]}
    assert len(both) == 80 * 100 * 6  # every value of the 80 series, kept or dropped
    assert len(tables.observations) == 80 * round(0.4 * 600)


@needs_aeon
def test_japanesevowels_keeps_its_variable_lengths(tmp_path):
    destination = tmp_path / "uea-japanesevowels"
    manifest = uea.preprocess(destination, "japanesevowels")
    tables = read_processed(destination)
    dropped = pd.read_parquet(destination / uea.DROPPED)
    steps = pd.concat([tables.observations, dropped]).groupby("stay_id")["time"].max() + 1
    assert (steps.min(), steps.max()) == (7, 29)
    assert manifest["counts"]["stays"] == 640 and len(manifest["classes"]) == 9
    assert manifest["subject_splits"]["test"] == list(range(271, 641))


def test_irregularisation_drops_the_stated_share_of_every_series_seeded(tmp_path):
    destination, manifest = tiny(tmp_path, drop_share=0.3, seed=5)
    kept = read_processed(destination).observations
    dropped = pd.read_parquet(destination / uea.DROPPED)
    assert (dropped.groupby("stay_id").size() == round(0.3 * 40)).all()
    assert (kept.groupby("stay_id").size() == 40 - round(0.3 * 40)).all()
    assert manifest["irregular"] == {
        "seed": 5,
        "drop_share": 0.3,
        "drop_sensors": 0,
        "values_read": 20 * 40,
        "values_dropped": {"sensor": 0, "share": 20 * 12},
    }
    again, _ = tiny(tmp_path, "again", drop_share=0.3, seed=5)
    other, _ = tiny(tmp_path, "other", drop_share=0.3, seed=6)
    pd.testing.assert_frame_equal(pd.read_parquet(again / uea.DROPPED), dropped)
    assert not pd.read_parquet(other / uea.DROPPED)[["stay_id", "time", "variable"]].equals(
        dropped[["stay_id", "time", "variable"]]
    )


def test_whole_sensors_are_dropped_before_the_share(tmp_path):
    destination, manifest = tiny(tmp_path, drop_share=0.5, drop_sensors=1)
    kept = read_processed(destination).observations
    dropped = pd.read_parquet(destination / uea.DROPPED)
    assert (kept.groupby("stay_id")["variable"].nunique() == 1).all()  # one of the two variables left
    assert (dropped[dropped["reason"] == "sensor"].groupby("stay_id").size() == 20).all()
    assert (dropped[dropped["reason"] == "share"].groupby("stay_id").size() == 10).all()  # half of the 20 left
    assert manifest["irregular"]["values_dropped"] == {"sensor": 20 * 20, "share": 20 * 10}


def test_the_archives_split_is_recorded_saved_and_read_back(tmp_path):
    destination, manifest = tiny(tmp_path, seed=3)
    recorded = manifest["subject_splits"]
    assert recorded["test"] == list(range(11, 21))  # the archive's test file, after its 10 training series
    labels = read_processed(destination).labels.set_index("stay_id")["label"]
    assert sorted(labels[recorded["validation"]]) == [0, 1, 2]  # a fifth of each class: round(0.2 x 3 or 4) = 1
    assert sorted(recorded["train"] + recorded["validation"]) == list(range(1, 11))
    tensors = load_tensors(destination)
    split = load_splits(destination, tensors, "subject-splits")[0]
    saved = split_path(destination, "subject-splits", 0)
    assert json.loads(saved.read_text())["validation"] == recorded["validation"]
    fitted = Normalisation.fit(tensors.subset(np.searchsorted(tensors.stay_ids, recorded["train"])))
    np.testing.assert_array_equal(split.normalisation.value_mean, fitted.value_mean)  # training stays only
    before = saved.stat().st_mtime_ns  # a saved split is read back, not drawn and written again
    assert load_splits(destination, tensors, "subject-splits")[0].digest() == split.digest()
    assert saved.stat().st_mtime_ns == before
    other, _ = tiny(tmp_path, "other", seed=4)
    assert read_manifest(other)["subject_splits"]["validation"] != recorded["validation"]


@pytest.mark.parametrize(
    "lines, message",
    [
        (["1,2,3:4,5,6:a", "1,2:b"], "BasicMotions_TRAIN.ts: line 9 has 1 dimensions, the header says 2"),
        (["1,2,x:4,5,6:a"], "BasicMotions_TRAIN.ts: line 8, dimension 0: not a list of numbers"),
        (["1,2,3:4,5,6:z"], "BasicMotions_TRAIN.ts: class 'z' is not one of the header's ['a', 'b', 'c']"),
    ],
)
def test_a_malformed_file_is_refused_naming_file_and_line(tmp_path, lines, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")) as refused:
        uea.preprocess(tmp_path / "out", "basicmotions", write_tiny(tmp_path / "raw", lines=lines))
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_missing_values_are_not_observations(tmp_path):
    folder = write_tiny(tmp_path / "raw", lines=["1,?,3:4,5,6:a", "1,2,3:4,5,6:b", "1,2,3:4,5,6:c"] * 2)
    uea.preprocess(tmp_path / "out", "basicmotions", folder, drop_share=0.0)
    observations = read_processed(tmp_path / "out").observations
    first = observations[(observations["stay_id"] == 1) & (observations["variable"] == "dim_0")]
    assert first["time"].tolist() == [0.0, 2.0]


def test_missing_files_and_bad_options_are_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"no BasicMotions_TRAIN.ts or BasicMotions_TEST.ts; expected the UEA"):
        uea.preprocess(tmp_path / "out", "basicmotions", tmp_path)
    with pytest.raises(ValueError, match=r"--drop-share must be at least 0 and below 1, got 1.0"):
        tiny(tmp_path, drop_share=1.0)
    with pytest.raises(ValueError, match=r"--drop-sensors must be from 0 to 1 \(the set has 2\), got 2"):
        tiny(tmp_path, drop_sensors=2)


def test_garlic_preprocess_builds_it_and_garlic_train_refuses_its_classes(tmp_path):
    source = write_tiny(tmp_path / "raw")
    done = garlic_here(
        "preprocess", "uea", "--source", str(source), "--drop-share", "0.5", "--seed", "1", root=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "uea-basicmotions: wrote" in done.stdout
    manifest = read_manifest(tmp_path / "data" / "processed" / "uea-basicmotions")
    assert (manifest["irregular"]["drop_share"], manifest["irregular"]["seed"]) == (0.5, 1)
    refused = garlic_here("train", "--dataset", "uea-basicmotions", root=tmp_path)
    assert refused.returncode != 0
    assert error_line(refused.stderr).endswith(
        "the project's methods predict the risk of a 0/1 outcome; its comparison is python -m experiments.uea"
    )
    elsewhere = garlic_here("preprocess", "synthetic", "--drop-share", "0.5", root=tmp_path)
    assert "--drop-share does not apply to synthetic" in elsewhere.stderr


def test_labels_outside_the_manifests_classes_are_refused(tmp_path):
    observations = pd.DataFrame({"stay_id": [1, 2], "time": [0.0, 0.0], "variable": ["x", "x"], "value": [1.0, 2.0]})
    static, labels = pd.DataFrame({"stay_id": [1, 2]}), pd.DataFrame({"stay_id": [1, 2], "label": [0, 3]})
    with pytest.raises(ValueError, match=r"labels.label must be a class index 0..2"):
        write_processed(tmp_path / "out", observations, static, labels, ["x"], {"classes": ["a", "b", "c"]})
    with pytest.raises(ValueError, match=r"labels.label must be 0 or 1"):
        write_processed(tmp_path / "out", observations, static, labels, ["x"], {})
