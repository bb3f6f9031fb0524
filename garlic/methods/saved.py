"""A fitted method as a folder, GARLIC's as every other's: what ``garlic train`` logs with each split run
(``fitted_on``, ``log_method``) and ``garlic predict``, ``garlic evaluate``, the dashboard and the studies read back
(``load_predictor``) as one object, ``SavedMethod``: the method, built again by the registry from the folder's
description and given what it fitted. The folder's files are ``garlic.methods.model_files``'.

Only a method that can write and read back what it fitted (``contract.can_be_saved``) is saved: the severity scores
read a column of the outcomes file that new records do not have, so they are not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.data.splits import Normalisation
from garlic.io.tensors import IrregularTensors
from garlic.methods import registry
from garlic.methods.contract import Method, can_be_saved, explains
from garlic.methods.model_files import FITTED, Description, ModelFileError, check_fitted_by, read_description
from garlic.methods.model_files import write_description
from garlic.tracking.local_store import DEFAULT_STORE, stored_model_folder


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
    write_description(
        folder,
        saved.name,
        saved.config,
        saved.settings,
        saved.variables,
        saved.static_features,
        saved.normalisation,
    )
    return folder


def log_method(saved: SavedMethod) -> None:
    """Log ``saved`` as the active MLflow run's model folder (``garlic.tracking.run_contract.MODEL``)."""
    from garlic.tracking.store import log_model_folder  # MLflow, which reading a folder back never needs

    log_model_folder(lambda folder: save_method(folder, saved))


def load_method(folder: Path) -> SavedMethod:
    """The method saved in ``folder``, built again from the saved config and given what it fitted."""
    folder = Path(folder)
    described = read_description(folder)
    method = _built(described)
    if not can_be_saved(method):
        raise ModelFileError(f"{described.path}: method {described.method} cannot be read back from a folder")
    check_fitted_by(folder, described, method.name)
    try:
        method.restore_fitted(folder)
    except (KeyError, TypeError) as exc:  # a field of fitted.json missing or of the wrong kind
        raise ModelFileError(f"{folder / FITTED}: not what method {described.method} fits ({exc!r:.200})") from None
    return SavedMethod(
        described.method,
        method,
        described.config,
        described.variables,
        described.static_features,
        described.normalisation,
        described.settings,
    )


def _built(described: Description) -> Method:
    """A fresh method of the description's name, config and own settings, as the registry builds it (importing that
    method's module alone: a saved GARLIC scoring one stay imports no scikit-learn, MLflow or plotting)."""
    try:  # an unknown method or a missing extra: the registry's own message names what to install
        return registry.method(described.method).create(
            registry.MethodContext(described.config, pd.DataFrame({"stay_id": []}), settings=described.settings)
        )
    except ValueError as exc:
        raise ModelFileError(f"{described.path}: {exc}") from None


def load_predictor(run_id: str, store: Path = DEFAULT_STORE) -> SavedMethod:
    """The method split run ``run_id`` logged, whichever it is.

    Read from its folder in the local store when the store's database names one (``stored_model_folder``: no MLflow
    to import and open), else through MLflow, which also names what is wrong with the run."""
    folder = stored_model_folder(run_id, store)
    if folder is None:
        from garlic.tracking.queries import download_run_model

        folder = download_run_model(run_id, store)
    return load_method(folder)
