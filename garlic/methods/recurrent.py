"""Recurrent baselines: GRU-D (Che et al., Sci. Rep. 2018) and decay imputation + GRU (GARLIC without the graph,
the per-variable encoder and the attention), as methods of ``garlic.evaluation.fit_and_test`` (``RecurrentModel``), fitted by
``RecurrentTrainer`` on the project's one fit loop (``garlic.training.trainer.Trainer``).

Inputs are GARLIC's batches: values normalised with training statistics (so each variable's training mean is 0),
the mask and the times in hours. Both models read each stay's state at its last real step.

GRU-D, for variable d at step t, with delta the time since d's last observation *before* t (counted from the
stay's first step while d has not been observed yet):

    gamma_x = exp(-max(0, w_d * delta + b_d))                 input decay, one rate per variable
    x_hat   = m * x + (1 - m) * (gamma_x * x_last + (1 - gamma_x) * mean)
    gamma_h = exp(-max(0, W delta + b))                       hidden decay, [D] -> [H]
    h       = GRUCell([x_hat, m], gamma_h * h)

The hidden decay depends on the step, so the recurrence steps through time in Python (a baseline, not GARLIC's
vectorised path); everything else is vectorised over stays, steps and variables.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator
from torch import Tensor, nn

from garlic.data.batches import IrregularDataset, loader
from garlic.methods.contract import fitted_inputs
from garlic.methods.model_files import WEIGHTS, load_state, read_fitted
from garlic.methods.network import NetworkMethod
from garlic.models.compact import DecayImputation, last_observed, step_mask
from garlic.models.fused import FusedGRU
from garlic.models.predict import predict_proba
from garlic.training.device import resolve_device
from garlic.training.trainer import EpochPass, Progress, Trainer


def last_observed_before(mask: Tensor) -> tuple[Tensor, Tensor]:
    """For each cell, the step of the variable's last observation strictly before it, and whether there is one.

    mask [B, T, D] -> step [B, T, D] (long, 0 where none), seen [B, T, D] (bool)
    """
    before = F.pad(last_observed(mask), (0, 0, 1, 0), value=-1)[:, :-1]
    return before.clamp(min=0), before >= 0


class GRUD(nn.Module):
    """values, mask [B, T, D], times [B, T], lengths [B] -> logits [B]"""

    def __init__(self, num_variables: int, hidden_dim: int = 64, dropout: float = 0.2):
        super().__init__()
        self.input_rate = nn.Parameter(torch.full((num_variables,), 0.1))
        self.input_offset = nn.Parameter(torch.zeros(num_variables))
        self.hidden_decay = nn.Linear(num_variables, hidden_dim)
        self.cell = nn.GRUCell(2 * num_variables, hidden_dim)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden_dim, 1))

    def forward(self, values: Tensor, mask: Tensor, times: Tensor, lengths: Tensor) -> Tensor:
        last, seen = last_observed_before(mask)
        start = times[:, :1, None]
        since = torch.where(seen, times[:, :, None].expand_as(mask).gather(1, last), start)
        delta = times[:, :, None] - since
        gamma_x = torch.exp(-F.relu(self.input_rate * delta + self.input_offset))
        x_last = values.gather(1, last) * seen  # the training mean (0) until a first observation
        x_hat = mask * values + (1 - mask) * gamma_x * x_last
        gamma_h = torch.exp(-F.relu(self.hidden_decay(delta)))  # [B, T, H]
        inputs = torch.cat([x_hat, mask], dim=-1)
        real = step_mask(lengths, values.shape[1])
        hidden = values.new_zeros(len(values), self.cell.hidden_size)
        for t in range(values.shape[1]):  # GRU-D's hidden decay depends on the step: the recurrence must step
            updated = self.cell(inputs[:, t], gamma_h[:, t] * hidden)
            hidden = torch.where(real[:, t, None], updated, hidden)  # padding steps leave the state as it is
        return self.classifier(hidden)[:, 0]

    def predict_logits(self, values: Tensor, mask: Tensor, times: Tensor, lengths: Tensor, static: Tensor) -> Tensor:
        """The logits as ``garlic.models.predict`` asks every model for them (no static features here)."""
        return self(values, mask, times, lengths)


class DecayGRU(nn.Module):
    """GARLIC's decay imputation, the mask beside it, a 2-layer GRU and a classifier on the last real state."""

    def __init__(self, num_variables: int, hidden_dim: int = 64, dropout: float = 0.2):
        super().__init__()
        self.decay = DecayImputation(num_variables)
        self.gru = FusedGRU(2 * num_variables, hidden_dim, num_layers=2, batch_first=True, dropout=dropout)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden_dim, 1))

    def forward(self, values: Tensor, mask: Tensor, times: Tensor, lengths: Tensor) -> Tensor:
        imputed = self.decay(values, mask, times)
        states, _ = self.gru(torch.cat([imputed, mask], dim=-1))
        last = (lengths - 1).clamp(min=0)
        return self.classifier(states[torch.arange(len(states)), last])[:, 0]

    def predict_logits(self, values: Tensor, mask: Tensor, times: Tensor, lengths: Tensor, static: Tensor) -> Tensor:
        """The logits as ``garlic.models.predict`` asks every model for them (no static features here)."""
        return self(values, mask, times, lengths)


