"""PhysioNet 2019: cohort counts on the complete sets A and B, archive formats, the true ICULOS hour, bad input."""

from __future__ import annotations

import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from garlic.cli import main
from garlic.config import Config
from garlic.data.datasets import processed_folder
from garlic.data.splits import load_splits, not_applicable, published_ids
from garlic.sources import physionet2019
from garlic.sources.physionet2019 import COLUMNS, HEADER, PhysioNet2019Error, preprocess
from garlic.io.tables import DatasetNotFoundError, read_manifest, read_processed
from garlic.io.tensors import load_tensors
from helpers import SHARED

P19 = SHARED / "physionet2019"
needs_p19 = pytest.mark.skipif(
    not (P19 / "training_setA.zip").is_file(), reason=f"shared PhysioNet 2019 data not found at {P19}"
)


# ---------------------------------------------------------------------------------------------------------------
# Real data: one preprocessing per cohort, shared by the tests of that cohort


@pytest.fixture(scope="module")
def processed(tmp_path_factory):
    """Each cohort built by ``preprocess``, from one reading of the 40,336 raw files (``read_sets``, 8 of a cohort's
    10 s): what is read does not depend on the cohort. Each gets its own copy, which the cohort's rules may change."""
    cache, read = {}, {}
    read_once = physionet2019.read_sets

    def read_sets(located, strict):
        if not read:
            read["sets"] = read_once(located, strict)
        rows, *rest = read["sets"]
        return rows.copy(), *rest

    def get(cohort: str):
        if cohort not in cache:
            destination = tmp_path_factory.mktemp(cohort) / "processed"
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(physionet2019, "read_sets", read_sets)
                preprocess(P19, destination, cohort=cohort)
            cache[cohort] = (destination, read_processed(destination))
        return cache[cohort]

    return get


@needs_p19
@pytest.mark.parametrize(
    "cohort, stays, positives",
    # garlic: the 40,331 stays of the GARLIC reference split; raindrop: the 38,803 of Raindrop's splits.
    [("garlic", 40_331, 2_931), ("raindrop", 38_803, 1_626), ("early", 8_870, 1_071)],
)
def test_cohort_counts_on_sets_a_and_b(processed, cohort, stays, positives):
    folder, dataset = processed(cohort)
    counts = dataset.manifest["counts"]
    assert counts["stays_read"] == 40_336
    assert counts["stays_read_per_set"] == {"A": 20_336, "B": 20_000}
    assert counts["stays_ever_septic_read"] == 2_932
    assert (counts["stays"], counts["positives"]) == (stays, positives)
    assert counts["prevalence"] == pytest.approx(positives / stays, abs=1e-6)
    assert dataset.manifest["cohort"] == cohort and dataset.manifest["cohort_rule"]
    dropped = sum(len(ids) for ids in dataset.manifest["dropped_stays"].values())
    assert dropped + stays == 40_336
    tensors = load_tensors(folder)
    assert tensors.values.shape[0] == stays and tensors.values.shape[2] == 34
    assert tensors.static_features == ["Age", "Gender", "Unit1", "Unit2", "HospAdmTime"]


@needs_p19
def test_garlic_window_keeps_the_true_iculos_hour(processed):
    _, dataset = processed("garlic")
    times = dataset.observations.groupby("stay_id")["time"]
    assert times.max().max() <= 48
    # The first row (ICULOS 1) often holds no value, so most stays start at hour 2; 5,912 stays start at hour 3 or
    # later and keep that true hour (a time re-based to the first observation would start every stay at one hour).
    assert (times.min() >= 3).sum() > 5_000


@needs_p19
def test_raindrop_cohort_is_raindrops_published_stays_and_rows(processed):
    folder, dataset = processed("raindrop")
    labels = dataset.labels.set_index("stay_id")
    published = published_ids("raindrop", "physionet2019-raindrop")
    assert np.array_equal(labels.index, np.sort(np.concatenate(list(published[0].values()))))
    # The input ends before the first labelled hour: no model of this cohort sees an hour with SepsisLabel 1.
    last_input = dataset.observations.groupby("stay_id")["time"].max()
    septic = labels["first_septic_hour"].reindex(last_input.index)
    assert (last_input[septic.notna()] < septic.dropna()).all()
    assert dataset.observations.groupby("stay_id")["time"].nunique().max() <= 60
    # 65 stays hold no value before sepsis is labelled; Raindrop keeps them, as one empty step.
    tensors = load_tensors(folder)
    empty = ~tensors.mask.any(axis=(1, 2))
    assert empty.sum() == 65 and (tensors.lengths[empty] == 1).all() and (tensors.times[empty] == 0).all()
    assert np.isin(tensors.stay_ids[empty], labels.index).all()
    splits = load_splits(folder, tensors, "raindrop", "physionet2019-raindrop")
    assert [(len(s.train), len(s.validation), len(s.test)) for s in splits] == [(31_042, 3_880, 3_881)] * 5


