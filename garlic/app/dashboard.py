"""The bedside dashboard: replay one ICU stay hour by hour with its risk, warnings and their explanations.

Started by ``garlic dashboard [--run RUN_ID]``, which runs ``garlic.app.serve``: it serves
``streamlit run garlic/app/dashboard.py -- --mlruns STORE --data-root DATA [--run RUN_ID] [--ward URL]`` on 127.0.0.1
unless told otherwise, and then only to visitors who give the token (``garlic.app.access``). The page reads only the
MLflow store, the data root, the live ward's store when given, and uploaded files. A stay comes from the run's test
split (``?stay=ID`` in the URL picks one) or from an uploaded PhysioNet 2012 ``.txt`` / 2019 ``.psv`` record. With
``--ward URL`` (the store of ``garlic monitor``), a ward view lists every bed of the live ward with its risk, trend
and alert, updating itself, and a bed opens the bedside view with its live data (``?bed=ID`` in the URL opens one).
What goes wrong is said in the page without server paths or tracebacks; the details go to the server's log.
"""

from __future__ import annotations

import argparse
import base64
import functools
import io
import logging
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import streamlit as st
import torch
from streamlit.runtime.scriptrunner import get_script_run_ctx

from garlic.app import charts, sources
from garlic.app.access import ADMITTED, ATTEMPTS, AccessError, required_token, token_matches
from garlic.app.replay import (
    Hour,
    Replay,
    alert_start,
    contribution_bars,
    drivers_at,
    edges_at,
    explain_hour,
    observations_at,
    replay_stay,
    signal_bars,
    signals_at,
)
from garlic.app.summary import change_text, driver_note, plain_summary, risk_change, risk_trend
from garlic.evaluation import alerting
from garlic.metrics.alert_policy import AlertPolicy, AlertPolicyError
from garlic.tracking.local_store import database_error
from garlic.data.batches import IrregularDataset
from garlic.data.datasets import DEFAULT_DATA_ROOT
from garlic.explain.built_in import BUILT_IN
from garlic.tracking import plots, run_contract
from garlic.methods.contract import unexplained_reason
from garlic.methods.saved import SavedMethod
from garlic.tracking.store import DEFAULT_STORE, RunNotFoundError
from garlic.io.tables import DatasetNotFoundError
from garlic.inference import tensors_for_model
from garlic.live.scoring import record_tables
from garlic.live.store import LiveStore, StoreError

TEST_SPLIT, UPLOAD, LIVE = "Test split of the run", "Upload a record", "Bed of the live ward"
WARD_REFRESH_SECONDS = 2.0
BANNER_SECONDS = 60.0  # how long a bed's crossing of its threshold stays on the ward's banner
SPEEDS = {"1 h/s": 1.0, "2 h/s": 2.0, "4 h/s": 4.0, "8 h/s": 8.0}
SHOWN_VARIABLES = 8
FAILED = "Something went wrong on the server, so this part cannot be shown. The details are in the server's log."
log = logging.getLogger("garlic.dashboard")
folders: dict[str, Path] = {}  # label -> configured folder, for messages without server paths (set by main)
MODEL_PLOTS = {
    run_contract.plot("roc_pr.png"): "ROC and precision-recall curves on the test split",
    run_contract.plot("calibration.png"): "Calibration on the test split",
    run_contract.plot("graph.png"): "The learned variable graph (row: source, column: target)",
    run_contract.explanation("strongest_edges.png"): "Its strongest edges",
}


def settings(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dashboard", description="GARLIC-ICU bedside dashboard")
    parser.add_argument("--mlruns", type=Path, default=DEFAULT_STORE, help="the local MLflow store")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT, help="where processed datasets live")
    parser.add_argument("--run", help="MLflow run id (default: the newest run with a model)")
    parser.add_argument("--ward", help="SQLAlchemy URL of a live ward's store (garlic monitor --store): the ward view")
    parser.add_argument("--profile", type=Path, help="a site profile of the run (garlic calibrate): its alert policy")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------------------------
# Cached loading: once per process for the model and the test split, once per stay for its replay


