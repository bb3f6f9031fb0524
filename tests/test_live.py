"""The live ward (``garlic.live``) for real: a uvicorn server on a loopback port, a SQLite file, FHIR resources
posted as a bedside feed posts them, the tiny synthetic run's model scoring them."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fhir.resources", reason="the live ward validates FHIR with fhir.resources: bin/setup live")
pytest.importorskip("uvicorn", reason="the live ward's service runs on uvicorn: bin/setup live")

from garlic.inference import predict_tables  # noqa: E402
from garlic.evaluation.alerting import policy_for  # noqa: E402
from garlic.live.codes import Codes  # noqa: E402
from garlic.live.feed import Client, encounter, feed, observation, recorded_stays  # noqa: E402
from garlic.live.monitor import Monitor  # noqa: E402
from garlic.live.scoring import BedScorer  # noqa: E402
from garlic.live.service import create_app  # noqa: E402
from garlic.live.store import LiveStore, StoreError  # noqa: E402
from garlic.methods.saved import load_predictor  # noqa: E402
from garlic.metrics.alert_policy import AlertPolicy  # noqa: E402
from helpers import tiny_run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOKEN = "3f9a1c0e7b2d4a68"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory)


@pytest.fixture(scope="module")
def trained(run):
    return load_predictor(run.run_id, run.store)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def service(
    run,
    trained,
    url: str,
    token: str | None = None,
    port: int | None = None,
    codes: Codes | None = None,
    policy: AlertPolicy | None = None,
):
    """``garlic monitor``'s service and scoring loop in this process, on loopback ``port`` (default: a free one),
    reading ``codes`` (default: ``codes.csv``'s), alerting by ``policy`` (default: the run's): (base URL, monitor)."""
    import uvicorn

    found = policy_for(run.run_id, run.store)
    monitor = Monitor(LiveStore(url, run.run_id), BedScorer(trained, found.hourly), policy or found.policy)
    codes = codes or Codes(trained.config.dataset, trained.variables + trained.static_features)
    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(monitor, codes, token), host="127.0.0.1", port=port, log_level="warning")
    )
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    scoring = monitor.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", monitor
    finally:
        server.should_exit = True
        monitor.stop()
        serving.join(10)
        scoring.join(10)
        monitor.store.close()


def get(url: str, token: str | None = None):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def request(method: str, url: str, body: bytes, token: str | None = None) -> tuple[int, dict]:
    """The service's status and JSON answer; its answer is read even when it refused the body before the end of
    it (an oversized one) and closed the connection meanwhile."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    headers = {"Content-Type": "application/fhir+json", **({"Authorization": f"Bearer {token}"} if token else {})}
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        try:
            connection.request(method, parts.path, body, headers)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def counted(url: str, body: bytes, token: str | None = None) -> tuple[int, dict]:
    """A POST's status and its counts (the readings it stored, repeated, withdrew: the X-Garlic-* headers)."""
    headers = {"Content-Type": "application/fhir+json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30) as answer:
            return answer.status, {
                name: int(answer.headers[f"X-Garlic-{name.title()}"]) for name in ("stored", "repeats", "withdrawn")
            }
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def scored(base: str, token: str | None = None, timeout: float = 60) -> dict:
    """The service's counts once nothing is left to score."""
    deadline = time.monotonic() + timeout
    while (counts := get(f"{base}/health", token))["pending"] and time.monotonic() < deadline:
        time.sleep(0.1)
    return counts


def test_posted_readings_get_the_offline_risk_of_the_same_prefix(run, trained, tmp_path):
    dataset, observations, static = recorded_stays(run.run_id, run.store, run.data_root, beds=2)
    assert static["stay_id"].nunique() == 2
    for beds in (0, -3):  # a slice would take all the test stays but the last three
        with pytest.raises(ValueError, match=f"--beds must be at least 1, got {beds}"):
            recorded_stays(run.run_id, run.store, run.data_root, beds=beds)
    codes = Codes(dataset, trained.variables + trained.static_features)
    # A policy whose threshold the risks cross, with a band and quiet hours: the ward's alerts must be the offline
    # policy's on the same risks, time by time, though the readings arrive over many scoring rounds.
    offline_risks = predict_tables(trained, observations, static)["risk"]
    policy = AlertPolicy(float(offline_risks.median()), band=0.05, quiet_hours=2, margin=0.2)
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}", policy=policy) as (base, _):
        fed = feed(Client(base), observations, static, codes, speed=1e7)
        counts = scored(base)
        assert (
            fed.sent
            == fed.stored
            == counts["readings"]
            == counts["scored"]
            == len(observations) + static[trained.static_features].notna().sum().sum()
        )
        ward = get(f"{base}/ward")
        assert [bed["risk"] for bed in ward] == sorted((bed["risk"] for bed in ward), reverse=True)
        for stay in static["stay_id"]:
            history = get(f"{base}/beds/{stay}")["scores"]
            stay_observations = observations[observations["stay_id"] == stay]
            times = np.unique(stay_observations["time"].to_numpy())
            assert [s["time"] for s in history][1:] == pytest.approx(
                times.tolist(), abs=1e-5
            )  # 0: descriptors; float32 times
            for score in history[1::7] + history[-1:]:  # every 7th time of the stay, and its last
                cut = stay_observations[stay_observations["time"] <= score["time"] + 1e-5]
                offline = predict_tables(trained, cut, static[static["stay_id"] == stay])["risk"].iloc[0]
                assert score["risk"] == pytest.approx(float(offline), abs=1e-6)
                assert score["drivers"] and set(score["drivers"]) <= set(trained.variables)
            risks = np.array([np.nan if s["risk"] is None else s["risk"] for s in history])
            alarms = policy.alarms(risks, [s["time"] for s in history], [len(history)])
            assert [s["alert"] for s in history] == alarms.tolist()
        assert any(s["alert"] for stay in static["stay_id"] for s in get(f"{base}/beds/{stay}")["scores"])


def test_a_repeat_counts_once_and_a_late_reading_is_scored_at_its_time(run, trained, tmp_path):
    codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
    from datetime import datetime, timedelta, timezone

    start = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    readings = [("HR", 2.0, 120.0), ("HR", 4.0, 130.0), ("Lactate", 1.0, 6.0)]  # the lactate comes in late
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}") as (base, _):
        assert request("PUT", f"{base}/fhir/Encounter/bed-7", json.dumps(encounter("bed-7", start)).encode())[0] == 200
        answers = []
        for variable, hours, value in readings + readings[:1]:
            resource = observation(codes, "bed-7", variable, start + timedelta(hours=hours), value)
            answers.append(request("POST", f"{base}/fhir/Observation", json.dumps(resource).encode()))
            scored(base)
        assert [status for status, _ in answers] == [201, 201, 201, 200]  # the repeat: 200, the reading held
        assert answers[3][1]["id"] == answers[0][1]["id"] and answers[3][1]["meta"] == answers[0][1]["meta"]
        history = get(f"{base}/beds/bed-7")
    assert [len(history["readings"]), [s["time"] for s in history["scores"]]] == [3, [1.0, 2.0, 4.0]]
    import pandas as pd

    table = pd.DataFrame([{"stay_id": 7, "variable": v, "time": t, "value": x} for v, t, x in readings])
    static = pd.DataFrame({"stay_id": [7], **{name: [np.nan] for name in trained.static_features}})
    for score in history["scores"]:
        cut = table[table["time"] <= score["time"]].astype({"time": "float32", "value": "float32"})
        assert score["risk"] == pytest.approx(float(predict_tables(trained, cut, static)["risk"].iloc[0]), abs=1e-6)


