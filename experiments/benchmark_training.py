"""Training and inference speed of GARLIC on a processed dataset, and (with --accuracy) the five-split result.

    python -m experiments.benchmark_training --dataset physionet2012            # one epoch + inference, minutes
    python -m experiments.benchmark_training --config experiments/configs/physionet2012-reference.json --batches 20
    python -m experiments.benchmark_training --dataset physionet2012 --accuracy # five full trainings, hours on a CPU

Speed: one training epoch (or its first ``--batches N``) in the reconstruction stage (all parameters, the costlier
stage) over split 0's training stays with the dataset's shipped config (or ``--config FILE``), the model prepared as
a fit prepares it (the reference model's scales and padded length from the training stays), and stays per second
when predicting split 0's validation and test stays:
the median of ``INFERENCE_PASSES`` passes, with the slowest and fastest beside it, because single passes on a shared
machine were seen to differ by 20%.
Accuracy: ``garlic train --all-splits`` with the shipped config, test AUROC/AUPRC mean +/- std beside the paper's.
"""
from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
import torch

from garlic import runs
from garlic.config import Config
from garlic.data import IrregularDataset, loader
from garlic.datasets import DEFAULT_DATA_ROOT, ensure_processed
from garlic.splits import load_splits
from garlic.tracking import DEFAULT_STORE
from garlic.losses import RECONSTRUCTION
from garlic.predict import predict_proba
from garlic.reference_model import ReferenceGarlic
from garlic.train import make_trainer
from preprocessing.tensors import load_tensors

INFERENCE_PASSES = 5
PAPER = {"physionet2012": {"auroc": (86.40, 0.86), "auprc": (56.89, 1.75)}}


def measure_speed(config: Config, data_root: Path, batches: int | None = None) -> dict:
    folder = ensure_processed(config.dataset, data_root)
    tensors = load_tensors(folder)
    split = load_splits(folder, tensors, config.split_protocol)[0]

    def part(name: str) -> IrregularDataset:
        return IrregularDataset(tensors.subset(split.positions(tensors, name)), split.normalisation)

    train, held_out = part("train"), part("validation")
    trainer = make_trainer(config, len(tensors.variables), len(tensors.static_features))
    if isinstance(trainer.model, ReferenceGarlic):
        trainer.model.fit_scales(train.times, train.lengths)
    epoch = loader(train, config.batch_size, shuffle=True, seed=config.seed)
    timed = list(itertools.islice(epoch, batches)) if batches else epoch
    start = time.perf_counter()
    trainer.train_epoch(timed, RECONSTRUCTION)
    epoch_seconds = time.perf_counter() - start

    test = part("test")
    rates = []
    for _ in range(INFERENCE_PASSES):
        start = time.perf_counter()
        predict_proba(trainer.model, held_out)
        predict_proba(trainer.model, test)
        rates.append((len(held_out) + len(test)) / (time.perf_counter() - start))
    return {
        "training_stays": len(train),
        "batches": len(timed),
        "epoch_batches": len(epoch),
        "epoch_seconds": epoch_seconds,
        "predicted_stays": len(held_out) + len(test),
        "stays_per_second": float(np.median(rates)),
        "stays_per_second_range": (min(rates), max(rates)),
    }


def measure_accuracy(config: Config, data_root: Path, store: Path) -> None:
    run_id, results = runs.train(config, list(range(5)), data_root, store)
    print(f"five-split run {run_id}")
    for metric in ("auroc", "auprc", "brier", "ece"):
        values = 100 * np.array([r.test[metric] for r in results])
        paper = PAPER.get(config.dataset, {}).get(metric)
        beside = f"   paper {paper[0]:.2f} +/- {paper[1]:.2f}" if paper else ""
        print(f"test {metric:6s} {values.mean():6.2f} +/- {values.std():.2f}{beside}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="physionet2012")
    parser.add_argument("--config", type=Path, help="a JSON config (default: the dataset's shipped one)")
    parser.add_argument("--batches", type=int, metavar="N", help="time the epoch's first N batches only")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--mlruns", type=Path, default=DEFAULT_STORE)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--accuracy", action="store_true", help="also train all five splits (long)")
    args = parser.parse_args()
    if args.batches is not None and args.batches < 1:
        parser.error(f"--batches must be at least 1, got {args.batches}")
    config = (Config.load(args.config) if args.config else Config.for_dataset(args.dataset)).override(args.set)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {config.device}")
    speed = measure_speed(config, args.data_root, args.batches)
    if speed["batches"] < speed["epoch_batches"]:
        print(f"training: {speed['epoch_seconds']:.1f} s for the first {speed['batches']} of the epoch's "
              f"{speed['epoch_batches']} batches of {config.batch_size} stays")  # fmt: skip
    else:
        print(f"one training epoch: {speed['epoch_seconds']:.1f} s for {speed['training_stays']} stays "
              f"(batch {config.batch_size})")  # fmt: skip
    slowest, fastest = speed["stays_per_second_range"]
    print(f"inference: {speed['stays_per_second']:.0f} stays/s over {speed['predicted_stays']} stays "
          f"(median of {INFERENCE_PASSES} passes; {slowest:.0f}-{fastest:.0f})")  # fmt: skip
    if args.accuracy:
        measure_accuracy(config, args.data_root, args.mlruns)


if __name__ == "__main__":
    main()
