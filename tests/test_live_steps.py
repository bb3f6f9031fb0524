"""Step states (``garlic.models.steps``, ``garlic.live.steps``): a stay's risk and drivers after each new step equal
the one pass over the stay cut there."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
import torch

from garlic.config import Config
from garlic.data.batches import Batch
from garlic.explain.built_in import explain
from garlic.models import steps
from garlic.models.compact import Garlic
from garlic.models.network_config import NetworkConfig
from helpers import synthetic_root, tiny_run


@pytest.mark.parametrize(
    "settings",
    [{}, {"summary_branch": True, "hours_input": True}, {"use_gru": False, "use_decay": False, "window_size": 1}],
)
def test_a_stay_taken_step_by_step_has_the_one_pass_risk_and_signal_importance(settings):
    torch.manual_seed(0)
    config = NetworkConfig.from_run(
        Config.for_dataset("synthetic").override({"hidden_dim": 16, "feature_dim": 4, "window_size": 3, **settings})
    )
    variables, stays, length = 6, 3, 9
    model = Garlic(variables, 2, config).eval()
    with torch.no_grad():  # away from the initial weights, where some terms vanish (the graph is I + 0.2)
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    mask = (torch.rand(stays, length, variables) < 0.4).float()
    mask[:, :, 0] = 1.0  # every step has an observation, as every step of a record has
    values = torch.randn(stays, length, variables) * mask
    times = torch.cumsum(torch.rand(stays, length) * 3, dim=1)
    static = torch.randn(stays, 2)
    state = steps.start(model, stays)
    for step in range(length):
        state = steps.advance(model, state, values[:, step], mask[:, step], times[:, step], explain=True)
        cut = Batch(
            values[:, : step + 1],
            mask[:, : step + 1],
            times[:, : step + 1],
            torch.full((stays,), step + 1),
            static,
            torch.zeros(stays),
        )
        one_pass = explain(model, cut, [str(d) for d in range(variables)])
        assert torch.sigmoid(steps.logits(model, state, static)) == pytest.approx(one_pass.risk, abs=1e-5)
        assert steps.signal_importance(state).numpy() == pytest.approx(one_pass.signal.numpy(), abs=1e-5)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from garlic.methods.saved import load_predictor

    run = tiny_run(tmp_path_factory)
    return run, load_predictor(run.run_id, run.store)


def test_the_ward_scored_reading_by_reading_keeps_the_one_pass_risks_and_drivers(trained, tmp_path, monkeypatch):
    """Two beds fed reading by reading: same-time readings, a late one, a restart, and states for one bed only; a
    bed that goes on from its state is read from its last step on."""
    pytest.importorskip("fhir.resources", reason="the live ward validates FHIR with fhir.resources: bin/setup live")
    from garlic.metrics.alert_policy import AlertPolicy, AlertState
    from garlic.live.feed import recorded_stays
    from garlic.live.fhir import Observed, Stay
    from garlic.live.monitor import Monitor
    from garlic.live.scoring import BedScorer
    from garlic.live.store import LiveStore

    run, saved = trained
    _, observations, static = recorded_stays(run.run_id, run.store, run.data_root, beds=2)
    start = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    stays = sorted(static["stay_id"])
    feed = []
    for stay in stays:
        rows = observations[observations["stay_id"] == stay].sort_values("time", kind="stable").head(40)
        feed += [
            Observed(f"bed-{stay}", r.variable, start + timedelta(hours=float(r.time)), float(r.value))
            for r in rows.itertuples()
        ]
        descriptors = static[static["stay_id"] == stay].iloc[0]
        middle = start + timedelta(hours=float(rows["time"].iloc[len(rows) // 2]))
        feed += [
            Observed(f"bed-{stay}", name, middle, float(descriptors[name]))
            for name in saved.static_features
            if pd.notna(descriptors[name])
        ]
    feed.sort(key=lambda reading: (reading.at, reading.bed))  # the beds interleaved, same-time readings one by one
    late = feed.pop(len(feed) // 3)
    feed.insert(2 * len(feed) // 3, late)  # arrives after later readings of its bed
    url = f"sqlite:///{tmp_path / 'ward.sqlite'}"
    beds = [f"bed-{stay}" for stay in stays]
    # The one pass's risk at each time of every reading, and an alert whose state matters (the risks between its
    # thresholds keep it as it was), raised and cleared.
    whole = LiveStore(f"sqlite:///{tmp_path / 'whole.sqlite'}", run.run_id)
    for bed in beds:
        whole.admit(Stay(bed, True, start, None))
    whole.add(feed)
    readings = whole.readings(beds)
    whole.close()
    asked = readings[["bed", "time"]].drop_duplicates().reset_index(drop=True)
    one_pass = BedScorer(saved)
    one_pass.steps = None  # the one pass per cut, as every model without step states is scored
    risk, drivers = one_pass.score(readings, asked)
    low, high = np.nanquantile(risk, [0.3, 0.7])
    # on above the 70th centile, off below the 30th
    alerts = AlertPolicy(float(high), band=float(1 - low / high), quiet_hours=0, margin=0)

    def monitor() -> Monitor:
        scorer = BedScorer(saved, beds=1)  # one bed keeps a state: the other is rebuilt at each of its readings
        return Monitor(LiveStore(url, run.run_id), scorer, alerts)

    ward = monitor()
    for bed in beds:
        ward.store.admit(Stay(bed, True, start, None))
    read = []  # per round, (readings read, readings of its beds)
    whole_read = LiveStore.readings

    def counted(store, chosen, after=None, always=(), round_ids=None):
        got = whole_read(store, chosen, after, always, round_ids)
        read.append((len(got), len(whole_read(store, chosen))))
        return got

    for count, reading in enumerate(feed):
        if count == len(feed) // 2:  # a restart: states gone, the store as it was
            ward.store.close()
            ward = monitor()
        ward.take([reading])
        with monkeypatch.context() as patched:
            patched.setattr(LiveStore, "readings", counted)
            ward.score_round()
        assert len(ward.scorer.steps.beds) <= 1
    pd.testing.assert_frame_equal(ward.store.readings(beds), readings)
    assert sum(got < every for got, every in read) > len(feed) // 3  # rounds that read a bed from its last step on
    # Read from a time on: the later readings and every static descriptor, whatever its time.
    descriptors = readings["variable"].isin(saved.static_features)
    after = float(readings.loc[descriptors & (readings["bed"] == beds[0]), "time"].max())  # none of them after it
    later = ward.store.readings(beds, {beds[0]: after}, saved.static_features)
    expected = readings[(readings["bed"] != beds[0]) | (readings["time"] > after) | descriptors]
    pd.testing.assert_frame_equal(later, expected.reset_index(drop=True))
    assert len(later) < len(readings)
    assert np.isfinite(risk).sum() > 12  # times with a risk
    raised = []
    for bed in beds:
        history = ward.store.history(bed)
        expected = asked["bed"] == bed
        assert history["time"].tolist() == asked.loc[expected, "time"].tolist()
        assert history["risk"].to_numpy(float) == pytest.approx(risk[expected.to_numpy()], abs=1e-5, nan_ok=True)
        assert history["drivers"].tolist() == [drivers[row] for row in np.flatnonzero(expected)]
        # Each time's alert follows from the one before in time order, whether it was scored when its reading came
        # in order, again after a late one, or after the restart (when the loop remembers no bed's last alert).
        state = AlertState()
        for time, value, stored in zip(history["time"], history["risk"], history["alert"]):
            state = alerts.next(state, time, None if pd.isna(value) else float(value))
            assert bool(stored) == state.on, (bed, time)
            raised.append(state.on)
    assert 0 < sum(raised) < len(raised)
    ward.store.close()


def test_a_reading_before_the_last_step_rebuilds_the_bed_even_when_only_later_times_are_asked(trained):
    # A round reads its beds' readings after taking its pending ones: a late reading stored in between is in the
    # readings, but not in the times asked.
    from garlic.live.scoring import BedScorer

    _, saved = trained
    readings = pd.DataFrame(
        {
            "bed": "bed-1",
            "variable": saved.variables[:3] * 2,
            "time": [1.0, 2.0, 3.0] * 2,
            "value": [80.0, 90.0, 100.0, 1.0, 2.0, 3.0],
        }
    )
    readings = readings.sort_values("time", kind="stable")  # in time order, as the store reads them
    late = pd.DataFrame({"bed": ["bed-1"], "variable": [saved.variables[3]], "time": [1.5], "value": [5.0]})
    stepwise, one_pass = BedScorer(saved), BedScorer(saved)
    one_pass.steps = None
    stepwise.score(readings, readings[["bed", "time"]].drop_duplicates().reset_index(drop=True))
    readings = pd.concat([readings, late]).sort_values("time", kind="stable").reset_index(drop=True)
    asked = pd.DataFrame({"bed": ["bed-1"], "time": [3.0]})
    assert stepwise.score(readings, asked)[0] == pytest.approx(one_pass.score(readings, asked)[0], abs=1e-5)
    assert stepwise.score(readings, asked)[1] == one_pass.score(readings, asked)[1]


def test_the_step_benchmark_times_a_step_against_the_one_pass_and_checks_they_agree(tmp_path_factory, capsys):
    from experiments import benchmark_steps

    root = synthetic_root(tmp_path_factory, n_stays=40, seed=2)
    benchmark_steps.main(["--dataset", "synthetic", "--data-root", str(root)])
    lines = capsys.readouterr().out.strip().splitlines()
    agreement = re.fullmatch(r"largest difference from the one pass: risk (\S+), signal importance (\S+)", lines[0])
    assert agreement and float(agreement[1]) < 1e-5 and float(agreement[2]) < 1e-5, lines[0]
    assert len(lines) == 3 and all(
        re.fullmatch(
            r"\d+ steps over [\d.]+ h: step [\d.]+ ms, explained pass [\d.]+ ms, "
            r"risk-only pass [\d.]+ ms",
            line,
        )
        for line in lines[1:]
    ), lines