def test_a_hospitals_own_code_table_is_read_instead_of_the_built_in_one_and_checked_line_by_line(
    run, trained, tmp_path
):
    from datetime import datetime, timezone

    from garlic.config import ConfigError
    from garlic.live.codes import GARLIC_SYSTEM, LOINC
    from helpers import garlic_here

    names = trained.variables + trained.static_features
    own = tmp_path / "codes.csv"
    own.write_text(
        "variable,system,code,unit\nHR,http://hospital.example/obs,hr-42,/min\n"
        "Lactate,http://hospital.example/lab,LAC,mmol/L\n"
    )
    codes = Codes(trained.config.dataset, names, own)
    assert [
        codes.variable("http://hospital.example/obs", "hr-42"),
        codes.variable(GARLIC_SYSTEM, "Temp"),
        codes.variable(LOINC, "8867-4"),
    ] == ["HR", "Temp", None]  # instead of codes.csv's LOINC codes
    start = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}", codes=codes) as (base, _):
        assert request("PUT", f"{base}/fhir/Encounter/bed-1", json.dumps(encounter("bed-1", start)).encode())[0] == 200
        reading = observation(codes, "bed-1", "Lactate", start.replace(hour=9), 4.2)  # as garlic feed --codes sends
        assert (reading["code"]["coding"][0]["code"], reading["valueQuantity"]["code"]) == ("LAC", "mmol/L")
        assert request("POST", f"{base}/fhir/Observation", json.dumps(reading).encode())[0] == 201
        assert scored(base)["scored"] == 1
        assert get(f"{base}/ward")[0]["risk"] is not None
        loinc = observation(Codes(trained.config.dataset, names), "bed-1", "HR", start.replace(hour=9), 90.0)
        status, answer = request("POST", f"{base}/fhir/Observation", json.dumps(loinc).encode())
        assert (status, answer["issue"][0]["diagnostics"]) == (
            422,
            "Observation.code: http://loinc.org|8867-4 is "
            "not an input of this model (the monitor's "
            "--codes table lists the codes it reads)",
        )

    header = "variable,system,code,unit\n"
    bad = {
        "variable,code\nHR,hr-42\n": "has no column system (expected a header of variable, system, code",
        header + "HR,http://h/obs,hr-42,/min\nLactose,http://h/lab,LAC,\n": "line 3: 'Lactose' is not an input of",
        header + "HR,http://h/obs,hr-42,\nTemp,http://h/obs,hr-42,\n": "line 3: http://h/obs|hr-42 is given "
        "already, on line 2",
        header + "HR,,hr-42,\n": "line 2: system and code are required",
        header: "maps no code to an input of this model",
        "variable,system,code\nHR,http://h/obs,\xe9\n".encode("latin-1"): "cannot be read",
    }
    for text, says in bad.items():
        own.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(ConfigError, match=re.escape(says)) as refused:
            Codes(trained.config.dataset, names, own)
        assert str(own) in str(refused.value)
    pipe = tmp_path / "codes-pipe.csv"
    os.mkfifo(pipe)  # nothing writes to it: opened, it would wait for ever
    with pytest.raises(ConfigError, match="is not a file"):
        Codes(trained.config.dataset, names, pipe)
    result = garlic_here(
        "monitor", "--run", run.run_id, "--codes", str(own), "--port", str(free_port()), root=run.data_root.parent
    )
    assert result.returncode != 0 and "cannot be read" in result.stderr and "Traceback" not in result.stderr


def test_the_ward_lists_a_bed_admitted_with_no_reading_yet_beside_one_with_readings(run, trained, tmp_path):
    from datetime import datetime, timezone

    codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
    start = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}") as (base, _):
        for bed in ("bed-1", "bed-2"):
            assert request("PUT", f"{base}/fhir/Encounter/{bed}", json.dumps(encounter(bed, start)).encode())[0] == 200
        reading = observation(codes, "bed-1", "HR", start.replace(hour=9), 90.0)
        assert request("POST", f"{base}/fhir/Observation", json.dumps(reading).encode())[0] == 201
        scored(base)
        ward = get(f"{base}/ward")  # was a 500: the empty bed's count of readings came back as NaN
    assert [(bed["bed"], bed["readings"], bed["risk"] is None, bed["alert"], bed["drivers"]) for bed in ward][1] == (
        "bed-2",
        0,
        True,
        False,
        [],
    )
    assert (ward[0]["bed"], ward[0]["readings"]) == ("bed-1", 1)


def test_a_corrected_or_withdrawn_reading_leaves_the_bed_with_the_offline_risks_of_its_readings_without_it(
    run, trained, tmp_path
):
    from datetime import datetime, timedelta, timezone

    import pandas as pd

    codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
    start = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    held = {
        "hr-1": ("HR", 1.0, 95.0),
        "lac-2": ("Lactate", 2.0, 9.5),
        "hr-3": ("HR", 3.0, 300.0),
        "hr-4": ("HR", 4.0, 110.0),
    }

    def send(base: str, source: str, status: str = "final") -> tuple[int, dict]:
        variable, hours, value = held.get(source, ("HR", 1.0, 90.0))
        resource = {
            **observation(codes, "bed-3", variable, start + timedelta(hours=hours), value),
            "id": source,
            "status": status,
        }
        answer = counted(f"{base}/fhir/Observation", json.dumps(resource).encode())
        scored(base)
        return answer

    def offline_risks_match(base: str) -> None:
        """Every risk of the bed's history (and its newest, on the ward) is the offline risk of its readings held."""
        table = pd.DataFrame([{"stay_id": 3, "variable": v, "time": t, "value": x} for v, t, x in held.values()])
        static = pd.DataFrame({"stay_id": [3], **{name: [np.nan] for name in trained.static_features}})
        history = get(f"{base}/beds/bed-3")
        assert sorted((r["variable"], r["time"], r["value"]) for r in history["readings"]) == sorted(held.values())
        assert [score["time"] for score in history["scores"]] == sorted({t for _, t, _ in held.values()})
        for score in history["scores"]:
            cut = table[table["time"] <= score["time"]].astype({"time": "float32", "value": "float32"})
            offline = float(predict_tables(trained, cut, static)["risk"].iloc[0])
            assert score["risk"] == pytest.approx(offline, abs=1e-6), score
        newest = float(
            predict_tables(trained, table.astype({"time": "float32", "value": "float32"}), static)["risk"].iloc[0]
        )
        ward = get(f"{base}/ward")[0]
        assert (ward["time"], ward["risk"]) == (max(t for _, t, _ in held.values()), pytest.approx(newest, abs=1e-6))

    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}") as (base, monitor):
        assert request("PUT", f"{base}/fhir/Encounter/bed-3", json.dumps(encounter("bed-3", start)).encode())[0] == 200
        for source in held:
            assert send(base, source) == (201, {"stored": 1, "repeats": 0, "withdrawn": 0})
        offline_risks_match(base)
        held["hr-3"] = ("HR", 3.0, 130.0)  # the 300 was a typing mistake: corrected, at a step the bed took
        assert send(base, "hr-3", "corrected") == (201, {"stored": 1, "repeats": 0, "withdrawn": 1})
        offline_risks_match(base)
        del held["lac-2"]  # entered in error, before the bed's last step
        assert send(base, "lac-2", "entered-in-error") == (200, {"stored": 0, "repeats": 0, "withdrawn": 1})
        assert send(base, "lac-2", "entered-in-error") == (200, {"stored": 0, "repeats": 1, "withdrawn": 0})
        offline_risks_match(base)
        del held["hr-4"]  # the bed's newest reading withdrawn: its newest risk is that of the reading before
        assert send(base, "hr-4", "entered-in-error")[1]["withdrawn"] == 1
        offline_risks_match(base)
        held["hr-4"] = ("HR", 4.0, 110.0)  # sent again after all: taken back
        assert send(base, "hr-4") == (201, {"stored": 1, "repeats": 0, "withdrawn": 0})
        offline_risks_match(base)
        held["hr-4"] = ("HR", 4.0, 150.0)  # the newest reading corrected: as many readings at the bed's last step
        assert send(base, "hr-4", "amended") == (201, {"stored": 1, "repeats": 0, "withdrawn": 1})
        offline_risks_match(base)
        status, answer = send(base, "hr-9", "entered-in-error")
        assert (status, answer["issue"][0]["diagnostics"]) == (404, "bed bed-3 holds no reading sent with the id hr-9")
        no_id = {**observation(codes, "bed-3", "HR", start, 90.0), "status": "entered-in-error"}
        status, answer = request("POST", f"{base}/fhir/Observation", json.dumps(no_id).encode())
        assert status == 422 and answer["issue"][0]["diagnostics"].startswith("Observation.id is required to withdraw")
        only = {**observation(codes, "bed-4", "HR", start + timedelta(hours=1), 300.0), "id": "x-1"}
        assert request("PUT", f"{base}/fhir/Encounter/bed-4", json.dumps(encounter("bed-4", start)).encode())[0] == 200
        assert request("POST", f"{base}/fhir/Observation", json.dumps(only).encode())[0] == 201
        assert scored(base) and get(f"{base}/ward")[0]["bed"] == "bed-4"  # a risk above bed-3's
        only["status"] = "entered-in-error"  # the bed's one reading: none left, and no risk
        assert counted(f"{base}/fhir/Observation", json.dumps(only).encode())[1]["withdrawn"] == 1
        scored(base)
        assert [(b["bed"], b["risk"], b["readings"]) for b in get(f"{base}/ward")][1] == ("bed-4", None, 0)
        assert monitor.store.counts() == {"beds": 2, "readings": 3, "scored": 3, "withdrawn": 4, "pending": 0}


def nested(observation: dict, depth: int) -> dict:
    """``observation`` with an extension that holds an extension ... ``depth`` deep (valid FHIR)."""
    extension: dict = {"url": "http://example.org/inner"}
    for _ in range(depth):
        extension = {"url": "http://example.org/outer", "extension": [extension]}
    return {**observation, "extension": [extension]}


