import math

import pytest
import torch

from helpers import random_batch
from garlic.config import Config
from garlic.data.batches import Queries
from garlic.models.compact import (
    DecayImputation,
    Garlic,
    GraphMessagePassing,
    LagAttention,
    RunningSummary,
    SignalAttention,
    StepwiseProjection,
    TemporalAttention,
    VariableEncoder,
    at_last_step,
    fast_tanh,
    graph_penalty,
    lag_offsets,
    reconstruction_loss,
    step_mask,
)
from garlic.models.network_config import NetworkConfig

B, T, D, S = 5, 12, 4, 3


def small_model(**overrides) -> Garlic:
    torch.manual_seed(0)
    config = Config(hidden_dim=16, feature_dim=4, window_size=3).override(overrides)
    return Garlic(D, S, NetworkConfig.from_run(config)).eval()


def test_output_shapes_and_normalised_attention():
    values, mask, times, lengths, static = random_batch()
    output = small_model()(values, mask, times, lengths, static)
    assert output.logits.shape == (B,)
    assert output.reconstruction.shape == (B, T, D)
    assert output.lag_attention.shape == (B, T, 3, D)
    assert output.signal_attention.shape == (B, T, D)
    assert output.temporal_attention.shape == (B, T)
    torch.testing.assert_close(output.signal_attention.sum(-1), torch.ones(B, T))
    torch.testing.assert_close(output.temporal_attention.sum(-1), torch.ones(B))
    # No weight on padding steps, and none on lags before the stay began.
    assert (output.temporal_attention[~output.step_mask] == 0).all()
    assert (output.lag_attention[:, 0] == 0).all()
    assert (output.lag_attention[:, 1, :2] == 0).all() and torch.allclose(
        output.lag_attention[:, 1, 2], torch.ones(B, D)
    )


def test_prediction_does_not_depend_on_the_batch():
    values, mask, times, lengths, static = random_batch()
    model = small_model(use_static=True)
    with torch.no_grad():
        together = model(values, mask, times, lengths, static).logits
        torch.testing.assert_close(model.predict_logits(values, mask, times, lengths, static), together)
        # The inference path's chunks of stays (here one stay each) change nothing.
        torch.testing.assert_close(model.predict_logits(values, mask, times, lengths, static, chunk_cells=1), together)
        for i in range(B):
            n = int(lengths[i])
            alone = model(
                values[i : i + 1, :n], mask[i : i + 1, :n], times[i : i + 1, :n], lengths[i : i + 1], static[i : i + 1]
            ).logits
            assert alone.shape == (1,)  # batch size 1 keeps its batch axis
            torch.testing.assert_close(alone[0], together[i], atol=1e-5, rtol=1e-5)
        # Other stays in the batch change nothing either.
        shuffled = torch.tensor([3, 0, 4, 1, 2])
        reordered = model(values[shuffled], mask[shuffled], times[shuffled], lengths[shuffled], static[shuffled])
        torch.testing.assert_close(reordered.logits, together[shuffled], atol=1e-5, rtol=1e-5)