@st.cache_resource(ttl=60, show_spinner=False)
def cached_runs(store: str) -> list[sources.RunChoice]:
    return sources.runs_with_models(Path(store))


@st.cache_resource(show_spinner="Loading the model…")
def cached_run(store: str, run_id: str) -> tuple[SavedMethod, mlflow.entities.Run]:
    return sources.load_run(Path(store), run_id)


@st.cache_resource(show_spinner="Loading the test split…")
def cached_test_split(store: str, run_id: str, data_root: str) -> IrregularDataset:
    trained, run = cached_run(store, run_id)
    return sources.test_split(trained, run, Path(data_root))


@st.cache_resource(show_spinner=False)
def cached_predictions(store: str, run_id: str, part: str) -> pd.DataFrame:
    return sources.predictions(Path(store), run_id, part)


def hourly_run(store: str, run_id: str) -> bool:
    """Whether the run was tested at prediction times (an hourly task: its test predictions have a time each)."""
    try:
        return "time" in cached_predictions(store, run_id, "test")
    except RunNotFoundError:  # a run that logged no predictions is replayed as a per-stay one
        return False


@st.cache_resource(show_spinner=False)
def cached_artifact(store: str, run_id: str, path: str) -> bytes | None:
    return sources.artifact_bytes(Path(store), run_id, path)


@st.cache_resource(show_spinner=False)
def cached_onsets(store: str, run_id: str, data_root: str) -> pd.Series:
    return sources.onset_hours(cached_run(store, run_id)[1], Path(data_root))


@st.cache_resource(max_entries=64, show_spinner=False)
def cached_test_replay(store: str, run_id: str, data_root: str, stay_id: int) -> Replay:
    trained, _ = cached_run(store, run_id)
    dataset = cached_test_split(store, run_id, data_root)
    return replay_stay(trained, dataset, int(np.searchsorted(dataset.stay_ids, stay_id)))


@st.cache_resource(max_entries=8, show_spinner="Reading the record…")
def cached_upload_replay(store: str, run_id: str, name: str, data: bytes) -> Replay:
    trained, _ = cached_run(store, run_id)
    return replay_stay(trained, sources.read_upload(name, data, trained), 0)


@st.cache_resource(show_spinner=False)
def cached_ward(url: str, run_id: str) -> LiveStore:
    return LiveStore(url, run_id, create=False)


# ---------------------------------------------------------------------------------------------------------------
# What the page says when something fails: no server paths, no tracebacks


def plain(error: Exception | str) -> str:
    """An error's message for the page: the configured folders by name (STORE, DATA), other paths cut short."""
    return sources.without_paths(str(error), folders)


def shown_plainly(draw):
    """Run ``draw``; an unexpected error is logged with its traceback and shown as one plain line."""

    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        try:
            return draw(*args, **kwargs)
        except Exception:  # the last resort: st.rerun/st.stop are not Exceptions and pass through
            log.exception("the dashboard failed drawing %s", draw.__name__)
            st.error(FAILED)

    return drawn


def admitted() -> bool:
    """Whether this visitor may see the page: always on a loopback-only server without a token, else with it."""
    try:
        token = required_token(st.get_option("server.address"))
    except AccessError as exc:
        log.error("refusing to serve: %s", exc)
        st.error(f"This dashboard is not set up to be reached from other machines: {exc}.")
        return False
    session = get_script_run_ctx().session_id
    if token is None or st.session_state.get("admitted"):
        ADMITTED.add(session)  # its uploads may pass access.Gate
        return True
    with st.form("login"):
        given = st.text_input("Access token", type="password", key="token")
        submitted = st.form_submit_button("Open the dashboard")
    client = st.context.ip_address or "unknown"
    if submitted and ATTEMPTS.blocked(client):
        st.error("Too many wrong tokens; try again in a minute.")
    elif submitted and token_matches(given, token):
        st.session_state.admitted = True
        st.rerun()
    elif submitted:
        recent = ATTEMPTS.failed(client)
        log.warning("a wrong dashboard token (%d in the last minute, from every visitor)", recent)
        time.sleep(1.0)  # a wrong guess costs a second
        st.error("Wrong token.")
    return False