def test_a_live_store_that_cannot_be_used_is_named_as_the_live_store_in_one_line(tmp_path):
    from garlic.tracking.local_store import database_error

    (tmp_path / "notes.txt").write_text("not a database\n" * 100)
    cases = {
        f"sqlite:///{tmp_path / 'notes.txt'}": "cannot be used: file is not a database",
        f"sqlite:///{tmp_path / 'absent' / 'ward.sqlite'}": "cannot be used: unable to open database file",
        "postgresql+nodriver://nurse:secret@127.0.0.1/ward": "needs a driver that is not installed",
        "ward at secret": "is not a database URL",
    }
    for url, says in cases.items():
        with pytest.raises(StoreError, match=says) as raised:
            LiveStore(url, "run")
        assert "secret" not in str(raised.value)
        assert database_error(raised.value) is None  # so the command says this, not that the MLflow store is damaged


@pytest.fixture(scope="module")
def postgresql():
    """A PostgreSQL server of this module's own (``initdb`` and ``pg_ctl`` on the PATH, psycopg installed: ``bin/setup
    live``), run as the user nobody where the tests run as root (PostgreSQL refuses root): a function that makes a
    fresh database on it and returns its URL."""
    import shutil
    import tempfile

    pytest.importorskip("psycopg", reason="a PostgreSQL store needs psycopg: bin/setup live")
    if not (shutil.which("initdb") and shutil.which("pg_ctl")):
        pytest.skip("no PostgreSQL server on this machine (initdb, pg_ctl)")
    as_user = []
    folder = Path(tempfile.mkdtemp(prefix="garlic-postgresql-"))
    if os.geteuid() == 0:
        import pwd

        if not shutil.which("runuser"):
            pytest.skip("PostgreSQL refuses to run as root, and there is no runuser to run it as nobody")
        nobody = pwd.getpwnam("nobody")
        os.chown(folder, nobody.pw_uid, nobody.pw_gid)
        as_user = ["runuser", "-u", "nobody", "--"]
    data, port = folder / "data", free_port()
    try:
        subprocess.run(
            [*as_user, "initdb", "-D", str(data), "-A", "trust", "-U", "ward"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [
                *as_user,
                "pg_ctl",
                "-D",
                str(data),
                "-o",
                f"-p {port} -k {folder}",
                "-l",
                str(folder / "log"),
                "-w",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as failed:  # the machine's, not the store's
        log = (folder / "log").read_text()[-300:] if (folder / "log").is_file() else ""
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"a PostgreSQL server could not be started here: {failed} {log}")
    import sqlalchemy as sa

    server = sa.create_engine(f"postgresql+psycopg://ward@127.0.0.1:{port}/postgres", isolation_level="AUTOCOMMIT")
    made = []

    def database() -> str:
        made.append(f"ward{len(made)}")
        with server.connect() as db:
            db.execute(sa.text(f"CREATE DATABASE {made[-1]}"))
        return f"postgresql+psycopg://ward@127.0.0.1:{port}/{made[-1]}"

    try:
        yield database
    finally:
        server.dispose()
        subprocess.run([*as_user, "pg_ctl", "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """An empty database for a live store: a SQLite file, and a PostgreSQL database where a server can be run."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ward.sqlite'}"
    return request.getfixturevalue("postgresql")()


def test_a_store_of_the_first_layout_is_brought_to_the_third_with_its_readings_and_scores_kept(store_url):
    import sqlalchemy as sa
    from datetime import datetime, timezone

    from garlic.live.fhir import Observed, Withdrawal
    from garlic.live.store import BEDS, META, READINGS, SCORES

    url = store_url
    first = sa.MetaData()  # layout 1: the readings without their source and withdrawn columns, the beds' patient
    for table in (META, SCORES):
        table.to_metadata(first)
    sa.Table(
        "beds",
        first,
        *[
            sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in BEDS.columns
            if c.name != "patient"
        ],
    )
    sa.Table(
        "readings",
        first,
        *[
            sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in READINGS.columns
            if c.name not in ("source", "withdrawn")
        ],
        sa.UniqueConstraint("bed", "variable", "time", "value"),
    )
    engine = sa.create_engine(url)
    first.create_all(engine)
    admitted = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    with engine.begin() as db:
        db.execute(META.insert(), [{"key": "run_id", "value": "run"}, {"key": "schema", "value": "1"}])
        db.execute(BEDS.insert().values(bed="bed-1", admitted=admitted.timestamp(), discharged=None))
        db.execute(
            first.tables["readings"]
            .insert()
            .values(bed="bed-1", variable="HR", time=1.0, value=90.0, received=0.0, scored=True)
        )
        db.execute(SCORES.insert().values(bed="bed-1", time=1.0, risk=0.2, alert=False, drivers="[]", scored_at=0.0))
    engine.dispose()
    store = LiveStore(url, "run")
    try:
        assert store.counts() == {"beds": 1, "readings": 1, "scored": 1, "withdrawn": 0, "pending": 0}
        assert store.history("bed-1")["risk"].tolist() == [0.2]
        at = admitted.replace(hour=10)
        assert store.add([Observed("bed-1", "HR", at, 95.0, "obs-2")]) == (1, 0, 0)
        assert store.add([Withdrawal("bed-1", "obs-2")]) == (0, 0, 1)
        assert store.readings(["bed-1"])[["time", "value"]].values.tolist() == [[1.0, 90.0]]
        plain = Observed("bed-1", "HR", at, 95.0)  # the withdrawn reading sent again with no id, as feeds send
        assert [store.add([plain]), store.add([plain])] == [(1, 0, 0), (0, 1, 0)]  # taken back, then a repeat
        assert store.readings(["bed-1"])[["time", "value"]].values.tolist() == [[1.0, 90.0], [2.0, 95.0]]
        later = at.replace(hour=12)
        assert store.add([Observed("bed-1", "HR", later, 99.0)]) == (1, 0, 0)  # from a feed without ids
        assert store.add([Observed("bed-1", "HR", later, 99.0, "obs-3")]) == (0, 1, 0)  # held: named obs-3 now
        assert store.add([Withdrawal("bed-1", "obs-3")]) == (0, 0, 1)
        versions = [Observed("bed-1", "HR", later, value, "obs-9") for value in (140.0, 104.0)]  # in one request
        assert store.add(versions) == (2, 0, 1)  # the second replaces the first
        assert store.readings(["bed-1"])["value"].tolist()[-1:] == [104.0]
        more = [Observed("bed-1", "HR", at.replace(minute=minute), 80.0) for minute in range(1, 50)]
        assert [store.add(more), store.add(more[:10])] == [(49, 0, 0), (0, 10, 0)]  # counted in one statement too
    finally:
        store.close()
    LiveStore(url, "run").close()  # opened again: layout 3 already


def test_bad_requests_get_a_clear_4xx_and_change_nothing(run, trained, tmp_path):
    from datetime import datetime, timezone

    codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
    start = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    good = observation(codes, "bed-1", "HR", start, 90.0)
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}", token=TOKEN) as (base, monitor):
        put = request("PUT", f"{base}/fhir/Encounter/bed-1", json.dumps(encounter("bed-1", start)).encode(), TOKEN)
        assert put[0] == 200
        assert request("POST", f"{base}/fhir", json.dumps(good).encode(), TOKEN)[0] == 201
        scored(base, TOKEN)
        before = monitor.store.counts()
        unknown = {**good, "code": {"coding": [{"system": "http://loinc.org", "code": "0000-0"}]}}
        later = observation(codes, "bed-1", "HR", start.replace(hour=9), 95.0)
        bad = {
            "malformed": (b'{"resourceType": "Observation", ', TOKEN, 400, "not JSON"),
            "nested past the parser's depth": (b"[" * 100_000 + b"]" * 100_000, TOKEN, 400, "nests deeper"),
            "nested past the FHIR models' depth": (json.dumps(nested(good, 400)).encode(), TOKEN, 400, "nests deeper"),
            "a number of 5,000 digits": (json.dumps(good).replace("90.0", "9" * 5000).encode(), TOKEN, 400, "not JSON"),
            "oversized": (b" " * (2 << 20), TOKEN, 413, "bytes"),
            "unknown code": (json.dumps(unknown).encode(), TOKEN, 422, "0000-0 is not an input of this model"),
            "a thousand unknown codes": (
                json.dumps(
                    {
                        **good,
                        "code": {"coding": [{"system": "http://loinc.org", "code": f"0000-{n}"} for n in range(1000)]},
                    }
                ).encode(),
                TOKEN,
                422,
                "0000-2 (and 997 more codings) is not",
            ),
            "not FHIR": (
                json.dumps({**good, "valueQuantity": {"value": "high"}}).encode(),
                TOKEN,
                422,
                "valueQuantity",
            ),
            "in another unit": (
                json.dumps({**good, "valueQuantity": {"value": 1.5, "unit": "beats/s"}}).encode(),
                TOKEN,
                422,
                "'beats/s' is not a unit this service reads for HR (it reads HR in /min",
            ),
            "wrong bed": (
                json.dumps(observation(codes, "bed-2", "HR", start, 90.0)).encode(),
                TOKEN,
                404,
                "bed-2 is not admitted",
            ),
            "a bundle with one bad entry": (
                json.dumps(
                    {"resourceType": "Bundle", "type": "batch", "entry": [{"resource": later}, {"resource": unknown}]}
                ).encode(),
                TOKEN,
                422,
                "entry[1]",
            ),
            "dated years ahead": (
                json.dumps(observation(codes, "bed-1", "HR", start.replace(year=9999), 90.0)).encode(),
                TOKEN,
                422,
                "minutes after the service's clock; at most 5 minutes",
            ),
            "unauthenticated": (json.dumps(later).encode(), None, 401, "token"),
            "a wrong token": (json.dumps(later).encode(), TOKEN[::-1], 401, "token"),
        }
        for name, (body, token, status, says) in bad.items():
            answer = request("POST", f"{base}/fhir", body, token)
            assert (name, answer[0]) == (name, status)
            assert says in answer[1]["issue"][0]["diagnostics"], name
        assert monitor.store.counts() == before
        assert request("GET", f"{base}/ward", b"", None)[0] == 401


def test_a_unit_ucum_converts_is_converted_another_spelling_taken_and_any_other_unit_refused_whatever_its_system():
    from datetime import datetime, timezone

    from garlic.live.fhir import FhirError, observations_in

    codes = Codes("synthetic", ["Temp", "SysABP", "Platelets", "GCS", "FiO2", "SaO2", "Weight"])
    at = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)

    def sent(variable: str, value: float, **quantity) -> dict:
        reading = observation(codes, "bed-1", variable, at, value)
        return {**reading, "valueQuantity": {"value": value, **quantity}}

    def read(reading: dict) -> float:
        return observations_in(reading, codes).all()[0].value

    ucum, local = "http://unitsofmeasure.org", "http://hospital.example/units"
    taken = [
        sent("Temp", 37.2, unit="°C", system=ucum, code="Cel"),
        sent("Temp", 37.2, unit="°C"),
        sent("SysABP", 120, unit="mmHg"),
        sent("SysABP", 120, system=ucum, code="mm[Hg]"),
        sent("Platelets", 210, unit="10^9/L"),
        sent("GCS", 14),
        observation(codes, "bed-1", "SysABP", at, 120),
    ]
    assert [read(reading) for reading in taken] == [37.2, 37.2, 120, 120, 210, 14, 120]
    converted = {  # as UCUM relates the units, whatever system (or none) the unit comes under
        "[degF] under UCUM": (sent("Temp", 98.6, system=ucum, code="[degF]", unit="°F"), 37.0),
        "[degF] without a system": (sent("Temp", 98.6, code="[degF]"), 37.0),
        "degF under a local system": (sent("Temp", 98.6, system=local, code="degF", unit="degF"), 37.0),
        "FiO2 in %": (sent("FiO2", 40, unit="%", system=ucum, code="%"), 0.4),
        "SaO2 as a fraction": (sent("SaO2", 0.97, system=ucum, code="1"), 97.0),
        "kPa": (sent("SysABP", 16.0, unit="kPa"), 120.01),
        "pounds": (sent("Weight", 176.37, system=ucum, code="[lb_av]"), 80.0),
    }
    for name, (reading, value) in converted.items():
        assert (name, read(reading)) == (name, pytest.approx(value, abs=0.01))
    refused = {
        "mmol/L": (
            sent("Platelets", 210, unit="mmol/L"),
            "'mmol/L' is not the unit of Platelets, which this model "
            "reads in 10*3/uL (accepted as '10*3/uL', '10^3/uL', "
            "'10*9/L', '10^9/L', 'K/uL'); UCUM gives no fixed "
            "conversion from mmol/L to it",
        ),
        "the code and the label disagree": (
            sent("Temp", 99.0, unit="°C", system=ucum, code="[degF]"),
            "code '[degF]' and unit '°C' name different units",
        ),
        "a local unit": (
            sent("Temp", 37.0, system=local, code="C-body"),
            "'C-body' is not a unit this service reads for Temp",
        ),
    }
    for name, (reading, says) in refused.items():
        with pytest.raises(FhirError, match=re.escape(says)) as refusal:
            observations_in(reading, codes)
        assert refusal.value.status == 422, name


def test_a_feed_without_a_service_says_so_once_and_gives_up_after_its_retry_time(monkeypatch):
    import garlic.live.feed as feeding

    monkeypatch.setattr(feeding, "RETRY_SECONDS", 1.2)
    said: list[str] = []
    client = Client(f"http://127.0.0.1:{free_port()}", say=said.append)  # nothing listens there
    with pytest.raises(ConnectionError, match="no answer from http://127.0.0.1:"):
        client.send("GET", "/health", {})
    assert len(said) == 1 and "Connection refused" in said[0] and "sending again for up to 1.2 s" in said[0]


def test_a_restart_in_the_middle_of_a_feed_loses_nothing(run, trained, tmp_path):
    # A real `garlic monitor` killed outright mid-feed; the feed keeps sending until a new service answers.
    dataset, observations, static = recorded_stays(run.run_id, run.store, run.data_root, beds=3)
    codes = Codes(dataset, trained.variables + trained.static_features)
    url = f"sqlite:///{tmp_path / 'ward.sqlite'}"
    port = free_port()
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    environment.pop("GARLIC_MONITOR_TOKEN", None)
    command = [
        sys.executable,
        "-m",
        "garlic.cli",
        "--mlruns",
        str(run.store),
        "monitor",
        "--run",
        run.run_id,
        "--store",
        url,
        "--port",
        str(port),
    ]
    first = subprocess.Popen(command, env=environment, stderr=subprocess.PIPE, text=True)
    fed, failed = [], []

    def feeding():
        try:
            fed.append(feed(Client(f"http://127.0.0.1:{port}"), observations, static, codes, speed=3600 * 20))
        except Exception as exc:  # noqa: BLE001  (reported by the assertion below)
            failed.append(exc)

    feeder = threading.Thread(target=feeding)
    try:
        feeder.start()
        readings = 0
        deadline = time.monotonic() + 120
        while readings < 200 and time.monotonic() < deadline:  # well into the feed, not at its end
            time.sleep(0.2)
            try:
                readings = get(f"http://127.0.0.1:{port}/health")["readings"]
            except OSError:
                pass
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert 200 <= readings < len(observations), readings
        with service(run, trained, url, port=port) as (base, _):  # a new service on the port the feed sends to
            feeder.join(120)
            counts = scored(base)
    finally:
        if first.poll() is None:
            first.kill()
    assert not failed and len(fed) == 1
    distinct = len(observations) + static[trained.static_features].notna().sum().sum()
    assert counts["readings"] == counts["scored"] == fed[0].sent == distinct  # sent = stored = scored


class NewestValue:
    """A stand-in for the model, so that each risk is set by hand: at each asked time, the value of the bed's newest
    reading up to it (the last one stored at that time)."""

    static_features: list[str] = []

    def reads_after(self, earliest):
        return {}  # every reading of a bed

    def forget(self, beds):
        pass  # it keeps nothing between rounds

    def score(self, readings, asked, partial):
        risks = [
            readings[(readings["bed"] == bed) & (readings["time"] <= time)]["value"].iloc[-1]
            for bed, time in zip(asked["bed"], asked["time"])
        ]
        return np.array(risks), [[] for _ in risks]


def test_each_alert_follows_from_the_alert_before_its_time_after_a_same_time_reading_a_late_one_and_a_restart(
    run, tmp_path
):
    from datetime import datetime, timedelta, timezone

    from garlic.live.fhir import Observed, Stay

    start = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    url = f"sqlite:///{tmp_path / 'ward.sqlite'}"
    alerts = AlertPolicy(0.5, band=0.5, quiet_hours=0, margin=0)  # on at 0.5, off below 0.25

    def ward() -> Monitor:
        return Monitor(LiveStore(url, run.run_id), NewestValue(), alerts)

    monitor = ward()
    monitor.store.admit(Stay("bed-1", True, start, None))
    # (hours, risk): on at hour 2; a second reading at hour 2 lowers its risk to 0.4, which from hour 1's "off" stays
    # off (from hour 2's first "on" it would have stayed on); a late one at 1.5 turns it on before hour 2; after a
    # restart, hour 3's 0.3 keeps it on.
    steps = [(1.0, 0.1), (2.0, 0.9), (2.0, 0.4), (1.5, 0.95), "restart", (3.0, 0.3)]
    expected = [
        {1.0: False},
        {1.0: False, 2.0: True},
        {1.0: False, 2.0: False},
        {1.0: False, 1.5: True, 2.0: True},
        {1.0: False, 1.5: True, 2.0: True, 3.0: True},
    ]
    seen = []
    for step in steps:
        if step == "restart":
            monitor.store.close()
            monitor = ward()
            continue
        hours, risk = step
        monitor.take([Observed("bed-1", "HR", start + timedelta(hours=hours), risk)])
        assert monitor.score_round() == 1
        history = monitor.store.history("bed-1")
        seen.append(dict(zip(history["time"], history["alert"].astype(bool))))
    monitor.store.close()
    assert seen == expected


def test_a_cleared_alert_stays_quiet_for_its_hours_across_a_restart_unless_the_risk_passes_the_margin(run, tmp_path):
    from datetime import datetime, timedelta, timezone

    from garlic.live.fhir import Observed, Stay

    start = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    url = f"sqlite:///{tmp_path / 'ward.sqlite'}"
    policy = AlertPolicy(0.5, band=0.2, quiet_hours=6, margin=0.5)  # on at 0.5, off below 0.4, back at once at 0.75
    monitor = Monitor(LiveStore(url, run.run_id), NewestValue(), policy)
    monitor.store.admit(Stay("bed-1", True, start, None))
    steps = [(1.0, 0.9), (2.0, 0.1), "restart", (3.0, 0.6), (6.0, 0.6), (7.5, 0.6), (8.0, 0.1), (9.0, 0.8)]
    # on at 1, off at 2; after the restart (the state read from the store) 0.6 at 3 and 6 stays quiet (within 6 hours
    # of hour 1), at 7.5 it is past them: on; off at 8; 0.8 at 9 passes 0.75: on at once.
    for step in steps:
        if step == "restart":
            monitor.store.close()
            monitor = Monitor(LiveStore(url, run.run_id), NewestValue(), policy)
            continue
        hours, risk = step
        monitor.take([Observed("bed-1", "HR", start + timedelta(hours=hours), risk)])
        assert monitor.score_round() == 1
    history = monitor.store.history("bed-1")
    monitor.store.close()
    assert history["alert"].astype(bool).tolist() == [True, False, False, False, True, False, True]
    assert history["alert"].astype(bool).tolist() == policy.alarms(history["risk"], history["time"], [7]).tolist()


class Recorded(NewestValue):
    """``NewestValue``, saying which scorer asked which bed at which times, and failing where two scorers score one
    bed at once."""

    def __init__(self, name: str, asked: list, busy: set, lock: threading.Lock):
        self.name, self.asked, self.busy, self.lock = name, asked, busy, lock

    def score(self, readings, asked, partial):
        beds = set(asked["bed"])
        with self.lock:
            assert not beds & self.busy, f"beds scored by two scorers at once: {sorted(beds & self.busy)}"
            self.busy |= beds
        time.sleep(0.005)  # long enough for the other scorers' rounds to overlap this one
        try:
            with self.lock:
                self.asked += [(self.name, bed, hours) for bed, hours in zip(asked["bed"], asked["time"])]
            return super().score(readings, asked, partial)
        finally:
            with self.lock:
                self.busy -= beds


def test_scorers_sharing_a_postgresql_store_score_each_beds_readings_once_in_order_by_one_at_a_time(postgresql, run):
    """Three scorers (own connections, as three processes have) over one PostgreSQL store while readings arrive:
    beds move between them (any scorer takes any bed at once), yet each bed's readings are scored in time order,
    each once, by one scorer at a time, and each alert follows from the bed's alert before it, whoever scored that."""
    from datetime import datetime, timedelta, timezone

    from garlic.live.fhir import Observed, Stay

    url, start = postgresql(), datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    policy = AlertPolicy(0.5, band=0.5, quiet_hours=2, margin=0.3)
    asked, busy, lock = [], set(), threading.Lock()
    scorers = [
        Monitor(
            LiveStore(url, run.run_id), Recorded(f"scorer {k}", asked, busy, lock), policy, shard=(0, 1), takeover=0.0
        )
        for k in range(3)
    ]  # one share: each takes any bed
    feeder = Monitor(LiveStore(url, run.run_id), NewestValue(), policy)  # stores only: it wakes no scorer
    beds, readings = [f"bed-{number}" for number in range(24)], 15
    for bed in beds:
        feeder.store.admit(Stay(bed, True, start, None))
    threads = [scorer.start() for scorer in scorers]
    rng = np.random.default_rng(5)
    risks = {bed: rng.uniform(0, 1, readings).round(3) for bed in beds}
    try:
        for hour in range(readings):  # each bed's readings in time order, a few beds to a request, as feeds send
            for part in range(0, len(beds), 5):
                feeder.take(
                    [
                        Observed(bed, "HR", start + timedelta(hours=hour), float(risks[bed][hour]))
                        for bed in beds[part : part + 5]
                    ]
                )
                time.sleep(0.03)  # readings keep arriving across many polls of the scorers
        deadline = time.monotonic() + 60
        while feeder.store.counts()["pending"] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for scorer in scorers:
            scorer.stop()
        for thread in threads:
            thread.join(10)
    counts = feeder.store.counts()
    assert counts["readings"] == counts["scored"] == len(beds) * readings and counts["pending"] == 0
    moved = 0
    for bed in beds:
        times = [hours for _, of, hours in asked if of == bed]
        assert times == [float(hour) for hour in range(readings)], bed  # in order, each once, none lost
        moved += len({name for name, of, _ in asked if of == bed}) > 1
        history = feeder.store.history(bed)
        assert len(history) == readings and history["risk"].tolist() == risks[bed].tolist()
        assert (
            history["alert"].astype(bool).tolist()
            == policy.alarms(history["risk"], history["time"], [readings]).tolist()
        )
    assert moved >= len(beds) // 2  # beds did move between scorers
    for scorer in [*scorers, feeder]:
        scorer.store.close()


def test_garlic_monitor_with_two_scorer_processes_on_postgresql_gives_the_offline_risks_and_alerts(
    postgresql, run, trained
):
    """``garlic monitor --scorers 2`` as run: the service and a second scoring process over one PostgreSQL store,
    each with its step states; every reading is scored, each risk the offline one, each alert the policy's."""
    url = postgresql()
    dataset, observations, static = recorded_stays(run.run_id, run.store, run.data_root, beds=4)
    codes = Codes(dataset, trained.variables + trained.static_features)
    port = free_port()
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    environment.pop("GARLIC_MONITOR_TOKEN", None)
    monitor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "garlic.cli",
            "--mlruns",
            str(run.store),
            "monitor",
            "--run",
            run.run_id,
            "--store",
            url,
            "--port",
            str(port),
            "--scorers",
            "2",
        ],
        env=environment,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                get(f"{base}/health")
                break
            except OSError:
                assert monitor.poll() is None, "garlic monitor stopped"
                time.sleep(0.3)
        fed = feed(Client(base), observations, static, codes, speed=1e7)
        counts = scored(base)
        assert fed.sent == fed.stored == counts["readings"] == counts["scored"]
        policy = policy_for(run.run_id, run.store).policy
        for stay in static["stay_id"]:
            history = get(f"{base}/beds/{stay}")["scores"]
            stay_observations = observations[observations["stay_id"] == stay]
            for score in history[1::5] + history[-1:]:
                cut = stay_observations[stay_observations["time"] <= score["time"] + 1e-5]
                offline = predict_tables(trained, cut, static[static["stay_id"] == stay])["risk"].iloc[0]
                assert score["risk"] == pytest.approx(float(offline), abs=1e-5)
            risks = np.array([np.nan if s["risk"] is None else s["risk"] for s in history])
            alarms = policy.alarms(risks, [s["time"] for s in history], [len(history)])
            assert [s["alert"] for s in history] == alarms.tolist()
    finally:
        monitor.terminate()
        _, said = monitor.communicate(timeout=60)
    assert "scorer 2 of 2 scoring store" in said and "2 scorers: this process and 1 more" in said


def test_more_than_one_scorer_on_a_sqlite_store_is_refused_in_one_line(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "garlic.cli", "--mlruns", str(tmp_path), "monitor", "--run", "0" * 32, "--scorers", "2"],
        env=environment,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "garlic: error: --scorers 2 needs a PostgreSQL store (--store postgresql+psycopg://...): SQLite has one "
        "writer, so one scorer"
    ]


