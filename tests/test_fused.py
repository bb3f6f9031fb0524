"""The fused CPU kernels (garlic.models.fused) against the PyTorch layers they stand in for."""

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from helpers import random_batch
from garlic.models import fused
from garlic.models.compact import Garlic, reconstruction_loss
from garlic.models.fused import FusedGRU, FusedLayerNorm, fused_kernels
from garlic.models.network_config import NetworkConfig

needs_kernels = pytest.mark.skipif(
    fused.kernels() is None,
    reason="the fused CPU kernels could not be built here (no C++ compiler or ninja; the warning logged says which)",
)


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
    model = Garlic(
        values.shape[2], static.shape[1], NetworkConfig(hidden_dim=16, feature_dim=4, window_size=3, dropout=0.3)
    ).train()
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


def test_layers_fall_back_to_pytorch_without_kernels(monkeypatch, caplog, tmp_path):
    """A machine that cannot build the kernels warns once, saying why, and still trains the same model."""
    import torch.utils.cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # nothing built there yet
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


def raised_by(call) -> tuple[type, str]:
    """The type and message of the error ``call()`` raises (the test fails where it raises none)."""
    with pytest.raises(Exception) as caught:
        call()
    return caught.type, str(caught.value)


@needs_kernels
@pytest.mark.parametrize(
    "bad_input",
    [
        torch.randn(2, 1000),  # a longer last axis: the kernel read past the 8 weights
        torch.randn(2, 4),  # a shorter one: normalised with the first 4 weights, silently
        torch.randn(2, 8, dtype=torch.float64),  # float64 input, float32 weights
        torch.tensor(1.0),  # no axis at all
    ],
    ids=["longer", "shorter", "dtype", "scalar"],
)
def test_layer_norm_refuses_what_nn_layer_norm_refuses(bad_input):
    norm, plain = FusedLayerNorm(8), nn.LayerNorm(8)
    assert raised_by(lambda: norm(bad_input)) == raised_by(lambda: plain(bad_input))


@needs_kernels
def test_layer_norm_refuses_weights_on_another_device():
    norm, plain = FusedLayerNorm(8).to("meta"), nn.LayerNorm(8, device="meta")
    x = torch.randn(3, 8)
    assert raised_by(lambda: norm(x)) == raised_by(lambda: plain(x))


@needs_kernels
@pytest.mark.parametrize(
    "x, hx",
    [
        (torch.randn(20, 7, 5), torch.randn(1, 1, 16)),  # hx for another batch size: garbage, a resize warning at most
        (torch.randn(20, 7, 5), torch.randn(2, 20, 16)),  # hx for two layers of a one-layer GRU
        (torch.randn(20, 7, 5), torch.randn(20, 16)),  # hx without its layer axis
        (torch.randn(20, 7, 5), torch.randn(1, 20, 8)),  # hx of another hidden size
        (torch.randn(20, 7, 5), torch.randn(1, 20, 16, dtype=torch.float64)),
        (torch.randn(20, 7, 6), None),  # more input features than the GRU's input size
        (torch.randn(20, 7, 5, dtype=torch.float64), None),
        (torch.randn(2, 20, 7, 5), None),
    ],
    ids=["hx-batch", "hx-layers", "hx-2d", "hx-hidden", "hx-dtype", "features", "dtype", "4d"],
)
def test_gru_refuses_what_nn_gru_refuses(x, hx):
    torch.manual_seed(0)
    gru, plain = FusedGRU(5, 16, batch_first=True), nn.GRU(5, 16, batch_first=True)
    plain.load_state_dict(gru.state_dict())
    assert raised_by(lambda: gru(x, hx)) == raised_by(lambda: plain(x, hx))


@needs_kernels
def test_gru_refuses_hx_on_another_device():
    gru, plain = FusedGRU(5, 16, batch_first=True), nn.GRU(5, 16, batch_first=True)
    x, hx = torch.randn(4, 3, 5), torch.randn(1, 4, 16, device="meta")
    assert raised_by(lambda: gru(x, hx)) == raised_by(lambda: plain(x, hx))


@needs_kernels
@pytest.mark.parametrize("size", ["batch", "hidden", "w_hh", "b_hh", "gi"])
def test_gru_kernel_checks_its_sizes(size):
    """The kernel itself refuses sizes that would make it read or write out of bounds (a caller past the layer)."""
    b, t, h = 3, 4, 5
    args = {
        "gi": torch.randn(b, t, 3 * h),
        "h0": torch.randn(b, h),
        "w_hh": torch.randn(3 * h, h),
        "b_hh": torch.randn(3 * h),
    }
    wrong = {
        "batch": ("h0", torch.randn(1, h)),
        "hidden": ("h0", torch.randn(b, h + 1)),
        "w_hh": ("w_hh", torch.randn(3 * h, h + 1)),
        "b_hh": ("b_hh", torch.randn(h)),
        "gi": ("gi", torch.randn(b, t, 2 * h)),
    }
    name, tensor = wrong[size]
    args[name] = tensor
    with pytest.raises(RuntimeError, match="gru_layer_forward"):
        fused.kernels().gru_layer_forward(args["gi"], args["h0"], args["w_hh"], args["b_hh"], True)


@needs_kernels
def test_layer_norm_kernel_checks_its_sizes():
    with pytest.raises(RuntimeError, match="layer_norm_forward"):
        fused.kernels().layer_norm_forward(torch.randn(2, 1000), torch.randn(8), torch.randn(8), 1e-5)
    x = torch.randn(2, 8)
    y, statistics = fused.kernels().layer_norm_forward(x, torch.ones(8), torch.zeros(8), 1e-5)
    with pytest.raises(RuntimeError, match="layer_norm_backward"):
        fused.kernels().layer_norm_backward(torch.randn(2, 1000), x, torch.ones(8), statistics)


