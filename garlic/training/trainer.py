"""The one fit loop, ``Trainer``: epochs of the current stage, each checked on the validation split, the best
epoch's weights kept, the stage switched and the fit stopped as the schedule decides. A schedule is a set of hooks
on it: GARLIC's alternating decoupled optimisation (``garlic.training.alternating``), the reference code's loop
(``garlic.training.reference_schedule``), the recurrent baselines' plain one
(``garlic.methods.recurrent.RecurrentTrainer``) and PyPOTS's (``garlic.methods.field.FieldTrainer``). After every
epoch, and within an epoch every ``Trainer.checkpoint_seconds`` (``EpochPass``), the fit can hand out its whole state
(weights, optimisers, schedules, sampler epoch, random state, bookkeeping and how far the epoch has come); a fit
continued from that state ends exactly as an uninterrupted one. Under ``torchrun`` the same code trains
data-parallel (``garlic.training.distributed``). The loop knows no model: a schedule builds its own.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, ClassVar, Iterable, Iterator

import torch
from torch.utils.data import DataLoader

from garlic.data.batches import IrregularDataset, batch_work
from garlic.metrics import binary_metrics
from garlic.training import distributed
from garlic.training.state import RANK_TALLIES, WITHIN_EPOCH
from garlic.data.threads import on_chosen_threads

# lr_schedule=cosine: the share of the epoch budget over which the learning rates rise linearly from 0.
WARMUP = 0.05


def remember_base_rates(optimisers: dict[str, torch.optim.Optimizer]) -> None:
    """Keep each parameter group's configured rate as ``base_lr`` (saved with the optimiser's state), the rate
    ``lr_schedule=cosine`` scales."""
    for optimiser in optimisers.values():
        for group in optimiser.param_groups:
            group["base_lr"] = group["lr"]


def cosine_factor(progress: float) -> float:
    """The learning rate's multiple at ``progress`` (0 .. 1) through the epoch budget under ``lr_schedule=cosine``."""
    if progress < WARMUP:
        return progress / WARMUP
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - WARMUP) / (1 - WARMUP))))


@dataclass
class EpochRecord:
    epoch: int
    stage: str
    train_loss: float
    train_bce: float
    train_reconstruction: float
    val_loss: float
    val_bce: float
    val_reconstruction: float
    val_auroc: float
    val_auprc: float
    seconds: float

    def metrics(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if k not in ("epoch", "stage")}


@dataclass
class Progress:
    """Where a fit stands after an epoch; with the weights, optimisers and random state, all it needs to go on."""

    epoch: int = 0
    stage: str = ""  # set to the schedule's first stage when a fit starts
    best_score: float = -math.inf
    best_epoch: int = 0
    improved_score: float = -math.inf  # the score when the early-stopping count last restarted
    stale: int = 0
    stage_best: float = math.inf
    stage_stale: int = 0
    stopped: bool = False
    history: list[EpochRecord] = field(default_factory=list)


@dataclass
class FitResult:
    model: torch.nn.Module
    history: list[EpochRecord]
    best_epoch: int


