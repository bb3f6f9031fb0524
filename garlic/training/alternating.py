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

``AlternatingTrainer`` is this schedule as hooks of the one fit loop (``garlic.training.trainer.Trainer``);
``garlic.training.schedules.make_trainer`` picks it, or the reference code's, by the config's ``schedule``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from garlic.config import ConfigError
from garlic.data.batches import IrregularDataset, loader
from garlic.models.architectures import build_model
from garlic.models.network_config import NetworkConfig
from garlic.training import distributed
from garlic.training.device import resolve_device
from garlic.training.training_config import TrainingConfig
from garlic.training.losses import PREDICTION, RECONSTRUCTION, class_weights, evaluate, stage_losses
from garlic.training.trainer import EpochPass, Progress, Trainer, remember_base_rates

GRADIENT_CLIP = 5.0


class AlternatingTrainer(Trainer):
    """GARLIC's own schedule (``schedule=compact``): a fresh GARLIC fitted to a training split, the best epoch chosen
    by validation AUROC."""

    stages = (RECONSTRUCTION, PREDICTION)

    def __init__(self, network: NetworkConfig, config: TrainingConfig, num_variables: int, num_static: int):
        if config.schedule != "compact":
            raise ConfigError(f"AlternatingTrainer runs schedule=compact, not {config.schedule!r}: use make_trainer")
        self.config = config
        self.device = resolve_device(config.device)
        torch.manual_seed(config.seed)
        self.model = build_model(num_variables, num_static, network).to(self.device)
        self.optimisers = {
            RECONSTRUCTION: torch.optim.Adam(
                self.model.reconstruction_parameters(), lr=config.lr_rec, weight_decay=config.wd_rec
            ),
            PREDICTION: torch.optim.Adam(
                self.model.prediction_parameters(), lr=config.lr_cls, weight_decay=config.wd_cls
            ),
        }
        remember_base_rates(self.optimisers)
        self.schedulers = (
            {
                name: torch.optim.lr_scheduler.ReduceLROnPlateau(
                    opt, mode="min", factor=0.5, patience=config.lr_patience
                )
                for name, opt in self.optimisers.items()
            }
            if config.lr_schedule == "plateau"
            else {}
        )
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
        """One pass over the training batches (an ``EpochPass`` or any sized iterable of batches) in ``stage``
        (``epoch`` of the budget, from 0: where the cosine schedule stands); returns mean losses."""
        self.model.train()
        self._set_stage(stage)
        stepped = [self.optimisers[name] for name in self.trained_groups(stage)]
        batches = EpochPass.of(batches)
        sums = batches.tally(loss=0.0, bce=0.0, mse=0.0, count=0)
        for index, batch in batches:
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
            sums["count"] += len(batch)
        self._set_stage(RECONSTRUCTION)
        totals = distributed.all_sum(torch.tensor([*sums.values()], dtype=torch.float64)).tolist()
        return {name: total / max(totals[-1], 1) for name, total in zip(("loss", "bce", "mse"), totals)}

    def before_fit(self, train: IrregularDataset) -> None:
        self.model.prepare(train.times, train.lengths)
        if self.config.balance_classes:
            self.class_weights = class_weights(train.targets)
            negative, positive = self.class_weights
            self.model.logit_offset.fill_(math.log(negative / positive))  # the training odds, n_pos / n_neg

    def validate(self, validation: IrregularDataset) -> dict:
        return evaluate(self.model, validation, self.config)

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
