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
def service(run, trained, url: str, token: str | None = None, port: int | None = None, codes: Codes | None = None,
            policy: AlertPolicy | None = None):  # fmt: skip
    """``garlic monitor``'s service and scoring loop in this process, on loopback ``port`` (default: a free one),
    reading ``codes`` (default: ``codes.csv``'s), alerting by ``policy`` (default: the run's): (base URL, monitor)."""
    import uvicorn

    found = policy_for(run.run_id, run.store)
    monitor = Monitor(LiveStore(url, run.run_id), BedScorer(trained, found.hourly), policy or found.policy)
    codes = codes or Codes(trained.config.dataset, trained.variables + trained.static_features)
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(monitor, codes, token), host="127.0.0.1", port=port,
                                           log_level="warning"))  # fmt: skip
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
        assert fed.sent == fed.stored == counts["readings"] == counts["scored"] == len(observations) + static[
            trained.static_features].notna().sum().sum()
        ward = get(f"{base}/ward")
        assert [bed["risk"] for bed in ward] == sorted((bed["risk"] for bed in ward), reverse=True)
        for stay in static["stay_id"]:
            history = get(f"{base}/beds/{stay}")["scores"]
            stay_observations = observations[observations["stay_id"] == stay]
            times = np.unique(stay_observations["time"].to_numpy())
            assert [s["time"] for s in history][1:] == pytest.approx(times.tolist(), abs=1e-5)  # 0: descriptors; float32 times
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
        for variable, hours, value in readings + readings[:1]:
            resource = observation(codes, "bed-7", variable, start + timedelta(hours=hours), value)
            status, answer = request("POST", f"{base}/fhir/Observation", json.dumps(resource).encode())
            assert status == 201
            scored(base)
        assert answer == {"stored": 0, "repeats": 1, "withdrawn": 0}
        history = get(f"{base}/beds/bed-7")
    assert [len(history["readings"]), [s["time"] for s in history["scores"]]] == [3, [1.0, 2.0, 4.0]]
    import pandas as pd

    table = pd.DataFrame([{"stay_id": 7, "variable": v, "time": t, "value": x} for v, t, x in readings])
    static = pd.DataFrame({"stay_id": [7], **{name: [np.nan] for name in trained.static_features}})
    for score in history["scores"]:
        cut = table[table["time"] <= score["time"]].astype({"time": "float32", "value": "float32"})
        assert score["risk"] == pytest.approx(float(predict_tables(trained, cut, static)["risk"].iloc[0]), abs=1e-6)


def test_a_hospitals_own_code_table_is_read_instead_of_the_built_in_one_and_checked_line_by_line(run, trained,
                                                                                                  tmp_path):
    from datetime import datetime, timezone

    from garlic.config import ConfigError
    from garlic.live.codes import GARLIC_SYSTEM, LOINC
    from helpers import garlic_here

    names = trained.variables + trained.static_features
    own = tmp_path / "codes.csv"
    own.write_text("variable,system,code,unit\nHR,http://hospital.example/obs,hr-42,/min\n"
                   "Lactate,http://hospital.example/lab,LAC,mmol/L\n")
    codes = Codes(trained.config.dataset, names, own)
    assert [codes.variable("http://hospital.example/obs", "hr-42"), codes.variable(GARLIC_SYSTEM, "Temp"),
            codes.variable(LOINC, "8867-4")] == ["HR", "Temp", None]  # instead of codes.csv's LOINC codes
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
        assert (status, answer["issue"][0]["diagnostics"]) == (422, "Observation.code: http://loinc.org|8867-4 is "
                                                                    "not an input of this model (the monitor's "
                                                                    "--codes table lists the codes it reads)")

    header = "variable,system,code,unit\n"
    bad = {
        "variable,code\nHR,hr-42\n": "has no column system (expected a header of variable, system, code",
        header + "HR,http://h/obs,hr-42,/min\nLactose,http://h/lab,LAC,\n": "line 3: 'Lactose' is not an input of",
        header + "HR,http://h/obs,hr-42,\nTemp,http://h/obs,hr-42,\n": "line 3: http://h/obs|hr-42 is given "
                                                                         "already, on line 2",
        header + "HR,,hr-42,\n": "line 2: system and code are required",
        header: "maps no code to an input of this model",
        "variable,system,code\nHR,http://h/obs,\xe9\n".encode("latin-1"): "cannot be read",
    }  # fmt: skip
    for text, says in bad.items():
        own.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(ConfigError, match=re.escape(says)) as refused:
            Codes(trained.config.dataset, names, own)
        assert str(own) in str(refused.value)
    pipe = tmp_path / "codes-pipe.csv"
    os.mkfifo(pipe)  # nothing writes to it: opened, it would wait for ever
    with pytest.raises(ConfigError, match="is not a file"):
        Codes(trained.config.dataset, names, pipe)
    result = garlic_here("monitor", "--run", run.run_id, "--codes", str(own), "--port", str(free_port()),
                         root=run.data_root.parent)  # fmt: skip
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
        "bed-2", 0, True, False, [])  # fmt: skip
    assert (ward[0]["bed"], ward[0]["readings"]) == ("bed-1", 1)


