"""Units of a study in parallel child processes: on a CPU one per core, on one GPU many at once.

A job is one unit's command (``garlic train ...`` for the comparison table, the study's own command narrowed to the
unit for the ablations), run with the CPU threads shared out evenly among the ``workers`` running at a time. Each
job holds a lock while its child lives, so that a second command on the same store skips the unit; its output goes
to a log file; the child dies with this process (``PARENT_ENV``, ``die_with_parent``). At a deadline no job starts any more
and the running ones get SIGTERM: their MLflow runs end FAILED, and the next call trains those units anew.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from garlic.io.locks import LockHeld, acquire, release


def add_worker_arguments(parser: argparse.ArgumentParser, units: str) -> None:
    """``--workers N`` and ``--deadline MINUTES``, alike in every command that trains its ``units`` in workers."""
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help=f"train {units} in N parallel processes (default 1: one at a time, in this one)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        metavar="MINUTES",
        help="with --workers: start none after MINUTES of training and stop the running ones then "
        "(the next call trains them anew), then write the tables of what finished",
    )


def check_worker_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, worker: bool = False) -> None:
    """``add_worker_arguments``'s values checked, ``parser.error`` naming the bad one; a ``worker``'s ``--deadline``
    is not (a job of ``run_jobs``: its command repeats its parent's, ``--deadline`` included, with ``--workers 1``, and
    the parent enforces the deadline)."""
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.deadline is not None and not worker and not (args.deadline >= 0 and args.workers > 1):
        parser.error(
            f"--deadline takes minutes (0 or more), with --workers 2 or more; got --deadline "
            f"{args.deadline} with --workers {args.workers}"
        )


@dataclass
class Job:
    name: str  # what the report calls it
    command: list[str]
    lock: Path  # held by the child while it runs
    log: Path  # its stdout and stderr


def run_jobs(
    jobs: list[Job], workers: int, minutes: float | None = None, finished: Callable[[Job], None] | None = None
) -> dict[str, str]:
    """Run ``jobs``, ``workers`` at a time; returns each job's outcome by name ("done" when its command succeeded).
    ``minutes`` from now is the deadline (none without). ``finished(job)`` is called, one call at a time, as soon as
    a job's command has succeeded: to keep its unit while the other jobs run."""
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    one_at_a_time = threading.Lock()
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
                process = subprocess.Popen(
                    job.command, stdout=sink, stderr=subprocess.STDOUT, env=environment, pass_fds=(claim,)
                )
            try:
                code = process.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.terminate()
                process.wait()
                return f"stopped at the deadline (its run is FAILED and resumable), see {job.log}"
        finally:
            release(claim)
        if code != 0:
            return f"failed (exit {code}), see {job.log}"
        if finished is not None:
            with one_at_a_time:
                finished(job)
        return "done"

    print(f"running {len(jobs)} units in {workers} processes of {threads} thread(s)")
    with ThreadPoolExecutor(workers) as pool:
        outcomes = dict(zip((job.name for job in jobs), pool.map(run, jobs)))
    for name, outcome in outcomes.items():
        print(f"{name}: {outcome}")
    return outcomes


PARENT_ENV = "GARLIC_PARENT_PID"


def die_with_parent() -> None:
    """Under a parent that set ``PARENT_ENV``, on Linux: have the kernel send SIGTERM when the parent dies, and stop
    at once if it already has (elsewhere a worker, or the dashboard's server, outlives a killed parent)."""
    parent = os.environ.get(PARENT_ENV)
    if parent is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    if str(os.getppid()) != parent:
        raise SystemExit(f"garlic: the parent process {parent} is gone; stopping")
