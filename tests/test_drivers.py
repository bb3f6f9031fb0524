"""The baselines explain their risks by their variables (``garlic.explain.contributions``): exact tree SHAP values
for gradient boosting, coefficient x standardised value for logistic regression, folded into the variables; and the
faithfulness of those drivers at alerted hours (``garlic.evaluation.faithfulness``). On the synthetic cohort, asked at
five hours of every stay as an hourly task asks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from garlic.data.batches import IrregularDataset
from garlic.explain.contributions import SHAP_MISSING, top_drivers
from garlic.methods.drivers import row_gradients, row_importance, row_signal_importance
from garlic.evaluation.faithfulness import alert_faithfulness, removal_drops, removed_variables
from garlic.io.tensors import PredictionTimes
from garlic.methods.contract import explains_rows, unexplained_reason
from garlic.methods.hourly import HourlyModel, feature_names
from garlic.methods.summary import SummaryModel
from helpers import synthetic_cohort

HOURS = np.array([6, 12, 24, 36, 47], dtype="float32")
needs_shap = pytest.mark.skipif(
    HourlyModel("gbm").explanation_unavailable is not None, reason="needs the explain extra (shap): bin/setup explain"
)


@pytest.fixture(scope="module")
def hourly_parts(tmp_path_factory) -> dict:
    """The synthetic cohort's parts, each stay asked at ``HOURS`` with its outcome as the label."""
    cohort = synthetic_cohort(tmp_path_factory, n_stays=200, seed=3)
    tensors = cohort.tensors
    task = PredictionTimes(
        np.repeat(np.arange(len(tensors)), len(HOURS)),
        np.tile(HOURS, len(tensors)),
        np.repeat(tensors.labels, len(HOURS)).astype("float32"),
    )
    asked = replace(tensors, task=task)
    return {
        part: IrregularDataset(asked.subset(cohort.split.positions(asked, part)), cohort.split.normalisation)
        for part in ("train", "validation", "test")
    }


@pytest.fixture(scope="module")
def fitted(hourly_parts) -> dict:
    train, validation = hourly_parts["train"], hourly_parts["validation"]
    return {kind: HourlyModel(kind).fit(train, validation) for kind in ("logreg", "gbm")}


def folded_by_name(model, dataset) -> np.ndarray:
    """The oracle of folding: each variable's columns found by their names (``HR_last`` ... belong to ``HR``)."""
    columns, _ = model.column_contributions(dataset)
    names = np.asarray(feature_names(dataset.tensors))[model.kept_]
    return np.stack(
        [
            columns[:, [name.startswith(f"{variable}_") for name in names]].sum(axis=1)
            for variable in dataset.tensors.variables
        ],
        axis=1,
    )


@pytest.mark.parametrize("kind", ["logreg", pytest.param("gbm", marks=needs_shap)])
def test_contributions_and_the_base_sum_to_the_models_log_odds_on_every_row(kind, fitted, hourly_parts):
    model, test = fitted[kind], hourly_parts["test"]
    columns, base = model.column_contributions(test)
    raw = model.model_.decision_function(model.features(test)[:, model.kept_])
    assert columns.shape == (len(test.prediction_times), model.kept_.sum())
    np.testing.assert_allclose(columns.sum(axis=1) + base, raw, atol=1e-5)
    # Folded into the variables: each variable's statistics summed; the static features and the hour left out
    np.testing.assert_allclose(model.contributions(test), folded_by_name(model, test), atol=1e-6)  # float32 sums
    assert explains_rows(model) and unexplained_reason(model) is None


def test_logistic_regression_gives_coefficient_times_value_and_a_missing_variable_its_indicator(fitted, hourly_parts):
    model, test = fitted["logreg"], hourly_parts["test"]
    imputer, scaler, linear = model.model_
    features = model.features(test)[:, model.kept_]
    columns, base = model.column_contributions(test)
    standardised = scaler.transform(imputer.transform(features))
    indicated = list(imputer.indicator_.features_)
    assert indicated, "the synthetic labs leave hours with a statistic missing"
    column = indicated[0]
    expected = standardised[:, column] * linear.coef_[0, column]
    expected += standardised[:, features.shape[1] + 0] * linear.coef_[0, features.shape[1] + 0]
    np.testing.assert_allclose(columns[:, column], expected, atol=1e-9)
    assert base == linear.intercept_[0]