def test_a_corrected_or_withdrawn_reading_leaves_the_bed_with_the_offline_risks_of_its_readings_without_it(
    run, trained, tmp_path
):
    from datetime import datetime, timedelta, timezone

    import pandas as pd

    codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
    start = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    held = {"hr-1": ("HR", 1.0, 95.0), "lac-2": ("Lactate", 2.0, 9.5), "hr-3": ("HR", 3.0, 300.0),
            "hr-4": ("HR", 4.0, 110.0)}  # fmt: skip

    def send(base: str, source: str, status: str = "final") -> tuple[int, dict]:
        variable, hours, value = held.get(source, ("HR", 1.0, 90.0))
        resource = {**observation(codes, "bed-3", variable, start + timedelta(hours=hours), value), "id": source,
                    "status": status}  # fmt: skip
        answer = request("POST", f"{base}/fhir/Observation", json.dumps(resource).encode())
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
        newest = float(predict_tables(trained, table.astype({"time": "float32", "value": "float32"}), static)[
            "risk"].iloc[0])  # fmt: skip
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
        assert send(base, "lac-2", "entered-in-error") == (201, {"stored": 0, "repeats": 0, "withdrawn": 1})
        assert send(base, "lac-2", "entered-in-error") == (201, {"stored": 0, "repeats": 1, "withdrawn": 0})
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
        assert request("POST", f"{base}/fhir/Observation", json.dumps(only).encode())[1]["withdrawn"] == 1
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
    from garlic.cli import database_error

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
        subprocess.run([*as_user, "initdb", "-D", str(data), "-A", "trust", "-U", "ward"], check=True,
                       capture_output=True, timeout=120)  # fmt: skip
        subprocess.run([*as_user, "pg_ctl", "-D", str(data), "-o", f"-p {port} -k {folder}", "-l",
                        str(folder / "log"), "-w", "start"], check=True, capture_output=True, timeout=120)  # fmt: skip
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


