"""architecture=reference and schedule=reference: each vectorised layer against a plain loop over variables and
windows written here, batch independence, causality, and the reference training loop on scripted losses."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import garlic.training.losses
import garlic.training.reference_schedule
from garlic.app.replay import risk_curve
from experiments.ablations import VARIANTS
from garlic.config import Config, ConfigError
from garlic.data.batches import collate
from garlic.explain.built_in import explain
from garlic.explain.integrated_gradients import ig_importance
from garlic.metrics import binary_metrics
from garlic.models.architectures import build_model
from garlic.models.network_config import NetworkConfig
from garlic.methods.garlic import GarlicEstimator
from garlic.methods.saved import fitted_on, load_method, save_method
from garlic.tracking.run_contract import GARLIC
from garlic.models.reference import (
    PerVariableEncoder,
    ReferenceDecay,
    ReferenceGarlic,
    ReferenceGraph,
    SignalAttention,
    TemporalAttention,
    WindowAttention,
    sinusoid,
)
from garlic.models.predict import predict_proba
from garlic.training.losses import PREDICTION, RECONSTRUCTION
from garlic.training.alternating import AlternatingTrainer
from garlic.training.reference_schedule import ReferenceTrainer
from garlic.training.schedules import make_trainer
from garlic.sources import synthetic
from helpers import random_batch, synthetic_cohort, garlic_settings

B, T, D, S, W, FEATURES = 5, 12, 4, 3, 3, 4


def reference_model(**overrides) -> ReferenceGarlic:
    torch.manual_seed(0)
    config = Config(architecture="reference", hidden_dim=8, feature_dim=FEATURES, window_size=W).override(overrides)
    return build_model(D, S, NetworkConfig.from_run(config)).eval()


# Plain versions, one variable, window or stay at a time, in the reference code's order of operations.


def loop_decay(layer: ReferenceDecay, values, mask, times):
    gap = torch.zeros_like(values)
    last = values.clone()
    total, count = torch.zeros(B, D), torch.zeros(B, D)
    mean = torch.zeros_like(values)
    for t in range(values.shape[1]):
        delta = times[:, t] - times[:, t - 1] if t else torch.zeros(B)
        gap[:, t] = delta[:, None] + (gap[:, t - 1] * (1 - mask[:, t]) if t else 0)
        if t:
            last[:, t] = torch.where(mask[:, t].bool(), values[:, t], last[:, t - 1])
        total, count = total + values[:, t] * mask[:, t], count + mask[:, t]
        mean[:, t] = total / count.clamp(min=1)
    decay = torch.exp(-torch.clamp(layer.rate * gap / layer.gap_scale + layer.offset, min=0, max=1000))
    return values * mask + (1 - mask) * (decay * last + (1 - decay) * mean)


def loop_encoder(layer: PerVariableEncoder, values, mask):
    out = []
    for d in range(D):
        mlp = nn.Sequential(nn.Linear(2, FEATURES), nn.ReLU(), nn.Linear(FEATURES, FEATURES))
        with torch.no_grad():
            mlp[0].weight.copy_(layer.weight_in[d].T), mlp[0].bias.copy_(layer.bias_in[d])
            mlp[2].weight.copy_(layer.weight_out[d].T), mlp[2].bias.copy_(layer.bias_out[d])
        out.append(mlp(torch.stack([values[:, :, d], mask[:, :, d]], dim=-1)))
    return torch.stack(out, dim=2)


def loop_window_attention(layer: WindowAttention, features):
    windows = features.shape[1] - W + 1
    summary = torch.zeros(B, windows, D, FEATURES)
    weights = torch.zeros(B, windows, D, W, W)
    for start in range(windows):
        for d in range(D):
            x = features[:, start : start + W, d] + sinusoid(W, FEATURES)  # [B, W, F]
            q, k, v = (x @ p.weight[d] + p.bias[d] for p in (layer.query, layer.key, layer.value))
            weight = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(FEATURES), dim=-1)
            weights[:, start, d] = weight
            summary[:, start, d] = (weight @ v).sum(1)
    return summary, weights


def loop_signal_attention(layer: SignalAttention, items):
    pooled = []
    for group in items:  # [D, F]
        x = group
        weight = torch.softmax(layer.query(x) @ layer.key(x).T / math.sqrt(FEATURES), dim=-1)
        pooled.append((weight @ layer.value(x)).sum(0))
    return torch.stack(pooled)


def loop_temporal_attention(layer: TemporalAttention, states, real):
    contexts = []
    for stay, keep in zip(states, real):
        x = (stay + sinusoid(len(stay), stay.shape[1]))[keep]  # the real windows, at their own positions
        if not len(x):
            contexts.append(torch.zeros(stay.shape[1]))
            continue
        weight = torch.softmax(layer.query(x) @ layer.key(x).T / math.sqrt(x.shape[1]), dim=-1)
        contexts.append((weight @ layer.value(x)).sum(0))
    return torch.stack(contexts)


def variable_items(messages):
    """Each window's D variables, each with the encoding of its index: [B, L, D, F] -> [B * L, D, F]."""
    return (messages + sinusoid(D, FEATURES)).reshape(-1, D, FEATURES)