def test_monitor_off_loopback_without_a_token_is_refused_in_one_line(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    environment.pop("GARLIC_MONITOR_TOKEN", None)
    result = subprocess.run(
        [sys.executable, "-m", "garlic.cli", "monitor", "--run", "0" * 32, "--host", "0.0.0.0"],
        env=environment,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "garlic: error: listening on 0.0.0.0 needs a login: set GARLIC_MONITOR_TOKEN to a secret of at least 16 "
        "characters (for example: export GARLIC_MONITOR_TOKEN=$(openssl rand -hex 16)), or keep the default --host "
        "127.0.0.1"
    ]


def test_a_pipe_or_a_device_in_the_watched_folder_is_left_out_and_the_watcher_goes_on(run, trained, tmp_path):
    from garlic.live.watch import FolderWatcher
    from garlic.sources.physionet2012 import format_record

    dataset, observations, static = recorded_stays(run.run_id, run.store, run.data_root, beds=1)
    stay = int(static["stay_id"].iloc[0])
    folder = tmp_path / "export"
    folder.mkdir()
    os.mkfifo(folder / "1.txt")  # opened for reading, a pipe waits for a writer that never comes
    (folder / "2.txt").symlink_to("/dev/zero")  # read to its end, a device never ends
    (folder / f"{stay}.txt").write_text(
        format_record(stay, observations, static.drop(columns="stay_id").iloc[0].to_dict())
    )
    monitor = Monitor(
        LiveStore(f"sqlite:///{tmp_path / 'ward.sqlite'}", run.run_id), BedScorer(trained), AlertPolicy(0.5)
    )
    watcher = FolderWatcher(folder, monitor, trained.variables + trained.static_features)
    scanned: list[int] = []
    scanning = threading.Thread(target=lambda: scanned.append(watcher.scan()), daemon=True)
    scanning.start()
    scanning.join(timeout=30)
    assert scanned == [len(observations) + len(trained.static_features)]
    assert monitor.store.counts()["beds"] == 1


def test_past_its_file_cap_the_watcher_reads_the_most_recently_changed_files_and_says_how_many_it_leaves(
    run, trained, tmp_path, monkeypatch, caplog
):
    import garlic.live.watch as watch
    from garlic.sources.physionet2012 import format_record

    dataset, observations, static = recorded_stays(run.run_id, run.store, run.data_root, beds=3)
    folder = tmp_path / "export"
    folder.mkdir()
    for age, (stay, rows) in enumerate(observations.groupby("stay_id")):  # the first stay's file the oldest
        record = static[static["stay_id"] == stay].drop(columns="stay_id").iloc[0].to_dict()
        (folder / f"{stay}.txt").write_text(format_record(int(stay), rows, record))
        os.utime(folder / f"{stay}.txt", ns=(age * 10**9, age * 10**9))
    monkeypatch.setattr(watch, "MAX_FILES", 2)
    monitor = Monitor(
        LiveStore(f"sqlite:///{tmp_path / 'ward.sqlite'}", run.run_id), BedScorer(trained), AlertPolicy(0.5)
    )
    watcher = watch.FolderWatcher(folder, monitor, trained.variables + trained.static_features)
    with caplog.at_level("WARNING", logger="garlic.live"):
        watcher.scan()
        watcher.scan()
    stays = sorted(observations["stay_id"].unique())
    assert sorted(monitor.store.beds()["bed"].astype(int)) == stays[1:]  # the two newest files
    assert caplog.text.count("1 record files left out: the watched folder holds 3") == 1  # said once, not per scan


def test_a_watched_record_file_is_taken_line_by_line_as_it_grows(run, trained, tmp_path):
    from garlic.live.watch import FolderWatcher
    from garlic.sources.physionet2012 import format_record

    dataset, observations, static = recorded_stays(run.run_id, run.store, run.data_root, beds=1)
    stay = int(static["stay_id"].iloc[0])
    lines = format_record(stay, observations, static.drop(columns="stay_id").iloc[0].to_dict()).splitlines(True)
    header = 2 + len(static.columns) - 1  # Time,Parameter,Value; RecordID; the descriptors
    folder = tmp_path / "export"
    folder.mkdir()
    half = header + len(observations) // 2
    (folder / f"{stay}.txt").write_text("".join(lines[:half]) + lines[half][:4])  # its last line half written
    monitor = Monitor(
        LiveStore(f"sqlite:///{tmp_path / 'ward.sqlite'}", run.run_id), BedScorer(trained), AlertPolicy(0.5)
    )
    watcher = FolderWatcher(folder, monitor, trained.variables + trained.static_features)
    descriptors = len(trained.static_features)
    assert watcher.scan() == half - header + descriptors
    assert watcher.scan() == 0  # nothing changed
    (folder / f"{stay}.txt").write_text("".join(lines))
    assert watcher.scan() == len(observations) - (half - header)
    while monitor.score_round():
        pass
    assert monitor.store.counts() == {
        "beds": 1,
        "readings": len(observations) + descriptors,
        "withdrawn": 0,
        "scored": len(observations) + descriptors,
        "pending": 0,
    }
    offline = predict_tables(trained, observations, static)["risk"].iloc[0]
    assert monitor.store.history(str(stay))["risk"].iloc[-1] == pytest.approx(float(offline), abs=1e-6)


def test_values_are_checked_before_they_are_stored_units_ranges_times_identity_and_bundle_kinds(run, trained, tmp_path):
    from datetime import datetime, timedelta, timezone

    codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    start = now - timedelta(hours=6)

    def reading(variable: str, value: float, bed: str = "bed-1", hours: float = 1.0, **extra) -> dict:
        return {**observation(codes, bed, variable, start + timedelta(hours=hours), value), **extra}

    def quantity(resource: dict, **given) -> dict:
        return {**resource, "valueQuantity": {"value": resource["valueQuantity"]["value"], **given}}

    patient = {"subject": {"reference": "Patient/p-1"}}
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}") as (base, monitor):
        admit = {**encounter("bed-1", start), **patient}
        assert request("PUT", f"{base}/fhir/Encounter/bed-1", json.dumps(admit).encode())[0] == 200
        assert request("PUT", f"{base}/fhir/Encounter/bed-2", json.dumps(encounter("bed-2", start)).encode())[0] == 200
        fahrenheit = quantity(reading("Temp", 98.6), code="[degF]")  # no system: still Fahrenheit
        assert request("POST", f"{base}/fhir/Observation", json.dumps(fahrenheit).encode())[0] == 201
        assert (
            request(
                "POST", f"{base}/fhir/Observation", json.dumps(reading("HR", 90.0, id="obs-1", **patient)).encode()
            )[0]
            == 201
        )
        scored(base)
        before = monitor.store.counts()
        bp = {"resourceType": "Bundle", "type": "searchset", "entry": [{"resource": reading("HR", 91.0)}]}
        get_entry = {
            "resourceType": "Bundle",
            "type": "batch",
            "entry": [{"resource": reading("HR", 92.0), "request": {"method": "GET", "url": "Observation"}}],
        }
        two = reading("HR", 93.0)
        two["code"]["coding"].append({"system": "urn:garlic-icu:variable", "code": "RespRate"})
        bad = {
            "HR 10000": (reading("HR", 10000.0), "HR 10000 /min is outside its plausible range 0 to 350 /min"),
            "HR -20": (reading("HR", -20.0), "HR -20 /min is outside its plausible range 0 to 350"),
            "HR 9.9e29": (reading("HR", 9.9e29), "HR 9.9e+29 /min is outside its plausible range"),
            "Temp -50": (reading("Temp", -50.0), "Temp -50 Cel is outside its plausible range 25 to 45 Cel"),
            "98.6 as Cel": (reading("Temp", 98.6), "Temp 98.6 Cel is outside its plausible range 25 to 45"),
            "SaO2 250": (reading("SaO2", 250.0), "SaO2 250 % is outside its plausible range 0 to 100 %"),
            "Age -5": (reading("Age", -5.0, hours=0), "Age -5 a is outside its plausible range 0 to 125 a"),
            "Gender 7": (reading("Gender", 7.0, hours=0), "Gender 7 is outside its plausible range 0 to 1"),
            "30 days ahead": (reading("HR", 90.0, hours=6 + 30 * 24), "minutes after the service's clock"),
            "a comparator": (quantity(reading("Lactate", 1.0), comparator="<"), "valueQuantity.comparator"),
            "two variables": (two, "is coded as 2 different inputs of this model (HR, RespRate)"),
            "a searchset": (bp, "Bundle.type searchset is not taken here"),
            "a GET entry": (get_entry, "Bundle.entry[0].request.method GET is not taken here"),
            "another subject": (
                reading("HR", 94.0, subject={"reference": "Patient/p-2"}),
                "Observation.subject is not the patient of bed bed-1",
            ),
            "the same id, another subject": (
                reading("HR", 95.0, id="obs-1", subject={"reference": "Patient/p-2"}),
                "Observation.subject is not the patient of bed bed-1",
            ),
            "the same id in another bed": (
                reading("HR", 96.0, bed="bed-2", id="obs-1"),
                "an Observation id sent for bed bed-2 is held by bed bed-1",
            ),
            "a local unit": (
                quantity(reading("Temp", 37.0), system="http://hospital.example/u", code="dC"),
                "'dC' is not a unit this service reads for Temp",
            ),
        }
        for name, (resource, says) in bad.items():
            status, answer = request("POST", f"{base}/fhir", json.dumps(resource).encode())
            assert (name, status in (409, 422)) == (name, True)
            assert says in answer["issue"][0]["diagnostics"], (name, answer)
        future = {**encounter("bed-9", datetime(2099, 1, 1, tzinfo=timezone.utc))}
        status, answer = request("PUT", f"{base}/fhir/Encounter/bed-9", json.dumps(future).encode())
        assert (status, "Encounter.period.start is" in answer["issue"][0]["diagnostics"]) == (422, True)
        other = {**encounter("bed-1", start), "subject": {"reference": "Patient/p-2"}}
        assert request("PUT", f"{base}/fhir/Encounter/bed-1", json.dumps(other).encode())[0] == 409
        assert monitor.store.counts() == before
        held = {r["variable"]: r["value"] for r in get(f"{base}/beds/bed-1")["readings"]}
    assert held == {"Temp": pytest.approx(37.0), "HR": 90.0}


