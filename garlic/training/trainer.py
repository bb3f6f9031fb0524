"""Alternating decoupled optimisation of GARLIC, with model selection on the validation split only.

Two stages take turns:
- reconstruction: reconstruction loss + lambda_cls * BCE + lambda_graph * |A|_1, all parameters;
- prediction: BCE, the prediction parameters only (signal attention, GRU, temporal attention, classifier).
Each parameter group has its own optimiser (learning rate, weight decay) and learning-rate schedule: with
``lr_schedule=plateau`` the group's rate halves after ``lr_patience`` epochs without progress on its objective,
counting only the epochs that train the group; with ``lr_schedule=cosine`` every group's rate follows one curve over
the ``max_epochs`` budget, set before every batch: a linear warm-up over the first ``WARMUP`` of the budget, then a
half cosine down to 0. The stage switches when its validation objective has not dropped by ``stage_tolerance``
(relative) for ``stage_patience`` epochs, restarting from the best epoch's weights (the tolerance matters: on P12
the reconstruction error kept creeping down by 0.1-0.5% an epoch for 40 epochs, and any drop at all held training in
the first stage). Training stops when validation AUROC has not risen by ``early_stopping_tolerance`` for
``early_stopping`` epochs; the kept weights are still those of the best AUROC of all epochs. With
``alternating=False`` the reconstruction-stage objective trains everything jointly (the ablation).

With ``balance_classes`` the training BCE weights each stay by n / (2 n_class) of its outcome, and the model adds the
training log-odds to its logits, so that its risks keep the real prevalence; validation uses the plain BCE.

One fit loop, ``Trainer``, runs every schedule through its hooks: the compact schedule above
(``AlternatingTrainer``), the reference code's (``ReferenceTrainer``) and the recurrent baselines' plain one
(``garlic.methods.recurrent.RecurrentTrainer``). After every epoch the fit can hand out its whole state (weights, optimisers, schedules, sampler epoch, random
state and bookkeeping); a fit continued from that state ends exactly as an uninterrupted one. Under ``torchrun``
the same code trains data-parallel (see ``garlic.training.distributed``).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from garlic.config import Config, ConfigError
from garlic.data.batches import IrregularDataset, loader
from garlic.metrics import binary_metrics
from garlic.models.architectures import build_model
from garlic.models.compact import Garlic, graph_penalty
from garlic.models.predict import INFERENCE_BATCH, in_length_order
from garlic.training import distributed
from garlic.training.device import resolve_device
from garlic.training.losses import PREDICTION, RECONSTRUCTION, class_weights, forward, stage_losses
from garlic.training.threads import adapt_threads

GRADIENT_CLIP = 5.0
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
    stage: str = RECONSTRUCTION
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
    model: Garlic
    history: list[EpochRecord]
    best_epoch: int


@torch.no_grad()
def evaluate(model: Garlic, dataset: IrregularDataset, config: Config, batch_size: int = INFERENCE_BATCH) -> dict:
    """Risk per stay (in dataset order) and the mean loss parts and stage objectives over ``dataset``."""
    model.eval()
    probabilities = torch.empty(len(dataset))
    totals = {"bce": 0.0, "mse": 0.0}
    for positions, batch in in_length_order(model, dataset, batch_size):
        output = forward(model, batch)
        probabilities[positions] = torch.sigmoid(output.logits).cpu()
        totals["bce"] += float(F.binary_cross_entropy_with_logits(output.logits, batch.labels, reduction="sum"))
        totals["mse"] += float(model.reconstruction_loss(output, batch.values, batch.mask)) * len(batch)
    losses = {k: v / max(len(dataset), 1) for k, v in totals.items()}
    penalty = float(graph_penalty(model))
    losses[RECONSTRUCTION] = losses["mse"] + config.lambda_cls * losses["bce"] + config.lambda_graph * penalty
    losses[PREDICTION] = losses["bce"]
    return {"probabilities": probabilities.numpy(), "losses": losses}


class Trainer:
    """The one fit loop: epochs of the current stage, each checked on the validation split, the best epoch's weights
    kept, the stage switched and the fit stopped as the schedule decides, and the whole state handed out after every
    epoch (``on_state``) so that a fit continued from it (``resume``) ends as an uninterrupted one.

    A schedule is a subclass that builds ``model``, ``optimisers`` and ``schedulers`` and fills in the hooks:

        before_fit(train)                                     what it takes from the training split first
        batches(train) -> DataLoader                          the training batches (length-bucketed, shuffled)
        run_epoch(batches, progress) -> dict[str, float]      one pass in ``progress.stage``: mean losses
                                                              ``loss``, ``bce`` and ``mse``
        validate(validation) -> {"probabilities", "losses"}   risks and mean losses (default: ``evaluate``)
        after_validation(progress, trained, losses)           step the learning-rate schedules
        validation_loss(progress, losses) -> float            the epoch record's ``val_loss``
        score(losses, scores) -> float                        higher is better: picks the best epoch
        decide(progress, score, losses) -> (switch, stop)     after the best epoch is updated

    ``scores`` are the validation AUROC and AUPRC. GARLIC's schedules are ``AlternatingTrainer`` (compact) and
    ``ReferenceTrainer``; the recurrent baselines' plain loop is ``garlic.methods.recurrent.RecurrentTrainer``.
    """

    config: Config  # the recurrent baselines': ``RecurrentSettings`` (the loop reads ``max_epochs``)
    device: torch.device
    model: torch.nn.Module
    optimisers: dict[str, torch.optim.Optimizer]
    schedulers: dict[str, torch.optim.lr_scheduler.ReduceLROnPlateau]

    def before_fit(self, train: IrregularDataset) -> None:
        """Anything the schedule takes from the training split before the first epoch."""

    def validate(self, validation: IrregularDataset) -> dict:
        return evaluate(self.model, validation, self.config)

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
        """Fit, selecting on ``validation``; ``on_state`` gets the state after each epoch, ``resume`` continues
        from such a state."""
        config = self.config
        self.before_fit(train)
        batches = self.batches(train)
        progress, best_state = Progress(), copy.deepcopy(self.model.state_dict())
        if resume is not None:
            progress, best_state = self.restore(resume, batches.batch_sampler)
        while not progress.stopped and progress.epoch < config.max_epochs:
            progress.epoch += 1
            adapt_threads()  # from the CPUs other processes used since the last epoch (or the command's start)
            start = time.perf_counter()
            trained = self.run_epoch(batches, progress)
            checked = self.validate(validation)
            scores = binary_metrics(validation.labels.numpy(), checked["probabilities"])
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
                seconds=time.perf_counter() - start,
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
                progress.stage = PREDICTION if progress.stage == RECONSTRUCTION else RECONSTRUCTION
                self.model.load_state_dict(best_state)
            if on_state is not None:
                on_state(self.state(progress, best_state, batches.batch_sampler))
        self.model.load_state_dict(best_state)
        return FitResult(self.model, progress.history, progress.best_epoch)

    def set_rates(self, epochs: float) -> None:
        """Under ``lr_schedule=cosine``, every parameter group's rate after ``epochs`` (fractional) of the budget."""
        if self.config.lr_schedule == "cosine":
            factor = cosine_factor(epochs / self.config.max_epochs)
            for optimiser in self.optimisers.values():
                for group in optimiser.param_groups:
                    group["lr"] = group["base_lr"] * factor

    def state(self, progress: Progress, best_state: dict, sampler) -> dict:
        """Everything a fit needs to go on from here (every rank must call it: it gathers their random states)."""
        cuda = self.device.type == "cuda"
        return {
            "progress": asdict(progress),
            "model": self.model.state_dict(),
            "best_model": best_state,
            "optimisers": {name: opt.state_dict() for name, opt in self.optimisers.items()},
            "schedulers": {name: s.state_dict() for name, s in self.schedulers.items()},
            "sampler_epoch": sampler.epoch,
            "rng": distributed.all_gather(torch.get_rng_state()),
            "cuda_rng": distributed.all_gather(torch.cuda.get_rng_state()) if cuda else [],
        }

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


