"""How fast a config trains and predicts on this machine: what the speed benchmarks measure
(``experiments.benchmark_training``, and ``experiments.benchmark_load`` in processes of their own).

``measure_speed``: one training epoch (or its first ``batches``) in the reconstruction stage (all parameters, the
costlier stage) over a split's training stays, the model prepared as a fit prepares it (the reference model's scales
and padded length from the training stays), and stays per second when predicting the split's validation and test
stays: the median of ``INFERENCE_PASSES`` passes, with the slowest and fastest beside it, because single passes on a
shared machine were seen to differ by 20%. Asked for, the work of the epoch in floating-point operations of its
matrix products, forward and backward (``torch.utils.flop_counter``, on a sample of batches scaled to the epoch's
padded steps). ``cpu_name`` names the machine a measurement was made on.
"""

from __future__ import annotations

import itertools
import platform
import time
from pathlib import Path

import numpy as np
from torch.utils.flop_counter import FlopCounterMode

from garlic.config import Config
from garlic.data.batches import IrregularDataset, loader
from garlic.data.datasets import ensure_processed
from garlic.data.splits import load_splits
from garlic.io.tensors import load_tensors
from garlic.models.network_config import NetworkConfig
from garlic.models.predict import predict_proba
from garlic.training.losses import RECONSTRUCTION, stage_losses
from garlic.training.schedules import make_trainer
from garlic.training.training_config import TrainingConfig

INFERENCE_PASSES = 5
FLOP_SAMPLE_BATCHES = 8


def cpu_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what ``platform`` knows: the machines behind this
    project's rows have differed, and a row's seconds mean little without its machine."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def epoch_gflop(trainer, batches: list, config: Config) -> float:
    """The matrix-product work of one training epoch over ``batches`` (forward and backward, reconstruction stage),
    counted on ``FLOP_SAMPLE_BATCHES`` of them and scaled by the epoch's padded steps (every product is per step or per
    stay, so its work grows with the stays times the padded steps)."""
    sample = batches[:: max(1, len(batches) // FLOP_SAMPLE_BATCHES)][:FLOP_SAMPLE_BATCHES]
    trainer.model.train()
    with FlopCounterMode(display=False) as counter:
        for batch in sample:
            losses = stage_losses(trainer.model, batch.to(trainer.device), config)
            losses[RECONSTRUCTION].backward()
    trainer.model.zero_grad(set_to_none=True)
    cells = lambda chosen: sum(len(batch) * batch.values.shape[1] for batch in chosen)  # noqa: E731
    return counter.get_total_flops() * cells(batches) / cells(sample) / 1e9


def measure_speed(
    config: Config, data_root: Path, batches: int | None = None, split_index: int = 0, count_flops: bool = False
) -> dict:
    """The training epoch's seconds (its first ``batches`` only, where given) and the inference rate of ``config``
    on split ``split_index`` of its dataset under ``data_root``; with ``count_flops``, the epoch's GFLOP."""
    folder = ensure_processed(config.dataset, data_root)
    tensors = load_tensors(folder)
    split = load_splits(folder, tensors, config.split_protocol, config.dataset)[split_index]

    def part(name: str) -> IrregularDataset:
        return IrregularDataset(tensors.subset(split.positions(tensors, name)), split.normalisation)

    train, held_out = part("train"), part("validation")
    trainer = make_trainer(
        NetworkConfig.from_run(config),
        TrainingConfig.from_run(config),
        len(tensors.variables),
        len(tensors.static_features),
    )
    trainer.model.prepare(train.times, train.lengths)
    epoch = loader(train, config.batch_size, shuffle=True, seed=config.seed)
    timed = list(itertools.islice(epoch, batches)) if batches else list(epoch)
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
        "gflop_per_epoch": epoch_gflop(trainer, timed, config) * len(epoch) / len(timed) if count_flops else None,
        "predicted_stays": len(held_out) + len(test),
        "inference_passes": len(rates),
        "stays_per_second": float(np.median(rates)),
        "stays_per_second_range": (min(rates), max(rates)),
    }
