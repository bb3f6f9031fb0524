"""The comparison's committed record of its units: read back only for the same settings and data, whole or not at
all, with the outcomes joined back from the dataset."""
import gzip

import numpy as np
import pandas as pd
import pytest

from experiments.run_archive import RUNS, RunArchive, Unit, risks_path

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