class AlternatingTrainer(Trainer):
    """GARLIC's own schedule (``schedule=compact``): a fresh GARLIC fitted to a training split, the best epoch chosen
    by validation AUROC."""

    def __init__(self, config: Config, num_variables: int, num_static: int):
        if config.schedule != "compact":
            raise ConfigError(f"AlternatingTrainer runs schedule=compact, not {config.schedule!r}: use make_trainer")
        self.config = config
        self.device = resolve_device(config.device)
        torch.manual_seed(config.seed)
        self.model = build_model(num_variables, num_static, config).to(self.device)
        self.optimisers = {
            RECONSTRUCTION: torch.optim.Adam(
                self.model.reconstruction_parameters(), lr=config.lr_rec, weight_decay=config.wd_rec
            ),
            PREDICTION: torch.optim.Adam(
                self.model.prediction_parameters(), lr=config.lr_cls, weight_decay=config.wd_cls
            ),
        }
        remember_base_rates(self.optimisers)
        self.schedulers = {
            name: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=config.lr_patience)
            for name, opt in self.optimisers.items()
        } if config.lr_schedule == "plateau" else {}  # fmt: skip
        self.class_weights: tuple[float, float] | None = None  # set by ``fit`` when ``balance_classes``
        self.network = distributed.wrap(self.model)
        world = distributed.current()
        if world.size > 1:  # the ranks start from the same weights, but each draws its own dropout masks
            torch.manual_seed(config.seed + world.rank)

    @staticmethod
    def trained_groups(stage: str) -> list[str]:
        """The parameter groups that ``stage`` trains: both in reconstruction, the prediction group alone else."""
        return [RECONSTRUCTION, PREDICTION] if stage == RECONSTRUCTION else [PREDICTION]

    def _set_stage(self, stage: str) -> None:
        for parameter in self.model.reconstruction_parameters():
            parameter.requires_grad_(stage == RECONSTRUCTION)

    def train_epoch(self, batches, stage: str, epoch: int = 0) -> dict[str, float]:
        """One pass over the training batches in ``stage`` (``epoch`` of the budget, from 0: where the cosine schedule
        stands); returns mean losses."""
        self.model.train()
        self._set_stage(stage)
        stepped = [self.optimisers[name] for name in self.trained_groups(stage)]
        sums, count = {"loss": 0.0, "bce": 0.0, "mse": 0.0}, 0
        for index, batch in enumerate(batches):
            self.set_rates(epoch + index / len(batches))
            batch = batch.to(self.device)
            losses = stage_losses(self.model, batch, self.config, self.network, self.class_weights)
            for optimiser in self.optimisers.values():
                optimiser.zero_grad(set_to_none=True)
            (losses[stage] * distributed.batch_weight(len(batch))).backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRADIENT_CLIP)
            for optimiser in stepped:
                optimiser.step()
            for name, key in (("loss", stage), ("bce", "bce"), ("mse", "mse")):
                sums[name] += losses[key].item() * len(batch)
            count += len(batch)
        self._set_stage(RECONSTRUCTION)
        totals = distributed.all_sum(torch.tensor([*sums.values(), count], dtype=torch.float64)).tolist()
        return {name: total / max(totals[-1], 1) for name, total in zip(sums, totals)}

    def before_fit(self, train: IrregularDataset) -> None:
        self.model.prepare(train.times, train.lengths)
        if self.config.balance_classes:
            self.class_weights = class_weights(train.labels)
            negative, positive = self.class_weights
            self.model.logit_offset.fill_(math.log(negative / positive))  # the training odds, n_pos / n_neg

    def batches(self, train: IrregularDataset):
        return distributed.shard(loader(train, self.config.batch_size, shuffle=True, seed=self.config.seed))

    def run_epoch(self, batches, progress: Progress) -> dict[str, float]:
        return self.train_epoch(batches, progress.stage, progress.epoch - 1)

    def after_validation(self, progress: Progress, trained: dict[str, float], losses: dict[str, float]) -> None:
        # A group frozen this epoch cannot improve its objective: its schedule waits, or every prediction stage
        # would halve the reconstruction learning rate for nothing.
        for name in self.trained_groups(progress.stage):
            if name in self.schedulers:
                self.schedulers[name].step(losses[name])

    def validation_loss(self, progress: Progress, losses: dict[str, float]) -> float:
        return losses[progress.stage]

    def score(self, losses: dict[str, float], scores: dict[str, float]) -> float:
        # AUROC picks the best epoch; it is NaN only with one class, when the loss has to decide.
        return scores["auroc"] if np.isfinite(scores["auroc"]) else -losses["bce"]

    def decide(self, progress: Progress, score: float, losses: dict[str, float]) -> tuple[bool, bool]:
        """Stop after ``early_stopping`` epochs without a gain of the tolerance (any gain picks the best epoch, but
        only a gain of the tolerance keeps training going: on P12 runs went on for 10 epochs after gains in the
        fourth decimal); else switch the stage after ``stage_patience`` epochs without a relative drop of
        ``stage_tolerance`` in its validation objective."""
        config = self.config
        if score > progress.improved_score + config.early_stopping_tolerance:
            progress.improved_score, progress.stale = score, 0
        else:
            progress.stale += 1
        if losses[progress.stage] < progress.stage_best * (1 - config.stage_tolerance):
            progress.stage_best, progress.stage_stale = losses[progress.stage], 0
        else:
            progress.stage_stale += 1
        if progress.stale >= config.early_stopping:
            return False, True
        if config.alternating and progress.stage_stale >= config.stage_patience:
            progress.stage_best, progress.stage_stale = np.inf, 0
            return True, False
        return False, False


