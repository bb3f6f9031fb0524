"""One suite for every method of the registry (``garlic.methods.registry``): each entry, the template's and any one
registered later, is held to the contract of ``garlic.methods.contract`` with no edit here:

- one that learns a task's score (``learns_score``) is held to it on a task of that score (one prediction time per
  stay, at its end);
- its settings are its constructor's: the method built gives back, by ``get_params``, what the registry identifies
  it by, and scikit-learn's ``clone`` makes it again;
- ``fit`` returns the method, and ``predict_proba`` gives one risk in [0, 1] per stay;
- one that can be saved (``contract.can_be_saved``) is read back from its folder (``garlic.methods.saved``) with
  the same risks;
- ``predict_proba`` before ``fit`` raises scikit-learn's ``NotFittedError``;
- the same seed gives the same risks;
- one that explains each risk by its variables (``contract.explains_rows``) gives a finite contribution of every
  variable to every risk, read back from its folder alike; one that could but cannot here says why in one line.

On a small synthetic cohort, one epoch, the networks made small through the config and the methods' own settings
where they have them. An entry whose optional extra is missing is skipped, naming it.
"""

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from dataclasses import replace

from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.methods import registry
from garlic.methods.contract import can_be_saved, explains, explains_rows, unexplained_reason
from garlic.methods.saved import SavedMethod, load_method, save_method
from helpers import synthetic_cohort

# dropout 0: SeFT's attention over every observation spends most of a CPU epoch in dropout
SMALL = {"hidden_dim": 8, "feature_dim": 4, "dropout": 0.0, "max_epochs": 1, "early_stopping": 1, "device": "cpu"}


def entries() -> list:
    return [
        pytest.param(
            name,
            marks=pytest.mark.skipif(
                not spec.installed(), reason=f"needs the {spec.needs_package} extra: bin/setup {spec.needs_package}"
            ),
        )
        for name, spec in registry.METHODS.items()
    ]


every_method = pytest.mark.parametrize("name", entries())


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    torch.set_num_threads(1)
    return synthetic_cohort(tmp_path_factory, n_stays=120, seed=8)


def context(name: str, cohort) -> registry.MethodContext:
    """The unit's context: the small config, the method's own settings where it has those of ``SMALL``, and a label
    table with every column an entry reads (a score that carries the label, as SAPS-I and SOFA do)."""
    spec = registry.method(name)
    config = Config.for_dataset("synthetic").override(
        {key: value for key, value in SMALL.items() if key in registry.CONFIG_KEYS}
    )
    tensors = cohort.tensors
    labels = pd.DataFrame({"stay_id": tensors.stay_ids, "label": tensors.labels})
    noise = np.random.default_rng(0).normal(0, 3, len(labels))
    for column in {entry.needs_column for entry in registry.METHODS.values()} - {None}:
        labels[column] = (10 + 5 * labels["label"] + noise).round()
    own = {key: value for key, value in SMALL.items() if key in spec.own_settings()}
    return registry.MethodContext(config, labels, settings=own)


def parts(name: str, cohort) -> dict:
    """The cohort's parts as the entry runs on them: for one that learns a task's score, with a task of that score,
    asked once per stay at the end of its input."""
    learned = getattr(registry.method(name).create(context(name, cohort)), "learns_score", None)
    if not learned:
        return cohort.parts
    tensors = cohort.tensors
    scored = replace(tensors, task=replace(tensors.prediction_times(), score=learned))
    return {
        part: IrregularDataset(scored.subset(cohort.split.positions(tensors, part)), cohort.split.normalisation)
        for part in ("train", "validation", "test")
    }


@pytest.fixture(scope="module")
def fitted(cohort):
    """``fitted(name)``: two methods of the entry built alike and fitted on the same split, and what the first
    ``fit`` returned; fitted once per module."""
    done = {}

    def fit(name: str):
        if name not in done:
            spec, own = registry.method(name), parts(name, cohort)
            first, second = (spec.create(context(name, cohort)) for _ in range(2))
            returned = first.fit(own["train"], own["validation"])
            second.fit(own["train"], own["validation"])
            done[name] = first, second, returned
        return done[name]

    return fit


