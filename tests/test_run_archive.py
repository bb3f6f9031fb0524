"""The committed record of the runs behind a table or a study (one ``RunArchive``, in a table's or a study's layout):
read back only for the same settings and data, whole or not at all, with the outcomes joined back from the
dataset."""

import gzip
import io

import numpy as np
import pandas as pd
import pytest

from garlic.tracking import archive as run_archive
from garlic.tracking.archive import RUNS, RunArchive, Unit, risks_path, study_archive, write_risks

LABELS = pd.Series([0, 1, 0, 1], index=pd.Index([11, 12, 13, 14], name="stay_id"), name="label")


def unit(seed=0, risk=(0.1, 0.8, 0.3, 0.6), settings="abc"):
    predictions = pd.DataFrame({"stay_id": LABELS.index, "label": LABELS.to_numpy(), "risk": risk})
    metrics = {"auroc": 1.0, "auprc": 1.0, "brier": 0.05, "ece": 0.1}
    return Unit("preset", "five-split", 2, seed, "run-1", settings, metrics, predictions)


def test_a_kept_unit_reads_back_with_its_metrics_and_outcomes_for_the_same_settings_and_data_only(tmp_path):
    RunArchive(tmp_path, "data-1", LABELS).keep([unit(), unit(seed=None)])
    archive = RunArchive(tmp_path, "data-1", LABELS)
    back = archive.find("preset", "five-split", 2, 0, "abc")
    assert back.metrics == unit().metrics and back.run_id == "run-1"
    pd.testing.assert_frame_equal(back.predictions, unit().predictions)
    assert archive.find("preset", "five-split", 2, None, "abc") is not None  # a baseline's unit has no seed
    assert archive.find("preset", "five-split", 2, 1, "abc") is None
    assert archive.find("preset", "five-split", 2, 0, "other settings") is None
    assert RunArchive(tmp_path, "other data", LABELS).find("preset", "five-split", 2, 0, "abc") is None
    with gzip.open(tmp_path / risks_path("preset", "five-split", 2, 0), "rt") as risks:
        assert risks.readline().strip() == "stay_id,risk"  # the outcomes stay in the dataset


def test_keeping_a_unit_again_replaces_it_and_writes_the_same_bytes_for_the_same_risks(tmp_path):
    RunArchive(tmp_path, "data-1", LABELS).keep([unit()])
    first = (tmp_path / risks_path("preset", "five-split", 2, 0)).read_bytes()
    RunArchive(tmp_path, "data-1", LABELS).keep([unit()])
    assert (tmp_path / risks_path("preset", "five-split", 2, 0)).read_bytes() == first  # no churn in git
    RunArchive(tmp_path, "data-1", LABELS).keep([unit(risk=(0.9, 0.1, 0.9, 0.1))])
    runs = pd.read_csv(tmp_path / RUNS)
    assert len(runs) == 1
    back = RunArchive(tmp_path, "data-1", LABELS).find("preset", "five-split", 2, 0, "abc")
    assert np.allclose(back.predictions["risk"], [0.9, 0.1, 0.9, 0.1])


def test_two_calls_keeping_into_one_archive_keep_each_others_units(tmp_path):
    # Raindrop's and SeFT's background calls both keep their splits in the P12 table's archive as they finish.
    first, second = RunArchive(tmp_path, "data-1", LABELS), RunArchive(tmp_path, "data-1", LABELS)
    first.keep([unit(seed=0)])
    second.keep([unit(seed=1)])  # read before the first kept its unit
    first.keep([unit(seed=2)])
    kept = RunArchive(tmp_path, "data-1", LABELS)
    assert [kept.find("preset", "five-split", 2, seed, "abc") is not None for seed in (0, 1, 2)] == [True] * 3
    assert sorted(pd.read_csv(tmp_path / RUNS)["seed"]) == [0, 1, 2]


def test_a_damaged_archive_is_an_error_that_names_the_file(tmp_path):
    RunArchive(tmp_path, "data-1", LABELS).keep([unit()])
    path = tmp_path / risks_path("preset", "five-split", 2, 0)
    pd.DataFrame({"stay_id": [11, 99], "risk": [0.1, 0.2]}).to_csv(path, index=False, compression="gzip")
    with pytest.raises(ValueError, match=f"{path}: stay 99 is not in the dataset's labels"):
        RunArchive(tmp_path, "data-1", LABELS).find("preset", "five-split", 2, 0, "abc")
    path.unlink()
    with pytest.raises(FileNotFoundError, match="its risks .* are missing"):
        RunArchive(tmp_path, "data-1", LABELS).find("preset", "five-split", 2, 0, "abc")
    (tmp_path / RUNS).write_text("method,protocol\npreset,five-split\n")
    with pytest.raises(ValueError, match=f"{tmp_path / RUNS}: no column"):
        RunArchive(tmp_path, "data-1", LABELS)


