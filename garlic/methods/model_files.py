"""The files of a saved method's folder: the one on-disk format of a fitted model, every method's alike, which
``garlic.methods.saved`` writes and reads back.

    method.json    the method's registry name, the run's config and the method's own settings that were set (from
                   which the method is built again), the variable order, the static features and the training
                   split's normalisation (``write_description`` / ``read_description``)
    fitted.json    what the method wrote beside its parameters (``FITTED``), with its name and the inputs it was
                   fitted on: a folder is refused whose method.json names another method or lists the inputs
                   otherwise (``check_fitted_by``)
    weights.pt     a torch method's state dict (``WEIGHTS``: GARLIC's network, GRU-D's ...), written atomically
                   (``save_weights``) and loaded with ``weights_only=True`` (``load_weights``, ``load_state``); or
    model.skops    a scikit-learn model in skops's format (``garlic.methods.summary.load_skops``)

GARLIC saved its models before in a folder of its own, ``model.json`` (``LEGACY_DESCRIPTION``: the config, the
variables, the static features and the normalisation) beside ``weights.pt``. Such a folder, in a store trained
before, is still read: as the method.json and fitted.json of a GARLIC that it describes (``_legacy``).

Nothing here builds a method (that is the registry's, ``garlic.methods.saved.load_method``), so every method's module
imports this one and none of them imports the loader.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

from garlic.config import Config
from garlic.data.splits import Normalisation
from garlic.io.atomic import atomic_file, write_json_atomic
from garlic.tracking.run_contract import GARLIC

METHOD_DESCRIPTION = "method.json"
FITTED = "fitted.json"
WEIGHTS = "weights.pt"
LEGACY_DESCRIPTION = "model.json"  # GARLIC's folder before it was saved as a method: read, never written


class ModelFileError(ValueError):
    """A saved model whose files do not load (truncated, not a weights file, or not the model described)."""


@dataclass(frozen=True)
class Description:
    """A folder's method.json read back: the method's registry name, the run's config, the method's own settings
    that were set, its inputs in their order and the training split's normalisation; ``path``, the file read."""

    method: str
    config: Config
    settings: dict
    variables: list[str]
    static_features: list[str]
    normalisation: Normalisation
    path: Path


def write_description(
    folder: Path,
    method: str,
    config: Config,
    settings: dict,
    variables: list[str],
    static_features: list[str],
    normalisation: Normalisation,
) -> None:
    write_json_atomic(
        Path(folder) / METHOD_DESCRIPTION,
        {
            "method": method,
            "config": config.to_dict(),
            "settings": settings,
            "variables": variables,
            "static_features": static_features,
            "normalisation": normalisation.to_json(),
        },
    )


def read_description(folder: Path) -> Description:
    """The folder's method.json (a legacy GARLIC folder's ``LEGACY_DESCRIPTION``, as the method.json it stands for);
    one line naming the file when it does not read."""
    folder = Path(folder)
    legacy = _is_legacy(folder)
    described = folder / (LEGACY_DESCRIPTION if legacy else METHOD_DESCRIPTION)
    try:
        description = _legacy(folder)[0] if legacy else json.loads(described.read_text())
        return Description(
            description["method"],
            Config().override(description["config"]),
            description.get("settings", {}),  # a folder saved before methods had settings of their own: none
            list(description["variables"]),
            list(description["static_features"]),
            Normalisation.from_json(description["normalisation"]),
            described,
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:  # JSON, config and field errors alike
        raise ModelFileError(f"{described}: not a readable method description ({exc!r:.200})") from None


def check_fitted_by(folder: Path, description: Description, fitted_by: str) -> None:
    """Refuse a description that names another method than the one whose fit the folder holds (``fitted_by``: the
    name of the method built from it), or lists the inputs (variables, static features) otherwise than they were
    fitted: read in another order, each value would go into another input's column and every risk would change,
    silently."""
    fitted = read_fitted(folder)
    if "method" not in fitted:
        raise ModelFileError(
            f"{folder / FITTED}: records neither the method that wrote it nor its inputs (saved by an "
            "older version); train the method again"
        )
    if fitted["method"] != fitted_by:
        raise ModelFileError(
            f"{folder / METHOD_DESCRIPTION} names method {description.method}, but {folder / FITTED} was written by "
            f"{fitted['method']}"
        )
    described = {"variables": description.variables, "static_features": description.static_features}
    for key, inputs in described.items():
        recorded = fitted.get(key)
        if inputs != recorded:
            recorded = recorded if isinstance(recorded, list) else []
            at = next(
                (i for i, pair in enumerate(zip(inputs, recorded)) if pair[0] != pair[1]),
                min(len(inputs), len(recorded)),
            )  # the first position that differs (or where one list ends)
            raise ModelFileError(
                f"{folder / METHOD_DESCRIPTION}: its {key} are not those the model was fitted on, in "
                f"their order: {inputs[at : at + 1] or 'nothing'} at position {at}, where "
                f"{folder / FITTED} has {recorded[at : at + 1] or 'nothing'}; use the run's own "
                "model folder"
            )


def read_fitted(folder: Path) -> dict:
    """The JSON a method wrote beside its fitted parameters (``FITTED``; a legacy GARLIC folder's, from its
    ``LEGACY_DESCRIPTION``)."""
    folder = Path(folder)
    legacy = _is_legacy(folder)
    try:
        return _legacy(folder)[1] if legacy else json.loads((folder / FITTED).read_text())
    except (OSError, ValueError, KeyError) as exc:
        path = folder / (LEGACY_DESCRIPTION if legacy else FITTED)
        raise ModelFileError(f"{path}: missing, not JSON or not a model's description ({type(exc).__name__})") from None


def _is_legacy(folder: Path) -> bool:
    return not (folder / METHOD_DESCRIPTION).is_file() and (folder / LEGACY_DESCRIPTION).is_file()


def _legacy(folder: Path) -> tuple[dict, dict]:
    """The method.json and fitted.json that a legacy GARLIC folder's ``LEGACY_DESCRIPTION`` stands for."""
    description = json.loads((folder / LEGACY_DESCRIPTION).read_text())
    inputs = {key: description[key] for key in ("variables", "static_features")}
    return (
        {"method": GARLIC, "config": description["config"], "normalisation": description["normalisation"], **inputs},
        {"method": GARLIC, **inputs},
    )


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


def load_state(module: torch.nn.Module, path: Path, weights: dict | None = None) -> None:
    """Load the state dict in ``path`` (weights only; or ``weights``, read from it) into ``module``; one line naming
    the file when it does not fit."""
    try:
        module.load_state_dict(load_weights(path) if weights is None else weights)
    except RuntimeError:
        raise ModelFileError(f"{path}: the weights do not fit the model its folder describes") from None
