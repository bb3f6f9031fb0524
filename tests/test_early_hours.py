"""The P12 early-hours table (``experiments.early_hours``): three rows trained through the one path on a small
``physionet2012-hourly``, scored at hours 6 to 48, and the tables remade from the archive alone."""

from __future__ import annotations

import tarfile
from io import BytesIO

import numpy as np
import pandas as pd
import pytest

from garlic.sources.physionet2012 import preprocess

OUTCOME_HEADER = "RecordID,SAPS-I,SOFA,Length_of_stay,Survival,In-hospital_death"


def _release(root, stays: int = 60):
    """``stays`` records of 48 hours of heart rate (every other one dies; its heart rate climbs), as set-a."""
    rng = np.random.default_rng(0)
    members, outcomes = {}, []
    for i in range(stays):
        stay, dies = 140_000 + i, i % 2
        lines = ["Time,Parameter,Value", f"00:00,RecordID,{stay}", "00:00,Age,60", "00:00,Gender,1"]
        first = int(rng.integers(0, 8))  # some stays are first observed after hour 6
        lines += [f"{h:02d}:30,HR,{80 + dies * 2 * h + rng.normal(0, 4):.1f}" for h in range(first, 48)]
        members[f"set-a/{stay}.txt"] = "\n".join(lines) + "\n"
        outcomes.append(f"{stay},10,2,5,-1,{dies}")
    root.mkdir(parents=True)
    with tarfile.open(root / "set-a.tar.gz", "w:gz") as archive:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            archive.addfile(info, BytesIO(text.encode()))
    (root / "Outcomes-a.txt").write_text("\n".join([OUTCOME_HEADER, *outcomes]) + "\n")
    return root


@pytest.mark.slow
def test_the_early_hours_table_scores_each_row_at_each_hour_and_is_remade_from_its_archive(tmp_path):
    from experiments import early_hours

    data_root = tmp_path / "data"
    preprocess(_release(tmp_path / "source"), data_root / "processed" / early_hours.DATASET, cohort="hourly")
    out, store = tmp_path / "out", tmp_path / "store"
    arguments = [
        "--data-root",
        str(data_root),
        "--out",
        str(out),
        "--splits",
        "0",
        "--set",
        "max_epochs=1",
        "--set",
        "hidden_dim=8",
        "--set",
        "feature_dim=4",
    ]
    early_hours.main([*arguments, "--mlruns", str(store)])

    runs = pd.read_csv(out / f"{early_hours.DATASET}-runs" / "runs.csv")
    assert sorted(runs["method"]) == [
        "garlic (physionet2012-fast)",
        "garlic_whole_stays (physionet2012-fast)",
        "hourly_gbm",
    ]
    risks = pd.read_csv(early_hours.risks_path(out, "hourly_gbm", 0))
    assert sorted(risks["time"].unique()) == list(early_hours.HOURS)
    late_starters = risks.groupby("stay_id")["time"].min() > 6  # first observed after hour 6: not asked there
    assert late_starters.any() and (risks.groupby("time").size().loc[12:] == risks["stay_id"].nunique()).all()
    whole = pd.read_csv(early_hours.risks_path(out, "garlic_whole_stays (physionet2012-fast)", 0))
    assert whole.groupby("stay_id")["risk"].nunique().gt(1).all()  # a risk of its own at each hour

    summary = pd.read_csv(out / "early-hours.csv")
    assert len(summary) == 3 * len(early_hours.HOURS) and summary["auroc_mean"].between(0, 1).all()
    paired = pd.read_csv(out / "early-hours-paired.csv")
    assert set(paired["against"]) == {"garlic_whole_stays (physionet2012-fast)"} and len(paired) == 2 * 5
    made = {name: (out / name).read_bytes() for name in ("early-hours.md", "early-hours.csv", "early-hours-paired.csv")}
    for name in made:
        (out / name).unlink()
    early_hours.main([*arguments, "--mlruns", str(tmp_path / "empty-store"), "--no-train"])  # the archive alone
    assert {name: (out / name).read_bytes() for name in made} == made
