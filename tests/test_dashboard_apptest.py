"""The dashboard page driven through Streamlit's testing API: choosing a stay, replaying it, and bad input."""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path

import pytest
from streamlit import config as streamlit_config
from streamlit.testing.v1 import AppTest

from garlic.app import sources
from garlic.metrics.threshold import threshold_at_sensitivity
from garlic.sources.physionet2012 import format_record
from garlic.io.tables import read_processed
from helpers import run_without_model, tiny_method_run, tiny_run

PAGE = Path(__file__).resolve().parents[1] / "garlic" / "app" / "dashboard.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory)


@pytest.fixture
def listening_on():
    """Sets the address the page believes its server listens on (AppTest starts none; `garlic dashboard`
    listens on 127.0.0.1); restored afterwards."""
    before = streamlit_config.get_option("server.address")
    yield lambda address: streamlit_config.set_option("server.address", address)
    streamlit_config.set_option("server.address", before)


@pytest.fixture
def page(run, monkeypatch, listening_on):
    """The page for ``run`` (or another run id) as ``garlic dashboard`` would start it: on 127.0.0.1, no token."""
    monkeypatch.delenv("GARLIC_DASHBOARD_TOKEN", raising=False)
    listening_on("127.0.0.1")

    def open_page(
        run_id: str | None = run.run_id, store: Path = run.store, address: str = "", data_root: Path = run.data_root
    ) -> AppTest:
        arguments = ["--mlruns", str(store), "--data-root", str(data_root)] + (["--run", run_id] if run_id else [])
        monkeypatch.setattr(sys, "argv", [str(PAGE), *arguments])
        at = AppTest.from_file(str(PAGE), default_timeout=60)
        at.query_params = dict(part.split("=") for part in address.split("&") if part)
        return at.run()

    return open_page


def test_a_run_whose_model_has_no_built_in_explanation_is_explained_by_integrated_gradients(page, tmp_path_factory):
    reference = tiny_run(tmp_path_factory, architecture="reference")
    at = page(reference.run_id, reference.store, data_root=reference.data_root)
    assert not at.exception
    assert any(m.label.startswith("Risk at hour") and m.value != "—" for m in at.metric)
    assert any(m.label == "Test AUROC" for m in at.metric)
    said = [e.value for e in at.info]
    assert any(s.startswith("Importance by integrated gradients") for s in said), said
    assert any(s.startswith("No explanation plot: ") for s in said), said  # the run logged none at training
    assert "Not given by integrated gradients: they attribute the risk to values, not to the graph." in [
        m.value for m in at.markdown
    ]
    assert not [e.value for e in at.error if "Something went wrong" in e.value]
    at.sidebar.number_input(key=f"threshold-{reference.run_id}").set_value(0.0).run()
    (warning,) = warnings(at)
    assert "Driven by " in warning and "no single signal" not in warning


@pytest.mark.skipif(
    importlib.util.find_spec("shap") is None, reason="needs the explain extra (shap): bin/setup explain"
)
def test_a_run_of_another_method_replays_its_risk_and_explains_it_by_its_variables(page, tmp_path_factory):
    boosting = tiny_method_run(tmp_path_factory, "gbm_static")
    at = page(boosting.run_id, boosting.store, data_root=boosting.data_root)
    assert not at.exception
    assert any(m.label.startswith("Risk at hour") and m.value != "—" for m in at.metric)
    assert any(m.label == "Test AUROC" for m in at.metric)
    assert not any("gives no explanation" in e.value for e in at.info)
    assert any(
        "contribution to the risk's log-odds at this hour (exact tree SHAP values" in c.value for c in at.caption
    )
    assert not [e.value for e in at.error if "Something went wrong" in e.value]
    (choice,) = sources.runs_with_models(boosting.store)  # listed with the runs that have a model, by its method
    assert choice.run_id == boosting.run_id and choice.label.startswith("gbm_static · AUROC ")
    at.sidebar.number_input(key=f"threshold-{boosting.run_id}").set_value(0.0).run()
    (warning,) = warnings(at)
    assert "since hour" in warning and "Driven by " in warning and "no single signal" not in warning


