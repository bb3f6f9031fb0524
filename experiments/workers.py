"""Units of a study in parallel child processes: on a CPU one per core, on one GPU many at once.

A job is one unit's command (``garlic train ...`` for the comparison table, the study's own command narrowed to the
unit for the ablations), run with the CPU threads shared out evenly among the ``workers`` running at a time. Each
job holds a lock while its child lives, so that a second command on the same store skips the unit; its output goes
to a log file; the child dies with this process (``garlic.cli.PARENT_ENV``). At a deadline no job starts any more
and the running ones get SIGTERM: their MLflow runs end FAILED, and the next call trains those units anew.
"""
from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from garlic.cli import PARENT_ENV
from preprocessing.locks import LockHeld, acquire, release


@dataclass
class Job:
    name: str  # what the report calls it
    command: list[str]
    lock: Path  # held by the child while it runs
    log: Path  # its stdout and stderr


def run_jobs(jobs: list[Job], workers: int, deadline: float | None = None) -> dict[str, str]:
    """Run ``jobs``, ``workers`` at a time; returns each job's outcome by name ("done" when its command succeeded).

    ``deadline`` is a ``time.monotonic()`` value."""
    threads = str(max(1, (os.cpu_count() or 1) // workers))
    environment = os.environ | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, PARENT_ENV: str(os.getpid())}

    def run(job: Job) -> str:
        if deadline is not None and time.monotonic() >= deadline:
            return "not started: the deadline had passed"
        job.lock.parent.mkdir(parents=True, exist_ok=True)
        try:
            claim = acquire(job.lock, wait=False)
        except LockHeld:
            return "skipped: another process is training it"
        job.log.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(job.log, "w") as sink:
                # The child inherits the claim (one lock, two descriptors): it holds the unit while it lives.
                process = subprocess.Popen(job.command, stdout=sink, stderr=subprocess.STDOUT, env=environment,
                                           pass_fds=(claim,))  # fmt: skip
            try:
                code = process.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.terminate()
                process.wait()
                return f"stopped at the deadline (its run is FAILED and resumable), see {job.log}"
        finally:
            release(claim)
        return "done" if code == 0 else f"failed (exit {code}), see {job.log}"

    print(f"running {len(jobs)} units in {workers} processes of {threads} thread(s)")
    with ThreadPoolExecutor(workers) as pool:
        outcomes = dict(zip((job.name for job in jobs), pool.map(run, jobs)))
    for name, outcome in outcomes.items():
        print(f"{name}: {outcome}")
    return outcomes
