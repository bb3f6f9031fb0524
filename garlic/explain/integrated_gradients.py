"""A post-hoc explanation to set beside the built-in one, and the one of a model without a built-in one
(``gradient_explanation``): Integrated Gradients (Sundararajan et al., 2017), computed
by Captum (``captum.attr.IntegratedGradients``).

The baseline is the stay with nothing observed (values 0, mask 0), so the path from it to the stay scales values
and mask together: (alpha * x, alpha * m), alpha in (0, 1]. The attribution of a cell is what its value and its
observed flag contribute together to the logit, (x * dF/dx + m * dF/dm) averaged along the path (Captum's
``riemann_middle`` rule, so alpha is never exactly 0). Summed over the cells it approximates logit(stay) -
logit(nothing observed). tests/test_explain.py checks Captum's numbers against the formula written out.

Cells that were not observed have x = m = 0 and so exactly zero attribution: like the built-in explanation,
importance lands only on observed values.
"""

from __future__ import annotations

import torch
from captum.attr import IntegratedGradients
from torch import Tensor, nn

from garlic.data.batches import Batch
from garlic.explain.built_in import Explanation

DEFAULT_STEPS = 16
GRADIENTS = "integrated gradients"


def integrated_gradients(model: nn.Module, batch: Batch, steps: int = DEFAULT_STEPS) -> Tensor:
    """Signed attribution of each stay's logit to each cell: [B, T, D], on the batch's device (``model``: GARLIC of
    either architecture; only its logits are read).

    Captum runs one integration step at a time over the whole batch (``internal_batch_size``), so memory stays that
    of one training batch; a stay's logit does not depend on the other stays of its batch, so the gradient of the
    summed logits gives every stay's own gradient in one backward pass.
    """
    model.eval()
    device = next(model.parameters()).device
    inputs = batch.to(device)

    def logits(values: Tensor, mask: Tensor, times: Tensor, lengths: Tensor, static: Tensor) -> Tensor:
        return model(values, mask, times, lengths, static).logits

    # cuDNN's recurrent kernels refuse a backward pass in eval mode; the plain kernels do not.
    with torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
        value_part, mask_part = IntegratedGradients(logits).attribute(
            (inputs.values, inputs.mask),
            baselines=(torch.zeros_like(inputs.values), torch.zeros_like(inputs.mask)),
            additional_forward_args=(inputs.times, inputs.lengths, inputs.static),
            n_steps=steps,
            method="riemann_middle",
            internal_batch_size=len(inputs),
        )
    return (value_part + mask_part).detach().to(batch.values.device)


def ig_importance(model: nn.Module, batch: Batch, steps: int = DEFAULT_STEPS) -> Tensor:
    """|IG| on observed cells, normalised to sum to 1 per stay like the built-in explanation: [B, T, D].

    The magnitude counts because a value that pushes the risk down is as informative as one that pushes it up.
    A stay with no observation (or only zero attributions) keeps all zeros.
    """
    attribution = integrated_gradients(model, batch, steps).abs() * batch.mask
    total = attribution.sum(dim=(1, 2), keepdim=True)
    return torch.where(total > 0, attribution / total.clamp(min=1e-12), attribution)


def gradient_explanation(
    model: nn.Module, batch: Batch, variables: list[str], steps: int = DEFAULT_STEPS
) -> Explanation:
    """The explanation a model without a built-in one still allows (the reference architecture's, whose layers do
    not split a step into the variable's own part and its messages): observation importance ``ig_importance``, signal
    importance its sum over time, and no edges (integrated gradients attribute to values, not to the graph).
    Returned on the batch's device."""
    observation = ig_importance(model, batch, steps)
    with torch.no_grad():
        inputs = batch.to(next(model.parameters()).device)
        logits = model(inputs.values, inputs.mask, inputs.times, inputs.lengths, inputs.static).logits
    return Explanation(
        observation=observation,
        signal=observation.sum(1),
        edges=None,
        graph=None,
        risk=torch.sigmoid(logits).to(batch.values.device),
        variables=list(variables),
        method=GRADIENTS,
    )