# ---------------------------------------------------------------------------------------------------------------
# Sidebar: run, stay, threshold, speed


def choose_run(store: Path, given: str | None) -> str | None:
    try:
        choices = cached_runs(str(store))
    except RunNotFoundError as exc:
        choices = []
        st.sidebar.error(plain(exc))
    except Exception as exc:
        damaged = database_error(exc)
        if damaged is None:
            raise
        st.error(
            f"The MLflow store {plain(store)} cannot be read: {plain(str(damaged))} (a damaged database: "
            "restore it from a copy)."
        )
        return None
    labels = {choice.run_id: choice.label for choice in choices}
    details = {choice.run_id: choice.details for choice in choices}
    if given and given not in labels:  # still offered, so that the page can say what is wrong with it
        labels = {given: f"{given} (given with --run)", **labels}
    if not labels:
        st.error(f"No run with a model in the MLflow store {plain(store)}. Train one first: `garlic train`.")
        return None
    ids = list(labels)
    run_id = st.sidebar.selectbox("Run", ids, index=ids.index(given) if given else 0, format_func=labels.get)
    st.sidebar.caption(details.get(run_id, ""))
    return run_id


def default_policy(store: str, run_id: str, profile: str | None) -> tuple[AlertPolicy, str]:
    """The alert policy the run alerts with (``garlic.evaluation.alerting.policy_for``: its own, chosen on its
    validation stays, or the site profile's), and how it was chosen; the default policy at 0.5 where the run has
    none to read."""
    try:
        found = alerting.policy_for(run_id, Path(store), None if profile is None else Path(profile))
    except (RunNotFoundError, AlertPolicyError, FileNotFoundError, KeyError) as exc:
        return AlertPolicy(0.5), f"0.5 by default: no alert policy to read ({plain(exc)})"
    return found.policy, f"Default {found.policy.threshold:.3f}: {found.chosen_by}"


def choose_test_stay(store: str, run_id: str, data_root: str) -> tuple[Replay, str] | None:
    try:
        dataset = cached_test_split(store, run_id, data_root)
        test = sources.per_stay(cached_predictions(store, run_id, "test")).set_index("stay_id")
    except (DatasetNotFoundError, RunNotFoundError, ValueError, OSError) as exc:
        log.warning("run %s: cannot read its test split: %s", run_id, exc)
        st.error(f"Cannot read this run's test split from the data root: {plain(exc)}")
        return None
    available = set(dataset.stay_ids.tolist())
    ids = [int(s) for s in test["risk"].sort_values(ascending=False).index if s in available]

    def describe(stay_id: int) -> str:
        row = test.loc[stay_id]
        return f"{stay_id} · outcome {int(row['label'])} · risk {row['risk']:.2f}"

    asked = st.query_params.get("stay", "")  # a link to one stay: ?stay=ID
    first = ids.index(int(asked)) if asked.isdigit() and int(asked) in ids else 0
    stay_id = st.sidebar.selectbox(
        "Stay (test split, highest risk first)", ids, index=first, format_func=describe, key="stay"
    )
    outcome = "positive" if test.loc[stay_id, "label"] == 1 else "negative"
    return cached_test_replay(store, run_id, data_root, stay_id), f"Stay {stay_id} · test split · outcome {outcome}"


def choose_upload(store: str, run_id: str) -> tuple[Replay, str] | None:
    uploaded = st.sidebar.file_uploader(
        "Record file (RECORDID.txt or pNNNNNN.psv)",
        type=["txt", "psv"],
        max_upload_size=sources.MAX_UPLOAD_BYTES // (1024 * 1024),
    )
    if uploaded is None:
        st.info("Upload one stay as a PhysioNet 2012 `RECORDID.txt` or PhysioNet 2019 `pNNNNNN.psv` record.")
        return None
    if uploaded.size > sources.MAX_UPLOAD_BYTES:  # refused before its bytes are copied again
        st.error(
            f"Cannot use the upload: {uploaded.name} is {uploaded.size / 1e6:.1f} MB; one stay's record is "
            f"under 0.1 MB (at most {sources.MAX_UPLOAD_BYTES // 1024} kB accepted)."
        )
        return None
    try:
        replay = cached_upload_replay(store, run_id, uploaded.name, uploaded.getvalue())
    except ValueError as exc:
        st.error(f"Cannot use the upload: {plain(exc)}")
        return None
    return replay, f"Stay {replay.stay_id} · uploaded {uploaded.name}"


