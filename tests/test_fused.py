"""The fused CPU kernels (garlic.models.fused) against the PyTorch layers they stand in for."""
import logging
import os
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from helpers import random_batch
from garlic.config import Config
from garlic.models import fused
from garlic.models.compact import Garlic, reconstruction_loss
from garlic.models.fused import FusedGRU, FusedLayerNorm, fused_kernels

needs_kernels = pytest.mark.skipif(fused.kernels() is None, reason="the fused CPU kernels could not be built here "
                                   "(no C++ compiler or ninja; the warning logged says which)")  # fmt: skip


def gru_gradients(gru: nn.GRU, x: Tensor, use_fused: bool, hx=None) -> list:
    """Outputs and the gradients of a loss that reads every step's output and the last states."""
    gru.zero_grad()
    x = x.detach().clone().requires_grad_()
    with fused_kernels(use_fused):
        torch.manual_seed(1)
        output, last = gru(x, hx)
    weights = torch.linspace(-1, 1, output.numel(), dtype=x.dtype).view_as(output)
    ((output * weights).sum() + last.pow(2).sum()).backward()
    return [output, last, x.grad] + [p.grad.clone() for p in gru.parameters()]


@needs_kernels
@pytest.mark.parametrize("dropout, train", [(0.0, False), (0.4, True)])
def test_gru_equals_pytorch_forward_and_backward(dropout, train):
    torch.manual_seed(0)
    gru = FusedGRU(5, 7, num_layers=2, batch_first=True, dropout=dropout).double().train(train)
    x = torch.randn(4, 9, 5, dtype=torch.float64)
    plain, ours = gru_gradients(gru, x, use_fused=False), gru_gradients(gru, x, use_fused=True)
    # same dropout draws under the same seed: the outputs agree to rounding even where units were dropped
    for expected, got in zip(plain, ours):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert ours[2].abs().sum() > 0 and all(g.abs().sum() > 0 for g in ours[3:])


@needs_kernels
def test_gru_float32_and_initial_state():
    torch.manual_seed(0)
    gru = FusedGRU(6, 8, num_layers=3, batch_first=True)
    x, hx = torch.randn(3, 11, 6), torch.randn(3, 3, 8)
    plain, ours = gru_gradients(gru, x, False, hx), gru_gradients(gru, x, True, hx)
    for expected, got in zip(plain, ours):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@needs_kernels
def test_gru_layer_gradcheck():
    torch.manual_seed(0)
    b, t, h = 2, 4, 3
    inputs = [torch.randn(b, t, 3 * h), torch.randn(b, h), torch.randn(3 * h, h), torch.randn(3 * h)]
    inputs = [tensor.double().requires_grad_() for tensor in inputs]
    assert torch.autograd.gradcheck(fused._GRULayer.apply, inputs)


@needs_kernels
def test_gru_inference_keeps_no_gates_and_matches():
    torch.manual_seed(0)
    gru = FusedGRU(4, 6, num_layers=2, batch_first=True).eval()
    x = torch.randn(5, 7, 4)
    with torch.inference_mode():
        ours = gru(x)[0]
        with fused_kernels(False):
            plain = gru(x)[0]
    torch.testing.assert_close(ours, plain)
    gi, h0, w_hh, b_hh = torch.randn(5, 7, 18), torch.randn(5, 6), torch.randn(18, 6), torch.randn(18)
    kept, gates = fused.kernels().gru_layer_forward(gi, h0, w_hh, b_hh, True)
    alone, none = fused.kernels().gru_layer_forward(gi, h0, w_hh, b_hh, False)
    assert gates.shape == (5, 7, 24) and none.numel() == 0 and torch.equal(kept, alone)


@needs_kernels
def test_layer_norm_equals_pytorch_and_gradcheck():
    torch.manual_seed(0)
    norm = FusedLayerNorm(8).double()
    with torch.no_grad():
        norm.weight.normal_(), norm.bias.normal_()
    x = torch.randn(3, 5, 4, 8, dtype=torch.float64) * 3 + 1
    results = {}
    for use_fused in (False, True):
        norm.zero_grad()
        leaf = x.clone().requires_grad_()
        with fused_kernels(use_fused):
            y = norm(leaf)
        (y * torch.cos(leaf)).sum().backward()
        results[use_fused] = [y, leaf.grad, norm.weight.grad.clone(), norm.bias.grad.clone()]
    for expected, got in zip(results[False], results[True]):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    leaf = x[:2, :2].clone().requires_grad_()
    weight, bias = norm.weight.detach().clone().requires_grad_(), norm.bias.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: fused._LayerNorm.apply(*a, 1e-5), (leaf, weight, bias))


@needs_kernels
def test_model_training_step_matches_pytorch_layers():
    """A whole Garlic training step (dropout on) gives the same losses and gradients with and without the kernels."""
    values, mask, times, lengths, static = random_batch()
    torch.manual_seed(0)
    model = Garlic(values.shape[2], static.shape[1], Config(hidden_dim=16, feature_dim=4, window_size=3,
                                                             dropout=0.3)).train()  # fmt: skip
    results = {}
    for use_fused in (False, True):
        model.zero_grad()
        with fused_kernels(use_fused):
            torch.manual_seed(3)
            output = model(values, mask, times, lengths, static)
        loss = output.logits.sum() + reconstruction_loss(output, values, mask)
        loss.backward()
        results[use_fused] = [loss.detach()] + [p.grad.clone() for p in model.parameters()]
    for expected, got in zip(results[False], results[True]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_layers_fall_back_to_pytorch_without_kernels(monkeypatch, caplog):
    """A machine that cannot build the kernels warns once, saying why, and still trains the same model."""
    import torch.utils.cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    fused.kernels.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="garlic.models.fused"):
            gru, norm = FusedGRU(3, 4, batch_first=True), FusedLayerNorm(4)
            x = torch.randn(2, 5, 3, requires_grad=True)
            output, _ = gru(x)
            norm(output).sum().backward()
        assert fused.kernels() is None
        assert x.grad is not None and x.grad.abs().sum() > 0
        warnings = [r.getMessage() for r in caplog.records if r.name == "garlic.models.fused"]
        assert len(warnings) == 1 and "Ninja is required" in warnings[0]
    finally:
        monkeypatch.undo()
        fused.kernels.cache_clear()


def test_gru_refuses_what_it_does_not_implement():
    with pytest.raises(ValueError, match="batch first"):
        FusedGRU(3, 4)
    with pytest.raises(ValueError, match="one direction"):
        FusedGRU(3, 4, batch_first=True, bidirectional=True)


def test_the_ninja_package_is_put_on_path_where_none_is(tmp_path, monkeypatch):
    """PyTorch runs ninja by name; an unactivated virtual environment has the package's ninja off PATH."""
    import shutil

    import ninja

    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("ninja") is None
    fused.ninja_on_path()
    assert shutil.which("ninja") == str(Path(ninja.BIN_DIR) / "ninja")
    fused.ninja_on_path()  # once there, PATH is left alone
    assert os.environ["PATH"].count(ninja.BIN_DIR) == 1