def path_dependent_value(model, row: np.ndarray, known: set[int]) -> float:
    """The model's raw score at ``row`` knowing only the features ``known``: down each tree, a split on a known
    feature follows the row, one on another averages both sides by their training counts (TreeSHAP's
    expectation, Lundberg et al. 2020)."""

    def down(nodes, at: int) -> float:
        node = nodes[at]
        if node["is_leaf"]:
            return float(node["value"])
        left, right = int(node["left"]), int(node["right"])
        feature = int(node["feature_idx"])
        if feature in known:
            value = row[feature]
            goes_left = node["missing_go_to_left"] if np.isnan(value) else value <= node["num_threshold"]
            return down(nodes, left if goes_left else right)
        counts = nodes[left]["count"], nodes[right]["count"]
        return (counts[0] * down(nodes, left) + counts[1] * down(nodes, right)) / (counts[0] + counts[1])

    return sum(down(trees[0].nodes, 0) for trees in model._predictors)


def brute_force_shapley(model, row: np.ndarray) -> np.ndarray:
    from itertools import combinations
    from math import factorial

    n = len(row)
    values = np.zeros(n)
    for feature in range(n):
        others = [f for f in range(n) if f != feature]
        for size in range(n):
            weight = factorial(size) * factorial(n - size - 1) / factorial(n)
            for subset in combinations(others, size):
                values[feature] += weight * (
                    path_dependent_value(model, row, {*subset, feature}) - path_dependent_value(model, row, set(subset))
                )
    return values