@pytest.mark.parametrize(
    "risk, shown", [("nan", "nan"), ("inf", "inf"), ("1.5", "1.5"), ("-0.1", "-0.1"), ("high", "high")]
)
def test_a_risk_that_is_not_a_probability_is_refused_naming_the_file_and_line(tmp_path, risk, shown):
    RunArchive(tmp_path, "data-1", LABELS).keep([unit()])
    path = tmp_path / risks_path("preset", "five-split", 2, 0)
    with gzip.open(path, "wt") as out:
        out.write(f"stay_id,risk\n11,0.1\n12,{risk}\n13,0.3\n14,0.6\n")
    with pytest.raises(ValueError, match=f"^{path}, line 3: risk {shown} is not a number in \\[0, 1\\]$"):
        RunArchive(tmp_path, "data-1", LABELS).find("preset", "five-split", 2, 0, "abc")


def test_a_stay_repeated_in_a_risks_file_is_refused(tmp_path):
    RunArchive(tmp_path, "data-1", LABELS).keep([unit()])
    path = tmp_path / risks_path("preset", "five-split", 2, 0)
    with gzip.open(path, "wt") as out:
        out.write("stay_id,risk\n11,0.1\n12,0.8\n11,0.3\n14,0.6\n")
    with pytest.raises(ValueError, match=f"^{path}, line 4 repeats line 2 \\(stay_id 11\\)$"):
        RunArchive(tmp_path, "data-1", LABELS).find("preset", "five-split", 2, 0, "abc")


def test_a_repeated_unit_or_a_metric_out_of_range_in_runs_csv_is_refused_naming_the_line(tmp_path):
    RunArchive(tmp_path, "data-1", LABELS).keep([unit(), unit(seed=1)])
    index = tmp_path / RUNS
    good = index.read_text()
    lines = good.splitlines()
    index.write_text("\n".join([*lines, lines[1]]) + "\n")  # the first unit again, as line 4
    with pytest.raises(
        ValueError, match=f"^{index}, line 4 repeats line 2 \\(method preset, protocol five-split, split 2, seed 0\\)$"
    ):
        RunArchive(tmp_path, "data-1", LABELS)
    for value in ("nan", "inf", "1.2", "-0.5"):
        runs = pd.read_csv(io.StringIO(good)).astype({"brier": object})
        runs.loc[1, "brier"] = value
        runs.to_csv(index, index=False)
        with pytest.raises(ValueError, match=f"^{index}, line 3: brier {value} is not a number in \\[0, 1\\]$"):
            RunArchive(tmp_path, "data-1", LABELS)


def test_a_studys_archive_refuses_a_repeated_run_a_metric_out_of_range_and_a_bad_risk(tmp_path, monkeypatch):
    monkeypatch.setattr(run_archive, "dataset_outcomes", lambda dataset, data_root: ("data-1", LABELS))
    table = tmp_path / "fidelity_runs.csv"
    runs = pd.DataFrame(
        {
            "split": [0, 1],
            "run_id": ["a", "b"],
            "settings": ["s", "s"],
            "test_auroc": [0.8, 0.7],
            "data_digest": ["data-1", "data-1"],
        }
    )
    runs.to_csv(table, index=False)
    archive = study_archive(tmp_path, "fidelity_runs", "synthetic", tmp_path)
    assert len(archive.on_this_data()) == 2
    write_risks(tmp_path / "risks" / "a.csv.gz", pd.DataFrame({"stay_id": [11, 12], "risk": [0.2, float("nan")]}))
    with pytest.raises(ValueError, match=f"^{tmp_path / 'risks' / 'a.csv.gz'}, line 3: risk nan is not a number"):
        archive.predictions(tmp_path, "a")
    runs.assign(run_id="a").to_csv(table, index=False)
    with pytest.raises(ValueError, match=f"^{table}, line 3 repeats line 2 \\(run_id a\\)$"):
        study_archive(tmp_path, "fidelity_runs", "synthetic", tmp_path)
    runs.assign(test_auroc=[0.8, 1.3]).to_csv(table, index=False)
    with pytest.raises(ValueError, match=f"^{table}, line 3: test_auroc 1.3 is not a number in \\[0, 1\\]$"):
        study_archive(tmp_path, "fidelity_runs", "synthetic", tmp_path)
