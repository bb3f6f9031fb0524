"""The dashboard's logic without a page: replay, threshold, summary, and where its data come from."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import mlflow
import numpy as np
import pytest
import torch

from garlic.app import sources
from garlic.app.replay import (
    drivers_at,
    edges_at,
    explain_hour,
    observations_at,
    prefix_batch,
    replay_hours,
    replay_stay,
    risk_curve,
    signal_bars,
    signals_at,
)
from garlic.app.summary import (
    FALLING,
    NO_RECENT_READING,
    ONE_READING,
    RISING,
    STEADY,
    TRENDS,
    change_text,
    plain_summary,
    risk_change,
    risk_trend,
    value_direction,
)
from garlic.metrics.threshold import threshold_at_sensitivity
from garlic.config import Config
from garlic.data.batches import IrregularDataset, collate
from garlic.data.datasets import processed_folder
from garlic.models.compact import Garlic
from garlic.models.network_config import NetworkConfig
from garlic.tracking.store import RunNotFoundError, use_store
from garlic.training.losses import forward
from garlic.sources import physionet2019
from garlic.sources.physionet2012 import format_record
from garlic.sources.records import readers
from garlic.io.tables import DatasetNotFoundError, read_processed
from garlic.io.tensors import PredictionTimes
from helpers import TinyRun, run_without_model, tiny_run


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> TinyRun:
    return tiny_run(tmp_path_factory)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """As the dashboard runs: one small pass took 3 ms on one thread and 220 ms on two on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def loaded(run):
    trained, mlflow_run = sources.load_run(run.store, run.run_id)
    return trained, sources.test_split(trained, mlflow_run, run.data_root)


# ---------------------------------------------------------------------------------------------------------------
# Replay: hour h sees only the data up to h, the whole curve in one pass


def test_prefix_h_keeps_exactly_the_observations_up_to_h(loaded):
    _, test = loaded
    stay = test[0]
    steps = int(stay["lengths"])
    hours = replay_hours(float(stay["times"][steps - 1]))
    batch = prefix_batch(stay, hours)
    assert len(batch) == len(hours) and hours[0] == 1 and hours[-1] >= stay["times"][steps - 1]
    for row, hour in enumerate(hours):
        upto = stay["times"][:steps] <= hour
        assert int(batch.lengths[row]) == int(upto.sum())
        assert batch.mask[row].sum() == stay["mask"][:steps][upto].sum()
        assert not batch.mask[row, int(upto.sum()) :].any() and not batch.values[row, int(upto.sum()) :].any()


def risk_of_the_stay_cut_at(model: Garlic, stay: dict, hour: float) -> float:
    """The model run the ordinary way on the stay with only its observations up to ``hour``."""
    steps = int((stay["times"][: int(stay["lengths"])] <= hour).sum())
    cut = {
        **stay,
        "values": stay["values"][:steps],
        "mask": stay["mask"][:steps],
        "times": stay["times"][:steps],
        "lengths": torch.tensor(steps),
    }
    with torch.no_grad():
        return float(torch.sigmoid(forward(model.eval(), collate([cut])).logits))


def test_each_hour_of_the_curve_is_the_risk_of_the_stay_cut_at_that_hour(loaded, run):
    trained, test = loaded
    position = int(np.argmax(test.lengths.numpy()))
    replay = replay_stay(trained, test, position)
    observed = np.isfinite(replay.risk)
    expected = [risk_of_the_stay_cut_at(trained.model, replay.stay, hour) for hour in replay.hours[observed]]
    np.testing.assert_allclose(replay.risk[observed], expected, atol=1e-5)
    logged = sources.predictions(run.store, run.run_id, "test").set_index("stay_id")
    assert replay.risk[-1] == pytest.approx(logged.loc[replay.stay_id, "risk"], abs=1e-5)