def test_a_run_of_a_method_that_cannot_explain_here_replays_its_risk_and_says_why(page, tmp_path_factory, monkeypatch):
    import garlic.methods.summary

    monkeypatch.setattr(garlic.methods.summary, "shap_installed", lambda: False)  # boosting without the shap package
    boosting = tiny_method_run(tmp_path_factory, "gbm_static")
    at = page(boosting.run_id, boosting.store, data_root=boosting.data_root)
    assert not at.exception
    assert any(m.label.startswith("Risk at hour") and m.value != "—" for m in at.metric)
    said = [e.value for e in at.info]
    assert any(
        s.startswith(
            "This run's model (gbm_static) gives no explanation here: gradient boosting's drivers need the shap package"
        )
        for s in said
    ), said
    assert not [e.value for e in at.error if "Something went wrong" in e.value]
    at.sidebar.number_input(key=f"threshold-{boosting.run_id}").set_value(0.0).run()
    (warning,) = warnings(at)
    assert "since hour" in warning and "Driven by" not in warning  # it names no driver it cannot know


def warnings(at: AppTest) -> list[str]:
    return [e.value for e in at.error if e.value.startswith("**Warning")]


def test_a_stay_opens_at_its_last_hour_with_its_risk_and_the_default_threshold(page, run):
    at = page()
    assert not at.exception
    test = sources.predictions(run.store, run.run_id, "test")
    highest = test.sort_values("risk").iloc[-1]
    assert at.sidebar.selectbox(key="stay").value == highest["stay_id"]
    last_hour = int(at.slider(key="hour").max)
    assert at.slider(key="hour").value == last_hour
    risk = next(m for m in at.metric if m.label == f"Risk at hour {last_hour}")
    assert float(risk.value) == pytest.approx(highest["risk"], abs=0.005)
    validation = sources.predictions(run.store, run.run_id, "validation")
    default = threshold_at_sensitivity(validation["label"], validation["risk"])
    assert at.sidebar.number_input(key=f"threshold-{run.run_id}").value == pytest.approx(default, abs=1e-3)
    assert any(m.label == "Test AUROC" for m in at.metric)  # the model view


def test_a_low_threshold_raises_a_warning_naming_its_drivers_and_a_high_one_clears_it(page, run):
    at = page()
    at.sidebar.number_input(key=f"threshold-{run.run_id}").set_value(0.001).run()
    (warning,) = warnings(at)
    assert "Warning: alert on since hour" in warning and "raised at 0.00" in warning and "Driven by" in warning
    drivers = warning.split("Driven by ")[1].rstrip(".").split(", ")
    assert drivers and all(re.fullmatch(r"\w+ \([\w ]+\)", driver) for driver in drivers), drivers  # each says how
    at.sidebar.number_input(key=f"threshold-{run.run_id}").set_value(1.0).run()
    assert not warnings(at) and any("No alert: risk" in s.value for s in at.success)


def test_play_follows_the_clock_at_the_speed_shown_and_step_and_pause_stop_it(page):
    at = page()
    clicked = time.monotonic()
    at.button(key="play").click().run()  # from the last hour, play starts again at hour 1
    assert at.session_state.playing and at.slider(key="hour").value <= 1 + (time.monotonic() - clicked) * 4
    time.sleep(1.0)
    before = time.monotonic()
    at.run()  # what the timer does while playing: the hour the clock has reached at 4 hours a second
    hour = at.slider(key="hour").value
    assert 1 + int((before - clicked) * 4) <= hour <= 1 + (time.monotonic() - clicked) * 4, hour
    at.button(key="play").click().run()  # now labelled Pause
    assert not at.session_state.playing and at.slider(key="hour").value == hour
    at.button(key="step").click().run()
    assert at.slider(key="hour").value == hour + 1
    at.slider(key="hour").set_value(10).run()
    assert any(m.label == "Risk at hour 10" for m in at.metric)
    assert not at.exception


def test_a_stay_is_chosen_from_the_list_or_the_address(page, run):
    test = sources.predictions(run.store, run.run_id, "test").sort_values("risk")
    lowest, second = (int(s) for s in test["stay_id"].iloc[:2])
    at = page()
    at.sidebar.selectbox(key="stay").set_value(lowest).run()
    assert at.subheader[0].value.startswith(f"Stay {lowest} ")
    at = page(address=f"stay={second}")
    assert at.subheader[0].value.startswith(f"Stay {second} ")


def test_an_uploaded_record_is_replayed_and_a_malformed_one_refused(page, run):
    at = page()
    at.sidebar.radio(key="source").set_value("Upload a record").run()
    assert not at.exception and at.info  # asks for a file
    at.sidebar.file_uploader[0].set_value(("132539.txt", b"Time;Parameter;Value\n00:10;HR;80\n", "text/plain")).run()
    assert any("Cannot use the upload" in e.value and "expected header" in e.value for e in at.error)
    assert not at.exception

    tables = read_processed(run.data_root / "processed" / "synthetic")
    stay_id = int(tables.labels["stay_id"].iloc[0])
    observations = tables.observations[tables.observations["stay_id"] == stay_id]
    record = format_record(stay_id, observations, tables.static.set_index("stay_id").loc[stay_id].to_dict())
    at.sidebar.file_uploader[0].set_value((f"{stay_id}.txt", record.encode(), "text/plain")).run()
    assert not at.exception and not [e for e in at.error if "Cannot" in e.value]
    assert at.subheader[0].value == f"Stay {stay_id} · uploaded {stay_id}.txt"