class EpochPass:
    """One epoch's pass over the training batches, as the fit loop hands it to ``run_epoch``: iterated, it gives
    ``(index, batch)`` in the epoch's order, and ``tally`` keeps the sums a schedule accumulates over the pass.

    Between two batches, once ``checkpoint_seconds`` have passed since the pass began or since its last checkpoint,
    it calls ``checkpoint`` with how far it has come (``underway``: the batches done, the tally, the seconds spent). A
    pass continued from there (``resume``) skips the batches done without loading them or drawing random numbers,
    and starts from that tally: with the fit's weights, optimisers and random state restored, it goes on as the
    uninterrupted pass did.

    Each batch runs on the CPU threads the process's chooser picks for it (``garlic.data.threads``), and the
    pass being iterated is ``EpochPass.running``, where a progress display reads how far the fit's ``epoch`` has come
    (``done`` of ``len``)."""

    running: ClassVar["EpochPass | None"] = None

    def __init__(
        self,
        batches: Iterable,
        resume: dict | None = None,
        checkpoint: Callable[[dict], None] | None = None,
        checkpoint_seconds: float = math.inf,
        epoch: int = 1,
    ):
        self.batches, self.checkpoint, self.checkpoint_seconds = batches, checkpoint, checkpoint_seconds
        self.epoch = epoch  # the fit's epoch this pass is (from 1), for the progress display
        self.done = resume["batches_done"] if resume else 0
        self.sums = copy.deepcopy(resume["tally"]) if resume else {}  # the state it resumes from stays as written
        self.seconds_before = resume["seconds"] if resume else 0.0
        self.started = time.perf_counter()

    @classmethod
    def of(cls, batches: Iterable) -> "EpochPass":
        """``batches`` (a pass, or any sized iterable of batches) as a pass without checkpoints."""
        return batches if isinstance(batches, EpochPass) else cls(batches)

    def __len__(self) -> int:
        return len(self.batches)

    def tally(self, **start) -> dict:
        """The pass's sums, to update in place after every batch: ``start`` on a fresh pass, where they stood on a
        resumed one. Call it before iterating."""
        if not self.sums:
            self.sums = dict(start)
        return self.sums

    def underway(self) -> dict:
        """How far the pass has come (a copy: the tally's lists go on growing)."""
        return {
            "batches_done": self.done,
            "tally": {key: copy.copy(value) for key, value in self.sums.items()},
            "seconds": self.seconds_before + time.perf_counter() - self.started,
        }

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        batches = _batches_after(self.batches, self.done) if self.done else self.batches
        last = time.monotonic()
        EpochPass.running = self
        try:
            for index, batch in enumerate(on_chosen_threads(batches, batch_work), start=self.done):
                yield index, batch
                self.done = index + 1
                # Under torchrun every rank takes part in a state: they checkpoint together once any rank's time is up.
                if self.checkpoint is not None and distributed.any_rank(
                    time.monotonic() - last >= self.checkpoint_seconds
                ):
                    self.checkpoint(self.underway())
                    last = time.monotonic()
        finally:
            EpochPass.running = None


def _batches_after(batches: DataLoader, done: int) -> DataLoader:
    """The batches of ``batches``' next pass after its first ``done``, loaded as it loads them. The sampler is walked
    to its end, as the whole pass walks it; the seed every DataLoader pass draws comes from a generator of its own, so
    the global random state stays as the checkpoint left it (the interrupted pass drew it when it began)."""
    remaining = list(batches.batch_sampler)[done:]
    return DataLoader(
        batches.dataset, batch_sampler=remaining, collate_fn=batches.collate_fn, generator=torch.Generator()
    )