# ---------------------------------------------------------------------------------------------------------------
# The live ward (garlic monitor's store): every bed, redrawn every WARD_REFRESH_SECONDS; a bed opens the bedside view


def ward_table(ward: LiveStore) -> pd.DataFrame:
    """The admitted beds, highest risk first: bed, risk, trend (change over the last hour), alert, readings,
    drivers, time (hours since admission of the newest risk)."""
    beds = ward.ward()  # the service's /ward, as a table
    beds["drivers"] = beds["drivers"].map(", ".join)
    return beds[["bed", "risk", "trend", "alert", "readings", "drivers", "time"]]


def open_bed() -> None:
    """A row picked in the ward's table: that bed, in the bedside view."""
    rows = st.session_state.ward_table.selection.rows
    if rows:
        st.session_state.update(source=LIVE, bed=st.session_state.ward_beds[rows[0]], view="Bedside", picked=True)


@shown_plainly
def ward_view(ward: LiveStore) -> None:
    beds = ward_table(ward)
    now = time.monotonic()
    alerting = set(beds.loc[beds["alert"], "bed"])
    crossed = st.session_state.setdefault("crossed", {})
    for bed in alerting - st.session_state.get("alerting", alerting):  # not on the first look: those were before
        crossed[bed] = now
        st.toast(f"Bed {bed} crossed its alert threshold", icon=":material/warning:")
    st.session_state.alerting = alerting
    recent = [bed for bed, when in crossed.items() if now - when < BANNER_SECONDS and bed in alerting]
    if recent:
        st.error(
            f"**Alert: bed {', '.join(recent)} crossed {'its' if len(recent) == 1 else 'their'} alert "
            "threshold** in the last minute.",
            icon=":material/warning:",
        )
    st.caption(
        f"{len(beds)} beds, {len(alerting)} in alert · highest risk first · updated every "
        f"{WARD_REFRESH_SECONDS:g} s · pick a bed to open it"
    )
    st.session_state.ward_beds = beds["bed"].tolist()
    st.dataframe(
        beds,
        hide_index=True,
        key="ward_table",
        on_select=open_bed,
        selection_mode="single-row",
        column_config={
            "risk": st.column_config.NumberColumn("Risk", format="%.3f"),
            "trend": st.column_config.NumberColumn("Change in 1 h", format="%+.3f"),
            "alert": st.column_config.CheckboxColumn("Alert"),
            "time": st.column_config.NumberColumn("Hour", format="%.1f"),
            "bed": "Bed",
            "readings": "Readings",
            "drivers": "Drivers",
        },
    )
    if st.session_state.pop("picked", False):
        st.rerun(scope="app")  # a bed was picked in this fragment: the whole page, once, to open it


def choose_bed(ward: LiveStore, trained: SavedMethod) -> tuple[Replay, str] | None:
    beds = ward_table(ward)
    if beds.empty:
        st.info("No bed in the live ward yet: admit one (garlic feed, or a FHIR Encounter).")
        return None
    ids = beds["bed"].tolist()
    if st.session_state.get("bed") not in ids:
        st.session_state.bed = ids[0]
    risks = dict(zip(beds["bed"], beds["risk"]))

    def describe(bed: str) -> str:
        return f"{bed} · risk {risks[bed]:.2f}" if pd.notna(risks[bed]) else f"{bed} · no risk yet"

    bed = st.sidebar.selectbox("Bed (live ward, highest risk first)", ids, format_func=describe, key="bed")
    observations, static = record_tables(ward.readings([bed]), trained.static_features)
    try:
        dataset = trained.dataset(tensors_for_model(trained, observations, static))
        replay = replay_stay(trained, dataset, 0)
    except ValueError as exc:  # no reading of a time-varying input yet
        st.info(f"Bed {bed} has no risk yet: {plain(exc)}")
        return None
    return replay, f"Bed {bed} · live ward · {len(observations)} readings"


