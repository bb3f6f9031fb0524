"""A fitted method as a folder, GARLIC's as every other's: the one on-disk contract of a saved model, which ``garlic
train`` logs with each split run and ``garlic predict``, ``garlic evaluate``, the dashboard and the studies read back
(``load_predictor``) as one object, ``SavedMethod``.

    method.json    the method's registry name, the run's config and the method's own settings that were set (from
                   which the method is built again), the variable order, the static features and the training
                   split's normalisation
    fitted.json    what the method wrote beside its parameters (``FITTED``), with its name and the inputs it was
                   fitted on: reading the folder back refuses a method.json that names another method or lists the
                   inputs otherwise (``garlic.methods.contract``)
    weights.pt     a torch method's state dict (``WEIGHTS``: GARLIC's network, GRU-D's ...), loaded with
                   ``weights_only=True``; or
    model.skops    a scikit-learn model in skops's format (``garlic.methods.summary.load_skops``)

Only a method that can write and read back what it fitted (``contract.can_be_saved``) is saved: the severity scores
read a column of the outcomes file that new records do not have, so they are not.

GARLIC saved its models before in a folder of its own, ``model.json`` (``LEGACY_DESCRIPTION``: the config, the
variables, the static features and the normalisation) beside ``weights.pt``. Such a folder, in a store trained
before, is still read: as the method.json and fitted.json of a GARLIC that it describes (``_legacy``).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import pandas as pd
import torch

from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.data.splits import Normalisation
from garlic.io.atomic import atomic_file, write_json_atomic
from garlic.io.tensors import IrregularTensors
from garlic.methods.contract import Method, can_be_saved, check_fitted, explains
from garlic.models.predict import predict_proba
from garlic.tracking.local_store import DEFAULT_STORE, stored_model_folder

if TYPE_CHECKING:
    from garlic.training.trainer import EpochRecord
from garlic.tracking.run_contract import GARLIC

METHOD_DESCRIPTION = "method.json"
FITTED = "fitted.json"
WEIGHTS = "weights.pt"
LEGACY_DESCRIPTION = "model.json"  # GARLIC's folder before it was saved as a method: read, never written


class ModelFileError(ValueError):
    """A saved model whose files do not load (truncated, not a weights file, or not the model described)."""


@dataclass
class SavedMethod:
    """A fitted method with what it needs to score new stays: the variable order, the static features and the
    training split's normalisation. A method that explains its risks (``explains``: GARLIC) gives the dashboard and
    the studies its fitted network (``model``); the others show their risk only."""

    name: str
    method: Method
    config: Config
    variables: list[str]
    static_features: list[str]
    normalisation: Normalisation
    settings: dict = field(default_factory=dict)  # the method's own settings, where not its defaults

    @property
    def explains(self) -> bool:
        return explains(self.method)

    @property
    def model(self) -> torch.nn.Module:
        """The fitted network whose explanations ``garlic.explain`` computes (a method that ``explains`` only)."""
        return self.method.model

    def dataset(self, tensors: IrregularTensors) -> IrregularDataset:
        """Stays as the method's input, normalised with the training statistics; their variables must match."""
        return model_input(tensors, self.variables, self.normalisation)

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        return self.method.predict_proba(dataset)


def model_input(tensors: IrregularTensors, variables: list[str], normalisation: Normalisation) -> IrregularDataset:
    """Stays as a saved method's input, normalised with its training statistics; refused unless their variables are
    the method's, in its order."""
    if list(tensors.variables) != variables:
        raise ValueError(f"the stays' variables {list(tensors.variables)} differ from the model's {variables}")
    return IrregularDataset(tensors, normalisation)


def fitted_on(
    name: str, method: Method, config: Config, train: IrregularDataset, settings: dict | None = None
) -> SavedMethod:
    """``method`` (registered as ``name``, built from ``config`` and its own ``settings``), fitted on ``train``: with
    its inputs and normalisation."""
    tensors = train.tensors
    return SavedMethod(
        name,
        method,
        config,
        list(tensors.variables),
        list(tensors.static_features),
        train.normalisation,
        dict(settings or {}),
    )


def save_method(folder: Path, saved: SavedMethod) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    saved.method.save_fitted(folder)
    write_json_atomic(
        folder / METHOD_DESCRIPTION,
        {
            "method": saved.name,
            "config": saved.config.to_dict(),
            "settings": saved.settings,
            "variables": saved.variables,
            "static_features": saved.static_features,
            "normalisation": saved.normalisation.to_json(),
        },
    )
    return folder


def log_method(saved: SavedMethod) -> None:
    """Log ``saved`` as the active MLflow run's model folder (``garlic.tracking.run_contract.MODEL``)."""
    from garlic.tracking.store import log_model_folder  # MLflow, which reading a folder back never needs

    log_model_folder(lambda folder: save_method(folder, saved))


def load_method(folder: Path) -> SavedMethod:
    """The method saved in ``folder``, built again from the saved config and given what it fitted."""
    folder = Path(folder)
    legacy = _is_legacy(folder)
    described = folder / (LEGACY_DESCRIPTION if legacy else METHOD_DESCRIPTION)
    try:
        description = _legacy(folder)[0] if legacy else json.loads(described.read_text())
        name, config = description["method"], Config().override(description["config"])
        settings = description.get("settings", {})  # a folder saved before methods had settings of their own: none
        normalisation = Normalisation.from_json(description["normalisation"])
        variables, static_features = list(description["variables"]), list(description["static_features"])
    except (OSError, ValueError, KeyError, TypeError) as exc:  # JSON, config and field errors alike
        raise ModelFileError(f"{described}: not a readable method description ({exc!r:.200})") from None
    method = _built(name, config, settings, described)
    if not can_be_saved(method):
        raise ModelFileError(f"{described}: method {name} cannot be read back from a folder")
    _check_fitted_by(folder, name, method, {"variables": variables, "static_features": static_features})
    try:
        method.restore_fitted(folder)
    except (KeyError, TypeError) as exc:  # a field of fitted.json missing or of the wrong kind
        raise ModelFileError(f"{folder / FITTED}: not what method {name} fits ({exc!r:.200})") from None
    return SavedMethod(name, method, config, variables, static_features, normalisation, settings)


