"""A new user's first minutes, measured: ``bin/setup`` in a fresh clone (with ``--setup``), ``garlic --help`` and an
argument error, and README command 1's main job (``garlic train --dataset synthetic``) in an empty folder.

For the main job it reports when the first line reached the screen, the longest silence between two screen updates
(a tqdm redraw counts: it moves the elapsed time), the job's wall time and the stages by epoch as printed.

    .venv/bin/python experiments/benchmark_first_run.py [--setup] [--python PYTHON] [--out FILE.json]

Run it on an idle machine: every number is wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(command: list[str], **options) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, **options)
    return time.perf_counter() - start, result


def setup_in_fresh_clone(folder: Path) -> tuple[Path, float]:
    """Clone this checkout's HEAD into ``folder`` and run its ``bin/setup``; returns (the clone's python, seconds)."""
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(folder)], check=True)
    seconds, result = timed(["bin/setup"], cwd=folder)
    if result.returncode != 0:
        raise SystemExit(f"bin/setup failed:\n{result.stderr[-3000:]}")
    return folder / ".venv" / "bin" / "python", seconds


def start_up(python: Path, repo: Path) -> dict[str, float]:
    """Median of three: ``garlic --help`` and ``garlic train --no-such-option``."""
    times = {}
    for name, args in (("help", ["--help"]), ("argument_error", ["train", "--no-such-option"])):
        runs = [timed([str(python), "-m", "garlic.cli", *args], cwd=repo)[0] for _ in range(3)]
        times[name] = statistics.median(runs)
    return times


def main_job(python: Path, repo: Path, work: Path) -> dict:
    """README command 1's job in the empty folder ``work``; every screen update time-stamped."""
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    process = subprocess.Popen(
        [str(python), "-m", "garlic.cli", "train", "--dataset", "synthetic"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    updates, line = [], b""
    while True:
        byte = process.stdout.read(1)
        if not byte:
            break
        if byte in b"\r\n":
            if line.strip():
                updates.append((time.perf_counter() - start, line.decode(errors="replace")))
            line = b""
        else:
            line += byte
    process.wait()
    total = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit("the main job failed:\n" + "\n".join(text for _, text in updates[-20:]))
    moments = [0.0] + [moment for moment, _ in updates] + [total]
    epochs = [moment for moment, text in updates if re.search(r"epoch (\d+)/\d+ \|.*val AUROC", text)]
    stages = [text.split("stages by epoch: ")[1] for _, text in updates if "stages by epoch: " in text]
    return {
        "first_output_s": updates[0][0] if updates else None,
        "longest_silence_s": max(b - a for a, b in zip(moments, moments[1:])),
        "first_epoch_done_s": epochs[0] if epochs else None,
        "last_epoch_done_s": epochs[-1] if epochs else None,
        "job_s": total,
        "stages": stages,
        "result": [text for _, text in updates if "test auroc" in text],
    }


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--setup", action="store_true", help="time bin/setup in a fresh clone and use its venv")
    options.add_argument("--python", type=Path, default=Path(sys.executable), help="the venv's python otherwise")
    options.add_argument("--out", type=Path, help="also write the numbers here as JSON")
    args = options.parse_args()
    with tempfile.TemporaryDirectory(prefix="garlic-first-run-") as scratch:
        scratch = Path(scratch)
        report: dict = {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
        python, repo = args.python, ROOT
        if args.setup:
            repo = scratch / "clone"
            python, report["setup_s"] = setup_in_fresh_clone(repo)
        report["start_up_s"] = start_up(python, repo)
        work = scratch / "work"
        work.mkdir()
        report["main_job"] = main_job(python, repo, work)
        if "setup_s" in report:
            report["setup_plus_main_job_s"] = report["setup_s"] + report["main_job"]["job_s"]
        report["load_average_at_end"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
