"""A fitted method other than GARLIC as a folder, so that ``garlic predict`` and the dashboard use it as they use a
saved GARLIC model (``garlic.tracking.saved_model``).

    method.json    the method's registry name, the run's config and the method's own settings that were set (from
                   which the registry builds it again), the variable order, the static features and the training
                   split's normalisation
    fitted.json    what the method wrote beside its parameters (``garlic.tracking.saved_model.FITTED``), with its
                   name and the inputs it was fitted on: reading the folder back refuses a method.json that names
                   another method or lists the inputs otherwise (``garlic.methods.contract``)
    weights.pt     a torch method's state dict, loaded with ``weights_only=True``; or
    model.skops    a scikit-learn model in skops's format (``garlic.methods.summary.load_skops``)

Only a method that can write and read back what it fitted (``contract.can_be_saved``) is saved: the severity scores
read a column of the outcomes file that new records do not have, so they are not.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.data.splits import Normalisation
from garlic.tracking.local_store import DEFAULT_STORE, stored_model_folder
from garlic.tracking.saved_model import FITTED, ModelFileError, TrainedModel, load_model, model_input, read_fitted
from garlic.io.atomic import write_json_atomic
from garlic.io.tensors import IrregularTensors

if TYPE_CHECKING:
    from garlic.methods.contract import Method

METHOD_DESCRIPTION = "method.json"


@dataclass
class SavedMethod:
    """A fitted method with what it needs to score new stays: the variable order, the static features and the
    training split's normalisation. It explains nothing of its own (``explains``): the dashboard shows its risk."""

    name: str
    method: Method
    config: Config
    variables: list[str]
    static_features: list[str]
    normalisation: Normalisation
    settings: dict = field(default_factory=dict)  # the method's own settings, where not its defaults
    explains = False

    def dataset(self, tensors: IrregularTensors) -> IrregularDataset:
        """Stays as the method's input, normalised with the training statistics; their variables must match."""
        return model_input(tensors, self.variables, self.normalisation)

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        return self.method.predict_proba(dataset)


def save_method(folder: Path, saved: SavedMethod) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    saved.method.save_fitted(folder)
    write_json_atomic(folder / METHOD_DESCRIPTION, {
        "method": saved.name,
        "config": saved.config.to_dict(),
        "settings": saved.settings,
        "variables": saved.variables,
        "static_features": saved.static_features,
        "normalisation": saved.normalisation.to_json(),
    })  # fmt: skip
    return folder


def load_method(folder: Path) -> SavedMethod:
    """The method saved in ``folder``, built again by the registry from the saved config and given what it fitted."""
    folder = Path(folder)
    try:
        description = json.loads((folder / METHOD_DESCRIPTION).read_text())
        name, config = description["method"], Config().override(description["config"])
        settings = description.get("settings", {})  # a folder saved before methods had settings of their own: none
        normalisation = Normalisation.from_json(description["normalisation"])
        variables, static_features = list(description["variables"]), list(description["static_features"])
    except (OSError, ValueError, KeyError, TypeError) as exc:  # JSON, config and field errors alike
        raise ModelFileError(f"{folder / METHOD_DESCRIPTION}: not a readable method description ({exc!r:.200})") from None
    # Here, not above: the registry imports every method (scikit-learn, MLflow, plotting), and a GARLIC model, the one
    # a one-stay `garlic predict` usually reads, needs none of them.
    from garlic.methods import registry
    from garlic.methods.contract import can_be_saved

    try:  # an unknown method or a missing extra: the registry's own message names what to install
        method = registry.method(name).create(registry.MethodContext(config, pd.DataFrame({"stay_id": []}),
                                                                     settings=settings))  # fmt: skip
    except ValueError as exc:
        raise ModelFileError(f"{folder / METHOD_DESCRIPTION}: {exc}") from None
    if not can_be_saved(method):
        raise ModelFileError(f"{folder / METHOD_DESCRIPTION}: method {name} cannot be read back from a folder")
    _check_fitted_by(folder, name, method, {"variables": variables, "static_features": static_features})
    try:
        method.restore_fitted(folder)
    except (KeyError, TypeError) as exc:  # a field of fitted.json missing or of the wrong kind
        raise ModelFileError(f"{folder / FITTED}: not what method {name} fits ({exc!r:.200})") from None
    return SavedMethod(name, method, config, variables, static_features, normalisation, settings)


def _check_fitted_by(folder: Path, name: str, method: Method, described: dict[str, list[str]]) -> None:
    """Refuse a description that names another method than the one whose fit the folder holds (``name``: the one it
    names), or lists the inputs (variables, static features) otherwise than they were fitted: read in another order,
    each value would go into another input's column and every risk would change, silently."""
    fitted = read_fitted(folder)
    if "method" not in fitted:
        raise ModelFileError(f"{folder / FITTED}: records neither the method that wrote it nor its inputs (saved by an "
                             "older version); train the method again")  # fmt: skip
    if fitted["method"] != method.name:
        raise ModelFileError(f"{folder / METHOD_DESCRIPTION} names method {name}, but {folder / FITTED} was written by "
                             f"{fitted['method']}")  # fmt: skip
    for key, inputs in described.items():
        recorded = fitted.get(key)
        if inputs != recorded:
            recorded = recorded if isinstance(recorded, list) else []
            at = next((i for i, pair in enumerate(zip(inputs, recorded)) if pair[0] != pair[1]),
                      min(len(inputs), len(recorded)))  # the first position that differs (or where one list ends)
            raise ModelFileError(f"{folder / METHOD_DESCRIPTION}: its {key} are not those the model was fitted on, in "
                                 f"their order: {inputs[at : at + 1] or 'nothing'} at position {at}, where "
                                 f"{folder / FITTED} has {recorded[at : at + 1] or 'nothing'}; use the run's own "
                                 "model folder")  # fmt: skip


# What ``garlic predict``, ``garlic evaluate`` and the dashboard score stays with: both give ``dataset(tensors)``,
# ``predict_proba(dataset)``, ``config``, ``variables``, ``static_features`` and ``explains``.
Predictor = TrainedModel | SavedMethod


def load_predictor(run_id: str, store: Path = DEFAULT_STORE) -> Predictor:
    """The model split run ``run_id`` logged: GARLIC's (``TrainedModel``) or another method's (``SavedMethod``).

    Read from its folder in the local store when the store's database names one (``stored_model_folder``: no MLflow
    to import and open), else through MLflow, which also names what is wrong with the run."""
    folder = stored_model_folder(run_id, store)
    if folder is None:
        from garlic.tracking.store import download_run_model

        folder = download_run_model(run_id, store)
    return load_method(folder) if (folder / METHOD_DESCRIPTION).is_file() else load_model(folder)