# ---------------------------------------------------------------------------------------------------------------
# Playback: the hour follows the clock (start hour + elapsed seconds x speed), so "4 h/s" is 4 hours a second
# however long a redraw takes; a slow redraw skips hours instead of slowing the replay down.


def follow_stay(replay: Replay, key: str) -> None:
    """A newly chosen stay opens paused at its last hour."""
    if st.session_state.get("stay_key") != key:
        st.session_state.update(stay_key=key, hour=int(replay.hours[-1]), playing=False)


def restart_clock() -> None:
    st.session_state.clock = (time.monotonic(), st.session_state.hour)


def play_or_pause(last_hour: int) -> None:
    if st.session_state.playing:
        st.session_state.playing = False
        return
    if st.session_state.hour >= last_hour:  # at the end: play again from the start
        st.session_state.hour = 1
    st.session_state.playing = True
    restart_clock()


def step(last_hour: int) -> None:
    st.session_state.update(playing=False, hour=min(st.session_state.hour + 1, last_hour))


def replayed_hour(last_hour: int, speed: float) -> int:
    started, first = st.session_state.clock
    return min(first + int((time.monotonic() - started) * speed), last_hour)


# ---------------------------------------------------------------------------------------------------------------
# The bedside view: a fragment, redrawn alone at every replayed hour and for Step or the slider; the rest of the
# page (sidebar, model tab) is drawn again only when a sidebar setting changes or playback starts or stops.


