"""The comparison table: every method on a protocol's runs, resumable from MLflow, with paired differences."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from experiments import compare
from garlic import runs, studies
from garlic.studies import comparison, comparison_units
from garlic.training.workers import PARENT_ENV
from garlic.config import Config
from garlic.data.splits import PROTOCOLS, Protocol
from garlic.evaluation.fit_and_test import split_parts
from garlic.evaluation import published
from garlic.evaluation import stats
from garlic.io.locks import acquire, release
from garlic.io.tables import read_manifest
from garlic.sources import synthetic
from garlic.tracking import queries, run_contract
from garlic.tracking.archive import RunArchive, Unit
from garlic.tracking.store import use_store

TINY = ["--set", "max_epochs=1", "--set", "hidden_dim=8", "--set", "feature_dim=4"]


@contextmanager
def tiny_protocol():
    """The protocol ``tiny``: split 0, trained with model seeds 0 and 1."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROTOCOLS, "tiny", Protocol("tiny", (0,), seeds=(0, 1)))
        yield


def compare_tiny(root, store, out, *extra) -> None:
    """The comparison of GARLIC and two baselines on ``tiny``."""
    with tiny_protocol():
        compare.main(
            [
                "--dataset",
                "synthetic",
                "--protocols",
                "tiny",
                "--presets",
                "synthetic",
                "--methods",
                "logreg",
                "gbm",
                *TINY,
                "--data-root",
                str(root),
                "--mlruns",
                str(store),
                "--out",
                str(out),
                *extra,
            ]
        )


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """One drawn split trained with two model seeds, beside two baselines; then the same command again."""
    root = tmp_path_factory.mktemp("compare")
    synthetic.generate(root / "processed" / "synthetic", n_stays=300, seed=2)
    store, out = root / "mlruns", root / "results"
    compare_tiny(root, store, out)
    first = (out / "synthetic.md").read_text(), (out / "synthetic.csv").read_text()
    trained = split_runs(store)
    compare_tiny(root, store, out, "--no-train")
    return root, store, out, first, trained


def split_runs(store) -> list:
    use_store(store)
    return mlflow.search_runs(
        search_all_experiments=True, filter_string="attributes.status = 'FINISHED'", output_format="list"
    )


def test_the_table_has_one_row_per_method_and_protocol_from_the_runs_it_made(compared):
    root, store, out, _, _ = compared
    table = pd.read_csv(out / "synthetic.csv")
    assert list(table.columns) == [
        "method",
        "protocol",
        "runs",
        "auroc_mean",
        "auroc_std",
        "auprc_mean",
        "auprc_std",
        "brier_mean",
        "ece_mean",
    ]
    assert table[["method", "protocol", "runs"]].values.tolist() == [
        ["logreg", "tiny", 1],
        ["gbm", "tiny", 1],
        ["synthetic", "tiny", 2],
    ]
    use_store(store)
    garlic = mlflow.search_runs(
        search_all_experiments=True, filter_string="params.split = 'tiny/split_0'", output_format="list"
    )
    garlic = [run for run in garlic if "lr_cls" in run.data.params]
    assert sorted(run.data.params["seed"] for run in garlic) == ["0", "1"]
    aurocs = [run.data.metrics["test_auroc"] for run in garlic]
    row = table.set_index("method").loc["synthetic"]
    assert row["auroc_mean"] == pytest.approx(np.mean(aurocs), abs=1e-4)
    assert row["auroc_std"] == pytest.approx(np.std(aurocs), abs=1e-4)


def test_a_second_run_reuses_every_finished_run_and_reports_the_same_table(compared):
    root, store, out, first, trained = compared
    again = split_runs(store)
    made = {run.info.run_id for run in again} - {run.info.run_id for run in trained}
    assert all(run.info.run_name == "comparison" for run in again if run.info.run_id in made)  # only the summary
    report, table = first
    assert (out / "synthetic.csv").read_text() == table
    assert "## Paired differences against the best simple baseline" in report and "Not yet run" not in report


def test_runs_on_other_data_are_not_reused(compared, tmp_path):
    root, store, _, _, _ = compared
    other = tmp_path / "other"
    synthetic.generate(other / "processed" / "synthetic", n_stays=300, seed=9)
    config = studies.preset_config("synthetic", "synthetic", TINY[1::2])
    with tiny_protocol():
        units, missing = comparison_units.garlic_units("synthetic", config, "tiny", [store], other, train=False)
    assert units == [] and list(map(str, missing)) == ["synthetic tiny/split_0 seed 0", "synthetic tiny/split_0 seed 1"]


def test_a_unit_another_process_is_training_is_not_trained_twice(compared, tmp_path, monkeypatch):
    root, _, _, _, _ = compared
    store = tmp_path / "store"
    config = studies.preset_config("synthetic", "synthetic", TINY[1::2])
    trained = []
    monkeypatch.setattr(
        comparison_units.runs, "train", lambda config, splits, *a, **k: trained.append((splits, config.seed))
    )
    held = acquire(
        comparison_units.unit_lock(store, "synthetic", "tiny", 0, 1), wait=False
    )  # "another process", seed 1
    try:
        with tiny_protocol():
            _, missing = comparison_units.garlic_units("synthetic", config, "tiny", [store], root, train=True)
    finally:
        release(held)
    assert trained == [([0], 0)]  # seed 0 trained here; seed 1 left to the process that holds it
    assert "synthetic tiny/split_0 seed 1" in list(map(str, missing))


def test_seeds_replace_the_protocols_model_seeds_for_every_preset(compared, tmp_path):
    root, store, _, _, _ = compared  # seeds 0 and 1 trained
    out = tmp_path / "results"
    compare_tiny(root, store, out, "--no-train", "--seeds", "1", "2")
    table = pd.read_csv(out / "synthetic.csv").set_index("method")
    assert table.loc["synthetic", "runs"] == 1  # seed 1 found; seed 0 not asked for
    report = (out / "synthetic.md").read_text()
    assert "- synthetic tiny/split_0 seed 2" in report and "split_0 seed 0" not in report
    kept = pd.read_csv(out / "synthetic-runs" / "runs.csv").query("method == 'synthetic'")
    assert kept["seed"].tolist() == [1]


def test_no_train_gathers_the_baselines_it_has_and_names_the_others_without_training_them(compared, tmp_path):
    root, store, _, _, _ = compared
    out = tmp_path / "results"
    with tiny_protocol():
        compare.main(
            [
                "--dataset",
                "synthetic",
                "--protocols",
                "tiny",
                "--presets",
                "--methods",
                "logreg",
                "gbm_static",
                *TINY,
                "--data-root",
                str(root),
                "--mlruns",
                str(store),
                "--out",
                str(out),
                "--no-train",
            ]
        )
    table = pd.read_csv(out / "synthetic.csv")
    assert table[["method", "runs"]].values.tolist() == [["logreg", 1]]  # from the store
    report = (out / "synthetic.md").read_text()
    assert "## Not yet run\n\n- gbm_static tiny/split_0\n" in report
    assert not [run for run in split_runs(store) if run.data.tags.get("method") == "gbm_static"]  # nothing trained