@needs_p19
def test_garlic_cohort_is_the_garlic_reference_split_and_not_raindrops(processed):
    folder, dataset = processed("garlic")
    tensors = load_tensors(folder)
    (split,) = load_splits(folder, tensors, "garlic-reference", "physionet2019-garlic")
    assert (len(split.train), len(split.validation), len(split.test)) == (32_264, 4_034, 4_033)
    assert np.array_equal(np.sort(np.concatenate([split.train, split.validation, split.test])), tensors.stay_ids)
    # Raindrop's stays are all here, but with other rows: its protocol runs only on its own cohort.
    assert not_applicable("garlic-reference", tensors.stay_ids, "physionet2019-garlic") is None
    assert "not published for dataset 'physionet2019-garlic'" in not_applicable(
        "raindrop", tensors.stay_ids, "physionet2019-garlic"
    )


@pytest.mark.parametrize(
    "name, dataset", [("raindrop", "physionet2019-raindrop"), ("garlic-reference", "physionet2019-garlic")]
)
def test_shipped_p19_protocols_equal_the_shared_ones(name, dataset):
    shared = P19 / "splits" / f"{name}.json"
    if not shared.is_file():
        pytest.skip(f"the shared protocol file is not at {shared}")
    splits = json.loads(shared.read_text())["splits"]
    shipped = published_ids(name, dataset)
    assert len(shipped) == len(splits) == (5 if name == "raindrop" else 1)
    for index, key in enumerate(sorted(splits, key=int)):
        for part, ids in splits[key].items():
            assert [f"p{i:06d}" for i in shipped[index][part]] == sorted(ids)


@needs_p19
def test_early_cohort_has_no_sepsis_inside_its_window(processed):
    _, dataset = processed("early")
    labels = dataset.labels
    assert not (labels["first_septic_hour"] <= 48).any()
    assert (labels["last_hour"] > 48).all()
    assert (labels["label"] == (labels["first_septic_hour"] > 48)).all()
    assert dataset.observations["time"].max() <= 48


# ---------------------------------------------------------------------------------------------------------------
# Generated files


