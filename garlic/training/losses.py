"""The two objectives of GARLIC's training, one per stage, and the loss parts they are made of:

    reconstruction = MSE(reconstruction, observed values) + lambda_cls * BCE + lambda_graph * |A|_1
    prediction     = BCE

The MSE is the architecture's own (``reconstruction_loss`` of the model).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from garlic.data.batches import IrregularDataset
from garlic.models.compact import Garlic, GarlicOutput, graph_penalty
from garlic.models.predict import INFERENCE_BATCH, in_length_order
from garlic.training.training_config import TrainingConfig

RECONSTRUCTION, PREDICTION = "reconstruction", "prediction"


def forward(model: nn.Module, batch) -> GarlicOutput:
    """The model on a batch; on one with prediction times (``batch.queries``), a logit for each of them."""
    asked = {} if batch.queries is None else {"queries": batch.queries}
    return model(batch.values, batch.mask, batch.times, batch.lengths, batch.static, **asked)


def class_weights(labels: torch.Tensor) -> tuple[float, float]:
    """(negative, positive) weights n / (2 n_class): each outcome carries half the loss, the mean weight stays 1."""
    positives = float(labels.sum())
    if not 0 < positives < len(labels):
        raise ValueError("balance_classes needs both outcomes in the training split")
    return len(labels) / (2 * (len(labels) - positives)), len(labels) / (2 * positives)


def stage_losses(
    model: Garlic,
    batch,
    config: TrainingConfig,
    network: nn.Module | None = None,
    weights: tuple[float, float] | None = None,
) -> dict[str, torch.Tensor]:
    """The loss parts (``bce``, ``mse``: the reconstruction error) and each stage's objective, keyed by stage name;
    ``network`` runs the forward pass when it wraps ``model`` (DDP). With class ``weights`` the BCE is weighted, on
    the logits before ``model.logit_offset``: the classifier learns the odds of a balanced cohort."""
    output = forward(network or model, batch)
    targets = batch.targets  # each stay's outcome, or the outcome at each prediction time
    per_target = None if weights is None else torch.where(targets > 0.5, weights[1], weights[0])
    if batch.target_weights is not None:  # the dataset's own weights (``IrregularDataset.with_utility_targets``)
        per_target = batch.target_weights if per_target is None else per_target * batch.target_weights
    bce = F.binary_cross_entropy_with_logits(output.logits - model.logit_offset, targets, per_target)
    mse = model.reconstruction_loss(output, batch.values, batch.mask)
    return {
        "logits": output.logits.detach(),
        "bce": bce,
        "mse": mse,
        RECONSTRUCTION: mse + config.lambda_cls * bce + config.lambda_graph * graph_penalty(model),
        PREDICTION: bce,
    }


@torch.no_grad()
def evaluate(
    model: Garlic, dataset: IrregularDataset, config: TrainingConfig, batch_size: int = INFERENCE_BATCH
) -> dict:
    """Risk per stay, or per prediction time (in dataset order), and the mean loss parts and stage objectives over
    ``dataset`` (the BCE per target, weighted by the dataset's ``target_weights`` where it has them; the
    reconstruction error per stay)."""
    model.eval()
    probabilities = torch.empty(len(dataset.targets))
    totals = {"bce": 0.0, "mse": 0.0}
    for positions, batch in in_length_order(model, dataset, batch_size):
        output = forward(model, batch)
        targets = positions if batch.queries is None else batch.queries.index.cpu()
        probabilities[targets] = torch.sigmoid(output.logits).cpu()
        totals["bce"] += float(
            F.binary_cross_entropy_with_logits(output.logits, batch.targets, batch.target_weights, reduction="sum")
        )
        totals["mse"] += float(model.reconstruction_loss(output, batch.values, batch.mask)) * len(batch)
    losses = {"bce": totals["bce"] / max(len(dataset.targets), 1), "mse": totals["mse"] / max(len(dataset), 1)}
    penalty = float(graph_penalty(model))
    losses[RECONSTRUCTION] = losses["mse"] + config.lambda_cls * losses["bce"] + config.lambda_graph * penalty
    losses[PREDICTION] = losses["bce"]
    return {"probabilities": probabilities.numpy(), "losses": losses}