def test_a_baseline_run_in_another_store_is_gathered_and_not_trained_again(compared, tmp_path):
    # as GARLIC's units are: runs trained into separate stores are gathered by listing every store
    root, store, _, _, _ = compared
    first, out = tmp_path / "first", tmp_path / "results"
    with tiny_protocol():
        compare.main(
            [
                "--dataset",
                "synthetic",
                "--protocols",
                "tiny",
                "--presets",
                "--methods",
                "logreg",
                "gbm",
                *TINY,
                "--data-root",
                str(root),
                "--mlruns",
                str(first),
                str(store),
                "--out",
                str(out),
            ]
        )
    table = pd.read_csv(out / "synthetic.csv")
    assert table[["method", "runs"]].values.tolist() == [["logreg", 1], ["gbm", 1]]
    assert not [run for run in split_runs(first) if run.data.tags.get("study") == "baseline"]  # nothing trained
    before = {run.info.run_id for run in split_runs(store)}
    with tiny_protocol():  # a store without the baselines' experiment is only read: nothing is created in it
        compare.main(
            [
                "--dataset",
                "synthetic",
                "--protocols",
                "tiny",
                "--presets",
                "--methods",
                "logreg",
                *TINY,
                "--data-root",
                str(root),
                "--mlruns",
                str(store),
                str(tmp_path / "empty"),
                "--no-train",
            ]
        )
    assert {run.info.run_id for run in split_runs(store)} >= before
    use_store(tmp_path / "empty")
    assert mlflow.MlflowClient().get_experiment_by_name("baselines-synthetic") is None


def test_a_table_with_nothing_paired_is_read_back_by_the_next_call(compared, tmp_path):
    root, store, _, _, _ = compared
    out = tmp_path / "results"
    for methods in ([], ["logreg"]):  # the first pairs nothing: a preset without baselines
        with tiny_protocol():
            compare.main(
                [
                    "--dataset",
                    "synthetic",
                    "--protocols",
                    "tiny",
                    "--presets",
                    "synthetic",
                    "--methods",
                    *methods,
                    *TINY,
                    "--data-root",
                    str(root),
                    "--mlruns",
                    str(store),
                    "--out",
                    str(out),
                    "--no-train",
                ]
            )
        paired = pd.read_csv(out / "synthetic-paired.csv")
        assert paired["baseline"].tolist() == methods * 2  # one row per metric
    assert list(paired.columns) == comparison.PAIRED_COLUMNS


@pytest.mark.slow
def test_workers_train_the_missing_units_in_parallel_processes_into_the_first_store(tmp_path, monkeypatch):
    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=200, seed=3)
    store, out, carried = tmp_path / "mlruns", tmp_path / "results", tmp_path / "unfinished"
    # splits 0, 2 and 4 are trained here first, as any earlier command would have left them
    config = studies.preset_config("synthetic", "synthetic", TINY[1::2]).override({"split_protocol": "five-split"})
    for split in (0, 2, 4):
        runs.train(config, [split], data_root=tmp_path, store=store, preset="synthetic")
    command = [
        "--dataset",
        "synthetic",
        "--protocols",
        "five-split",
        "--presets",
        "synthetic",
        "--methods",
        *TINY,
        "--data-root",
        str(tmp_path),
        "--mlruns",
        str(store),
        "--out",
        str(out),
        "--workers",
        "2",
        "--carry",
        str(carried),
    ]

    def machine_gone(*args, **kwargs):
        raise KeyboardInterrupt("the machine went away")

    with monkeypatch.context() as patched:  # cut off as the workers end: each unit was kept as its process ended
        patched.setattr(comparison, "baseline_units", machine_gone)
        with pytest.raises(KeyboardInterrupt):
            compare.main(command)
    kept = pd.read_csv(out / "synthetic-runs" / "runs.csv")  # 0, 2 and 4 as the store was read, 1 and 3 as trained
    assert sorted(kept["split"]) == [0, 1, 2, 3, 4] and set(kept["method"]) == {"synthetic"}
    assert carried.is_dir() and not any(carried.iterdir())  # the workers carried their states, gone once finished
    compare.main(command)
    table = pd.read_csv(out / "synthetic.csv")
    assert table[["method", "protocol", "runs"]].values.tolist() == [["synthetic", "five-split", 5]]
    logs = sorted(log.name for log in (store / "logs").glob("*.log"))
    assert logs == ["synthetic-five-split-split_1-seed_0.log", "synthetic-five-split-split_3-seed_0.log"]
    trained = {
        run.data.params["split"]: (run.info.start_time, run.info.end_time)
        for run in split_runs(store)
        if run.data.params.get("split", "").startswith("five-split/")
    }
    assert sorted(trained) == [f"five-split/split_{k}" for k in range(5)]
    first, second = trained["five-split/split_1"], trained["five-split/split_3"]
    assert second[0] < first[1] and first[0] < second[1]  # the missing two trained at the same time, in two processes


def test_two_calls_with_their_own_splits_and_stores_make_one_whole_table(tmp_path, capsys):
    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=200, seed=3)
    first, second, out = tmp_path / "first", tmp_path / "second", tmp_path / "results"
    command = [
        "--dataset",
        "synthetic",
        "--protocols",
        "five-split",
        "--presets",
        "synthetic",
        "--methods",
        "logreg",
        *TINY,
        "--data-root",
        str(tmp_path),
    ]
    with pytest.raises(SystemExit):
        compare.main([*command, "--mlruns", str(first), "--splits", "1", "7"])
    assert "--splits 7: protocol five-split has splits 0, 1, 2, 3, 4" in capsys.readouterr().err
    compare.main([*command, "--mlruns", str(first), "--splits", "0", "1"])
    assert "synthetic five-split/split_2 seed 0" in capsys.readouterr().out  # listed as missing, not trained
    compare.main([*command, "--mlruns", str(second), "--splits", "2", "3", "4"])
    for store, splits in ((first, [0, 1]), (second, [2, 3, 4])):
        trained = [run.data.params.get("split") or run.data.tags.get("split") for run in split_runs(store)]
        assert sorted(name for name in trained if name) == sorted(
            f"five-split/split_{k}" for k in splits for _ in ("logreg", "synthetic")
        )
    compare.main([*command, "--mlruns", str(first), str(second), "--no-train", "--out", str(out)])
    table = pd.read_csv(out / "synthetic.csv")
    assert table[["method", "protocol", "runs"]].values.tolist() == [
        ["logreg", "five-split", 5],
        ["synthetic", "five-split", 5],
    ]


