"""The field's irregular-series classifiers from PyPOTS (the well-kept library of them): Raindrop (Zhang et al.,
ICLR 2022), SeFT (Horn et al., ICML 2020) and BRITS (Cao et al., NeurIPS 2018), as methods of ``garlic.evaluation.fit_and_test``, on
an hourly grid of the same stays. GRU-D is ours (``garlic.methods.recurrent``): PyPOTS's GRU-D tied with it on every
P12 protocol (docs/experiments.md, stop 41), so the project keeps one, the one that needs no optional extra.

PyPOTS's models read a regular grid ``X`` [N, H, D] with NaN where nothing was measured. Each stay's observations
(normalised with the split's training statistics, as every method here sees them) are put on hourly bins: bin h
holds the last value observed in [h, h + 1) hours; H is the whole hours of the training part's longest stay, and a
later observation of a validation or test stay falls in the last bin. Static features are not used. PyPOTS trains
each with Adam and cross-entropy, keeps the epoch of lowest validation cross-entropy and stops after ``patience``
epochs without a lower one: selection on validation only. PyPOTS is an optional extra (``pip install -e
'.[pypots]'``); it is imported when a model is fitted.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator

from garlic.data.batches import IrregularDataset
from garlic.methods.contract import check_fitted, fitted_inputs
from garlic.methods.saved import FITTED, WEIGHTS, load_state, read_fitted, save_weights
from garlic.training.device import resolve_device
from garlic.io.atomic import write_json_atomic

MODELS = ("raindrop", "seft", "brits")


def hourly_grid(dataset: IrregularDataset, hours: int) -> np.ndarray:
    """The stays on ``hours`` hourly bins: [N, hours, D], the last value observed in each bin, NaN where none."""
    values, mask, times = dataset.values.numpy(), dataset.mask.numpy() > 0, dataset.times.numpy()
    stays, steps, variables = mask.shape
    bins = np.clip(np.floor(times), 0, hours - 1).astype(np.int64)  # [N, T]
    # the last observed step of each (stay, bin, variable): steps are in time order, so the largest
    last = np.full((stays, hours, variables), -1)
    stay, step, variable = np.nonzero(mask)
    np.maximum.at(last, (stay, bins[stay, step], variable), step)
    s, h, d = np.nonzero(last >= 0)
    grid = np.full((stays, hours, variables), np.nan, dtype="float32")
    grid[s, h, d] = values[s, last[s, h, d], d]
    return grid


def raindrop_on_pyg_scatter() -> None:
    """PyPOTS's Raindrop layer takes ``scatter`` from torch_scatter and ``SparseTensor`` from torch_sparse, compiled
    extensions with no wheel for this torch; without them its first batch fails (``name 'scatter' is not defined``).
    PyTorch Geometric (installed with the ``pypots`` extra for this) ships pure-torch versions of both with the same
    signatures: where the extensions are missing, the layer gets those."""
    from pypots.nn.modules.raindrop import layers

    if not hasattr(layers, "scatter"):
        from torch_geometric.typing import SparseTensor
        from torch_geometric.utils import scatter

        layers.scatter, layers.SparseTensor = scatter, SparseTensor


def build(settings: "FieldModel", steps: int, variables: int):
    """A fresh PyPOTS classifier of ``settings`` (its name, size and training) for ``steps`` hourly bins of
    ``variables`` variables."""
    from pypots.classification import BRITS, Raindrop, SeFT  # the optional extra
    from pypots.utils.random import set_random_seed

    raindrop_on_pyg_scatter()

    set_random_seed(settings.seed)
    common = {"n_steps": steps, "n_features": variables, "n_classes": 2, "batch_size": settings.batch_size,
              "epochs": settings.max_epochs,
              # PyPOTS refuses a patience that the budget cannot reach; then no early stop is needed
              "patience": settings.patience if settings.patience < settings.max_epochs else None,
              "device": str(resolve_device(settings.device)), "saving_path": None, "verbose": False}  # fmt: skip
    hidden = settings.hidden_dim
    if settings.name == "raindrop":  # d_model: a few features per variable, as in the Raindrop paper
        return Raindrop(n_layers=2, d_model=4 * variables, n_heads=2, d_ffn=hidden, dropout=settings.dropout,
                        **common)  # fmt: skip
    if settings.name == "seft":
        return SeFT(n_layers=2, n_heads=2, d_model=hidden, d_ffn=2 * hidden, dropout=settings.dropout, **common)
    if settings.name == "brits":
        return BRITS(rnn_hidden_size=hidden, **common)
    raise ValueError(f"name must be one of {', '.join(MODELS)}, got {settings.name!r}")


class FieldModel(BaseEstimator):
    """PyPOTS's ``name`` (one of ``MODELS``) as a method of ``garlic.evaluation.fit_and_test``: its size
    (``hidden_dim``, ``dropout``), the batch, the epoch budget and ``patience``, the seed and the device."""

    def __init__(self, name: str, hidden_dim: int = 64, dropout: float = 0.2, batch_size: int = 64,
                 max_epochs: int = 30, patience: int = 5, seed: int = 0, device: str = "auto"):  # fmt: skip
        if name not in MODELS:
            raise ValueError(f"name must be one of {', '.join(MODELS)}, got {name!r}")
        self.name, self.hidden_dim, self.dropout, self.batch_size = name, hidden_dim, dropout, batch_size
        self.max_epochs, self.patience, self.seed, self.device = max_epochs, patience, seed, device

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "FieldModel":
        last = train.times.numpy()[np.arange(len(train)), np.maximum(train.lengths.numpy() - 1, 0)]
        self.hours_ = max(1, math.ceil(float(last.max())))
        grids = {part: hourly_grid(data, self.hours_) for part, data in (("train", train), ("val", validation))}
        self.num_variables_ = grids["train"].shape[-1]
        self.inputs_ = fitted_inputs(train)
        self.model_ = build(self, self.hours_, self.num_variables_)
        self.model_.fit({"X": grids["train"], "y": train.labels.numpy().astype(np.int64)},
                        {"X": grids["val"], "y": validation.labels.numpy().astype(np.int64)})  # fmt: skip
        return self

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return self.model_.predict_proba({"X": hourly_grid(dataset, self.hours_)})[:, 1]

    def save_fitted(self, folder: Path) -> None:
        check_fitted(self)
        save_weights(folder / WEIGHTS, self.model_.model.state_dict())  # the torch module inside PyPOTS's model
        write_json_atomic(folder / FITTED, {"method": self.name, **self.inputs_, "hours": self.hours_,
                                            "num_variables": self.num_variables_})  # fmt: skip

    def restore_fitted(self, folder: Path) -> None:
        fitted = read_fitted(folder)
        self.model_ = build(self, fitted["hours"], fitted["num_variables"])
        load_state(self.model_.model, folder / WEIGHTS)
        self.model_.model.eval()
        self.hours_, self.num_variables_ = fitted["hours"], fitted["num_variables"]
        self.inputs_ = {key: fitted[key] for key in ("variables", "static_features")}