@pytest.mark.parametrize(
    "variant",
    [
        {"use_static": True},
        {"use_gru": False, "use_decay": False, "window_size": 5},
        {"summary_branch": True, "use_static": True},
    ],
)
def test_the_one_pass_curve_holds_for_model_variants(loaded, variant):
    trained, test = loaded
    torch.manual_seed(0)
    model = Garlic(
        len(trained.variables), len(trained.static_features), NetworkConfig.from_run(Config().override(variant))
    )
    stay = test[0]
    hours = replay_hours(float(stay["times"][int(stay["lengths"]) - 1]))
    curve = risk_curve(model, stay, hours)
    observed = np.isfinite(curve)
    np.testing.assert_allclose(
        curve[observed], [risk_of_the_stay_cut_at(model, stay, h) for h in hours[observed]], atol=1e-5
    )


def test_an_hour_is_explained_on_the_stay_cut_at_that_hour(loaded):
    trained, test = loaded
    replay = replay_stay(trained, test, 0)
    observed = np.flatnonzero(np.isfinite(replay.risk))
    assert np.isnan(replay.risk[: observed[0]]).all() and (np.diff(observed) == 1).all()
    for index in (observed[0], len(replay.hours) - 1):
        hour = explain_hour(trained, replay, index)
        assert float(hour.explanation.risk[0]) == pytest.approx(replay.risk[index], abs=1e-5)
        table = observations_at(hour, trained)
        assert list(table.columns) == ["time", "variable", "value", "importance"]
        assert (table["time"] <= replay.hours[index]).all()
        assert table["importance"].sum() == pytest.approx(1.0, abs=1e-4)
        assert signals_at(hour).sum() == pytest.approx(1.0, abs=1e-4)
    assert list(signals_at(hour).index[:2]) == [name for name, _ in drivers_at(hour)]
    assert all(direction in (*TRENDS, ONE_READING, NO_RECENT_READING) for _, direction in drivers_at(hour))
    edges = edges_at(hour, top=5)
    assert len(edges) <= 5 and (edges["source"] != edges["target"]).all()
    assert edges["importance"].is_monotonic_decreasing


# ---------------------------------------------------------------------------------------------------------------
# Threshold and summary


def test_threshold_is_the_highest_that_meets_the_sensitivity():
    labels = np.array([1, 1, 1, 1, 1, 0, 0, 0])
    risk = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.65, 0.3, 0.1])
    threshold = threshold_at_sensitivity(labels, risk, 0.8)
    assert threshold == 0.6
    assert (risk[labels == 1] >= threshold).mean() >= 0.8 > (risk[labels == 1] > threshold).mean()
    assert threshold_at_sensitivity(labels, risk, 1.0) == 0.5
    with pytest.raises(ValueError, match="no positive"):
        threshold_at_sensitivity(np.zeros(3), np.ones(3))


def test_the_replay_gives_the_start_of_the_current_alert_under_the_policy():
    from garlic.app.replay import alert_start
    from garlic.metrics.alert_policy import AlertPolicy

    hours = np.arange(1, 8, dtype=float)
    risk = np.array([np.nan, 0.1, 0.5, 0.47, 0.2, 0.7, 0.7])
    alarms = AlertPolicy(0.5, band=0.1, quiet_hours=0, margin=0).alarms(risk, hours, [7])
    assert alert_start(hours, alarms, 0) is None
    assert alert_start(hours, alarms, 3) == 3.0  # 0.47 is within the band: the alert raised at hour 3 holds
    assert alert_start(hours, alarms, 4) is None
    assert alert_start(hours, alarms, 6) == 6.0
    quiet = AlertPolicy(0.5, band=0.1, quiet_hours=6, margin=0.5).alarms(risk, hours, [7])
    assert alert_start(hours, quiet, 6) is None  # cleared at hour 5: quiet, 0.7 is under 0.75


def test_plain_summary_reads_like_a_sentence():
    assert plain_summary(0.72, RISING, [("GCS", FALLING), ("BUN", RISING)]) == (
        "risk 0.72, rising; driven by falling GCS and rising BUN"
    )
    assert plain_summary(0.1, STEADY, [("HR", ONE_READING), ("Temp", STEADY), ("WBC", RISING)]) == (
        "risk 0.10, steady; driven by HR (one reading), steady Temp and rising WBC"
    )
    assert plain_summary(float("nan"), STEADY, []).startswith("no observation yet")


