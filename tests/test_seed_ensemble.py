"""experiments.seed_ensemble: a preset's archived seeds averaged per stay, scored and paired, with nothing trained."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from experiments import seed_ensemble
from experiments.seed_ensemble import blend_row, ensemble, ensemble_row
from garlic.tracking.archive import RUNS, RunArchive, Unit, risks_path
from garlic.tracking.archive import archived

STAYS = np.arange(100, 300)


@pytest.fixture
def archive(tmp_path):
    generator = np.random.default_rng(0)
    labels = pd.Series((generator.random(len(STAYS)) < 0.3).astype(int), index=STAYS)
    kept = RunArchive(tmp_path / "runs", "digest", labels)

    def unit(method: str, seed: int | None, risk: np.ndarray, stays=STAYS) -> Unit:
        predictions = pd.DataFrame({"stay_id": stays, "label": labels.loc[stays].to_numpy(), "risk": risk})
        metrics = {"auroc": roc_auc_score(predictions["label"], risk), "auprc": 0.0, "brier": 0.0, "ece": 0.0}
        return Unit(method, "garlic-reference", 0, seed, f"{method}-{seed}", "settings", metrics, predictions)

    signal = labels.to_numpy() * 0.4  # risks: signal + a draw in [0, 1), divided by 1.4 to be probabilities
    kept.keep(
        [unit("preset", seed, (signal + generator.random(len(STAYS))) / 1.4) for seed in range(3)]
        + [unit("gbm_static", None, (signal + generator.random(len(STAYS))) / 1.4)]
    )
    return kept, unit


def test_the_ensemble_is_the_mean_risk_of_the_seeds_scored_on_the_same_stays(archive):
    kept, _ = archive
    seeds = archived(kept, "preset", "garlic-reference")
    assert sorted(unit.seed for unit in seeds) == [0, 1, 2]
    together = ensemble(seeds)
    mean = np.mean([unit.predictions["risk"].to_numpy() for unit in seeds], axis=0)
    np.testing.assert_allclose(together.predictions["risk"], mean, rtol=1e-6)
    labels = together.predictions["label"].to_numpy()
    assert together.metrics["auroc"] == pytest.approx(roc_auc_score(labels, mean))
    assert together.metrics["auprc"] == pytest.approx(average_precision_score(labels, mean))
    assert together.method == "preset ensemble of 3"


def test_a_row_pairs_the_ensemble_with_the_baseline(archive):
    kept, _ = archive
    seeds, baseline = archived(kept, "preset", "garlic-reference"), archived(kept, "gbm_static", "garlic-reference")
    row = ensemble_row(seeds, baseline, "gbm_static")
    assert (row["splits"], row["seeds"]) == (1, "3")
    expected = ensemble(seeds).metrics["auroc"] - baseline[0].metrics["auroc"]
    assert row["auroc_vs_gbm_static"].startswith(f"{expected:+.4f} [")
    singles = [unit.metrics["auroc"] for unit in seeds]
    assert row["single_auroc"] == f"{np.mean(singles):.4f} ± {np.std(singles):.4f}"


def test_seeds_on_other_stays_or_a_single_seed_are_refused(archive):
    kept, unit = archive
    seeds = archived(kept, "preset", "garlic-reference")
    elsewhere = unit("preset", 3, np.zeros(len(STAYS) - 1), STAYS[1:])
    with pytest.raises(ValueError, match="do not share test stays"):
        ensemble([*seeds, elsewhere])
    with pytest.raises(ValueError, match="no split has two or more seeds"):
        ensemble_row(seeds[:1], archived(kept, "gbm_static", "garlic-reference"), "gbm_static")


def test_a_blend_is_the_mean_of_the_ensembles_and_the_baselines_risks_paired_with_the_baseline(archive):
    kept, unit = archive
    seeds, baseline = archived(kept, "preset", "garlic-reference"), archived(kept, "gbm_static", "garlic-reference")
    row = blend_row(seeds, baseline, "gbm_static")
    ensembled = ensemble(seeds).predictions.set_index("stay_id")["risk"]
    theirs = baseline[0].predictions.set_index("stay_id")["risk"]
    labels = baseline[0].predictions.set_index("stay_id")["label"]
    blended = roc_auc_score(labels, (ensembled + theirs.loc[ensembled.index]) / 2)
    assert row["blend"] == "preset ensemble of 3 + gbm_static (mean risk)" and row["splits"] == 1
    assert row["blend_auroc"] == round(blended, 4)
    assert row["auroc_vs_gbm_static"].startswith(f"{blended - baseline[0].metrics['auroc']:+.4f} [")
    elsewhere = [
        Unit("gbm_static", "garlic-reference", 1, None, "x", "settings", baseline[0].metrics, baseline[0].predictions)
    ]
    with pytest.raises(ValueError, match="gbm_static has no run on a split of preset's ensembles"):
        blend_row(seeds, elsewhere, "gbm_static")


def ensemble_command(kept, monkeypatch, tmp_path):
    """The command on the archive ``kept``, read from disk as the command reads it."""
    monkeypatch.setattr(
        seed_ensemble,
        "open_archive",
        lambda out, dataset, data_root: RunArchive(kept.folder, kept.data_digest, kept.labels),
    )
    seed_ensemble.main(
        [
            "--dataset",
            "synthetic",
            "--protocol",
            "garlic-reference",
            "--presets",
            "preset",
            "--out",
            str(tmp_path / "out"),
        ]
    )


def test_a_nan_risk_or_a_repeated_run_is_refused_by_the_command_in_one_line(archive, monkeypatch, tmp_path, capsys):
    kept, _ = archive
    path = kept.folder / risks_path("preset", "garlic-reference", 0, 1)
    good = path.read_bytes()
    risks = pd.read_csv(path)
    risks.loc[0, "risk"] = float("nan")
    risks.to_csv(path, index=False, compression="gzip")
    with pytest.raises(SystemExit) as refused:
        ensemble_command(kept, monkeypatch, tmp_path)
    assert str(refused.value) == f"{path}, line 2: risk nan is not a number in [0, 1]"
    path.write_bytes(good)
    ensemble_command(kept, monkeypatch, tmp_path)  # whole again
    assert "| preset | garlic-reference | 1 | 3 |" in capsys.readouterr().out
    index = kept.folder / RUNS
    lines = index.read_text().splitlines()
    index.write_text("\n".join([*lines, lines[2]]) + "\n")
    with pytest.raises(SystemExit) as refused:
        ensemble_command(kept, monkeypatch, tmp_path)
    assert str(refused.value) == (
        f"{index}, line 6 repeats line 3 (method preset, protocol garlic-reference, split 0, seed 1)"
    )
