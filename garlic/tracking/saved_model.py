"""A trained model as a folder: weights (loaded with ``weights_only=True``) and a JSON description.

The description holds everything needed to use the model on new stays: the config, the variable order and the
training split's normalisation statistics.
"""
from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.data.splits import Normalisation
from garlic.models.architectures import build_model
from garlic.models.compact import Garlic
from garlic.models.predict import predict_proba
from garlic.io.atomic import atomic_file, write_json_atomic
from garlic.io.tensors import IrregularTensors

WEIGHTS = "weights.pt"
DESCRIPTION = "model.json"
FITTED = "fitted.json"  # what a method other than GARLIC fitted beside its weights (garlic.methods.saved)


class ModelFileError(ValueError):
    """A saved model whose files do not load (truncated, not a weights file, or not the model described)."""


@dataclass
class TrainedModel:
    model: Garlic
    variables: list[str]
    static_features: list[str]
    normalisation: Normalisation
    explains = True  # the dashboard shows its explanations (built in, or integrated gradients)

    @property
    def config(self) -> Config:
        return self.model.config

    def dataset(self, tensors: IrregularTensors) -> IrregularDataset:
        """Stays as model input, normalised with the training statistics; their variables must match."""
        return model_input(tensors, self.variables, self.normalisation)

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        return predict_proba(self.model, dataset)


def model_input(tensors: IrregularTensors, variables: list[str], normalisation: Normalisation) -> IrregularDataset:
    """Stays as a saved model's input, normalised with its training statistics; refused unless their variables are
    the model's, in its order."""
    if list(tensors.variables) != variables:
        raise ValueError(f"the stays' variables {list(tensors.variables)} differ from the model's {variables}")
    return IrregularDataset(tensors, normalisation)


def save_model(folder: Path, trained: TrainedModel) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_weights(folder / WEIGHTS, trained.model.state_dict())
    write_json_atomic(
        folder / DESCRIPTION,
        {
            "config": trained.config.to_dict(),
            "num_variables": trained.model.num_variables,
            "num_static": trained.model.num_static,
            "variables": trained.variables,
            "static_features": trained.static_features,
            "normalisation": trained.normalisation.to_json(),
        },
    )
    return folder


def load_model(folder: Path, device: str = "cpu") -> TrainedModel:
    folder = Path(folder)
    if not (folder / DESCRIPTION).is_file() or not (folder / WEIGHTS).is_file():
        raise FileNotFoundError(f"{folder} holds no saved model (expected {WEIGHTS} and {DESCRIPTION})")
    try:
        description = json.loads((folder / DESCRIPTION).read_text())
        config = Config().override(description["config"])
        model = build_model(description["num_variables"], description["num_static"], config)
        normalisation = Normalisation.from_json(description["normalisation"])
        trained = TrainedModel(model, description["variables"], description["static_features"], normalisation)
    except (ValueError, KeyError, TypeError) as exc:  # JSON, config and field errors alike
        raise ModelFileError(f"{folder / DESCRIPTION}: not a readable model description ({exc!r:.200})") from None
    weights = load_weights(folder / WEIGHTS, device)
    weights.setdefault("logit_offset", torch.zeros(()))  # saved before the offset existed: trained unweighted
    try:
        model.load_state_dict(weights)
    except RuntimeError:
        message = f"{folder / WEIGHTS}: the weights do not fit the model that {DESCRIPTION} describes"
        raise ModelFileError(message) from None
    model.eval()
    return trained


def save_weights(path: Path, state: dict[str, torch.Tensor]) -> None:
    """A state dict of tensors, written atomically (a killed write leaves no half file)."""
    with atomic_file(path) as out:
        torch.save(state, out)


def load_weights(path: Path, device: str = "cpu") -> dict:
    """The state dict in ``path``, loaded with ``weights_only=True``; any failure is one line naming the file."""
    try:
        weights = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:  # weights_only refused something that is not plain tensors: nothing was run
        raise ModelFileError(f"{path}: holds objects other than tensors; refused, not loaded") from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise ModelFileError(f"{path}: truncated or not a PyTorch weights file ({type(exc).__name__})") from None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise ModelFileError(f"{path}: not a state dict of tensors")
    return weights


def load_state(module: torch.nn.Module, path: Path) -> None:
    """Load the state dict in ``path`` (weights only) into ``module``; one line naming the file when it does not fit."""
    try:
        module.load_state_dict(load_weights(path))
    except RuntimeError:
        raise ModelFileError(f"{path}: the weights do not fit the model its folder describes") from None


def read_fitted(folder: Path) -> dict:
    """The JSON a method wrote beside its fitted parameters (``FITTED``)."""
    try:
        return json.loads((Path(folder) / FITTED).read_text())
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{Path(folder) / FITTED}: missing or not JSON ({type(exc).__name__})") from None
