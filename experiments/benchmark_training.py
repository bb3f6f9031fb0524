"""Training and inference speed of GARLIC's presets on a processed dataset, and (with --accuracy) the five-split result.

    python -m experiments.benchmark_training --dataset physionet2012            # one epoch + inference, minutes
    python -m experiments.benchmark_training --config garlic/configs/physionet2012-reference.json --batches 20
    python -m experiments.benchmark_training --presets physionet2012-best physionet2012-fast --protocol raindrop \\
        --full-run --out docs/results                                           # the speed table, docs/results/speed.md
    python -m experiments.benchmark_training --presets physionet2012-fast --protocol raindrop --batches 60 \\
        --compare-kernels 3                                                     # fused kernels against PyTorch's
    python -m experiments.benchmark_training --dataset physionet2012 --accuracy # five full trainings

Speed (``garlic.training.speed.measure_speed``): one training epoch (or its first ``--batches N``) in the
reconstruction stage over the split's training stays with the dataset's shipped config (or ``--config FILE``, or each
of ``--presets``), and stays per second when predicting the split's validation and test stays (the median of several
passes, with the slowest and fastest beside it). With ``--out``, the work of the epoch in floating-point operations of
its matrix products beside the rate at which this machine multiplies two 2048 x 2048 matrices: their ratio is the
epoch's floor.

``--compare-kernels R`` measures the same (the first ``--batches N``) with PyTorch's GRU and layer norm and with the
fused CPU kernels that stand in for them (``garlic.models.fused``), alternated R times in one process, and prints the
medians and their ratio: a before/after on a shared machine, where the hour moves single timings by a quarter.

``--full-run`` also trains, selects and tests the split once (``garlic train``, into ``--mlruns``): its wall time and
the epochs it ran. ``--out DIR`` keeps one row per preset, protocol, split and thread count in ``DIR/speed.csv``
(rows of other presets stay) and writes the table of ``DIR/speed.md`` from it; the sections after the table
(``## ...``: ``experiments.benchmark_load``'s, one written by hand) stay.

Accuracy: ``garlic train --all-splits`` with the shipped config, test AUROC/AUPRC mean +/- std beside the paper's.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from garlic import runs
from garlic.config import CONFIG_DIR, Config
from garlic.data.datasets import DEFAULT_DATA_ROOT
from garlic.metrics import METRICS
from garlic.models.fused import fused_kernels, kernels
from garlic.tracking.store import DEFAULT_STORE
from garlic.training.speed import cpu_name, measure_speed
from garlic.io.atomic import atomic_file

PAPER = {"physionet2012": {"auroc": (86.40, 0.86), "auprc": (56.89, 1.75)}}
SPEED_COLUMNS = [
    "preset",
    "dataset",
    "protocol",
    "split",
    "cpu",
    "threads",
    "training_stays",
    "batch_size",
    "epoch_seconds",
    "gflop_per_epoch",
    "matmul_gflops",
    "floor_seconds",
    "stays_per_second",
    "epochs_run",
    "best_epoch",
    "run_seconds",
    "test_auroc",
    "test_auprc",
    "command",
]


def matmul_gflops(size: int = 2048, repeats: int = 10) -> float:
    """This machine's rate at multiplying two ``size`` x ``size`` float32 matrices, in GFLOP/s (the best of three)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, (time.perf_counter() - start) / repeats)
    return 2 * size**3 / best / 1e9


def compare_kernels(
    config: Config, data_root: Path, batches: int | None, split_index: int, rounds: int
) -> pd.DataFrame:
    """``measure_speed`` with PyTorch's layers and with the fused kernels, alternated ``rounds`` times: one row each."""
    rows = []
    for round_ in range(rounds):
        for fused in (False, True):
            with fused_kernels(fused):
                speed = measure_speed(config, data_root, batches, split_index)
            rows.append(
                {
                    "round": round_,
                    "kernels": "fused" if fused else "pytorch",
                    "epoch_seconds": speed["epoch_seconds"],
                    "stays_per_second": speed["stays_per_second"],
                }
            )
    return pd.DataFrame(rows)


def print_kernel_comparison(frame: pd.DataFrame) -> None:
    for name, timings in frame.groupby("kernels", sort=False):
        print(
            f"{name:8s} training {', '.join(f'{s:.2f}' for s in timings['epoch_seconds'])} s; inference "
            f"{', '.join(f'{r:.0f}' for r in timings['stays_per_second'])} stays/s"
        )
    fused, pytorch = (frame[frame["kernels"] == name].median(numeric_only=True) for name in ("fused", "pytorch"))
    print(
        f"fused / pytorch, medians: training time x{fused['epoch_seconds'] / pytorch['epoch_seconds']:.2f}, "
        f"inference rate x{fused['stays_per_second'] / pytorch['stays_per_second']:.2f}"
    )


