"""The two objectives of GARLIC's training, one per stage, and the loss parts they are made of:

    reconstruction = MSE(reconstruction, observed values) + lambda_cls * BCE + lambda_graph * |A|_1
    prediction     = BCE

The MSE is the architecture's own (``reconstruction_loss`` of the model).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from garlic.config import Config
from garlic.models.compact import Garlic, GarlicOutput, graph_penalty

RECONSTRUCTION, PREDICTION = "reconstruction", "prediction"


def forward(model: nn.Module, batch) -> GarlicOutput:
    return model(batch.values, batch.mask, batch.times, batch.lengths, batch.static)


def class_weights(labels: torch.Tensor) -> tuple[float, float]:
    """(negative, positive) weights n / (2 n_class): each outcome carries half the loss, the mean weight stays 1."""
    positives = float(labels.sum())
    if not 0 < positives < len(labels):
        raise ValueError("balance_classes needs both outcomes in the training split")
    return len(labels) / (2 * (len(labels) - positives)), len(labels) / (2 * positives)


def stage_losses(
    model: Garlic,
    batch,
    config: Config,
    network: nn.Module | None = None,
    weights: tuple[float, float] | None = None,
) -> dict[str, torch.Tensor]:
    """The loss parts (``bce``, ``mse``: the reconstruction error) and each stage's objective, keyed by stage name;
    ``network`` runs the forward pass when it wraps ``model`` (DDP). With class ``weights`` the BCE is weighted, on
    the logits before ``model.logit_offset``: the classifier learns the odds of a balanced cohort."""
    output = forward(network or model, batch)
    per_stay = None if weights is None else torch.where(batch.labels > 0.5, weights[1], weights[0])
    bce = F.binary_cross_entropy_with_logits(output.logits - model.logit_offset, batch.labels, per_stay)
    mse = model.reconstruction_loss(output, batch.values, batch.mask)
    return {
        "logits": output.logits.detach(),
        "bce": bce,
        "mse": mse,
        RECONSTRUCTION: mse + config.lambda_cls * bce + config.lambda_graph * graph_penalty(model),
        PREDICTION: bce,
    }
