"""Batches for the model: a dataset over the cached tensors, normalised with training statistics only."""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from functools import cached_property

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from garlic.data.splits import Normalisation
from garlic.io.tensors import IrregularTensors, PredictionTimes


@dataclass
class Queries:
    """The prediction times of a batch's stays (a dataset with a tasks table), P of them.

    stay   [P] the stay's row in the batch
    steps  [P] how many of its steps the prediction time sees (0: none yet)
    index  [P] the prediction time's position in the dataset's ``prediction_times``
    labels [P] 0/1 outcome at that time (the dataset's ``targets``)
    time   [P] hours since admission of the prediction time
    weights [P] what each one weighs in the loss (the dataset's ``target_weights``), or None: all alike
    """

    stay: torch.Tensor
    steps: torch.Tensor
    index: torch.Tensor
    labels: torch.Tensor
    time: torch.Tensor
    weights: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> "Queries":
        return Queries(
            *(None if getattr(self, f.name) is None else getattr(self, f.name).to(device) for f in fields(self))
        )


@dataclass
class Batch:
    """B stays padded to the longest among them (T steps), D variables, S static features.

    values  [B, T, D] normalised values, 0 where not observed
    mask    [B, T, D] 1.0 where observed
    times   [B, T]    hours since admission
    lengths [B]       real steps per stay
    static  [B, S]    normalised static features, 0 where unknown
    labels  [B]       0/1 outcome
    queries the stays' prediction times (``Queries``), or None: one risk per stay, at its end
    """

    values: torch.Tensor
    mask: torch.Tensor
    times: torch.Tensor
    lengths: torch.Tensor
    static: torch.Tensor
    labels: torch.Tensor
    queries: Queries | None = None

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(
            **{
                f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                for f in fields(self)
            }
        )

    @property
    def targets(self) -> torch.Tensor:
        """What the risks are compared with: the outcome at each prediction time, or each stay's."""
        return self.labels if self.queries is None else self.queries.labels

    @property
    def target_weights(self) -> torch.Tensor | None:
        """What each of ``targets`` weighs in the loss; None: all alike."""
        return None if self.queries is None else self.queries.weights

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def cells(self) -> int:
        """Stays times padded steps: a batch's time grows with it (``garlic.data.threads`` compares by it)."""
        return int(self.values.shape[0] * self.values.shape[1])


def batch_work(batch) -> float:
    """A training or inference batch's size for timing it: a ``Batch``'s cells; 1 for another kind of batch."""
    return float(batch.cells) if isinstance(batch, Batch) else 1.0


class IrregularDataset(Dataset):
    """The stays of one split, normalised with statistics from the training split, and the times at which a risk
    is asked for (``prediction_times``: one per stay, or the dataset's task rows).

    The normalised model inputs are made on first use: a method that reads the raw ``tensors`` (the summary and
    hourly baselines) never pays for them, which on a long-stay cohort is gigabytes.

    ``targets`` are what a network learns at each prediction time: its label, or what ``with_utility_targets``
    makes of it, with ``target_weights`` (None: all alike).
    """

    def __init__(self, tensors: IrregularTensors, normalisation: Normalisation):
        self.tensors, self.normalisation = tensors, normalisation
        self.stay_ids = tensors.stay_ids
        self.times = torch.from_numpy(tensors.times)
        self.lengths = torch.from_numpy(tensors.lengths)
        self.labels = torch.from_numpy(tensors.labels)
        self.prediction_times = tensors.prediction_times()
        self.targets = torch.from_numpy(self.prediction_times.label.astype("float32"))
        self.target_weights: torch.Tensor | None = None
        if tensors.task is not None:  # each stay's prediction times: rows first..last of ``prediction_times``
            self.query_bounds = np.searchsorted(self.prediction_times.stay, np.arange(len(tensors) + 1))
            self.query_steps = torch.from_numpy(steps_seen(tensors, self.prediction_times))
            self.query_times = torch.from_numpy(self.prediction_times.time.astype("float32"))

    @cached_property
    def values(self) -> torch.Tensor:
        tensors = self.tensors
        return torch.from_numpy(np.where(tensors.mask, self.normalisation.standardise(tensors.values), 0.0))

    @cached_property
    def mask(self) -> torch.Tensor:
        return torch.from_numpy(self.tensors.mask.astype("float32"))

    @cached_property
    def static(self) -> torch.Tensor:
        return torch.from_numpy(self.normalisation.standardise_static(self.tensors.static))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = {
            "values": self.values[index],
            "mask": self.mask[index],
            "times": self.times[index],
            "lengths": self.lengths[index],
            "static": self.static[index],
            "labels": self.labels[index],
        }
        if self.tensors.task is not None:
            rows = slice(int(self.query_bounds[index]), int(self.query_bounds[index + 1]))
            item |= {
                "query_steps": self.query_steps[rows],
                "query_index": torch.arange(rows.start, rows.stop),
                "query_labels": self.targets[rows],
                "query_time": self.query_times[rows],
            }
            if self.target_weights is not None:
                item["query_weights"] = self.target_weights[rows]
        return item

    def with_utility_targets(self) -> "IrregularDataset":
        """This dataset (sharing its tensors) with the targets of a task scored by the Sepsis Challenge's utility
        recast as what the utility rewards (``garlic.metrics.utility.utility_targets``): 1 where an alarm gains, each
        prediction time weighted by the size of its gain, so that a weighted loss is least where the alarms are
        those of highest expected utility (cost-sensitive learning). The prediction times must be every hour of each
        stay, in order, as the utility counts them."""
        # Here, not at the top: garlic.metrics imports scikit-learn, which a one-stay `garlic predict` never needs.
        from garlic.metrics.utility import SEPSIS_UTILITY, stay_lengths, utility_targets

        times = self.prediction_times
        if times.score != SEPSIS_UTILITY:
            raise ValueError(
                f"utility targets need a task scored by {SEPSIS_UTILITY}; this one is scored by "
                f"{times.score or 'its labels alone'}"
            )
        gains, weights = utility_targets(times.label, stay_lengths(times.stay))
        recast = copy.copy(self)
        recast.targets = torch.from_numpy(gains.astype("float32"))
        recast.target_weights = torch.from_numpy(weights.astype("float32"))
        return recast


