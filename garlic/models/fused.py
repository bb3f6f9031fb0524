"""Two of PyTorch's layers with fused CPU kernels behind them, for the shapes GARLIC gives them.

On a CPU, a training batch of the compact model spent more time in two layers than their arithmetic asks for:
``nn.GRU``, whose backward pass autograd runs step by step in several small operations (with hidden 64, a third of a
batch), and ``nn.LayerNorm`` over F = 8 features of every variable and step, whose kernels are built for long rows
(an eighth of a batch, its backward pass most of it). ``garlic/models/fused.cpp`` writes both out: each GRU step's
elementwise work in one loop, the recurrent weight's gradient in one product over all steps, the layer norm one
short row at a time. The layers below are those PyTorch layers, with the same parameters and state-dict keys; on
float CPU tensors they run the fused kernels, elsewhere (a GPU, where cuDNN does this already) PyTorch's own.

    FusedGRU:       nn.GRU(batch_first=True); the same outputs (to the last bit at GARLIC's sizes), gradients
                    within rounding
    FusedLayerNorm: nn.LayerNorm over the last axis; equal within rounding

The kernels compile on first use (``torch.utils.cpp_extension``, half a minute; ``bin/setup`` builds them), once per
source: into a folder named after a digest of ``fused.cpp``, torch's version, Python's, the compiler and its flags,
under PyTorch's extension root (``TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions``), so that checkouts
with the same source share one build and different sources never evict each other (``build_directory``). One
process builds while the others wait, at most ``BUILD_WAIT_SECONDS``, under a lock that dies with its holder
(``build_once``). Where they cannot be built or loaded, a warning says why and the layers are PyTorch's own, slower
but the same model. ``fused_kernels(False)`` turns them off for a comparison.

The layers hand the kernels only what the kernels take (float CPU tensors whose shapes, dtypes and devices match the
parameters); anything else goes to PyTorch's layer, which computes it or refuses it with its own error. The kernels
check the sizes they index by as well, for any other caller.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from garlic.io.locks import LockHeld, acquire, release

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_suffix(".cpp")
BUILD_FLAGS = ["-O3"]
# How long a process waits for another process's build of the same kernels (half a minute on a free machine, a few
# on a busy one) before it gives up on them and runs PyTorch's layers.
BUILD_WAIT_SECONDS = 600.0
_enabled = True


def ninja_on_path() -> None:
    """Put the ninja of the ``ninja`` package on PATH where none is: PyTorch runs ``ninja`` by name, and a virtual
    environment's scripts are not on PATH unless it is activated (``.venv/bin/python -m pytest`` does not)."""
    if shutil.which("ninja") is None:
        import ninja

        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


def build_directory(source: Path = SOURCE) -> Path:
    """The folder that holds the kernels built from ``source``: named (``garlic_fused_<digest>``, also the module's
    name) after a SHA-256 of the source and of what else the build depends on, under PyTorch's extension root."""
    from torch.utils.cpp_extension import get_cxx_compiler, get_default_build_root

    digest = hashlib.sha256(Path(source).read_bytes())
    for part in (
        torch.__version__,
        sys.implementation.cache_tag + sys.abiflags,
        platform.machine(),
        get_cxx_compiler(),
        *BUILD_FLAGS,
    ):
        digest.update(b"\0" + part.encode())
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / f"garlic_fused_{digest.hexdigest()[:16]}"


def _say(message: str) -> None:
    print(f"garlic: {message}", file=sys.stderr, flush=True)


