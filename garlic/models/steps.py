"""GARLIC's compact model (``garlic.models.compact.Garlic``) one step at a time: the risk of a stay after a new step,
and its built-in signal importance, from a state of what the next step needs instead of the whole stay again.

Every layer before the temporal pooling sees a step and earlier ones only, and the pooling's softmax has a score per
step from that step's state alone; so a stay's risk after step t follows from (shapes as in ``compact``; B stays,
L = 2 GRU layers):

    decay carry       each variable's last observed value, its time and whether it was seen        [B, D] x 3
    lag window        the encoded features h of the previous W steps, for ``LagAttention``         [B, W, D, F]
    GRU               the hidden state of each layer                                               [B, L, H]
    pooling           an online softmax (in float64, as ``TemporalAttention.up_to_each_step``):
                      m = max_s a_s,  S = sum_s e^{a_s - m},  P = sum_s e^{a_s - m} h_s,  context P / S
                                                                                                   [B], [B], [B, H]
    running summary   first, lowest, highest, sum and count of each variable's observations       [B, D] x 5
                      (the last value and its time are the decay carry's); under ``summary_branch``
    time              of the last step, and how many steps were taken                              [B] x 2

and, for the built-in explanation (``explain``), the importance of the steps so far. ``garlic.explain.built_in``
gives each observed cell the importance that the temporal weight c_t of the step t' that used it sends there; summed
over time (the signal importance), variable d gets sum_t' c_t' u_{t',d} over the total, with u from step t' and the
W steps before it alone:

    u_{t,d} = b_{t,d} o_{t,d} k_{t,d} + r_{t,d} sum_w a_{t,w,d} k_{t-W+w,d},   r_t = (b_t (1 - o_t)) N^T

b the signal attention, o the own share |h| / (|h| + |g|), N the normalised graph (``normalised_adjacency``), a the
lag attention, and k_{s,d} = m_{s,d} + (1 - m_{s,d}) g_{s,d} the share of cell (s, d)'s importance that lands on an
observation: all of it where observed, the decay weight g (carried to the variable's last observation) where not.
So the state keeps k for the lag window [B, W, D] and V = sum_s e^{a_s - m} u_s [B, D] beside P; the signal
importance is V / sum_d V_d, as the explanation's of the stay cut after the step.

``start`` makes the state before any step, ``advance`` takes one step (values and mask normalised as the model's
input, ``garlic.data.batches.IrregularDataset``), ``logits`` and ``signal_importance`` read it. A state is a batch:
``select`` and ``place`` read and write some of its stays, ``packed`` and ``unpacked`` turn it into one row of numbers
per stay and back. Equal to the one pass on the same prefix to float
rounding (tests/test_live_steps.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor

from garlic.models.compact import Garlic, RunningSummary, normalised_adjacency


@dataclass
class StepState:
    """The state of B stays after their steps so far (``start``, ``advance``); fields batch first."""

    steps: Tensor  # [B] long: steps taken
    time: Tensor  # [B] hours of the last step
    last_value: Tensor  # [B, D] the variable's last observed value (normalised), 0 before it was seen
    last_time: Tensor  # [B, D] the hours of that observation
    seen: Tensor  # [B, D] 1.0 once observed
    past: Tensor  # [B, W, D, F] the encoded features of the previous W steps (position w: step t - W + w)
    past_kept: Tensor  # [B, W, D] k of the same cells: the share of their importance that lands on an observation
    past_real: Tensor  # [B, W] bool: whether position w holds a step
    hidden: Tensor  # [B, L, H] the GRU's state of each layer
    score_max: Tensor  # [B] float64: the highest temporal score a_s so far (-inf before the first step)
    score_sum: Tensor  # [B] float64: sum_s e^{a_s - max}
    pooled: Tensor  # [B, H] float64: sum_s e^{a_s - max} h_s
    importance: Tensor  # [B, D] float64: sum_s e^{a_s - max} u_s (zeros unless ``advance`` is asked to ``explain``)
    first: Tensor  # [B, D] the running summary's first observed value
    low: Tensor  # [B, D] lowest (the dtype's largest number before the first)
    high: Tensor  # [B, D] highest (its lowest before the first)
    total: Tensor  # [B, D] sum of the observed values
    count: Tensor  # [B, D] number of observations


def packed(state: StepState) -> Tensor:
    """``state`` as one float64 row per stay, every field flattened in turn [B, N]: exactly (float32 values, counts,
    flags and -inf are all float64 numbers), so that a stay kept on its own is one tensor, not one per field."""
    parts = [getattr(state, f.name) for f in fields(StepState)]
    return torch.cat([part.reshape(len(part), math.prod(part.shape[1:])).double() for part in parts], dim=1)


def unpacked(model: Garlic, rows: Tensor) -> StepState:
    """The state whose ``packed`` rows are ``rows`` [B, N], for ``model``."""
    template, at, parts = start(model, 0), 0, []
    for f in fields(StepState):
        like = getattr(template, f.name)
        size = math.prod(like.shape[1:])
        parts.append(rows[:, at : at + size].reshape(len(rows), *like.shape[1:]).to(like.dtype))
        at += size
    return StepState(*parts)


def select(state: StepState, index: Tensor) -> StepState:
    """The stays at ``index`` [K] (long) of ``state``, copied."""
    return StepState(*(getattr(state, f.name).index_select(0, index) for f in fields(StepState)))


def place(state: StepState, index: Tensor, chosen: StepState) -> None:
    """Write the stays of ``chosen`` over the stays at ``index`` [K] of ``state``, in place."""
    for f in fields(StepState):
        getattr(state, f.name).index_copy_(0, index, getattr(chosen, f.name))


def start(model: Garlic, stays: int = 1) -> StepState:
    """The state of ``stays`` stays before their first step, on the model's device."""
    parameter = next(model.parameters())
    d, w = model.num_variables, model.config.window_size
    f, h = model.config.feature_dim, model.config.hidden_dim
    layers = getattr(model.sequence, "num_layers", 1)

    def zeros(*shape, dtype=parameter.dtype):
        return torch.zeros(*shape, dtype=dtype, device=parameter.device)

    largest = torch.finfo(parameter.dtype).max
    return StepState(
        steps=zeros(stays, dtype=torch.long),
        time=zeros(stays),
        last_value=zeros(stays, d),
        last_time=zeros(stays, d),
        seen=zeros(stays, d),
        past=zeros(stays, w, d, f),
        past_kept=zeros(stays, w, d),
        past_real=zeros(stays, w, dtype=torch.bool),
        hidden=zeros(stays, layers, h),
        score_max=torch.full((stays,), float("-inf"), dtype=torch.float64, device=parameter.device),
        score_sum=zeros(stays, dtype=torch.float64),
        pooled=zeros(stays, h, dtype=torch.float64),
        importance=zeros(stays, d, dtype=torch.float64),
        first=zeros(stays, d),
        low=zeros(stays, d) + largest,
        high=zeros(stays, d) - largest,
        total=zeros(stays, d),
        count=zeros(stays, d),
    )