def full_run(config: Config, split_index: int, data_root: Path, store: Path, preset: str) -> dict:
    """Train, select and test one split as ``garlic train`` does: wall time, epochs run, best epoch, test metrics."""
    epochs = []
    start = time.perf_counter()
    _, results = runs.train(
        config, [split_index], data_root, store, on_epoch=lambda _, record: epochs.append(record), preset=preset
    )
    seconds = time.perf_counter() - start
    result = results[0]
    return {
        "run_seconds": seconds,
        "epochs_run": len(epochs),
        "best_epoch": result.best_epoch,
        "test_auroc": result.test["auroc"],
        "test_auprc": result.test["auprc"],
    }


def keep_rows(path: Path, rows: list[dict]) -> pd.DataFrame:
    """``path``'s rows with ``rows`` in place of those of the same preset, dataset, protocol, split, CPU and threads."""
    new = pd.DataFrame(rows, columns=SPEED_COLUMNS)
    if path.is_file():
        old = pd.read_csv(path)
        key = ["preset", "dataset", "protocol", "split", "cpu", "threads"]
        replaced = old.set_index(key).index.isin(new.set_index(key).index)
        new = pd.concat([old[~replaced], new], ignore_index=True)
    return new


def sections_after_the_table(report: Path) -> str:
    """The ``## `` sections that follow the table in ``report`` (from its first such heading on), or nothing."""
    text = report.read_text() if report.is_file() else ""
    start = text.find("\n## ")
    return "" if start < 0 else text[start:]