def test_workers_train_nothing_that_the_run_archive_holds(compared, tmp_path):
    root, _, out, first, _ = compared
    moved = tmp_path / "results"
    shutil.copytree(out, moved)
    compare_tiny(root, tmp_path / "empty", moved, "--workers", "2")
    assert not (tmp_path / "empty" / "logs").exists()  # no unit went to a worker process
    assert (moved / "synthetic.csv").read_text() == first[1]


def test_the_table_is_made_again_from_the_run_archive_when_the_stores_are_gone(compared, tmp_path):
    root, store, out, first, _ = compared
    kept = pd.read_csv(out / "synthetic-runs" / "runs.csv")
    assert sorted(map(tuple, kept[["method", "seed"]].fillna(-1).values)) == [
        ("gbm", -1),
        ("logreg", -1),
        ("synthetic", 0),
        ("synthetic", 1),
    ]
    risks = pd.read_csv(out / "synthetic-runs" / "synthetic" / "tiny-split_0-seed_1.csv.gz")
    assert list(risks.columns) == ["stay_id", "risk"]  # no outcomes leave the dataset
    moved = tmp_path / "results"
    shutil.copytree(out, moved)
    compare_tiny(root, tmp_path / "empty", moved, "--no-train")
    assert (moved / "synthetic.csv").read_text() == first[1]
    paired = lambda text: text[text.index("## Paired") :]  # noqa: E731
    assert paired((moved / "synthetic.md").read_text()) == paired(first[0])
    assert all(run.info.run_name == "comparison" for run in split_runs(tmp_path / "empty"))  # nothing trained
    # other settings are other units: the archive does not stand in for them
    config = studies.preset_config("synthetic", "synthetic", [*TINY[1::2], "hidden_dim=16"])
    digest = run_contract.manifest_digest(read_manifest(root / "processed" / "synthetic"))
    labels = pd.read_parquet(root / "processed" / "synthetic" / "labels.parquet").set_index("stay_id")["label"]
    archive = RunArchive(moved / "synthetic-runs", digest, labels)
    with tiny_protocol():
        units, missing = comparison_units.garlic_units(
            "synthetic", config, "tiny", [tmp_path / "empty"], root, False, archive
        )
    assert units == [] and len(missing) == 2


def test_each_unit_is_archived_as_it_finishes_so_a_call_cut_off_later_loses_none(tmp_path, monkeypatch):
    # A long call (five seeds of an hour each) whose machine goes away in its last unit keeps in the run archive
    # every unit that finished before it, baselines and GARLIC seeds alike.
    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=300, seed=2)
    store, out = tmp_path / "mlruns", tmp_path / "results"
    train = runs.train

    def cut_off_in_seed_1(config, *args, **kwargs):
        if config.seed == 1:
            raise KeyboardInterrupt("the machine went away")
        return train(config, *args, **kwargs)

    monkeypatch.setattr(comparison_units.runs, "train", cut_off_in_seed_1)
    with pytest.raises(KeyboardInterrupt):
        compare_tiny(tmp_path, store, out)
    kept = pd.read_csv(out / "synthetic-runs" / "runs.csv")
    assert sorted(map(tuple, kept[["method", "seed"]].fillna(-1).values)) == [
        ("gbm", -1),
        ("logreg", -1),
        ("synthetic", 0),
    ]
    assert not (out / "synthetic.md").exists()  # the table waits for the call's end
    monkeypatch.setattr(comparison_units.runs, "train", train)
    fresh = tmp_path / "next-machine"  # the store went with the machine; the next call trains only the cut-off unit
    compare_tiny(tmp_path, fresh, out)
    (trained,) = [run for run in split_runs(fresh) if run.info.run_name != "comparison"]
    assert trained.data.params["seed"] == "1"
    assert len(pd.read_csv(out / "synthetic-runs" / "runs.csv")) == 4


def test_a_baseline_trains_only_the_splits_the_run_archive_does_not_keep(tmp_path, monkeypatch):
    # Raindrop's first two P12 splits are in the archive; a fresh machine trains the third, not the first two again.
    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=300, seed=2)
    digest = run_contract.manifest_digest(read_manifest(tmp_path / "processed" / "synthetic"))
    labels = pd.read_parquet(tmp_path / "processed" / "synthetic" / "labels.parquet").set_index("stay_id")["label"]
    archive = RunArchive(tmp_path / "synthetic-runs", digest, labels)
    monkeypatch.setitem(PROTOCOLS, "two", Protocol("two", (0, 1)))
    first, _ = comparison_units.baseline_units(
        ["logreg"], "synthetic", "two", [tmp_path / "first"], tmp_path, [], archive
    )
    kept = pd.read_csv(tmp_path / "synthetic-runs" / "runs.csv")
    kept[kept["split"] == 0].to_csv(tmp_path / "synthetic-runs" / "runs.csv", index=False)  # split 1 was cut off
    archive = RunArchive(tmp_path / "synthetic-runs", digest, labels)
    units, _ = comparison_units.baseline_units(
        ["logreg"], "synthetic", "two", [tmp_path / "next"], tmp_path, [], archive
    )
    assert [unit.run_id for unit in units] == [first[0].run_id, units[1].run_id] != [u.run_id for u in first]
    (trained,) = split_runs(tmp_path / "next")
    assert trained.info.run_id == units[1].run_id and trained.data.params["split_name"] == "two/split_1"


def test_carry_names_a_folder_before_anything_is_trained(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit):
        compare.main(
            [
                "--dataset",
                "synthetic",
                "--methods",
                "logreg",
                "--presets",
                "--data-root",
                str(tmp_path),
                "--mlruns",
                str(tmp_path / "mlruns"),
                "--carry",
                str(tmp_path / "a-file"),
            ]
        )
    assert "is a file; it names the folder" in capsys.readouterr().err
    assert not (tmp_path / "mlruns").exists()


def test_the_report_says_how_far_each_carried_unit_has_come_and_names_a_damaged_state(compared, tmp_path):
    from garlic.config import Config
    from garlic.training.state import save_training_state

    root, _, out, _, _ = compared
    moved, carried = tmp_path / "results", tmp_path / "unfinished"
    shutil.copytree(out, moved)
    carried.mkdir()
    from garlic.data.datasets import processed_folder
    from garlic.io.tables import read_manifest
    from garlic.tracking.run_contract import manifest_digest

    digest = manifest_digest(read_manifest(processed_folder("synthetic", root)))[:12]
    unit = f"pypots_seft-tiny-split_0-af42c96c4dae-{digest}"  # this cohort's unit
    history = [{"epoch": epoch, "seconds": 60.0 * epoch} for epoch in range(1, 13)]  # the last five: 8-12 minutes
    save_training_state(
        carried / f"{unit}.pt", {"progress": {"epoch": 12, "best_epoch": 9, "history": history}}, Config()
    )
    (carried / "cut-short.pt").write_bytes(b"PK\x03\x04 half a file")
    other = "pypots_seft-raindrop-split_0-af42c96c4dae-0123456789ab"  # another dataset's unit: another table's
    save_training_state(carried / f"{other}.pt", {"progress": {"epoch": 3, "best_epoch": 3}}, Config())
    compare_tiny(root, tmp_path / "empty", moved, "--no-train", "--carry", str(carried))
    under_way = (moved / "synthetic.md").read_text().split("## Under way")[1]
    assert f"- `{unit}`: 12 epochs done, the best at epoch 9, 10.0 minutes an epoch lately" in under_way
    assert other not in under_way
    assert "- `cut-short.pt`: " in under_way and "cut-short.pt: not a readable training state" in under_way