@torch.no_grad()
def advance(
    model: Garlic, state: StepState, values: Tensor, mask: Tensor, time: Tensor, explain: bool = False
) -> StepState:
    """``state`` after one more step of each stay: its values (normalised, 0 where not observed), mask [B, D] and
    hours [B]; with ``explain``, the signal importance kept up too. The model must be in eval mode."""
    # 1. The decay carry (DecayImputation), from the state's last observations.
    decay = model.decay
    gap = time[:, None] - state.last_time
    carried = (
        torch.exp(-F.relu(decay.rate * gap + decay.offset)) * state.seen if decay.enabled else torch.zeros_like(mask)
    )
    imputed = mask * values + (1 - mask) * carried * state.last_value
    features = model.encoder(imputed[:, None], mask[:, None])  # [B, 1, D, F]
    # 2. The lag attention over the window, then the rest of the step as ``per_step`` runs it.
    summary, lag_weights = model.lag_attention.at_step(state.past, state.past_real)
    step = model.after_lags(features, summary[:, None], lag_weights[:, None])
    # 3. The GRU from its kept state; the pooling's online softmax.
    if model.config.use_gru:
        output, hidden = model.sequence(step.sequence_input, state.hidden.transpose(0, 1).contiguous())
        hidden = hidden.transpose(0, 1)
    else:
        output, hidden = model.sequence(step.sequence_input)[0], state.hidden
    score = model.temporal_attention.scores(output[:, 0]).double()
    score_max = torch.maximum(state.score_max, score)
    earlier, now = torch.exp(state.score_max - score_max), torch.exp(score - score_max)
    kept = mask + (1 - mask) * carried  # k_t
    importance = state.importance * earlier[:, None]
    if explain:
        signal = step.signal_attention[:, 0]  # [B, D]
        own, message = step.features[:, 0].norm(dim=-1), step.messages[:, 0].norm(dim=-1)
        own_share = own / (own + message).clamp(min=1e-12)
        sent = (signal * (1 - own_share)) @ normalised_adjacency(model.graph.adjacency).T
        cell = signal * own_share * kept + sent * (lag_weights * state.past_kept).sum(1)
        importance = importance + now[:, None] * cell.double()
    observed = mask.bool()
    return StepState(
        steps=state.steps + 1,
        time=time,
        last_value=torch.where(observed, values, state.last_value),
        last_time=torch.where(observed, time[:, None], state.last_time),
        seen=torch.maximum(state.seen, mask),
        past=torch.cat([state.past[:, 1:], features], dim=1),
        past_kept=torch.cat([state.past_kept[:, 1:], kept[:, None]], dim=1),
        past_real=torch.cat([state.past_real[:, 1:], torch.ones_like(state.past_real[:, :1])], dim=1),
        hidden=hidden,
        score_max=score_max,
        score_sum=state.score_sum * earlier + now,
        pooled=state.pooled * earlier[:, None] + now[:, None] * output[:, 0].double(),
        importance=importance,
        first=torch.where(observed & (state.seen == 0), values, state.first),
        low=torch.where(observed, torch.minimum(state.low, values), state.low),
        high=torch.where(observed, torch.maximum(state.high, values), state.high),
        total=state.total + values * mask,
        count=state.count + mask,
    )


@torch.no_grad()
def logits(model: Garlic, state: StepState, static: Tensor, hours: Tensor | None = None) -> Tensor:
    """The logit of each stay cut after its last step (``Garlic.predict_logits``), with its normalised static
    features [B, S]; ``hours`` (``hours_input``) default to the last step's. A stay without a step has none."""
    context = (state.pooled / state.score_sum.clamp(min=torch.finfo(torch.float64).tiny)[:, None]).to(static.dtype)
    summary = None
    if model.config.summary_branch:  # ``RunningSummary.at_end`` from the running statistics
        seen = state.count > 0
        mean = state.total / state.count.clamp(min=1)
        summary = RunningSummary.stacked(
            [state.first, state.last_value, state.low, state.high, mean],
            state.count,
            state.time[:, None] - state.last_time,
            seen,
        )
    return model.classifier_head(context, static, summary, state.time if hours is None else hours)


def signal_importance(state: StepState) -> Tensor:
    """Each variable's built-in signal importance over the steps so far (``advance`` with ``explain``), summing to 1
    per stay (zeros where nothing has any). [B, D]"""
    total = state.importance.sum(-1, keepdim=True)
    return torch.where(total > 0, state.importance / total.clamp(min=1e-300), state.importance).float()
