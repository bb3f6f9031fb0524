"""Explanations read off the model itself: observation-, signal- and edge-level importance.

How a prediction's attention flows back to the data (B stays, T steps, D variables, W lags):

1. Step t, variable j weighs ``w[t, j] = temporal[t] * signal[t, j]`` in the pooled representation (sums to 1).
2. That representation is the variable's own features plus the graph messages it receives. The share of each is
   the ratio of their norms: the own share stays on cell (t, j); the message share goes to the source variables i
   in proportion to the normalised graph weight |A_ij| / sum_i |A_ij|, and on to the earlier steps t - W .. t - 1
   by the source's lag attention.
3. An unobserved cell holds a value imputed from the variable's last observation with weight g (the decay); that
   share g of its importance moves to the observation it came from, the rest (which came from the training mean)
   is attributed to nothing.

So observation-level importance is zero on every cell that was not observed, and it sums to 1 over each stay's
observed cells (a stay with no observation at all has none). Signal-level importance is its sum over time;
edge-level importance is the message share that flowed along each edge for that stay.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from garlic.data.batches import Batch
from garlic.models.compact import Garlic, lag_offsets, normalised_adjacency


BUILT_IN = "built-in"


@dataclass
class Explanation:
    """Importance for one batch of stays, with the names needed to read it.

    observation [B, T, D]  importance of each observed value (0 elsewhere), sums to 1 per stay
    signal      [B, D]     importance of each variable per stay (sum of ``observation`` over time)
    edges       [B, D, D]  per stay, importance that flowed from source i (row) to target j (column); None where
                           the method gives none
    graph       [D, D]     the learned summary graph, |A_ij| normalised over sources i for each target j; None
                           likewise
    risk        [B]        predicted probability
    method      how it was read: ``BUILT_IN`` (this module) or ``garlic.explain.integrated_gradients.GRADIENTS``
    """

    observation: Tensor
    signal: Tensor
    edges: Tensor | None
    graph: Tensor | None
    risk: Tensor
    variables: list[str]
    method: str = BUILT_IN

    def cohort_signal(self) -> pd.Series:
        """Signal importance averaged over the stays, largest first."""
        mean = self.signal.mean(0).cpu().numpy()
        return pd.Series(mean, index=self.variables, name="importance").sort_values(ascending=False)


def normalised_graph(model: Garlic) -> Tensor:
    """The model's summary graph, ``normalised_adjacency`` of its learned adjacency. [D, D]"""
    return normalised_adjacency(model.graph.adjacency)


@torch.no_grad()
def explain(model: Garlic, batch: Batch, variables: list[str]) -> Explanation:
    """Observation-, signal- and edge-level importance for every stay in ``batch`` (returned on the batch's device)."""
    model.eval()
    home = batch.values.device
    batch = batch.to(next(model.parameters()).device)  # a model trained on a GPU explains a batch read on the CPU
    output = model(batch.values, batch.mask, batch.times, batch.lengths, batch.static)
    own_norm, message_norm = output.features.norm(dim=-1), output.messages.norm(dim=-1)
    own_share = own_norm / (own_norm + message_norm).clamp(min=1e-12)

    weight = output.temporal_attention[:, :, None] * output.signal_attention  # [B, T, D]
    graph = normalised_graph(model)
    message_weight = weight * (1 - own_share)
    from_source = message_weight @ graph.T  # [B, T, D]: what each source variable sends at step t
    edges = torch.einsum("btj,ij,bti->bij", message_weight, graph, output.lag_attention.sum(2))

    cell = weight * own_share
    for lag, back in lag_offsets(output.lag_attention.shape[2], cell.shape[1]):  # W is a handful
        cell[:, :-back] += (from_source * output.lag_attention[:, :, lag])[:, back:]

    last, carried = model.decay.carry(batch.mask, batch.times)
    unobserved = 1 - batch.mask
    observation = cell * batch.mask
    # g > 0 only after an observation, so carried importance always lands on an observed cell.
    observation.scatter_add_(1, last, cell * unobserved * carried)
    total = observation.sum(dim=(1, 2), keepdim=True)
    observation = torch.where(total > 0, observation / total.clamp(min=1e-12), observation)
    return Explanation(
        observation=observation.to(home),
        signal=observation.sum(1).to(home),
        edges=edges.to(home),
        graph=graph.to(home),
        risk=torch.sigmoid(output.logits).to(home),
        variables=list(variables),
    )
