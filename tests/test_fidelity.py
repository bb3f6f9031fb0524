import mlflow
import numpy as np
import pandas as pd
import pytest

from garlic import studies
from garlic.tracking import queries
from garlic.methods.summary import SummaryModel
from experiments.fidelity import (
    CLAIMED_ORDER,
    EQUIVALENCE_MARGIN,
    FidelityStudy,
    equivalence_tests,
    importance_map,
    ordering_tests,
    ranking_comparison,
    results_table,
    variable_importance,
)
from experiments.fidelity import main as fidelity_main
from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.data.splits import draw_split
from garlic.evaluation.fit_and_test import TEST_METRICS, split_parts
from garlic.evaluation.stats import page_l, page_trend, paired_comparisons
from garlic.explain.removal import keep_count, keep_highest, keep_mask, reduce
from garlic.io.tensors import IrregularTensors
from garlic.metrics import binary_metrics
from garlic.models.compact import Garlic
from garlic.models.network_config import NetworkConfig
from helpers import synthetic_root

TINY = {"hidden_dim": 16, "feature_dim": 4, "batch_size": 64, "lr_cls": 3e-3, "lr_rec": 3e-3, "max_epochs": 1}


def cohort(n=6, steps=5, variables=3, seed=0) -> IrregularTensors:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, steps + 1, n)
    real = np.arange(steps)[None, :] < lengths[:, None]
    mask = (rng.random((n, steps, variables)) < 0.6) & real[:, :, None]
    mask[np.arange(n), 0, 0] = True  # every stay observes something
    return IrregularTensors(
        stay_ids=np.arange(n, dtype="int64"),
        values=np.where(mask, rng.normal(size=mask.shape), 0).astype("float32"),
        mask=mask,
        times=np.where(real, np.cumsum(rng.random((n, steps)), axis=1), 0).astype("float32"),
        lengths=lengths.astype("int64"),
        static=np.zeros((n, 0), dtype="float32"),
        labels=(np.arange(n) % 2).astype("float32"),
        variables=[f"v{i}" for i in range(variables)],
        static_features=[],
    )


def test_keep_count_rounds_halves_up():
    mask = np.zeros((5, 4, 3), dtype=bool)
    for stay, observed in enumerate([0, 1, 3, 10, 12]):
        mask[stay].flat[:observed] = True
    np.testing.assert_array_equal(keep_count(mask, 0.5), [0, 1, 2, 5, 6])
    np.testing.assert_array_equal(keep_count(mask, 0.25), [0, 0, 1, 3, 3])  # 0.25 -> 0, 0.75 -> 1, 2.5 -> 3
    np.testing.assert_array_equal(keep_count(mask, 1.0), [0, 1, 3, 10, 12])
    with pytest.raises(ValueError):
        keep_count(mask, 1.5)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("condition", ["top", "random", "bottom"])
def test_removal_keeps_exactly_the_requested_share_of_each_stays_observed_values(fraction, condition):
    tensors = cohort(n=40, steps=8, variables=4)
    importance = np.random.default_rng(1).random(tensors.mask.shape)
    keep = keep_mask(tensors.mask, importance, fraction, condition, seed=3)
    assert not (keep & ~tensors.mask).any()  # only observed cells are kept
    np.testing.assert_array_equal(keep.sum(axis=(1, 2)), keep_count(tensors.mask, fraction))


def test_top_keeps_the_most_important_and_bottom_the_least():
    tensors = cohort(n=30, steps=8, variables=4)
    importance = np.random.default_rng(2).random(tensors.mask.shape)
    top, bottom = keep_highest(tensors.mask, importance, 0.5), keep_mask(tensors.mask, importance, 0.5, "bottom")
    for stay in range(len(tensors)):
        observed = tensors.mask[stay]
        dropped_by_top = importance[stay][observed & ~top[stay]]
        if top[stay].any() and len(dropped_by_top):
            assert importance[stay][top[stay]].min() >= dropped_by_top.max()
        dropped_by_bottom = importance[stay][observed & ~bottom[stay]]
        if bottom[stay].any() and len(dropped_by_bottom):
            assert importance[stay][bottom[stay]].max() <= dropped_by_bottom.min()