def test_a_row_whose_runs_are_gone_is_kept_from_the_previous_table_and_named(compared, tmp_path):
    root, _, out, first, _ = compared
    moved = tmp_path / "results"
    shutil.copytree(out, moved)
    shutil.rmtree(moved / "synthetic-runs" / "synthetic")
    runs = pd.read_csv(moved / "synthetic-runs" / "runs.csv")
    runs[runs["method"] != "synthetic"].to_csv(moved / "synthetic-runs" / "runs.csv", index=False)
    compare_tiny(root, tmp_path / "empty", moved, "--no-train")
    assert (moved / "synthetic.csv").read_text() == first[1]
    report = (moved / "synthetic.md").read_text()
    assert "## Kept from the previous table" in report and "- synthetic tiny (2 of the protocol's 2 runs)" in report
    assert "Not yet run" not in report  # they ran: only their runs' record is gone
    assert pd.read_csv(moved / "synthetic-paired.csv").equals(pd.read_csv(out / "synthetic-paired.csv"))


def unit(method, split, risk, labels):
    predictions = pd.DataFrame({"stay_id": np.arange(len(labels)), "label": labels, "risk": risk})
    return Unit(method, "p", split, None, "run", "settings", {}, predictions)


def test_paired_difference_calls_a_clear_gain_a_win_noise_a_tie_and_the_same_risks_identical():
    generator = np.random.default_rng(7)
    labels = (generator.random(400) < 0.2).astype(int)
    noise = generator.random(400)
    baseline = [unit("base", 0, noise + 0.3 * labels, labels)]
    better = [unit("ours", 0, noise + 2.0 * labels, labels)]
    nearly = [unit("ours", 0, noise + 0.3 * labels + 0.05 * generator.random(400), labels)]
    same = [unit("ours", 0, noise + 0.3 * labels, labels)]
    win = stats.paired_difference(better, baseline, "auroc")
    assert win["verdict"] == "win" and 0 < win["ci_low"] <= win["difference"] <= win["ci_high"]
    tie = stats.paired_difference(nearly, baseline, "auprc")
    assert tie["verdict"] == "tie" and tie["ci_low"] < 0 < tie["ci_high"]
    # One model twice is no comparison: "identical", not a tie that looks measured.
    identical = stats.paired_difference(same, baseline, "auprc")
    assert identical == {"difference": 0.0, "ci_low": 0.0, "ci_high": 0.0, "verdict": "identical"}
    with pytest.raises(ValueError, match="do not share the test stays"):
        stats.paired_difference([unit("ours", 0, noise[:300], labels[:300])], baseline, "auroc")


def test_weighted_scores_equal_sklearns_with_sample_weights_ties_included():
    from sklearn.metrics import average_precision_score, roc_auc_score

    from garlic.evaluation.stats import weighted_auroc, weighted_average_precision

    generator = np.random.default_rng(1)
    labels = (generator.random(300) < 0.25).astype(int)
    scores = np.round(generator.random(300) + 0.5 * labels, 1)  # rounded: many ties
    weights = generator.multinomial(300, np.full(300, 1 / 300), size=4).astype(float)
    for row, auroc, ap in zip(
        weights, weighted_auroc(scores, labels, weights), weighted_average_precision(scores, labels, weights)
    ):
        assert auroc == pytest.approx(roc_auc_score(labels, scores, sample_weight=row), abs=1e-12)
        assert ap == pytest.approx(average_precision_score(labels, scores, sample_weight=row), abs=1e-12)


def test_a_key_added_since_a_unit_was_archived_leaves_its_digest_alone_at_the_value_that_trains_as_before():
    archive = Path(__file__).resolve().parents[1] / "docs" / "results" / "physionet2012-runs" / "runs.csv"
    kept = pd.read_csv(archive, dtype=str).set_index(["method", "protocol", "split"])
    config = studies.preset_config("physionet2012-best", "physionet2012", []).override({"split_protocol": "raindrop"})
    # The unit was archived before ``lr_schedule`` existed; at "plateau" it trains as it did then.
    assert queries.config_digest(config) == kept.loc[("physionet2012-best", "raindrop", "0"), "settings"]
    assert (
        queries.config_digest(config.override({"lr_schedule": "cosine"}))
        != kept.loc[("physionet2012-best", "raindrop", "0"), "settings"]
    )


def test_past_the_deadline_no_unit_starts_and_the_table_names_them_not_yet_run(tmp_path, capsys):
    # a unit running at the deadline is stopped (tests/test_workers.py), its run FAILED and resumable as any stopped
    # by SIGTERM (tests/test_resume.py); here the table after a deadline that had passed before the first unit
    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=200, seed=3)
    store, out = tmp_path / "mlruns", tmp_path / "results"
    compare.main(
        [
            "--dataset",
            "synthetic",
            "--protocols",
            "five-split",
            "--presets",
            "synthetic",
            "--methods",
            "--data-root",
            str(tmp_path),
            "--mlruns",
            str(store),
            "--out",
            str(out),
            "--workers",
            "2",
            "--deadline",
            "0",
        ]
    )
    printed = capsys.readouterr().out
    assert printed.count("not started: the deadline had passed") == 5
    assert "## Not yet run\n\n" + "".join(f"- synthetic five-split/split_{k} seed 0\n" for k in range(5)) in printed
    use_store(store)
    made = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert [run.info.run_name for run in made] == ["comparison"]  # the table's own run, no unit's


def test_a_unit_that_another_process_trains_is_skipped(tmp_path, capsys):
    store = tmp_path / "mlruns"
    (store / "locks").mkdir(parents=True)
    unit = comparison_units.Pending("synthetic", "tiny", 0, 0)
    held = acquire(store / "locks" / "unit-synthetic-tiny-split_0-seed_0", wait=False)
    try:
        comparison_units.train_in_workers([unit], 2, store, tmp_path, [])
    finally:
        release(held)
    assert "synthetic tiny/split_0 seed 0: skipped: another process is training it" in capsys.readouterr().out
    assert not list((store / "logs").glob("*.log"))


