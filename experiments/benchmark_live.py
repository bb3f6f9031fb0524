"""The live ward under load: N beds, one reading per bed every ``--every`` seconds, posted over loopback to a real
``garlic monitor``; how long from a reading's POST to its bed's risk stored, and whether any reading was lost.

    python -m experiments.benchmark_live --beds 200 --seconds 60                    # a reading per bed a second
    python -m experiments.benchmark_live --beds 10000 --every 60 --seconds 300      # a health system's ward
    python -m experiments.benchmark_live --beds 400 --store postgresql+psycopg://USER@HOST/EMPTY_DB --scorers 2
    python -m experiments.benchmark_live --beds 50 --seconds 30 --run RUN_ID --mlruns mlruns   # another run's model

Without ``--run``, a tiny synthetic run (300 stays, one epoch) is trained first in a temporary folder. The service
runs in a process of its own, as ``garlic monitor`` starts it, with a fresh SQLite store in WAL mode (the default)
or ``--store`` (an empty database) and ``--scorers`` scoring processes. The load comes from ``--clients`` threads of
this process, each keeping one connection open and posting one FHIR Observation per bed of its share every
``--every`` seconds (the model's variables in turn, at the bed's next time), the beds spread evenly over the period.
A reading's latency runs from just before its POST to the ``scored_at`` of its bed's first risk at its time, read from
the store when the service has scored everything. Lost: readings acknowledged but not stored and scored. It ends
with where the time went (from the POST to the service taking the reading in, from there to its risk stored, and
the scoring rounds: how many, and their readings) and one line:

    beds N, every S s, readings R (X/s), lost L, p50 X ms, p99 Y ms

Not a test: it takes ``--seconds`` plus the set-up (admitting the beds), and its numbers depend on what else the
machine runs. A load generator that falls behind its schedule posts late, so the rate it reached is in the line.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
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


def wait_until_scored(port: int, seconds: float, poll: float) -> None:
    """Until the service on ``port`` has no reading left to score, or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as answer:
            if json.loads(answer.read())["pending"] == 0:
                return
        time.sleep(poll)


def tiny_synthetic_run(folder: Path) -> tuple[str, Path]:
    from garlic import runs
    from garlic.config import Config
    from garlic.data.datasets import processed_folder
    from garlic.sources import synthetic

    synthetic.generate(processed_folder("synthetic", folder / "data"), n_stays=300, seed=3)
    config = Config.for_dataset("synthetic").override(
        {"hidden_dim": 16, "feature_dim": 4, "max_epochs": 1, "batch_size": 32, "device": "cpu"}
    )
    run_id, _ = runs.train(config, data_root=folder / "data", store=folder / "mlruns")
    return run_id, folder / "mlruns"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_service(run_id: str, mlruns: Path, store: str, port: int, scorers: int) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment.pop("GARLIC_MONITOR_TOKEN", None)
    command = [
        sys.executable,
        "-m",
        "garlic.cli",
        "--mlruns",
        str(mlruns),
        "monitor",
        "--run",
        run_id,
        "--store",
        store,
        "--port",
        str(port),
        "--scorers",
        str(scorers),
    ]
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