def test_ties_are_broken_by_position_and_random_is_seeded():
    mask = np.ones((1, 2, 2), dtype=bool)
    keep = keep_highest(mask, np.zeros(mask.shape), 0.5)
    np.testing.assert_array_equal(keep[0], [[True, True], [False, False]])  # the earlier step wins a tie
    tensors = cohort(n=20, steps=8, variables=4)
    first = keep_mask(tensors.mask, None, 0.5, "random", seed=[0, 1, 500])
    np.testing.assert_array_equal(first, keep_mask(tensors.mask, None, 0.5, "random", seed=[0, 1, 500]))
    assert (first != keep_mask(tensors.mask, None, 0.5, "random", seed=[0, 2, 500])).any()


def test_reduce_makes_removed_values_missing_and_packs_the_remaining_steps():
    tensors = cohort(n=12, steps=6, variables=3)
    keep = keep_mask(tensors.mask, np.random.default_rng(4).random(tensors.mask.shape), 0.4, "top")
    reduced = reduce(tensors, keep)
    np.testing.assert_array_equal(reduced.mask.sum(axis=(1, 2)), keep.sum(axis=(1, 2)))
    np.testing.assert_array_equal(reduced.stay_ids, tensors.stay_ids)
    for stay in range(len(tensors)):
        steps = reduced.lengths[stay]
        assert reduced.mask[stay, :steps].any(axis=1).all()  # no empty step is left
        assert not reduced.mask[stay, steps:].any() and (reduced.times[stay, steps:] == 0).all()
        kept_steps = np.nonzero(keep[stay].any(axis=1))[0]
        np.testing.assert_array_equal(reduced.times[stay, :steps], tensors.times[stay, kept_steps])
        np.testing.assert_array_equal(reduced.mask[stay, :steps], keep[stay, kept_steps])
        np.testing.assert_array_equal(reduced.values[stay, :steps], np.where(keep, tensors.values, 0)[stay, kept_steps])


def test_page_l_against_a_hand_computation():
    # Columns in predicted increasing order. Ranks per row: [1,2,3], [2,1,3], [3,2,1] -> rank sums 6, 5, 7.
    scores = np.array([[0.1, 0.2, 0.3], [0.5, 0.4, 0.6], [0.9, 0.8, 0.7]])
    assert page_l(scores) == 1 * 6 + 2 * 5 + 3 * 7
    table = pd.DataFrame(scores, columns=["worst", "middle", "best"])
    result = page_trend(table, ["best", "middle", "worst"])
    assert result.statistic == 37


def test_one_screening_split_gets_its_l_and_no_p_value():
    table = pd.DataFrame({"best": [0.9], "middle": [0.8], "worst": [0.7]})
    result = page_trend(table, ["best", "middle", "worst"])
    assert result.statistic == page_l(np.array([[0.7, 0.8, 0.9]])) == 14.0
    assert np.isnan(result.p_value) and result.method == "not tested: one split" and result.n_blocks == 1


def test_page_test_of_a_perfect_ordering_is_exact():
    # Every one of 3 splits ranks 4 conditions as claimed: L = 3 * (1 + 4 + 9 + 16), p = (1 / 4!)^3.
    table = pd.DataFrame([[0.9, 0.8, 0.7, 0.6], [0.85, 0.8, 0.75, 0.5], [0.95, 0.9, 0.6, 0.55]], columns=CLAIMED_ORDER)
    result = page_trend(table, CLAIMED_ORDER)
    assert result.statistic == 90 and result.p_value == pytest.approx((1 / 24) ** 3)
    pairs = paired_comparisons(table, CLAIMED_ORDER)
    assert pairs["splits_agreeing"].tolist() == [3, 3, 3]
    assert pairs.loc[0, "mean_difference"] == pytest.approx(np.mean([0.1, 0.05, 0.05]))


