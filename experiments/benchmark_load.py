"""Training speed on a shared machine: the first batches of an epoch with 0, 1 and 2 busy processes beside it, for
torch's threads as garlic set them before issue #56, one thread, and as garlic now chooses them.

    python -m experiments.benchmark_load --out docs/results      # on an otherwise idle machine: the numbers of speed.md
    python -m experiments.benchmark_load --batches 3 --busy 0    # a quick check that it runs

Each measurement is ``garlic.training.speed.measure_speed``: the first ``--batches`` of a training epoch of
the preset (default physionet2012-fast, split 0 of its protocol; the data under ``--data-root``) in the
reconstruction stage, then inference over the split's validation and test stays (median of its passes). Each runs in
a process of its own, because OpenMP reads its wait policy once, as torch loads. The busy processes are Python loops
(``while True: pass``, on no particular CPU), started a second before the conditions' measurements and stopped after
them. The variants:

    before      torch's own thread count and OpenMP's default wait (spinning, then sleeping): garlic before #56
    passive     torch's own thread count, waiting passively (OMP_WAIT_POLICY=PASSIVE)
    one         one thread (OMP_NUM_THREADS=1)
    automatic   what `garlic train` does now: OpenMP's default wait, threads chosen from the CPUs that other
                processes left free since the process started (garlic.training.threads), as before every epoch

``--out DIR`` writes the table, the machine and the command as the "Under load" section of ``DIR/speed.md`` (the
speed table of ``experiments.benchmark_training`` above it stays).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from garlic.config import CONFIG_DIR, Config
from garlic.data.datasets import DEFAULT_DATA_ROOT
from garlic.io.atomic import atomic_file

HEADING = "## Under load"
BUSY_LOOP = "while True: pass"
SETTLE_SECONDS = 1.0  # the busy processes run this long before a condition's first measurement
CHOSEN_ENVIRONMENT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")  # each variant sets its own


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    environment: dict[str, str]  # on top of this process's, without CHOSEN_ENVIRONMENT
    torch_first: bool = False  # torch loaded before garlic can set the wait policy: OpenMP's default wait


VARIANTS = {v.name: v for v in [
    Variant("before", "torch's thread count, OpenMP's default wait (garlic before #56)", {}, torch_first=True),
    Variant("passive", "torch's thread count, passive wait", {"OMP_WAIT_POLICY": "PASSIVE"}),
    Variant("one", "one thread", {"OMP_NUM_THREADS": "1"}),
    Variant("automatic", "garlic now: OpenMP's default wait, threads chosen from the free CPUs", {}),
]}  # fmt: skip


def child_command(variant: Variant, job: dict) -> list[str]:
    """The measuring process of ``variant``: the first imports decide OpenMP's wait and start the CPU watch."""
    first = "import torch" if variant.torch_first else "from garlic.training.threads import watch_cpus; watch_cpus()"
    return [sys.executable, "-c", f"{first}\nfrom experiments.benchmark_load import child\nchild()", json.dumps(job)]