# main.py's --warm_up: no early stop while its epoch index (counted from 0) is 40 or less.
REFERENCE_WARM_UP = 40


class ReferenceTrainer(Trainer):
    """The reference code's training loop (``main.py`` of SCAI-Lab/GARLIC), for ``schedule=reference``.

    - One Adam over two groups: the reconstruction parameters (lr_rec, wd_rec) and the prediction parameters
      (lr_cls, wd_cls); one ReduceLROnPlateau (factor 0.5, patience 3, threshold 1e-4 relative, min_lr 1e-5) on the
      training epoch's AUROC, for both groups, every epoch. No gradient clipping. (``lr_schedule=cosine``, not the
      reference's, replaces the plateau schedule by the compact trainer's cosine curve over ``max_epochs``.)
    - Reconstruction stage: reconstruction loss + lambda_cls * BCE + lambda_graph * |A|_1. The first trains every
      parameter; later ones only the reconstruction parameters. Prediction stage: lambda_cls * BCE, the
      prediction parameters only. A frozen parameter gets no gradient, so Adam leaves it (and its moments) alone.
    - After each epoch: the best epoch is that of the lowest validation BCE so far; when that best epoch is more than
      ``stage_patience`` epochs old the stage switches and the best epoch's weights are reloaded (weights only, not the
      optimiser). The best epoch is not reset at a switch, so without a new best the stage switches every epoch.
      Training stops when the best epoch is more than ``early_stopping`` epochs old, but not while the epoch index
      (from 0) is ``REFERENCE_WARM_UP`` or less; the fit ends on the best epoch's weights.
    Departures: the validation BCE is the mean over stays (the reference sums batch means times lambda_cls and
    divides by the stays: the same order of epochs but for the last batch's weight); training batches are shuffled
    by length buckets as in the compact schedule (the reference keeps one fixed order); ``alternating=false`` never
    switches. Runs in one process.
    """

    def __init__(self, config: Config, num_variables: int, num_static: int):
        if distributed.current().size > 1:
            raise ValueError("schedule=reference runs in a single process, not under torchrun")
        if config.balance_classes:
            raise ConfigError("schedule=reference has no balance_classes (the reference weights no class)")
        self.config = config
        self.device = resolve_device(config.device)
        torch.manual_seed(config.seed)
        self.model = build_model(num_variables, num_static, config).to(self.device)
        optimiser = torch.optim.Adam([
            {"params": self.model.reconstruction_parameters(), "lr": config.lr_rec, "weight_decay": config.wd_rec},
            {"params": self.model.prediction_parameters(), "lr": config.lr_cls, "weight_decay": config.wd_cls},
        ])  # fmt: skip
        self.optimisers = {"both": optimiser}  # named like the compact trainer's, so ``state`` and ``restore`` serve
        remember_base_rates(self.optimisers)
        self.schedulers = {"both": torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimiser, mode="max", factor=0.5, patience=3, threshold=1e-4, min_lr=1e-5)
        } if config.lr_schedule == "plateau" else {}  # fmt: skip
        self.class_weights = None
        self.network = self.model

    def train_epoch(self, batches, stage: str, first_stage: bool = True, epoch: int = 0) -> dict[str, float]:
        """One pass in ``stage`` (``epoch`` of the budget, from 0); mean losses and the AUROC of the risks the batches
        met on the way."""
        self.model.train()
        trains = {RECONSTRUCTION: stage == RECONSTRUCTION, PREDICTION: stage == PREDICTION or first_stage}
        for name, parameters in ((RECONSTRUCTION, self.model.reconstruction_parameters()),
                                 (PREDICTION, self.model.prediction_parameters())):  # fmt: skip
            for parameter in parameters:
                parameter.requires_grad_(trains[name])
        optimiser = self.optimisers["both"]
        sums, count, risks, labels = {"loss": 0.0, "bce": 0.0, "mse": 0.0}, 0, [], []
        for index, batch in enumerate(batches):
            self.set_rates(epoch + index / len(batches))
            batch = batch.to(self.device)
            losses = stage_losses(self.model, batch, self.config)
            objective = losses[RECONSTRUCTION] if stage == RECONSTRUCTION else self.config.lambda_cls * losses["bce"]
            optimiser.zero_grad(set_to_none=True)
            objective.backward()
            optimiser.step()
            for name, value in (("loss", objective), ("bce", losses["bce"]), ("mse", losses["mse"])):
                sums[name] += value.item() * len(batch)
            count += len(batch)
            risks.append(torch.sigmoid(losses["logits"]).cpu())
            labels.append(batch.labels.cpu())
        for parameter in self.model.parameters():
            parameter.requires_grad_(True)
        means = {name: total / max(count, 1) for name, total in sums.items()}
        means["auroc"] = binary_metrics(torch.cat(labels).numpy(), torch.cat(risks).numpy())["auroc"]
        return means

    def before_fit(self, train: IrregularDataset) -> None:
        self.model.prepare(train.times, train.lengths)

    def batches(self, train: IrregularDataset):
        return loader(train, self.config.batch_size, shuffle=True, seed=self.config.seed)

    def run_epoch(self, batches, progress: Progress) -> dict[str, float]:
        first_stage = all(record.stage == RECONSTRUCTION for record in progress.history)
        return self.train_epoch(batches, progress.stage, first_stage, progress.epoch - 1)

    def after_validation(self, progress: Progress, trained: dict[str, float], losses: dict[str, float]) -> None:
        if "both" in self.schedulers:
            self.schedulers["both"].step(trained["auroc"])

    def validation_loss(self, progress: Progress, losses: dict[str, float]) -> float:
        return losses["bce"]

    def score(self, losses: dict[str, float], scores: dict[str, float]) -> float:
        return -losses["bce"]

    def decide(self, progress: Progress, score: float, losses: dict[str, float]) -> tuple[bool, bool]:
        since_best = progress.epoch - progress.best_epoch
        switch = self.config.alternating and since_best > self.config.stage_patience
        return switch, progress.epoch - 1 > REFERENCE_WARM_UP and since_best > self.config.early_stopping


TRAINERS = {"compact": AlternatingTrainer, "reference": ReferenceTrainer}


def make_trainer(config: Config, num_variables: int, num_static: int) -> Trainer:
    """The trainer of ``config.schedule``."""
    if config.schedule not in TRAINERS:
        raise ConfigError(f"schedule must be one of {', '.join(TRAINERS)}, got {config.schedule!r}")
    return TRAINERS[config.schedule](config, num_variables, num_static)
