"""The live ward under load: N beds, one reading per bed per second, posted over loopback to a real
``garlic monitor``; how long from a reading's POST to its bed's risk stored, and whether any reading was lost.

    python -m experiments.benchmark_live --beds 200 --seconds 60
    python -m experiments.benchmark_live --beds 50 --seconds 30 --run RUN_ID --mlruns mlruns   # another run's model

Without ``--run``, a tiny synthetic run (300 stays, one epoch) is trained first in a temporary folder. The service
runs in a process of its own with a fresh SQLite store in WAL mode (the default), as ``garlic monitor`` starts it;
the load comes from ``--clients`` threads of this process, each keeping one connection open and posting, every
second, one FHIR Observation per bed of its share (the model's variables in turn, at the bed's next second). A
reading's latency runs from just before its POST to the ``scored_at`` of its bed's first risk at its time, read from
the store when the service has scored everything. Lost: readings acknowledged but not stored and scored. It ends
with where the time went (from the POST to the service taking the reading in, and from there to its risk stored)
and one line:

    beds N, readings R, lost L, p50 X ms, p99 Y ms

Not a test: it takes ``--seconds`` plus the set-up, and its numbers depend on what else the machine runs.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from garlic.live.codes import Codes
from garlic.live.feed import encounter, observation

ROOT = Path(__file__).resolve().parents[1]


def tiny_synthetic_run(folder: Path) -> tuple[str, Path]:
    from garlic import runs
    from garlic.config import Config
    from garlic.data.datasets import processed_folder
    from garlic.sources import synthetic

    synthetic.generate(processed_folder("synthetic", folder / "data"), n_stays=300, seed=3)
    config = Config.for_dataset("synthetic").override({"hidden_dim": 16, "feature_dim": 4, "max_epochs": 1,
                                                       "batch_size": 32, "device": "cpu"})  # fmt: skip
    run_id, _ = runs.train(config, data_root=folder / "data", store=folder / "mlruns")
    return run_id, folder / "mlruns"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_service(run_id: str, mlruns: Path, database: Path, port: int) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment.pop("GARLIC_MONITOR_TOKEN", None)
    command = [sys.executable, "-m", "garlic.cli", "--mlruns", str(mlruns), "monitor", "--run", run_id, "--store",
               f"sqlite:///{database}", "--port", str(port)]  # fmt: skip
    service = subprocess.Popen(command, env=environment)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if service.poll() is not None:
            raise RuntimeError(f"garlic monitor stopped with exit code {service.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return service
        except OSError:
            time.sleep(0.5)
    service.kill()
    raise RuntimeError("garlic monitor did not answer within 180 s")


def post(connection: http.client.HTTPConnection, method: str, path: str, payload: dict) -> None:
    connection.request(method, path, json.dumps(payload).encode(), {"Content-Type": "application/fhir+json"})
    answer = connection.getresponse()
    body = answer.read()
    if answer.status >= 300:
        raise RuntimeError(f"{method} {path}: {answer.status} {body[:300]!r}")


def plausible(codes: Codes, variable: str, second: int) -> float:
    """A value of ``variable`` inside its plausible range (the service refuses others), changing every second."""
    bounds = codes.ranges.of_variable.get(variable)
    if bounds is None:
        return 1.0 + second
    return bounds.low + (bounds.high - bounds.low) * (0.3 + 0.02 * (second % 20))


def load(port: int, beds: list[str], seconds: int, codes: Codes, variables: list[str], start: datetime,
         sent: dict, clients: int) -> None:  # fmt: skip
    """Post one reading per bed per second for ``seconds``, from ``clients`` threads; ``sent[(bed, second)]`` is
    the wall time just before each POST."""
    began = time.monotonic()
    failures: list[BaseException] = []

    def client(share: list[str]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            for second in range(seconds):
                delay = began + second - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                for number, bed in enumerate(share):
                    variable = variables[(second + number) % len(variables)]
                    resource = observation(codes, bed, variable, start + timedelta(seconds=second + 1),
                                           plausible(codes, variable, second))
                    sent[(bed, second + 1)] = time.time()
                    post(connection, "POST", "/fhir/Observation", resource)
        except BaseException as exc:  # reported after the threads end
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(beds[k::clients],)) for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"the load stopped: {failures[0]}")


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--beds", type=int, default=200)
    options.add_argument("--seconds", type=int, default=60)
    options.add_argument("--clients", type=int, default=8, help="posting threads (default 8)")
    options.add_argument("--run", help="a run whose model scores the ward (default: a tiny synthetic run)")
    options.add_argument("--mlruns", type=Path, default=Path("mlruns"), help="the store that holds --run")
    args = options.parse_args()
    with tempfile.TemporaryDirectory(prefix="garlic-live-benchmark-") as work:
        work = Path(work)
        run_id, mlruns = (args.run, args.mlruns) if args.run else tiny_synthetic_run(work)
        from garlic.methods.saved import load_predictor

        trained = load_predictor(run_id, mlruns)
        codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
        port, database = free_port(), work / "ward.sqlite"
        service = start_service(run_id, mlruns, database, port)
        try:
            start = datetime.now(timezone.utc).replace(microsecond=0)
            beds = [f"bed-{number}" for number in range(1, args.beds + 1)]
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            for bed in beds:
                post(connection, "PUT", f"/fhir/Encounter/{bed}", encounter(bed, start))
            connection.close()
            sent: dict[tuple[str, int], float] = {}
            load(port, beds, args.seconds, codes, trained.variables, start, sent, args.clients)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as answer:
                    if json.loads(answer.read())["pending"] == 0:
                        break
                time.sleep(0.5)
        finally:
            service.terminate()
            service.wait(60)
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            stored = db.execute("SELECT COUNT(*) FROM readings WHERE scored").fetchone()[0]
            first_scores = db.execute("SELECT bed, time, MIN(scored_at) FROM scores GROUP BY bed, time").fetchall()
            received = db.execute("SELECT bed, time, MIN(received) FROM readings GROUP BY bed, time").fetchall()
    scored_at = {(bed, round(hours * 3600)): at for bed, hours, at in first_scores}
    received_at = {(bed, round(hours * 3600)): at for bed, hours, at in received}
    scored = [key for key in sent if key in scored_at and key in received_at]
    latency = np.array([(scored_at[key] - sent[key]) * 1000 for key in scored])
    lost = len(sent) - min(stored, len(latency))
    # Where the time goes: from the POST to the service taking the reading in (HTTP, FHIR validation: its
    # ``received``), and from there to its risk stored (the commit, the wait for a scoring round, the round).
    parts = {"post to received": [(received_at[key] - sent[key]) * 1000 for key in scored],
             "received to scored": [(scored_at[key] - received_at[key]) * 1000 for key in scored]}  # fmt: skip
    if scored:
        print("; ".join(f"{name} p50 {np.percentile(values, 50):.0f} ms, p99 {np.percentile(values, 99):.0f} ms"
                        for name, values in parts.items()))  # fmt: skip
    p50, p99 = np.percentile(latency, [50, 99]) if len(latency) else (float("nan"), float("nan"))
    print(f"beds {args.beds}, readings {len(sent)}, lost {lost}, p50 {p50:.0f} ms, p99 {p99:.0f} ms")


if __name__ == "__main__":
    main()