def test_a_run_without_a_model_or_a_missing_store_is_reported_in_the_page(page, run, tmp_path):
    at = page(run_id=run_without_model(run.store))
    assert any("no model artifact" in e.value for e in at.error) and not at.exception
    at = page(run_id=None, store=tmp_path / "nowhere")
    assert any("no MLflow store at STORE" in e.value for e in at.sidebar.error) and not at.exception
    assert not [e for e in [*at.error, *at.sidebar.error] if str(tmp_path) in e.value]  # no server paths shown
    assert not (tmp_path / "nowhere").exists()  # the page reads the store; it does not make one
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "mlflow.db").write_bytes(b"\x00not sqlite\xff" * 4096)  # once: "Something went wrong"
    at = page(run_id=None, store=damaged)
    assert [e.value for e in at.error] == [
        "The MLflow store STORE cannot be read: file is not a database (a damaged database: restore it from a copy)."
    ] and not at.exception


def test_a_wider_address_shows_nothing_without_a_token_set(page, listening_on):
    listening_on("0.0.0.0")
    at = page()
    assert any("not set up to be reached from other machines" in e.value for e in at.error)
    assert not at.metric and not at.sidebar.selectbox and not at.exception


def test_with_a_token_set_the_page_asks_for_it_and_opens_only_for_the_right_one(page, listening_on, monkeypatch):
    token = "a-long-enough-secret-token"
    monkeypatch.setenv("GARLIC_DASHBOARD_TOKEN", token)
    listening_on("0.0.0.0")
    at = page()
    assert not at.metric and not at.sidebar.selectbox  # nothing of the run before the token
    at.text_input(key="token").input("wrong-guess-of-some-length")
    at.button[0].click().run()
    assert any(e.value == "Wrong token." for e in at.error) and not at.metric
    at.text_input(key="token").input(token)
    at.button[0].click().run()
    assert any(m.label.startswith("Risk at hour") for m in at.metric) and not at.exception


def test_an_unexpected_error_is_a_plain_line_in_the_page_and_its_trace_goes_to_the_log(page, monkeypatch, caplog):
    import garlic.app.replay

    def broken(*args, **kwargs):
        raise RuntimeError("boom in /srv/secret/garlic/app/replay.py")

    monkeypatch.setattr(garlic.app.replay, "explain_hour", broken)
    at = page()
    assert not at.exception  # no traceback in the page
    assert any("Something went wrong on the server" in e.value for e in at.error)
    shown = " ".join(str(e.value) for e in [*at.error, *at.markdown, *at.caption])
    assert "/srv/secret" not in shown and "boom" not in shown
    assert "boom in /srv/secret" in caplog.text  # the details are in the server's log


def test_an_upload_over_the_size_limit_is_refused(page):
    at = page()
    at.sidebar.radio(key="source").set_value("Upload a record").run()
    record = b"Time,Parameter,Value\n00:00,RecordID,132539\n" + b"00:10,HR,80\n" * 100_000  # 1.2 MB
    at.sidebar.file_uploader[0].set_value(("132539.txt", record, "text/plain")).run()
    assert any("at most 1024 kB accepted" in e.value for e in at.error) and not at.exception


def test_after_too_many_wrong_tokens_not_even_the_right_one_is_checked(page, listening_on, monkeypatch, caplog):
    import garlic.app.access

    token = "3f9a1c0e7b2d4a68c5e1"
    monkeypatch.setenv("GARLIC_DASHBOARD_TOKEN", token)
    # AppTest gives every run another visitor address, so this page meets the overall limit (per address: unit test)
    monkeypatch.setattr(garlic.app.access, "ATTEMPTS", garlic.app.access.Attempts(per_client=2, overall=2))
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # the second a wrong guess costs
    listening_on("0.0.0.0")
    at = page()
    for guess in ("wrong-guess-number-1", "wrong-guess-number-2", token):
        at.text_input(key="token").input(guess)
        at.button[0].click().run()
    assert any(e.value.startswith("Too many wrong tokens") for e in at.error) and not at.metric
    assert "a wrong dashboard token (2 in the last minute, from every visitor)" in caplog.text
    assert token not in caplog.text and "wrong-guess" not in caplog.text  # guesses are not logged