def steps_seen(tensors: IrregularTensors, times: PredictionTimes) -> np.ndarray:
    """[M] for each prediction time, how many of its stay's steps are at or before it (vectorised: one search over
    every stay's steps, keyed by stay then time)."""
    real = np.arange(tensors.times.shape[1])[None, :] < tensors.lengths[:, None]
    stay_of_step = np.repeat(np.arange(len(tensors)), real.sum(axis=1))
    span = float(max(tensors.times.max(initial=0.0), times.time.max(initial=0.0))) + 2.0
    step_keys = stay_of_step * span + tensors.times[real].astype("float64")
    query_keys = times.stay * span + np.clip(times.time.astype("float64"), -1.0, None)
    first_step = np.concatenate([[0], np.cumsum(real.sum(axis=1))[:-1]])
    return (np.searchsorted(step_keys, query_keys, side="right") - first_step[times.stay]).astype("int64")


def collate(items: list[dict[str, torch.Tensor]]) -> Batch:
    """Stack single stays into a batch cut to the longest stay, so short batches cost less."""
    steps = max(max(int(item["lengths"]) for item in items), 1)
    queries = None
    if "query_steps" in items[0]:
        counts = torch.tensor([len(item["query_steps"]) for item in items])
        queries = Queries(
            stay=torch.repeat_interleave(torch.arange(len(items)), counts),
            steps=torch.cat([item["query_steps"] for item in items]),
            index=torch.cat([item["query_index"] for item in items]),
            labels=torch.cat([item["query_labels"] for item in items]),
            time=torch.cat([item["query_time"] for item in items]),
            weights=(torch.cat([item["query_weights"] for item in items]) if "query_weights" in items[0] else None),
        )
    return Batch(
        values=torch.stack([item["values"][:steps] for item in items]),
        mask=torch.stack([item["mask"][:steps] for item in items]),
        times=torch.stack([item["times"][:steps] for item in items]),
        lengths=torch.stack([item["lengths"] for item in items]),
        static=torch.stack([item["static"] for item in items]),
        labels=torch.stack([item["labels"] for item in items]),
        queries=queries,
    )


class LengthBucketSampler(Sampler[list[int]]):
    """Shuffled batches of stays of similar length, so that batches carry little padding.

    Each epoch: shuffle all stays, sort each pool of ``pool_batches`` batches' worth of stays by length, cut it into
    batches, and shuffle the batches. Every stay is seen once per epoch; the order is fixed by ``seed`` and epoch.
    """

    def __init__(self, lengths: torch.Tensor, batch_size: int, seed: int = 0, pool_batches: int = 50):
        self.lengths, self.batch_size, self.seed, self.pool_batches = lengths, batch_size, seed, pool_batches
        self.epoch = 0

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        self.epoch += 1
        order = torch.randperm(len(self.lengths), generator=generator)
        pool = self.batch_size * self.pool_batches
        batches = []
        for start in range(0, len(order), pool):
            chunk = order[start : start + pool]
            chunk = chunk[torch.argsort(self.lengths[chunk], stable=True)]
            batches.extend(chunk[i : i + self.batch_size].tolist() for i in range(0, len(chunk), self.batch_size))
        for index in torch.randperm(len(batches), generator=generator).tolist():
            yield batches[index]


def loader(dataset: IrregularDataset, batch_size: int, shuffle: bool = False, seed: int = 0) -> DataLoader:
    """Batches in order, or (``shuffle``) length-bucketed random batches for training."""
    if shuffle:
        sampler = LengthBucketSampler(dataset.lengths, batch_size, seed)
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