def test_a_blood_pressure_panel_gives_its_components_as_readings_and_a_correction_replaces_them_together(store_url):
    from datetime import datetime, timezone

    from garlic.live.fhir import FhirError, Stay, observations_in

    codes = Codes("physionet2019", ["SBP", "DBP", "MAP", "HR"])
    at = datetime(2026, 1, 1, 9, tzinfo=timezone.utc)

    def component(code: str, value: float) -> dict:
        return {
            "code": {"coding": [{"system": "http://loinc.org", "code": code}]},
            "valueQuantity": {"value": value, "unit": "mmHg", "system": "http://unitsofmeasure.org", "code": "mm[Hg]"},
        }

    panel = {
        "resourceType": "Observation",
        "id": "bp-1",
        "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "85354-9"}]},
        "encounter": {"reference": "Encounter/bed-1"},
        "effectiveDateTime": "2026-01-01T09:00:00Z",
        "component": [component("8480-6", 120), component("8462-4", 80)],
    }
    readings = observations_in(panel, codes).all()
    assert [(r.variable, r.value, r.source, r.part) for r in readings] == [
        ("SBP", 120, "bp-1", 0),
        ("DBP", 80, "bp-1", 1),
    ]
    beside = {
        **panel,
        "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
        "valueQuantity": {"value": 88, "unit": "/min"},
    }  # a value and components: all of them read
    assert [r.variable for r in observations_in(beside, codes).all()] == ["HR", "SBP", "DBP"]
    unread = {**panel, "component": [component("8480-6", 120), component("2708-6", 97)]}
    with pytest.raises(FhirError, match=r"component\[1\]\.code: http://loinc.org\|2708-6 is not an input"):
        observations_in(unread, codes)
    store = LiveStore(store_url, "run")
    try:
        store.admit(Stay("bed-1", True, at.replace(hour=8), None))
        store.admit(Stay("bed-2", True, at.replace(hour=8), None))
        assert store.add(readings) == (2, 0, 0)
        elsewhere = observations_in({**panel, "encounter": {"reference": "Encounter/bed-2"}}, codes).all()
        with pytest.raises(FhirError, match="an Observation id sent for bed bed-2 is held by bed bed-1"):
            store.add(elsewhere)
        assert [held[0] > 0 for held in store.ids_of(readings)] == [True, True]
        corrected = {**panel, "status": "corrected", "component": [component("8480-6", 125), component("8462-4", 80)]}
        assert store.add(observations_in(corrected, codes).all()) == (1, 1, 1)  # the systolic replaced
        assert sorted(store.readings(["bed-1"])["value"]) == [80, 125]
        withdrawn = {**panel, "status": "entered-in-error"}
        assert store.add(observations_in(withdrawn, codes).all()) == (0, 0, 2)
    finally:
        store.close()