def planted_cohort(n=4000, steps=12, seed=0) -> IrregularTensors:
    """Three of four variables read the outcome's latent z through heavy noise, the fourth is noise alone.

    Every informative value is worth the same, so the model's evidence grows with how many it keeps: with an
    oracle ranking (informative first), top 50% keeps 2/3 of them, random 50% keeps 1/2, bottom 50% keeps 1/3.
    """
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=n)
    informative = np.array([1.0, 1.0, 1.0, 0.0])
    values = latent[:, None, None] * informative + rng.normal(0, 4.0, (n, steps, 4))
    mask = rng.random((n, steps, 4)) < 0.8
    mask[:, 0, 3] = True
    return IrregularTensors(
        stay_ids=np.arange(n, dtype="int64"),
        values=np.where(mask, values, 0).astype("float32"),
        mask=mask,
        times=np.tile(np.arange(steps, dtype="float32"), (n, 1)),
        lengths=np.full(n, steps, dtype="int64"),
        static=np.zeros((n, 0), dtype="float32"),
        labels=(latent > 0).astype("float32"),
        variables=["a", "b", "c", "noise"],
        static_features=[],
    )


def test_ordering_test_detects_full_top_random_bottom_with_an_oracle_ranking():
    tensors = planted_cohort()
    oracle = np.broadcast_to(np.array([1.0, 1.0, 1.0, 0.0]), tensors.mask.shape)
    rows = []
    for index in range(5):
        split = draw_split(tensors, "five-split", index)
        for condition in CLAIMED_ORDER:
            kept = (
                tensors
                if condition == "full"
                else reduce(tensors, keep_mask(tensors.mask, oracle, 0.5, condition, seed=index))
            )
            parts = split_parts(kept, split)
            fitted = SummaryModel("logreg").fit(parts["train"], parts["validation"])
            auroc = binary_metrics(parts["test"].labels.numpy(), fitted.predict_proba(parts["test"]))["auroc"]
            rows.append(
                {
                    "split": index,
                    "condition": condition,
                    "method": "oracle",
                    "fraction": 0.5,
                    "test_auroc": auroc,
                    "test_auprc": auroc,
                }
            )
    records = pd.DataFrame(rows)
    table = records.pivot_table(index="split", columns="condition", values="test_auroc")
    means = table[CLAIMED_ORDER].mean()
    assert list(means.sort_values(ascending=False).index) == CLAIMED_ORDER
    result = page_trend(table, CLAIMED_ORDER)
    assert result.p_value < 0.01
    tests = ordering_tests(records, ["oracle"], [0.5])
    assert tests.loc[0, "page_L"] == result.statistic


@pytest.fixture(scope="module")
def small_cohort(tmp_path_factory):
    return synthetic_root(tmp_path_factory, n_stays=160, seed=2)


def test_importance_maps_cover_every_stay_and_only_observed_cells(small_cohort):
    loaded = studies.load_cohort("synthetic", small_cohort, "five-split", [0])
    tensors, split = loaded.tensors, loaded.splits[0]
    model = Garlic(len(tensors.variables), 0, NetworkConfig.from_run(Config().override(TINY)))
    dataset = IrregularDataset(tensors, split.normalisation)
    for method in ("garlic", "ig"):
        importance = importance_map(model, dataset, method, ig_steps=4, batch_size=50)
        assert importance.shape == tensors.mask.shape
        assert (importance[~tensors.mask] == 0).all()
        np.testing.assert_allclose(importance.sum(axis=(1, 2)), 1.0, rtol=1e-4)


