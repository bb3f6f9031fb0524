"""Run the README's command lines top to bottom, as a new user would, in an empty folder.

Every line of the README's ``bash`` blocks is run in order (the ``text`` block of the command-line reference is
syntax, not run). ``RUN_ID`` and ``P12_RUN_ID`` are the run ids that the trainings before them printed. The lines
run as written except that:

- ``bin/setup && ...`` runs what follows: the Python running this walk is the set-up venv (the set-up itself is
  timed by ``experiments/benchmark_first_run.py --setup``); the test-suite line is skipped (CI runs it);
- ``.venv/bin/garlic`` and ``.venv/bin/python`` are this checkout's command line and Python, and another
  ``.venv/bin/`` tool the one beside this Python;
- servers (the dashboard, ``mlflow ui``, ``garlic monitor``) get a free port, must answer on it, and are then
  stopped; the walk goes on to the next lines while one starts, and waits for its answer before it ends (a server
  spends its start-up importing, on a core of its own); one started in the background (a line ending in ``&``)
  answers before the next line runs, stays up for the lines after it until the walk ends, and ``garlic feed`` is
  pointed at its port (``--url``);
- lines that read ``../shared/data`` are skipped, saying so, when that folder is absent, and the live ward's lines
  when its FHIR library is (``bin/setup live``);
- with ``--quick`` (the test suite's walk) the trainings run one epoch of a small model (``--set`` appended: the
  line's command and options are the README's), the feed sends 5 beds as fast as the service takes them, and the
  PhysioNet 2012 lines are skipped: a P12 preprocessing and training are too long for the suite.

    .venv/bin/python experiments/readme_walk.py [--quick] [--work DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHARED = ROOT.parent / "shared" / "data"
QUICK_TRAINING = ["--set", "max_epochs=1", "--set", "hidden_dim=8", "--set", "feature_dim=4"]
QUICK_FEED = ["--beds", "5", "--speed", "1e7"]
# a command's words -> the path that answers
SERVERS = {"dashboard": "/_stcore/health", "mlflow ui": "/health", "monitor": "/health"}


@dataclass
class Step:
    line: str  # as the README has it
    command: str  # as run ("" when skipped)
    skipped: str  # why, when skipped
    seconds: float = 0.0
    output: str = ""  # standard output (a server: where it answered)


@dataclass
class Starting:
    """A server a line started, not yet seen answering on ``port`` at ``path``; ``started``: its perf_counter."""

    step: Step
    process: subprocess.Popen
    port: int
    path: str
    started: float


def readme_lines(readme: Path = README) -> list[str]:
    """The command lines of the README's ``bash`` blocks, in order, without their trailing comments."""
    blocks = re.findall(r"^```bash\n(.*?)^```", readme.read_text(), flags=re.MULTILINE | re.DOTALL)
    lines = []
    for block in blocks:
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launch(command: list[str], env: dict, work: Path) -> tuple[subprocess.Popen, int]:
    """Start a server on a free port: the process and its port."""
    port = _free_port()
    process = subprocess.Popen(
        [*command, "--port", str(port)], cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    return process, port


def _answers(process: subprocess.Popen, port: int, command: list[str], path: str, timeout: float = 180.0) -> None:
    """Wait until ``path`` answers 200 on ``port``; the server is stopped and RuntimeError raised if it does not."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{shlex.join(command)} stopped with exit code {process.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.25)
        raise RuntimeError(f"{shlex.join(command)} did not answer on port {port} within {timeout:.0f} s")
    except BaseException:
        _stop(process)
        raise


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


def walk(work: Path, quick: bool = False, readme: Path = README, shared: Path = SHARED, say=print) -> list[Step]:
    """Run the README's lines in ``work`` (an empty folder); raises RuntimeError at the first line that fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("GARLIC_DATA_ROOT", "GARLIC_MLRUNS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    run_ids: dict[str, str] = {}
    steps = []
    background: dict[str, tuple[subprocess.Popen, int]] = {}  # a server's words -> it and its port
    starting: list[Starting] = []  # servers not yet seen answering
    try:
        for line in readme_lines(readme):
            steps.append(_walk_line(line, work, quick, shared, env, run_ids, background, starting, say))
        for server in starting:
            _answers(server.process, server.port, shlex.split(server.step.command), server.path)
            server.step.output = f"answered on port {server.port}"
            server.step.seconds = time.perf_counter() - server.started
            say(f"      {server.step.line}: answered on port {server.port}, {server.step.seconds:.1f} s after starting")
            server.process.terminate()  # it winds down while the next one is checked
    finally:
        for process in [*(process for process, _ in background.values()), *(server.process for server in starting)]:
            _stop(process)
    return steps


def _walk_line(
    line: str,
    work: Path,
    quick: bool,
    shared: Path,
    env: dict,
    run_ids: dict[str, str],
    background: dict[str, tuple[subprocess.Popen, int]],
    starting: list[Starting],
    say,
) -> Step:
    """Run one README line (see ``walk``)."""
    command, skipped = line.removeprefix("bin/setup && "), ""
    if "-m pytest" in command:
        skipped = "the test suite: CI runs it (.ci/run)"
    elif re.search(r" (monitor|feed) |--ward ", command) and importlib.util.find_spec("fhir.resources") is None:
        skipped = "the live ward: its FHIR library is not installed (bin/setup live)"
    elif "../shared/data" in command or "P12_RUN_ID" in command or "physionet2012" in command:
        if quick:
            skipped = "PhysioNet 2012: too long for the test suite (run this walk without --quick)"
        elif not shared.is_dir():
            skipped = f"PhysioNet 2012: {shared} is absent"
    for name, value in run_ids.items():
        command = re.sub(rf"\b{name}\b", value, command)
    if not skipped and re.search(r"\b(P12_)?RUN_ID\b", command):
        skipped = "no training before it printed its run id"
    if skipped:
        say(f"skip  {line}  ({skipped})")
        return Step(line, "", skipped)
    in_background = command.endswith("&")
    words = shlex.split(command.removesuffix("&").replace("../shared/data", str(shared)))
    program = {".venv/bin/garlic": [sys.executable, "-m", "garlic.cli"], ".venv/bin/python": [sys.executable]}
    installed = Path(sys.executable).parent / words[0].removeprefix(".venv/bin/")  # another tool of the venv
    words = program.get(words[0], [str(installed) if words[0].startswith(".venv/bin/") else words[0]]) + words[1:]
    if quick and words[3:4] == ["train"]:
        words += QUICK_TRAINING
    if words[3:4] == ["feed"] and "monitor" in background:
        words += ["--url", f"http://127.0.0.1:{background['monitor'][1]}", *(QUICK_FEED if quick else [])]
    say(f"run   {shlex.join(words)}")
    start = time.perf_counter()
    server = next((key for key in SERVERS if f" {key}" in command), None)
    if server is not None:
        process, port = _launch(words, env, work)
        if in_background:  # the lines after it use it: it answers first
            _answers(process, port, words, SERVERS[server])
            background[server] = (process, port)
            output = f"answered on port {port}"
        else:  # checked when the walk ends (``walk``); its seconds count from its start until it answers
            step = Step(line, shlex.join(words), "", 0.0, f"started on port {port}")
            starting.append(Starting(step, process, port, SERVERS[server], start))
            say(f"      started on port {port}; checked at the end")
            return step
    else:
        result = subprocess.run(words, cwd=work, env=env, capture_output=True, text=True, timeout=3600)
        output = result.stdout
        if result.returncode != 0:
            raise RuntimeError(f"README line {line!r} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
        if words[3:4] == ["train"]:
            found = re.search(r"^run ([0-9a-f]{32})$", result.stdout, flags=re.MULTILINE)
            if found is None:
                raise RuntimeError(f"README line {line!r} printed no run id:\n{result.stdout[-2000:]}")
            run_ids["P12_RUN_ID" if "physionet2012" in words else "RUN_ID"] = found.group(1)
    step = Step(line, shlex.join(words), "", time.perf_counter() - start, output)
    say(f"      done in {step.seconds:.1f} s")
    return step


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--quick", action="store_true", help="one-epoch trainings, no PhysioNet 2012 lines")
    options.add_argument("--work", type=Path, help="an empty folder to run in (default: a temporary one)")
    args = options.parse_args()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        walk(args.work, args.quick)
        return
    with tempfile.TemporaryDirectory(prefix="garlic-readme-") as work:
        walk(Path(work), args.quick)


if __name__ == "__main__":
    main()
