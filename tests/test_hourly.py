"""Tasks as prediction times: the tasks table, its tensors, the P19 ``hourly`` cohort, the hourly features and the
one training path on an hourly task."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from garlic.cli import main
from garlic.data.splits import load_splits
from garlic.io.tables import read_processed
from garlic.io.tensors import IrregularTensors, PredictionTimes, load_tensors, tensorize
from garlic.methods.hourly import STATISTICS, feature_names, hourly_features
from garlic.sources.physionet2019 import COLUMNS, HEADER, preprocess

VARIABLES = ["HR", "Temp"]


def _psv(rows: list[list[object]]) -> bytes:
    lines = [HEADER.decode()] + ["|".join("NaN" if v is None else str(v) for v in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def _row(hour: int, label: int, hr: float | None) -> list[object]:
    row: list[object] = [None] * len(COLUMNS)
    row[0] = hr
    row[COLUMNS.index("Age")], row[COLUMNS.index("Gender")], row[COLUMNS.index("HospAdmTime")] = 60, 1, -3.0
    row[-2], row[-1] = hour, label
    return row


def _stays(count: int, first_id: int, rng: np.random.Generator) -> dict[str, bytes]:
    """``count`` stays of 20-40 hours; every third becomes septic, its heart rate climbing from six hours before the
    label turns 1; hour 2 of every stay has no value (a prediction time with nothing new)."""
    files = {}
    for i in range(count):
        hours = range(1, int(rng.integers(20, 41)))
        onset = 14 if i % 3 == 0 else None
        rows = [
            _row(
                h,
                int(onset is not None and h >= onset),
                None if h == 2 else 80 + (5 * max(0, h - onset + 6) if onset else 0) + float(rng.normal(0, 2)),
            )
            for h in hours
        ]
        files[f"p{first_id + i:06d}.psv"] = _psv(rows)
    return files


@pytest.fixture(scope="module")
def hourly_root(tmp_path_factory) -> Path:
    """A data root with a small ``physionet2019-hourly`` dataset of 30 stays from each hospital system."""
    root = tmp_path_factory.mktemp("hourly")
    rng = np.random.default_rng(0)
    for name, first_id in (("training_setA", 1), ("training_setB", 100_001)):
        folder = root / "source" / name
        folder.mkdir(parents=True)
        for file, text in _stays(30, first_id, rng).items():
            (folder / file).write_bytes(text)
    preprocess(root / "source", root / "processed" / "physionet2019-hourly", cohort="hourly")
    return root


def test_hourly_cohort_asks_for_a_risk_at_every_row(hourly_root):
    dataset = read_processed(hourly_root / "processed" / "physionet2019-hourly")
    tasks, labels = dataset.tasks, dataset.labels
    stay = dataset.labels["stay_id"].iloc[0]
    raw = pd.read_csv(hourly_root / "source" / "training_setA" / f"p{stay:06d}.psv", sep="|")
    mine = tasks[tasks["stay_id"] == stay]
    assert mine["time"].tolist() == raw["ICULOS"].tolist()  # hour 2, with no value, is a prediction time too
    assert mine["label"].tolist() == raw["SepsisLabel"].tolist()
    assert len(tasks) == dataset.manifest["counts"]["prediction_times"]
    assert (tasks.groupby("stay_id")["label"].max().to_numpy() == labels["label"].to_numpy()).all()
    assert dataset.manifest["task"]["score"] == "sepsis-utility"
    assert dataset.manifest["split_strata"] == ["label", "hospital_system"]


def test_tasks_travel_with_the_tensors_through_cache_and_subset(hourly_root):
    folder = hourly_root / "processed" / "physionet2019-hourly"
    built = tensorize(read_processed(folder))
    first, cached = load_tensors(folder), load_tensors(folder)  # the second reads the cache the first wrote
    for tensors in (first, cached):
        assert tensors.task.score == "sepsis-utility"
        np.testing.assert_array_equal(tensors.task.time, built.task.time)
        np.testing.assert_array_equal(tensors.task.stay, built.task.stay)
    picked = np.array([5, 0, 40])
    subset = built.subset(picked)
    for new, old in enumerate(picked):
        np.testing.assert_array_equal(
            subset.task.time[subset.task.stay == new], built.task.time[built.task.stay == old]
        )
        np.testing.assert_array_equal(
            subset.task.label[subset.task.stay == new], built.task.label[built.task.stay == old]
        )
    assert np.all(np.diff(subset.task.stay) >= 0)


def test_a_dataset_without_tasks_asks_once_per_stay_at_the_end_of_its_input():
    times = np.array([[0.0, 2.0, 5.0], [1.0, 0.0, 0.0]], dtype="float32")
    tensors = IrregularTensors(
        np.array([1, 2]),
        np.zeros((2, 3, 1), "float32"),
        np.ones((2, 3, 1), bool),
        times,
        np.array([3, 1]),
        np.zeros((2, 0), "float32"),
        np.array([0.0, 1.0], "float32"),
        ["x"],
        [],
    )
    at = tensors.prediction_times()
    assert at.stay.tolist() == [0, 1] and at.time.tolist() == [5.0, 1.0] and at.label.tolist() == [0.0, 1.0]


def test_splits_are_stratified_on_label_and_hospital(hourly_root):
    folder = hourly_root / "processed" / "physionet2019-hourly"
    tensors = load_tensors(folder)
    split = load_splits(folder, tensors, "five-split")[0]
    for part in ("validation", "test"):
        ids = getattr(split, part)
        septic = tensors.labels[np.searchsorted(tensors.stay_ids, ids)] == 1
        systems = np.where(ids >= 100_001, "B", "A")
        # 60 stays, a fifth in each of 4 strata of 10 and 20: every stratum appears in a part of 6
        assert {(s, bool(y)) for s, y in zip(systems, septic)} == {("A", True), ("A", False), ("B", True), ("B", False)}


def _oracle(tensors: IrregularTensors, stay: int, time: float) -> np.ndarray:
    """The per-variable statistics of one prediction time, from the definition, one variable at a time."""
    steps = tensors.lengths[stay]
    out = []
    for statistic in STATISTICS:
        for d in range(len(tensors.variables)):
            seen = [
                (t, v)
                for t, v, m in zip(
                    tensors.times[stay, :steps], tensors.values[stay, :steps, d], tensors.mask[stay, :steps, d]
                )
                if m and t <= time
            ]
            window = {h: [v for t, v in seen if t > time - h] for h in (6, 24)}
            value = {
                "last": seen[-1][1] if seen else np.nan,
                "hours_since": time - seen[-1][0] if seen else np.nan,
                "count": len(seen),
                "change": seen[-1][1] - seen[-2][1] if len(seen) > 1 else np.nan,
                "mean_6h": np.mean(window[6]) if window[6] else np.nan,
                "mean_24h": np.mean(window[24]) if window[24] else np.nan,
                "std_24h": np.std(window[24]) if window[24] else np.nan,
            }[statistic]
            out.append(value)
    return np.array(out)


def test_hourly_features_equal_their_definition_on_random_stays(monkeypatch):
    monkeypatch.setattr("garlic.methods.hourly.CHUNK_STAYS", 3)  # several chunks, one of them partly empty
    rng = np.random.default_rng(1)
    n, t = 8, 12
    lengths = rng.integers(1, t + 1, n)
    times = np.sort(rng.choice(np.arange(0, 60, 0.5), (n, t)), axis=1).astype("float32")
    times[np.arange(t)[None, :] >= lengths[:, None]] = 0
    mask = (rng.random((n, t, 2)) < 0.6) & (np.arange(t)[None, :, None] < lengths[:, None, None])
    values = np.where(mask, rng.normal(80, 10, (n, t, 2)), 0).astype("float32")
    stay = np.repeat(np.arange(n), 5)
    when = rng.uniform(-1, 62, len(stay)).astype("float32")
    order = np.lexsort((when, stay))
    task = PredictionTimes(stay[order], when[order], np.zeros(len(stay), "float32"))
    tensors = IrregularTensors(
        np.arange(n),
        values,
        mask,
        times,
        lengths,
        rng.normal(size=(n, 1)).astype("float32"),
        np.zeros(n, "float32"),
        VARIABLES,
        ["Age"],
        task,
    )
    features = hourly_features(tensors)
    assert features.shape == (len(stay), len(feature_names(tensors)))
    per_variable = len(STATISTICS) * len(VARIABLES)
    for row, (s, time) in enumerate(zip(task.stay, task.time)):
        np.testing.assert_allclose(features[row, :per_variable], _oracle(tensors, s, time), rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(features[:, -1], task.time)
    np.testing.assert_array_equal(features[:, -2], tensors.static[task.stay, 0])


@pytest.fixture(scope="module")
def hourly_run(hourly_root, tmp_path_factory):
    """``garlic train --method hourly_logreg`` on split 0 of the small hourly dataset: (store, run id)."""
    store = tmp_path_factory.mktemp("hourly-store")
    main(
        [
            "--data-root",
            str(hourly_root),
            "--mlruns",
            str(store),
            "train",
            "--dataset",
            "physionet2019-hourly",
            "--split",
            "0",
            "--method",
            "hourly_logreg",
        ]
    )
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    (run_id,) = mlflow.search_runs(search_all_experiments=True, filter_string="metrics.threshold >= 0")["run_id"]
    return store, run_id


def test_a_per_stay_method_is_refused_on_an_hourly_task(hourly_root, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            [
                "--data-root",
                str(hourly_root),
                "--mlruns",
                str(tmp_path / "mlruns"),
                "train",
                "--dataset",
                "physionet2019-hourly",
                "--split",
                "0",
                "--method",
                "logreg",
            ]
        )
    assert "asks for a risk at each of its prediction times" in capsys.readouterr().err


def test_the_utility_target_is_where_an_alarm_gains_weighted_by_the_gain_and_needs_a_utility_task(
    hourly_root, tmp_path, capsys
):
    from garlic.data.batches import IrregularDataset
    from garlic.methods.hourly import HourlyModel

    folder = hourly_root / "processed" / "physionet2019-hourly"
    tensors = load_tensors(folder)
    dataset = IrregularDataset(tensors, load_splits(folder, tensors, "five-split")[0].normalisation)
    model = HourlyModel("gbm", target="utility")
    targets, weights = model.targets(dataset), model.sample_weights(dataset)
    times = dataset.prediction_times
    checked = 0
    for stay in np.unique(times.stay):
        rows = np.flatnonzero(times.stay == stay)
        hour = np.arange(len(rows))
        if times.label[
            rows
        ].any():  # onset 6 h after the first labelled hour; alarms gain from 12 h before to 3 h after
            r = hour - (np.argmax(times.label[rows]) + 6)
            np.testing.assert_array_equal(targets[rows], (r > -12) & (r <= 3))
            np.testing.assert_array_equal(weights[rows] == 0, (r == -12) | (r > 3))
            np.testing.assert_allclose(weights[rows][r < -12], 0.05)
            checked += 1
        else:
            assert not targets[rows].any() and np.allclose(weights[rows], 0.05)
    assert checked > 5
    model.fit(dataset, dataset)
    assert model.name == "hourly_gbm_utility" and model.chosen_["validation_auroc"] > 0.5
    # GARLIC learns the same targets: its weighted loss ignores the hours of weight 0 and weighs the others.
    from garlic.config import Config
    from garlic.data.batches import collate
    from garlic.models.architectures import build_model
    from garlic.models.network_config import NetworkConfig
    from garlic.training.losses import stage_losses

    recast = dataset.with_utility_targets()
    np.testing.assert_array_equal(recast.targets.numpy(), targets)
    np.testing.assert_allclose(recast.target_weights.numpy(), weights, rtol=1e-6)
    config = Config.for_dataset("physionet2019-hourly").override({"hidden_dim": 8, "feature_dim": 4})
    torch.manual_seed(0)
    network = build_model(len(tensors.variables), len(tensors.static_features), NetworkConfig.from_run(config)).eval()
    batch = collate([recast[position] for position in range(8)])

    def bce() -> float:
        with torch.no_grad():
            return float(stage_losses(network, batch, config)["bce"])

    before = bce()
    unweighted = batch.queries.weights == 0
    assert unweighted.any() and (~unweighted).any()
    batch.queries.labels[unweighted] = 1 - batch.queries.labels[unweighted]
    assert bce() == pytest.approx(before, rel=1e-6)
    batch.queries.labels[~unweighted] = 1 - batch.queries.labels[~unweighted]
    assert bce() != pytest.approx(before, rel=1e-3)
    # On a task not scored by the utility it is refused before anything is trained.
    for asked in (["--method", "hourly_gbm_utility"], ["--set", "hourly_target=utility"]):
        with pytest.raises(SystemExit):
            main(
                [
                    "--data-root",
                    str(hourly_root),
                    "--mlruns",
                    str(tmp_path / "mlruns"),
                    "train",
                    "--dataset",
                    "synthetic",
                    *asked,
                ]
            )
        assert "learns the sepsis-utility score, but this dataset's task is scored by its labels alone" in (
            capsys.readouterr().err
        )


def test_hourly_training_path_logs_a_risk_per_prediction_time(hourly_root, hourly_run, tmp_path, capsys, monkeypatch):
    store, run_id = hourly_run
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    predictions = pd.read_csv(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="predictions/test.csv"))
    folder = hourly_root / "processed" / "physionet2019-hourly"
    tasks = read_processed(folder).tasks
    test = load_splits(folder, load_tensors(folder), "five-split")[0].test
    expected = tasks[tasks["stay_id"].isin(test)].reset_index(drop=True)
    assert list(predictions.columns) == ["stay_id", "time", "label", "risk"]
    pd.testing.assert_frame_equal(predictions[["stay_id", "time", "label"]], expected, check_dtype=False)
    metrics = mlflow.get_run(run_id).data.metrics
    assert 0 <= metrics["threshold"] <= 1 and -2 <= metrics["test_utility"] <= 1

    # The run's model on the test stays' own record files, as the Challenge's files: the same utility
    records = tmp_path / "records"
    records.mkdir()
    for stay in test:
        system = "training_setA" if stay < 100_001 else "training_setB"
        shutil.copy(hourly_root / "source" / system / f"p{stay:06d}.psv", records)
    main(
        [
            "--mlruns",
            str(store),
            "predict",
            "--run",
            run_id,
            "--hourly",
            "--input",
            str(records),
            "--output",
            str(tmp_path / "predictions"),
        ]
    )
    assert "wrote the top drivers of its" in capsys.readouterr().err
    main(["score-utility", "--labels", str(records), "--predictions", str(tmp_path / "predictions")])
    names, values = capsys.readouterr().out.strip().splitlines()
    # The files' alarms are the run's alert policy's (chosen on validation): its utility, and per alert its scores.
    assert 0 < metrics["alert_threshold"] <= 1 and metrics["alert_quiet_hours"] == 24
    assert float(values.split("|")[names.split("|").index("Utility")]) == pytest.approx(metrics["test_alert_utility"])
    main(["score-alerts", "--labels", str(records), "--predictions", str(tmp_path / "predictions")])
    names, values = capsys.readouterr().out.strip().splitlines()
    scored = dict(zip(names.split("|"), map(float, values.split("|"))))
    for name, metric in (
        ("Sensitivity", "sensitivity"),
        ("PPV", "ppv"),
        ("Alerts per 100 patient-days", "alerts_per_100_days"),
    ):
        assert scored[name] == pytest.approx(metrics[f"test_alert_{metric}"], rel=1e-5, nan_ok=True)
    # The bare threshold, as the Challenge scores it, given as a policy with no band, quiet hours or margin
    main(
        [
            "--mlruns",
            str(store),
            "predict",
            "--run",
            run_id,
            "--hourly",
            "--input",
            str(records),
            "--output",
            str(tmp_path / "bare"),
            "--threshold",
            str(metrics["threshold"]),
            "--band",
            "0",
            "--quiet-hours",
            "0",
            "--margin",
            "0",
        ]
    )
    capsys.readouterr()
    main(["score-utility", "--labels", str(records), "--predictions", str(tmp_path / "bare")])
    names, values = capsys.readouterr().out.strip().splitlines()
    assert float(values.split("|")[names.split("|").index("Utility")]) == pytest.approx(metrics["test_utility"])
    # Every hour the policy alarms at, and only those, with the variables that raised its risk (logistic
    # regression explains)
    drivers = pd.read_csv(tmp_path / "predictions" / "alarm-drivers.csv", keep_default_na=False)
    alarmed = set()
    for stay in test:
        hours = pd.read_csv(records / f"p{stay:06d}.psv", sep="|")["ICULOS"].to_numpy()
        alarms = pd.read_csv(tmp_path / "predictions" / f"p{stay:06d}.psv", sep="|")["PredictedLabel"].to_numpy()
        alarmed |= {(int(stay), float(hour)) for hour in hours[alarms == 1]}
    assert list(drivers.columns) == ["stay_id", "time", "risk", "drivers"] and len(drivers) == len(alarmed) > 0
    assert set(zip(drivers["stay_id"].astype(int), drivers["time"].astype(float))) == alarmed
    assert {name for text in drivers["drivers"] for name in text.split(", ") if name} <= {"HR", "Temp"}
    assert (drivers["drivers"] != "").any()
    # A model that cannot explain here (as boosting without shap) writes its predictions and says why, once
    from garlic.methods.summary import ChosenClassifier

    monkeypatch.setattr(ChosenClassifier, "explanation_unavailable", property(lambda self: "shap is not installed"))
    main(
        [
            "--mlruns",
            str(store),
            "predict",
            "--run",
            run_id,
            "--hourly",
            "--input",
            str(records),
            "--output",
            str(tmp_path / "unexplained"),
        ]
    )
    said = capsys.readouterr().err
    assert said.count("hourly_logreg gives no drivers of its alarms: shap is not installed") == 1
    assert not (tmp_path / "unexplained" / "alarm-drivers.csv").exists()
    assert len(list((tmp_path / "unexplained").glob("p*.psv"))) == len(test)
    # A policy setting out of its range: one line naming it, nothing written
    with pytest.raises(SystemExit):
        main(
            [
                "--mlruns",
                str(store),
                "predict",
                "--run",
                run_id,
                "--hourly",
                "--input",
                str(records),
                "--output",
                str(tmp_path / "refused"),
                "--band",
                "1.5",
            ]
        )
    assert "alert policy: band must be a share of the threshold in [0, 1), got 1.5" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def test_the_floor_is_saved_and_predicts_hourly(hourly_root, tmp_path, capsys):
    store = tmp_path / "store"
    main(
        [
            "--data-root",
            str(hourly_root),
            "--mlruns",
            str(store),
            "train",
            "--dataset",
            "physionet2019-hourly",
            "--split",
            "0",
            "--method",
            "alarm_after_hour",
        ]
    )
    run_id = capsys.readouterr().out.split("(run ")[1].split(")")[0]
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    after = float(mlflow.get_run(run_id).data.params["chosen_after_hour"])
    records = tmp_path / "records"
    records.mkdir()
    for name in sorted((hourly_root / "source" / "training_setA").iterdir())[:3]:
        shutil.copy(name, records)
    main(
        [
            "--mlruns",
            str(store),
            "predict",
            "--run",
            run_id,
            "--hourly",
            "--input",
            str(records),
            "--output",
            str(tmp_path / "predictions"),
        ]
    )
    for written in sorted((tmp_path / "predictions").iterdir()):
        risks = pd.read_csv(written, sep="|")["PredictedProbability"].to_numpy()
        hours = np.arange(1, len(risks) + 1)  # ICULOS of these records: 1, 2, ...
        np.testing.assert_array_equal(risks, (hours >= after).astype(float))


def test_the_dashboard_replays_an_hourly_run_with_its_threshold_and_the_onset(hourly_root, hourly_run, monkeypatch):
    from streamlit import config as streamlit_config
    from streamlit.testing.v1 import AppTest

    store, run_id = hourly_run
    folder = hourly_root / "processed" / "physionet2019-hourly"
    labels = read_processed(folder).labels.set_index("stay_id")
    test = load_splits(folder, load_tensors(folder), "five-split")[0].test
    septic = next(int(stay) for stay in test if labels.loc[stay, "label"] == 1)
    monkeypatch.delenv("GARLIC_DASHBOARD_TOKEN", raising=False)
    page = Path(__file__).resolve().parents[1] / "garlic" / "app" / "dashboard.py"
    monkeypatch.setattr(
        sys, "argv", [str(page), "--mlruns", str(store), "--data-root", str(hourly_root), "--run", run_id]
    )
    before = streamlit_config.get_option("server.address")
    streamlit_config.set_option("server.address", "127.0.0.1")  # as `garlic dashboard` serves it
    try:
        at = AppTest.from_file(str(page), default_timeout=60)
        at.query_params = {"stay": str(septic)}
        at.run()
    finally:
        streamlit_config.set_option("server.address", before)
    assert not at.exception
    assert any("the run's, chosen on its validation stays by utility" in c.value for c in at.sidebar.caption)
    assert any("Per alert, under its policy" in m.value for m in at.markdown)  # the model view's burden
    onset = labels.loc[septic, "first_septic_hour"] + 6
    assert any(c.value.startswith(f"Sepsis onset at hour {onset:g}") for c in at.caption)
    assert any("Sepsis Challenge's utility on the test stays" in m.value for m in at.markdown)
    # Its logistic regression explains the hour by its variables' contributions (test_drivers checks the values)
    assert any(
        "contribution to the risk's log-odds at this hour (coefficient x standardised value" in c.value
        for c in at.caption
    )
    assert not any("gives no explanation" in i.value for i in at.info)


def test_the_floor_alarms_from_the_training_hour_of_best_utility(hourly_root):
    from garlic.evaluation.fit_and_test import split_parts
    from garlic.methods.hourly import AlarmAfterHour
    from garlic.metrics.utility import normalised_utility, stay_lengths

    folder = hourly_root / "processed" / "physionet2019-hourly"
    tensors = load_tensors(folder)
    parts = split_parts(tensors, load_splits(folder, tensors, "five-split")[0])
    floor = AlarmAfterHour().fit(parts["train"], parts["validation"])
    train = parts["train"].prediction_times
    utility = {
        hour: normalised_utility(train.label, train.time >= hour, stay_lengths(train.stay))
        for hour in np.unique(train.time)
    }
    assert utility[floor.after_] == pytest.approx(max(utility.values()))
    test = parts["test"].prediction_times
    np.testing.assert_array_equal(floor.predict_proba(parts["test"]), (test.time >= floor.after_).astype(float))


def test_the_replay_asks_an_hourly_model_at_each_hour(hourly_root):
    from garlic.app.replay import method_risk_curve
    from garlic.config import Config
    from garlic.evaluation.fit_and_test import split_parts
    from garlic.methods.hourly import HourlyModel
    from garlic.methods.saved import SavedMethod

    folder = hourly_root / "processed" / "physionet2019-hourly"
    tensors = load_tensors(folder)
    split = load_splits(folder, tensors, "five-split")[0]
    parts = split_parts(tensors, split)
    model = HourlyModel("logreg").fit(parts["train"], parts["validation"])
    saved = SavedMethod(
        "hourly_logreg", model, Config(), tensors.variables, tensors.static_features, split.normalisation
    )
    test = parts["test"]
    risks = model.predict_proba(test)
    one = test.tensors.subset(np.array([0]))
    asked = test.prediction_times.time[test.prediction_times.stay == 0]
    curve = method_risk_curve(saved, replace(one, task=None), asked)
    np.testing.assert_allclose(curve, risks[test.prediction_times.stay == 0], rtol=1e-5)  # float32 sums' order


@pytest.mark.parametrize("target", ["label", "utility"])
def test_garlic_trains_on_every_hour_and_is_tested_by_utility(hourly_root, tmp_path, capsys, target):
    main(
        [
            "--data-root",
            str(hourly_root),
            "--mlruns",
            str(tmp_path / "mlruns"),
            "train",
            "--dataset",
            "physionet2019-hourly",
            "--split",
            "0",
            "--set",
            "max_epochs=1",
            "--set",
            "hidden_dim=8",
            "--set",
            "feature_dim=4",
            "--set",
            f"hourly_target={target}",
        ]
    )
    run_id = capsys.readouterr().out.split("(run ")[1].split(",")[0]
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    predictions = pd.read_csv(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="predictions/test.csv"))
    folder = hourly_root / "processed" / "physionet2019-hourly"
    test = load_splits(folder, load_tensors(folder), "five-split")[0].test
    assert len(predictions) == read_processed(folder).tasks["stay_id"].isin(test).sum()
    assert predictions["risk"].nunique() > len(test)  # a risk of its own at each hour, not one per stay
    assert "test_utility" in mlflow.get_run(run_id).data.metrics


def test_garlic_trained_on_whole_stays_answers_each_hour_on_the_record_cut_there(hourly_root):
    from garlic.config import Config
    from garlic.evaluation.fit_and_test import split_parts
    from garlic.data.batches import IrregularDataset
    from garlic.methods.garlic import GarlicEstimator, WholeStaysGarlic, whole_stays

    folder = hourly_root / "processed" / "physionet2019-hourly"
    tensors = load_tensors(folder)
    parts = split_parts(tensors, load_splits(folder, tensors, "five-split")[0])
    config = Config().override(
        {"dataset": "physionet2019-hourly", "max_epochs": 1, "hidden_dim": 8, "feature_dim": 4, "device": "cpu"}
    )
    whole = WholeStaysGarlic.of_run(config, explain=False).fit(parts["train"], parts["validation"])
    per_stay = GarlicEstimator.of_run(config, explain=False).fit(
        whole_stays(parts["train"]), whole_stays(parts["validation"])
    )
    fitted = whole.model.state_dict()
    assert all(torch.equal(fitted[key], value) for key, value in per_stay.model.state_dict().items())  # the same fit
    test = parts["test"]
    risks = whole.predict_proba(test)
    assert len(risks) == len(test.prediction_times)
    times = test.prediction_times
    for row in (0, len(times) // 2, len(times) - 1):  # the per-stay model on the stay cut at that time
        stay = test.tensors.subset(np.array([times.stay[row]]))
        cut = replace(
            stay, task=PredictionTimes(np.zeros(1, np.int64), times.time[row : row + 1], times.label[row : row + 1])
        ).cut_at_prediction_times()
        np.testing.assert_allclose(
            risks[row], per_stay.predict_proba(IrregularDataset(cut, test.normalisation)), rtol=1e-5
        )


def test_the_early_warning_table_is_remade_from_its_archive_alone(hourly_root, tmp_path):
    from experiments import early_warning

    out = tmp_path / "out"
    arguments = [
        "--data-root",
        str(hourly_root),
        "--out",
        str(out),
        "--protocols",
        "cross-hospital",
        "--methods",
        "hourly_logreg",
        "alarm_after_hour",
    ]
    early_warning.main([*arguments, "--mlruns", str(tmp_path / "store")])
    made = {name: (out / name).read_text() for name in ("early-warning.md", "early-warning.csv")}
    assert "| hourly_logreg | cross-hospital | 2 |" in made["early-warning.md"]
    assert "| hourly_logreg | alarm_after_hour | cross-hospital | 2 |" in made["early-warning.md"]
    # Each unit's validation utility (what a search compares) is that of its validation predictions at its threshold.
    import mlflow

    from garlic.metrics.utility import normalised_utility, stay_lengths
    from garlic.tracking.queries import test_predictions

    kept = pd.read_csv(out / "physionet2019-hourly-runs" / "runs.csv", dtype={"run_id": str})
    for row in kept.itertuples():
        validation = test_predictions(tmp_path / "store", row.run_id, "validation")
        threshold = mlflow.get_run(row.run_id).data.metrics["threshold"]  # runs.csv rounds it
        alarms = (validation["risk"] >= threshold).astype(int)
        assert row.validation_utility == pytest.approx(
            normalised_utility(validation["label"], alarms, stay_lengths(validation["stay_id"].to_numpy())), abs=1e-6
        )
    # Per alert: each unit's policy chosen on its validation stays, scored on its test stays as score-alerts would
    from garlic.evaluation import alerting

    assert "## Per alert, under the alert policy" in made["early-warning.md"]
    assert "| hourly_logreg | alarm_after_hour | cross-hospital | 2 | ppv |" in made["early-warning.md"]
    assert "## A new hospital's threshold" in made["early-warning.md"]
    for row in kept.itertuples():
        validation = test_predictions(tmp_path / "store", row.run_id, "validation")
        assert row.alert_threshold == pytest.approx(alerting.choose(validation).policy.threshold, rel=1e-5)
        test = test_predictions(tmp_path / "store", row.run_id)
        metrics = mlflow.get_run(row.run_id).data.metrics
        kept_stays = pd.read_csv(early_warning.parts_path(out, row.method, row.protocol, row.split, "alerts"))
        assert alerting.scores(alerting.as_parts(kept_stays))["ppv"] == pytest.approx(
            metrics["test_alert_ppv"], nan_ok=True
        )
        assert len(kept_stays) == test["stay_id"].nunique()
    sites = pd.read_csv(out / "physionet2019-hourly-runs" / "site-thresholds.csv")
    assert sorted(sites["policy"].unique()) == ["carried", "site-burden", "site-labelled"] and len(sites) == 12
    assert (out / "early-warning-burden-cross-hospital.png").stat().st_size > 10_000
    made |= {name: (out / name).read_text() for name in ("early-warning-alerts.csv", "early-warning-sites.csv")}
    early_warning.main([*arguments, "--mlruns", str(tmp_path / "empty-store"), "--no-train"])  # the store is gone
    assert {name: (out / name).read_text() for name in made} == made


def test_the_early_warning_table_trains_the_stacked_model_of_a_preset_and_pairs_it_with_the_best_boosting(
    hourly_root, tmp_path
):
    from experiments import early_warning

    out = tmp_path / "out"
    early_warning.main(
        ["--data-root", str(hourly_root), "--out", str(out), "--mlruns", str(tmp_path / "store")]
        + ["--protocols", "cross-hospital", "--methods", "hourly_gbm_utility"]
        + ["--stacked", "physionet2019-cpu-utility"]
    )
    made = (out / "early-warning.md").read_text()
    stacked = "hourly_stacked+physionet2019-cpu-utility"
    assert f"| {stacked} | cross-hospital | 2 |" in made
    assert f"| {stacked} | hourly_gbm_utility | cross-hospital | 2 |" in made  # paired with the best boosting
    kept = pd.read_csv(out / "physionet2019-hourly-runs" / "runs.csv")
    assert set(kept["method"]) == {"hourly_gbm_utility", stacked}
    import mlflow

    tags = [mlflow.get_run(run_id).data.tags for run_id in kept[kept["method"] == stacked]["run_id"]]
    assert {tag["method"] for tag in tags} == {"hourly_stacked"}


def test_the_hourly_speed_benchmark_fits_on_one_hospital_and_scores_every_hour(hourly_root, hourly_run, capsys):
    from experiments import benchmark_hourly

    benchmark_hourly.main(["--data-root", str(hourly_root), "--method", "hourly_logreg", "--threads", "1"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    hours = len(read_processed(hourly_root / "processed" / "physionet2019-hourly").tasks)
    assert line.startswith("hourly_logreg: fit on ") and f"scored {hours} hours of 60 stays in " in line, line
    # A trained run's saved model is asked the same hours, nothing fitted.
    store, run_id = hourly_run
    benchmark_hourly.main(["--data-root", str(hourly_root), "--run", run_id, "--mlruns", str(store), "--threads", "1"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"hourly_logreg (run {run_id}): loaded; scored {hours} hours of 60 stays in "), line
    with pytest.raises(SystemExit):
        benchmark_hourly.main(["--data-root", str(hourly_root), "--run", "0" * 32, "--mlruns", str(store)])
    assert f"{'0' * 32}' in the MLflow store" in capsys.readouterr().err.splitlines()[-1]


def test_the_boosting_screen_scores_a_setting_on_validation_as_the_method_fitted_with_it_would(hourly_root, capsys):
    import json

    from experiments import screen_hourly_boosting
    from garlic import studies
    from garlic.evaluation.fit_and_test import split_parts
    from garlic.methods.hourly import HourlyModel
    from garlic.methods.summary import BOOSTING_SETTINGS
    from garlic.metrics.utility import choose_threshold, stay_lengths

    settings = [json.dumps(setting) for setting in BOOSTING_SETTINGS]
    screen_hourly_boosting.main(
        [
            "--data-root",
            str(hourly_root),
            "--protocol",
            "five-split",
            "--split",
            "1",
            *(item for setting in settings for item in ("--setting", setting)),
        ]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [line["setting"] for line in lines] == list(BOOSTING_SETTINGS)
    assert lines[0]["weighted_validation_auroc"] != lines[1]["weighted_validation_auroc"]  # a choice to make
    # The method fits the same candidates and keeps the one of highest weighted validation AUROC: its validation
    # risks score as that candidate's line says.
    cohort = studies.load_cohort("physionet2019-hourly", hourly_root, "five-split", [1])
    parts = split_parts(cohort.tensors, cohort.splits[0])
    method = HourlyModel("gbm", target="utility").fit(parts["train"], parts["validation"])
    best = max(lines, key=lambda line: line["weighted_validation_auroc"])
    assert method.chosen_ == best["setting"] | {"validation_auroc": pytest.approx(best["weighted_validation_auroc"])}
    times = parts["validation"].prediction_times
    choice = choose_threshold(times.label, method.predict_proba(parts["validation"]), stay_lengths(times.stay))
    assert choice.normalised_utility == pytest.approx(best["validation_utility"])


def test_the_alert_faithfulness_study_measures_a_trained_hourly_run(hourly_root, hourly_run, tmp_path, capsys):
    from experiments import alert_faithfulness

    store, run_id = hourly_run
    out = tmp_path / "faithfulness.md"
    table = alert_faithfulness.main(
        [
            "--mlruns",
            str(store),
            "--runs",
            run_id,
            "--data-root",
            str(hourly_root),
            "--max-alerts",
            "40",
            "--out",
            str(out),
        ]
    )
    (row,) = table.to_dict("records")
    assert row["method"] == "hourly_logreg" and 0 < row["alerts"] <= 40 and row["risk"] >= row["threshold"]
    # Its only measured variable is HR: removing the top half removes HR, the bottom half too (half of one, rounded
    # up), and so does a random half: the three drops are one, each asked of a record left with nothing observed
    assert row["drop_top"] == pytest.approx(row["drop_random"]) == pytest.approx(row["drop_bottom"])
    text = out.read_text()
    assert text.splitlines()[2].startswith("`python -m experiments.alert_faithfulness --mlruns")
    assert "| hourly_logreg |" in text
    assert text in capsys.readouterr().out
    # Its rows beside it, which the early-warning table shows in a section of its own
    from experiments import early_warning

    kept = pd.read_csv(out.with_suffix(".csv"))
    assert kept["drop_top"].tolist() == pytest.approx([row["drop_top"]]) and kept["alerts"].tolist() == [row["alerts"]]
    section = early_warning.drivers_report(kept)
    assert "## Are an alert's drivers the ones the model needs?" in section
    assert f"| hourly_logreg | {row['split']} | {row['threshold']:.3f} | {row['alerts']:.0f} |" in section
    assert text.splitlines()[2].strip("`") in section and early_warning.drivers_report(pd.DataFrame()) == ""
    # A few stays read from the tables alone: the same stays and hours as in the whole cohort's tensors
    folder = hourly_root / "processed" / "physionet2019-hourly"
    tensors = load_tensors(folder)
    test = load_splits(folder, tensors, "five-split")[0].test
    few = alert_faithfulness.stays_of(folder, np.sort(test)[:4])
    whole = tensors.subset(np.flatnonzero(np.isin(tensors.stay_ids, np.sort(test)[:4])))
    np.testing.assert_array_equal(few.stay_ids, whole.stay_ids)
    np.testing.assert_array_equal(few.prediction_times().time, whole.prediction_times().time)
    small = alert_faithfulness.main(
        ["--mlruns", str(store), "--runs", run_id, "--data-root", str(hourly_root), "--max-stays", "4"]
    )
    assert 0 < small["alerts"].iloc[0] <= len(few.prediction_times())
    # Saved runs and models fitted afresh, measured in one table: the fitted rows first, then the runs'
    both = alert_faithfulness.main(
        ["--fit", "hourly_logreg", "--train-stays", "30", "--validation-stays", "6", "--mlruns", str(store)]
        + ["--runs", run_id, "--data-root", str(hourly_root), "--max-stays", "4"]
    )
    assert list(both["run"]) == ["fitted on 30 stays", run_id]
    assert both.iloc[1].to_dict() == pytest.approx(small.iloc[0].to_dict())
    # A study's unit records its data digest and split name as tags, and no split digest: read by name once the
    # data digest is checked
    from garlic.io.tables import read_manifest
    from garlic.tracking import run_contract

    unit = {
        "dataset": "physionet2019-hourly",
        "split": "five-split/split_0",
        "data_digest": run_contract.manifest_digest(read_manifest(folder)),
    }
    np.testing.assert_array_equal(alert_faithfulness.recorded_split("unit", unit, folder).test, test)
    with pytest.raises(run_contract.StaleRunDataError, match="is not the one run unit was trained on"):
        alert_faithfulness.recorded_split("unit", {**unit, "data_digest": "0" * 64}, folder)


def test_the_alert_faithfulness_study_fits_hourly_models_on_a_sample_where_no_run_saved_one(hourly_root, capsys):
    from experiments import alert_faithfulness

    folder = hourly_root / "processed" / "physionet2019-hourly"
    load_splits(folder, load_tensors(folder), "five-split")  # saved, as the first training on the dataset saves them
    table = alert_faithfulness.main(
        [
            "--fit",
            "hourly_logreg_utility",
            "hourly_logreg",
            "--data-root",
            str(hourly_root),
            "--train-stays",
            "30",
            "--validation-stays",
            "6",
            "--max-stays",
            "6",
        ]
    )
    assert list(table["method"]) == ["hourly_logreg_utility", "hourly_logreg"] and (table["alerts"] > 0).all()
    assert table["run"].eq("fitted on 30 stays").all() and table["split"].eq("five-split/split_0").all()
    # GARLIC of a preset, fitted on the same sample and measured alike, its drivers its built-in signal importance
    garlic = alert_faithfulness.main(
        ["--fit-presets", "physionet2019-cpu-utility", "--data-root", str(hourly_root)]
        + ["--train-stays", "30", "--validation-stays", "6", "--max-stays", "6"]
    )
    # measured twice, one fit: by its bedside drivers (integrated gradients) and by its built-in signal importance
    gradients, built_in = garlic.to_dict("records")
    assert gradients["method"] == "garlic+physionet2019-cpu-utility" and gradients["run"] == "fitted on 30 stays"
    assert built_in["method"] == "garlic+physionet2019-cpu-utility, built-in signal importance"
    for row in (built_in, gradients):
        assert row["alerts"] > 0 and row["risk"] >= row["threshold"]
        assert np.isfinite([row["drop_top"], row["drop_random"], row["drop_bottom"]]).all()
    assert built_in["threshold"] == gradients["threshold"] and built_in["risk"] == gradients["risk"]
    with pytest.raises(ValueError, match="--fit takes hourly_gbm, hourly_logreg and their _utility forms, got 'gbm'"):
        alert_faithfulness.main(["--fit", "gbm", "--data-root", str(hourly_root)])
    with pytest.raises(SystemExit):
        alert_faithfulness.main(["--runs", "abc"])
    assert "--runs needs --mlruns" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        alert_faithfulness.main(["--data-root", str(hourly_root)])
    assert "name the hourly models measured" in capsys.readouterr().err


def test_calibrate_sets_a_sites_threshold_that_predict_and_the_ward_read(hourly_root, hourly_run, tmp_path, capsys):
    import json

    from garlic.evaluation.alerting import policy_for

    store, run_id = hourly_run
    site = tmp_path / "site-b"
    site.mkdir()
    for name in sorted((hourly_root / "source" / "training_setB").iterdir()):
        shutil.copy(name, site)
    profile = tmp_path / "site-b.json"
    main(
        [
            "--mlruns",
            str(store),
            "calibrate",
            "--run",
            run_id,
            "--site",
            str(site),
            "--alerts-per-day",
            "0.5",
            "--profile",
            str(profile),
        ]
    )
    said = capsys.readouterr().out
    assert "chosen for at most 0.5 alerts per patient-day on 30 stays" in said, said
    written = json.loads(profile.read_text())
    assert (
        written["run"] == run_id and written["stays"] == 30 and written["scores_on_site"]["alerts_per_100_days"] <= 50
    )
    found = policy_for(run_id, store, profile)
    assert found.policy.threshold == written["policy"]["threshold"] and "site profile site-b.json" in found.chosen_by
    # predict --hourly with the profile: the site's own alarms stay within the burden asked
    main(
        [
            "--mlruns",
            str(store),
            "predict",
            "--run",
            run_id,
            "--hourly",
            "--input",
            str(site),
            "--output",
            str(tmp_path / "predictions"),
            "--profile",
            str(profile),
        ]
    )
    capsys.readouterr()
    main(["score-alerts", "--labels", str(site), "--predictions", str(tmp_path / "predictions")])
    names, values = capsys.readouterr().out.strip().splitlines()
    scored = dict(zip(names.split("|"), map(float, values.split("|"))))
    assert scored["Alerts per 100 patient-days"] == pytest.approx(written["scores_on_site"]["alerts_per_100_days"])
    # on the site's labels, by utility
    main(
        [
            "--mlruns",
            str(store),
            "calibrate",
            "--run",
            run_id,
            "--site",
            str(site),
            "--labelled",
            "--profile",
            str(tmp_path / "labelled.json"),
        ]
    )
    assert "chosen for the highest Challenge utility" in capsys.readouterr().out
    # Refused in one line, nothing written: no target or two, a burden no threshold meets, an empty site, another
    # run's profile, a damaged one
    refusals = [
        (["--alerts-per-day", "0.5", "--labelled"], "set the threshold for one target"),
        ([], "set the threshold for one target: --alerts-per-day X"),
        (["--alerts-per-day", "0"], "alerts per patient-day must be a number in (0, 24), got 0.0"),
        (["--sensitivity", "1.5"], "the sensitivity must be in (0, 1], got 1.5"),
        (["--alerts-per-day", "0.5", "--band", "2"], "alert policy: band must be a share"),
    ]
    for extra, message in refusals:
        with pytest.raises(SystemExit):
            main(
                [
                    "--mlruns",
                    str(store),
                    "calibrate",
                    "--run",
                    run_id,
                    "--site",
                    str(site),
                    "--profile",
                    str(tmp_path / "refused.json"),
                    *extra,
                ]
            )
        assert message in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit):
        main(
            [
                "--mlruns",
                str(store),
                "calibrate",
                "--run",
                run_id,
                "--site",
                str(empty),
                "--alerts-per-day",
                "1",
                "--profile",
                str(tmp_path / "refused.json"),
            ]
        )
    assert str(empty) in capsys.readouterr().err
    assert not (tmp_path / "refused.json").exists()
    other = tmp_path / "other.json"
    other.write_text(profile.read_text().replace(run_id, "0" * 32))
    damaged = tmp_path / "damaged.json"
    damaged.write_text(profile.read_text()[:40])
    for path, message in ((other, "a site profile for run '00000000"), (damaged, "damaged.json: not a site profile")):
        with pytest.raises(SystemExit):
            main(
                [
                    "--mlruns",
                    str(store),
                    "predict",
                    "--run",
                    run_id,
                    "--hourly",
                    "--input",
                    str(site),
                    "--output",
                    str(tmp_path / "refused"),
                    "--profile",
                    str(path),
                ]
            )
        assert message in capsys.readouterr().err


def test_the_goal_section_says_what_an_operating_point_misses_and_the_best_ppv_at_the_goals_sensitivity():
    from types import SimpleNamespace

    from experiments import early_warning

    within = SimpleNamespace(sensitivity=0.85, ppv=0.20, lead_median=4.0, alerts_per_100_days=25.0)
    assert early_warning.shortfalls(within, "within") == ["ppv 20.0% (goal >= 33%)", "lead_median 4.0 (goal >= 6)"]
    reached = SimpleNamespace(sensitivity=0.80, ppv=0.33, lead_median=6.0, alerts_per_100_days=30.0)
    assert early_warning.shortfalls(reached, "within") == []  # each goal's bound is met at the bound itself
    assert early_warning.shortfalls(within, "across") == ["ppv 20.0% (goal >= 25%)"]
    # Three thresholds over 10 septic stays and 2,400 hours (100 patient-days): sensitivity 0.9, 0.8, 0.5 with PPV
    # 0.2, 0.25, 0.5; the best PPV at sensitivity >= 0.8 is the middle one's, at 40 alerts per 100 patient-days
    curve = pd.DataFrame(
        {
            "threshold": [0.1, 0.2, 0.3],
            "stays": 100,
            "hours": 2400,
            "septic": 10,
            "alerts": [45, 40, 10],
            "true_alerts": [9, 10, 5],
            "detected": [9, 8, 5],
            "alerted": [40, 35, 10],
        }
    )
    assert early_warning.frontier(curve, 0.8) == pytest.approx((0.25, 40.0))
    assert np.isnan(early_warning.frontier(curve, 0.95)).all()  # no threshold reaches it


def test_the_stacked_model_is_the_boosting_with_garlics_log_odds_as_one_more_column(hourly_root, tmp_path):
    from garlic.config import Config
    from garlic.evaluation.fit_and_test import split_parts
    from garlic.methods import registry
    from garlic.methods.garlic import GarlicEstimator
    from garlic.methods.hourly import hourly_features
    from garlic.methods.saved import fitted_on, load_method, save_method

    folder = hourly_root / "processed" / "physionet2019-hourly"
    tensors = load_tensors(folder)
    parts = split_parts(tensors, load_splits(folder, tensors, "five-split")[0])
    config = Config().override(
        {"dataset": "physionet2019-hourly", "max_epochs": 1, "hidden_dim": 8, "feature_dim": 4, "device": "cpu"}
    )
    context = registry.MethodContext(config, pd.DataFrame())
    stacked = registry.method("hourly_stacked").create(context).fit(parts["train"], parts["validation"])
    assert stacked.target == "utility" and stacked.learns_score is not None
    # GARLIC inside is the one GARLIC's own entry fits from the same config: the same weights
    alone = registry.method("garlic").create(context).set_params(explain=False)
    alone.fit(parts["train"], parts["validation"])
    inside = stacked.garlic_.model.state_dict()
    assert all(torch.equal(inside[key], value) for key, value in alone.model.state_dict().items())
    test = parts["test"]
    features = stacked.features(test)
    np.testing.assert_array_equal(features[:, :-1], hourly_features(test.tensors))
    risk = np.clip(alone.predict_proba(test), 1e-6, 1 - 1e-6)
    np.testing.assert_allclose(features[:, -1], np.log(risk / (1 - risk)), rtol=1e-5, atol=1e-5)
    assert stacked.kept_[-1]  # the boosting reads GARLIC's column
    # Its drivers are the variables' only: GARLIC's column, like the hour, is no variable's
    groups = stacked.feature_groups(stacked.inputs_)
    assert groups[-1] == -1 and len(groups) == features.shape[1]
    contributions = stacked.contributions(test)
    assert contributions.shape == (len(test.prediction_times), len(tensors.variables))
    # Saved and read back: the boosting and GARLIC both, the same risks
    saved = save_method(tmp_path / "model", fitted_on("hourly_stacked", stacked, config, parts["train"]))
    assert (saved / "garlic" / "fitted.json").is_file()
    again = load_method(saved)
    np.testing.assert_allclose(again.method.predict_proba(test), stacked.predict_proba(test), rtol=1e-6)
    assert isinstance(again.method.garlic_, GarlicEstimator)