def speed_report(frame: pd.DataFrame) -> str:
    lines = [
        "# Speed",
        "",
        "Each row is one measurement on one of this project's CPU machines, named in its row "
        "(the machines have differed over time: compare rows of the same CPU; the command is in the row's "
        "`command` column of `speed.csv`): one training epoch in the reconstruction stage (the costlier stage), "
        "the matrix-product work of that epoch (forward and backward) and the seconds it would take at this "
        "machine's measured 2048 x 2048 matrix-multiply rate (the floor), inference over the split's validation "
        "and test stays (median of 5 passes) and, where a whole run was timed, its wall time (train, select, "
        "test, explanations and logging) and the epochs it ran.",
        "",
        "| preset | dataset | protocol / split | CPU | threads | s / epoch | GFLOP / epoch | matmul GFLOP/s | "
        "floor s / epoch | inference stays/s | epochs run (best) | s / run | test AUROC / AUPRC |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in frame.itertuples():
        run = "" if pd.isna(row.run_seconds) else f"{row.run_seconds:.0f}"
        epochs = "" if pd.isna(row.epochs_run) else f"{row.epochs_run:.0f} ({row.best_epoch:.0f})"
        test = "" if pd.isna(row.test_auroc) else f"{row.test_auroc:.3f} / {row.test_auprc:.3f}"
        lines.append(
            f"| {row.preset} | {row.dataset} | {row.protocol} / {row.split} | {row.cpu} | {row.threads} | "
            f"{row.epoch_seconds:.1f} | {row.gflop_per_epoch:.0f} | {row.matmul_gflops:.0f} | "
            f"{row.floor_seconds:.1f} | "
            f"{row.stays_per_second:.0f} | {epochs} | {run} | {test} |"
        )
    return "\n".join(lines) + "\n"


def measure_accuracy(config: Config, data_root: Path, store: Path) -> None:
    run_id, results = runs.train(config, list(range(5)), data_root, store)
    print(f"five-split run {run_id}")
    for metric in METRICS:
        values = 100 * np.array([r.test[metric] for r in results])
        paper = PAPER.get(config.dataset, {}).get(metric)
        beside = f"   paper {paper[0]:.2f} +/- {paper[1]:.2f}" if paper else ""
        print(f"test {metric:6s} {values.mean():6.2f} +/- {values.std():.2f}{beside}")


def print_speed(config: Config, speed: dict) -> None:
    if speed["batches"] < speed["epoch_batches"]:
        print(
            f"training: {speed['epoch_seconds']:.1f} s for the first {speed['batches']} of the epoch's "
            f"{speed['epoch_batches']} batches of {config.batch_size} stays"
        )
    else:
        print(
            f"one training epoch: {speed['epoch_seconds']:.1f} s for {speed['training_stays']} stays "
            f"(batch {config.batch_size})"
        )
    slowest, fastest = speed["stays_per_second_range"]
    print(
        f"inference: {speed['stays_per_second']:.0f} stays/s over {speed['predicted_stays']} stays "
        f"(median of {speed['inference_passes']} passes; {slowest:.0f}-{fastest:.0f})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--dataset",
        help="the dataset (default: physionet2012, or each preset's own); a source's "
        "preset (physionet2019) runs on the cohort named here or by --set dataset=",
    )
    parser.add_argument("--config", type=Path, help="a JSON config (default: the dataset's shipped one)")
    parser.add_argument("--presets", nargs="+", metavar="NAME", help="shipped presets (garlic/configs/NAME.json)")
    parser.add_argument("--protocol", help="the split protocol (default: the config's)")
    parser.add_argument("--split", type=int, default=0, metavar="K", help="the split to time on (default 0)")
    parser.add_argument("--batches", type=int, metavar="N", help="time the epoch's first N batches only")
    parser.add_argument("--full-run", action="store_true", help="also train, select and test the split once")
    parser.add_argument(
        "--compare-kernels",
        type=int,
        metavar="R",
        help="time PyTorch's layers against the fused kernels instead, alternated R times",
    )
    parser.add_argument("--out", type=Path, help="keep the rows in DIR/speed.csv and write DIR/speed.md")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--mlruns", type=Path, default=DEFAULT_STORE)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--accuracy", action="store_true", help="also train all five splits (long)")
    args = parser.parse_args(argv)
    if args.batches is not None and args.batches < 1:
        parser.error(f"--batches must be at least 1, got {args.batches}")
    if args.compare_kernels is not None and (args.compare_kernels < 1 or args.out or args.full_run or args.accuracy):
        parser.error("--compare-kernels R (R >= 1) only times: no --out, --full-run or --accuracy")
    if args.out is not None and (args.presets is None or args.batches is not None):
        parser.error("--out keeps whole-epoch rows of named presets: give --presets and no --batches")
    protocol = [f"split_protocol={args.protocol}"] if args.protocol else []
    if any("=" not in item for item in args.set):
        parser.error(f"--set takes KEY=VALUE, got {args.set}")
    if args.presets:
        # The overrides go in before the values are checked: a source's preset (dataset physionet2019) names its cohort.
        overrides = dict(item.split("=", 1) for item in [*protocol, *args.set])
        if args.dataset is not None:
            overrides.setdefault("dataset", args.dataset)
        configs = {name: Config.load(CONFIG_DIR / f"{name}.json", **overrides) for name in args.presets}
    else:
        config = Config.load(args.config) if args.config else Config.for_dataset(args.dataset or "physionet2012")
        configs = {None: config.override([*protocol, *args.set])}
    threads = torch.get_num_threads()
    cpu = cpu_name()
    kernels()  # built (or found unavailable) before anything is timed
    print(f"torch {torch.__version__}, {threads} threads, {cpu}")
    rate = matmul_gflops() if args.out else None
    command = "python -m experiments.benchmark_training " + shlex.join(argv if argv is not None else sys.argv[1:])
    rows = []
    for name, config in configs.items():
        print(f"{name or config.dataset}: {config.split_protocol} split {args.split}, device {config.device}")
        if args.compare_kernels:
            print_kernel_comparison(
                compare_kernels(config, args.data_root, args.batches, args.split, args.compare_kernels)
            )
            continue
        speed = measure_speed(config, args.data_root, args.batches, args.split, count_flops=args.out is not None)
        print_speed(config, speed)
        row = {
            "preset": name,
            "dataset": config.dataset,
            "protocol": config.split_protocol,
            "split": args.split,
            "cpu": cpu,
            "threads": threads,
            "training_stays": speed["training_stays"],
            "batch_size": config.batch_size,
            "epoch_seconds": speed["epoch_seconds"],
            "stays_per_second": speed["stays_per_second"],
            "command": command,
        }
        if rate is not None:
            row |= {
                "gflop_per_epoch": speed["gflop_per_epoch"],
                "matmul_gflops": rate,
                "floor_seconds": speed["gflop_per_epoch"] / rate,
            }
            print(
                f"work: {speed['gflop_per_epoch']:.0f} GFLOP an epoch; matrix products at {rate:.0f} GFLOP/s: "
                f"{row['floor_seconds']:.1f} s"
            )
        if args.full_run:
            row |= full_run(config, args.split, args.data_root, args.mlruns, name)
            print(
                f"whole run: {row['run_seconds']:.0f} s, {row['epochs_run']} epochs (best {row['best_epoch']}), "
                f"test AUROC {row['test_auroc']:.3f} AUPRC {row['test_auprc']:.3f}"
            )
        rows.append(row)
        if args.accuracy:
            measure_accuracy(config, args.data_root, args.mlruns)
    if args.out is not None:
        frame = keep_rows(args.out / "speed.csv", rows)
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic_file(args.out / "speed.csv", "w") as out:
            frame.to_csv(out, index=False, float_format="%.4g")
        sections = sections_after_the_table(args.out / "speed.md")
        with atomic_file(args.out / "speed.md", "w") as out:
            out.write(speed_report(frame) + sections)


if __name__ == "__main__":
    main()
