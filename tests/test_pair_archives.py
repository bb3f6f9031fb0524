"""experiments.pair_archives: a preset's runs from two archives, paired split by split on the same test stays."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from experiments import pair_archives
from garlic.tracking.archive import RUNS, RunArchive, Unit, risks_path

STAYS = np.arange(100, 400)


@pytest.fixture
def archives(tmp_path, monkeypatch):
    """Two archives of one dataset: "before" with splits 0-2 of a preset, "after" with splits 1-3, better risks."""
    generator = np.random.default_rng(0)
    labels = pd.Series((generator.random(len(STAYS)) < 0.3).astype(int), index=STAYS)
    kept = {name: RunArchive(tmp_path / name / "synthetic-runs", "digest", labels) for name in ("before", "after")}
    # read from disk at each call, as the command does
    monkeypatch.setattr(
        pair_archives,
        "open_archive",
        lambda out, dataset, data_root: RunArchive(out / "synthetic-runs", "digest", labels),
    )

    def unit(split: int, signal: float) -> Unit:
        risk = (labels.to_numpy() * signal + generator.random(len(STAYS))) / (1 + signal)  # a probability
        predictions = pd.DataFrame({"stay_id": STAYS, "label": labels.to_numpy(), "risk": risk})
        metrics = {"auroc": roc_auc_score(labels, risk), "auprc": 0.5, "brier": 0.0, "ece": 0.0}
        return Unit("preset", "raindrop", split, 0, f"run-{split}", "settings", metrics, predictions)

    kept["before"].keep([unit(split, 0.2) for split in (0, 1, 2)])
    kept["after"].keep([unit(split, 0.6) for split in (1, 2, 3)])
    return tmp_path, kept


def test_only_the_shared_runs_are_paired_after_minus_before(archives):
    tmp_path, kept = archives
    table = pair_archives.pair("synthetic", "preset", tmp_path / "before", tmp_path / "after", tmp_path)
    row = table.iloc[0]
    assert (row["protocol"], row["runs"]) == ("raindrop", 2)
    shared = lambda name: kept[name].runs[kept[name].runs["split"].isin([1, 2])]["auroc"]  # noqa: E731
    assert row["before_auroc"] == round(shared("before").mean(), 4)
    assert row["after_auroc"] == round(shared("after").mean(), 4)
    difference = shared("after").mean() - shared("before").mean()
    assert row["auroc_after_minus_before"].startswith(f"{difference:+.4f} [") and difference > 0.1
    assert row["auroc_after_minus_before"].endswith("win")


def test_an_archive_against_itself_is_identical_and_nothing_shared_is_refused(archives):
    tmp_path, _ = archives
    same = pair_archives.pair("synthetic", "preset", tmp_path / "after", tmp_path / "after", tmp_path)
    assert same.iloc[0]["auprc_after_minus_before"] == "+0.0000 [+0.0000, +0.0000] identical"
    with pytest.raises(ValueError, match="share no run of other"):
        pair_archives.pair("synthetic", "other", tmp_path / "before", tmp_path / "after", tmp_path)


@pytest.mark.parametrize("risk", ["nan", "inf", "1.5"])
def test_a_risk_that_is_not_a_probability_is_refused_by_the_command_in_one_line(archives, risk):
    tmp_path, _ = archives
    path = tmp_path / "after" / "synthetic-runs" / risks_path("preset", "raindrop", 1, 0)
    risks = pd.read_csv(path).astype({"risk": object})
    risks.loc[4, "risk"] = risk
    risks.to_csv(path, index=False, compression="gzip")
    with pytest.raises(SystemExit) as refused:
        pair_archives.main(
            [
                "--dataset",
                "synthetic",
                "--method",
                "preset",
                "--before",
                str(tmp_path / "before"),
                "--after",
                str(tmp_path / "after"),
                "--data-root",
                str(tmp_path),
            ]
        )
    assert str(refused.value) == f"{path}, line 6: risk {risk} is not a number in [0, 1]"


def test_a_repeated_run_is_refused_rather_than_counted_twice(archives, capsys):
    tmp_path, _ = archives
    index = tmp_path / "after" / "synthetic-runs" / RUNS
    lines = index.read_text().splitlines()
    index.write_text("\n".join([*lines, lines[1]]) + "\n")
    with pytest.raises(SystemExit) as refused:
        pair_archives.main(
            [
                "--dataset",
                "synthetic",
                "--method",
                "preset",
                "--before",
                str(tmp_path / "before"),
                "--after",
                str(tmp_path / "after"),
                "--data-root",
                str(tmp_path),
            ]
        )
    assert str(refused.value) == (f"{index}, line 5 repeats line 2 (method preset, protocol raindrop, split 1, seed 0)")
    assert "| raindrop |" not in capsys.readouterr().out
