"""``experiments.uea``: GARLIC's network with a logit per class, its fit on the alternating schedule, the scores
and their paired intervals. Small generated series; the real sets are the page's (docs/results/uea.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import f1_score

from experiments import uea as experiment
from garlic.data.batches import loader
from garlic.data.splits import load_splits
from garlic.evaluation.fit_and_test import split_parts
from garlic.io.tensors import load_tensors
from garlic.models.network_config import NetworkConfig
from garlic.sources import uea
from garlic.studies import preset_config
from test_uea import write_tiny


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """Three classes told apart by the level of the first variable, 30 + 30 series, half their values dropped."""
    folder = tmp_path_factory.mktemp("raw")
    rng = np.random.default_rng(0)
    lines = []
    for i in range(30):
        level = i % 3
        first = ",".join(f"{level * 2 + 0.3 * v:.3f}" for v in rng.normal(size=12))
        second = ",".join(f"{v:.3f}" for v in rng.normal(size=12))
        lines.append(f"{first}:{second}:{'abc'[level]}")
    destination = tmp_path_factory.mktemp("processed") / "uea-basicmotions"
    uea.preprocess(destination, "basicmotions", write_tiny(folder, lines=lines), drop_share=0.5)
    tensors = load_tensors(destination)
    return split_parts(tensors, load_splits(destination, tensors, experiment.PROTOCOL)[0])


def test_classes_garlic_gives_a_logit_per_class_and_trains_its_new_layer_in_the_prediction_stage():
    config = preset_config(experiment.PRESET, "uea-basicmotions", [])
    model = experiment.ClassesGarlic(4, 0, NetworkConfig.from_run(config), classes=5)
    values, mask = torch.randn(3, 7, 4), (torch.rand(3, 7, 4) > 0.5).float()
    times, lengths = torch.arange(7.0).expand(3, 7), torch.tensor([7, 5, 2])
    output = model(values * mask, mask, times, lengths, torch.zeros(3, 0))
    assert output.logits.shape == (3, 5)
    assert output.reconstruction.shape == (3, 7, 4)
    last = model.classifier[-1][0]
    assert {id(p) for p in last.parameters()} <= {id(p) for p in model.prediction_parameters()}


def test_fit_learns_the_classes_and_keeps_its_best_validation_epoch(parts):
    config = preset_config(experiment.PRESET, "uea-basicmotions", ["max_epochs=40", "seed=0"])
    model, fit = experiment.fit_garlic(config, parts, classes=3)
    checked = experiment.evaluate(model, parts["validation"], config)
    assert checked["ce"] == pytest.approx(fit["validation_ce"], rel=1e-5)  # the weights of the best epoch
    assert 1 <= fit["best_epoch"] <= fit["epochs"] <= 40
    test = experiment.evaluate(model, parts["test"], config)["probabilities"]
    np.testing.assert_allclose(test.sum(axis=1), 1, rtol=1e-5)
    assert (test.argmax(axis=1) == parts["test"].labels.numpy()).mean() >= 0.8  # chance: 1/3
    again, _ = experiment.fit_garlic(config, parts, classes=3)
    batch = next(iter(loader(parts["test"], 64)))
    arguments = (batch.values, batch.mask, batch.times, batch.lengths, batch.static)
    torch.testing.assert_close(model(*arguments).logits, again(*arguments).logits)  # seeded


def test_imputation_scores_the_hidden_values_of_every_imputer(parts):
    config = preset_config(experiment.PRESET, "uea-basicmotions", ["max_epochs=3"])
    model, _ = experiment.fit_garlic(config, parts, classes=3)
    errors = experiment.imputation_errors(model, parts["test"], seed=0)
    assert set(errors) == set(experiment.IMPUTERS)
    assert all(np.isfinite(error) and error > 0 for error in errors.values())


def test_weighted_scores_are_scikit_learns_on_the_resampled_series():
    rng = np.random.default_rng(1)
    labels, predicted = rng.integers(0, 4, 50), rng.integers(0, 4, 50)
    predicted[:20] = labels[:20]
    counts = rng.multinomial(50, np.full(50, 1 / 50), size=3)
    for row in counts:
        repeated = np.repeat(np.arange(50), row)
        assert experiment.accuracy(predicted, labels, row[None])[0] == pytest.approx(
            (predicted[repeated] == labels[repeated]).mean()
        )
        assert experiment.macro_f1(predicted, labels, row[None])[0] == pytest.approx(
            f1_score(labels[repeated], predicted[repeated], average="macro")
        )


def test_paired_differences_call_a_clear_gap_a_win_and_one_model_against_itself_a_tie():
    series, labels = np.arange(1, 61), np.arange(60) % 3
    rows = []
    for seed in (0, 1):
        right = labels.copy()
        wrong = np.where(np.arange(60) < 30, (labels + 1) % 3, labels)  # half wrong
        constant = np.zeros(60, dtype=int)
        for method, predicted in (("garlic", right), ("logreg", wrong), ("gbm", right), ("last_values", constant)):
            rows.append(
                pd.DataFrame(
                    {
                        "dataset": "tiny",
                        "seed": seed,
                        "method": method,
                        "stay_id": series,
                        "label": labels,
                        "predicted": predicted,
                        "cpu_seconds": 1.0,
                    }
                )
            )
    predictions = pd.concat(rows)
    table, paired = experiment.scored(predictions)
    assert experiment.one_class_notes(predictions) == [
        "last_values gives one class to every test series of tiny, in every seed."
    ]
    assert table.set_index("method").loc["logreg", "accuracy"] == pytest.approx(0.5)
    paired = paired.set_index("method")
    assert paired.loc["logreg", "accuracy_verdict"] == "win"
    assert paired.loc["logreg", "accuracy_difference"] == pytest.approx(0.5)
    assert paired.loc["gbm", "accuracy_verdict"] == "tie"