def code_layout_chunks(messages):
    """The reference's own steps: [B, L, D, F] -> permute to [B, D, F, L], the encoding of the variable index added,
    back to [B, D, L, F], then a reshape to [B * L, D, F] with no permute between."""
    batch, windows = messages.shape[:2]
    encoded = messages.permute(0, 2, 3, 1) + sinusoid(D, FEATURES)[:, :, None]
    return encoded.permute(0, 1, 3, 2).reshape(batch * windows, D, FEATURES)


def test_each_vectorised_layer_equals_its_loop_version():
    torch.manual_seed(0)
    values, mask, times, lengths, static = random_batch()
    decay = ReferenceDecay(D)
    with torch.no_grad():
        decay.rate.uniform_(0.5, 3.0), decay.offset.uniform_(-0.5, 0.2)
        decay.gap_scale.fill_(7.0)
        imputed = decay(values, mask, times)
        torch.testing.assert_close(imputed, loop_decay(decay, values, mask, times))

        encoder = PerVariableEncoder(D, FEATURES)
        features = encoder(imputed, mask)
        torch.testing.assert_close(features, loop_encoder(encoder, imputed, mask))

        attention = WindowAttention(D, FEATURES, W)
        summary, weights = attention(features)
        expected_summary, expected_weights = loop_window_attention(attention, features)
        torch.testing.assert_close(summary, expected_summary, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(weights, expected_weights)

        graph = ReferenceGraph(D, FEATURES)
        graph.adjacency.copy_(torch.randn(D, D))
        messages = graph(summary)
        for j in range(D):  # the reference's matmul(adj, x) with adj = A^T: target j gathers from every source i
            expected = sum(graph.adjacency.T[j, i] * summary[:, :, i] for i in range(D))
            torch.testing.assert_close(messages[:, :, j], expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(graph.reconstruct(messages)[:, :, j], graph.head(messages[:, :, j])[..., 0])

        signal = SignalAttention(D, FEATURES)
        windows = messages.shape[1]
        items = variable_items(messages)
        torch.testing.assert_close(signal.encode(messages).view(-1, D, FEATURES), items)
        pooled, _ = signal(items)
        torch.testing.assert_close(pooled, loop_signal_attention(signal, items), atol=1e-5, rtol=1e-5)
        chunks = code_layout_chunks(messages)
        torch.testing.assert_close(signal(chunks)[0], loop_signal_attention(signal, chunks), atol=1e-5, rtol=1e-5)

        temporal = TemporalAttention(8)
        states = torch.randn(B, windows, 8)
        real = torch.arange(windows)[None, :] + W - 1 < lengths[:, None]
        torch.testing.assert_close(
            temporal(states, real)[0], loop_temporal_attention(temporal, states, real), atol=1e-5, rtol=1e-5
        )


def test_window_attention_has_the_gradients_of_its_loop_version():
    """The vectorised layer's backward (its stacked Q, K, V product and the strided layouts) is the loop's."""
    torch.manual_seed(1)
    attention = WindowAttention(D, FEATURES, W)
    features = torch.randn(B, 6, D, FEATURES, requires_grad=True)
    weighting = torch.randn(B, 6 - W + 1, D, FEATURES)

    def gradients(layer_output):
        summary, weights = layer_output
        attention.zero_grad()
        features.grad = None
        ((summary * weighting).sum() + weights.pow(2).sum()).backward()
        return [features.grad.clone()] + [p.grad.clone() for p in attention.parameters()]

    vectorised, looped = gradients(attention(features)), gradients(loop_window_attention(attention, features))
    for got, expected in zip(vectorised, looped, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["variables", "code"])
def test_the_model_chains_the_layers_as_the_reference_does(layout):
    values, mask, times, lengths, static = random_batch()
    model = reference_model(signal_layout=layout)
    model.prepare(times, lengths)
    with torch.no_grad():
        output = model(values, mask, times, lengths, static)
        imputed = loop_decay(model.decay, values, mask, times)
        summary, _ = loop_window_attention(model.lag_attention, loop_encoder(model.encoder, imputed, mask))
        messages = torch.einsum("blif,ij->bljf", summary, model.graph.adjacency)
        windows = messages.shape[1]
        if layout == "variables":
            items, real = variable_items(messages), torch.arange(windows)[None, :] + W - 1 < lengths[:, None]
        else:  # every window, the padding included, as in the reference
            items, real = code_layout_chunks(messages), torch.ones(B, windows, dtype=torch.bool)
        states, _ = model.sequence(loop_signal_attention(model.signal_attention, items).view(B, windows, -1))
        logits = model.classifier(loop_temporal_attention(model.temporal_attention, states, real))[:, 0]
    torch.testing.assert_close(output.logits, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(output.imputed, imputed, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(
        output.reconstruction[:, W - 1 :], model.graph.reconstruct(messages), atol=1e-5, rtol=1e-5
    )
    assert (output.reconstruction[:, : W - 1] == 0).all()


@pytest.mark.parametrize("lengths, padded", [((12, 7, 3, 1, 9), 4 * T), ((2, 1), 0)])
def test_code_layout_computes_each_stays_empty_window_once_with_the_same_logits_and_gradients(lengths, padded):
    """Stays far shorter than the data set's (padded) length, and a batch shorter than a window in a model with no
    padded length: the same logits, gradients and signal weights as computing every padded window (and the signal
    attention of every chunk, the chunks of one variable's empty windows included)."""
    values, mask, times, lengths, static = random_batch(lengths=lengths)
    batch, steps = len(lengths), values.shape[1]
    model = reference_model(signal_layout="code").train()
    model.padded_length.fill_(padded)

    def every_window_computed():  # the reference's way: the whole padded length through every layer
        full, real = max(padded, steps), torch.arange(steps)[None, :] < lengths[:, None]
        _, _, messages = model.windows(
            *[F.pad(x, (0, 0, 0, full - steps)) for x in (values, mask)], F.pad(times * real, (0, full - steps))
        )
        windows = messages.shape[1]
        pooled, signal_weights = model.signal_attention(code_layout_chunks(messages))
        states, _ = model.sequence(pooled.view(batch, windows, -1))
        context, _ = model.temporal_attention(states, torch.ones(batch, windows, dtype=torch.bool))
        return model.classifier(context)[:, 0], messages, signal_weights.view(batch, windows, D, D).mean(2)

    def logits_and_gradients(logits):
        model.zero_grad()
        logits.pow(2).sum().backward()
        return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    output = model(values, mask, times, lengths, static)
    logits, gradients = logits_and_gradients(output.logits)
    expected_logits, messages, signal_weights = every_window_computed()
    expected, expected_gradients = logits_and_gradients(expected_logits)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert gradients.keys() == expected_gradients.keys() and "encoder.weight_in" in gradients
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, expected_gradients[name], atol=1e-4, rtol=1e-4, msg=name)
    torch.testing.assert_close(output.signal_attention, signal_weights.detach(), atol=1e-6, rtol=1e-6)
    shown = max(steps - W + 1, 0)
    torch.testing.assert_close(output.messages[:, W - 1 :], messages[:, :shown].detach(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("layout", ["variables", "code"])
def test_prediction_does_not_depend_on_the_batch(layout):
    values, mask, times, lengths, static = random_batch()
    model = reference_model(signal_layout=layout)
    model.prepare(times, lengths)
    with torch.no_grad():
        together = model(values, mask, times, lengths, static).logits
        torch.testing.assert_close(model.predict_logits(values, mask, times, lengths, static), together)
        # The inference path's chunks of stays (here one stay each) change nothing.
        torch.testing.assert_close(
            model.predict_logits(values, mask, times, lengths, static, chunk_cells=1), together, atol=1e-5, rtol=1e-5
        )
        for i in range(B):
            n = int(lengths[i])
            alone = model(
                values[i : i + 1, :n], mask[i : i + 1, :n], times[i : i + 1, :n], lengths[i : i + 1], static[i : i + 1]
            ).logits
            assert alone.shape == (1,)
            torch.testing.assert_close(alone[0], together[i], atol=1e-5, rtol=1e-5)
        # A stay with a huge gap in the batch rescales nobody's decay; shuffling changes nothing either.
        shuffled = torch.tensor([3, 0, 4, 1, 2])
        reordered = model(values[shuffled], mask[shuffled], times[shuffled], lengths[shuffled], static[shuffled])
        torch.testing.assert_close(reordered.logits, together[shuffled], atol=1e-5, rtol=1e-5)
        stretched = times.clone()
        stretched[0] *= 50
        torch.testing.assert_close(
            model(values, mask, stretched, lengths, static).logits[1:], together[1:], atol=1e-5, rtol=1e-5
        )


def test_every_step_sees_only_itself_and_the_past():
    values, mask, times, lengths, static = random_batch()
    model = reference_model()
    with torch.no_grad():
        output = model(values, mask, times, lengths, static)
        changed_values, changed_mask = values.clone(), mask.clone()
        changed_values[0, 6], changed_mask[0, 6] = 5.0, 1.0
        changed = model(changed_values, changed_mask, times, lengths, static)
        for field in ("imputed", "messages", "states", "reconstruction"):
            torch.testing.assert_close(getattr(changed, field)[0, :6], getattr(output, field)[0, :6])
            assert not torch.allclose(getattr(changed, field)[0, 6], getattr(output, field)[0, 6])
        # So one pass over the whole stay gives the risk of every prefix (the dashboard's risk curve relies on it).
        states = model.encode(values[:1], mask[:1], times[:1]).states
        for n in (1, 3, 8, 12):
            prefix = model(values[:1, :n], mask[:1, :n], times[:1, :n], torch.tensor([n]), static[:1]).logits
            real = torch.arange(T)[None, :] < n
            torch.testing.assert_close(model.classify(states, real, static[:1])[0], prefix, atol=1e-5, rtol=1e-5)
    assert output.lag_attention.shape == (B, T, W, D) and output.signal_attention.shape == (B, T, D)
    real_windows = (torch.arange(T)[None, :] >= W - 1) & output.step_mask
    torch.testing.assert_close(output.signal_attention[real_windows].sum(-1), torch.ones(int(real_windows.sum())))
    sums = output.temporal_attention.sum(-1)
    torch.testing.assert_close(sums[lengths >= W], torch.ones(int((lengths >= W).sum())))
    assert (output.temporal_attention[~real_windows] == 0).all()
    assert (sums[lengths < W] == 0).all()  # a stay shorter than a window has none


def test_reconstruction_loss_is_the_mse_over_observed_window_ends_over_the_mask_mean():
    values, mask, times, lengths, static = random_batch()
    model = reference_model()
    model.padded_length.fill_(20)  # the data set's length: the mask mean counts the padded grid
    output = model(values, mask, times, lengths, static)
    kept = mask.clone()
    kept[:, : W - 1] = 0
    selected = kept.bool()
    mse = F.mse_loss(output.reconstruction[selected], values[selected])
    expected = mse / (mask.sum() / (B * 20 * D))
    torch.testing.assert_close(model.reconstruction_loss(output, values, mask), expected)
    garbage = values + (1 - mask) * 100.0
    torch.testing.assert_close(model.reconstruction_loss(output, garbage, mask), expected)


def test_parameter_groups_are_the_references_and_bad_settings_are_refused():
    model = reference_model()
    prediction = {id(p) for p in model.prediction_parameters()}
    reconstruction = {id(p) for p in model.reconstruction_parameters()}
    assert prediction and reconstruction and not prediction & reconstruction
    assert prediction | reconstruction == {id(p) for p in model.parameters()}
    named = {name.split(".")[0] for name, p in model.named_parameters() if id(p) in prediction}
    assert named == {"signal_attention", "sequence", "temporal_attention", "classifier"}
    torch.testing.assert_close(model.graph.adjacency.detach(), torch.eye(D) + 0.2)
    assert float(garlic.training.losses.graph_penalty(model).detach()) > 0
    with pytest.raises(ConfigError, match="signal_layout"):
        reference_model(signal_layout="rows")
    with pytest.raises(ConfigError, match="use_static"):
        reference_model(use_static=True)
    with pytest.raises(ConfigError, match="architecture"):
        build_model(D, S, NetworkConfig.from_run(Config(architecture="big")))
    values, mask, times, lengths, static = random_batch()
    with pytest.raises(ValueError, match="signal_layout=variables"):
        reference_model(signal_layout="code").encode(values, mask, times)


@pytest.mark.parametrize("layout", ["variables", "code"])
def test_each_ablation_switch_takes_out_its_module_and_the_rest_still_learns(layout):
    values, mask, times, lengths, static = random_batch()
    full = reference_model(signal_layout=layout)
    full.prepare(times, lengths)
    for name, switches in VARIANTS.items():
        model = reference_model(signal_layout=layout, **switches)
        model.prepare(times, lengths)
        output = model(values, mask, times, lengths, static)
        (output.logits.sum() + output.reconstruction.sum()).backward()
        used = [p for p in model.parameters() if p.grad is not None]
        assert used and all(torch.isfinite(p.grad).all() for p in used), name
        with torch.no_grad():
            if name == "no_decay":
                torch.testing.assert_close(model.decay(values, mask, times), mask * values)
                assert not torch.equal(full.decay(values, mask, times), mask * values)
            if name == "no_missing_indicator":  # the encoder reads the (imputed) value alone
                torch.testing.assert_close(model.encoder(values, mask), model.encoder(values, 1 - mask))
                assert not torch.equal(full.encoder(values, mask), full.encoder(values, 1 - mask))
            if name == "no_per_variable_encoder":  # one encoder: the same input gives every variable the same features
                same = model.encoder(torch.ones(1, 1, D), torch.ones(1, 1, D))[0, 0]
                torch.testing.assert_close(same, same[:1].expand(D, -1))
                assert sum(p.numel() for p in model.encoder.parameters()) * D == sum(
                    p.numel() for p in full.encoder.parameters()
                )
            if name == "no_graph":  # each variable keeps its own summary
                summary = torch.randn(2, 3, D, FEATURES)
                torch.testing.assert_close(model.graph(summary), summary)
                assert "graph.adjacency" not in dict(model.named_parameters())
            if name == "no_gru":  # each window's state from that window alone
                inputs = torch.randn(2, 5, FEATURES)
                changed = inputs.clone()
                changed[:, 0] += 1.0
                torch.testing.assert_close(model.sequence(inputs)[0][:, 1:], model.sequence(changed)[0][:, 1:])
                assert not any(isinstance(m, nn.GRU) for m in model.modules())
        if name in ("full", "joint_training"):
            torch.testing.assert_close(output.logits, full(values, mask, times, lengths, static).logits)


# The reference training loop.

FAST = {
    "architecture": "reference",
    "schedule": "reference",
    "hidden_dim": 16,
    "feature_dim": 4,
    "batch_size": 64,
    "lr_cls": 3e-3,
    "lr_rec": 3e-3,
}


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    cohort = synthetic_cohort(tmp_path_factory, n_stays=240, seed=2)
    return cohort.tensors, cohort.split, cohort.parts


def scripted_fit(cohort, monkeypatch, bces, train_aurocs, **overrides):
    """A reference fit whose epochs only add 1 to one weight, with scripted validation BCEs and training AUROCs.
    Returns the fit, the weight at the start of each epoch and the learning rates after each epoch."""
    tensors, _, parts = cohort
    config = Config().override({**FAST, **overrides})
    trainer = make_trainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features))
    weight = trainer.model.classifier[2].bias
    with torch.no_grad():
        weight.zero_()  # whole numbers from here on
    bces, train_aurocs, at_start, rates = iter(bces), iter(train_aurocs), [], []

    def train_epoch(batches, stage, first_stage=True, epoch=0):
        at_start.append(float(weight.detach()))
        with torch.no_grad():
            weight.add_(1.0)
        return {"loss": 0.0, "bce": 0.0, "mse": 0.0, "auroc": next(train_aurocs)}

    def evaluate(model, dataset, config):
        return {"probabilities": np.full(len(dataset), 0.5), "losses": {"bce": next(bces), "mse": 0.0}}

    monkeypatch.setattr(trainer, "train_epoch", train_epoch)
    monkeypatch.setattr(garlic.training.reference_schedule, "evaluate", evaluate)
    on_epoch = lambda r: rates.append([g["lr"] for g in trainer.optimisers["both"].param_groups])  # noqa: E731
    fitted = trainer.fit(parts["train"], parts["validation"], on_epoch=on_epoch)
    return fitted, at_start, rates, float(weight.detach()) - at_start[0]


def alternating(first: str, start: int, stop: int) -> list[str]:
    other = PREDICTION if first == RECONSTRUCTION else RECONSTRUCTION
    return [first if (epoch - start) % 2 == 0 else other for epoch in range(start, stop + 1)]


def test_reference_schedule_switches_and_stops_on_validation_bce(cohort, monkeypatch):
    # Bests at epochs 1-5 and 20; nothing else comes close.
    bces = [1.0 - 0.01 * e if e <= 5 else (0.5 if e == 20 else 2.0) for e in range(1, 101)]
    fitted, at_start, rates, final = scripted_fit(cohort, monkeypatch, bces, [0.7] * 100)
    # Epoch 9 is the first more than 3 epochs after the best (5): switch. The best epoch is not reset, so every
    # later epoch switches again, until the new best of epoch 20 (a prediction epoch) holds the stage for 4 more.
    # Early stopping waits for the warm-up: epoch index (from 0) above 40, here epoch 42, though 20 + 10 < 42.
    expected = (
        [RECONSTRUCTION] * 9 + alternating(PREDICTION, 10, 19) + [PREDICTION] * 5 + alternating(RECONSTRUCTION, 25, 42)
    )
    assert [r.stage for r in fitted.history] == expected
    assert fitted.best_epoch == 20 and len(fitted.history) == 42
    # Each switch reloads the best epoch's weights: epoch 10 starts from the end of epoch 5, 25 from the end of 20.
    start = at_start[0]
    assert at_start[9] - start == 5 and at_start[10] - start == 5
    assert at_start[24] - start == at_start[19] - start + 1
    assert final == at_start[19] - start + 1  # the fit ends on the best epoch's weights
    # The plateau schedule halves both groups after 4 epochs without a gain in training AUROC, down to 1e-5.
    assert rates[3] == [3e-3, 3e-3] and rates[4] == [1.5e-3, 1.5e-3]
    assert rates[-1] == [1e-5, 1e-5]


def test_reference_schedule_stops_after_the_patience_once_warm(cohort, monkeypatch):
    # Bests at epochs 1 and 35: once past the warm-up, the stop comes at 46, the first epoch more than 10 after 35.
    bces = [{1: 0.9, 35: 0.5}.get(e, 2.0) for e in range(1, 101)]
    fitted, *_ = scripted_fit(cohort, monkeypatch, bces, np.linspace(0.6, 0.9, 100))
    assert fitted.best_epoch == 35 and len(fitted.history) == 46


def test_reference_stages_train_the_references_parameter_groups(cohort):
    tensors, _, parts = cohort
    trainer = make_trainer(
        *garlic_settings(Config().override(FAST)), len(tensors.variables), len(tensors.static_features)
    )
    model = trainer.model
    batches = garlic.training.reference_schedule.loader(parts["train"], 64, shuffle=True)

    def snapshot():
        return [p.detach().clone() for p in model.reconstruction_parameters()], [
            p.detach().clone() for p in model.prediction_parameters()
        ]

    def changed(before, parameters):
        return [not torch.equal(b, p.detach()) for b, p in zip(before, parameters)]

    for stage, first, reconstruction_trains, prediction_trains in [
        (RECONSTRUCTION, True, True, True),  # the first reconstruction stage trains everything
        (PREDICTION, False, False, True),
        (RECONSTRUCTION, False, True, False),  # later ones the reconstruction group only
    ]:
        reconstruction, prediction = snapshot()
        trained = trainer.train_epoch(batches, stage, first)
        assert 0.0 <= trained["auroc"] <= 1.0
        moved = changed(reconstruction, model.reconstruction_parameters())
        assert all(moved) if reconstruction_trains else not any(moved)
        moved = changed(prediction, model.prediction_parameters())
        assert all(moved) if prediction_trains else not any(moved)


def test_reference_training_runs_end_to_end_saves_and_reloads(cohort, tmp_path):
    tensors, split, parts = cohort
    config = Config().override({**FAST, "max_epochs": 3})
    trainer = make_trainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features))
    assert isinstance(trainer, ReferenceTrainer) and isinstance(trainer.model, ReferenceGarlic)
    estimator = GarlicEstimator.of_run(config).fit(
        parts["train"], parts["validation"]
    )  # the config's trainer, as above
    fitted = estimator.fit_result_
    assert len(fitted.history) == 3 and 1 <= fitted.best_epoch <= 3
    times, lengths = parts["train"].times, parts["train"].lengths
    assert int(fitted.model.padded_length) == times.shape[1]
    longest = (times[torch.arange(len(times)), lengths - 1] - times[:, 0]).max()
    assert float(fitted.model.decay.gap_scale) == pytest.approx(float(longest))
    risk = predict_proba(fitted.model, parts["test"])
    assert np.isfinite(risk).all() and binary_metrics(parts["test"].labels.numpy(), risk)["auroc"] > 0.5

    reloaded = load_method(save_method(tmp_path / "model", fitted_on(GARLIC, estimator, config, parts["train"])))
    assert isinstance(reloaded.model, ReferenceGarlic) and reloaded.explains
    np.testing.assert_array_equal(reloaded.predict_proba(parts["test"]), risk)

    # The dashboard's risk curve: one pass over the stay, every prefix's risk; the whole stay's is the prediction's.
    stay = parts["test"][0]
    last_time = float(stay["times"][int(stay["lengths"]) - 1])
    curve = risk_curve(reloaded.model, stay, np.array([last_time / 2, last_time]))
    assert curve[1] == pytest.approx(risk[0], abs=1e-5) and np.isfinite(curve).all()

    stays = collate([parts["test"][i] for i in range(4)])
    with pytest.raises(NotImplementedError, match="architecture=reference"):
        explain(reloaded.model, stays, list(tensors.variables))
    importance = ig_importance(reloaded.model, stays, steps=2)  # the post-hoc explanation needs only the logits
    torch.testing.assert_close(importance.sum(dim=(1, 2)), torch.ones(4))
    with pytest.raises(ConfigError, match="make_trainer"):
        AlternatingTrainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features))
    with pytest.raises(ConfigError, match="schedule"):
        make_trainer(
            *garlic_settings(config.override({"schedule": "fast"})),
            len(tensors.variables),
            len(tensors.static_features),
        )


