"""The reference code's training loop (``main.py`` of SCAI-Lab/GARLIC) as hooks of the one fit loop
(``garlic.training.trainer.Trainer``), for ``schedule=reference``."""

from __future__ import annotations

import torch

from garlic.config import ConfigError
from garlic.data.batches import IrregularDataset, loader
from garlic.metrics import binary_metrics
from garlic.models.architectures import build_model
from garlic.models.network_config import NetworkConfig
from garlic.training import distributed
from garlic.training.device import resolve_device
from garlic.training.training_config import TrainingConfig
from garlic.training.losses import PREDICTION, RECONSTRUCTION, evaluate, stage_losses
from garlic.training.trainer import EpochPass, Progress, Trainer, remember_base_rates

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

    stages = (RECONSTRUCTION, PREDICTION)

    def __init__(self, network: NetworkConfig, config: TrainingConfig, num_variables: int, num_static: int):
        if distributed.current().size > 1:
            raise ValueError("schedule=reference runs in a single process, not under torchrun")
        if config.balance_classes:
            raise ConfigError("schedule=reference has no balance_classes (the reference weights no class)")
        self.config = config
        self.device = resolve_device(config.device)
        torch.manual_seed(config.seed)
        self.model = build_model(num_variables, num_static, network).to(self.device)
        optimiser = torch.optim.Adam(
            [
                {"params": self.model.reconstruction_parameters(), "lr": config.lr_rec, "weight_decay": config.wd_rec},
                {"params": self.model.prediction_parameters(), "lr": config.lr_cls, "weight_decay": config.wd_cls},
            ]
        )
        self.optimisers = {"both": optimiser}  # named like the compact trainer's, so ``state`` and ``restore`` serve
        remember_base_rates(self.optimisers)
        self.schedulers = (
            {
                "both": torch.optim.lr_scheduler.ReduceLROnPlateau(
                    optimiser, mode="max", factor=0.5, patience=3, threshold=1e-4, min_lr=1e-5
                )
            }
            if config.lr_schedule == "plateau"
            else {}
        )
        self.class_weights = None
        self.network = self.model

    def train_epoch(self, batches, stage: str, first_stage: bool = True, epoch: int = 0) -> dict[str, float]:
        """One pass over ``batches`` (an ``EpochPass`` or any sized iterable of batches) in ``stage`` (``epoch`` of
        the budget, from 0); mean losses and the AUROC of the risks the batches met on the way."""
        self.model.train()
        trains = {RECONSTRUCTION: stage == RECONSTRUCTION, PREDICTION: stage == PREDICTION or first_stage}
        for name, parameters in (
            (RECONSTRUCTION, self.model.reconstruction_parameters()),
            (PREDICTION, self.model.prediction_parameters()),
        ):
            for parameter in parameters:
                parameter.requires_grad_(trains[name])
        optimiser = self.optimisers["both"]
        batches = EpochPass.of(batches)
        sums = batches.tally(loss=0.0, bce=0.0, mse=0.0, count=0, risks=[], labels=[])
        for index, batch in batches:
            self.set_rates(epoch + index / len(batches))
            batch = batch.to(self.device)
            losses = stage_losses(self.model, batch, self.config)
            objective = losses[RECONSTRUCTION] if stage == RECONSTRUCTION else self.config.lambda_cls * losses["bce"]
            optimiser.zero_grad(set_to_none=True)
            objective.backward()
            optimiser.step()
            for name, value in (("loss", objective), ("bce", losses["bce"]), ("mse", losses["mse"])):
                sums[name] += value.item() * len(batch)
            sums["count"] += len(batch)
            sums["risks"].append(torch.sigmoid(losses["logits"]).cpu())
            sums["labels"].append(batch.labels.cpu())
        for parameter in self.model.parameters():
            parameter.requires_grad_(True)
        means = {name: sums[name] / max(sums["count"], 1) for name in ("loss", "bce", "mse")}
        means["auroc"] = binary_metrics(torch.cat(sums["labels"]).numpy(), torch.cat(sums["risks"]).numpy())["auroc"]
        return means

    def before_fit(self, train: IrregularDataset) -> None:
        self.model.prepare(train.times, train.lengths)

    def validate(self, validation: IrregularDataset) -> dict:
        return evaluate(self.model, validation, self.config)

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