def test_trends_of_risk_and_values():
    risk = np.array([np.nan, 0.2, 0.21, 0.3, 0.5])
    assert risk_trend(risk, 4) == RISING and risk_trend(risk, 2) == STEADY and risk_trend(risk, 0) == STEADY
    assert risk_trend(risk[::-1].copy(), 3) == FALLING
    times = np.array([1.0, 5.0, 30.0, 40.0])
    assert value_direction(times, np.array([0.0, 3.0, 1.0, 0.2]), now=45) == FALLING  # only the last 24 h count
    assert value_direction(times, np.array([0.0, 3.0, 1.0, 1.1]), now=45) == STEADY
    assert value_direction(times, np.array([0.0, 3.0, 1.0, 1.1]), now=6) == RISING
    assert value_direction(times, np.zeros(4), now=2) == ONE_READING  # said, not left out ("Driven by HR, BUN.")
    assert value_direction(times, np.zeros(4), now=80) == NO_RECENT_READING


def test_the_risk_change_names_its_span_and_shows_no_arrow_for_nothing():
    risk = np.array([np.nan, np.nan, 0.2, 0.2, 0.201, 0.3, 0.3, 0.3, 0.3, 0.3, 0.25])
    assert risk_change(risk, 2) is None  # nothing earlier to compare with
    assert risk_change(risk, 4) == (pytest.approx(0.001), 2)  # from hour 3, the first with a risk
    assert risk_change(risk, 10) == (pytest.approx(0.049), 6)  # hour 11 against hour 5
    assert change_text(risk_change(risk, 4)) == ("no change in 2 h", False)  # not "↑ +0.00 in 6 h"
    assert change_text((0.01, 6)) == ("+0.01 in 6 h", False)  # steady, as the summary says
    assert change_text((-0.05, 6)) == ("-0.05 in 6 h", True)
    assert change_text(None) == (None, False)


def test_signal_bars_leave_out_variables_of_no_importance(loaded):
    trained, test = loaded
    replay = replay_stay(trained, test, 0)
    first = int(np.flatnonzero(np.isfinite(replay.risk))[0])
    hour = explain_hour(trained, replay, first)  # few variables observed yet: most have no importance
    assert (signals_at(hour) == 0).any()
    bars = signal_bars(hour)
    assert list(bars.columns) == ["variable", "importance"] and len(bars) > 0 and (bars["importance"] > 0).all()


# ---------------------------------------------------------------------------------------------------------------
# Sources: the store, the data root, uploads


def test_runs_with_models_lists_only_runs_that_logged_one(run):
    crashed = run_without_model(run.store)
    listed = [choice.run_id for choice in sources.runs_with_models(run.store)]
    assert run.run_id in listed and crashed not in listed
    with pytest.raises(RunNotFoundError, match="no model"):
        sources.load_run(run.store, crashed)
    with mlflow.start_run(run_name="not garlic") as other:
        mlflow.log_dict({"something": "else"}, "model/model.json")
    with pytest.raises(RunNotFoundError, match="cannot be loaded"):
        sources.load_run(run.store, other.info.run_id)
    with pytest.raises(RunNotFoundError, match="no MLflow store"):
        sources.runs_with_models(run.store.parent / "elsewhere")


def test_run_labels_fit_the_sidebar_and_the_details_name_split_and_run(run):
    (choice,) = [c for c in sources.runs_with_models(run.store) if c.run_id == run.run_id]
    assert len(choice.label) <= 36 and choice.label.startswith("synthetic · AUROC ")  # was cut off at 60+
    assert "five-split/split_0" in choice.details and run.run_id in choice.details