class Trainer:
    """The one fit loop: epochs of the current stage, each checked on the validation split, the best epoch's weights
    kept, the stage switched and the fit stopped as the schedule decides, and the whole state handed out after every
    epoch (``on_state``) so that a fit continued from it (``resume``) ends as an uninterrupted one. Within an epoch
    too, every ``checkpoint_seconds`` between two batches (under ``torchrun``, all ranks together, each rank's tally
    kept): a long epoch killed half-way loses at most that much training.

    A schedule is a subclass that builds ``model``, ``optimisers`` and ``schedulers``, names its ``stages`` (a fit
    starts in the first; a switch moves to the next, after the last back to the first) and fills in the hooks:

        before_fit(train)                                     what it takes from the training split first
        batches(train) -> DataLoader                          the training batches (length-bucketed, shuffled)
        run_epoch(batches, progress) -> dict[str, float]      one pass (an ``EpochPass``) in ``progress.stage``:
                                                              mean losses ``loss``, ``bce`` and ``mse``, summed
                                                              in the pass's ``tally``
        validate(validation) -> {"probabilities", "losses"}   risks and mean losses (``bce``, ``mse``, ...)
        after_validation(progress, trained, losses)           step the learning-rate schedules
        validation_loss(progress, losses) -> float            the epoch record's ``val_loss``
        score(losses, scores) -> float                        higher is better: picks the best epoch
        decide(progress, score, losses) -> (switch, stop)     after the best epoch is updated

    ``scores`` are the validation AUROC and AUPRC.
    """

    config: Any  # the schedule's settings: the loop reads ``max_epochs`` and ``lr_schedule``
    stages: tuple[str, ...]
    device: torch.device
    model: torch.nn.Module
    optimisers: dict[str, torch.optim.Optimizer]
    schedulers: dict[str, torch.optim.lr_scheduler.ReduceLROnPlateau]
    # How often a fit with ``on_state`` also hands out its state within an epoch. A setting of the process, not of the
    # run: checkpoints change no result (the state is read, never changed), so it is no config key and in no digest.
    checkpoint_seconds: float = 600.0

    def before_fit(self, train: IrregularDataset) -> None:
        """Anything the schedule takes from the training split before the first epoch."""

    def after_validation(self, progress: Progress, trained: dict[str, float], losses: dict[str, float]) -> None:
        """Step the learning-rate schedules, if any."""

    def fit(
        self,
        train: IrregularDataset,
        validation: IrregularDataset,
        on_epoch: Callable[[EpochRecord], None] | None = None,
        on_state: Callable[[dict], None] | None = None,
        resume: dict | None = None,
    ) -> FitResult:
        """Fit, selecting on ``validation``; ``on_state`` gets the state after each epoch and every
        ``checkpoint_seconds`` within one, ``resume`` continues from such a state."""
        config = self.config
        self.before_fit(train)
        batches = self.batches(train)
        sampler = batches.batch_sampler
        progress, best_state, underway = Progress(stage=self.stages[0]), copy.deepcopy(self.model.state_dict()), None
        if resume is not None:
            progress, best_state = self.restore(resume, sampler)
            underway = _this_ranks_pass(resume.get(WITHIN_EPOCH))
        checkpoints = on_state is not None
        while not progress.stopped and progress.epoch < config.max_epochs:
            progress.epoch += 1
            start = time.perf_counter()
            # Within the epoch, the fit stands where it stood when the epoch began, and the sampler draws this epoch.
            began, sampler_epoch = replace(progress, epoch=progress.epoch - 1), sampler.epoch
            checkpoint = (
                (lambda underway: on_state(self.state(began, best_state, sampler_epoch, underway)))
                if checkpoints
                else None
            )
            epoch_pass = EpochPass(batches, underway, checkpoint, self.checkpoint_seconds, progress.epoch)
            underway = None
            trained = self.run_epoch(epoch_pass, progress)
            checked = self.validate(validation)
            weights = None if validation.target_weights is None else validation.target_weights.numpy()
            scores = binary_metrics(validation.targets.numpy(), checked["probabilities"], weights)
            losses = checked["losses"]
            self.after_validation(progress, trained, losses)
            record = EpochRecord(
                epoch=progress.epoch,
                stage=progress.stage,
                train_loss=trained["loss"],
                train_bce=trained["bce"],
                train_reconstruction=trained["mse"],
                val_loss=self.validation_loss(progress, losses),
                val_bce=losses["bce"],
                val_reconstruction=losses["mse"],
                val_auroc=scores["auroc"],
                val_auprc=scores["auprc"],
                seconds=epoch_pass.seconds_before + time.perf_counter() - start,
            )
            progress.history.append(record)
            score = self.score(losses, scores)
            if score > progress.best_score:
                progress.best_score, progress.best_epoch = score, progress.epoch
                best_state = copy.deepcopy(self.model.state_dict())
            switch, progress.stopped = self.decide(progress, score, losses)
            if on_epoch is not None:
                on_epoch(record)
            if switch:
                progress.stage = self.stages[(self.stages.index(progress.stage) + 1) % len(self.stages)]
                self.model.load_state_dict(best_state)
            if on_state is not None:
                on_state(self.state(progress, best_state, sampler.epoch))
        self.model.load_state_dict(best_state)
        return FitResult(self.model, progress.history, progress.best_epoch)

    def set_rates(self, epochs: float) -> None:
        """Under ``lr_schedule=cosine``, every parameter group's rate after ``epochs`` (fractional) of the budget."""
        if getattr(self.config, "lr_schedule", None) == "cosine":
            factor = cosine_factor(epochs / self.config.max_epochs)
            for optimiser in self.optimisers.values():
                for group in optimiser.param_groups:
                    group["lr"] = group["base_lr"] * factor

    def state(self, progress: Progress, best_state: dict, sampler_epoch: int, epoch_pass: dict | None = None) -> dict:
        """Everything a fit needs to go on from here (every rank must call it: it gathers their random states):
        after the epochs of ``progress``, with the sampler's next pass ``sampler_epoch``, and within the next epoch
        where ``epoch_pass`` (``EpochPass.underway``) says how far it has come."""
        cuda = self.device.type == "cuda"
        if epoch_pass is not None and distributed.current().size > 1:
            epoch_pass = _with_every_ranks_tally(epoch_pass)
        return {
            "progress": asdict(progress),
            "model": self.model.state_dict(),
            "best_model": best_state,
            "optimisers": {name: opt.state_dict() for name, opt in self.optimisers.items()},
            "schedulers": {name: s.state_dict() for name, s in self.schedulers.items()},
            "sampler_epoch": sampler_epoch,
            "rng": distributed.all_gather(torch.get_rng_state()),
            "cuda_rng": distributed.all_gather(torch.cuda.get_rng_state()) if cuda else [],
        } | ({} if epoch_pass is None else {WITHIN_EPOCH: epoch_pass})

    def restore(self, state: dict, sampler) -> tuple[Progress, dict]:
        """Put the trainer back where ``state`` was taken; returns the fit's progress and best weights."""
        self.model.load_state_dict(state["model"])
        for name, optimiser in self.optimisers.items():
            optimiser.load_state_dict(state["optimisers"][name])
        for name, scheduler in self.schedulers.items():
            scheduler.load_state_dict(state["schedulers"][name])
        sampler.epoch = state["sampler_epoch"]
        # With another number of processes than wrote the state, training goes on, but not bit for bit.
        rank = distributed.current().rank
        torch.set_rng_state(state["rng"][rank % len(state["rng"])])
        if state["cuda_rng"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"][rank % len(state["cuda_rng"])])
        progress = dict(state["progress"])
        progress["history"] = [EpochRecord(**record) for record in progress["history"]]
        return Progress(**progress), state["best_model"]


def _with_every_ranks_tally(epoch_pass: dict) -> dict:
    """A pass under several processes, as a state keeps it: ``tallies``, each rank's own tally in rank order, beside
    ``tally``, rank 0's. Only numbers are gathered (GARLIC's schedule, the one that shares batches under ``torchrun``,
    tallies loss sums and a count)."""
    names, tally = list(epoch_pass["tally"]), epoch_pass["tally"]
    kinds = [type(tally[name]) for name in names]
    values = torch.tensor([float(tally[name]) for name in names], dtype=torch.float64)
    tallies = [
        {name: kind(value) for name, kind, value in zip(names, kinds, gathered.tolist())}
        for gathered in distributed.all_gather(values)
    ]
    return {**epoch_pass, "tally": tallies[0], RANK_TALLIES: tallies}


def _this_ranks_pass(epoch_pass: dict | None) -> dict | None:
    """This process's share of a saved pass: its own tally where the state was written by as many processes; with
    another number (training goes on, not bit for bit), rank 0 goes on from rank 0's and the others from none: the
    epoch's mean losses are then means over the stays tallied."""
    if epoch_pass is None:
        return None
    world, tallies = distributed.current(), epoch_pass.get(RANK_TALLIES)
    if tallies is not None and len(tallies) == world.size:
        return {**epoch_pass, "tally": tallies[world.rank]}
    return epoch_pass if world.is_main else {**epoch_pass, "tally": {}}
