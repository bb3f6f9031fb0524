"""GARLIC as the reference code computes it (github SCAI-Lab/GARLIC, ``model.py``), vectorised: architecture=reference.

``garlic.models.compact.Garlic`` (``architecture=compact``) is a compact reading of the paper. This module computes what the
authors' code computes, layer for layer, but over whole tensors: no loop over variables or time steps, only over
the W positions of a window (a handful). Read top to bottom:

1. ``ReferenceDecay``: x' = m x + (1 - m) (g x_last + (1 - g) mean), g = exp(-max(0, w_d gap / scale + b_d)), where
   ``gap`` runs, as in the reference, from the step *before* the variable's last observation (from the stay's first
   step when it was never observed). ``PerVariableEncoder``: per variable its own Linear(2, F) -> ReLU ->
   Linear(F, F) on (imputed value, mask).
2. ``WindowAttention``: windows of the W steps t - W + 1 .. t (stride 1, one window ending at each step t >= W - 1),
   a sinusoidal encoding of the position in the window added, then per variable (own Q, K, V of size F) softmax
   attention over the W positions, the output summed over the query positions. ``ReferenceGraph``: messages
   m_j = sum_i A_ij s_i over a learned dense A (I + 0.2, L1-penalised); the reconstruction head Linear(F, F) ->
   ReLU -> Linear(F, 1) reads each variable's message and predicts the (imputed) value at the window's last step.
3. ``SignalAttention``: attention (Q, K, V of size F, sinusoidal encoding of the variable index) among D items,
   summed over the query items into one F-vector. A 2-layer GRU (F -> H) runs over those vectors,
   ``TemporalAttention`` (Q, K, V of size H, sinusoidal encoding of the window index) sums over the real windows,
   and a classifier Linear(H, H) -> ReLU -> Linear(H, 1) gives the logit.

``signal_layout`` says what the D items of the signal attention are:
- ``variables`` (the default; the paper's meaning): the D variables of one window. The GRU runs over the windows.
- ``code`` (what the reference code computes, and what made the paper's numbers): the reference reshapes the
  messages [B, D, L, F] to [B * L, D, F] without a permute, so its "step" c attends over the items c D .. c D + D - 1
  of the variable-major sequence (variable 0's L windows, then variable 1's, ...): about D neighbouring windows of
  mostly one variable. The GRU runs over these L chunks, and the temporal attention pools them, all of them, as in
  the reference. The stays are padded (empty steps, time 0) to ``padded_length`` first, the data set's length, as
  the reference pads every stay to it; otherwise the chunks would depend on the batch. A chunk mixes windows of all
  times, so this layout is not causal: no per-step encoding, no risk curve, no built-in explanation.

What made the reference's risk depend on the other stays of its batch, fixed here:
- the decay gap was divided by the batch's largest gap: here by ``gap_scale``, the training split's longest stay in
  hours (what that largest gap is on a batch of any size), set by ``prepare`` and saved with the weights;
- the decay's mean was the stay's mean over all its padded steps, zeros at missing cells included, so it depends
  on how far the stay is padded (in batches cut to their longest stay: on the batch): here the mean of the stay's
  own observations of the variable up to the step (0, the training mean, before the first), which also keeps every
  step causal;
- padded steps went through the attention over time: here (``variables``) the temporal attention reads the real
  windows only, as keys and as the queries it sums over. ``code`` keeps them, but pads to the fixed
  ``padded_length``, so they are the same in every batch.
The paper's ablations switch modules off as in ``garlic.models.compact`` (the same config switches):
``use_decay=false`` leaves a missing cell at 0, the training mean (x' = m x); ``use_missing_indicator=false``
drops the mask from the encoder's input; ``per_variable_encoder=false`` shares one encoder among all variables;
``use_graph=false`` fixes A at I (each variable keeps its own summary); ``use_gru=false`` maps each window (or
chunk) on its own, h = tanh(W u + b), where the GRU would carry the past. ``alternating=false`` is the schedule's.

Other departures, smaller: a stay shorter than W has no window, so its context is 0 (the reference would fill its
window with padding); windows exist from step W - 1 on, as in the reference. The reconstruction target, the
value at the window's last step, lies inside the window, in the reference too: the head can learn to copy.
The reference reads no static features and has no dropout; neither does this model.

Shapes: B stays, T steps, D variables, F ``feature_dim``, W ``window_size``, H ``hidden_dim``, L windows (T - W + 1).
Per-step outputs are laid out over the T steps, a window at the step where it ends; steps before W - 1 hold zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from garlic.config import ConfigError
from garlic.models.compact import (
    CACHE_CELLS,
    DecayImputation,
    StepwiseProjection,
    add_adjacency,
    last_observed,
    step_mask,
)
from garlic.models.fused import FusedGRU
from garlic.models.network_config import NetworkConfig

SIGNAL_LAYOUTS = ("variables", "code")
# Compact-model switches the reference has no counterpart for; they must stay at their defaults.
COMPACT_ONLY = ("use_static", "summary_branch", "hours_input")
EXPLANATION_UNSUPPORTED = (
    "the built-in explanation (garlic.explain.built_in) is not defined for architecture=reference: it splits each step's "
    "representation into the variable's own features and the graph messages, and the reference reads the messages "
    "alone, over windows that include the current step; use the integrated gradients of garlic.explain.integrated_gradients"
)


def sinusoid(positions: int, dim: int, device: torch.device | None = None) -> Tensor:
    """The Transformer's sinusoidal encoding [positions, dim]: sin at even features, cos at odd ones."""
    position = torch.arange(positions, dtype=torch.float32, device=device)[:, None]
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / dim))
    encoding = torch.zeros(positions, dim, device=device)
    encoding[:, 0::2] = torch.sin(position * frequency)
    encoding[:, 1::2] = torch.cos(position * frequency)[:, : dim // 2]
    return encoding


def uniform(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
    """nn.Linear's default initialisation U(-1/sqrt(fan_in), 1/sqrt(fan_in)), for stacked per-variable weights."""
    bound = 1 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


class ReferenceDecay(DecayImputation):
    """Decay imputation as in the reference, without its dependence on the batch (see the module docstring): the
    compact model's parameters (a rate and an offset per variable), the reference's formula. Not ``enabled`` (the
    ablation): x' = m x, a missing cell at 0, the training mean. Same shapes as ``DecayImputation``.
    """

    def __init__(self, num_variables: int, enabled: bool = True):
        super().__init__(num_variables, enabled)
        self.register_buffer("gap_scale", torch.tensor(48.0))  # hours; ``prepare`` sets it from training data

    def forward(self, values: Tensor, mask: Tensor, times: Tensor) -> Tensor:
        if not self.enabled:
            return mask * values
        last = last_observed(mask)  # -1 before the first observation
        start = (last - 1).clamp(min=0)  # the reference accumulates the gap from the step before the observation
        gap = times[:, :, None] - times[:, :, None].expand_as(mask).gather(1, start)
        # The reference also clamps at 1000, where exp(-x) is already 0 in float32.
        decay = torch.exp(-F.relu(self.rate * gap / self.gap_scale + self.offset))
        carried = values.gather(1, last.clamp(min=0))  # 0 before the first observation: values are 0 where missing
        mean = (values * mask).cumsum(1) / mask.cumsum(1).clamp(min=1.0)
        return mask * values + (1 - mask) * (decay * carried + (1 - decay) * mean)


class PerVariableEncoder(nn.Module):
    """Per variable d: Linear(2, F) -> ReLU -> Linear(F, F) on (value, mask), weights of its own (one set shared by
    all variables when not ``per_variable``). Without ``use_mask`` the mask's input is left out, so that the features
    see the (imputed) value alone.

    values, mask [B, T, D] -> features [B, T, D, F]
    """

    def __init__(self, num_variables: int, feature_dim: int, per_variable: bool = True, use_mask: bool = True):
        super().__init__()
        d, f = num_variables if per_variable else 1, feature_dim
        self.use_mask = use_mask
        self.weight_in, self.bias_in = uniform((d, 2, f), 2), uniform((d, f), 2)
        self.weight_out, self.bias_out = uniform((d, f, f), f), uniform((d, f), f)

    def forward(self, values: Tensor, mask: Tensor) -> Tensor:
        hidden = torch.addcmul(self.bias_in, values[..., None], self.weight_in[:, 0])
        if self.use_mask:
            hidden.addcmul_(mask[..., None], self.weight_in[:, 1])
        weight_out = self.weight_out.expand(values.shape[-1], -1, -1)  # a view: a shared set serves every variable
        return torch.einsum("btdf,dfg->btdg", F.relu(hidden), weight_out) + self.bias_out


class PerVariableLinear(nn.Module):
    """The weights of y_d = x_d W_d + b_d, a Linear(F, F) of its own for each variable d: weight [D, F, F], bias
    [D, F]. ``WindowAttention`` applies its query, key and value ones together, in one product."""

    def __init__(self, num_variables: int, feature_dim: int):
        super().__init__()
        self.weight = uniform((num_variables, feature_dim, feature_dim), feature_dim)
        self.bias = uniform((num_variables, feature_dim), feature_dim)


class WindowAttention(nn.Module):
    """Per-variable attention inside each window of W steps, summed over the window's (query) positions.

    For the window ending at step t: x_w = features[t - W + 1 + w] + pe[w]; q, k, v = per-variable projections;
    a = softmax(q k^T / sqrt(F)) over the key positions; summary = sum_w sum_u a[w, u] v[u].

    features [B, T, D, F] (T >= W) -> summary [B, L, D, F], weights [B, L, D, W, W] (query, key)
    """

    def __init__(self, num_variables: int, feature_dim: int, window_size: int):
        super().__init__()
        self.window_size = window_size
        self.query = PerVariableLinear(num_variables, feature_dim)
        self.key = PerVariableLinear(num_variables, feature_dim)
        self.value = PerVariableLinear(num_variables, feature_dim)
        self.register_buffer("position", sinusoid(window_size, feature_dim))  # [W, F]

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        batch, steps, variables, dim = features.shape
        window = self.window_size
        windows = steps - window + 1
        projections = (self.query, self.key, self.value)
        # The projections are affine: project each step once, and the encoding once per position, then add them.
        # One product for Q, K and V, laid out [.., F, D]: the dot products over F below then reduce a middle axis,
        # with the D variables innermost, many times faster than over a last axis of F.
        weight = torch.cat([p.weight for p in projections], dim=-1)  # [D, F, 3F]
        bias = torch.cat([p.bias for p in projections], dim=-1)  # [D, 3F]
        flat = features.reshape(batch * steps, variables, dim).transpose(0, 1)  # [D, B T, F]
        projected = (torch.bmm(flat, weight) + bias[:, None]).permute(1, 2, 0)  # [B T, 3F, D]
        projected = projected.contiguous().view(batch, steps, 3 * dim, variables)
        step_query, step_key, step_value = projected.split(dim, dim=2)  # [B, T, F, D] each
        position = torch.einsum("wf,dfg->wgd", self.position, weight)  # [W, 3F, D]
        position_query, position_key, position_value = position.split(dim, dim=1)
        # Each window's steps, [B, L, F, D, W] (unfold's views), with their positions' encodings added.
        queries = step_query.unfold(1, window, 1) + position_query.permute(1, 2, 0)
        keys = step_key.unfold(1, window, 1) + position_key.permute(1, 2, 0)
        # [B, L, key, query, D], one batched product over F (its W x W dot products one by one took twice as long,
        # backward included); the softmax runs over a middle axis, many times faster than over a last one of W.
        scores = torch.einsum("blfdu,blfdw->bluwd", keys, queries)
        weights = torch.softmax(scores / math.sqrt(dim), dim=2)
        # sum_w sum_u a[w, u] v[u] = sum_u (sum_w a[w, u]) v[u]
        column = weights.sum(3)  # [B, L, key, D]
        summary = (column[:, :, :, None] * position_value).sum(2)  # [B, L, F, D], the encoding's share
        for u in range(window):  # added in place: no temporary [B, L, F, D] per position
            summary.addcmul_(column[:, :, u, None], step_value[:, u : u + windows])
        return summary.transpose(2, 3), weights.permute(0, 1, 4, 3, 2)


class ReferenceGraph(nn.Module):
    """m_j = sum_i A_ij s_i over a learned dense graph A = I + 0.2 at first (fixed at I when not ``learn_graph``),
    and the reconstruction head on m_j.

    A's row is the source and its column the target, as in ``garlic.models.compact``; the reference stores the transpose
    (``matmul(adj, x)``), which starts equal and has the same L1 norm.

    summary [B, L, D, F] -> messages [B, L, D, F]; ``reconstruct``: messages -> [B, L, D]
    """

    def __init__(self, num_variables: int, feature_dim: int, learn_graph: bool = True):
        super().__init__()
        add_adjacency(self, num_variables, learn_graph)
        self.head = nn.Sequential(nn.Linear(feature_dim, feature_dim), nn.ReLU(), nn.Linear(feature_dim, 1))

    def forward(self, summary: Tensor) -> Tensor:
        return torch.einsum("blif,ij->bljf", summary, self.adjacency)

    def reconstruct(self, messages: Tensor) -> Tensor:
        return self.head(messages)[..., 0]


class SignalAttention(nn.Module):
    """Attention among the D items of a group, summed over the queries. ``encode`` adds the sinusoidal encoding of
    the variable index to the messages first: the reference adds it per variable before it groups the items.

    items [G, D, F] -> pooled [G, F], weights [G, D, D] (query, key)
    """

    def __init__(self, num_items: int, feature_dim: int):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(feature_dim, feature_dim) for _ in range(3))
        self.register_buffer("position", sinusoid(num_items, feature_dim))

    def encode(self, messages: Tensor) -> Tensor:
        """messages [B, L, D, F] -> the same plus the encoding of each variable's index"""
        return messages + self.position

    def forward(self, items: Tensor) -> tuple[Tensor, Tensor]:
        # [G, key, query]: the softmax over the middle axis is much faster than over a last one of D; the scale goes
        # on the [G, D, F] queries rather than on the [G, D, D] scores.
        scores = self.key(items) @ (self.query(items) / math.sqrt(items.shape[-1])).transpose(-1, -2)
        weights = torch.softmax(scores, dim=1)
        return weights.sum(2)[:, None, :].bmm(self.value(items))[:, 0], weights.transpose(1, 2)


class TemporalAttention(nn.Module):
    """Self-attention over the windows (sinusoidal encoding of the window index), summed over the real queries.

    states [B, L, H], real [B, L] -> context [B, H], weights [B, L, L] (query, key; 0 at padded keys and queries)
    """

    def __init__(self, hidden_dim: int):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(hidden_dim, hidden_dim) for _ in range(3))

    def forward(self, states: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
        states = states + sinusoid(states.shape[1], states.shape[2], states.device)
        scores = self.query(states) @ self.key(states).transpose(-1, -2) / math.sqrt(states.shape[-1])
        weights = torch.softmax(scores.masked_fill(~real[:, None, :], float("-inf")), dim=-1).nan_to_num(0.0)
        weights = weights * real[:, :, None]
        return weights.sum(1)[:, None, :].matmul(self.value(states))[:, 0], weights


@dataclass
class ReferenceOutput:
    """What the reference model computes. Per-step fields are over the T steps (a window where it ends) for
    ``signal_layout=variables``; with ``code``, ``states`` and ``temporal_attention`` are over the L chunks of the
    padded stay and ``signal_attention`` is per chunk item [B, L, D]."""

    imputed: Tensor  # [B, T, D]
    messages: Tensor  # [B, T, D, F]
    lag_attention: Tensor  # [B, T, W, D] weight of step t - W + 1 + w in the window ending at t (mean over queries)
    signal_attention: Tensor  # [B, T, D] weight of each variable (mean over queries; sums to 1 where a window is)
    states: Tensor  # [B, T, H] the GRU's state after each window
    reconstruction: Tensor  # [B, T, D] predicted values at the windows' last steps (0 before step W - 1)
    logits: Tensor  # [B]
    temporal_attention: Tensor  # [B, T] weight of each window (mean over the real queries; sums to 1 over them)
    step_mask: Tensor  # [B, T] True for real steps

    @property
    def features(self) -> Tensor:
        raise NotImplementedError(EXPLANATION_UNSUPPORTED)


class ReferenceGarlic(nn.Module):
    """The reference code's GARLIC. ``prediction_parameters()`` are the reference's prediction group (signal and
    temporal attention, GRU, classifier); everything else is its reconstruction group."""

    PREDICTION_MODULES = ("signal_attention", "sequence", "temporal_attention", "classifier")
    explanation_unavailable = EXPLANATION_UNSUPPORTED  # as ``Garlic.explanation_unavailable``

    def __init__(self, num_variables: int, num_static: int, config: NetworkConfig):
        super().__init__()
        if config.signal_layout not in SIGNAL_LAYOUTS:
            raise ConfigError(f"signal_layout must be one of {', '.join(SIGNAL_LAYOUTS)}, got {config.signal_layout!r}")
        changed = [name for name in COMPACT_ONLY if getattr(config, name) != getattr(NetworkConfig, name)]
        if changed:
            raise ConfigError(f"architecture=reference has no switch {', '.join(changed)}: leave it at its default")
        d, f, h = num_variables, config.feature_dim, config.hidden_dim
        self.config = config
        self.num_variables, self.num_static = num_variables, num_static
        self.window_size = config.window_size
        self.decay = ReferenceDecay(d, enabled=config.use_decay)
        self.encoder = PerVariableEncoder(d, f, config.per_variable_encoder, config.use_missing_indicator)
        self.lag_attention = WindowAttention(d, f, config.window_size)
        self.graph = ReferenceGraph(d, f, learn_graph=config.use_graph)
        self.signal_attention = SignalAttention(d, f)
        self.sequence = FusedGRU(f, h, num_layers=2, batch_first=True) if config.use_gru else StepwiseProjection(f, h)
        self.temporal_attention = TemporalAttention(h)
        self.classifier = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))
        self.register_buffer("logit_offset", torch.zeros(()))  # as in ``Garlic``: set by ``balance_classes``
        # Every stay padded to this many steps (the data set's length, set by ``prepare``), as the reference
        # does: the chunks of ``signal_layout=code`` and the mask mean of the reconstruction loss count them.
        self.register_buffer("padded_length", torch.tensor(0))

    def prediction_parameters(self) -> list[nn.Parameter]:
        return [p for name in self.PREDICTION_MODULES for p in getattr(self, name).parameters()]

    def reconstruction_parameters(self) -> list[nn.Parameter]:
        prediction = {id(p) for p in self.prediction_parameters()}
        return [p for p in self.parameters() if id(p) not in prediction]

    @torch.no_grad()
    def prepare(self, times: Tensor, lengths: Tensor) -> None:
        """Set the decay's gap scale (the longest stay, in hours) and the padded length from the training stays.

        times [N, T], lengths [N]
        """
        last = times.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
        longest = float((last - times[:, 0]).max()) if len(times) else 0.0
        self.decay.gap_scale.fill_(longest if longest > 0 else 1.0)
        self.padded_length.fill_(times.shape[1])

    def windows(self, values: Tensor, mask: Tensor, times: Tensor) -> tuple[Tensor, ...]:
        """Stages 1 and 2: imputed [B, T, D], window attention weights [B, L, D, W, W], messages [B, L, D, F].

        A batch shorter than W is padded with empty steps to one window (which ends on padding, so it is not real).
        """
        steps = values.shape[1]
        if steps < self.window_size:
            pad = self.window_size - steps
            values, mask = F.pad(values, (0, 0, 0, pad)), F.pad(mask, (0, 0, 0, pad))
            times = F.pad(times[:, None], (0, pad), mode="replicate")[:, 0]
        imputed = self.decay(values, mask, times)
        summary, lag_weights = self.lag_attention(self.encoder(imputed, mask))
        return imputed[:, :steps], lag_weights, self.graph(summary)

    def window_mask(self, lengths: Tensor, steps: int) -> Tensor:
        """[B] -> [B, L]: True for the windows that end at a real step."""
        windows = max(steps - self.window_size + 1, 1)
        ends = torch.arange(windows, device=lengths.device) + self.window_size - 1
        return ends[None, :] < lengths[:, None]

    def by_step(self, windowed: Tensor, steps: int) -> Tensor:
        """[B, L, ...] per window -> [B, T, ...] per step where it ends, zeros before step W - 1."""
        front = windowed.new_zeros(len(windowed), self.window_size - 1, *windowed.shape[2:])
        return torch.cat([front, windowed], dim=1)[:, :steps]

    def encode(self, values: Tensor, mask: Tensor, times: Tensor):
        """Per-step encoding (``signal_layout=variables`` only): ``states`` [B, T, H], each from its step and before."""
        self.require_variables_layout("a per-step encoding")
        return self.run(values, mask, times)[1]

    def run(self, values: Tensor, mask: Tensor, times: Tensor) -> tuple[Tensor, "_Steps"]:
        """All before the temporal attention (``signal_layout=variables``): messages [B, L, D, F] and the rest."""
        steps = values.shape[1]
        imputed, lag_weights, messages = self.windows(values, mask, times)
        batch, windows, variables, features = messages.shape
        items = self.signal_attention.encode(messages).view(batch * windows, variables, features)
        pooled, signal_weights = self.signal_attention(items)
        states, _ = self.sequence(pooled.view(batch, windows, -1))
        return messages, _Steps(
            imputed, lag_weights, signal_weights.view(batch, windows, variables, variables), self.by_step(states, steps)
        )

    def classify(
        self, states: Tensor, real: Tensor, static: Tensor, summary: Tensor | None = None, hours: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """states [B, T, H] per step, real [B, T] -> logits [B], temporal weights [B, L, L] (query, key) over the
        windows, which end at the steps W - 1 .. T - 1. ``static``, ``summary`` (always None: the reference has no
        wide branch) and ``hours`` (unread: it has no ``hours_input``) are there for ``Garlic.classify``'s callers."""
        first = self.window_size - 1
        context, weights = self.temporal_attention(states[:, first:], real[:, first:])
        return self.classifier(context)[:, 0] + self.logit_offset, weights

    def forward(self, values: Tensor, mask: Tensor, times: Tensor, lengths: Tensor, static: Tensor) -> ReferenceOutput:
        """values, mask [B, T, D], times [B, T], lengths [B], static [B, S] (unused) -> ReferenceOutput"""
        if self.config.signal_layout == "code":
            return self.forward_code_layout(values, mask, times, lengths)
        steps = values.shape[1]
        real = step_mask(lengths, steps)
        messages, encoded = self.run(values, mask, times)
        logits, temporal_weights = self.classify(encoded.states, real, static)
        windows = self.window_mask(lengths, steps)
        real_queries = windows.sum(1, keepdim=True).clamp(min=1)
        return ReferenceOutput(
            imputed=encoded.imputed,
            messages=self.by_step(messages, steps),
            lag_attention=self.by_step(encoded.lag_weights.mean(3).transpose(2, 3), steps),
            signal_attention=self.by_step(encoded.signal_weights.mean(2), steps),
            states=encoded.states,
            reconstruction=self.by_step(self.graph.reconstruct(messages), steps),
            logits=logits,
            temporal_attention=self.by_step(temporal_weights.sum(1) / real_queries, steps),
            step_mask=real,
        )

    def forward_code_layout(self, values: Tensor, mask: Tensor, times: Tensor, lengths: Tensor) -> ReferenceOutput:
        """The reference's layout: every stay padded to ``padded_length``, chunks of D items of the variable-major
        sequence of windows into the signal attention, the GRU and the temporal attention over all chunks."""
        steps, padded = values.shape[1], int(self.padded_length)
        length = max(padded, steps)
        if padded and steps > padded:
            raise ValueError(
                f"a batch of {steps} steps is longer than the model's padded length {padded} (the "
                "training data's): signal_layout=code cannot take longer stays"
            )
        real = step_mask(lengths, steps)
        # Past a stay's last step every step is the same empty step (no value, time 0, the same carried value and
        # mean), so every window wholly past it is the same window: compute the windows up to that first one (at
        # most ``steps + 1`` of them) and repeat it to the padded length, not the same window up to ``length`` times.
        computed = min(length, steps + self.window_size)
        values, mask = F.pad(values, (0, 0, 0, computed - steps)), F.pad(mask, (0, 0, 0, computed - steps))
        times = F.pad(times * real, (0, computed - steps))  # padding at time 0, as the reference's data has it
        imputed, lag_weights, messages = self.windows(values, mask, times)
        batch, variables = len(messages), messages.shape[2]
        windows = max(length - self.window_size + 1, 1)  # a stay shorter than W has one window, of padding
        pooled, signal_weights = self.pool_chunks(messages, lengths, windows)
        states, _ = self.sequence(pooled.view(batch, windows, -1))
        every = torch.ones(batch, windows, dtype=torch.bool, device=values.device)
        context, temporal_weights = self.temporal_attention(states, every)
        return ReferenceOutput(
            imputed=imputed[:, :steps],
            messages=self.by_step(messages, steps),
            lag_attention=self.by_step(lag_weights.mean(3).transpose(2, 3), steps),
            signal_attention=signal_weights.view(batch, windows, variables),
            states=states,
            reconstruction=self.by_step(self.graph.reconstruct(messages), steps),
            logits=self.classifier(context)[:, 0] + self.logit_offset,
            temporal_attention=temporal_weights.mean(1),
            step_mask=real,
        )

    def pool_chunks(self, messages: Tensor, lengths: Tensor, windows: int) -> tuple[Tensor, Tensor]:
        """The signal attention over the code layout's chunks of the stays padded to ``windows`` windows: messages
        [B, L', D, F] (each stay's windows up to its first empty one, window ``lengths``) -> pooled [B L, F], each
        item's weight (the mean over the queries) [B L, D].

        Item i of chunk c is item c D + i of the variable-major sequence: variable (c D + i) // L's window
        (c D + i) % L, read at the stay's first empty window when it lies past it, plus the encoding of the variable.
        A chunk whose D items are all one variable's first empty window holds D equal items. Their weights are 1/D
        whatever the scores, so it pools to D v(item), with the same gradients, and its attention is not computed: a
        stay of n windows has about n + D other chunks of the L, so on P12 (L = 212, D = 36, median n 69) this
        skips about half of them.
        """
        batch, _, variables, _ = messages.shape
        position = self.signal_attention.position  # [D, F]
        item = torch.arange(windows * variables, device=lengths.device).view(windows, variables)
        variable, window = item // windows, item % windows  # [L, D] each: what chunk c's item i reads
        empty = (variable[:, 0] == variable[:, -1])[None, :] & (window[None, :, 0] >= lengths[:, None])  # [B, L]
        every_stay = torch.arange(batch, device=lengths.device)
        first_empty = messages[every_stay, lengths.clamp(0, messages.shape[1] - 1)] + position  # [B, D, F]
        pooled = (variables * self.signal_attention.value(first_empty))[:, variable[:, 0]].reshape(batch * windows, -1)
        weights = messages.new_full((batch * windows, variables), 1 / variables)
        stay, chunk = (~empty).nonzero(as_tuple=True)
        if len(stay):
            read = torch.minimum(window[chunk], lengths[stay, None])  # [N, D]
            chunks = messages[stay[:, None], read, variable[chunk]] + position[variable[chunk]]  # [N, D, F]
            computed, computed_weights = self.signal_attention(chunks)
            attended = stay * windows + chunk
            pooled = pooled.index_put((attended,), computed)
            weights = weights.index_put((attended,), computed_weights.mean(1))
        return pooled, weights

    def predict_logits(
        self,
        values: Tensor,
        mask: Tensor,
        times: Tensor,
        lengths: Tensor,
        static: Tensor,
        chunk_cells: int = CACHE_CELLS,
    ) -> Tensor:
        """The logits alone, without the reconstruction head: the inference path. Same arguments as ``forward``.

        On a CPU it runs a few stays at a time, about ``chunk_cells`` cells of [b, T, D, F] each, as
        ``Garlic.predict_logits`` does, so that the many elementwise passes over windows stay in the cache.
        """
        steps, variables = values.shape[1:]
        cells_per_stay = steps * variables * self.config.feature_dim
        stays = max(1, chunk_cells // cells_per_stay) if values.device.type == "cpu" else max(len(values), 1)
        if self.config.signal_layout == "code":
            chunks = zip(values.split(stays), mask.split(stays), times.split(stays), lengths.split(stays))
            return torch.cat([self.forward_code_layout(*chunk).logits for chunk in chunks])
        chunks = zip(values.split(stays), mask.split(stays), times.split(stays))
        states = torch.cat([self.run(*chunk)[1].states for chunk in chunks])
        return self.classify(states, step_mask(lengths, steps), static)[0]

    def reconstruction_loss(self, output: ReferenceOutput, values: Tensor, mask: Tensor) -> Tensor:
        """The reference's loss: the MSE over the observed cells at the windows' last steps, divided by the mean of
        the mask over the batch padded to ``padded_length`` (the share of observed cells). 0 without such cells."""
        counted = mask.clone()
        counted[:, : self.window_size - 1] = 0
        cells = counted.sum()
        squared = ((output.reconstruction - values) ** 2 * counted).sum() / cells.clamp(min=1.0)
        grid = mask.shape[0] * max(int(self.padded_length), mask.shape[1]) * mask.shape[2]
        return squared / (mask.sum() / grid).clamp(min=1e-12) if cells > 0 else squared

    def require_variables_layout(self, what: str) -> None:
        if self.config.signal_layout != "variables":
            raise ValueError(
                f"{what} needs signal_layout=variables: signal_layout=code mixes windows of all times in "
                "each step of its GRU, so no step is a function of the stay's past alone"
            )


@dataclass
class _Steps:
    """``ReferenceGarlic.run``'s per-window results, before they are laid out over the steps."""

    imputed: Tensor  # [B, T, D]
    lag_weights: Tensor  # [B, L, D, W, W]
    signal_weights: Tensor  # [B, L, D, D]
    states: Tensor  # [B, T, H]
    summaries: None = None  # as ``garlic.models.compact.StepEncoding``'s without the wide branch