@needs_kernels
def test_traced_gru_follows_the_batch_size():
    """A trace records the zero initial state for the batch it is given; later batches of another size get theirs."""
    torch.manual_seed(0)
    gru = FusedGRU(5, 16, num_layers=2, batch_first=True).eval()
    with torch.no_grad():
        traced = torch.jit.trace(gru, torch.randn(3, 7, 5))
        for batch in (3, 6):
            x = torch.randn(batch, 7, 5)
            for expected, got in zip(gru(x), traced(x)):
                torch.testing.assert_close(got, expected)


def test_one_build_per_source_shared_by_checkouts(tmp_path, monkeypatch):
    """Checkouts with the same fused.cpp share one build folder; another source, torch or flags get their own, so
    that switching between checkouts neither rebuilds the kernels nor evicts the other's."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    one, same, changed = (tmp_path / checkout / "fused.cpp" for checkout in ("one", "same", "changed"))
    for source in (one, same, changed):
        source.parent.mkdir()
        shutil.copy(fused.SOURCE, source)
    changed.write_text(fused.SOURCE.read_text() + "// a changed kernel\n")
    directory = fused.build_directory(one)
    assert directory.parent == tmp_path / "extensions" and directory.name.startswith("garlic_fused_")
    assert fused.build_directory(same) == directory == fused.build_directory(fused.SOURCE)
    assert fused.build_directory(changed) != directory
    with monkeypatch.context() as patch:
        patch.setattr(fused, "BUILD_FLAGS", ["-O2"])
        assert fused.build_directory(one) != directory
    with monkeypatch.context() as patch:
        patch.setattr(torch, "__version__", "0.0.0+other")
        assert fused.build_directory(one) != directory
    assert fused.build_directory(one) == directory


@needs_kernels
def test_the_kernels_load_from_their_build_directory():
    module_file = Path(fused.kernels().__file__)
    assert module_file.parent == fused.build_directory() and module_file.stem == fused.build_directory().name


def fake_compile(built: list):
    """A stand-in for the compiler: writes a 'library' into the folder it is given, and notes that it ran."""

    def compile(build: Path) -> Path:
        built.append(build)
        (build / "library.so").write_bytes(b"built")
        return build / "library.so"

    return compile


def test_a_killed_build_leaves_nothing_that_blocks_the_next(tmp_path, capsys):
    """What a build killed midway leaves (its lock files, its half-built folder) is taken over at once."""
    library = tmp_path / "garlic_fused_x" / "garlic_fused_x.so"
    leftover = library.parent / "build-killed"
    leftover.mkdir(parents=True)
    (leftover / "lock").touch()  # PyTorch's own lock, which it waits on forever
    (library.parent / "build.lock").touch()
    built = []
    fused.build_once(library, fake_compile(built))
    assert library.read_bytes() == b"built" and len(built) == 1
    assert not leftover.exists() and not built[0].exists()
    assert f"building the fused CPU kernels in {library.parent}" in capsys.readouterr().err
    fused.build_once(library, fake_compile(built))  # built: nothing more to do
    assert len(built) == 1


@pytest.mark.parametrize("publishes", [True, False])
def test_a_live_build_is_waited_for(tmp_path, capsys, publishes):
    """Another process's build in progress is waited for, saying so; its library is used, or, where that build ended
    without one, this process builds it."""
    from garlic.io.locks import acquire, release

    library = tmp_path / "garlic_fused_x" / "garlic_fused_x.so"
    library.parent.mkdir()
    held = acquire(library.parent / "build.lock")

    def other_build():
        time.sleep(1)
        if publishes:
            library.write_bytes(b"theirs")
        release(held)

    other = threading.Thread(target=other_build)
    other.start()
    built = []
    fused.build_once(library, fake_compile(built))
    other.join()
    assert library.read_bytes() == (b"theirs" if publishes else b"built") and len(built) == (0 if publishes else 1)
    assert f"waiting for another process building the fused CPU kernels in {library.parent}" in capsys.readouterr().err


def test_the_wait_for_another_build_is_bounded(tmp_path, monkeypatch):
    from garlic.io.locks import acquire, release

    monkeypatch.setattr(fused, "BUILD_WAIT_SECONDS", 1.0)
    library = tmp_path / "garlic_fused_x" / "garlic_fused_x.so"
    library.parent.mkdir()
    held = acquire(library.parent / "build.lock")
    built, started = [], time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=re.escape(f"building them in {library.parent} for over 1 s")):
            fused.build_once(library, fake_compile(built))
    finally:
        release(held)
    assert time.monotonic() - started < 10 and built == [] and not library.exists()


def test_setup_with_a_stale_build_lock_ends(tmp_path, monkeypatch):
    """bin/setup's build step, where a killed build left its locks behind (the old layout's, PyTorch's, ours), ends
    in bounded time: here with no compiler (CXX=false), so with the warning that PyTorch's layers will run."""
    extensions = tmp_path / "extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    monkeypatch.setenv("CXX", "false")
    directory = fused.build_directory()
    for lock in (extensions / "garlic_fused" / "lock", directory / "build.lock", directory / "build-killed" / "lock"):
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.touch()
    root = Path(__file__).resolve().parents[1]
    finished = subprocess.run(
        [sys.executable, "-m", "garlic.models.fused"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert finished.returncode == 0, finished.stderr
    assert "fused CPU kernels unavailable; PyTorch's layers will run" in finished.stdout
    assert f"building the fused CPU kernels in {directory}" in finished.stderr
    assert "fused CPU kernels unavailable (" in finished.stderr and not (directory / "build-killed").exists()
