"""A post-hoc explanation to set beside the built-in one: Integrated Gradients (Sundararajan et al., 2017).

The baseline is the stay with nothing observed (values 0, mask 0), so the path from it to the stay scales values
and mask together: (alpha * x, alpha * m), alpha in (0, 1]. The attribution of a cell is what its value and its
observed flag contribute together to the logit, (x * dF/dx + m * dF/dm) averaged along the path (midpoint rule,
so alpha is never exactly 0). Summed over the cells it approximates logit(stay) - logit(nothing observed).

Cells that were not observed have x = m = 0 and so exactly zero attribution: like the built-in explanation,
importance lands only on observed values.
"""
from __future__ import annotations

import torch
from torch import Tensor

from garlic.data import Batch
from garlic.model import Garlic

DEFAULT_STEPS = 16


def integrated_gradients(model: Garlic, batch: Batch, steps: int = DEFAULT_STEPS) -> Tensor:
    """Signed attribution of each stay's logit to each cell: [B, T, D], on the batch's device.

    A stay's logit does not depend on the other stays of its batch, so the gradient of the summed logits gives
    every stay's own gradient in one backward pass.
    """
    model.eval()
    device = next(model.parameters()).device
    inputs = batch.to(device)
    total = torch.zeros_like(inputs.values)
    alphas = (torch.arange(steps, dtype=torch.float32) + 0.5) / steps
    # cuDNN's recurrent kernels refuse a backward pass in eval mode; the plain kernels do not.
    with torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
        for alpha in alphas:  # a loop over integration steps, each one vectorised over stays, steps and variables
            values = (alpha * inputs.values).requires_grad_()
            mask = (alpha * inputs.mask).requires_grad_()
            logits = model(values, mask, inputs.times, inputs.lengths, inputs.static).logits
            value_grad, mask_grad = torch.autograd.grad(logits.sum(), (values, mask))
            total += value_grad * inputs.values + mask_grad * inputs.mask
    return (total / steps).to(batch.values.device)


def ig_importance(model: Garlic, batch: Batch, steps: int = DEFAULT_STEPS) -> Tensor:
    """|IG| on observed cells, normalised to sum to 1 per stay like the built-in explanation: [B, T, D].

    The magnitude counts because a value that pushes the risk down is as informative as one that pushes it up.
    A stay with no observation (or only zero attributions) keeps all zeros.
    """
    attribution = integrated_gradients(model, batch, steps).abs() * batch.mask
    total = attribution.sum(dim=(1, 2), keepdim=True)
    return torch.where(total > 0, attribution / total.clamp(min=1e-12), attribution)