def test_a_worker_dies_with_the_process_that_started_it(tmp_path):
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, subprocess, sys, time\n"
                "child = subprocess.Popen([sys.executable, '-c', 'import time; from garlic.training.workers import die_with_parent; "
                'die_with_parent(); print("ready", flush=True); time.sleep(120)\'],\n'
                f"    env=os.environ | {{'{PARENT_ENV}': str(os.getpid())}}, stdout=open({str(tmp_path / 'child')!r}, 'w'))\n"
                "print(child.pid, flush=True)\n"
                "time.sleep(120)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while "ready" not in (tmp_path / "child").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    parent.kill()
    parent.wait()
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the worker outlived the killed parent")


def test_a_preset_named_with_against_is_paired_run_by_run_on_the_same_split_and_seed():
    from garlic.tracking.archive import Unit

    generator = np.random.default_rng(4)
    labels = (generator.random(200) < 0.3).astype(int)

    def unit(method, seed, risk):
        frame = pd.DataFrame({"stay_id": np.arange(200), "label": labels, "risk": risk})
        metrics = {"auroc": 0.0, "auprc": 0.0, "brier": 0.0, "ece": 0.0}
        return Unit(method, "garlic-reference", 0, seed, f"{method}-{seed}", "x", metrics, frame)

    risks = [generator.random(200) + labels * k for k in (0.2, 0.6, 1.0)]
    old = [unit("old", seed, risk) for seed, risk in enumerate(risks)]
    same = [unit("new", seed, risk) for seed, risk in enumerate(risks)]  # each seed equals the old one's
    baseline, network = [unit("logreg", None, risks[1])], [unit("pypots_raindrop", None, risks[0])]
    paired = comparison.comparisons(
        old + same + baseline + network, ["old", "new"], ["garlic-reference"], against=["old"]
    )
    rows = paired.set_index(["preset", "baseline", "metric"])
    for metric in ("auroc", "auprc"):
        tie = rows.loc[("new", "old", metric)]
        assert tie["difference"] == 0 and tie["ci_low"] == 0 and tie["ci_high"] == 0 and tie["runs"] == 3
        assert ("new", "logreg", metric) in rows.index and ("old", "logreg", metric) in rows.index
        assert ("old", "old", metric) not in rows.index  # no preset against itself
        # the preset named with --against meets the field's models too, each of its seeds the model's one run
        assert rows.loc[("old", "pypots_raindrop", metric), "verdict"] == "win"
        assert ("new", "pypots_raindrop", metric) not in rows.index
    # By split alone every seed would have met the last old seed's risks (the strongest): a clear loss instead.
    assert stats.paired_difference(same, old[2:], "auroc")["verdict"] == "loss"


def test_a_network_baseline_still_training_is_paired_on_the_splits_it_has():
    generator = np.random.default_rng(5)
    labels = (generator.random(300) < 0.3).astype(int)

    def scored(method, split, strength):
        made = unit(method, split, generator.random(300) + strength * labels, labels)
        made.metrics.update(auroc=0.0, auprc=0.0, brier=0.0, ece=0.0)  # what the table reads; the pairing reads risks
        return made

    preset = [scored("fast", split, 1.0) for split in range(5)]
    partial = [scored("pypots_seft", split, 0.2) for split in (0, 1)]
    paired = comparison.comparisons(preset + partial, ["fast"], ["p"], against=["fast"])
    row = paired.set_index(["baseline", "metric"]).loc[("pypots_seft", "auroc")]
    assert row["runs"] == 2 and row["verdict"] == "win"
    assert row["difference"] == pytest.approx(stats.paired_difference(preset[:2], partial, "auroc")["difference"])