@shown_plainly
def bedside_view(
    replay: Replay,
    title: str,
    policy: AlertPolicy,
    trained: SavedMethod,
    speed: float,
    timed: bool,
    onsets: pd.Series,
    hourly: bool = False,
) -> None:
    last_hour = int(replay.hours[-1])
    if st.session_state.playing != timed:
        st.rerun()  # Play, Pause or the end of the replay: the whole page, to start or stop the timer
    if st.session_state.playing:
        if st.session_state.hour >= last_hour:
            # The last hour is on screen since the previous tick (a rerun right after setting it would race the
            # slider's old value back in): now a full run stops the timer and turns Pause back into Play.
            st.session_state.playing = False
            st.rerun()
        st.session_state.hour = replayed_hour(last_hour, speed)
    st.subheader(title)
    play, step_button, hint = st.columns([1, 1, 4], vertical_alignment="center")
    # One button whose label changes, so that the page never shows a stale Play beside a Pause.
    play.button(
        "⏸ Pause" if st.session_state.playing else "▶ Play",
        on_click=play_or_pause,
        args=(last_hour,),
        key="play",
        width="stretch",
    )
    step_button.button("Step +1 h", on_click=step, args=(last_hour,), key="step", width="stretch")
    hint.caption(f"Replays at {speed:g} hours a second (speed in the sidebar).")
    # Held still while playing: a slider the page moves and the user drags at once sent stale hours back.
    hour = st.slider(
        "Hour since ICU admission (the model sees only the data up to it)",
        1,
        last_hour,
        key="hour",
        disabled=st.session_state.playing,
    )
    now = hour - 1
    risk = replay.risk[now]
    explained = explain_hour(trained, replay, now, hourly)
    drivers = drivers_at(explained)
    trend = risk_trend(replay.risk, now)

    left, middle, right = st.columns(3)
    delta, moved = change_text(risk_change(replay.risk, now))
    left.metric(
        f"Risk at hour {hour}",
        "—" if not np.isfinite(risk) else f"{risk:.2f}",
        delta=delta,
        delta_color="inverse" if moved else "off",
        delta_arrow="auto" if moved else "off",
    )
    threshold = policy.threshold
    middle.metric("Alert threshold", f"{threshold:.2f}", help=policy.describe())
    right.metric(
        "Playback",
        "playing" if st.session_state.playing else "paused",
        f"hour {hour} of {last_hour}",
        delta_color="off",
        delta_arrow="off",
    )

    alarms = policy.alarms(replay.risk, replay.hours, [len(replay.hours)])  # as the live ward raises them
    since = alert_start(replay.hours, alarms, now)
    driven = ", ".join(driver_note(name, direction) for name, direction in drivers)
    if since is not None:
        why = f"Driven by {driven or 'no single signal'}." if explained.explained else ""
        st.error(
            f"**Warning: alert on since hour {since:g}** (risk {risk:.2f}; raised at {threshold:.2f}, cleared "
            f"below {policy.release:.2f}). {why}",
            icon=":material/warning:",
        )
    elif np.isfinite(risk):
        st.success(
            f"No alert: risk {risk:.2f} (an alert is raised at {threshold:.2f}).", icon=":material/check_circle:"
        )
    else:
        st.info("No observation yet at this hour.")
    st.markdown(f"**In short:** {plain_summary(risk, trend, drivers)}")
    onset = onsets.get(replay.stay_id)
    st.vega_lite_chart(*charts.risk_chart(replay.hours, replay.risk, threshold, now, onset, alarms), width="stretch")
    if onset is not None:
        st.caption(
            f"Sepsis onset at hour {onset:g} (green line); an alarm in the shaded hours, 12 before it to 3 "
            "after, is the warning the Sepsis Challenge rewards."
        )

    st.subheader("Why")
    if explained.contributions is not None:
        contributions_view(explained, trained)
        return
    if explained.explanation is None:
        reason = unexplained_reason(trained.method)
        st.info(
            f"This run's model ({trained.name}) gives no explanation "
            + (f"here: {reason}. " if reason else "of its own: ")
            + "the page shows its risk only. GARLIC runs show which signals, observations and "
            "edges drove the risk.",
            icon=":material/info:",
        )
        return
    gradients = explained.explanation.method != BUILT_IN
    if gradients:
        st.info(
            "Importance by integrated gradients (each observed value's share of what moved the risk from a stay "
            "with nothing observed): this run's model has no built-in explanation, so no edges either.",
            icon=":material/info:",
        )
    signals = signals_at(explained)
    left, right = st.columns(2)
    with left:
        st.caption(
            "Signal importance: each variable's share of the risk's "
            + ("attribution" if gradients else "attention")
            + ", summed over time"
        )
        bars = signal_bars(explained)
        if bars.empty:
            st.write("No signal yet: nothing has been observed by this hour.")
        else:
            st.vega_lite_chart(*charts.bar_chart(bars, "variable", "importance", "importance"), width="stretch")
    with right:
        st.caption("Strongest edges of the learned variable graph, weighted for this stay (source → target)")
        edges = edges_at(explained)
        edges["edge"] = edges["source"] + " → " + edges["target"]
        if gradients:
            st.write("Not given by integrated gradients: they attribute the risk to values, not to the graph.")
        elif edges.empty:
            st.write("No messages yet: the graph carries a variable's past, and this hour has none.")
        else:
            st.vega_lite_chart(*charts.bar_chart(edges, "edge", "importance", "importance"), width="stretch")
    observed = observations_at(explained, trained)
    top = [name for name in signals.index if name in set(observed["variable"])][:SHOWN_VARIABLES]
    st.caption(
        f"The {len(top)} most important vital signs and labs up to this hour, each observation shaded by its "
        "importance to the risk"
    )
    if top:
        st.vega_lite_chart(*charts.observations_chart(observed, top, float(replay.hours[-1])), width="content")


def contributions_view(explained: Hour, trained: SavedMethod) -> None:
    """The "Why" of a method that explains each risk by its variables: the variables that raised the hour's risk."""
    how = getattr(trained.method, "explained_by", "the model's own attribution")
    st.caption(
        f"Each variable's contribution to the risk's log-odds at this hour ({how}), all its features summed "
        "(last value, hours since it, means and spread over the last hours); the variables that raised the "
        "risk, largest first"
    )
    bars = contribution_bars(explained)
    if bars.empty:
        st.write("No variable raised the risk above the model's baseline at this hour.")
    else:
        st.vega_lite_chart(*charts.bar_chart(bars, "variable", "contribution", "contribution"), width="stretch")