@every_method
def test_its_settings_are_its_constructors(name, cohort):
    spec, unit = registry.method(name), context(name, cohort)
    method = spec.create(unit)
    params = method.get_params()
    settings, arguments = spec.settings(unit), spec.arguments(unit)
    assert {key: params[key] for key in arguments} == arguments
    if spec.keyed_by_run:  # told apart by the run's config (GARLIC): the same config, the same arguments
        assert spec.arguments(unit.with_config(Config().override(settings))) == arguments
    else:
        assert {k: v for k, v in settings.items() if k != "method"} == arguments
    assert clone(method).get_params().keys() == params.keys()


@every_method
def test_fit_returns_the_method_and_predict_proba_gives_a_risk_in_0_1_per_stay(name, cohort, fitted):
    method, _, returned = fitted(name)
    assert returned is method
    test = parts(name, cohort)["test"]
    risks = method.predict_proba(test)
    assert risks.shape == (len(test),) and np.isfinite(risks).all() and ((risks >= 0) & (risks <= 1)).all()


@every_method
def test_the_same_seed_gives_the_same_risks(name, cohort, fitted):
    first, second, _ = fitted(name)
    test = parts(name, cohort)["test"]
    np.testing.assert_array_equal(second.predict_proba(test), first.predict_proba(test))


@every_method
def test_a_method_read_back_from_its_folder_gives_the_same_risks(name, cohort, fitted, tmp_path):
    method, _, _ = fitted(name)
    if not can_be_saved(method):
        pytest.skip(f"{name} has no save_fitted and restore_fitted (contract.can_be_saved)")
    unit, tensors = context(name, cohort), cohort.tensors
    saved = SavedMethod(
        name,
        method,
        unit.config,
        list(tensors.variables),
        list(tensors.static_features),
        cohort.split.normalisation,
        unit.settings,
    )
    loaded = load_method(save_method(tmp_path / "model", saved))
    assert type(loaded.method) is type(method) and loaded.name == name and loaded.explains == explains(method)
    test = loaded.dataset(tensors.subset(cohort.split.positions(tensors, "test")))
    np.testing.assert_array_equal(loaded.predict_proba(test), method.predict_proba(parts(name, cohort)["test"]))


@every_method
def test_predict_proba_before_fit_says_it_is_not_fitted(name, cohort):
    unfitted = registry.method(name).create(context(name, cohort))
    with pytest.raises(NotFittedError, match=f"This {type(unfitted).__name__} instance is not fitted yet"):
        unfitted.predict_proba(cohort.parts["test"])


@every_method
def test_a_method_that_explains_by_variable_gives_each_risk_a_contribution_of_every_variable(
    name, cohort, fitted, tmp_path
):
    method, _, _ = fitted(name)
    reason = unexplained_reason(method)
    assert reason is None or (reason and "\n" not in reason)
    if not explains_rows(method):
        pytest.skip(f"{name} gives no contributions here" + (f": {reason}" if reason else ""))
    test = parts(name, cohort)["test"]
    contributions = method.contributions(test)
    assert contributions.shape == (len(test.prediction_times), len(cohort.tensors.variables))
    assert np.isfinite(contributions).all() and (contributions != 0).any()
    if can_be_saved(method):
        unit, tensors = context(name, cohort), cohort.tensors
        saved = SavedMethod(
            name,
            method,
            unit.config,
            list(tensors.variables),
            list(tensors.static_features),
            cohort.split.normalisation,
            unit.settings,
        )
        loaded = load_method(save_method(tmp_path / "model", saved))
        np.testing.assert_allclose(loaded.method.contributions(test), contributions)