def load(
    port: int,
    beds: list[str],
    seconds: int,
    every: int,
    codes: Codes,
    variables: list[str],
    start: datetime,
    sent: dict,
    clients: int,
) -> None:
    """Post one reading per bed every ``every`` seconds for ``seconds``, bed i of N first at second i * every / N,
    from ``clients`` threads; ``sent[(bed, second)]`` is the wall time just before each POST of the reading dated
    ``second`` after ``start``."""
    offsets = {bed: number * every // len(beds) for number, bed in enumerate(beds)}
    began = time.monotonic()
    failures: list[BaseException] = []

    def client(share: list[str]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        schedule = sorted(
            (offsets[bed] + turn * every, number, bed)
            for number, bed in enumerate(share)
            for turn in range(max(1, seconds // every))
        )
        try:
            for second, number, bed in schedule:
                delay = began + second - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                variable = variables[(second // every + number) % len(variables)]
                resource = observation(
                    codes,
                    bed,
                    variable,
                    start + timedelta(seconds=second + 1),
                    plausible(codes, variable, second // every),
                )
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


def backlog(args, run_id: str, mlruns: Path, store: str, port: int, trained) -> None:
    """Store every reading of the load first (as the service stores them, without HTTP), then start the service and
    time its scorers scoring them all: the scoring rate alone, from the first score to the last."""
    import sqlalchemy as sa

    from garlic.live.fhir import Observed, Stay
    from garlic.live.store import LiveStore

    live = LiveStore(store, run_id)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(seconds=args.seconds + 60)
    beds = [f"bed-{number}" for number in range(1, args.beds + 1)]
    for bed in beds:
        live.admit(Stay(bed, True, start, None))
    turns = max(1, args.seconds // args.every)
    for turn in range(turns):
        readings = [
            Observed(
                bed,
                trained.variables[(turn + number) % len(trained.variables)],
                start + timedelta(seconds=turn * args.every + 1),
                50.0 + turn % 20,
            )
            for number, bed in enumerate(beds)
        ]
        for part in range(0, len(readings), 500):
            live.add(readings[part : part + 500])
    live.close()
    service = start_service(run_id, mlruns, store, port, args.scorers)
    try:
        cpu = cpu_seconds(service.pid)
        wait_until_scored(port, 600, 0.2)
        cpu = cpu_seconds(service.pid, cpu)
    finally:
        service.terminate()
        service.wait(60)
    engine = sa.create_engine(store)
    with engine.connect() as db:
        first, last, scores = db.execute(sa.text("SELECT MIN(scored_at), MAX(scored_at), COUNT(*) FROM scores")).one()
        pending = db.execute(sa.text("SELECT COUNT(*) FROM readings WHERE NOT scored")).scalar_one()
    engine.dispose()
    print("CPU seconds while scoring: " + ", ".join(f"{name} {seconds:.0f}" for name, seconds in cpu.items()))
    kind = sa.engine.make_url(store).get_backend_name()
    rate = f"{scores / (last - first):.0f}/s" if last > first else "all in one round (too small a backlog to time)"
    print(
        f"backlog: beds {args.beds}, readings {args.beds * turns}, {kind}, scorers {args.scorers}: scores {scores} "
        f"in {last - first:.1f} s, {rate}, left {pending}"
    )


def cpu_seconds(pid: int, since: dict | None = None) -> dict[str, float]:
    """CPU seconds of the service (its HTTP side and first scorer), its other scorers, this load generator and the
    rest of the machine (PostgreSQL, other jobs): since ``since``'s."""
    import psutil

    service = psutil.Process(pid)
    scorers = sum(sum(child.cpu_times()[:2]) for child in service.children(recursive=True))
    machine = psutil.cpu_times()
    used = {
        "service": sum(service.cpu_times()[:2]),
        "other scorers": scorers,
        "load generator": sum(psutil.Process().cpu_times()[:2]),
        "machine": machine.user + machine.system + machine.nice,
    }
    used["rest of the machine"] = used.pop("machine") - used["service"] - scorers - used["load generator"]
    return {name: seconds - (since or {}).get(name, 0.0) for name, seconds in used.items()}


def admit(port: int, beds: list[str], start: datetime, clients: int) -> None:
    """Admit every bed, from ``clients`` threads."""

    def client(share: list[str]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for bed in share:
            post(connection, "PUT", f"/fhir/Encounter/{bed}", encounter(bed, start))
        connection.close()

    threads = [threading.Thread(target=client, args=(beds[k::clients],)) for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--beds", type=int, default=200)
    options.add_argument("--every", type=int, default=1, help="seconds between a bed's readings (default 1)")
    options.add_argument("--seconds", type=int, default=60)
    options.add_argument("--clients", type=int, default=8, help="posting threads (default 8)")
    options.add_argument("--store", help="an empty database's SQLAlchemy URL (default: a fresh SQLite file)")
    options.add_argument("--scorers", type=int, default=1, help="garlic monitor --scorers (PostgreSQL only)")
    options.add_argument(
        "--backlog",
        action="store_true",
        help="the scorers alone: the readings stored first (no HTTP), then how fast the service's "
        "scorers score them all",
    )
    options.add_argument("--run", help="a run whose model scores the ward (default: a tiny synthetic run)")
    options.add_argument("--mlruns", type=Path, default=Path("mlruns"), help="the store that holds --run")
    args = options.parse_args()
    import sqlalchemy as sa

    with tempfile.TemporaryDirectory(prefix="garlic-live-benchmark-") as work:
        work = Path(work)
        run_id, mlruns = (args.run, args.mlruns) if args.run else tiny_synthetic_run(work)
        from garlic.methods.saved import load_predictor

        trained = load_predictor(run_id, mlruns)
        codes = Codes(trained.config.dataset, trained.variables + trained.static_features)
        port, store = free_port(), args.store or f"sqlite:///{work / 'ward.sqlite'}"
        if args.backlog:
            return backlog(args, run_id, mlruns, store, port, trained)
        service = start_service(run_id, mlruns, store, port, args.scorers)
        try:
            start = datetime.now(timezone.utc).replace(microsecond=0)
            beds = [f"bed-{number}" for number in range(1, args.beds + 1)]
            admitted = time.monotonic()
            admit(port, beds, start, args.clients)
            print(f"admitted {len(beds)} beds in {time.monotonic() - admitted:.0f} s", flush=True)
            sent: dict[tuple[str, int], float] = {}
            cpu = cpu_seconds(service.pid)
            began = time.monotonic()
            load(port, beds, args.seconds, args.every, codes, trained.variables, start, sent, args.clients)
            took = time.monotonic() - began
            wait_until_scored(port, 300, 0.5)
            cpu = cpu_seconds(service.pid, cpu)
        finally:
            service.terminate()
            service.wait(60)
        engine = sa.create_engine(store)
        with engine.connect() as db:
            stored = db.execute(sa.text("SELECT COUNT(*) FROM readings WHERE scored")).scalar_one()
            first_scores = db.execute(sa.text("SELECT bed, time, MIN(scored_at) FROM scores GROUP BY bed, time")).all()
            received = db.execute(sa.text("SELECT bed, time, MIN(received) FROM readings GROUP BY bed, time")).all()
            rounds = np.array(db.execute(sa.text("SELECT COUNT(*) FROM scores GROUP BY scored_at")).scalars().all())
        engine.dispose()
    scored_at = {(bed, round(hours * 3600)): at for bed, hours, at in first_scores}
    received_at = {(bed, round(hours * 3600)): at for bed, hours, at in received}
    scored = [key for key in sent if key in scored_at and key in received_at]
    latency = np.array([(scored_at[key] - sent[key]) * 1000 for key in scored])
    lost = len(sent) - min(stored, len(latency))
    # Where the time goes: from the POST to the service taking the reading in (HTTP, FHIR validation: its
    # ``received``), and from there to its risk stored (the commit, the wait for a scoring round, the round).
    parts = {
        "post to received": [(received_at[key] - sent[key]) * 1000 for key in scored],
        "received to scored": [(scored_at[key] - received_at[key]) * 1000 for key in scored],
    }
    if scored:
        print(
            "; ".join(
                f"{name} p50 {np.percentile(values, 50):.0f} ms, p99 {np.percentile(values, 99):.0f} ms"
                for name, values in parts.items()
            )
        )
    if len(rounds):
        print(
            f"scoring rounds {len(rounds)} ({args.scorers} scorer{'s' * (args.scorers > 1)}), scores a round "
            f"p50 {np.percentile(rounds, 50):.0f}, p99 {np.percentile(rounds, 99):.0f}, max {rounds.max()}"
        )
    print(
        f"CPU seconds over the load ({took:.0f} s, {os.cpu_count()} cores): "
        + ", ".join(f"{name} {seconds:.0f}" for name, seconds in cpu.items())
    )
    p50, p99 = np.percentile(latency, [50, 99]) if len(latency) else (float("nan"), float("nan"))
    kind = sa.engine.make_url(store).get_backend_name()
    print(
        f"beds {args.beds}, every {args.every} s, readings {len(sent)} ({len(sent) / took:.0f}/s, offered "
        f"{args.beds / args.every:.0f}/s), {kind}, scorers {args.scorers}, lost {lost}, p50 {p50:.0f} ms, "
        f"p99 {p99:.0f} ms"
    )


if __name__ == "__main__":
    main()