@pytest.mark.slow
def test_fidelity_study_runs_every_condition_once_and_resumes_from_mlflow(small_cohort, tmp_path):
    loaded = studies.load_cohort("synthetic", small_cohort, "five-split", [0])
    config = Config().override(TINY)
    store = tmp_path / "mlruns"
    experiment = studies.open_experiment("fidelity-test", store)
    first = FidelityStudy(config, loaded, experiment, store, ["garlic"], [0.5]).run()
    assert sorted(first["condition"]) == ["bottom", "full", "random", "top"]
    assert np.isfinite(first["test_auroc"]).all() and "edge_recovery_auroc" in first
    runs = mlflow.search_runs(experiment_ids=[experiment])
    assert len(runs) == 4 and set(runs["tags.study"]) == {"fidelity"}
    full = runs[runs["tags.condition"] == "full"].iloc[0]
    assert full["tags.fraction"] == "1" and full["tags.split"] == "0"

    again = FidelityStudy(config, loaded, experiment, store, ["garlic"], [0.5]).run()
    assert len(mlflow.search_runs(experiment_ids=[experiment])) == 4  # nothing retrained
    pd.testing.assert_series_equal(again["test_auroc"], first["test_auroc"])

    # the model-agnostic ranking reuses the full and random runs and adds its own top and bottom
    ranked = FidelityStudy(config, loaded, experiment, store, ["gbm"], [0.5]).run()
    assert sorted(zip(ranked["condition"], ranked["method"])) == [
        ("bottom", "gbm"),
        ("full", "garlic"),
        ("random", "random"),
        ("top", "gbm"),
    ]
    assert len(mlflow.search_runs(experiment_ids=[experiment])) == 6

    # the equivalence test reads the runs' logged test risks: one split, so its difference is that split's
    equivalence = equivalence_tests(first, ["garlic"], [0.5], lambda run_id: queries.test_predictions(store, run_id))
    equivalence = equivalence.set_index("metric")
    by_condition = first.set_index("condition")
    for metric in ("auroc", "auprc"):
        expected = by_condition.loc["top", f"test_{metric}"] - by_condition.loc["full", f"test_{metric}"]
        assert equivalence.loc[metric, "top_minus_full"] == pytest.approx(expected, abs=1e-4)
        assert equivalence.loc[metric, "ci90_low"] <= equivalence.loc[metric, "top_minus_full"]


def test_equivalence_needs_the_whole_90_percent_interval_inside_the_margin():
    generator = np.random.default_rng(0)
    labels = generator.random(400) < 0.3
    risk = np.clip(labels * 0.3 + generator.random(400) * 0.7, 0, 1)
    risks = {"full": risk, "same": risk + 1e-6, "noise": generator.random(400)}

    def predictions(run_id):
        return pd.DataFrame({"stay_id": np.arange(400), "label": labels.astype(int), "risk": risks[run_id]})

    records = pd.DataFrame(
        [
            {"split": 0, "condition": "full", "method": "garlic", "fraction": 1.0, "run_id": "full"},
            {"split": 0, "condition": "top", "method": "garlic", "fraction": 0.5, "run_id": "same"},
            {"split": 0, "condition": "top", "method": "ig", "fraction": 0.5, "run_id": "noise"},
        ]
    )
    tests = equivalence_tests(records, ["garlic", "ig"], [0.5], predictions).set_index(["method", "metric"])
    assert tests.loc[("garlic", "auroc"), "verdict"] == "equivalent"  # the same ranking: a zero-width interval
    assert tests.loc[("ig", "auroc"), "verdict"] == "not shown"  # a ranking that lost the signal
    assert tests.loc[("ig", "auroc"), "ci90_high"] < -EQUIVALENCE_MARGIN["auroc"]
    assert list(tests["margin"]) == [EQUIVALENCE_MARGIN["auroc"], EQUIVALENCE_MARGIN["auprc"]] * 2

    # which ranking keeps more of the signal: IG's top half against the built-in's, on the same stays
    rankings = ranking_comparison(records, ["garlic", "ig"], [0.5], predictions).set_index("metric")
    assert list(rankings["against"]) == ["garlic", "garlic"] and rankings.loc["auroc", "verdict"] == "loss"
    assert (
        rankings.loc["auroc", "ci_low"] <= rankings.loc["auroc", "difference"] <= rankings.loc["auroc", "ci_high"] < 0
    )
    assert ranking_comparison(records, ["garlic"], [0.5], predictions).empty  # one ranking: nothing to compare


