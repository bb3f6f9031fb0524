"""Training speed on a shared machine: the first batches of an epoch with 0, 1 and 2 busy processes beside it, and
beside another training (with or without busy processes), for torch's threads as garlic set them before issue #56,
one thread, and as garlic now chooses them.

    python -m experiments.benchmark_load --out docs/results      # on an otherwise idle machine: the numbers of speed.md
    python -m experiments.benchmark_load --busy --training 0 1 --variants before one automatic --rounds 2
                                                                 # beside another training, alternated twice
    python -m experiments.benchmark_load --batches 3 --busy 0    # a quick check that it runs

Each measurement is ``garlic.training.speed.measure_speed``: the first ``--batches`` of a training epoch of
the preset (default physionet2012-fast, split 0 of its protocol; the data under ``--data-root``) in the
reconstruction stage, then inference over the split's validation and test stays (median of its passes). Each runs in
a process of its own, because OpenMP reads its wait policy once, as torch loads. The busy processes are Python loops
(``while True: pass``, on no particular CPU), started a second before the conditions' measurements and stopped after
them. ``--training K ...`` adds conditions beside another training and K busy processes: real work that comes in
bursts (imports, data, epochs, validation, testing, plots), ``garlic train`` on the synthetic cohort with garlic's
own threads (``TRAINING_LOAD``, into a store of its own), started again whenever it ends, ``SETTLE_TRAINING_SECONDS``
before the first measurement. ``--rounds R`` measures each condition's variants R times, alternated. The variants:

    before      torch's own thread count held, OpenMP's default wait (spinning, then sleeping): garlic before #56
    passive     torch's own thread count held, waiting passively (OMP_WAIT_POLICY=PASSIVE)
    one         one thread (OMP_NUM_THREADS=1)
    automatic   what `garlic train` does now: OpenMP's default wait, one thread or torch's count, whichever the
                batches measure faster, checked again as the epoch goes (garlic.data.threads)

``--out DIR`` writes the table, the machine and the command as the "Under load" section of ``DIR/speed.md`` (the
speed table of ``experiments.benchmark_training`` above it stays).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from garlic.config import CONFIG_DIR, Config
from garlic.data.datasets import DEFAULT_DATA_ROOT
from garlic.io.atomic import atomic_file

HEADING = "## Under load"
BUSY_LOOP = "while True: pass"
SETTLE_SECONDS = 1.0  # the busy processes run this long before a condition's first measurement
SETTLE_TRAINING_SECONDS = 15.0  # the other training has imported and begun its epochs
ROOT = Path(__file__).resolve().parents[1]
TRAINING_LOAD = ["-m", "garlic.cli", "train", "--dataset", "synthetic"]  # with --data-root and --mlruns
CHOSEN_ENVIRONMENT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")  # each variant sets its own


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    environment: dict[str, str]  # on top of this process's, without CHOSEN_ENVIRONMENT
    held: bool = False  # torch's own count, held (as OMP_NUM_THREADS, which garlic's chooser leaves alone)


VARIANTS = {
    v.name: v
    for v in [
        Variant("before", "torch's thread count held, OpenMP's default wait (garlic before #56)", {}, held=True),
        Variant("passive", "torch's thread count held, passive wait", {"OMP_WAIT_POLICY": "PASSIVE"}, held=True),
        Variant("one", "one thread", {"OMP_NUM_THREADS": "1"}),
        Variant(
            "automatic",
            "garlic now: OpenMP's default wait, one thread or torch's count, whichever the batches measure faster",
            {},
        ),
    ]
}


def child_command(variant: Variant, job: dict) -> list[str]:
    """The measuring process of ``variant``."""
    return [sys.executable, "-c", "from experiments.benchmark_load import child\nchild()", json.dumps(job)]


def child() -> None:
    """In a measuring process: ``measure_speed`` of the job in ``sys.argv[1]``; prints its result as a JSON line,
    with the thread count torch ran the last batches on."""
    import torch

    from garlic.training.speed import measure_speed

    job = json.loads(sys.argv[1])
    if VARIANTS[job["variant"]].held:
        os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    speed = measure_speed(Config().override(job["config"]), Path(job["data_root"]), job["batches"])
    threads = torch.get_num_threads()
    print(
        json.dumps(
            {
                "threads": threads,
                "epoch_seconds": speed["epoch_seconds"],
                "stays_per_second": speed["stays_per_second"],
                "batches": speed["batches"],
            }
        )
    )


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


@contextmanager
def training_beside() -> Iterator[None]:
    """Another training (``TRAINING_LOAD``, garlic's own threads, its data and store in a folder of its own), started
    again whenever it ends, for the ``with`` block."""
    stop = threading.Event()
    environment = {k: v for k, v in os.environ.items() if k not in CHOSEN_ENVIRONMENT}
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, *TRAINING_LOAD, "--data-root", folder, "--mlruns", str(Path(folder) / "mlruns")]

        def train_again() -> None:
            while not stop.is_set():
                process = subprocess.Popen(
                    command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment, cwd=ROOT
                )
                while process.poll() is None:
                    if stop.wait(0.5):
                        process.terminate()
                        process.wait()

        trainer = threading.Thread(target=train_again)
        trainer.start()
        try:
            time.sleep(SETTLE_TRAINING_SECONDS)
            yield
        finally:
            stop.set()
            trainer.join()


def measure(variant: Variant, job: dict) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in CHOSEN_ENVIRONMENT} | variant.environment
    result = subprocess.run(
        child_command(variant, job | {"variant": variant.name}),
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
    )
    if result.returncode != 0:
        raise SystemExit(f"the {variant.name} measurement failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def condition_name(training: bool, busy: int) -> str:
    loops = f"{busy} busy process{'es' if busy > 1 else ''}"
    if training:
        return "beside a training" + (f" and {loops}" if busy else "")
    return f"beside {loops}" if busy else "idle"


def load_table(rows: list[dict], batches: int) -> str:
    """Markdown: a row per condition, round and variant, its time beside the one-thread time of the same condition
    and round."""
    lines = [
        f"| condition | variant | threads | s for {batches} batches | x one thread | inference stays/s | load |",
        "|---|---|---|---|---|---|---|",
    ]
    key = lambda row: (row["training"], row["busy"], row["round"])  # noqa: E731
    one = {key(row): row["epoch_seconds"] for row in rows if row["variant"] == "one"}
    for row in rows:
        ratio = f"{row['epoch_seconds'] / one[key(row)]:.2f}" if key(row) in one else ""
        lines.append(
            f"| {condition_name(row['training'], row['busy'])} | {row['variant']} | {row['threads']} | "
            f"{row['epoch_seconds']:.1f} | {ratio} | {row['stays_per_second']:.0f} | "
            f"{row['load']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def load_section(rows: list[dict], batches: int, preset: str, machine: str, command: str) -> str:
    variants = "; ".join(
        f"**{v.name}**: {v.description}" for v in VARIANTS.values() if v.name in {row["variant"] for row in rows}
    )
    return (
        f"{HEADING}\n\nHow training degrades on a machine that other work shares (issue #56): the first {batches} "
        f"batches of a {preset} training epoch (reconstruction stage) and inference over its split's validation "
        "and test stays, each in a process of its own, idle and beside busy processes (Python loops on no "
        "particular CPU) or another training (`garlic train --dataset synthetic`, started again as it ends). "
        f"Variants: {variants}. `x one thread` is the time over the one-thread time in the same condition and "
        f"round; `load` the load average as the measurement began. {machine}. Command: `{command}`.\n\n"
        + load_table(rows, batches)
    )


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
    parser.add_argument(
        "--busy",
        type=int,
        nargs="*",
        default=[0, 1, 2],
        metavar="K",
        help="the conditions: K busy processes beside each measurement (default 0 1 2)",
    )
    parser.add_argument(
        "--training",
        type=int,
        nargs="*",
        default=[],
        metavar="K",
        help="more conditions: another training and K busy processes beside each measurement",
    )
    parser.add_argument("--rounds", type=int, default=1, metavar="R", help="measure each condition R times")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--out", type=Path, help="write the section 'Under load' of DIR/speed.md")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.rounds < 1 or any(k < 0 for k in args.busy + args.training):
        parser.error(
            f"--batches and --rounds must be at least 1, --busy and --training 0 or more, got "
            f"{args.batches}, {args.rounds}, {args.busy} and {args.training}"
        )
    if any("=" not in item for item in args.set):
        parser.error(f"--set takes KEY=VALUE, got {args.set}")
    config = Config.load(CONFIG_DIR / f"{args.preset}.json", **dict(item.split("=", 1) for item in args.set))
    job = {"config": config.to_dict(), "data_root": str(args.data_root.resolve()), "batches": args.batches}

    from garlic.training.speed import cpu_name

    load = os.getloadavg()[0]
    machine = f"{cpu_name()}, {os.cpu_count()} CPUs, load average {load:.2f} at the start"
    print(f"{machine}{' (not idle: measure on an idle machine)' if load > 0.5 else ''}", flush=True)
    rows = []
    for training, busy in [(False, k) for k in args.busy] + [(True, k) for k in args.training]:
        with training_beside() if training else nullcontext(), busy_processes(busy):
            for round_, name in itertools.product(range(args.rounds), args.variants):
                row = {
                    "training": training,
                    "busy": busy,
                    "round": round_,
                    "variant": name,
                    "load": os.getloadavg()[0],
                } | measure(VARIANTS[name], job)
                rows.append(row)
                print(
                    f"{condition_name(training, busy)}, {name}: {row['threads']} thread(s), "
                    f"{row['epoch_seconds']:.1f} s for {row['batches']} batches, inference "
                    f"{row['stays_per_second']:.0f} stays/s",
                    flush=True,
                )
    print(load_table(rows, args.batches), end="")
    if args.out is not None:
        command = "python -m experiments.benchmark_load " + shlex.join(argv if argv is not None else sys.argv[1:])
        report = args.out / "speed.md"
        text = with_section(
            report.read_text() if report.is_file() else "",
            load_section(rows, args.batches, args.preset, machine, command),
        )
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic_file(report, "w") as out:
            out.write(text)


if __name__ == "__main__":
    main()