def test_a_split_that_leaves_the_data_root_is_refused(loaded, run, tmp_path):
    trained, _ = loaded
    folder = processed_folder("synthetic", run.data_root)
    outside = run.data_root.parent / "outside"  # a split file the page must not read, though it is a good one
    outside.mkdir(exist_ok=True)
    (outside / "split_0.json").write_text((folder / "splits" / "five-split" / "split_0.json").read_text())
    climbing = "/".join([".."] * 4) + "/outside/split_0"
    assert (folder / "splits" / f"{climbing}.json").resolve() == (outside / "split_0.json").resolve()
    forged = SimpleNamespace(
        info=SimpleNamespace(run_id="forged"), data=SimpleNamespace(params={"dataset": "synthetic", "split": climbing})
    )
    with pytest.raises((ValueError, sources.OutsideFoldersError)) as refused:  # not a split name, or outside
        sources.test_split(trained, forged, run.data_root)
    assert str(run.data_root) not in str(refused.value)
    linked = folder / "splits" / "linked"  # a link out of the folder is refused too
    linked.symlink_to(outside, target_is_directory=True)
    try:
        forged.data.params["split"] = "linked/split_0"  # a well-formed name, whose file lies outside
        with pytest.raises(sources.OutsideFoldersError, match="outside the configured folders"):
            sources.test_split(trained, forged, run.data_root)
    finally:
        linked.unlink()


def test_a_run_whose_artifacts_live_outside_the_store_is_refused(run, tmp_path):
    use_store(run.store)
    elsewhere = mlflow.MlflowClient().create_experiment("elsewhere", artifact_location=(tmp_path / "x").as_uri())
    with mlflow.start_run(experiment_id=elsewhere) as foreign:
        mlflow.log_text("stay_id,label,risk\n1,0,0.5\n", "predictions/test.csv")
    assert (tmp_path / "x").is_dir()  # MLflow itself would read it from there
    for read in (
        lambda: sources.load_run(run.store, foreign.info.run_id),
        lambda: sources.predictions(run.store, foreign.info.run_id, "test"),
        lambda: sources.artifact_bytes(run.store, foreign.info.run_id, "predictions/test.csv"),
    ):
        with pytest.raises(sources.OutsideFoldersError):
            read()


def test_messages_for_the_page_hold_no_server_paths(tmp_path):
    store, data = tmp_path / "mlruns", tmp_path / "data"
    message = (
        f"no MLflow store at {store} (no mlflow.db); split missing under {data}/processed/synthetic; "
        f"see {tmp_path}/other/file.json or file://{store}/artifacts/x"
    )
    plain = sources.without_paths(message, {"STORE": store, "DATA": data})
    assert str(tmp_path) not in plain and "/tmp" not in plain
    assert "no MLflow store at STORE" in plain and "under DATA/processed/synthetic" in plain
    assert "…/file.json" in plain and "STORE/artifacts/x" in plain


def test_test_split_is_read_from_the_configured_data_root(loaded, run, tmp_path):
    trained, test = loaded
    logged = sources.predictions(run.store, run.run_id, "test")
    np.testing.assert_array_equal(test.stay_ids, logged["stay_id"])
    _, mlflow_run = sources.load_run(run.store, run.run_id)
    with pytest.raises(DatasetNotFoundError):
        sources.test_split(trained, mlflow_run, tmp_path)


def test_an_uploaded_record_replays_like_the_same_stay_from_the_test_split(loaded, run):
    trained, test = loaded
    stay_id = int(test.stay_ids[0])
    tables = read_processed(processed_folder("synthetic", run.data_root))
    observations = tables.observations[tables.observations["stay_id"] == stay_id]
    static = tables.static.set_index("stay_id").loc[stay_id].to_dict()
    record = format_record(stay_id, observations, static).encode()
    uploaded = replay_stay(trained, sources.read_upload(f"{stay_id}.txt", record, trained), 0)
    np.testing.assert_allclose(uploaded.risk, replay_stay(trained, test, 0).risk, atol=1e-4)