def _built(name: str, config: Config, settings: dict, described: Path) -> Method:
    """A fresh ``name`` of ``config`` and its own ``settings``, as the registry builds it. GARLIC, the model a
    one-stay ``garlic predict``
    usually reads, is built from its own module: the registry imports every method (scikit-learn, MLflow,
    plotting), which GARLIC scoring a stay needs none of."""
    if name == GARLIC:
        from garlic.methods.garlic import GarlicEstimator

        return GarlicEstimator(config)
    from garlic.methods import registry

    try:  # an unknown method or a missing extra: the registry's own message names what to install
        return registry.method(name).create(
            registry.MethodContext(config, pd.DataFrame({"stay_id": []}), settings=settings)
        )
    except ValueError as exc:
        raise ModelFileError(f"{described}: {exc}") from None


def _check_fitted_by(folder: Path, name: str, method: Method, described: dict[str, list[str]]) -> None:
    """Refuse a description that names another method than the one whose fit the folder holds (``name``: the one it
    names), or lists the inputs (variables, static features) otherwise than they were fitted: read in another order,
    each value would go into another input's column and every risk would change, silently."""
    fitted = read_fitted(folder)
    if "method" not in fitted:
        raise ModelFileError(
            f"{folder / FITTED}: records neither the method that wrote it nor its inputs (saved by an "
            "older version); train the method again"
        )
    if fitted["method"] != method.name:
        raise ModelFileError(
            f"{folder / METHOD_DESCRIPTION} names method {name}, but {folder / FITTED} was written by "
            f"{fitted['method']}"
        )
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


class ResumableFit:
    """What the methods whose fit runs ``garlic.training``'s loop (``Trainer.fit``) share: they resume
    (``garlic.methods.contract.can_resume``), their fit taking the hooks of ``set_training_hooks``."""

    def set_training_hooks(
        self,
        on_epoch: Callable[[EpochRecord], None] | None = None,
        on_state: Callable[[dict], None] | None = None,
        resume: dict | None = None,
    ) -> None:
        """What ``fit`` calls after every epoch, where it hands the fit's state (``garlic.training.state``) after every
        epoch and within long ones, and a state to continue from."""
        self._training_hooks = {"on_epoch": on_epoch, "on_state": on_state, "resume": resume}

    def training_hooks(self) -> dict:
        """The hooks of ``set_training_hooks`` (none before it is called), keyed as ``Trainer.fit`` takes them (an
        attribute of its own, not a setting: scikit-learn's settings are the constructor's arguments). Within an
        active MLflow run, each epoch's ``epoch_metrics`` are logged to it (step: the epoch) before ``on_epoch``."""
        import mlflow

        hooks = dict(getattr(self, "_training_hooks", dict.fromkeys(("on_epoch", "on_state", "resume"))))
        if mlflow.active_run() is not None:
            on_epoch = hooks["on_epoch"]

            def log_epoch(record: EpochRecord) -> None:
                mlflow.log_metrics(self.epoch_metrics(record), step=record.epoch)
                if on_epoch is not None:
                    on_epoch(record)

            hooks["on_epoch"] = log_epoch
        return hooks

    def epoch_metrics(self, record: EpochRecord) -> dict[str, float]:
        """What an epoch logs: its record's losses and validation scores."""
        return record.metrics()


class NetworkMethod(ResumableFit):
    """What the methods whose fit is one torch network (``model_``, over the inputs of ``inputs_``) share, GARLIC's and
    the recurrent baselines': their risks are the network's (``garlic.models.predict``), they are saved as the
    network's weights (``WEIGHTS``) and a fitted.json of their name, their inputs and ``fitted_beside_inputs``, and
    they resume (``ResumableFit``)."""

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return predict_proba(self.model_, dataset)

    def save_fitted(self, folder: Path) -> None:
        check_fitted(self)
        save_weights(folder / WEIGHTS, self.model_.state_dict())
        write_json_atomic(folder / FITTED, {"method": self.name, **self.inputs_, **self.fitted_beside_inputs()})

    def fitted_beside_inputs(self) -> dict:
        """What fitted.json keeps beside the method's name and inputs, for ``restore_fitted`` to read back."""
        return {}


def load_state(module: torch.nn.Module, path: Path, weights: dict | None = None) -> None:
    """Load the state dict in ``path`` (weights only; or ``weights``, read from it) into ``module``; one line naming
    the file when it does not fit."""
    try:
        module.load_state_dict(load_weights(path) if weights is None else weights)
    except RuntimeError:
        raise ModelFileError(f"{path}: the weights do not fit the model its folder describes") from None


def load_predictor(run_id: str, store: Path = DEFAULT_STORE) -> SavedMethod:
    """The method split run ``run_id`` logged, whichever it is.

    Read from its folder in the local store when the store's database names one (``stored_model_folder``: no MLflow
    to import and open), else through MLflow, which also names what is wrong with the run."""
    folder = stored_model_folder(run_id, store)
    if folder is None:
        from garlic.tracking.queries import download_run_model

        folder = download_run_model(run_id, store)
    return load_method(folder)