def test_fhirpy_and_fhirclient_create_read_and_search_observations_against_the_service(run, trained, tmp_path):
    fhirpy = pytest.importorskip("fhirpy", reason="the FHIR clients are in the test extra: pip install -e '.[test]'")
    pytest.importorskip("fhirclient", reason="the FHIR clients are in the test extra: pip install -e '.[test]'")
    from datetime import datetime, timedelta, timezone

    from fhirclient import server as fhirclient_server
    from fhirclient.models.observation import Observation as ClientObservation

    codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=3)
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}", token=TOKEN) as (base, monitor):
        assert (
            request("PUT", f"{base}/fhir/Encounter/bed-1", json.dumps(encounter("bed-1", start)).encode(), TOKEN)[0]
            == 200
        )
        client = fhirpy.SyncFHIRClient(f"{base}/fhir", authorization=f"Bearer {TOKEN}")
        made = client.resource("Observation", **observation(codes, "bed-1", "HR", start + timedelta(hours=1), 88.0))
        made.save()
        assert made.id and made["meta"]["versionId"]
        read = client.reference("Observation", made.id).to_resource()
        assert (read["valueQuantity"]["value"], read["encounter"]["reference"]) == (88.0, "Encounter/bed-1")
        found = client.resources("Observation").search(encounter="Encounter/bed-1").fetch()
        assert [o.id for o in found] == [made.id]

        server = fhirclient_server.FHIRServer(None, base_uri=f"{base}/fhir/")
        server.session.headers["Authorization"] = f"Bearer {TOKEN}"
        assert server.capabilityStatement.fhirVersion == "4.0.1"
        sent = ClientObservation(observation(codes, "bed-1", "HR", start + timedelta(hours=2), 92.0))
        answer = sent.create(server)
        assert answer["id"] and answer["valueQuantity"]["value"] == 92.0
        again = ClientObservation.read(answer["id"], server)
        assert (again.id, again.valueQuantity.value) == (answer["id"], 92.0)
        found = ClientObservation.where({"encounter": "Encounter/bed-1"}).perform_resources_iter(server)
        assert sorted(o.valueQuantity.value for o in found) == [88.0, 92.0]
        assert scored(base, TOKEN)["scored"] == 2


