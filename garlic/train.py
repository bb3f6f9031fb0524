"""Alternating decoupled optimisation of GARLIC, with model selection on the validation split only.

Two stages take turns:
- reconstruction: reconstruction loss + lambda_cls * BCE + lambda_graph * |A|_1, all parameters;
- prediction: BCE, the prediction parameters only (signal attention, GRU, temporal attention, classifier).
Each parameter group has its own optimiser (learning rate, weight decay) and plateau schedule. The stage switches
when its validation loss has not improved for ``stage_patience`` epochs, restarting from the best checkpoint;
training stops when validation AUROC has not improved for ``early_stopping`` epochs. With ``alternating=False``
the reconstruction-stage objective trains everything jointly (the ablation).
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from garlic.config import Config
from garlic.data import IrregularDataset, collate, loader
from garlic.metrics import binary_metrics
from garlic.model import Garlic, GarlicOutput, graph_penalty, reconstruction_loss

RECONSTRUCTION, PREDICTION = "reconstruction", "prediction"
GRADIENT_CLIP = 5.0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA device; use --device cpu or auto")
    return torch.device(name)


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
class FitResult:
    model: Garlic
    history: list[EpochRecord]
    best_epoch: int


def forward(model: Garlic, batch) -> GarlicOutput:
    return model(batch.values, batch.mask, batch.times, batch.lengths, batch.static)


def stage_losses(model: Garlic, batch, config: Config) -> dict[str, torch.Tensor]:
    output = forward(model, batch)
    bce = F.binary_cross_entropy_with_logits(output.logits, batch.labels)
    reconstruction = reconstruction_loss(output, batch.values, batch.mask)
    return {
        "bce": bce,
        "reconstruction": reconstruction,
        RECONSTRUCTION: reconstruction + config.lambda_cls * bce + config.lambda_graph * graph_penalty(model),
        PREDICTION: bce,
    }


def ordered_by_length(dataset: IrregularDataset, batch_size: int) -> DataLoader:
    """Batches of stays sorted by length (little padding); predictions do not depend on the batch."""
    order = torch.argsort(dataset.lengths, stable=True).tolist()
    return DataLoader(dataset, batch_size=batch_size, sampler=order, collate_fn=collate)


@torch.no_grad()
def evaluate(model: Garlic, dataset: IrregularDataset, config: Config, batch_size: int = 256) -> dict:
    """Risk per stay (in dataset order) and the mean stage losses over ``dataset``."""
    model.eval()
    device = next(model.parameters()).device
    order = torch.argsort(dataset.lengths, stable=True)
    probabilities = torch.empty(len(dataset))
    totals = {"bce": 0.0, "reconstruction": 0.0, RECONSTRUCTION: 0.0}
    done = 0
    for batch in ordered_by_length(dataset, batch_size):
        batch = batch.to(device)
        output = forward(model, batch)
        probabilities[order[done : done + len(batch)]] = torch.sigmoid(output.logits).cpu()
        done += len(batch)
        bce = F.binary_cross_entropy_with_logits(output.logits, batch.labels, reduction="sum")
        reconstruction = reconstruction_loss(output, batch.values, batch.mask) * len(batch)
        totals["bce"] += float(bce)
        totals["reconstruction"] += float(reconstruction)
    n = max(len(dataset), 1)
    losses = {k: v / n for k, v in totals.items()}
    losses[RECONSTRUCTION] = (
        losses["reconstruction"] + config.lambda_cls * losses["bce"] + config.lambda_graph * float(graph_penalty(model))
    )
    losses[PREDICTION] = losses["bce"]
    return {"probabilities": probabilities.numpy(), "losses": losses}


def predict_proba(model: Garlic, dataset: IrregularDataset, batch_size: int = 256) -> np.ndarray:
    return evaluate(model, dataset, model.config, batch_size)["probabilities"]


class AlternatingTrainer:
    """Fits a fresh GARLIC to a training split, selecting the checkpoint on the validation split."""

    def __init__(self, config: Config, num_variables: int, num_static: int):
        self.config = config
        self.device = resolve_device(config.device)
        torch.manual_seed(config.seed)
        self.model = Garlic(num_variables, num_static, config).to(self.device)
        self.optimisers = {
            RECONSTRUCTION: torch.optim.Adam(
                self.model.reconstruction_parameters(), lr=config.lr_rec, weight_decay=config.wd_rec
            ),
            PREDICTION: torch.optim.Adam(
                self.model.prediction_parameters(), lr=config.lr_cls, weight_decay=config.wd_cls
            ),
        }
        self.schedulers = {
            name: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=2)
            for name, opt in self.optimisers.items()
        }

    def _set_stage(self, stage: str) -> None:
        for parameter in self.model.reconstruction_parameters():
            parameter.requires_grad_(stage == RECONSTRUCTION)

    def train_epoch(self, batches, stage: str) -> dict[str, float]:
        """One pass over the training batches in ``stage``; returns mean losses."""
        self.model.train()
        self._set_stage(stage)
        stepped = self.optimisers.values() if stage == RECONSTRUCTION else [self.optimisers[PREDICTION]]
        sums, count = {"loss": 0.0, "bce": 0.0, "reconstruction": 0.0}, 0
        for batch in batches:
            batch = batch.to(self.device)
            losses = stage_losses(self.model, batch, self.config)
            for optimiser in self.optimisers.values():
                optimiser.zero_grad(set_to_none=True)
            losses[stage].backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRADIENT_CLIP)
            for optimiser in stepped:
                optimiser.step()
            for name, key in (("loss", stage), ("bce", "bce"), ("reconstruction", "reconstruction")):
                sums[name] += losses[key].item() * len(batch)
            count += len(batch)
        self._set_stage(RECONSTRUCTION)
        return {k: v / max(count, 1) for k, v in sums.items()}

    def fit(
        self,
        train: IrregularDataset,
        validation: IrregularDataset,
        on_epoch: Callable[[EpochRecord], None] | None = None,
    ) -> FitResult:
        config = self.config
        batches = loader(train, config.batch_size, shuffle=True, seed=config.seed)
        stage = RECONSTRUCTION
        best_score, best_epoch = -np.inf, 0
        best_state = copy.deepcopy(self.model.state_dict())
        stage_best, stage_stale, stale = np.inf, 0, 0
        history: list[EpochRecord] = []
        for epoch in range(1, config.max_epochs + 1):
            start = time.perf_counter()
            trained = self.train_epoch(batches, stage)
            checked = evaluate(self.model, validation, config)
            scores = binary_metrics(validation.labels.numpy(), checked["probabilities"])
            losses = checked["losses"]
            for name, scheduler in self.schedulers.items():
                scheduler.step(losses[name])
            record = EpochRecord(
                epoch=epoch,
                stage=stage,
                train_loss=trained["loss"],
                train_bce=trained["bce"],
                train_reconstruction=trained["reconstruction"],
                val_loss=losses[stage],
                val_bce=losses["bce"],
                val_reconstruction=losses["reconstruction"],
                val_auroc=scores["auroc"],
                val_auprc=scores["auprc"],
                seconds=time.perf_counter() - start,
            )
            history.append(record)
            # AUROC picks the checkpoint; it is NaN only with one class, when the loss has to decide.
            score = scores["auroc"] if np.isfinite(scores["auroc"]) else -losses["bce"]
            if score > best_score:
                best_score, best_epoch, stale = score, epoch, 0
                best_state = copy.deepcopy(self.model.state_dict())
            else:
                stale += 1
            if losses[stage] < stage_best - 1e-6:
                stage_best, stage_stale = losses[stage], 0
            else:
                stage_stale += 1
            if on_epoch is not None:
                on_epoch(record)
            if stale >= config.early_stopping:
                break
            if config.alternating and stage_stale >= config.stage_patience:
                stage = PREDICTION if stage == RECONSTRUCTION else RECONSTRUCTION
                self.model.load_state_dict(best_state)
                stage_best, stage_stale = np.inf, 0
        self.model.load_state_dict(best_state)
        return FitResult(self.model, history, best_epoch)