def child() -> None:
    """In a measuring process: ``measure_speed`` of the job in ``sys.argv[1]``; prints its result as a JSON line."""
    import torch

    from garlic.training.speed import measure_speed
    from garlic.training.threads import adapt_threads

    job = json.loads(sys.argv[1])
    if job["variant"] == "automatic":
        adapt_threads()  # as the fit loop does before each epoch
    threads = torch.get_num_threads()
    speed = measure_speed(Config().override(job["config"]), Path(job["data_root"]), job["batches"])
    print(json.dumps({"threads": threads, "epoch_seconds": speed["epoch_seconds"],
                      "stays_per_second": speed["stays_per_second"], "batches": speed["batches"]}))  # fmt: skip


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` processes that keep a CPU busy each, for the ``with`` block."""
    started = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    try:
        if started:
            time.sleep(SETTLE_SECONDS)
        yield
    finally:
        for process in started:
            process.terminate()
            process.wait()


def measure(variant: Variant, job: dict) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in CHOSEN_ENVIRONMENT} | variant.environment
    result = subprocess.run(child_command(variant, job | {"variant": variant.name}), capture_output=True, text=True,
                            env=environment, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"the {variant.name} measurement failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def condition_name(busy: int) -> str:
    return "idle" if busy == 0 else f"beside {busy} busy process{'es' if busy > 1 else ''}"


def load_table(rows: list[dict], batches: int) -> str:
    """Markdown: a row per condition and variant, its time beside the one-thread time of the same condition."""
    lines = [f"| condition | variant | threads | s for {batches} batches | x one thread | inference stays/s |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    one = {row["busy"]: row["epoch_seconds"] for row in rows if row["variant"] == "one"}
    for row in rows:
        ratio = f"{row['epoch_seconds'] / one[row['busy']]:.2f}" if row["busy"] in one else ""
        lines.append(f"| {condition_name(row['busy'])} | {row['variant']} | {row['threads']} | "
                     f"{row['epoch_seconds']:.1f} | {ratio} | {row['stays_per_second']:.0f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def load_section(rows: list[dict], batches: int, preset: str, machine: str, command: str) -> str:
    variants = "; ".join(f"**{v.name}**: {v.description}" for v in VARIANTS.values() if v.name in
                         {row["variant"] for row in rows})  # fmt: skip
    return (f"{HEADING}\n\nHow training degrades on a machine that other work shares (issue #56): the first {batches} "
            f"batches of a {preset} training epoch (reconstruction stage) and inference over its split's validation "
            "and test stays, each in a process of its own, idle and beside 1 and 2 busy processes (Python loops on "
            f"no particular CPU). Variants: {variants}. `x one thread` is the time over the one-thread time in the "
            f"same condition. {machine}. Command: `{command}`.\n\n" + load_table(rows, batches))  # fmt: skip


def with_section(report: str, section: str) -> str:
    """``report`` with ``section`` in place of its section of the same ``## `` heading, or added at its end."""
    heading = section.split("\n", 1)[0]
    start = report.find(f"\n{heading}\n")
    if start < 0:
        return report.rstrip("\n") + "\n\n" + section if report.strip() else section
    end = report.find("\n## ", start + 1)
    return report[: start + 1] + section + (report[end:] if end >= 0 else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="physionet2012-fast", help="a shipped preset (garlic/configs/NAME.json)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    parser.add_argument("--batches", type=int, default=40, metavar="N", help="time the epoch's first N batches")
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], metavar="K",
                        help="the conditions: K busy processes beside each measurement (default 0 1 2)")  # fmt: skip
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--out", type=Path, help="write the section 'Under load' of DIR/speed.md")
    args = parser.parse_args(argv)
    if args.batches < 1 or any(k < 0 for k in args.busy):
        parser.error(f"--batches must be at least 1 and --busy 0 or more, got {args.batches} and {args.busy}")
    if any("=" not in item for item in args.set):
        parser.error(f"--set takes KEY=VALUE, got {args.set}")
    config = Config.load(CONFIG_DIR / f"{args.preset}.json", **dict(item.split("=", 1) for item in args.set))
    job = {"config": config.to_dict(), "data_root": str(args.data_root.resolve()), "batches": args.batches}

    from garlic.training.speed import cpu_name

    load = os.getloadavg()[0]
    machine = f"{cpu_name()}, {os.cpu_count()} CPUs, load average {load:.2f} at the start"
    print(f"{machine}{' (not idle: measure on an idle machine)' if load > 0.5 else ''}", flush=True)
    rows = []
    for busy in args.busy:
        with busy_processes(busy):
            for name in args.variants:
                row = {"busy": busy, "variant": name} | measure(VARIANTS[name], job)
                rows.append(row)
                print(f"{condition_name(busy)}, {name}: {row['threads']} thread(s), {row['epoch_seconds']:.1f} s "
                      f"for {row['batches']} batches, inference {row['stays_per_second']:.0f} stays/s",
                      flush=True)  # fmt: skip
    print(load_table(rows, args.batches), end="")
    if args.out is not None:
        command = "python -m experiments.benchmark_load " + shlex.join(argv if argv is not None else sys.argv[1:])
        report = args.out / "speed.md"
        text = with_section(report.read_text() if report.is_file() else "",
                            load_section(rows, args.batches, args.preset, machine, command))  # fmt: skip
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic_file(report, "w") as out:
            out.write(text)


if __name__ == "__main__":
    main()
