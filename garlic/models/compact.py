"""GARLIC: Graph Attention-based Relational Learning of multivariate ICU time series (Wang et al., ICLR 2026).

Read top to bottom: the layers in the order data meets them, then the model that chains them.

1. Latent feature modelling: ``DecayImputation`` fills unobserved cells by a learnable exponential decay from the
   variable's last observation towards its training mean; ``VariableEncoder`` turns (value, observed) into a
   feature vector per variable and step.
2. Time-lagged graph message passing: ``LagAttention`` summarises each variable's previous ``window_size`` steps;
   ``GraphMessagePassing`` sends those summaries along a learned dense variable graph; a reconstruction head
   predicts the observed values from the messages (the auxiliary loss that teaches the graph).
3. Cross-dimensional sequential attention: ``SignalAttention`` weighs variables per step, a 2-layer GRU runs over
   the steps, ``TemporalAttention`` pools the steps, and a classifier gives the logit.
4. Optionally (``summary_branch``), a wide branch into the classifier: ``RunningSummary`` gives each variable's
   first, last, lowest, highest and mean value, count and time since its last observation up to every step, what
   the summary-feature baselines see, and the classifier reads it at the stay's last step beside the pooled state.
   Optionally (``hours_input``), the classifier also reads ``log1p(hours)`` of the time the risk is asked at (the
   stay's last step, a prediction time's own time, a replayed hour).

Shapes: B stays, T steps, D variables, F ``feature_dim``, W ``window_size``, H ``hidden_dim``, S static features.
Everything is vectorised over B, T and D. Every step only sees itself and earlier steps, and padded steps are
masked out of the attention over time, so a stay's prediction does not depend on the other stays in its batch.

One path leads to a logit: ``per_step`` (stages 1, 2 and the signal attention, step by step), the GRU, then
``classify``. ``forward`` runs it whole and adds the reconstruction head; ``predict_logits`` runs ``per_step`` on
cache-sized chunks of stays and keeps only the logits; ``encode`` stops before ``classify``, so that the dashboard
can classify every prefix of a stay from one pass.

Some layers compute their formula in a rearranged but equal form that runs faster on a CPU (``fast_tanh``, the
folded key of ``LagAttention``, the transposed products of ``GraphMessagePassing``); tests/test_model.py checks each
against a plain implementation of the formula in its docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from garlic.data.batches import Queries
from garlic.models.fused import FusedGRU, FusedLayerNorm
from garlic.models.network_config import NetworkConfig

# 4 MiB of float32 activations. Inference that ran the per-step layers on chunks of this many cells predicted 1.2x the
# stays per second of whole batches of 128 on P12 (a 2-core EPYC: 2 MiB of L2 per core, 32 MiB of L3).
CACHE_CELLS = 2**20


@dataclass
class PerStep:
    """``Garlic.per_step``: every step from itself and its past, before the GRU joins the steps."""

    features: Tensor  # [B, T, D, F] each variable's own encoded features
    messages: Tensor  # [B, T, D, F] what each variable receives over the graph from the previous steps
    lag_attention: Tensor  # [B, T, W, D] weight of the step ``t - W + w`` for variable d at step t (``lag_offsets``)
    signal_attention: Tensor  # [B, T, D] weight of each variable at each step (sums to 1 over D)
    sequence_input: Tensor  # [B, T, H] the GRU's input at each step


@dataclass
class StepEncoding(PerStep):
    """What the model computes at every step, before pooling over time (``Garlic.encode``)."""

    states: Tensor  # [B, T, H] the GRU's state after each step
    summaries: Tensor | None  # [B, T, 8 D] the running summary (``RunningSummary``), None without the branch


@dataclass
class GarlicOutput(PerStep):
    states: Tensor  # [B, T, H] the GRU's state after each step
    summary: Tensor | None  # [B, 8 D] the running summary at each stay's last real step, None without the branch
    reconstruction: Tensor  # [B, T, D] predicted values, comparable where observed and a past exists
    logits: Tensor  # [B]
    temporal_attention: Tensor  # [B, T] weight of each step (sums to 1 over a stay's real steps)
    step_mask: Tensor  # [B, T] True for real (non-padding) steps


def fast_tanh(x: Tensor) -> Tensor:
    """tanh(x) as 2 sigmoid(2x) - 1, within 2e-7 of ``torch.tanh``. On CPU, PyTorch's tanh takes 4x the time of its
    sigmoid, and tanh over [B, T, D, F] was the costliest elementwise pass of inference."""
    sigmoid = torch.sigmoid(2 * x)
    return 2 * sigmoid - 1 if sigmoid.requires_grad else sigmoid.mul_(2).sub_(1)


def step_mask(lengths: Tensor, steps: int) -> Tensor:
    """[B] -> [B, T]: True where the step is part of the stay."""
    return torch.arange(steps, device=lengths.device)[None, :] < lengths[:, None]


def at_last_step(sequence: Tensor, real: Tensor) -> Tensor:
    """Each stay's entry at its last real step (the first step for a stay without one). [B, T, X], [B, T] -> [B, X]"""
    last = (real.sum(1) - 1).clamp(min=0)
    return sequence[torch.arange(len(sequence), device=sequence.device), last]