def test_a_store_of_the_first_layout_is_brought_to_the_second_with_its_readings_and_scores_kept(store_url):
    import sqlalchemy as sa
    from datetime import datetime, timezone

    from garlic.live.fhir import Observed, Withdrawal
    from garlic.live.store import BEDS, META, READINGS, SCORES

    url = store_url
    first = sa.MetaData()  # layout 1: the readings without their source and withdrawn columns
    for table in (META, BEDS, SCORES):
        table.to_metadata(first)
    sa.Table("readings", first, *[sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
                                  for c in READINGS.columns if c.name not in ("source", "withdrawn")],
             sa.UniqueConstraint("bed", "variable", "time", "value"))  # fmt: skip
    engine = sa.create_engine(url)
    first.create_all(engine)
    admitted = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    with engine.begin() as db:
        db.execute(META.insert(), [{"key": "run_id", "value": "run"}, {"key": "schema", "value": "1"}])
        db.execute(BEDS.insert().values(bed="bed-1", admitted=admitted.timestamp(), discharged=None))
        db.execute(first.tables["readings"].insert().values(bed="bed-1", variable="HR", time=1.0, value=90.0,
                                                            received=0.0, scored=True))  # fmt: skip
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
    LiveStore(url, "run").close()  # opened again: layout 2 already


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
            "a number of 5,000 digits": (json.dumps(good).replace("90.0", "9" * 5000).encode(), TOKEN, 400,
                                         "not JSON"),
            "oversized": (b" " * (2 << 20), TOKEN, 413, "bytes"),
            "unknown code": (json.dumps(unknown).encode(), TOKEN, 422, "0000-0 is not an input of this model"),
            "a thousand unknown codes": (json.dumps({**good, "code": {"coding": [{"system": "http://loinc.org", "code":
                f"0000-{n}"} for n in range(1000)]}}).encode(), TOKEN, 422, "0000-2 (and 997 more codings) is not"),
            "not FHIR": (json.dumps({**good, "valueQuantity": {"value": "high"}}).encode(), TOKEN, 422,
                         "valueQuantity"),
            "in another unit": (json.dumps({**good, "valueQuantity": {"value": 1.5, "unit": "beats/s"}}).encode(),
                                TOKEN, 422, "'beats/s' is not the unit of HR, which this model reads in /min"),
            "wrong bed": (json.dumps(observation(codes, "bed-2", "HR", start, 90.0)).encode(), TOKEN, 404,
                          "bed-2 is not admitted"),
            "a bundle with one bad entry": (json.dumps({"resourceType": "Bundle", "type": "batch", "entry": [
                {"resource": later}, {"resource": unknown}]}).encode(), TOKEN, 422, "entry[1]"),
            "dated years after the admission": (json.dumps(observation(codes, "bed-1", "HR", start.replace(
                year=9999), 90.0)).encode(), TOKEN, 422, "days after the bed's admission"),
            "unauthenticated": (json.dumps(later).encode(), None, 401, "token"),
            "a wrong token": (json.dumps(later).encode(), TOKEN[::-1], 401, "token"),
        }  # fmt: skip
        for name, (body, token, status, says) in bad.items():
            answer = request("POST", f"{base}/fhir", body, token)
            assert (name, answer[0]) == (name, status)
            assert says in answer[1]["issue"][0]["diagnostics"], name
        assert monitor.store.counts() == before
        assert request("GET", f"{base}/ward", b"", None)[0] == 401