def build_once(library: Path, compile: Callable[[Path], Path]) -> None:
    """Make ``library`` unless it exists: ``compile`` builds it in a fresh folder it is given and returns its path.

    One process builds at a time, holding ``build.lock`` beside the library; the operating system lets the lock go
    when its holder dies, so a killed build blocks no one, and the next builder removes the folder it left. The
    library appears by one rename, whole or not at all. The others wait, saying so once, until it appears, and take
    over a build that ended without it; after ``BUILD_WAIT_SECONDS`` they give up (``TimeoutError``).
    """
    directory = library.parent
    directory.mkdir(parents=True, exist_ok=True)
    deadline, waiting = time.monotonic() + BUILD_WAIT_SECONDS, False
    while not library.exists():
        try:
            held = acquire(directory / "build.lock", wait=False)
        except LockHeld:
            held = None
        if held is not None:
            try:
                if not library.exists():  # else built by the holder just before us
                    _build(library, compile)
                return
            finally:
                release(held)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"another process has been building them in {directory} for over "
                f"{BUILD_WAIT_SECONDS:.0f} s (it holds {directory / 'build.lock'})"
            )
        if not waiting:
            _say(f"waiting for another process building the fused CPU kernels in {directory}")
            waiting = True
        time.sleep(0.5)