MODELS = {"grud": GRUD, "decay_gru": DecayGRU}


class RecurrentTrainer(Trainer):
    """The recurrent baselines' plain loop on ``garlic.training.trainer.Trainer``: BCE and Adam, one stage, the epoch of best
    validation AUROC kept, stopped after ``settings.early_stopping`` epochs without a better one (``settings``: the
    ``RecurrentModel`` whose network it fits)."""

    stages = ("training",)

    def __init__(self, model: nn.Module, settings: "RecurrentModel", device: torch.device):
        self.config, self.model, self.device = settings, model, device
        self.optimisers = {
            "model": torch.optim.Adam(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
        }
        self.schedulers = {}

    def batches(self, train: IrregularDataset):
        return loader(train, self.config.batch_size, shuffle=True, seed=self.config.seed)

    def run_epoch(self, batches: EpochPass, progress: Progress) -> dict[str, float]:
        model, optimiser = self.model, self.optimisers["model"]
        model.train()
        sums = batches.tally(loss=0.0, count=0)
        for _, batch in batches:
            batch = batch.to(self.device)
            logits = model(batch.values, batch.mask, batch.times, batch.lengths)
            loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimiser.step()
            sums["loss"], sums["count"] = sums["loss"] + loss.item() * len(batch), sums["count"] + len(batch)
        mean = sums["loss"] / max(sums["count"], 1)
        return {"loss": mean, "bce": mean, "mse": math.nan}  # no reconstruction here

    def validate(self, validation: IrregularDataset) -> dict:
        risks = predict_proba(self.model, validation)
        bce = F.binary_cross_entropy(torch.from_numpy(risks).double().clamp(1e-7, 1 - 1e-7), validation.labels.double())
        return {"probabilities": risks, "losses": {"bce": float(bce), "mse": math.nan}}

    def validation_loss(self, progress: Progress, losses: dict[str, float]) -> float:
        return losses["bce"]

    def score(self, losses: dict[str, float], scores: dict[str, float]) -> float:
        return scores["auroc"]

    def decide(self, progress: Progress, score: float, losses: dict[str, float]) -> tuple[bool, bool]:
        if score > progress.improved_score:
            progress.improved_score, progress.stale = score, 0
        else:
            progress.stale += 1
        return False, progress.stale >= self.config.early_stopping


class RecurrentModel(NetworkMethod, BaseEstimator):
    """``name`` ('grud' or 'decay_gru') as a method of ``garlic.evaluation.fit_and_test``, fitted by
    ``RecurrentTrainer``: a network of ``hidden_dim`` units and ``dropout``, Adam at ``lr`` with ``weight_decay`` on
    batches of ``batch_size``, at most ``max_epochs``, stopped after ``early_stopping`` epochs without a better
    validation AUROC. It resumes (``garlic.methods.contract.can_resume``), as GARLIC does."""

    def __init__(
        self,
        name: str,
        hidden_dim: int = 64,
        dropout: float = 0.2,
        lr: float = 1e-3,
        weight_decay: float = 1e-4,
        batch_size: int = 64,
        max_epochs: int = 30,
        early_stopping: int = 5,
        seed: int = 0,
        device: str = "auto",
    ):
        if name not in MODELS:
            raise ValueError(f"name must be one of {', '.join(MODELS)}, got {name!r}")
        self.name, self.hidden_dim, self.dropout, self.lr = name, hidden_dim, dropout, lr
        self.weight_decay, self.batch_size, self.max_epochs = weight_decay, batch_size, max_epochs
        self.early_stopping, self.seed, self.device = early_stopping, seed, device

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "RecurrentModel":
        device = resolve_device(self.device)
        torch.manual_seed(self.seed)
        model = MODELS[self.name](train.values.shape[-1], self.hidden_dim, self.dropout).to(device)
        self.model_ = RecurrentTrainer(model, self, device).fit(train, validation, **self.training_hooks()).model
        self.num_variables_ = train.values.shape[-1]
        self.inputs_ = fitted_inputs(train)
        return self

    def fitted_beside_inputs(self) -> dict:
        return {"num_variables": self.num_variables_}

    def restore_fitted(self, folder: Path) -> None:
        fitted = read_fitted(folder)
        num_variables = fitted["num_variables"]
        model = MODELS[self.name](num_variables, self.hidden_dim, self.dropout)
        load_state(model, folder / WEIGHTS)
        self.model_, self.num_variables_ = model.eval(), num_variables
        self.inputs_ = {key: fitted[key] for key in ("variables", "static_features")}
