"""experiments.imputation: the hidden cells, the simple imputers and the reconstruction head, on small inputs."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from experiments import imputation
from garlic.evaluation.imputation import hide, reconstructed, simple_imputations
from garlic import studies
from garlic.data.batches import IrregularDataset
from garlic.methods.field import hourly_grid
from garlic.models.compact import Garlic
from garlic.models.network_config import NetworkConfig
from garlic.tracking.store import get_run, use_store
from helpers import synthetic_cohort, tiny_run


def test_hide_draws_a_tenth_of_the_observed_cells_and_only_those():
    mask = np.random.default_rng(1).random((20, 7, 4)) < 0.5
    hidden = hide(mask, 0.1, seed=3)
    assert hidden.sum() == round(0.1 * mask.sum()) and not (hidden & ~mask).any()
    assert (hide(mask, 0.1, seed=3) == hidden).all() and (hide(mask, 0.1, seed=4) != hidden).any()


def test_simple_imputers_read_the_values_left_before_and_after():
    # one stay, one variable: values left at t = 0 h (2.0) and t = 4 h (6.0); cells at 1 h, 2 h (between) and 6 h
    times = torch.tensor([[0.0, 1.0, 2.0, 4.0, 6.0]])
    values = torch.tensor([[2.0, 0.0, 0.0, 6.0, 0.0]])[..., None]
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0]])[..., None]
    imputed = {name: guess[0, :, 0].tolist() for name, guess in simple_imputations(values, mask, times).items()}
    assert imputed["locf"][1:] == [2.0, 2.0, 2.0, 6.0]  # the value at 4 h is carried from 0 h: strictly before
    assert imputed["linear"][1:3] == pytest.approx([3.0, 4.0]) and imputed["linear"][4] == 6.0
    assert imputed["linear"][0] == 6.0  # the first step has only a later value left
    assert imputed["mean"] == [0.0] * 5
    nothing = simple_imputations(values * 0, mask * 0, times)
    assert all(guess.abs().sum() == 0 for guess in nothing.values())  # no value left: the training mean (0)


def test_the_reconstruction_head_of_a_stay_does_not_depend_on_its_batch():
    torch.manual_seed(0)
    model = Garlic(3, 2, NetworkConfig(hidden_dim=8, feature_dim=4, summary_branch=True, use_static=True))
    lengths = torch.tensor([5, 2, 4])
    values, mask = torch.randn(3, 5, 3), (torch.rand(3, 5, 3) < 0.6).float()
    times, static = torch.arange(5.0).expand(3, 5), torch.randn(3, 2)
    together = reconstructed(model, values * mask, mask, times, lengths, static)
    for stay in range(3):
        steps = int(lengths[stay])
        alone = model.eval()(
            values[stay : stay + 1, :steps] * mask[stay : stay + 1, :steps],
            mask[stay : stay + 1, :steps],
            times[stay : stay + 1, :steps],
            lengths[stay : stay + 1],
            static[stay : stay + 1],
        ).reconstruction
        torch.testing.assert_close(together[stay, :steps], alone[0])


@pytest.mark.skipif(importlib.util.find_spec("pypots") is None, reason="needs the pypots extra: bin/setup pypots")
@pytest.mark.parametrize("name", ["saits", "brits"])
def test_pypots_imputers_guess_each_hidden_cell_from_its_hour_on_the_grid(name, tmp_path_factory, monkeypatch):
    monkeypatch.setitem(imputation.FIELD_TRAINING, "epochs", 2)
    monkeypatch.setitem(imputation.FIELD_TRAINING, "patience", 1)
    cohort = synthetic_cohort(tmp_path_factory, n_stays=120, seed=5)
    tensors, split = cohort.tensors, cohort.split
    raw = tensors.subset(split.positions(tensors, "test"))
    hidden = hide(raw.mask, 0.1, seed=0)
    kept = replace(raw, mask=raw.mask & ~hidden, values=np.where(hidden, 0, raw.values))
    left = IrregularDataset(kept, split.normalisation)
    guess = imputation.field_imputation(name, cohort.parts, left, hidden, seed=0)
    assert guess.shape == (hidden.sum(),) and np.isfinite(guess).all()
    # where a hidden cell's hour still holds a value of its variable, the grid keeps it and the imputer returns it
    grid = hourly_grid(left, 48)
    stay, step, variable = np.nonzero(hidden)
    hour = np.clip(np.floor(left.times.numpy()[stay, step]), 0, 47).astype(int)
    known = grid[stay, hour, variable]
    shared = ~np.isnan(known)
    assert shared.any() and (~shared).any()
    np.testing.assert_allclose(guess[shared], known[shared], rtol=1e-5, atol=1e-5)


@pytest.fixture
def study(tmp_path_factory, tmp_path, monkeypatch):
    """The tiny run, and the study's arguments on it with ``tmp_path`` as ``--out``."""
    run = tiny_run(tmp_path_factory)
    use_store(run.store)
    # the tiny run is not the shipped preset, which is what the study looks for (as the comparison finds runs)
    monkeypatch.setattr(studies, "stored_runs", lambda *args: [(0, 0, run.store, get_run(run.run_id))])
    arguments = [
        "--dataset",
        "synthetic",
        "--protocol",
        "five-split",
        "--preset",
        "synthetic",
        "--mlruns",
        str(run.store),
        "--data-root",
        str(run.data_root),
        "--out",
        str(tmp_path),
    ]
    return run, arguments