@pytest.mark.parametrize(
    "arguments, says",
    [
        (["--presets", "no-such-preset"], "no preset 'no-such-preset' in"),
        (["--presets", "synthetic", "--set", "no_such_key=1"], "unknown config key 'no_such_key'"),
        (["--seeds", "-1"], "argument --seeds: expected 0 or more, got -1"),
        (["--mlruns", "A_FILE"], "argument --mlruns: A_FILE is a file, not a folder"),
        (["--out", "A_FILE"], "argument --out: A_FILE is a file, not a folder"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it_before_anything_is_read(tmp_path, capsys, arguments, says):
    (tmp_path / "notes.txt").write_text("a file")
    arguments = [str(tmp_path / "notes.txt") if a == "A_FILE" else a for a in arguments]
    with pytest.raises(SystemExit) as refused:
        compare.main(
            [
                "--dataset",
                "synthetic",
                "--protocols",
                "five-split",
                "--methods",
                "logreg",
                "--data-root",
                str(tmp_path / "data"),
                "--no-train",
                *arguments,
            ]
        )
    assert refused.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error and says.replace("A_FILE", str(tmp_path / "notes.txt")) in error


def test_a_protocol_that_does_not_apply_is_refused_before_anything_is_trained(tmp_path, capsys):
    root, store = tmp_path, tmp_path / "mlruns"
    synthetic.generate(root / "processed" / "synthetic", n_stays=300, seed=2)
    with pytest.raises(SystemExit):
        compare.main(
            [
                "--dataset",
                "synthetic",
                "--protocols",
                "five-split",
                "raindrop",
                "--methods",
                "logreg",
                "--data-root",
                str(root),
                "--mlruns",
                str(store),
            ]
        )
    error = capsys.readouterr().err
    assert "--protocols raindrop does not apply to --dataset synthetic" in error
    assert "protocol 'raindrop' is not published for dataset 'synthetic'" in error
    assert not store.exists()  # nothing trained, no store made
    # Without --protocols, the ones that apply: five-split alone on synthetic data.
    compare.main(
        [
            "--dataset",
            "synthetic",
            "--methods",
            "logreg",
            "--presets",
            "--data-root",
            str(root),
            "--mlruns",
            str(store),
            "--out",
            str(tmp_path / "results"),
        ]
    )
    assert "protocol raindrop left out" in capsys.readouterr().err
    table = pd.read_csv(tmp_path / "results" / "synthetic.csv")
    assert table[["method", "protocol", "runs"]].values.tolist() == [["logreg", "five-split", 5]]


def two_hospital_records(folder: Path, stays_each: int = 100) -> None:
    """PhysioNet 2019 record files for both hospital systems: heart rate a little higher before sepsis, and in
    system B higher for everyone (so a model moved from one system to the other loses some of its skill)."""
    from garlic.sources.physionet2019 import COLUMNS, HEADER

    generator = np.random.default_rng(7)
    for system, first_id, shift in (("A", 1, 0.0), ("B", 100_001, 6.0)):
        (folder / f"training_set{system}").mkdir(parents=True)
        for stay_id in range(first_id, first_id + stays_each):
            septic = generator.random() < 0.3
            lines = [HEADER.decode()]
            for hour in range(1, 21):
                row = ["NaN"] * len(COLUMNS)
                row[0] = f"{80 + shift + 8 * septic + generator.normal(0, 6):.1f}"  # HR
                row[COLUMNS.index("Age")], row[COLUMNS.index("Gender")] = "60", "1"
                row[COLUMNS.index("HospAdmTime")] = "-1.5"
                row[-2], row[-1] = str(hour), str(int(septic and hour >= 15))
                lines.append("|".join(row))
            (folder / f"training_set{system}" / f"p{stay_id:06d}.psv").write_text("\n".join(lines) + "\n")


def test_cross_hospital_rows_and_the_drop_from_the_models_own_hospital(tmp_path, capsys):
    from garlic.sources.physionet2019 import preprocess

    two_hospital_records(tmp_path / "source")
    preprocess(tmp_path / "source", tmp_path / "processed" / "physionet2019-raindrop", cohort="raindrop")
    store, out = tmp_path / "mlruns", tmp_path / "results"
    compare.main(
        [
            "--dataset",
            "physionet2019-raindrop",
            "--protocols",
            "cross-hospital",
            "in-hospital",
            "--methods",
            "logreg",
            "--presets",
            "--data-root",
            str(tmp_path),
            "--mlruns",
            str(store),
            "--out",
            str(out),
        ]
    )
    table = pd.read_csv(out / "physionet2019-raindrop.csv")
    assert table[["method", "protocol", "runs"]].values.tolist() == [
        ["logreg", "cross-hospital", 2],
        ["logreg", "in-hospital", 2],
    ]
    runs = pd.read_csv(out / "physionet2019-raindrop-runs" / "runs.csv").set_index(["protocol", "split"])
    text = (out / "physionet2019-raindrop.md").read_text()
    assert "## From its own hospital to the other" in text
    for split, direction in ((0, "A -> B"), (1, "B -> A")):
        home, away = runs.loc[("in-hospital", split), "auroc"], runs.loc[("cross-hospital", split), "auroc"]
        assert f"| logreg | {direction} | auroc | {home:.4f} | {away:.4f} | {away - home:+.4f} |" in text
    # A protocol of published ids for another cohort is refused on this one, naming where it is published.
    with pytest.raises(SystemExit):
        compare.main(
            [
                "--dataset",
                "physionet2019-raindrop",
                "--protocols",
                "garlic-reference",
                "--methods",
                "logreg",
                "--presets",
                "--data-root",
                str(tmp_path),
                "--mlruns",
                str(store),
            ]
        )
    assert "it is for physionet2012, physionet2019-garlic" in capsys.readouterr().err


def test_a_sources_preset_runs_on_each_of_its_cohorts_and_nowhere_else():
    config = studies.preset_config("physionet2019-cpu", "physionet2019-early", ["split_protocol=cross-hospital"])
    assert (config.dataset, config.split_protocol) == ("physionet2019-early", "cross-hospital")
    with pytest.raises(ValueError, match="'physionet2019-cpu' is for dataset 'physionet2019', not 'physionet2012'"):
        studies.preset_config("physionet2019-cpu", "physionet2012", [])


def test_the_report_counts_the_test_positives_whose_input_shows_their_label(tmp_path):
    from garlic.sources.physionet2019 import preprocess

    two_hospital_records(tmp_path / "source")  # septic stays are labelled from hour 15 of their 20
    for cohort in ("garlic", "raindrop"):  # the first 48 hours, labelled rows too; the rows before the label
        preprocess(tmp_path / "source", tmp_path / "processed" / f"physionet2019-{cohort}", cohort=cohort)
        lines = comparison.what_the_model_sees(f"physionet2019-{cohort}", tmp_path, ["five-split"])
        assert lines[0].startswith(f"`physionet2019-{cohort}` (protocols five-split): input: ")
        labels = pd.read_parquet(tmp_path / "processed" / f"physionet2019-{cohort}" / "labels.parquet")
        splits = [
            json.loads(path.read_text())
            for path in (tmp_path / "processed" / f"physionet2019-{cohort}" / "splits" / "five-split").glob(
                "split_*.json"
            )
        ]
        positives = sum(labels.set_index("stay_id").loc[s["test"], "label"].sum() for s in splits)
        assert positives > 0
        seen = positives if cohort == "garlic" else 0
        assert lines[2] == (
            f"- `five-split`: {seen:,} of {positives:,} test positives (over its splits) show the "
            "model a value recorded at or after their first SepsisLabel 1."
        )


def test_a_source_table_runs_each_protocol_on_its_own_cohort(tmp_path, capsys):
    assert comparison_units.protocol_dataset("physionet2019", "garlic-reference") == "physionet2019-garlic"
    assert comparison_units.protocol_dataset("physionet2019", "raindrop") == "physionet2019-raindrop"
    assert comparison_units.protocol_dataset("physionet2019", "cross-hospital") == "physionet2019-raindrop"
    assert comparison_units.protocol_dataset("physionet2012", "raindrop") == "physionet2012"
    from garlic.sources.physionet2019 import preprocess

    two_hospital_records(tmp_path / "source")
    preprocess(tmp_path / "source", tmp_path / "processed" / "physionet2019-raindrop", cohort="raindrop")
    out = tmp_path / "results"
    compare.main(
        [
            "--dataset",
            "physionet2019",
            "--protocols",
            "five-split",
            "cross-hospital",
            "--methods",
            "logreg",
            "--presets",
            "--data-root",
            str(tmp_path),
            "--mlruns",
            str(tmp_path / "mlruns"),
            "--out",
            str(out),
        ]
    )
    table = pd.read_csv(out / "physionet2019.csv")
    assert table[["method", "protocol", "runs"]].values.tolist() == [
        ["logreg", "five-split", 5],
        ["logreg", "cross-hospital", 2],
    ]
    archived = pd.read_csv(out / "physionet2019-raindrop-runs" / "runs.csv")
    assert sorted(set(archived["protocol"])) == ["cross-hospital", "five-split"] and len(archived) == 7
    text = (out / "physionet2019.md").read_text()
    assert (
        text.startswith("# physionet2019: every method")
        and "`physionet2019-raindrop` (protocols five-split, cross-hospital): input: the rows before" in text
    )
    # Without --protocols: a protocol whose cohort is not preprocessed here, or whose stays it lacks, is left out.
    compare.main(
        [
            "--dataset",
            "physionet2019",
            "--methods",
            "logreg",
            "--presets",
            "--data-root",
            str(tmp_path),
            "--mlruns",
            str(tmp_path / "mlruns"),
            "--no-train",
        ]
    )
    error = capsys.readouterr().err
    assert "protocol garlic-reference left out" in error and "protocol raindrop left out" in error


@pytest.mark.slow
def test_workers_train_a_sources_preset_on_the_cohort_named(tmp_path):
    from garlic.sources.physionet2019 import preprocess

    two_hospital_records(tmp_path / "source", stays_each=60)
    preprocess(tmp_path / "source", tmp_path / "processed" / "physionet2019-raindrop", cohort="raindrop")
    store, out = tmp_path / "mlruns", tmp_path / "results"
    # physionet2019-cpu names the source: each worker is told the cohort (once: "name the cohort" and no run)
    compare.main(
        [
            "--dataset",
            "physionet2019-raindrop",
            "--protocols",
            "cross-hospital",
            "--presets",
            "physionet2019-cpu",
            "--methods",
            *TINY,
            "--data-root",
            str(tmp_path),
            "--mlruns",
            str(store),
            "--out",
            str(out),
            "--workers",
            "2",
        ]
    )
    table = pd.read_csv(out / "physionet2019-raindrop.csv")
    assert table[["method", "protocol", "runs"]].values.tolist() == [["physionet2019-cpu", "cross-hospital", 2]]


def test_published_rows_come_from_the_one_table_of_published_numbers():
    shown = comparison.table([], ["raindrop"], "physionet2012").set_index("method")
    for row in published.results("physionet2012", "raindrop"):
        assert (shown.loc[row.method, "auroc_mean"], shown.loc[row.method, "auprc_std"]) == (row.auroc[0], row.auprc[1])
    assert {"published: KEDGN", "published: ISTS-PLM"} <= set(shown.index)  # the best published on these splits
    assert "published: GARLIC" not in shown.index  # published on garlic-reference, not asked for


def test_a_damaged_archive_is_refused_in_one_line_and_nothing_is_written_back(compared, tmp_path):
    root, _, out, _, _ = compared
    moved = tmp_path / "results"
    shutil.copytree(out, moved)
    risks = moved / "synthetic-runs" / "synthetic" / "tiny-split_0-seed_1.csv.gz"
    damaged = pd.read_csv(risks)
    damaged.loc[2, "risk"] = float("nan")
    damaged.to_csv(risks, index=False, compression="gzip")
    written = {path: path.read_bytes() for path in moved.rglob("*") if path.is_file()}
    with pytest.raises(SystemExit) as refused:
        compare_tiny(root, tmp_path / "empty", moved, "--no-train")
    assert str(refused.value) == f"{risks}, line 4: risk nan is not a number in [0, 1]"
    index = moved / "synthetic-runs" / "runs.csv"
    lines = index.read_text().splitlines()
    index.write_text("\n".join([*lines, lines[1]]) + "\n")
    written[index] = index.read_bytes()
    with pytest.raises(SystemExit, match=f"^{index}, line {len(lines) + 1} repeats line 2 \\(method "):
        compare_tiny(root, tmp_path / "empty", moved, "--no-train")
    assert {path: path.read_bytes() for path in moved.rglob("*") if path.is_file()} == written


def test_a_call_naming_fewer_methods_keeps_the_others_rows_from_the_run_archive(compared, tmp_path):
    root, _, out, first, _ = compared
    moved = tmp_path / "results"
    shutil.copytree(out, moved)
    with tiny_protocol():  # one baseline of the three methods kept
        compare.main(
            [
                "--dataset",
                "synthetic",
                "--protocols",
                "tiny",
                "--presets",
                "--methods",
                "logreg",
                *TINY,
                "--data-root",
                str(root),
                "--mlruns",
                str(tmp_path / "empty"),
                "--out",
                str(moved),
                "--no-train",
            ]
        )
    assert (moved / "synthetic.csv").read_text() == first[1]
    assert pd.read_csv(moved / "synthetic-paired.csv").equals(pd.read_csv(out / "synthetic-paired.csv"))
    report = (moved / "synthetic.md").read_text()
    assert "## Read from the run archive, not named by the command\n" in report
    assert "- tiny: gbm, synthetic\n" in report


def test_a_call_naming_one_protocol_keeps_the_other_protocols_rows_from_the_run_archive(compared, tmp_path):
    root, _, out, _, _ = compared
    moved = tmp_path / "results"
    shutil.copytree(out, moved)
    archive = moved / "synthetic-runs"
    runs = pd.read_csv(archive / "runs.csv", dtype=str, keep_default_na=False)
    for row in runs.itertuples():  # the same units kept as a second protocol's too
        seed = f"-seed_{row.seed}" if row.seed else ""
        shutil.copy(
            archive / row.method / f"tiny-split_0{seed}.csv.gz", archive / row.method / f"tiny2-split_0{seed}.csv.gz"
        )
    pd.concat([runs, runs.assign(protocol="tiny2")]).to_csv(archive / "runs.csv", index=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROTOCOLS, "tiny2", Protocol("tiny2", (0,), seeds=(0, 1)))
        compare_tiny(root, tmp_path / "empty", moved, "--no-train")
    table = pd.read_csv(moved / "synthetic.csv")
    assert table[["method", "protocol"]].values.tolist() == [
        [method, name] for name in ("tiny", "tiny2") for method in ("logreg", "gbm", "synthetic")
    ]
    numbers = table.drop(columns="protocol")
    assert numbers.iloc[:3].reset_index(drop=True).equals(numbers.iloc[3:].reset_index(drop=True))
    paired = pd.read_csv(moved / "synthetic-paired.csv")
    assert sorted(set(paired["protocol"])) == ["tiny", "tiny2"]
    assert "- tiny2: logreg, gbm, synthetic\n" in (moved / "synthetic.md").read_text()


def test_a_unit_stopped_half_way_is_resumed_in_its_own_run_not_trained_again(tmp_path):
    # A machine that went away mid-run leaves the unit's run unfinished with its training state: the next compare
    # goes on from the state's epoch in that MLflow run, and the unit's row is that run.
    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=200, seed=3)
    store = tmp_path / "mlruns"
    config = studies.preset_config("synthetic", "synthetic", ["max_epochs=3", "hidden_dim=8", "feature_dim=4"])
    config = config.override({"split_protocol": "five-split"})

    def dies_in_the_second_epoch(split, record):  # after epoch 1's state was saved, before epoch 2's
        if record.epoch == 2:
            raise KeyboardInterrupt("the machine went away")

    with pytest.raises(KeyboardInterrupt):
        runs.train(config, [0], data_root=tmp_path, store=store, on_epoch=dies_in_the_second_epoch, preset="synthetic")
    use_store(store)
    (stopped,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert stopped.info.status == "KILLED"
    assert run_contract.training_state_path(store, stopped.info.run_id).is_file()
    units, missing = comparison_units.garlic_units("synthetic", config, "five-split", [store], tmp_path, train=True)
    assert missing == [] and [u.split for u in units if u.split == 0] == [0]
    (unit,) = [u for u in units if u.split == 0]
    assert unit.run_id == stopped.info.run_id and len(split_runs(store)) == 5
    use_store(store)
    resumed = mlflow.get_run(stopped.info.run_id)
    assert resumed.info.status == "FINISHED"
    # epoch 1 was trained once, before the stop; epoch 2 again from epoch 1's state, then epoch 3
    history = mlflow.MlflowClient().get_metric_history(stopped.info.run_id, "val_auroc")
    assert sorted(m.step for m in history) == [1, 2, 2, 3]


def test_the_report_says_what_the_input_hours_alone_score_on_each_protocol_and_what_that_means():
    def unit(method: str, protocol_name: str, split: int, auroc: float) -> Unit:
        metrics = {"auroc": auroc, "auprc": auroc / 2, "brier": 0.1, "ece": 0.01}
        return Unit(method, protocol_name, split, None, f"run{split}", "digest", metrics, pd.DataFrame())

    units = [
        unit("input_hours", "raindrop", 0, 0.70),
        unit("input_hours", "raindrop", 1, 0.80),
        unit("gbm", "raindrop", 0, 0.9),
        unit("input_hours", "garlic-reference", 0, 0.52),
    ]
    summary = comparison.table(units, ["raindrop", "garlic-reference"])

    def made(rows: pd.DataFrame) -> str:
        return comparison.report(
            rows, pd.DataFrame(), pd.DataFrame(), [], [], "python -m experiments.compare", "p19", [], {}
        )

    text = made(summary)
    section = text.split("## The input's length alone\n\n")[1]
    assert "every AUROC and AUPRC on the protocol, ours and the published ones on the same windows" in section
    assert "- `raindrop`: AUROC 0.750 ± 0.050, AUPRC 0.375 ± 0.025 (2 runs)\n" in section
    assert "- `garlic-reference`: AUROC 0.520 ± 0.000, AUPRC 0.260 ± 0.000 (1 run)\n" in section
    assert "length alone" not in made(summary[summary["method"] != "input_hours"])


def test_the_report_gives_each_methods_settings_with_the_epoch_budget_the_datasets_configuration_sets():
    from garlic.config import Config

    (line,) = comparison.method_settings(["pypots_raindrop", "garlic"], ["physionet2012"], [])  # GARLIC's: its preset
    budget = Config.for_dataset("physionet2012")
    assert line.startswith("- `pypots_raindrop`: hidden_dim 64, dropout 0.2, batch_size 64, ")
    assert f"max_epochs {budget.max_epochs}, patience {budget.early_stopping}, seed 0" in line
    # where the datasets' configurations differ, a line for each; --set reaches them as it reaches the runs
    assert Config.for_dataset("synthetic").max_epochs != budget.max_epochs
    lines = comparison.method_settings(["decay_gru"], ["physionet2012", "synthetic"], ["max_epochs=7"])
    assert [line.split(":")[0] for line in lines] == [
        "- `decay_gru` on `physionet2012`",
        "- `decay_gru` on `synthetic`",
    ]
    assert all("max_epochs 7," in line for line in lines)
    text = comparison.report(
        comparison.table([], []), pd.DataFrame(), pd.DataFrame(), [], [], "python -m ...", "p12", [], {}, lines
    )
    assert text.split("## The methods' settings\n\n")[1].endswith("\n\n" + "\n".join(lines) + "\n")


def test_every_path_sees_every_finished_unit_and_stores_written_before_units_were_tagged_still_read(
    tmp_path, monkeypatch
):
    # One unit, whichever path trained it and in whichever experiment: the table gathers `garlic train --method`'s
    # run and a baseline run in the experiment `baselines-DATASET` that carries the tags the baselines wrote before
    # (study among them), and a GARLIC split run of `garlic train` that carries no unit tags at all; none is trained.
    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=300, seed=2)
    monkeypatch.setitem(PROTOCOLS, "two", Protocol("two", (0, 1)))
    store = tmp_path / "mlruns"
    settings = {"split_protocol": "two"}
    by_train, _ = runs.train(Config.for_dataset("synthetic").override(settings), [0], tmp_path, store, method="logreg")
    loaded = studies.load_cohort("synthetic", tmp_path, "two", [1])
    earlier = studies.Baselines(Config.for_dataset("synthetic").override(settings), loaded, tmp_path, store)
    unit = earlier.unit("logreg", loaded.splits[0])
    experiment = studies.open_experiment("baselines-synthetic", store)  # where the baselines' runs were kept

    def work() -> dict[str, float]:
        parts = split_parts(loaded.tensors, loaded.splits[0])
        return runs.fit_and_test_resuming(earlier.method("logreg"), parts, earlier.config, store)

    _, by_study, _ = runs.resumable_run(
        None, None, {"experiment_id": experiment, "run_name": "logreg/split_1", "tags": unit.tags()}, work, store
    )
    mlflow.MlflowClient().set_tag(by_study, "study", "baseline")
    config = studies.preset_config("synthetic", "synthetic", TINY[1::2]).override({"split_protocol": "two", "seed": 0})
    untagged, _ = runs.train(config, [1], tmp_path, store, preset="synthetic")
    for key in ("dataset", "data_digest", "method", "split", "settings"):  # as `garlic train` left its runs before
        mlflow.MlflowClient().delete_tag(untagged, key)

    def never(*args, **kwargs):
        raise AssertionError("a finished unit was trained again")

    monkeypatch.setattr(runs, "fit_and_test_resuming", never)
    monkeypatch.setattr(runs, "train", never)
    monkeypatch.setattr(runs, "resume", never)
    found, missing = comparison_units.baseline_units(["logreg"], "synthetic", "two", [store], tmp_path, [])
    assert [(u.split, u.run_id) for u in found] == [(0, by_train), (1, by_study)] and missing == []
    monkeypatch.setitem(PROTOCOLS, "two", Protocol("two", (1,), seeds=(0,)))
    (garlic,), missing = comparison_units.garlic_units("synthetic", config, "two", [store], tmp_path, train=True)
    assert garlic.run_id == untagged and missing == []


def test_a_garlic_unit_that_garlic_train_finished_is_the_studies_unit_too(tmp_path, monkeypatch):
    # The early-warning study trains its GARLIC presets as registered methods; `garlic train --config` of the same
    # preset on the same split is the same unit, found by its identity rather than trained twice.
    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=300, seed=2)
    store = tmp_path / "mlruns"
    config = studies.preset_config("synthetic", "synthetic", TINY[1::2]).override({"split_protocol": "five-split"})
    trained, _ = runs.train(config, [0], tmp_path, store, preset="synthetic")

    def never(*args, **kwargs):
        raise AssertionError("a finished unit was trained again")

    monkeypatch.setattr(runs, "fit_and_test_resuming", never)
    loaded = studies.load_cohort("synthetic", tmp_path, "five-split", [0])
    (record,) = studies.Baselines(config, loaded, tmp_path, store).run(["garlic"]).to_dict("records")
    assert record["run_id"] == trained