def test_a_resumed_reference_fit_ends_as_an_uninterrupted_one(cohort):
    tensors, _, parts = cohort
    config = Config().override({**FAST, "max_epochs": 3, "stage_patience": 0})  # a switch after every stale epoch
    sizes = len(tensors.variables), len(tensors.static_features)
    states = []
    save = lambda state: states.append(copy.deepcopy(state))  # noqa: E731 (the state shares the live tensors)
    whole = make_trainer(*garlic_settings(config), *sizes).fit(parts["train"], parts["validation"], on_state=save)
    resumed = make_trainer(*garlic_settings(config), *sizes).fit(parts["train"], parts["validation"], resume=states[0])
    assert [r.stage for r in resumed.history] == [r.stage for r in whole.history]
    assert [r.val_bce for r in resumed.history] == [r.val_bce for r in whole.history]
    np.testing.assert_array_equal(
        predict_proba(resumed.model, parts["test"]), predict_proba(whole.model, parts["test"])
    )


def test_a_tracked_reference_run_logs_its_model_and_says_why_it_has_no_built_in_explanation(tmp_path):
    import mlflow

    from garlic import runs
    from garlic.models.reference import EXPLANATION_UNSUPPORTED
    from garlic.methods.saved import load_predictor
    from garlic.tracking.store import use_store

    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=200, seed=4)
    config = Config().override({**FAST, "max_epochs": 2})
    run_id, (result,) = runs.train(config, [0], data_root=tmp_path, store=tmp_path / "mlruns")
    use_store(tmp_path / "mlruns")
    run = mlflow.MlflowClient().get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["explanations"] == EXPLANATION_UNSUPPORTED
    assert run.data.params["architecture"] == "reference" and np.isfinite(result.test["auroc"])
    assert isinstance(load_predictor(run_id, tmp_path / "mlruns").model, ReferenceGarlic)