def test_the_study_keeps_each_runs_errors_and_reads_them_back_when_run_again(study, tmp_path, monkeypatch):
    _, arguments = study
    imputation.main(arguments)
    kept = tmp_path / "imputation-synthetic-five-split-by-run" / "split_0-seed_0-overall.csv"
    first = (tmp_path / "imputation-synthetic-five-split.md").read_text()
    assert kept.is_file() and "| garlic |" in first and "| locf |" in first
    # run again: nothing is imputed, the same tables come back from the kept errors
    monkeypatch.setattr(imputation, "impute_split", lambda *args, **kwargs: pytest.fail("imputed again"))
    imputation.main(arguments)
    assert (tmp_path / "imputation-synthetic-five-split.md").read_text() == first


def test_a_run_trained_again_is_imputed_again_by_garlic_alone_and_splits_bound_the_imputers_trained(
    study, tmp_path, monkeypatch
):
    run, arguments = study
    imputation.main(arguments)
    kept = tmp_path / "imputation-synthetic-five-split-by-run" / "split_0-seed_0"
    overall, variables = (pd.read_csv(f"{kept}-{kind}.csv") for kind in ("overall", "variables"))
    # as if SAITS had been trained with an earlier run of this split, whose model the runs' store no longer holds
    saits = overall[overall["method"] == "locf"].assign(method="saits", normalised_mae=0.123)
    overall = pd.concat([overall, saits]).assign(run_id="an-earlier-run")
    overall.to_csv(f"{kept}-overall.csv", index=False)
    pd.concat([variables, variables[variables["method"] == "locf"].assign(method="saits")]).to_csv(
        f"{kept}-variables.csv", index=False
    )
    monkeypatch.setattr(imputation, "field_imputation", lambda *args: pytest.fail("a PyPOTS imputer trained"))
    imputation.main([*arguments, "--imputers", "saits", "brits", "--splits"])  # --splits alone: train none
    again = pd.read_csv(f"{kept}-overall.csv")
    assert list(again["method"]) == ["garlic", "locf", "linear", "mean", "saits"]
    assert again.set_index("method").loc["garlic", "run_id"] == run.run_id  # the run's own model imputed again
    assert again.set_index("method").loc["saits", "normalised_mae"] == 0.123  # kept: it reads no model
    table = (tmp_path / "imputation-synthetic-five-split.md").read_text()
    assert "| saits | 1 | 0.1230 ± " in table and "| brits |" not in table
    with pytest.raises(pytest.fail.Exception, match="a PyPOTS imputer trained"):
        imputation.main([*arguments, "--imputers", "brits", "--splits", "0"])