@needs_shap
def test_boosting_gives_the_exact_tree_shap_values(fitted, hourly_parts):
    """Small boosting on four hourly features (one with missing values), its values against the Shapley values
    computed by brute force over every coalition."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    from garlic.explain.contributions import tree_contributions

    train, test = hourly_parts["train"], hourly_parts["test"]
    names = feature_names(train.tensors)
    chosen = [names.index(name) for name in ("Lactate_last", "Lactate_hours_since", "HR_mean_6h", "SysABP_last")]
    features = HourlyModel("gbm").features(train)[:, chosen]
    assert np.isnan(features[:, 0]).any()
    model = HistGradientBoostingClassifier(max_iter=5, max_leaf_nodes=6, random_state=0)
    model.fit(features, train.prediction_times.label)
    rows = HourlyModel("gbm").features(test)[:6, chosen].astype("float64")
    ours, base = tree_contributions(model, rows)
    for row, values in zip(rows, ours):
        np.testing.assert_allclose(values, brute_force_shapley(model, row), atol=1e-9)
    baseline = float(np.ravel(model._baseline_prediction)[0])
    assert base == pytest.approx(baseline + path_dependent_value(model, rows[0], set()))


def test_without_shap_boosting_declares_no_explanation_and_still_scores(fitted, hourly_parts, monkeypatch):
    import garlic.methods.summary as summary

    monkeypatch.setattr(summary, "shap_installed", lambda: False)
    model = fitted["gbm"]
    assert not explains_rows(model) and unexplained_reason(model) == SHAP_MISSING
    assert "pip install -e '.[explain]'" in SHAP_MISSING and "\n" not in SHAP_MISSING
    assert explains_rows(fitted["logreg"])  # logistic regression needs nothing beyond scikit-learn
    with pytest.raises(RuntimeError, match="need the shap package"):
        model.contributions(hourly_parts["test"])
    with pytest.raises(ValueError, match="hourly_gbm does not explain its risks: gradient boosting's drivers need"):
        row_importance(model, hourly_parts["test"])
    assert np.isfinite(model.predict_proba(hourly_parts["test"])).all()


def test_a_per_stay_summary_model_folds_its_summaries_into_the_variables(hourly_parts):
    train, validation = (replace_task(hourly_parts[part]) for part in ("train", "validation"))
    model = SummaryModel("logreg", with_static=True).fit(train, validation)
    columns, base = model.column_contributions(validation)
    groups = model.feature_groups(model.inputs_)
    variables = validation.tensors.variables
    assert (groups[-len(validation.tensors.static_features) :] == -1).all()  # the static features are no variable's
    assert [variables[g] for g in groups[: len(variables)]] == list(variables)  # first_HR, first_Temp, ...
    np.testing.assert_allclose(
        model.contributions(validation).sum(axis=1), columns[:, groups[model.kept_] >= 0].sum(axis=1), atol=1e-9
    )


def replace_task(dataset: IrregularDataset) -> IrregularDataset:
    """The dataset as a per-stay task (no prediction times)."""
    return IrregularDataset(replace(dataset.tensors, task=None), dataset.normalisation)


def test_the_top_drivers_are_the_variables_that_raised_the_risk_highest_first():
    names = ["HR", "Temp", "Lactate", "WBC"]
    assert top_drivers(np.array([0.2, -0.5, 0.9, 0.0]), names, 3) == ["Lactate", "HR"]
    assert top_drivers(np.array([0.3, 0.3, 0.1, 0.2]), names, 2) == ["HR", "Temp"]  # ties: the earlier variable
    assert top_drivers(np.array([-1.0, -1.0, 0.0, 0.0]), names, 3) == []


def test_half_of_the_observed_variables_are_removed_rounded_up_and_never_an_unobserved_one():
    observed = np.array([[True, True, True, False], [True, False, False, False], [False] * 4])
    scores = np.array([[0.1, 0.5, -0.2, 9.0], [0.0, 9.0, 9.0, 9.0], [1.0, 2.0, 3.0, 4.0]])
    removed = removed_variables(observed, scores, 0.5)
    np.testing.assert_array_equal(removed, [[True, True, False, False], [True, False, False, False], [False] * 4])


@pytest.mark.parametrize("kind", ["logreg", pytest.param("gbm", marks=needs_shap)])
def test_removing_an_alerts_top_drivers_lowers_its_risk_more_than_a_random_or_the_bottom_half(
    kind, fitted, hourly_parts
):
    model, test = fitted[kind], hourly_parts["test"]
    risk = model.predict_proba(test)
    rows = np.flatnonzero(risk >= 0.3)
    drops = removal_drops(model, test, rows)
    np.testing.assert_allclose(drops["risk"], risk[rows])  # asked again on the record cut there: the same risk
    np.testing.assert_array_equal(drops["time"], test.prediction_times.time[rows])
    summary = alert_faithfulness(model, test, threshold=0.3)
    assert summary["alerts"] == len(rows) > 10
    np.testing.assert_allclose(
        summary[["drop_top", "drop_random", "drop_bottom"]].to_numpy(float),
        drops[["drop_top", "drop_random", "drop_bottom"]].mean().to_numpy(),
        atol=1e-12,
    )
    assert summary["drop_top"] > summary["drop_random"] > summary["drop_bottom"]
    assert alert_faithfulness(model, test, threshold=0.3, max_alerts=5)["alerts"] == 5


def saved(model, dataset: IrregularDataset):
    from garlic.config import Config
    from garlic.methods.saved import SavedMethod

    tensors = dataset.tensors
    return SavedMethod(
        model.name, model, Config(), list(tensors.variables), list(tensors.static_features), dataset.normalisation
    )


def ward_readings(dataset: IrregularDataset, positions: list[int]):
    """The stays at ``positions`` as a ward's readings (bed, variable, time, value), the static features at hour 0."""
    import pandas as pd

    tensors, rows = dataset.tensors, []
    for position in positions:
        bed = f"bed-{position}"
        for step in range(int(tensors.lengths[position])):
            for column in np.flatnonzero(tensors.mask[position, step]):
                rows.append(
                    (
                        bed,
                        tensors.variables[column],
                        float(tensors.times[position, step]),
                        float(tensors.values[position, step, column]),
                    )
                )
        rows += [
            (bed, name, 0.0, float(value)) for name, value in zip(tensors.static_features, tensors.static[position])
        ]
    return pd.DataFrame(rows, columns=["bed", "variable", "time", "value"])


