"""A trained model as a folder: weights (loaded with ``weights_only=True``) and a JSON description.

The description holds everything needed to use the model on new stays: the config, the variable order and the
training split's normalisation statistics.
"""
from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.data.splits import Normalisation
from garlic.models.architectures import build_model
from garlic.models.compact import Garlic
from preprocessing.atomic import atomic_file, write_json_atomic
from preprocessing.tensors import IrregularTensors

WEIGHTS = "weights.pt"
DESCRIPTION = "model.json"


class ModelFileError(ValueError):
    """A saved model whose files do not load (truncated, not a weights file, or not the model described)."""


@dataclass
class TrainedModel:
    model: Garlic
    variables: list[str]
    static_features: list[str]
    normalisation: Normalisation

    @property
    def config(self) -> Config:
        return self.model.config

    def dataset(self, tensors: IrregularTensors) -> IrregularDataset:
        """Stays as model input, normalised with the training statistics; their variables must match."""
        if list(tensors.variables) != self.variables:
            raise ValueError(
                f"the stays' variables {list(tensors.variables)} differ from the model's {self.variables}"
            )
        return IrregularDataset(tensors, self.normalisation)


def save_model(folder: Path, trained: TrainedModel) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(folder / WEIGHTS) as out:
        torch.save(trained.model.state_dict(), out)
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
    weights = _load_weights(folder / WEIGHTS, device)
    weights.setdefault("logit_offset", torch.zeros(()))  # saved before the offset existed: trained unweighted
    try:
        model.load_state_dict(weights)
    except RuntimeError:
        message = f"{folder / WEIGHTS}: the weights do not fit the model that {DESCRIPTION} describes"
        raise ModelFileError(message) from None
    model.eval()
    return trained


def _load_weights(path: Path, device: str) -> dict:
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