def test_the_published_imv_lstm_trial_sits_beside_the_full_and_half_rows_on_p12():
    rows = [
        {"split": s, "method": m, "condition": c, "fraction": f, **dict.fromkeys(TEST_METRICS, 0.5)}
        for s in (0, 1)
        for m, c, f in [
            ("garlic", "full", 1.0),
            ("garlic", "top", 0.5),
            ("random", "random", 0.5),
            ("garlic", "bottom", 0.5),
            ("garlic", "top", 0.3),
        ]
    ]
    table = results_table(pd.DataFrame(rows), "physionet2012").set_index(["condition", "fraction"])
    assert table.loc[("full", 1.0), "published_imv_lstm"] == "0.840 / 0.491"
    assert table.loc[("bottom", 0.5), "published_imv_lstm"] == "0.701 / 0.268"
    assert pd.isna(table.loc[("top", 0.3), "published_imv_lstm"])  # the paper kept half
    assert "published_imv_lstm" not in results_table(pd.DataFrame(rows), "synthetic")


def test_gradient_boosting_ranks_the_noise_variable_last_and_gives_every_value_of_a_variable_its_weight():
    tensors = planted_cohort(n=1500)
    parts = split_parts(tensors, draw_split(tensors, "five-split", 0))
    weights = variable_importance(parts["train"], parts["validation"], seed=0, repeats=3)
    assert weights.shape == (4,) and int(np.argmin(weights)) == 3  # "noise" carries nothing
    assert (weights[:3] > 0.01).all()
    keep = keep_mask(tensors.mask, np.where(tensors.mask, weights, 0.0), 0.5, "bottom")
    assert keep[..., 3][tensors.mask[..., 3]].mean() > 0.9  # the bottom half keeps the noise first


def test_workers_run_each_unfinished_split_in_its_own_process_then_tabulate_the_finished_ones(
    small_cohort, tmp_path, capsys
):
    store, out = tmp_path / "mlruns", tmp_path / "out"
    arguments = [
        "--data-root",
        str(small_cohort),
        "--mlruns",
        str(store),
        "--splits",
        "0",
        "1",
        "--max-epochs",
        "1",
        "--methods",
        "gbm",
        "--out",
        str(out),
    ] + [f"--set={k}={v}" for k, v in TINY.items() if k != "max_epochs"]
    fidelity_main([*arguments, "--workers", "2"])
    printed = capsys.readouterr().out
    assert "split_0: done" in printed and "split_1: done" in printed
    assert len(list((store / "logs").glob("fidelity-synthetic-split_*.log"))) == 2
    runs = mlflow.search_runs(experiment_names=["fidelity-synthetic"])
    units = runs[runs["tags.condition"].notna()]  # not the summary run
    assert len(units) == 2 * 4 and set(units["status"]) == {"FINISHED"}  # full, random, top and bottom per split
    assert pd.read_csv(out / "fidelity_ordering.csv")["splits"].tolist() == [2, 2]
    fidelity_main([*arguments, "--workers", "2"])
    assert "running 0 units" in capsys.readouterr().out

    # the tables made again from the run archive in --out alone, without the store: nothing trained, the same numbers
    made = {
        name: pd.read_csv(out / f"{name}.csv")
        for name in ("fidelity_results", "fidelity_ordering", "fidelity_equivalence", "fidelity_runs")
    }
    assert len(list((out / "risks").glob("*.csv.gz"))) == 2 * 4
    empty = tmp_path / "empty-store"
    fidelity_main([*[str(empty) if a == str(store) else a for a in arguments], "--workers", "2"])
    assert "running 0 units" in capsys.readouterr().out
    assert not (empty / "logs").exists()
    for name, table in made.items():
        pd.testing.assert_frame_equal(pd.read_csv(out / f"{name}.csv"), table, check_like=True)