def raw(method: str, url: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, dict, dict]:
    """Status, headers and JSON body of one request, whatever its status."""
    request_ = urllib.request.Request(url, body or None, headers or {}, method=method)
    try:
        with urllib.request.urlopen(request_, timeout=30) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), json.loads(refused.read())


def test_the_service_answers_as_fhir_r4_clients_expect_created_locations_response_bundles_and_outcomes(
    run, trained, tmp_path
):
    from datetime import datetime, timedelta, timezone

    codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=3)
    fhir_json = {"Content-Type": "application/fhir+json"}
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}") as (base, monitor):
        assert (
            raw("PUT", f"{base}/fhir/Encounter/bed-1", json.dumps(encounter("bed-1", start)).encode(), fhir_json)[0]
            == 200
        )
        reading = observation(codes, "bed-1", "HR", start + timedelta(hours=1), 88.0)
        status, headers, body = raw("POST", f"{base}/fhir/Observation", json.dumps(reading).encode(), fhir_json)
        assert (status, headers["content-type"].split(";")[0]) == (201, "application/fhir+json")
        assert headers["location"] == f"{base}/fhir/Observation/{body['id']}/_history/{body['meta']['versionId']}"
        assert raw("GET", f"{base}/fhir/Observation/{body['id']}")[2]["valueQuantity"]["value"] == 88.0
        later = observation(codes, "bed-1", "HR", start + timedelta(hours=2), 90.0)
        transaction = {
            "resourceType": "Bundle",
            "type": "transaction",
            "entry": [
                {"resource": later, "request": {"method": "POST", "url": "Observation"}},
                {"resource": reading, "request": {"method": "POST", "url": "Observation"}},
            ],
        }
        status, _, body = raw("POST", f"{base}/fhir", json.dumps(transaction).encode(), fhir_json)
        assert (status, body["type"]) == (200, "transaction-response")
        assert [e["response"]["status"] for e in body["entry"]] == ["201 Created", "200 OK"]  # the second: held
        status, _, capability = raw("GET", f"{base}/fhir/metadata")
        assert (status, capability["resourceType"], capability["fhirVersion"]) == (200, "CapabilityStatement", "4.0.1")
        observation_rest = capability["rest"][0]["resource"][0]
        assert [i["code"] for i in observation_rest["interaction"]] == ["create", "read", "search-type"]
        since = (datetime.now(timezone.utc) + timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
        assert raw("GET", f"{base}/fhir/Observation?encounter=Encounter/bed-1&_since={since}")[2]["total"] == 0
        assert raw("GET", f"{base}/fhir/Observation?encounter=Encounter/bed-1")[2]["total"] == 2
        refusals = {
            "text/plain": (
                raw("POST", f"{base}/fhir/Observation", json.dumps(reading).encode(), {"Content-Type": "text/plain"}),
                415,
            ),
            "no such path": (raw("GET", f"{base}/fhir/Patient/1"), 404),
            "no such Observation": (raw("GET", f"{base}/fhir/Observation/nothing-here"), 404),
            "a DELETE": (raw("DELETE", f"{base}/fhir/Observation"), 405),
            "an unknown search parameter": (raw("GET", f"{base}/fhir/Observation?code=8867-4"), 400),
        }
        assert refusals["a DELETE"][0][1]["allow"] == "GET, POST"
        for name, ((status, headers, body), expected) in refusals.items():
            assert (name, status, body["resourceType"]) == (name, expected, "OperationOutcome")
            assert headers["content-type"].split(";")[0] == "application/fhir+json", name


def test_wrong_tokens_throttle_their_own_address_only_and_a_probe_without_a_token_is_no_guess(run, trained, tmp_path):
    from datetime import datetime, timedelta, timezone

    codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=3)
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}", token=TOKEN) as (base, _):
        for _ in range(10):  # a start-up probe polling /health before it has the token: no guess
            assert request("GET", f"{base}/health", b"")[0] == 401
        assert (
            request("PUT", f"{base}/fhir/Encounter/bed-1", json.dumps(encounter("bed-1", start)).encode(), TOKEN)[0]
            == 200
        )
        statuses = []
        for minute in range(30):  # a guesser on the same address, between the feed's readings
            statuses.append(request("GET", f"{base}/ward", b"", f"guess-{minute:012d}")[0])
            reading = observation(codes, "bed-1", "HR", start + timedelta(minutes=minute + 1), 80.0 + minute)
            assert request("POST", f"{base}/fhir/Observation", json.dumps(reading).encode(), TOKEN)[0] == 201
        assert statuses == [401] * 5 + [429] * 25