# ---------------------------------------------------------------------------------------------------------------
# The model view: what the run logged


@shown_plainly
def model_view(store: str, run: mlflow.entities.Run, policy: AlertPolicy) -> None:
    threshold = policy.threshold
    hourly_test = None
    metrics = run.data.metrics
    names = {"test_auroc": "AUROC", "test_auprc": "AUPRC", "test_brier": "Brier", "test_ece": "ECE"}
    for column, (key, name) in zip(st.columns(len(names)), names.items()):
        column.metric(f"Test {name}", f"{metrics[key]:.3f}" if key in metrics else "—")
    try:
        test = cached_predictions(store, run.info.run_id, "test")
    except RunNotFoundError as exc:
        st.warning(plain(exc))
    else:
        flagged = test["risk"] >= threshold
        positives = test["label"] == 1
        sensitivity = (flagged & positives).sum() / max(positives.sum(), 1)
        specificity = (~flagged & ~positives).sum() / max((~positives).sum(), 1)
        rows = "hours" if "time" in test else "stays"  # an hourly run's predictions: one row per prediction time
        hourly_test = test if "time" in test else None
        st.markdown(
            f"At the alert threshold {threshold:.2f} on the test split: sensitivity {sensitivity:.2f}, "
            f"specificity {specificity:.2f}, {flagged.mean():.0%} of {rows} flagged."
        )
    if "test_utility" in metrics:
        st.markdown(
            f"At the threshold it chose on validation ({metrics['threshold']:.3f}), the Sepsis Challenge's "
            f"utility on the test stays is {metrics['test_utility']:.3f}: "
            f"{metrics['test_warned_in_time']:.0%} of septic stays warned in time, a median "
            f"{metrics['test_median_warning_hours']:g} h before onset, "
            f"{metrics['test_false_alarms_per_100_days']:.0f} false alarms per 100 patient-days."
        )
    if hourly_test is not None:
        burden_view(hourly_test, policy, run.info.run_id)
    params = run.data.params
    st.caption(f"Run {run.info.run_id} · dataset {params.get('dataset', '?')} · split {params.get('split', '?')}")
    for column, (path, caption) in zip(st.columns(2) * 2, MODEL_PLOTS.items()):
        image = cached_artifact(store, run.info.run_id, path)
        unexplained = run.data.tags.get(run_contract.EXPLANATIONS_TAG)
        if image is None and path.startswith(run_contract.EXPLANATIONS) and unexplained:
            column.info(f"No explanation plot: {unexplained}.")
        elif image is None:
            column.warning(f"The run logged no {path}.")
        else:
            # Inline, not through Streamlit's /media/ route, which a login token closes (garlic.app.access.Gate).
            column.html(f'<img src="data:image/png;base64,{base64.b64encode(image).decode()}" style="width:100%">')
            column.caption(caption)


def burden_view(test: pd.DataFrame, policy: AlertPolicy, run_id: str) -> None:
    """An hourly run's alerts on its test stays, counted per alert under the policy, and its burden curves: what a
    bedside team reads to pick its operating point."""
    try:
        scored = alerting.scores(alerting.as_parts(alerting.stay_alerts(policy, test)))
        curve = alerting.curve_scores(alerting.burden_curve(policy, test))
    except ValueError as exc:
        st.warning(f"No per-alert scores: {plain(exc)}")
        return
    st.markdown(
        f"Per alert, under its policy ({policy.describe()}), on the test stays: sensitivity "
        f"{scored['sensitivity']:.0%}, PPV {scored['ppv']:.0%}, a median lead of {scored['lead_median']:g} h, "
        f"{scored['alerts_per_100_days']:.1f} alerts per 100 patient-days, {scored['share_alerted']:.0%} of "
        "stays alerted (docs/alerts.md)."
    )
    figure = plots.burden_figure(
        {run_id[:8]: curve},
        {run_id[:8]: (scored["alerts_per_100_days"], scored["sensitivity"], scored["ppv"])},
        "Test stays",
    )
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=90)
    plots.plt.close(figure)
    st.html(f'<img src="data:image/png;base64,{base64.b64encode(image.getvalue()).decode()}" style="width:100%">')
    st.caption(
        "Burden curves: sensitivity and PPV per alert against alerts per 100 patient-days as the threshold "
        "moves, the rest of the policy kept; the dot is the policy in use."
    )