def lag_offsets(window: int, steps: int) -> list[tuple[int, int]]:
    """The lag convention: lag position w (0 .. W - 1) of step t is step t - (W - w), so position W - 1 is the step
    just before and position 0 the earliest of the window. Returns (w, W - w) for each position that reaches a step
    of a T-step stay (W - w < T): at position w, steps t >= W - w look back W - w steps, to step t - (W - w)."""
    return [(lag, window - lag) for lag in range(window) if window - lag < steps]


def last_observed(mask: Tensor) -> Tensor:
    """For every cell, the step of the variable's last observation up to it (itself included), -1 before the first.

    mask [B, T, D] -> [B, T, D] (long)
    """
    steps = torch.arange(mask.shape[1], device=mask.device)[None, :, None]
    return torch.where(mask.bool(), steps, -1).cummax(dim=1).values


class DecayImputation(nn.Module):
    """x'_{t,d} = m_{t,d} x_{t,d} + (1 - m_{t,d}) (g_{t,d} x_last + (1 - g_{t,d}) mean_d),
    g_{t,d} = exp(-max(0, w_d dt_{t,d} + b_d)).

    Values arrive normalised with training statistics, so each variable's training mean is 0 here. ``dt`` is the
    time in hours since the variable was last observed in this stay; a variable never observed yet takes its mean.

    values, mask [B, T, D], times [B, T] -> imputed [B, T, D]
    """

    def __init__(self, num_variables: int, enabled: bool = True):
        super().__init__()
        self.enabled = enabled
        self.rate = nn.Parameter(torch.full((num_variables,), 0.1))
        self.offset = nn.Parameter(torch.zeros(num_variables))

    def carry(self, mask: Tensor, times: Tensor) -> tuple[Tensor, Tensor]:
        """For every cell, the step of the variable's last observation and the weight g carried from it.

        mask [B, T, D], times [B, T] -> last step [B, T, D] (long), g [B, T, D] (0 where never observed yet)
        """
        last = last_observed(mask)
        seen = last >= 0
        last = last.clamp(min=0)
        gap = times[:, :, None] - times[:, :, None].expand_as(mask).gather(1, last)
        carried = torch.exp(-F.relu(self.rate * gap + self.offset)) * seen if self.enabled else torch.zeros_like(mask)
        return last, carried

    def forward(self, values: Tensor, mask: Tensor, times: Tensor) -> Tensor:
        last, carried = self.carry(mask, times)
        return mask * values + (1 - mask) * carried * values.gather(1, last)


class VariableEncoder(nn.Module):
    """h_{t,d} = tanh(x'_{t,d} u_d + m_{t,d} v_d + c_d) in R^F: (value, observed) -> F features, with weights u_d,
    v_d, c_d of its own for each variable (one set shared by all when not ``per_variable``). Without ``use_mask``
    the term m v is left out, so that the features see the (imputed) value alone.

    values, mask [B, T, D] -> features [B, T, D, F]
    """

    def __init__(self, num_variables: int, feature_dim: int, per_variable: bool = True, use_mask: bool = True):
        super().__init__()
        rows = num_variables if per_variable else 1
        self.use_mask = use_mask
        self.weight = nn.Parameter(torch.randn(rows, 2, feature_dim) / math.sqrt(2))
        self.bias = nn.Parameter(torch.zeros(rows, feature_dim))

    def forward(self, values: Tensor, mask: Tensor) -> Tensor:
        # Two inputs per variable: fused multiply-adds beat a batched matmul with an inner size of 2.
        features = torch.addcmul(self.bias, values[..., None], self.weight[:, 0])
        if self.use_mask:
            features.addcmul_(mask[..., None], self.weight[:, 1])
        return fast_tanh(features)