P12_HEADER = "Time,Parameter,Value\n00:00,RecordID,132539\n"


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("../../132539.txt", b"", "132539.txt line 1: expected header"),  # the folders are dropped
        ("notes.txt", P12_HEADER.encode(), "not a record file name"),
        ("132539.csv", P12_HEADER.encode(), "not a record file name"),
        ("132539.txt", b"\x00\xff garbage", "expected header"),
        ("132539.txt", (P12_HEADER + "00:10,HeartRate,80\n").encode(), "unknown parameter 'HeartRate'"),
        ("132539.txt", (P12_HEADER + "00:10,HR,eighty\n").encode(), "unparseable value"),
        ("132539.txt", (P12_HEADER + "00:10,ALP,80\n").encode(), "variables the model does not know: ['ALP']"),
        ("132539.txt", (P12_HEADER + "49:00,HR,80\n").encode(), "no observation"),
        ("p000001.psv", physionet2019.HEADER + b"\n", "no observation"),
        ("p000001.psv", b"Time,Parameter,Value\n00:10,HR,80\n", "header"),
        ("132539.txt", P12_HEADER.encode() + b"00:10,HR,80\n" * 100_000, "at most 1024 kB accepted"),  # 1.2 MB
    ],
)
def test_bad_uploads_are_refused_with_a_reason(loaded, name, data, message):
    trained, _ = loaded
    with pytest.raises(sources.UploadError) as refused:
        sources.read_upload(name, data, trained)
    assert message in str(refused.value)
    assert "garlic-upload" not in str(refused.value)  # the message names the upload, not the temporary copy


def psv_record(rows: list[dict[str, float]]) -> bytes:
    lines = [physionet2019.HEADER.decode()]
    for row in rows:
        lines.append("|".join(f"{row[c]:g}" if c in row else "NaN" for c in physionet2019.COLUMNS))
    return ("\n".join(lines) + "\n").encode()


def test_a_physionet2019_record_is_read_and_its_unknown_variables_named(loaded, tmp_path):
    trained, _ = loaded
    rows = [
        {"HR": 80, "O2Sat": 97, "Age": 60, "Gender": 1, "ICULOS": 1, "SepsisLabel": 0},
        {"HR": 90, "Temp": 37.5, "Age": 60, "Gender": 1, "ICULOS": 2, "SepsisLabel": 0},
        {"HR": 99, "Age": 60, "Gender": 1, "ICULOS": 49, "SepsisLabel": 1},
    ]
    path = tmp_path / "p000042.psv"
    path.write_bytes(psv_record(rows))
    assert readers()[".psv"] is physionet2019.read_record_files
    observations, static = physionet2019.read_record_files([path])
    assert observations[["stay_id", "time", "variable", "value"]].astype({"variable": str}).values.tolist() == [
        [42, 1.0, "HR", 80.0],
        [42, 1.0, "O2Sat", 97.0],
        [42, 2.0, "HR", 90.0],
        [42, 2.0, "Temp", 37.5],
    ]
    static = static.set_index("stay_id").loc[42]
    assert static[["Age", "Gender"]].tolist() == [60.0, 1.0] and static[["Unit1", "Unit2", "HospAdmTime"]].isna().all()
    with pytest.raises(sources.UploadError, match=r"variables the model does not know: \['O2Sat'\]"):
        sources.read_upload(path.name, path.read_bytes(), trained)
    misnamed = tmp_path / "42.psv"
    misnamed.write_bytes(path.read_bytes())
    with pytest.raises(physionet2019.PhysioNet2019Error, match="pNNNNNN.psv"):
        physionet2019.read_record_files([misnamed])


def test_an_hourly_runs_alert_drivers_in_the_replay_are_garlics_integrated_gradients_as_the_wards(loaded):
    from garlic.methods.drivers import row_gradients

    trained, test = loaded
    replay = replay_stay(trained, test, 0)
    index = len(replay.hours) - 1
    hour = explain_hour(trained, replay, index, hourly=True)
    assert hour.explanation is not None  # the built-in explanation is still drawn beside the drivers
    # the ward's and predict's drivers at that hour: row_gradients of the stay asked at that hour
    record = test.tensors.subset(np.array([0]))
    asked = PredictionTimes(np.zeros(1, np.int64), replay.hours[index : index + 1].astype("float32"), np.zeros(1))
    ward = row_gradients(trained.method, IrregularDataset(replace(record, task=asked), test.normalisation))[0]
    np.testing.assert_allclose(hour.contributions.to_numpy(), ward, rtol=1e-4, atol=1e-6)
    raised = [name for name in hour.contributions.sort_values(ascending=False).index if hour.contributions[name] > 0]
    assert [name for name, _ in drivers_at(hour)] == raised[:2]
    assert explain_hour(trained, replay, index).contributions is None  # a per-stay run: the built-in signals