# ---------------------------------------------------------------------------------------------------------------


@shown_plainly
def page(config: argparse.Namespace) -> None:
    store, data_root = str(config.mlruns), str(config.data_root)
    run_id = choose_run(config.mlruns, config.run)
    if run_id is None:
        return
    try:
        trained, run = cached_run(store, run_id)
    except (RunNotFoundError, FileNotFoundError, ValueError) as exc:
        log.warning("run %s cannot be used: %s", run_id, exc)
        st.error(f"Cannot use run {run_id}: {plain(exc)}")
        return

    ward = None
    if config.ward:
        try:
            ward = cached_ward(config.ward, run_id)
        except (StoreError, OSError) as exc:
            st.error(f"Cannot open the live ward: {plain(exc)}")
    asked = st.query_params.get("bed", "")  # a link to one bed of the ward: ?bed=ID, opened once
    if ward is not None and asked and st.session_state.get("asked_bed") != asked:
        st.session_state.update(asked_bed=asked, source=LIVE, bed=asked, view="Bedside")
    sources_offered = [LIVE, TEST_SPLIT, UPLOAD] if ward is not None else [TEST_SPLIT, UPLOAD]
    source = st.sidebar.radio("Stay", sources_offered, key="source")
    policy_default, threshold_help = default_policy(store, run_id, config.profile)
    threshold = st.sidebar.number_input(
        "Alert threshold",
        0.001,
        1.0,
        round(policy_default.threshold, 3),
        step=0.01,
        format="%.3f",
        key=f"threshold-{run_id}",
        help=threshold_help,
    )
    st.sidebar.caption(threshold_help)
    policy = AlertPolicy(threshold, policy_default.band, policy_default.quiet_hours, policy_default.margin)
    if ward is not None:
        ward_tab, bedside, model = st.tabs(["Ward", "Bedside", "Model"], key="view", on_change="rerun")
        with ward_tab:
            st.fragment(ward_view, run_every=WARD_REFRESH_SECONDS)(ward)
    else:
        bedside, model = st.tabs(["Bedside", "Model"])
    with model:
        model_view(store, run, policy)
    with bedside:
        if source == LIVE:
            chosen = choose_bed(ward, trained)
        elif source == TEST_SPLIT:
            chosen = choose_test_stay(store, run_id, data_root)
        else:
            chosen = choose_upload(store, run_id)
        if chosen is None:
            return
        replay, title = chosen
        follow_stay(replay, f"{run_id}:{title}")
        st.sidebar.subheader("Replay")
        speed = SPEEDS[
            st.sidebar.select_slider("Speed", list(SPEEDS), value="4 h/s", key="speed", on_change=restart_clock)
        ]
        playing = st.session_state.playing
        onsets = cached_onsets(store, run_id, data_root) if source == TEST_SPLIT else pd.Series(dtype=float)
        st.fragment(bedside_view, run_every=1.0 / speed if playing else None)(
            replay, title, policy, trained, speed, playing, onsets, hourly_run(store, run_id)
        )


def main() -> None:
    config = settings(sys.argv[1:])
    # One thread per forward pass: the passes are small, and on a busy machine (or with several sessions) two
    # threads that wait on each other were several times slower than one (experiments/benchmark_dashboard.py).
    torch.set_num_threads(1)
    st.set_page_config(page_title="GARLIC-ICU bedside", page_icon="🫀", layout="wide")
    st.title("GARLIC-ICU · bedside risk")
    if not admitted():
        return
    folders.update(STORE=config.mlruns, DATA=config.data_root)
    if config.ward and config.ward.startswith("sqlite:///"):
        folders.update(WARD=Path(config.ward.removeprefix("sqlite:///")).parent)
    st.session_state.setdefault("playing", False)
    st.session_state.setdefault("hour", 1)
    st.session_state.setdefault("clock", (time.monotonic(), 1))
    page(config)


main()
