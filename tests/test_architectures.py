"""garlic.models.architectures: every architecture offers the members its callers use, and builds from its own
network settings (``NetworkConfig``), not the whole run config."""

from __future__ import annotations

import pytest
import torch

from garlic.config import Config, ConfigError
from garlic.models.architectures import ARCHITECTURES, Architecture, build_model
from garlic.models.compact import step_mask
from garlic.models.network_config import NetworkConfig
from garlic.training.schedules import make_trainer
from helpers import random_batch, garlic_settings


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture_keeps_the_contract_its_callers_use(name):
    model = build_model(4, 3, NetworkConfig(hidden_dim=8, feature_dim=4, window_size=2, architecture=name)).eval()
    assert isinstance(model, Architecture) and isinstance(model, ARCHITECTURES[name])
    values, mask, times, lengths, static = random_batch()
    model.prepare(times, lengths)
    assert model.explanation_unavailable is None or isinstance(model.explanation_unavailable, str)
    with torch.no_grad():
        output = model(values, mask, times, lengths, static)
        logits = model.predict_logits(values, mask, times, lengths, static)
        encoded = model.encode(values, mask, times)
        replayed, _ = model.classify(
            encoded.states,
            step_mask(lengths, values.shape[1]),
            static,
            None if encoded.summaries is None else encoded.summaries[:, -1],
        )
    torch.testing.assert_close(logits, output.logits, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(model.reconstruction_loss(output, values, mask))
    groups = [{id(p) for p in model.prediction_parameters()}, {id(p) for p in model.reconstruction_parameters()}]
    assert groups[0] and groups[1] and not groups[0] & groups[1]
    assert groups[0] | groups[1] == {id(p) for p in model.parameters()}
    assert replayed.shape == logits.shape


def test_an_unknown_architecture_is_refused_naming_the_known_ones():
    stale = NetworkConfig(
        architecture="mtand"
    )  # past the run config's own check, as a stale saved description could be
    with pytest.raises(ConfigError, match="architecture must be one of compact, reference"):
        build_model(4, 3, stale)


@pytest.mark.parametrize("schedule", ["compact", "reference"])
def test_a_trained_network_holds_its_own_settings_not_the_run_config(schedule):
    run = Config(
        hidden_dim=8,
        feature_dim=4,
        window_size=2,
        use_graph=False,
        architecture=schedule,
        schedule=schedule,
        lr_cls=0.5,
        max_epochs=3,
        seed=7,
    )
    network = make_trainer(*garlic_settings(run), 4, 0).model.config
    assert network == NetworkConfig(hidden_dim=8, feature_dim=4, window_size=2, use_graph=False, architecture=schedule)
    # What only trains the network (rates, epochs, seed) is no setting of it.
    assert NetworkConfig.from_run(run.override({"lr_cls": 0.1, "max_epochs": 9, "seed": 1})) == network