def test_a_refused_request_is_logged_in_one_line_without_its_values_and_its_echo_is_bounded(
    run, trained, tmp_path, caplog
):
    import logging
    from datetime import datetime, timedelta, timezone

    codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=3)
    huge = {
        **observation(codes, "bed-1", "HR", start + timedelta(hours=1), 90.0),
        "code": {"coding": [{"system": "http://loinc.org", "code": "7" * 600_000}]},
    }
    tiny_entries = {
        "resourceType": "Bundle",
        "type": "batch",
        "entry": [{"resource": {"resourceType": "Observation"}} for _ in range(10_000)],
    }
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}") as (base, _):
        assert request("PUT", f"{base}/fhir/Encounter/bed-1", json.dumps(encounter("bed-1", start)).encode())[0] == 200
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="garlic.live"):
            status, answer = request("POST", f"{base}/fhir/Observation", json.dumps(huge).encode())
            assert status == 422 and len(answer["issue"][0]["diagnostics"]) <= 600
            high = observation(codes, "bed-1", "HR", start + timedelta(hours=1), 4321.0)
            assert request("POST", f"{base}/fhir/Observation", json.dumps(high).encode())[0] == 422
            status, answer = request("POST", f"{base}/fhir", json.dumps(tiny_entries).encode())  # size first
            assert (status, answer["issue"][0]["diagnostics"]) == (
                413,
                "the Bundle holds 10000 entries; at most 5000 are taken at once",
            )
            for bed in ("..", "...", "bed-1\n"):
                bad = observation(codes, bed, "HR", start + timedelta(hours=1), 90.0)
                assert request("POST", f"{base}/fhir/Observation", json.dumps(bad).encode())[0] == 422, bed
            assert request("PUT", f"{base}/fhir/Encounter/...", json.dumps(encounter("...", start)).encode())[0] == 422
            assert (
                request("PUT", f"{base}/fhir/Encounter/bed-2%0A", json.dumps(encounter("bed-2\n", start)).encode())[0]
                == 422
            )
        lines = [record.getMessage() for record in caplog.records if record.name == "garlic.live"]
    assert lines[:3] == [
        "refused POST /fhir/Observation: 422 code (bed bed-1)",
        "refused POST /fhir/Observation: 422 range (bed bed-1)",
        "refused POST /fhir: 413 too many entries",
    ]
    assert len(lines) == 8 and not any("4321" in line or "7777" in line for line in lines)


def test_a_slow_body_is_refused_after_its_time_and_a_client_that_hangs_up_leaves_one_line_no_traceback(
    run, trained, tmp_path, monkeypatch, caplog
):
    import logging

    import garlic.live.service as live_service

    monkeypatch.setattr(live_service, "BODY_SECONDS", 1.0)
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}") as (base, _):
        port = int(base.rsplit(":", 1)[1])
        head = (
            b"POST /fhir/Observation HTTP/1.1\r\nHost: x\r\nContent-Type: application/fhir+json\r\n"
            b'Content-Length: 1000\r\n\r\n{"resourceType": '
        )
        with caplog.at_level(logging.INFO):
            began = time.monotonic()
            with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
                slow.sendall(head)  # and nothing more
                answer = slow.recv(65536).decode()
            assert answer.startswith("HTTP/1.1 408") and time.monotonic() - began < 10
            with socket.create_connection(("127.0.0.1", port), timeout=30) as gone:
                gone.sendall(head)
            time.sleep(3)  # past the body's time: a hang-up the server missed would be its 408 by now
            assert request("GET", f"{base}/health", b"")[0] == 200  # the service goes on
        tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
        assert tracebacks == []
        refused = [r.getMessage() for r in caplog.records if r.name == "garlic.live"]
        assert refused[0] == "refused POST /fhir/Observation: 408 body too slow"
        assert len(refused) == 2 and refused[1].startswith("refused POST /fhir/Observation: ")


def test_the_ward_shows_each_bed_at_its_newest_time_not_after_the_clock(run, trained, tmp_path):
    from datetime import datetime, timedelta, timezone

    from garlic.live.fhir import Observed, Stay

    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=3)
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}") as (base, monitor):
        monitor.store.admit(Stay("bed-1", True, start, None))
        # As a store filled before future times were refused holds it: straight into the store
        monitor.take(
            [
                Observed("bed-1", "HR", start + timedelta(hours=1), 90.0),
                Observed("bed-1", "HR", start + timedelta(days=30), 150.0),
            ]
        )
        scored(base)
        assert [(bed["bed"], bed["time"]) for bed in get(f"{base}/ward")] == [("bed-1", 1.0)]


def test_a_sites_range_table_replaces_the_rows_of_its_variables_and_a_bad_one_is_named_by_line(tmp_path):
    from garlic.config import ConfigError
    from garlic.live.values import Ranges

    site = tmp_path / "ranges.csv"
    site.write_text("variable,low,high,source\nHR,20,250,our ward's monitors\n")
    ranges = Ranges(site)
    assert ranges.refusal("HR", 260, "/min").startswith("HR 260 /min is outside its plausible range 20 to 250 /min")
    assert ranges.refusal("HR", 100, "/min") is None and ranges.refusal("Temp", 50, "Cel") is not None
    site.write_text("variable,low,high\nHR,250,20\n")
    with pytest.raises(ConfigError, match="ranges.csv line 2: expected finite low <= high"):
        Ranges(site)


def test_past_its_requests_in_flight_the_service_answers_503_as_an_operation_outcome(
    run, trained, tmp_path, monkeypatch
):
    import garlic.live.service as live_service

    monkeypatch.setattr(live_service, "MAX_IN_FLIGHT", 1)
    monkeypatch.setattr(live_service, "BODY_SECONDS", 2.0)
    with service(run, trained, f"sqlite:///{tmp_path / 'ward.sqlite'}") as (base, _):
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
            slow.sendall(
                b"POST /fhir/Observation HTTP/1.1\r\nHost: x\r\nContent-Type: application/fhir+json\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )  # held in flight until its body times out
            time.sleep(0.5)
            status, headers, body = raw("GET", f"{base}/health")
            assert (status, body["resourceType"], headers["content-type"]) == (
                503,
                "OperationOutcome",
                "application/fhir+json",
            )
            assert slow.recv(65536).startswith(b"HTTP/1.1 408")
        assert raw("GET", f"{base}/health")[0] == 200


def test_an_absolute_reference_names_the_same_bed_and_patient_and_a_subject_by_identifier_only_is_not_compared():
    from garlic.live.fhir import FhirError, observations_in

    codes = Codes("synthetic", ["HR"])
    sent = {
        "resourceType": "Observation",
        "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
        "encounter": {"reference": "https://ehr.example/fhir/Encounter/bed-1"},
        "subject": {"reference": "https://ehr.example/fhir/Patient/p-9"},
        "effectiveDateTime": "2026-01-01T09:00:00Z",
        "valueQuantity": {"value": 80},
    }
    (reading,) = observations_in(sent, codes).all()
    assert (reading.bed, reading.subject) == ("bed-1", "p-9")
    assert observations_in({**sent, "subject": {"identifier": {"value": "123"}}}, codes).all()[0].subject is None
    with pytest.raises(FhirError, match=r"Observation.subject.reference must be Patient/ID"):
        observations_in({**sent, "subject": {"reference": "Group/ward-3"}}, codes)