def _psv(rows: list[list[object]]) -> bytes:
    lines = [HEADER.decode()] + ["|".join("NaN" if v is None else str(v) for v in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def _row(hour: int, label: int = 0, hr: float | None = 80.0) -> list[object]:
    row: list[object] = [None] * len(COLUMNS)
    row[0] = hr
    row[COLUMNS.index("Age")] = 65
    row[COLUMNS.index("Gender")] = 1
    row[COLUMNS.index("HospAdmTime")] = -2.5
    row[-2], row[-1] = hour, label
    return row


STAYS = {
    "p000001.psv": _psv([_row(h) for h in range(1, 30)]),
    "p000002.psv": _psv([_row(h, label=int(h >= 50)) for h in range(5, 70)]),  # starts at hour 5, septic at 50
    "p000003.psv": _psv([_row(h, label=1) for h in range(1, 10)]),
}


def _write_set(root: Path, form: str, files: dict[str, bytes], name: str = "training_setA") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    folder = root / name
    folder.mkdir()
    for file, text in files.items():
        (folder / file).write_bytes(text)
    if form == "zip":
        with zipfile.ZipFile(root / f"{name}.zip", "w") as archive:
            for file in files:
                archive.write(folder / file, f"{name}/{file}")
    elif form == "tar.gz":
        with tarfile.open(root / f"{name}.tar.gz", "w:gz") as archive:
            archive.add(folder, arcname=name)
    if form != "folder":
        for file in files:
            (folder / file).unlink()
        folder.rmdir()
    return root


@pytest.mark.parametrize("form", ["folder", "zip", "tar.gz"])
def test_folder_zip_and_tar_give_the_same_tables(tmp_path, form):
    reference = tmp_path / "reference"
    preprocess(_write_set(tmp_path / "folder-source", "folder", STAYS), reference)
    if form != "folder":
        preprocess(_write_set(tmp_path / "source", form, STAYS), tmp_path / "out")
        for table in ("observations", "labels", "static"):
            pd.testing.assert_frame_equal(
                getattr(read_processed(tmp_path / "out"), table), getattr(read_processed(reference), table)
            )
    dataset = read_processed(reference)
    assert dataset.labels["stay_id"].tolist() == [1, 2, 3]
    assert dataset.labels["label"].tolist() == [0, 1, 1]
    late = dataset.observations[dataset.observations["stay_id"] == 2]["time"]
    assert late.min() == 5 and late.max() == 48


def test_early_cohort_on_generated_stays(tmp_path):
    manifest = preprocess(_write_set(tmp_path / "source", "folder", STAYS), tmp_path / "out", cohort="early")
    dataset = read_processed(tmp_path / "out")
    # stay 1 leaves the ICU before hour 48, stay 3 is septic inside the window; stay 2 becomes septic after it.
    assert dataset.labels[["stay_id", "label"]].values.tolist() == [[2, 1]]
    assert manifest["dropped_stays"]["no ICU row after hour 48"] == [1]
    assert manifest["dropped_stays"]["SepsisLabel 1 within the first 48 ICU hours"] == [3]


def test_sets_a_and_b_are_read_together(tmp_path):
    root = _write_set(tmp_path / "source", "zip", {"p000001.psv": STAYS["p000001.psv"]})
    _write_set(root, "folder", {"p100001.psv": STAYS["p000002.psv"]}, name="training_setB")
    manifest = preprocess(root, tmp_path / "out")
    assert manifest["counts"]["stays_read_per_set"] == {"A": 1, "B": 1}
    assert read_processed(tmp_path / "out").labels["stay_id"].tolist() == [1, 100001]


def test_bad_lines_are_skipped_and_reported_with_file_and_line(tmp_path):
    good = _psv([_row(1), _row(2)]).decode().splitlines()
    broken = "\n".join(
        [
            *good,
            "1|2|3",
            "|".join(["abc", *["NaN"] * (len(COLUMNS) - 3), "3", "0"]),
            good[2][:-1] + "2",
            "|".join(["3e38", *["NaN"] * (len(COLUMNS) - 3), "4", "0"]),
        ]
    )
    files = {
        "p000001.psv": broken.encode() + b"\n",
        "p000002.psv": STAYS["p000001.psv"],
        "p000003.psv": b"HR|Temp\n1|2\n",
    }
    manifest = preprocess(_write_set(tmp_path / "source", "zip", files), tmp_path / "out")
    skipped = manifest["skipped_lines"]
    assert len(skipped) == 5
    assert skipped[0].startswith("training_setA.zip:training_setA/p000001.psv line 4: expected 41")
    assert "line 5: unparseable value 'abc' for HR" in skipped[1]
    assert "line 6: SepsisLabel must be 0 or 1, got '2'" in skipped[2]
    assert "line 7: value '3e38' for HR is beyond +-100,000" in skipped[3]  # inside float32, no heart rate
    assert "p000003.psv line 1: expected header 'HR|O2Sat|...|ICULOS|SepsisLabel'; the first line differs" in skipped[4]
    dataset = read_processed(tmp_path / "out")
    assert dataset.labels["stay_id"].tolist() == [1, 2]  # stay 1 keeps its two good rows
    assert sorted(dataset.observations.query("stay_id == 1")["time"]) == [1.0, 2.0]
    with pytest.raises(PhysioNet2019Error, match=r"p000001.psv line 4"):
        preprocess(tmp_path / "source", tmp_path / "strict", strict=True)


def test_each_cohort_is_its_own_dataset_and_folder(tmp_path, capsys):
    source = _write_set(tmp_path / "source", "folder", STAYS)
    root = tmp_path / "data"
    for cohort in ("garlic", "early"):  # early after garlic used to replace it
        main(["--data-root", str(root), "preprocess", "physionet2019", "--source", str(source), "--cohort", cohort])
    assert "next: garlic train --dataset physionet2019-early" in capsys.readouterr().out
    garlic = read_processed(processed_folder("physionet2019-garlic", root))
    early = read_processed(processed_folder("physionet2019-early", root))
    assert garlic.manifest["cohort"] == "garlic" and garlic.labels["stay_id"].tolist() == [1, 2, 3]
    assert early.manifest["cohort"] == "early" and early.labels["stay_id"].tolist() == [2]
    with pytest.raises(DatasetNotFoundError, match="physionet2019-garlic, physionet2019-raindrop, physionet2019-early"):
        processed_folder("physionet2019", root)
    with pytest.raises(SystemExit):  # training must name the cohort
        main(["--data-root", str(root), "train", "--dataset", "physionet2019"])
    assert "physionet2019 has one dataset per cohort; name one of physionet2019-garlic" in capsys.readouterr().err
    preset = Config.for_dataset("physionet2019-early")  # the cohort's dataset takes the source's shipped preset
    assert (
        preset.dataset == "physionet2019-early"
        and preset == Config.for_dataset("physionet2019-garlic").override({"dataset": "physionet2019-early"})
        and preset.window_size == 9
    )


def test_strict_reaches_the_preprocessor_from_the_command_line(tmp_path, capsys):
    unreadable = "|".join(["abc", *["NaN"] * (len(COLUMNS) - 3), "3", "0"]).encode()
    files = {"p000001.psv": HEADER + b"\n" + unreadable + b"\n", "p000002.psv": STAYS["p000001.psv"]}
    source = _write_set(tmp_path / "source", "folder", files)
    command = ["--data-root", str(tmp_path / "data"), "preprocess", "physionet2019", "--source", str(source)]
    with pytest.raises(SystemExit) as stopped:
        main([*command, "--strict"])
    assert stopped.value.code == 2
    assert "training_setA/p000001.psv line 2: unparseable value 'abc' for HR" in capsys.readouterr().err
    assert not processed_folder("physionet2019-garlic", tmp_path / "data").exists()
    main(command)  # without --strict the line is a counted skip
    assert read_manifest(processed_folder("physionet2019-garlic", tmp_path / "data"))["counts"]["skipped_lines"] == 1


def test_missing_source_and_repeated_stays_are_errors(tmp_path):
    with pytest.raises(PhysioNet2019Error, match="neither training_setA nor training_setB"):
        preprocess(tmp_path, tmp_path / "out")
    root = _write_set(tmp_path / "source", "folder", {"p000001.psv": STAYS["p000001.psv"]})
    _write_set(root, "zip", {"p000001.psv": STAYS["p000001.psv"]}, name="training_setB")
    with pytest.raises(PhysioNet2019Error, match="p000001 appears more than once"):
        preprocess(root, tmp_path / "out")
    with pytest.raises(PhysioNet2019Error, match="unknown cohort"):
        preprocess(root, tmp_path / "out", cohort="nope")


def test_values_reach_the_tensors(tmp_path):
    preprocess(_write_set(tmp_path / "source", "folder", STAYS), tmp_path / "out")
    tensors = load_tensors(tmp_path / "out")
    assert tensors.lengths.tolist() == [29, 44, 9]
    assert np.allclose(tensors.values[0, :29, 0], 80.0) and tensors.mask[0, :29, 0].all()
    assert tensors.static[0].tolist()[:2] == [65.0, 1.0]


@pytest.mark.parametrize(
    "files, message",
    [
        (
            {"p000001.psv": HEADER + b"\n"},
            "no usable stay in the source (1 read, dropped: file has no valid hourly row: 1); nothing was written",
        ),
        ({}, "no pNNNNNN.psv file found in"),
    ],
    ids=["header-only record", "empty set"],
)
def test_a_source_without_a_usable_stay_leaves_the_dataset_there_as_it_was(tmp_path, capsys, files, message):
    destination = tmp_path / "data" / "processed" / "physionet2019-garlic"
    preprocess(_write_set(tmp_path / "good", "folder", STAYS), destination)
    (destination / "splits").mkdir()
    (destination / "splits" / "kept.json").write_text("{}")
    before = (destination / "manifest.json").read_bytes()
    with pytest.raises(SystemExit) as stopped:
        main(
            [
                "--data-root",
                str(tmp_path / "data"),
                "preprocess",
                "physionet2019",
                "--source",
                str(_write_set(tmp_path / "bad", "zip", files)),
            ]
        )
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert (destination / "manifest.json").read_bytes() == before
    assert len(read_processed(destination).labels) == 3 and (destination / "splits" / "kept.json").is_file()


def test_a_folder_source_is_recorded_by_a_digest_of_its_records(tmp_path):
    source = _write_set(tmp_path / "source", "folder", STAYS)
    first = preprocess(source, tmp_path / "one")["source"]["files_sha256"]
    assert list(first) == ["training_setA/"] and len(first["training_setA/"]) == 64
    assert preprocess(source, tmp_path / "two")["source"]["files_sha256"] == first  # the same files, the same digest
    (source / "training_setA" / "p000001.psv").write_bytes(STAYS["p000001.psv"].replace(b"80.0", b"81.0", 1))
    assert preprocess(source, tmp_path / "three")["source"]["files_sha256"] != first  # one value changed