class LagAttention(nn.Module):
    """Each variable attends over its own features at the previous W steps, each with a learned lag embedding e_w:

        k_{t,w,d} = W_k (h_{t-W+w,d} + e_w) + b_k
        a_{t,w,d} = softmax over the w with t - W + w >= 0 of  q_d . k_{t,w,d} / sqrt(F)
        s_{t,d}   = sum_w a_{t,w,d} (h_{t-W+w,d} + e_w)

    with a query q_d per variable (lag positions as in ``lag_offsets``). Computed with the key folded into the
    query: q_d . k = h . (W_k^T q_d) + e_w . (W_k^T q_d) + b_k . q_d, so that no lag is ever projected.

    features [B, T, D, F] -> summary [B, T, D, F], weights [B, T, W, D] (all zero at step 0, which has no past)
    """

    def __init__(self, num_variables: int, feature_dim: int, window_size: int):
        super().__init__()
        self.window_size = window_size
        self.lag_embedding = nn.Parameter(torch.randn(window_size, feature_dim) * 0.02)
        self.key = nn.Linear(feature_dim, feature_dim)
        self.query = nn.Parameter(torch.randn(num_variables, feature_dim) / math.sqrt(feature_dim))

    def folded_query(self) -> tuple[Tensor, Tensor]:
        """score(key(x), q) = x . (W_k^T q) + b_k . q: the key folded into the query instead of projecting every lag.
        -> query [D, F], the lag embeddings' and the bias's part of each score [W, D]"""
        query = self.query @ self.key.weight
        return query, self.lag_embedding @ query.T + self.query @ self.key.bias

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        steps, window = features.shape[1], self.window_size
        query, lag_scores = self.folded_query()  # [D, F], [W, D]
        # [B, T, D]: one matrix product per variable, about twice as fast as (features * query).sum(-1) for small F.
        own_scores = torch.einsum("btdf,df->btd", features, query)
        # W (not D) is innermost-but-one so that the softmax runs over a short middle axis, many times faster than
        # over a last axis of length W.
        step_scores = own_scores.new_zeros(len(features), steps, window, features.shape[2])  # [B, T, W, D]
        has_step = torch.zeros(steps, window, dtype=torch.bool, device=features.device)  # [T, W]
        for lag, back in lag_offsets(window, steps):
            step_scores[:, back:, lag] = own_scores[:, :-back]
            has_step[back:, lag] = True
        scores = (step_scores + lag_scores) / math.sqrt(features.shape[-1])
        # Filled after the sum, not before: masked_fill stops the NaN gradient of step 0's empty softmax here.
        scores = scores.masked_fill(~has_step[None, :, :, None], float("-inf"))
        weights = torch.softmax(scores, dim=2).nan_to_num(0.0)
        return LagPool.apply(weights, features, self.lag_embedding), weights

    def at_step(self, past: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
        """The same summary for one step from the features of its previous W steps (``garlic.models.steps``).

        past [B, W, D, F] (position w: step t - W + w), real [B, W] (whether position w holds a step) ->
        summary [B, D, F], weights [B, W, D]
        """
        query, lag_scores = self.folded_query()
        scores = (torch.einsum("bwdf,df->bwd", past, query) + lag_scores) / math.sqrt(past.shape[-1])
        weights = torch.softmax(scores.masked_fill(~real[:, :, None], float("-inf")), dim=1).nan_to_num(0.0)
        return weights.transpose(1, 2) @ self.lag_embedding + torch.einsum("bwd,bwdf->bdf", weights, past), weights


class LagPool(torch.autograd.Function):
    """``LagAttention``'s weighted sum s_{t,d} = sum_w a_{t,w,d} (h_{t-W+w,d} + e_w), its gradients written out:

        dh_{t-W+w,d} += a_{t,w,d} g_{t,d},  da_{t,w,d} = g_{t,d} . (h_{t-W+w,d} + e_w),  de_w = sum a_{t,w,d} g_{t,d}

    Both ways the W shifted slices are added in place. Autograd through in-place adds into slices copies the whole
    gradient once per lag; these sums took a fifth of the backward pass's time on P12.

    weights [B, T, W, D], features [B, T, D, F], lag_embedding [W, F] -> summary [B, T, D, F]
    """

    @staticmethod
    def forward(ctx, weights: Tensor, features: Tensor, lag_embedding: Tensor) -> Tensor:
        ctx.save_for_backward(weights, features, lag_embedding)
        # A sum over the W lag positions of shifted slices, added in place: much faster than reducing a strided
        # view, and no padded copy of the features.
        summary = weights.transpose(2, 3) @ lag_embedding
        for lag, back in lag_offsets(weights.shape[2], features.shape[1]):
            summary[:, back:].addcmul_(weights[:, back:, lag, :, None], features[:, :-back])
        return summary

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        weights, features, lag_embedding = ctx.saved_tensors
        grad = grad.contiguous()
        lags = lag_offsets(weights.shape[2], features.shape[1])
        grad_weights = grad_features = grad_embedding = None
        if ctx.needs_input_grad[0]:
            grad_weights = (grad @ lag_embedding.T).transpose(2, 3).contiguous()  # [B, T, W, D]
            for lag, back in lags:
                grad_weights[:, back:, lag] += torch.linalg.vecdot(grad[:, back:], features[:, :-back])
        if ctx.needs_input_grad[1]:
            grad_features = torch.zeros_like(features)
            for lag, back in lags:
                grad_features[:, :-back].addcmul_(weights[:, back:, lag, :, None], grad[:, back:])
        if ctx.needs_input_grad[2]:
            grad_embedding = weights.transpose(2, 3).reshape(-1, weights.shape[2]).T @ grad.view(-1, grad.shape[-1])
        return grad_weights, grad_features, grad_embedding


def normalised_adjacency(adjacency: Tensor) -> Tensor:
    """|A_ij| / sum_i |A_ij|: where each target variable's messages come from (row = source). [D, D] -> [D, D]"""
    weight = adjacency.detach().abs()
    return weight / weight.sum(0, keepdim=True).clamp(min=1e-12)


def add_adjacency(module: nn.Module, num_variables: int, learn_graph: bool) -> None:
    """Give ``module`` its graph ``adjacency`` [D, D] (row: the source, column: the target): a parameter from
    I + 0.2 under ``learn_graph``, else a buffer fixed at I (each variable receives only its own message)."""
    if learn_graph:
        module.adjacency = nn.Parameter(torch.eye(num_variables) + 0.2)
    else:
        module.register_buffer("adjacency", torch.eye(num_variables))


class GraphMessagePassing(nn.Module):
    """m_{t,j} = sum_i A_ij W s_{t,i}: every variable j receives the linear message W s_{t,i} (no bias) of each
    variable i, weighted by a learned dense graph A initialised as I + 0.2 (fixed at I when not ``learn_graph``: each
    variable receives only its own message). Computed as (W S_t^T) A, with S_t the [D, F] summaries of step t.

    summary [B, T, D, F] -> messages [B, T, D, F]
    """

    def __init__(self, num_variables: int, feature_dim: int, learn_graph: bool = True):
        super().__init__()
        add_adjacency(self, num_variables, learn_graph)
        self.message = nn.Linear(feature_dim, feature_dim, bias=False)  # linear, so it commutes with A

    def forward(self, summary: Tensor) -> Tensor:
        batch, steps, variables, features = summary.shape
        # Both maps as products without transposed copies of [B, T, D, F]: the message for all B*T steps at once
        # (into [B*T, F, D]), then the mix over variables on that last axis. The result is a transposed view.
        sent = torch.bmm(
            self.message.weight.expand(batch * steps, -1, -1),
            summary.reshape(batch * steps, variables, features).transpose(1, 2),
        )
        return (sent @ self.adjacency).view(batch, steps, features, variables).transpose(-1, -2)


class SignalAttention(nn.Module):
    """Attention across the variables of each step, which keeps each variable's features, reweighted:

        b_{t,d} = softmax over d of  u . tanh(P z_{t,d} + p)
        out_t   = concat over d of  D b_{t,d} z_{t,d}

    (scaled by D so that uniform attention leaves the features as they are).

    features [B, T, D, F] -> weighted [B, T, D * F], weights [B, T, D]
    """

    def __init__(self, feature_dim: int):
        super().__init__()
        self.project = nn.Linear(feature_dim, feature_dim)
        self.score = nn.Linear(feature_dim, 1, bias=False)

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        weights = torch.softmax(self.score(fast_tanh(self.project(features)))[..., 0], dim=-1)
        weighted = features * (weights * features.shape[2])[..., None]
        return weighted.flatten(2), weights


class StepwiseProjection(nn.Module):
    """The no-GRU ablation, each step on its own: h_t = tanh(W x_t + b), returned as ``nn.GRU`` returns.

    inputs [B, T, I] -> (states [B, T, H], None)
    """

    def __init__(self, input_dim: int, hidden_dim: int):
        super().__init__()
        self.layer = nn.Linear(input_dim, hidden_dim)

    def forward(self, inputs: Tensor) -> tuple[Tensor, None]:
        return fast_tanh(self.layer(inputs)), None


class TemporalAttention(nn.Module):
    """Attention pooling over a stay's real steps:

        c_t = softmax over the real t of  v . tanh(Q h_t + r),   context = sum_t c_t h_t

    states [B, T, H], step_mask [B, T] -> context [B, H], weights [B, T] (0 on padding)
    """

    def __init__(self, hidden_dim: int):
        super().__init__()
        self.project = nn.Linear(hidden_dim, hidden_dim)
        self.score = nn.Linear(hidden_dim, 1, bias=False)

    def scores(self, states: Tensor) -> Tensor:
        """v . tanh(Q h_t + r), each step's from its own state alone. [..., H] -> [...]"""
        return self.score(fast_tanh(self.project(states)))[..., 0]

    def forward(self, states: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        scores = self.scores(states).masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=1).nan_to_num(0.0)
        return torch.einsum("bt,bth->bh", weights, states), weights

    def up_to_each_step(self, states: Tensor, mask: Tensor) -> Tensor:
        """The context of every prefix at once: row t pools steps 0..t as ``forward`` pools a stay cut after step t.
        A step's score depends on its own state only, so each prefix's softmax is a running sum:

            context_t = sum_{s <= t} e^{a_s - m} h_s / sum_{s <= t} e^{a_s - m},   m = max_s a_s (per stay)

        in float64, where a score 700 below the stay's highest still counts. states [B, T, H], mask [B, T] ->
        contexts [B, T, H] (rows past a stay's end: its whole-stay context)"""
        scores = self.scores(states).masked_fill(~mask, float("-inf")).double()
        weights = torch.exp(scores - scores.max(dim=1, keepdim=True).values.detach())
        totals = torch.cumsum(weights, dim=1)[..., None]
        pooled = torch.cumsum(weights[..., None] * states.double(), dim=1)
        return (pooled / totals.clamp(min=torch.finfo(torch.float64).tiny)).to(states.dtype)


class RunningSummary(nn.Module):
    """Per variable, from the steps up to each step: first, last, lowest, highest and mean observed value,
    log(1 + count), hours since the last observation / 24, and whether it has been observed (values 0 until then).

    values, mask [B, T, D], times [B, T] -> summaries [B, T, 8 D] (variable-major: the 8 statistics of variable d
    are columns 8 d .. 8 d + 7)
    """

    STATISTICS = ("first", "last", "min", "max", "mean", "log_count", "days_since_last", "observed")

    def forward(self, values: Tensor, mask: Tensor, times: Tensor) -> Tensor:
        observed = mask.bool()
        count = mask.cumsum(1)
        seen = count > 0
        steps = torch.arange(mask.shape[1], device=mask.device)[None, :, None].expand_as(mask)
        last = torch.where(observed, steps, -1).cummax(1).values.clamp(min=0)
        first = torch.where(observed, steps, mask.shape[1]).cummin(1).values.clamp(max=mask.shape[1] - 1)
        infinity = torch.finfo(values.dtype).max
        low = torch.where(observed, values, infinity).cummin(1).values
        high = torch.where(observed, values, -infinity).cummax(1).values
        mean = (values * mask).cumsum(1) / count.clamp(min=1)
        since = times[:, :, None] - times[:, :, None].expand_as(mask).gather(1, last)
        return self.stacked([values.gather(1, first), values.gather(1, last), low, high, mean], count, since, seen)

    def at_end(self, values: Tensor, mask: Tensor, times: Tensor, lengths: Tensor) -> Tensor:
        """``forward(...)`` at each stay's last real step, by reductions over its steps instead of running ones (the
        inference path reads nothing else). -> [B, 8 D]"""
        steps = mask.shape[1]
        observed = mask.bool() & step_mask(lengths, steps)[:, :, None]
        count = observed.sum(1).to(values.dtype)
        seen = count > 0
        step = torch.arange(steps, device=mask.device)[None, :, None]
        last = torch.where(observed, step, -1).amax(1, keepdim=True).clamp(min=0)
        first = torch.where(observed, step, steps).amin(1, keepdim=True).clamp(max=steps - 1)
        infinity = torch.finfo(values.dtype).max
        low = torch.where(observed, values, infinity).amin(1)
        high = torch.where(observed, values, -infinity).amax(1)
        mean = torch.where(observed, values, 0.0).sum(1) / count.clamp(min=1)
        now = times.gather(1, (lengths - 1).clamp(min=0)[:, None])
        since = now - times.gather(1, last[:, 0])
        return self.stacked(
            [values.gather(1, first)[:, 0], values.gather(1, last)[:, 0], low, high, mean], count, since, seen
        )

    @staticmethod
    def stacked(observed: list[Tensor], count: Tensor, since: Tensor, seen: Tensor) -> Tensor:
        """The 8 statistics in ``STATISTICS`` order, variable-major on the last axis ([..., D] each -> [..., 8 D]);
        the ``observed`` ones (first .. mean) 0 until a variable is seen."""
        statistics = [torch.where(seen, statistic, 0.0) for statistic in observed]
        statistics += [torch.log1p(count), since * seen / 24, seen.to(count.dtype)]
        return torch.stack(statistics, dim=-1).flatten(-2)


class Garlic(nn.Module):
    """The full model; per stay, with the layers above:

        x' = DecayImputation(x, m, t);  h = VariableEncoder(x', m)                           [T, D, F]
        s, a = LagAttention(h);  g = GraphMessagePassing(s);  z = LayerNorm(h + g)          [T, D, F]
        u, b = SignalAttention(z);  states = GRU(Linear(u))   (2 layers; StepwiseProjection without use_gru)
        context, c = TemporalAttention(states)                                               [H]
        logit = MLP([context, SummaryBranch(RunningSummary(x, m, t) at the last step), static]) + logit_offset
        reconstruction_{t,d} = sum_f gelu(g_{t,d,f}) r_{d,f} + r0_d   (the auxiliary head, read where observed)

    with the summary branch only under ``summary_branch`` and the static features only under ``use_static``.
    ``prediction_parameters()`` are the ones the prediction stage trains.
    """

    takes_steps = True  # every layer is causal up to the pooling: garlic.models.steps goes on one step at a time

    PREDICTION_MODULES = (
        "signal_attention",
        "sequence_input",
        "sequence",
        "temporal_attention",
        "summary_branch",
        "classifier",
    )
    # Why the built-in explanation (``garlic.explain.built_in``) is not defined for the model, None where it is: what callers
    # ask instead of testing the class.
    explanation_unavailable: str | None = None

    def __init__(self, num_variables: int, num_static: int, config: NetworkConfig):
        super().__init__()
        d, f, h = num_variables, config.feature_dim, config.hidden_dim
        self.config = config
        self.num_variables, self.num_static = num_variables, num_static
        # 1. latent feature modelling
        self.decay = DecayImputation(d, enabled=config.use_decay)
        self.encoder = VariableEncoder(d, f, config.per_variable_encoder, config.use_missing_indicator)
        # 2. time-lagged graph message passing
        self.lag_attention = LagAttention(d, f, config.window_size)
        self.graph = GraphMessagePassing(d, f, learn_graph=config.use_graph)
        self.reconstruction_weight = nn.Parameter(torch.randn(d, f) / math.sqrt(f))
        self.reconstruction_bias = nn.Parameter(torch.zeros(d))
        self.norm = FusedLayerNorm(f)
        # 3. cross-dimensional sequential attention
        self.signal_attention = SignalAttention(f)
        self.sequence_input = nn.Linear(d * f, h)
        self.sequence = (
            FusedGRU(h, h, num_layers=2, batch_first=True, dropout=config.dropout)
            if config.use_gru
            else StepwiseProjection(h, h)
        )
        self.temporal_attention = TemporalAttention(h)
        # 4. the optional wide branch
        self.running_summary = RunningSummary()
        self.summary_branch = (
            nn.Sequential(nn.Linear(len(RunningSummary.STATISTICS) * d, h), nn.ReLU(), nn.Dropout(config.dropout))
            if config.summary_branch
            else nn.Identity()
        )
        wide = h if config.summary_branch else 0
        self.classifier = nn.Sequential(
            nn.Linear(h + wide + (num_static if config.use_static else 0) + int(config.hours_input), h),
            nn.ReLU(),
            nn.Dropout(config.dropout),
            nn.Linear(h, 1),
        )
        # The training split's log-odds log(n_pos / n_neg) where the loss weighted both outcomes equally
        # (``balance_classes``), else 0: the classifier learns balanced odds, this brings back the real prevalence.
        self.register_buffer("logit_offset", torch.zeros(()))

    def prepare(self, times: Tensor, lengths: Tensor) -> None:
        """Nothing to take from the training stays: their normalisation is the data set's (``garlic.data.splits``)."""

    def prediction_parameters(self) -> list[nn.Parameter]:
        return [p for name in self.PREDICTION_MODULES for p in getattr(self, name).parameters()]

    def reconstruction_parameters(self) -> list[nn.Parameter]:
        prediction = {id(p) for p in self.prediction_parameters()}
        return [p for p in self.parameters() if id(p) not in prediction]

    def encode(self, values: Tensor, mask: Tensor, times: Tensor) -> StepEncoding:
        """Every step up to and through the GRU; a step depends only on itself and earlier steps.

        values, mask [B, T, D], times [B, T] -> StepEncoding
        """
        steps = self.per_step(values, mask, times)
        states, _ = self.sequence(steps.sequence_input)
        return StepEncoding(**vars(steps), states=states, summaries=self.summaries(values, mask, times))

    def summaries(self, values: Tensor, mask: Tensor, times: Tensor) -> Tensor | None:
        """The running summary when the model has the wide branch, else None. -> [B, T, 8 D] or None"""
        return self.running_summary(values, mask, times) if self.config.summary_branch else None

    def per_step(self, values: Tensor, mask: Tensor, times: Tensor) -> PerStep:
        """Stages 1 and 2 and the signal attention: each step from itself and its past, before the GRU joins them.

        values, mask [B, T, D], times [B, T] -> PerStep
        """
        features = self.encoder(self.decay(values, mask, times), mask)
        summary, lag_weights = self.lag_attention(features)
        return self.after_lags(features, summary, lag_weights)

    def after_lags(self, features: Tensor, summary: Tensor, lag_weights: Tensor) -> PerStep:
        """``per_step`` from the lag attention on: the graph, the norm and the signal attention, each step on its own.

        features, summary [B, T, D, F], lag_weights [B, T, W, D] -> PerStep
        """
        messages = self.graph(summary)
        fused = self.norm(features + messages)
        weighted, signal_weights = self.signal_attention(fused)
        return PerStep(features, messages, lag_weights, signal_weights, self.sequence_input(weighted))

    def reconstruction_loss(self, output: GarlicOutput, values: Tensor, mask: Tensor) -> Tensor:
        """This architecture's reconstruction error (the function ``reconstruction_loss`` below)."""
        return reconstruction_loss(output, values, mask)

    def reconstruct(self, messages: Tensor) -> Tensor:
        """The auxiliary head: each variable's value from what it received. messages [B, T, D, F] -> [B, T, D]"""
        return (F.gelu(messages) * self.reconstruction_weight).sum(-1) + self.reconstruction_bias

    def classify(
        self, states: Tensor, real: Tensor, static: Tensor, summary: Tensor | None = None, hours: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Attention over the real steps, then the classifier (with the running summary at the last real step, and
        with ``hours_input`` the hours at which the risk is asked).

        states [B, T, H], real [B, T], static [B, S], summary [B, 8 D] or None, hours [B] -> logits [B], weights [B, T]
        """
        context, temporal_weights = self.temporal_attention(states, real)
        return self.classifier_head(context, static, summary, hours), temporal_weights

    def classifier_head(self, context: Tensor, static: Tensor, summary: Tensor | None, hours: Tensor | None) -> Tensor:
        """The classifier over the pooled state and what the config adds beside it. context [P, H] -> logits [P]"""
        if summary is not None:
            context = torch.cat([context, self.summary_branch(summary)], dim=-1)
        if self.config.use_static:
            context = torch.cat([context, static], dim=-1)
        if self.config.hours_input:
            context = torch.cat([context, torch.log1p(hours.clamp(min=0))[:, None].to(context.dtype)], dim=-1)
        return self.classifier(context)[:, 0] + self.logit_offset

    def classify_queries(
        self, states: Tensor, real: Tensor, static: Tensor, summaries: Tensor | None, queries: Queries
    ) -> Tensor:
        """The risk at each prediction time of ``queries``: ``classify`` of its stay cut after the steps it sees,
        all at once (the layers before are causal: a stay's step states are its prefixes' step states). A time
        before the stay's first step sees no state and no summary: zeros, and its static features.

        states [B, T, H], real [B, T], static [B, S], summaries [B, T, 8 D] or None -> logits [P]
        """
        last = (queries.steps - 1).clamp(min=0)
        # where, not a product: a stay without any real step attends over nothing (NaN), and NaN x 0 is NaN
        seen = (queries.steps > 0)[:, None]
        context = torch.where(seen, self.temporal_attention.up_to_each_step(states, real)[queries.stay, last], 0.0)
        summary = None if summaries is None else torch.where(seen, summaries[queries.stay, last], 0.0)
        return self.classifier_head(context, static[queries.stay], summary, queries.time)

    def forward(
        self,
        values: Tensor,
        mask: Tensor,
        times: Tensor,
        lengths: Tensor,
        static: Tensor,
        queries: Queries | None = None,
    ) -> GarlicOutput:
        """Everything, for training and explanations: ``encode`` and ``classify`` with the reconstruction head, except
        that ``per_step`` runs on chunks of stays (``in_chunks``) and the running summary is computed at the last step
        alone (``RunningSummary.at_end``), the one step the classifier reads. With ``queries``, the logits are those
        of its prediction times (``classify_queries``), and the attention still the whole stay's.

        values, mask [B, T, D], times [B, T], lengths [B], static [B, S] -> GarlicOutput
        """
        real = step_mask(lengths, values.shape[1])
        parts = [self.per_step(*chunk) for chunk in self.in_chunks(values, mask, times)]
        steps = PerStep(*(torch.cat(part) for part in zip(*(vars(p).values() for p in parts))))
        states, _ = self.sequence(steps.sequence_input)
        summary = self.running_summary.at_end(values, mask, times, lengths) if self.config.summary_branch else None
        logits, temporal_weights = self.classify(states, real, static, summary, last_step_times(times, lengths))
        if queries is not None:
            logits = self.classify_queries(states, real, static, self.summaries(values, mask, times), queries)
        return GarlicOutput(
            **vars(steps),
            states=states,
            summary=summary,
            reconstruction=self.reconstruct(steps.messages),
            logits=logits,
            temporal_attention=temporal_weights,
            step_mask=real,
        )

    def in_chunks(self, values: Tensor, mask: Tensor, times: Tensor, chunk_cells: int = CACHE_CELLS):
        """(values, mask, times) of a few stays at a time on a CPU, about ``chunk_cells`` cells of [b, T, D, F] each,
        so that ``per_step``'s many elementwise passes, forward and backward, stay in the cache; a GPU takes the batch
        at once. Per-step work is per stay, so the chunks give what the whole batch gives."""
        stays = len(values)
        if values.device.type == "cpu" and stays > 1:
            per_chunk = max(1, chunk_cells // (values.shape[1] * values.shape[2] * self.config.feature_dim))
            chunks = -(-stays // per_chunk)
            stays = -(-stays // chunks)  # chunks of even size: 4 of 16 stays, not 3 of 21 and 1 of 1
        return zip(values.split(max(stays, 1)), mask.split(max(stays, 1)), times.split(max(stays, 1)))

    def predict_logits(
        self,
        values: Tensor,
        mask: Tensor,
        times: Tensor,
        lengths: Tensor,
        static: Tensor,
        queries: Queries | None = None,
        chunk_cells: int = CACHE_CELLS,
    ) -> Tensor:
        """``forward(...).logits`` without the reconstruction head and the attention: the inference path.

        ``per_step`` on chunks of stays (``in_chunks``), the GRU over the whole batch, then ``classify`` (or
        ``classify_queries``: a logit per prediction time).
        """
        chunks = self.in_chunks(values, mask, times, chunk_cells)
        states, _ = self.sequence(torch.cat([self.per_step(*chunk).sequence_input for chunk in chunks]))
        if queries is not None:
            real = step_mask(lengths, values.shape[1])
            return self.classify_queries(states, real, static, self.summaries(values, mask, times), queries)
        summary = self.running_summary.at_end(values, mask, times, lengths) if self.config.summary_branch else None
        real = step_mask(lengths, values.shape[1])
        logits, _ = self.classify(states, real, static, summary, last_step_times(times, lengths))
        return logits


def last_step_times(times: Tensor, lengths: Tensor) -> Tensor:
    """The time of each stay's last real step, when its whole input is in (0 for a stay without steps).

    times [B, T], lengths [B] -> [B]"""
    return times.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0] * (lengths > 0)


def reconstruction_loss(output: GarlicOutput, values: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error over observed cells of real steps that have a past to reconstruct from."""
    has_past = output.step_mask.clone()
    has_past[:, 0] = False
    weight = mask * has_past[:, :, None]
    return ((output.reconstruction - values) ** 2 * weight).sum() / weight.sum().clamp(min=1.0)


def graph_penalty(model: Garlic) -> Tensor:
    """L1 norm of the learned adjacency (0 when the graph is fixed)."""
    adjacency = model.graph.adjacency
    return adjacency.abs().sum() if isinstance(adjacency, nn.Parameter) else adjacency.new_zeros(())
