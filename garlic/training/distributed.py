"""Data-parallel training over several processes, as launched by ``torchrun``: process group, ranks, sharding.

``torchrun`` gives every process RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. With WORLD_SIZE > 1,
``process_group`` joins them (NCCL on GPUs, gloo on CPUs); without it every helper here is a no-op, so one process
trains exactly as before. All ranks draw the same length-bucketed batches and each trains on its own slice of every
batch (``ShardedBatchSampler``): the training stays are disjoint across ranks and, together, the ranks take the
same optimisation steps as one process would, with DistributedDataParallel averaging the gradients. Validation and
test are small; every rank evaluates them whole, so that all ranks take the same model-selection decisions without
talking to each other. Only rank 0 logs to MLflow and writes the training state.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def current() -> World:
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(dist.get_rank(), dist.get_world_size())


def is_main() -> bool:
    return current().is_main


@contextlib.contextmanager
def process_group(device: str) -> Iterator[World]:
    """Join the ``torchrun`` job the environment describes, for the duration; a no-op in a single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        yield current()
        return
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:  # each process drives the GPU of its local rank; "cuda" then means that one
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    try:
        yield current()
        # Leave together: a rank that tears its group down while rank 0 still logs can be aborted by gloo.
        dist.barrier()
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block before the other ranks do, so that caches it writes are there for them to read."""
    world = current()
    if not world.is_main:
        dist.barrier()
    yield
    if world.is_main and world.size > 1:
        dist.barrier()


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def wrap(model: nn.Module) -> nn.Module:
    """``model`` under DistributedDataParallel when several processes train it, else ``model`` itself."""
    if current().size == 1:
        return model
    device_ids = [torch.cuda.current_device()] if next(model.parameters()).is_cuda else None
    # The prediction stage freezes the reconstruction parameters, which then get no gradient.
    return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=True)


class ShardedBatchSampler:
    """This rank's part of every batch that ``batches`` draws: the stays ``rank, rank + W, ...`` of it.

    Every rank draws the same batches (same seed, same epoch), so the parts are disjoint and together make exactly
    the batches of a single process. A batch with fewer stays than ranks would leave a rank without work; it is
    merged into the last batch of the epoch.
    """

    def __init__(self, batches, world: World):
        self.batches, self.world = batches, world

    @property
    def epoch(self) -> int:
        return self.batches.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.batches.epoch = value

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        batches = list(self.batches)
        large = [b for b in batches if len(b) >= self.world.size]
        if not large:
            raise ValueError(f"{sum(map(len, batches))} training stays cannot be shared by {self.world.size} processes")
        large[-1] = large[-1] + [i for b in batches if len(b) < self.world.size for i in b]
        for batch in large:
            yield batch[self.world.rank :: self.world.size]


def shard(batches: DataLoader) -> DataLoader:
    """``batches`` (built with a batch sampler) restricted to this rank's part of each batch."""
    world = current()
    if world.size == 1:
        return batches
    sampler = ShardedBatchSampler(batches.batch_sampler, world)
    return DataLoader(batches.dataset, batch_sampler=sampler, collate_fn=batches.collate_fn)


def all_sum(values: torch.Tensor) -> torch.Tensor:
    """``values`` summed over the ranks (unchanged in a single process)."""
    if current().size == 1:
        return values
    summed = values.to(_collective_device())
    dist.all_reduce(summed)
    return summed.to(values.device)


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (``flag`` itself in a single process): a decision all ranks take alike."""
    if current().size == 1:
        return flag
    return bool(all_sum(torch.tensor([float(flag)])).item() > 0)


def batch_weight(count: int) -> float:
    """The factor for this rank's mean loss over its ``count`` stays that makes DDP's average of the ranks'
    gradients equal the gradient of the whole batch's mean loss (1 in a single process)."""
    world = current()
    if world.size == 1:
        return 1.0
    total = int(all_sum(torch.tensor([count], dtype=torch.float64)).item())
    return count * world.size / total


def all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape on all ranks), in rank order, on the CPU."""
    world = current()
    if world.size == 1:
        return [tensor.cpu()]
    local = tensor.to(_collective_device())
    gathered = [torch.empty_like(local) for _ in range(world.size)]
    dist.all_gather(gathered, local)
    return [t.cpu() for t in gathered]


def broadcast_state(state: dict | None) -> dict | None:
    """Rank 0's ``state`` on every rank; it travels as ``torch.save`` bytes and is read with ``weights_only=True``."""
    world = current()
    if world.size == 1:
        return state
    device = _collective_device()
    if world.is_main:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8).to(device)
        size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if not world.is_main:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=0)
    if world.is_main:
        return state
    return torch.load(io.BytesIO(payload.cpu().numpy().tobytes()), map_location="cpu", weights_only=True)