def test_decay_passes_observations_through_and_decays_to_the_mean():
    decay = DecayImputation(2)
    times = torch.tensor([[0.0, 1.0, 2.0, 500.0]])
    mask = torch.tensor([[[1.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]])
    values = torch.tensor([[[2.0, 0.0], [0.0, 0.0], [3.0, 0.0], [0.0, 0.0]]])
    imputed = decay(values, mask, times).detach()
    assert imputed[0, 0, 0] == 2.0 and imputed[0, 2, 0] == 3.0  # observed values pass through
    rate = decay.rate[0].item()
    assert math.isclose(float(imputed[0, 1, 0]), 2.0 * math.exp(-rate * 1.0), rel_tol=1e-5)  # 1 h after a 2.0
    assert abs(float(imputed[0, 3, 0])) < 1e-6  # a very long gap decays to the (normalised) mean, 0
    assert (imputed[0, :, 1] == 0).all()  # never observed: the mean


def test_decay_is_per_stay_not_per_batch():
    decay = DecayImputation(1)
    short = (torch.tensor([[[1.0], [0.0]]]), torch.tensor([[[1.0], [0.0]]]), torch.tensor([[0.0, 1.0]]))
    alone = decay(*short)
    # A stay with a huge gap in the same batch must not rescale this stay's decay.
    values = torch.cat([short[0], torch.tensor([[[5.0], [0.0]]])])
    mask = torch.cat([short[1], torch.tensor([[[1.0], [0.0]]])])
    times = torch.cat([short[2], torch.tensor([[0.0, 300.0]])])
    torch.testing.assert_close(decay(values, mask, times)[:1], alone)


def test_lag_attention_looks_only_at_earlier_steps():
    layer = LagAttention(D, 4, window_size=2)
    features = torch.randn(1, T, D, 4)
    summary, _ = layer(features)
    changed = features.clone()
    changed[0, 6] += 10.0
    changed_summary, _ = layer(changed)
    torch.testing.assert_close(changed_summary[0, :7], summary[0, :7])  # steps up to 6 do not see step 6
    assert not torch.allclose(changed_summary[0, 7], summary[0, 7])


def test_message_passing_sums_weighted_messages_from_every_variable():
    torch.manual_seed(0)
    layer = GraphMessagePassing(D, 4)
    with torch.no_grad():
        layer.adjacency.copy_(torch.randn(D, D))
    summary = torch.randn(B, T, D, 4)
    expected = torch.zeros(B, T, D, 4)
    for j in range(D):  # out_j = sum_i A_ij W s_i, written out
        for i in range(D):
            expected[:, :, j] += layer.adjacency[i, j] * (summary[:, :, i] @ layer.message.weight.T)
    torch.testing.assert_close(layer(summary), expected.detach(), atol=1e-5, rtol=1e-5)


def test_reconstruction_loss_counts_only_observed_cells():
    values, mask, times, lengths, static = random_batch()
    model = small_model()
    output = model(values, mask, times, lengths, static)
    loss = reconstruction_loss(output, values, mask)
    noisy = values + (1 - mask) * 100.0  # garbage where nothing was observed
    assert torch.isclose(reconstruction_loss(output, noisy, mask), loss)


def test_parameter_groups_partition_the_model_and_ablations_build():
    model = small_model()
    prediction = {id(p) for p in model.prediction_parameters()}
    reconstruction = {id(p) for p in model.reconstruction_parameters()}
    assert prediction and reconstruction and not prediction & reconstruction
    assert prediction | reconstruction == {id(p) for p in model.parameters()}
    assert id(model.graph.adjacency) in reconstruction
    torch.testing.assert_close(model.graph.adjacency.detach(), torch.eye(D) + 0.2)
    assert float(graph_penalty(model).detach()) > 0

    values, mask, times, lengths, static = random_batch()
    for switch in ("use_missing_indicator", "use_decay", "per_variable_encoder", "use_graph", "use_gru"):
        ablated = small_model(**{switch: False})
        assert ablated(values, mask, times, lengths, static).logits.shape == (B,)
    assert float(graph_penalty(small_model(use_graph=False))) == 0.0
    assert not hasattr(model, "use_static")  # the config says it, once


def test_fast_tanh_matches_tanh_and_its_gradient():
    x = torch.linspace(-30.0, 30.0, 20_001).requires_grad_()
    y = fast_tanh(x)
    torch.testing.assert_close(y, torch.tanh(x), atol=3e-7, rtol=0.0)
    (gradient,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(gradient, 1 - torch.tanh(x.detach()) ** 2, atol=1e-6, rtol=0.0)
    with torch.no_grad():  # the in-place path of inference
        torch.testing.assert_close(fast_tanh(x), torch.tanh(x), atol=3e-7, rtol=0.0)


def test_running_summary_equals_a_plain_loop_over_stays_steps_and_variables():
    values, mask, times, lengths, _ = random_batch(seed=4)
    summaries = RunningSummary()(values, mask, times).view(B, T, D, 8)
    for b in range(B):
        for d in range(D):
            for t in range(T):
                seen = [k for k in range(t + 1) if mask[b, k, d]]
                got = summaries[b, t, d].tolist()
                if not seen:
                    assert got == [0.0] * 8
                    continue
                observed = [float(values[b, k, d]) for k in seen]
                since = float(times[b, t] - times[b, seen[-1]]) / 24
                expected = [
                    observed[0],
                    observed[-1],
                    min(observed),
                    max(observed),
                    sum(observed) / len(seen),
                    math.log1p(len(seen)),
                    since,
                    1.0,
                ]
                assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), (b, t, d)


def test_running_summary_at_the_end_equals_the_running_pass_at_each_stays_last_step():
    values, mask, times, lengths, _ = random_batch(seed=4)
    running = RunningSummary()(values, mask, times)
    expected = running[torch.arange(B), lengths - 1]
    torch.testing.assert_close(RunningSummary().at_end(values, mask, times, lengths), expected)
    # Steps beyond a stay's length are not read, even where the padding holds observations.
    padding = step_mask(lengths, T).logical_not()
    padded_values, padded_mask = values.clone(), mask.clone()
    padded_values[padding], padded_mask[padding] = 99.0, 1.0
    torch.testing.assert_close(RunningSummary().at_end(padded_values, padded_mask, times, lengths), expected)


def test_summary_branch_reads_the_last_real_step_and_keeps_predictions_batch_independent():
    values, mask, times, lengths, static = random_batch(seed=2)
    model = small_model(summary_branch=True, use_static=True)
    with torch.no_grad():
        together = model(values, mask, times, lengths, static).logits
        torch.testing.assert_close(model.predict_logits(values, mask, times, lengths, static, chunk_cells=1), together)
        for i in range(B):
            n = int(lengths[i])
            alone = model(
                values[i : i + 1, :n], mask[i : i + 1, :n], times[i : i + 1, :n], lengths[i : i + 1], static[i : i + 1]
            ).logits
            torch.testing.assert_close(alone[0], together[i], atol=1e-5, rtol=1e-5)
        # The branch is read: a value seen only in the summaries (a stay's last value changed) moves the logit.
        changed = values.clone()
        last = int(lengths[0]) - 1
        mask_last = mask.clone()
        mask_last[0, last, 0] = 1.0
        changed[0, last, 0] = 5.0
        plain = small_model(use_static=True)
        wide = model(changed, mask_last, times, lengths, static).logits[0]
        assert not torch.isclose(wide, together[0])
    assert any("summary_branch" in name for name, _ in model.named_parameters())
    assert not any("summary_branch" in name for name, _ in plain.named_parameters())
    prediction = {id(p) for p in model.prediction_parameters()}
    assert all(id(p) in prediction for p in model.summary_branch.parameters())


# ---------------------------------------------------------------------------------------------------------------
# Each layer against its docstring's formula, written plainly (torch.tanh, explicit loops, no folded key)


def plain_encoder(layer: VariableEncoder, values, mask):
    weight, bias = layer.weight.expand(D, -1, -1), layer.bias.expand(D, -1)
    features = values[..., None] * weight[:, 0] + bias
    if layer.use_mask:
        features = features + mask[..., None] * weight[:, 1]
    return torch.tanh(features)


def plain_lag_attention(layer: LagAttention, features):
    """s_{t,d} = sum_w a_{t,w,d} (h_{t-W+w,d} + e_w), a = softmax_w q_d . (W_k (h_{t-W+w,d} + e_w) + b_k) / sqrt(F)."""
    batch, steps, variables, size = features.shape
    window = layer.window_size
    summary = torch.zeros_like(features)
    weights = torch.zeros(batch, steps, window, variables)
    for t in range(steps):
        lags = [w for w in range(window) if t - window + w >= 0]
        if not lags:
            continue
        for d in range(variables):
            inputs = torch.stack([features[:, t - window + w, d] + layer.lag_embedding[w] for w in lags], dim=1)
            scores = layer.key(inputs) @ layer.query[d] / math.sqrt(size)  # [B, lags]
            attention = torch.softmax(scores, dim=1)
            summary[:, t, d] = (attention[..., None] * inputs).sum(1)
            weights[:, t, lags, d] = attention
    return summary, weights


def plain_signal_attention(layer: SignalAttention, features):
    scores = layer.score(torch.tanh(layer.project(features)))[..., 0]
    weights = torch.softmax(scores, dim=-1)
    return (features * weights[..., None] * features.shape[2]).flatten(2), weights


def plain_temporal_attention(layer: TemporalAttention, states, real):
    context = torch.zeros(states.shape[0], states.shape[2])
    weights = torch.zeros(states.shape[:2])
    for b in range(len(states)):
        n = int(real[b].sum())
        if n:
            attention = torch.softmax(layer.score(torch.tanh(layer.project(states[b, :n])))[:, 0], dim=0)
            context[b], weights[b, :n] = attention @ states[b, :n], attention
    return context, weights


def test_lag_offsets_name_the_step_each_lag_position_reads():
    assert lag_offsets(3, 12) == [(0, 3), (1, 2), (2, 1)]  # position 2 is the step before, position 0 three back
    assert lag_offsets(3, 2) == [(2, 1)]  # a 2-step stay: only one step back exists
    assert lag_offsets(3, 1) == []


@pytest.mark.parametrize("window", [1, 3, 15])  # 15 > T: windows reaching before every stay's start
def test_lag_attention_equals_the_plain_formula_with_its_gradients(window):
    torch.manual_seed(1)
    layer = LagAttention(D, 4, window_size=window)
    features = torch.randn(B, T, D, 4, requires_grad=True)
    summary, weights = layer(features)
    expected_summary, expected_weights = plain_lag_attention(layer, features)
    torch.testing.assert_close(summary, expected_summary, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    # The weights are an output too (explanations read them): the gradient through both is checked.
    probe, weight_probe = torch.randn_like(summary), torch.randn_like(weights)
    parameters = [features, *layer.parameters()]
    got = torch.autograd.grad((summary * probe).sum() + (weights * weight_probe).sum(), parameters)
    expected = torch.autograd.grad(
        (expected_summary * probe).sum() + (expected_weights * weight_probe).sum(), parameters
    )
    for a, b in zip(got, expected):
        assert torch.isfinite(a).all()  # step 0's empty softmax sends no NaN back
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("per_variable, use_mask", [(True, True), (False, True), (True, False)])
def test_variable_encoder_equals_the_plain_formula(per_variable, use_mask):
    values, mask, *_ = random_batch(seed=3)
    torch.manual_seed(2)
    layer = VariableEncoder(D, 4, per_variable=per_variable, use_mask=use_mask)
    with torch.no_grad():
        layer.bias.normal_()
        torch.testing.assert_close(layer(values, mask), plain_encoder(layer, values, mask), atol=1e-6, rtol=0.0)


def test_signal_and_temporal_attention_and_the_stepwise_projection_equal_the_plain_formulas():
    torch.manual_seed(3)
    features, states = torch.randn(B, T, D, 4), torch.randn(B, T, 16)
    real = torch.arange(T)[None, :] < torch.tensor([12, 7, 3, 0, 9])[:, None]  # one stay with no real step
    signal, temporal, stepwise = SignalAttention(4), TemporalAttention(16), StepwiseProjection(16, 16)
    with torch.no_grad():
        for got, expected in zip(signal(features), plain_signal_attention(signal, features)):
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
        for got, expected in zip(temporal(states, real), plain_temporal_attention(temporal, states, real)):
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
        states_alone, nothing = stepwise(states)
        torch.testing.assert_close(states_alone, torch.tanh(stepwise.layer(states)), atol=1e-6, rtol=0.0)
        assert nothing is None


def test_the_three_routes_to_a_logit_agree():
    values, mask, times, lengths, static = random_batch(seed=5)
    for overrides in ({"use_static": True}, {"summary_branch": True}):
        model = small_model(**overrides)
        with torch.no_grad():
            output = model(values, mask, times, lengths, static)
            encoded = model.encode(values, mask, times)
            real = torch.arange(T)[None, :] < lengths[:, None]
            summary = None if encoded.summaries is None else at_last_step(encoded.summaries, real)
            logits, weights = model.classify(encoded.states, real, static, summary)
            torch.testing.assert_close(logits, output.logits)
            torch.testing.assert_close(weights, output.temporal_attention)
            torch.testing.assert_close(
                model.predict_logits(values, mask, times, lengths, static, chunk_cells=1), output.logits
            )
            per_step = model.per_step(values, mask, times)
            torch.testing.assert_close(per_step.sequence_input, encoded.sequence_input)
            torch.testing.assert_close(per_step.messages, output.messages)


# ---------------------------------------------------------------------------------------------------------------
# Each ablation switch changes what it says it changes


def test_without_decay_nothing_is_carried_forward():
    values, mask, times, *_ = random_batch()
    decayed, plain = DecayImputation(D), DecayImputation(D, enabled=False)
    _, carried = plain.carry(mask, times)
    assert (carried == 0).all()
    torch.testing.assert_close(plain(values, mask, times), mask * values)  # unobserved cells take the mean, 0
    assert not torch.allclose(decayed(values, mask, times), mask * values)  # the switch is not a no-op


def test_without_the_missing_indicator_the_model_does_not_see_the_mask_where_values_agree():
    values, mask, times, lengths, static = random_batch()
    # Mark cells observed that hold the value 0 (the mean); without decay their imputed value is 0 either way.
    more_observed = mask.clone()
    more_observed[:, ::2] = 1.0
    with torch.no_grad():
        for indicator in (False, True):
            model = small_model(use_missing_indicator=indicator, use_decay=False)
            one = model(values, mask, times, lengths, static).logits
            other = model(values, more_observed, times, lengths, static).logits
            assert torch.allclose(one, other) != indicator, indicator


def test_a_shared_encoder_encodes_every_variable_alike():
    values = torch.randn(B, T, 1).expand(-1, -1, D)
    mask = torch.ones(B, T, D)
    with torch.no_grad():
        shared = small_model(per_variable_encoder=False).encoder(values, mask)
        own = small_model().encoder(values, mask)
    torch.testing.assert_close(shared, shared[:, :, :1].expand_as(shared))
    assert not torch.allclose(own, own[:, :, :1].expand_as(own))


def test_without_the_graph_each_variable_receives_only_its_own_message():
    model = small_model(use_graph=False)
    assert torch.equal(model.graph.adjacency, torch.eye(D))
    assert all(parameter is not model.graph.adjacency for parameter in model.parameters())  # fixed, never trained
    summary = torch.randn(B, T, D, 4)
    with torch.no_grad():
        torch.testing.assert_close(model.graph(summary), summary @ model.graph.message.weight.T)
        changed = summary.clone()
        changed[:, :, 1:] += 5.0  # every other variable changes
        torch.testing.assert_close(model.graph(changed)[:, :, 0], model.graph(summary)[:, :, 0])
        learned = small_model().graph
        assert not torch.allclose(learned(changed)[:, :, 0], learned(summary)[:, :, 0])


@pytest.mark.parametrize("use_gru", [False, True])
def test_without_the_gru_a_state_depends_on_its_own_step_alone(use_gru):
    model = small_model(use_gru=use_gru)
    inputs = torch.randn(B, T, 16)
    changed = inputs.clone()
    changed[:, 4] += 3.0
    with torch.no_grad():
        states, changed_states = model.sequence(inputs)[0], model.sequence(changed)[0]
    torch.testing.assert_close(changed_states[:, :4], states[:, :4])
    assert not torch.allclose(changed_states[:, 4], states[:, 4])
    assert torch.allclose(changed_states[:, 5:], states[:, 5:]) != use_gru


@pytest.mark.parametrize("summary_branch, hours_input", [(False, False), (True, False), (False, True)])
def test_a_logit_at_each_prediction_time_is_the_stay_cut_there(summary_branch, hours_input):
    values, mask, times, lengths, static = random_batch()
    model = small_model(use_static=True, summary_branch=summary_branch, hours_input=hours_input)
    stay = torch.tensor([0, 0, 0, 2, 2, 4])
    steps = torch.tensor([0, 1, int(lengths[0]), 3, int(lengths[2]), 2])  # 0: before the first step
    # asked at the time of the last step seen, as a stay cut there is (its whole input in)
    asked_at = torch.where(steps > 0, times[stay, (steps - 1).clamp(min=0)], torch.zeros(len(stay)))
    queries = Queries(stay, steps, torch.arange(len(stay)), torch.zeros(len(stay)), asked_at)
    with torch.no_grad():
        asked = model.predict_logits(values, mask, times, lengths, static, queries=queries)
        torch.testing.assert_close(model(values, mask, times, lengths, static, queries=queries).logits, asked)
        for row, (i, n) in enumerate(zip(stay.tolist(), steps.tolist())):
            if n == 0:
                continue
            cut = model.predict_logits(
                values[i : i + 1, :n], mask[i : i + 1, :n], times[i : i + 1, :n], torch.tensor([n]), static[i : i + 1]
            )
            torch.testing.assert_close(asked[row : row + 1], cut, rtol=1e-5, atol=1e-5)
        later = Queries(stay, steps, torch.arange(len(stay)), torch.zeros(len(stay)), asked_at + 24)
        moved = model.predict_logits(values, mask, times, lengths, static, queries=later)
        assert torch.equal(moved, asked) != hours_input  # the hours asked at reach the classifier only when fed


@pytest.mark.parametrize("summary_branch", [False, True])
def test_a_prediction_time_of_a_stay_without_steps_sees_zeros_not_nan(summary_branch):
    """A record emptied (every value removed, as the faithfulness studies remove them) is still asked at its time:
    its state and summary are zeros, its risk the classifier's on them and its static features."""
    torch.manual_seed(0)
    model = Garlic(3, 2, NetworkConfig(hidden_dim=8, feature_dim=4, summary_branch=summary_branch)).eval()
    values, mask, times = torch.randn(2, 4, 3), torch.ones(2, 4, 3), torch.arange(4.0).repeat(2, 1)
    mask[1], values[1], times[1] = 0, 0, 0
    static = torch.randn(2, 2)
    asked = Queries(
        stay=torch.tensor([0, 1]),
        steps=torch.tensor([4, 0]),
        index=torch.tensor([0, 1]),
        labels=torch.zeros(2),
        time=torch.tensor([3.0, 3.0]),
    )
    with torch.no_grad():
        logits = model(values, mask, times, torch.tensor([4, 0]), static, queries=asked).logits
        summary = torch.zeros(1, 8 * 3) if summary_branch else None
        alone = model.classifier_head(torch.zeros(1, 8), static[1:], summary, asked.time[1:])
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[1:], alone)