def test_a_value_sent_in_another_unit_is_refused_and_another_spelling_of_the_unit_is_taken():
    from datetime import datetime, timezone

    from garlic.live.fhir import FhirError, observations_in

    codes = Codes("synthetic", ["Temp", "SysABP", "Platelets", "GCS"])
    at = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)

    def sent(variable: str, value: float, **quantity) -> dict:
        reading = observation(codes, "bed-1", variable, at, value)
        return {**reading, "valueQuantity": {"value": value, **quantity}}

    ucum = "http://unitsofmeasure.org"
    taken = [sent("Temp", 37.2, unit="°C", system=ucum, code="Cel"), sent("Temp", 37.2, unit="°C"),
             sent("SysABP", 120, unit="mmHg"), sent("SysABP", 120, system=ucum, code="mm[Hg]"),
             sent("Platelets", 210, unit="10^9/L"), sent("GCS", 14), observation(codes, "bed-1", "SysABP", at, 120)]
    assert [observations_in(reading, codes)[0].value for reading in taken] == [37.2, 37.2, 120, 120, 210, 14, 120]
    refused = {"[degF]": sent("Temp", 99.0, unit="°C", system=ucum, code="[degF]"),  # the code decides, not the label
               "kPa": sent("SysABP", 16.0, unit="kPa"), "mmol/L": sent("Platelets", 210, unit="mmol/L")}
    said = {}
    for unit, reading in refused.items():
        with pytest.raises(FhirError, match=rf"valueQuantity: '{re.escape(unit)}' is not the unit of") as refusal:
            observations_in(reading, codes)
        assert refusal.value.status == 422
        said[unit] = str(refusal.value)
    assert "of Temp, which this model reads in Cel (accepted as 'Cel', '°C', 'degC'); values are not" in said["[degF]"]


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
    command = [sys.executable, "-m", "garlic.cli", "--mlruns", str(run.store), "monitor", "--run", run.run_id,
               "--store", url, "--port", str(port)]  # fmt: skip
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
        risks = [readings[(readings["bed"] == bed) & (readings["time"] <= time)]["value"].iloc[-1]
                 for bed, time in zip(asked["bed"], asked["time"])]  # fmt: skip
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
    expected = [{1.0: False}, {1.0: False, 2.0: True}, {1.0: False, 2.0: False}, {1.0: False, 1.5: True, 2.0: True},
                {1.0: False, 1.5: True, 2.0: True, 3.0: True}]  # fmt: skip
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


def test_monitor_off_loopback_without_a_token_is_refused_in_one_line(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    environment.pop("GARLIC_MONITOR_TOKEN", None)
    result = subprocess.run([sys.executable, "-m", "garlic.cli", "monitor", "--run", "0" * 32, "--host", "0.0.0.0"],
                            env=environment, capture_output=True, text=True, cwd=tmp_path, timeout=60)  # fmt: skip
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
    (folder / f"{stay}.txt").write_text(format_record(stay, observations, static.drop(columns="stay_id").iloc[0]
                                                      .to_dict()))  # fmt: skip
    monitor = Monitor(LiveStore(f"sqlite:///{tmp_path / 'ward.sqlite'}", run.run_id), BedScorer(trained),
                      AlertPolicy(0.5))  # fmt: skip
    watcher = FolderWatcher(folder, monitor, trained.variables + trained.static_features)
    scanned: list[int] = []
    scanning = threading.Thread(target=lambda: scanned.append(watcher.scan()), daemon=True)
    scanning.start()
    scanning.join(timeout=30)
    assert scanned == [len(observations) + len(trained.static_features)]
    assert monitor.store.counts()["beds"] == 1


def test_past_its_file_cap_the_watcher_reads_the_most_recently_changed_files_and_says_how_many_it_leaves(
        run, trained, tmp_path, monkeypatch, caplog):  # fmt: skip
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
    monitor = Monitor(LiveStore(f"sqlite:///{tmp_path / 'ward.sqlite'}", run.run_id), BedScorer(trained),
                      AlertPolicy(0.5))  # fmt: skip
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
    monitor = Monitor(LiveStore(f"sqlite:///{tmp_path / 'ward.sqlite'}", run.run_id), BedScorer(trained),
                      AlertPolicy(0.5))  # fmt: skip
    watcher = FolderWatcher(folder, monitor, trained.variables + trained.static_features)
    descriptors = len(trained.static_features)
    assert watcher.scan() == half - header + descriptors
    assert watcher.scan() == 0  # nothing changed
    (folder / f"{stay}.txt").write_text("".join(lines))
    assert watcher.scan() == len(observations) - (half - header)
    while monitor.score_round():
        pass
    assert monitor.store.counts() == {"beds": 1, "readings": len(observations) + descriptors, "withdrawn": 0,
                                      "scored": len(observations) + descriptors, "pending": 0}  # fmt: skip
    offline = predict_tables(trained, observations, static)["risk"].iloc[0]
    assert monitor.store.history(str(stay))["risk"].iloc[-1] == pytest.approx(float(offline), abs=1e-6)