@pytest.mark.parametrize("kind", ["logreg", pytest.param("gbm", marks=needs_shap)])
def test_the_live_ward_shows_an_hourly_models_top_drivers_at_every_scored_hour(kind, fitted, hourly_parts):
    import pandas as pd

    from garlic.live.scoring import TOP_DRIVERS, BedScorer

    model, test = fitted[kind], hourly_parts["test"]
    positions = [0, 1, 2]
    scorer = BedScorer(saved(model, test), hourly=True)
    assert scorer.contributes and scorer.unexplained is None
    times = test.prediction_times
    rows = np.flatnonzero(np.isin(times.stay, positions))
    asked = pd.DataFrame({"bed": [f"bed-{s}" for s in times.stay[rows]], "time": times.time[rows]})
    risk, drivers = scorer.score(ward_readings(test, positions), asked)
    np.testing.assert_allclose(risk, model.predict_proba(test)[rows], rtol=1e-5)
    expected = [top_drivers(row, test.tensors.variables, TOP_DRIVERS) for row in model.contributions(test)[rows]]
    assert drivers == expected and all(drivers) and all(len(names) <= TOP_DRIVERS for names in drivers)


def test_the_live_ward_shows_a_per_stay_models_drivers_and_says_why_boosting_shows_none(
    fitted, hourly_parts, monkeypatch
):
    import pandas as pd

    import garlic.methods.summary as summary
    from garlic.live.scoring import BedScorer

    train, test = replace_task(hourly_parts["train"]), replace_task(hourly_parts["test"])
    model = SummaryModel("logreg").fit(train, replace_task(hourly_parts["validation"]))
    end = test.prediction_times.time
    asked = pd.DataFrame({"bed": ["bed-0", "bed-1"], "time": end[:2]})
    _, drivers = BedScorer(saved(model, test), top=2).score(ward_readings(test, [0, 1]), asked)
    assert drivers == [top_drivers(row, test.tensors.variables, 2) for row in model.contributions(test)[:2]]
    assert all(drivers)

    monkeypatch.setattr(summary, "shap_installed", lambda: False)
    scorer = BedScorer(saved(fitted["gbm"], hourly_parts["test"]), hourly=True)
    assert not scorer.contributes and scorer.unexplained == SHAP_MISSING
    hours = pd.DataFrame({"bed": ["bed-0"], "time": [12.0]})
    risk, drivers = scorer.score(ward_readings(hourly_parts["test"], [0]), hours)
    assert np.isfinite(risk).all() and drivers == [[]]


@pytest.mark.parametrize("kind", ["logreg", pytest.param("gbm", marks=needs_shap)])
def test_the_dashboards_replay_explains_an_hour_by_the_models_contributions_there(kind, fitted, hourly_parts):
    from garlic.app.replay import contribution_bars, drivers_at, explain_hour, replay_stay

    model, test = fitted[kind], hourly_parts["test"]
    trained = saved(model, test)
    replay = replay_stay(trained, test, 0)
    index = 23  # hour 24, one of the task's hours
    hour = explain_hour(trained, replay, index)
    assert hour.explanation is None and hour.explained
    at_24 = np.flatnonzero((test.prediction_times.stay == 0) & (test.prediction_times.time == 24))
    np.testing.assert_allclose(hour.contributions.to_numpy(), model.contributions(test)[at_24][0], rtol=1e-5, atol=1e-7)
    bars = contribution_bars(hour)
    assert (bars["contribution"] > 0).all() and bars["contribution"].is_monotonic_decreasing
    named = [name for name, _ in drivers_at(hour, top=3)]
    assert named == top_drivers(hour.contributions.to_numpy(), list(hour.contributions.index), 3) and named


def test_the_replay_of_a_model_that_cannot_explain_here_has_no_why(fitted, hourly_parts, monkeypatch):
    import garlic.methods.summary as summary
    from garlic.app.replay import drivers_at, explain_hour, replay_stay

    monkeypatch.setattr(summary, "shap_installed", lambda: False)
    trained = saved(fitted["gbm"], hourly_parts["test"])
    hour = explain_hour(trained, replay_stay(trained, hourly_parts["test"], 0), 23)
    assert not hour.explained and drivers_at(hour) == []


