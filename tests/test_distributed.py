"""Data-parallel training: the batch sharding, and two gloo processes on loopback (``torchrun``) against one."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist

from garlic.training import distributed
from garlic import runs
from garlic.config import Config
from garlic.data.batches import IrregularDataset, LengthBucketSampler
from garlic.data.splits import load_splits
from garlic.io.tensors import load_tensors
from garlic.tracking.store import use_store
from garlic.sources import synthetic
from garlic.training.alternating import AlternatingTrainer
from garlic.training.state import RANK_TALLIES
from garlic.training.trainer import Trainer
from helpers import synthetic_cohort, garlic_settings

# dropout 0: with dropout on, each rank draws its own masks, so the runs agree only in distribution.
SMALL = {"hidden_dim": 16, "feature_dim": 4, "batch_size": 64, "max_epochs": 2, "dropout": 0.0}
# What differs: the order of floating-point sums, and the reconstruction MSE, a mean over observed cells, which
# each rank takes over its half-batch (weighted by stays, not cells; BCE is exact). Measured on this cohort after
# 2 epochs: validation risks within 1.6e-7, validation AUROC and AUPRC identical, validation loss within 1.4e-6,
# logged training loss (also a per-half mean) within 1.2e-4 relative.
RISK_TOLERANCE = 1e-5
METRIC_TOLERANCE = 1e-4
TRAIN_LOSS_RELATIVE = 1e-3


@pytest.mark.parametrize("stays, batch_size, world_size", [(320, 64, 2), (97, 10, 3), (5, 64, 2), (3, 2, 2)])
def test_each_rank_gets_a_disjoint_share_of_every_batch_and_together_all_stays(stays, batch_size, world_size):
    lengths = torch.randint(1, 50, (stays,))
    whole = [list(b) for b in LengthBucketSampler(lengths, batch_size, seed=4)]
    shares = []
    for rank in range(world_size):
        sampler = distributed.ShardedBatchSampler(
            LengthBucketSampler(lengths, batch_size, seed=4), distributed.World(rank, world_size)
        )
        shares.append(list(sampler))
        assert sampler.epoch == 1  # the wrapped sampler moved on one epoch, as it does alone
    assert len({len(s) for s in shares}) == 1  # every rank takes the same number of steps
    for step in zip(*shares):
        assert all(step) and not set.intersection(*map(set, step))
    seen = sorted(i for share in shares for batch in share for i in batch)
    assert seen == sorted(i for batch in whole for i in batch) == list(range(stays))
    # The ranks' parts of a step make one single-process batch, except that a batch too small to share is merged
    # into the epoch's last batch.
    joined = [sorted(i for part in step for i in part) for step in zip(*shares)]
    small = sum(len(b) < world_size for b in whole)
    assert sum(sorted(b) in joined for b in whole) == len(whole) - small - (small > 0)


def test_too_few_stays_for_the_ranks_is_a_clear_error():
    sampler = distributed.ShardedBatchSampler(LengthBucketSampler(torch.ones(1), 8), distributed.World(0, 2))
    with pytest.raises(ValueError, match="1 training stays cannot be shared by 2 processes"):
        list(sampler)


def test_helpers_do_nothing_in_a_single_process():
    assert distributed.current() == distributed.World(0, 1) and distributed.is_main()
    assert distributed.batch_weight(7) == 1.0
    assert distributed.any_rank(True) and not distributed.any_rank(False)
    state = {"a": torch.ones(2)}
    assert distributed.broadcast_state(state) is state
    assert torch.equal(distributed.all_gather(torch.arange(3))[0], torch.arange(3))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def validation_of(store, run_id) -> tuple[pd.DataFrame, dict[int, float], dict[str, float]]:
    use_store(store)
    client = mlflow.MlflowClient()
    table = pd.read_csv(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="predictions/validation.csv"))
    history = {m.step: m.value for m in client.get_metric_history(run_id, "val_auroc")}
    return table, history, client.get_run(run_id).data.metrics


def test_two_gloo_processes_reach_the_validation_metrics_of_one(tmp_path):
    root = tmp_path / "data"
    synthetic.generate(root / "processed" / "synthetic", n_stays=400, seed=5)
    config = Config.for_dataset("synthetic").override(SMALL)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun process runs
    try:
        alone, _ = runs.train(config, [0], data_root=root, store=tmp_path / "one")
    finally:
        torch.set_num_threads(threads)

    settings = [item for key, value in SMALL.items() for item in ("--set", f"{key}={value}")]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "garlic.cli",
        "--data-root",
        str(root),
        "--mlruns",
        str(tmp_path / "two"),
        "train",
        "--device",
        "cpu",
        *settings,
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("run ")]  # rank 0 alone reports
    together = line.split()[1].rstrip(";")

    one, two = validation_of(tmp_path / "one", alone), validation_of(tmp_path / "two", together)
    np.testing.assert_array_equal(one[0]["stay_id"], two[0]["stay_id"])
    np.testing.assert_allclose(two[0]["risk"], one[0]["risk"], rtol=0, atol=RISK_TOLERANCE)
    assert sorted(one[1]) == sorted(two[1]) == [1, 2]
    for step in one[1]:
        assert two[1][step] == pytest.approx(one[1][step], abs=METRIC_TOLERANCE)
    for metric in ("val_auprc", "val_bce", "val_loss", "test_auroc"):
        assert two[2][metric] == pytest.approx(one[2][metric], abs=METRIC_TOLERANCE), metric
    assert two[2]["train_loss"] == pytest.approx(one[2]["train_loss"], rel=TRAIN_LOSS_RELATIVE)
    assert len(mlflow.search_runs(search_all_experiments=True, output_format="list")) == 1  # rank 0's only


def _fit_whole_then_resumed(rank: int, root, address: str, out) -> None:
    """One of two gloo processes: GARLIC fitted with a state after every batch, then a fresh trainer resumed from
    the state written after the second epoch's first batch; each rank saves both fits' weights and histories."""
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        tensors = load_tensors(root / "processed" / "synthetic")
        split = load_splits(root / "processed" / "synthetic", tensors)[0]
        train, validation = (
            IrregularDataset(tensors.subset(split.positions(tensors, part)), split.normalisation)
            for part in ("train", "validation")
        )
        config = Config.for_dataset("synthetic").override({**SMALL, "batch_size": 32})
        settings = (*garlic_settings(config), len(tensors.variables), len(tensors.static_features))
        fresh = lambda: AlternatingTrainer(*settings)  # noqa: E731
        Trainer.checkpoint_seconds = 0.0
        written = []

        def keep(state: dict) -> None:  # as the state file holds it: saved, then read back
            buffer = io.BytesIO()
            torch.save(state, buffer)
            written.append(buffer.getvalue())

        whole = fresh().fit(train, validation, on_state=keep)
        states = [torch.load(io.BytesIO(b), weights_only=True) for b in written]
        (within,) = [
            state
            for state in states
            if state["progress"]["epoch"] == 1 and state.get("epoch_pass", {}).get("batches_done") == 1
        ]
        resumed = fresh().fit(train, validation, resume=within)
        torch.save(
            {
                "whole": whole.model.state_dict(),
                "resumed": resumed.model.state_dict(),
                "histories": [[asdict(r) | {"seconds": 0.0} for r in fit.history] for fit in (whole, resumed)],
                "within": within["epoch_pass"],
                "passes": sum("epoch_pass" in s for s in states),
            },
            out / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def test_two_processes_killed_within_an_epoch_resume_from_every_ranks_last_batch_exactly(tmp_path_factory, tmp_path):
    cohort = synthetic_cohort(tmp_path_factory, n_stays=240, seed=3)
    address = f"file://{tmp_path / 'rendezvous'}"
    # Two processes of their own (not multiprocessing's spawn, which runs the parent's __main__ again: under pytest
    # that can be a module another test ran as a script).
    worker = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "from test_distributed import _fit_whole_then_resumed as fit; "
        "fit(int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))"
    )
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                worker,
                str(Path(__file__).parent),
                str(rank),
                str(cohort.root),
                address,
                str(tmp_path),
            ],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    errors = [rank.communicate(timeout=300)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], "\n".join(error[-2000:] for error in errors)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
    batches = len(ranks[0]["histories"][0]) * -(-len(cohort.parts["train"]) // 32)
    assert ranks[0]["passes"] == batches  # all ranks wrote a state within the epoch after every batch, together
    within = ranks[0]["within"]
    tallies = within[RANK_TALLIES]
    assert len(tallies) == 2 and tallies[0] != tallies[1]  # each rank's own half-batch
    assert within["tally"] == tallies[0] and tallies[0]["count"] + tallies[1]["count"] == 32  # one whole batch
    for rank in ranks:
        whole, resumed = rank["whole"], rank["resumed"]
        for name in whole:
            torch.testing.assert_close(resumed[name], whole[name], rtol=0, atol=0)
        assert rank["histories"][1] == rank["histories"][0]  # the resumed epoch's losses too, to the last bit
