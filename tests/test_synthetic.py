"""The seeded synthetic cohort: determinism, the planted structure really in the data, and the pipeline on it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from helpers import assert_frames_equal
from garlic.data.splits import load_splits
from garlic.sources.synthetic import HOURS, LABS, PLANTED_GRAPH, SCALE, VARIABLES, VITALS, generate, simulate
from garlic.io.tables import read_processed
from garlic.io.tensors import load_tensors


@pytest.fixture(scope="module")
def cohort():
    return simulate(1000, seed=0)


def test_same_seed_same_cohort_other_seed_different():
    first, second, other = simulate(300, seed=5), simulate(300, seed=5), simulate(300, seed=6)
    for a, b in zip(first, second):
        assert_frames_equal(a, b)
    assert len(first[0]) != len(other[0]) or not np.array_equal(first[0]["value"], other[0]["value"])
    assert not np.array_equal(first[2]["label"], other[2]["label"])


def test_generate_writes_identical_tables_for_the_same_seed(tmp_path):
    generate(tmp_path / "one", n_stays=200, seed=1)
    generate(tmp_path / "two", n_stays=200, seed=1)
    one, two = read_processed(tmp_path / "one"), read_processed(tmp_path / "two")
    for name in ("observations", "static", "labels"):
        assert_frames_equal(getattr(one, name), getattr(two, name))
    assert one.manifest == two.manifest


def hourly_grid(observations: pd.DataFrame) -> np.ndarray:
    """[stays, hours 0..48, variables], NaN where nothing was observed in that hour."""
    ids = np.sort(observations["stay_id"].unique())
    grid = np.full((len(ids), HOURS + 1, len(VARIABLES)), np.nan)
    stay = np.searchsorted(ids, observations["stay_id"].to_numpy())
    hour = np.floor(observations["time"].to_numpy()).astype(int)
    variable = pd.Categorical(observations["variable"], categories=VARIABLES).codes
    grid[stay, hour, variable] = observations["value"].to_numpy()
    return grid


def partial_correlation(y: np.ndarray, x: np.ndarray, given: np.ndarray) -> float:
    r = np.corrcoef(np.vstack([y, x, given]))
    return (r[0, 1] - r[0, 2] * r[1, 2]) / np.sqrt((1 - r[0, 2] ** 2) * (1 - r[1, 2] ** 2))


def test_planted_edges_are_in_the_observations(cohort):
    """For each planted edge source -(lag)-> target, target(t) depends on source(t - lag) beyond the shared latent.

    Every variable feels the latent deterioration, so plain correlations are high everywhere. The test instead takes
    each variable X from another part of the graph as a competitor: the partial correlation of target(t) with
    source(t - lag) given X(t - lag) must be large, and that of target(t) with X(t - lag) given the source small.
    Labs are drawn at most every 4 hours, so an edge between two labs with a shorter lag is checked at the first
    lag the draws allow.
    """
    observations, _, _ = cohort
    grid = hourly_grid(observations)
    edges = [(e.source, e.target) for e in PLANTED_GRAPH]
    # Weakly connected parts of the planted graph, found here from the edge list.
    part = {v: v for v in VARIABLES}

    def root(v):
        while part[v] != v:
            v = part[v]
        return v

    for source, target in edges:
        part[root(source)] = root(target)
    for edge in PLANTED_GRAPH:
        s, t = VARIABLES.index(edge.source), VARIABLES.index(edge.target)
        lag = edge.lag_hours
        while True:
            y, x = grid[:, lag:, t].ravel(), grid[:, : HOURS + 1 - lag, s].ravel()
            if (~np.isnan(y) & ~np.isnan(x)).sum() >= 100:
                break
            lag += 1
        assert lag == edge.lag_hours or (edge.source in LABS and edge.target in LABS)
        edge_strength, competitor_strength = [], []
        for k, name in enumerate(VARIABLES):
            if root(name) == root(edge.target):
                continue
            z = grid[:, : HOURS + 1 - lag, k].ravel()
            ok = ~np.isnan(y) & ~np.isnan(x) & ~np.isnan(z)
            if ok.sum() < 50:  # e.g. a lab three hours before another lab: draws are at least 4 h apart
                continue
            edge_strength.append(abs(partial_correlation(y[ok], x[ok], z[ok])))
            competitor_strength.append(abs(partial_correlation(y[ok], z[ok], x[ok])))
        assert len(edge_strength) >= 3, edge
        assert min(edge_strength) > 0.5, edge
        assert min(edge_strength) > max(competitor_strength) + 0.15, (edge, edge_strength, competitor_strength)


def test_label_prevalence_and_association_with_the_loaded_variables(cohort):
    observations, _, labels = cohort
    for seed in (0, 1, 2):
        prevalence = simulate(500, seed)[2]["label"].mean()
        assert 0.10 <= prevalence <= 0.40, (seed, prevalence)
    assert 0.10 <= labels["label"].mean() <= 0.40
    # The outcome depends on the deterioration at 48 h: the directly loaded variables late in the stay show it.
    late = observations[observations["time"] >= HOURS - 12]
    means = late.groupby(["stay_id", "variable"], observed=True)["value"].mean().unstack()
    y = labels.set_index("stay_id")["label"]
    for name, direction in (("Lactate", 1), ("Creatinine", 1), ("Temp", 1), ("SysABP", -1)):
        known = means[name].dropna()
        auc = roc_auc_score(y.loc[known.index], direction * known)
        assert auc > 0.75, (name, auc)
    # ... and much more than the same variables at admission do.
    early = observations[observations["time"] < 6].groupby(["stay_id", "variable"], observed=True)["value"]
    early_lactate = early.mean().unstack()["Lactate"].dropna()
    late_auc = roc_auc_score(y.loc[means["Lactate"].dropna().index], means["Lactate"].dropna())
    assert roc_auc_score(y.loc[early_lactate.index], early_lactate) < late_auc - 0.1


def test_vitals_are_sampled_much_more_often_than_labs(cohort):
    observations, _, _ = cohort
    per_stay = observations.groupby(["stay_id", "variable"], observed=True).size().unstack(fill_value=0)
    vitals, labs = per_stay[VITALS].mean(), per_stay[LABS].mean()
    assert vitals.min() > 4 * labs.max(), (vitals, labs)
    assert vitals.min() > 0.6 * (HOURS + 1)  # about hourly, with dropouts
    gaps = observations.sort_values("time").groupby(["stay_id", "variable"], observed=True)["time"].diff()
    median_gap = gaps.groupby(observations["variable"]).median()
    assert median_gap[VITALS].max() < 1.5 and median_gap[LABS].min() >= 3.5
    assert observations["time"].between(0, HOURS).all()


def test_values_have_the_documented_clinical_scale(cohort):
    observations, _, _ = cohort
    spread = observations.groupby("variable", observed=True)["value"].agg(["mean", "std"])
    for name in VARIABLES:
        if name in ("GCS", "SaO2", "SpO2"):  # rounded or clipped to their ranges
            continue
        mean, std = SCALE[name]
        assert abs(spread.loc[name, "mean"] - mean) < 0.2 * std, name
        assert 0.8 * std < spread.loc[name, "std"] < 1.25 * std, name
    hr = observations.loc[observations["variable"] == "HR", "value"]
    assert hr.min() > 0
    gcs = observations.loc[observations["variable"] == "GCS", "value"]
    assert gcs.between(3, 15).all() and (gcs == gcs.round()).all()
    saturation = next(v for v in VARIABLES if v in ("SaO2", "SpO2"))  # capped at 100 %
    assert observations.loc[observations["variable"] == saturation, "value"].max() <= 100


def test_synthetic_cohort_flows_through_tensors_and_splits(tmp_path):
    manifest = generate(tmp_path, n_stays=400, seed=2)
    assert manifest["ground_truth_graph"] == [e.__dict__ for e in PLANTED_GRAPH]
    assert manifest["counts"]["stays"] == 400
    tensors = load_tensors(tmp_path)
    assert tensors.values.shape[0] == 400 and tensors.values.shape[2] == len(VARIABLES)
    assert tensors.variables == VARIABLES
    assert tensors.static_features == ["Age", "Gender", "Height", "ICUType", "Weight"]
    assert int(tensors.mask.sum()) == len(
        read_processed(tmp_path).observations.drop_duplicates(["stay_id", "time", "variable"])
    )
    splits = load_splits(tmp_path, tensors, "five-split")
    assert len(splits) == 5
    for split in splits:
        assert (len(split.train), len(split.validation), len(split.test)) == (320, 40, 40)
        assert split.normalisation.value_mean.shape == (len(VARIABLES),)


def test_the_hourly_cohort_asks_at_every_whole_hour_and_leaves_the_default_cohort_as_it_was(tmp_path):
    from garlic.data.datasets import preprocess

    name, folder, manifest = preprocess("synthetic", tmp_path, cohort="hourly", stays=40, seed=3)
    plain_name, plain_folder, plain = preprocess("synthetic", tmp_path, stays=40, seed=3)
    assert (name, plain_name) == ("synthetic-hourly", "synthetic")
    hourly, default = read_processed(folder), read_processed(plain_folder)
    assert_frames_equal(hourly.observations, default.observations)
    assert default.tasks is None and "cohort" not in plain and manifest["cohort"] == "hourly"
    tasks = hourly.tasks
    first = np.maximum(np.ceil(default.observations.groupby("stay_id")["time"].min()), 1)
    for stay, asked in tasks.groupby("stay_id"):
        assert asked["time"].tolist() == list(np.arange(first[stay], HOURS + 1, dtype=float))
    labels = default.labels.set_index("stay_id")["label"]
    assert (tasks["label"].to_numpy() == labels.loc[tasks["stay_id"]].to_numpy()).all()
    assert manifest["counts"]["prediction_times"] == len(tasks)