def test_garlic_is_measured_the_same_way_by_its_built_in_signal_importance_of_each_cut_record(hourly_parts):
    """GARLIC trained on the same hours (one small epoch): its built-in signal importance at an hour is that of the
    record cut there, and the removal asks it again at that hour as it asks the baselines."""
    import torch

    from garlic.config import Config
    from garlic.data.batches import collate
    from garlic.explain.built_in import explain
    from garlic.methods.garlic import GarlicEstimator

    torch.manual_seed(0)
    config = Config.for_dataset("synthetic").override(
        {"hidden_dim": 8, "feature_dim": 4, "max_epochs": 1, "early_stopping": 1, "device": "cpu"}
    )
    garlic = GarlicEstimator.of_run(config).fit(hourly_parts["train"], hourly_parts["validation"])
    test = hourly_parts["test"]
    importance = row_signal_importance(garlic, test)
    times = test.prediction_times
    row = int(np.flatnonzero(times.time == 24)[0])
    cut = test.tensors.subset(np.array([times.stay[row]]))
    asked = PredictionTimes(np.zeros(1, np.int64), times.time[row : row + 1], times.label[row : row + 1])
    cut = replace(cut, task=asked)
    one = IrregularDataset(cut.cut_at_prediction_times(), test.normalisation)
    expected = explain(garlic.model, collate([one[0]]), list(test.tensors.variables)).signal.numpy()[0]
    np.testing.assert_allclose(importance[row], expected, rtol=1e-4, atol=1e-6)
    drops = removal_drops(garlic, test, np.arange(10), importance=importance)
    np.testing.assert_allclose(drops["risk"], garlic.predict_proba(test)[:10], rtol=1e-4, atol=1e-6)
    assert np.isfinite(drops[["drop_top", "drop_random", "drop_bottom"]].to_numpy()).all()


def test_the_live_ward_shows_an_hourly_garlics_drivers_by_integrated_gradients(hourly_parts):
    import pandas as pd
    import torch

    from garlic.config import Config
    from garlic.live.scoring import TOP_DRIVERS, BedScorer
    from garlic.methods.garlic import GarlicEstimator

    torch.manual_seed(1)
    config = Config.for_dataset("synthetic").override(
        {"hidden_dim": 8, "feature_dim": 4, "max_epochs": 1, "early_stopping": 1, "device": "cpu"}
    )
    garlic = GarlicEstimator.of_run(config).fit(hourly_parts["train"], hourly_parts["validation"])
    test = hourly_parts["test"]
    scorer = BedScorer(saved(garlic, test), hourly=True)
    assert scorer.contributes and not scorer.explains
    times = test.prediction_times
    rows = np.flatnonzero(times.stay == 0)
    asked = pd.DataFrame({"bed": "bed-0", "time": times.time[rows]})
    _, drivers = scorer.score(ward_readings(test, [0]), asked)
    importance = row_importance(garlic, test)[rows]
    np.testing.assert_array_equal(importance, row_gradients(garlic, test)[rows])
    assert drivers == [top_drivers(row, test.tensors.variables, TOP_DRIVERS) for row in importance] and all(drivers)


def test_integrated_gradients_drivers_add_up_to_the_logit_above_a_record_with_nothing_observed(hourly_parts):
    import torch

    from garlic.config import Config
    from garlic.data.batches import collate
    from garlic.methods.garlic import GarlicEstimator

    config = Config.for_dataset("synthetic").override({"max_epochs": 1, "hidden_dim": 8, "feature_dim": 4})
    garlic = GarlicEstimator.of_run(config, explain=False).fit(hourly_parts["train"], hourly_parts["validation"])
    test = hourly_parts["test"]
    rows = np.arange(0, len(test.prediction_times), 7)
    times = test.prediction_times
    asked = IrregularDataset(
        replace(test.tensors, task=PredictionTimes(times.stay[rows], times.time[rows], times.label[rows])),
        test.normalisation,
    )
    gradients = row_gradients(garlic, asked)
    assert gradients.shape == (len(rows), len(test.tensors.variables))
    cut = asked.tensors.cut_at_prediction_times()
    batch = collate([IrregularDataset(cut, test.normalisation)[position] for position in range(len(cut))])
    with torch.no_grad():
        logits = garlic.model(batch.values, batch.mask, batch.times, batch.lengths, batch.static).logits
        empty = garlic.model(batch.values * 0, batch.mask * 0, batch.times, batch.lengths, batch.static).logits
    # completeness (Riemann's middle rule, 16 steps: close, not exact); an unobserved variable gets nothing
    np.testing.assert_allclose(gradients.sum(axis=1), (logits - empty).numpy(), atol=0.05)
    never = ~cut.mask.any(axis=1)
    assert (gradients[never] == 0).all() and never.any()