def _build(library: Path, compile: Callable[[Path], Path]) -> None:
    """``build_once``'s build, under its lock: with no other builder alive, any ``build-*`` folder is a killed one's."""
    directory = library.parent
    for leftover in directory.glob("build-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    _say(f"building the fused CPU kernels in {directory} (once for this source; about half a minute)")
    build = Path(tempfile.mkdtemp(prefix="build-", dir=directory))
    try:
        os.replace(compile(build), library)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _compile(source: Path, name: str, build: Path) -> Path:
    from torch.utils.cpp_extension import LIB_EXT, load

    ninja_on_path()
    # Built, not imported here (only loaded as a library, which the import from its published path then reuses), so
    # that the module is the one at that path.
    load(name, [str(source)], extra_cflags=BUILD_FLAGS, build_directory=str(build), is_python_module=False)
    return build / f"{name}{LIB_EXT}"


def load_kernels(source: Path = SOURCE) -> ModuleType:
    """The kernels of ``source``, from ``build_directory(source)``, built there first where they are not yet."""
    from torch.utils.cpp_extension import LIB_EXT

    directory = build_directory(source)
    name = directory.name
    library = directory / f"{name}{LIB_EXT}"
    build_once(library, lambda build: _compile(source, name, build))
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def kernels():
    """The compiled module, or None (with one warning saying why) where it cannot be built."""
    try:
        return load_kernels()
    except Exception as error:  # a missing compiler or ninja, a failed build: the PyTorch layers still work
        log.warning(
            "fused CPU kernels unavailable (%s: %s); using PyTorch's GRU and layer norm",
            type(error).__name__,
            str(error).strip().splitlines()[-1] if str(error).strip() else "",
        )
        return None


@contextlib.contextmanager
def fused_kernels(enabled: bool):
    """Within the block, the layers below use the fused kernels (where available) or not: for before/after timings
    and the tests that compare both."""
    global _enabled
    previous, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = previous


def _fused_for(x: Tensor) -> bool:
    """Whether ``x`` goes through the fused kernels: a float CPU tensor, the kernels enabled and built."""
    return _enabled and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and kernels() is not None


class _GRULayer(torch.autograd.Function):
    """One GRU layer: gi [B, T, 3H] (x W_ih^T + b_ih), h0 [B, H], w_hh [3H, H], b_hh [3H] -> outputs [B, T, H]."""

    @staticmethod
    def forward(ctx, gi: Tensor, h0: Tensor, w_hh: Tensor, b_hh: Tensor) -> Tensor:
        keep = any(ctx.needs_input_grad)  # the gates only for a backward pass: none under no_grad or inference
        tensors = [tensor.contiguous() for tensor in (gi, h0, w_hh, b_hh)]
        out, gates = kernels().gru_layer_forward(*tensors, keep)
        ctx.save_for_backward(h0, w_hh, out, gates)
        return out

    @staticmethod
    def backward(ctx, d_out: Tensor):
        h0, w_hh, out, gates = ctx.saved_tensors
        return tuple(kernels().gru_layer_backward(d_out.contiguous(), h0.contiguous(), w_hh.contiguous(), out, gates))


class FusedGRU(nn.GRU):
    """``nn.GRU`` (batch first, one direction) whose layers run ``_GRULayer`` on a CPU:

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr),  z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r (W_hn h + b_hn)),  h' = (1 - z) n + z h

    with dropout on each layer's outputs but the last, as ``nn.GRU``. input [B, T, I], hx [L, B, H] or None ->
    (output [B, T, H], h_n [L, B, H])
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.batch_first or self.bidirectional or not self.bias or self.proj_size:
            raise ValueError("FusedGRU is batch first, one direction, with biases and no projection")

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        # A trace runs nn.GRU, whose zero initial state follows the batch size: ours would be recorded for one size.
        if torch.jit.is_tracing() or not self._fits_kernel(input, hx):
            return super().forward(input, hx)
        layer_input, last_states = input, []
        for layer in range(self.num_layers):
            weights = self._layer_weights(layer)
            h0 = hx[layer] if hx is not None else input.new_zeros(len(input), self.hidden_size)
            out = _GRULayer.apply(F.linear(layer_input, weights[0], weights[1]), h0, weights[2], weights[3])
            last_states.append(out[:, -1])
            layer_input = out
            if self.dropout and self.training and layer < self.num_layers - 1:
                # Dropped on the time-major outputs, as nn.GRU drops them: the same draws from the same seed.
                layer_input = F.dropout(out.transpose(0, 1).contiguous(), self.dropout).transpose(0, 1)
        return layer_input, torch.stack(last_states)

    def _layer_weights(self, layer: int) -> list[Tensor]:
        return [getattr(self, f"{name}_l{layer}") for name in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")]

    def _fits_kernel(self, input: Tensor, hx: Tensor | None) -> bool:
        """Whether the kernels take ``input`` and ``hx`` as they are. Anything else (other shapes, dtypes or devices,
        an empty sequence) goes to nn.GRU, which computes it or refuses it with its own error."""
        if not isinstance(input, Tensor) or input.dim() != 3 or input.shape[1] == 0 or not _fused_for(input):
            return False
        if input.shape[2] != self.input_size:
            return False
        if hx is not None and (
            not isinstance(hx, Tensor)
            or hx.shape != (self.num_layers, len(input), self.hidden_size)
            or hx.dtype != input.dtype
            or hx.device != input.device
        ):
            return False
        weights = [w for layer in range(self.num_layers) for w in self._layer_weights(layer)]
        return all(w.dtype == input.dtype and w.device == input.device for w in weights)


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        x = x.contiguous()
        y, statistics = kernels().layer_norm_forward(x, weight.contiguous(), bias.contiguous(), eps)
        ctx.save_for_backward(x, weight, statistics)
        return y

    @staticmethod
    def backward(ctx, d_y: Tensor):
        x, weight, statistics = ctx.saved_tensors
        d_x, d_weight, d_bias = kernels().layer_norm_backward(d_y.contiguous(), x, weight.contiguous(), statistics)
        return d_x, d_weight, d_bias, None


class FusedLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` over the last axis, with weight and bias, whose CPU pass runs ``_LayerNorm``:

        y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias      (mean and biased var over the last axis)

    x [..., F] -> y [..., F]
    """

    def __init__(self, features: int, eps: float = 1e-5):
        super().__init__(features, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        if not self._fits_kernel(x):
            return super().forward(x)
        return _LayerNorm.apply(x, self.weight, self.bias, self.eps)

    def _fits_kernel(self, x: Tensor) -> bool:
        """Whether the kernels take ``x`` as it is. Anything else (another last axis, dtype or device, no elements)
        goes to nn.LayerNorm, which computes it or refuses it with its own error."""
        if not isinstance(x, Tensor) or x.numel() == 0 or x.dim() == 0 or not _fused_for(x):
            return False
        if self.weight is None or self.bias is None or x.shape[-1:] != tuple(self.normalized_shape):
            return False
        return all(p.dtype == x.dtype and p.device == x.device for p in (self.weight, self.bias))


if __name__ == "__main__":  # bin/setup builds the kernels here, so that no training or test waits for the compiler
    print("garlic: fused CPU kernels", "built" if kernels() is not None else "unavailable; PyTorch's layers will run")
