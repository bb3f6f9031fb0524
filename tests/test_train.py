import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from garlic import runs
from garlic.config import Config
from garlic.data.batches import collate, loader
from garlic.metrics import binary_metrics
from garlic.models.compact import graph_penalty
from garlic.models.predict import predict_proba
from garlic.io.atomic import write_json_atomic
from garlic.methods.garlic import GarlicEstimator
from garlic.methods.model_files import LEGACY_DESCRIPTION, WEIGHTS
from garlic.methods.saved import fitted_on, load_method, load_predictor, save_method
from garlic.tracking.run_contract import GARLIC
from garlic.tracking.store import use_store
from garlic.training.losses import PREDICTION, RECONSTRUCTION, class_weights, stage_losses
import garlic.training.trainer
from garlic.training.alternating import AlternatingTrainer
from garlic.training.losses import evaluate
from garlic.training.trainer import WARMUP, cosine_factor
from helpers import synthetic_cohort, garlic_settings

FAST = {"hidden_dim": 32, "feature_dim": 8, "lr_cls": 3e-3, "lr_rec": 3e-3, "batch_size": 64}


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    cohort = synthetic_cohort(tmp_path_factory, n_stays=600, seed=1)
    return cohort.root, cohort.tensors, cohort.parts


def snapshot(parameters):
    return [p.detach().clone() for p in parameters]


def changed(before, parameters):
    return [not torch.equal(b, p.detach()) for b, p in zip(before, parameters)]


def test_each_stage_updates_only_its_own_parameters(cohort):
    _, tensors, parts = cohort
    trainer = AlternatingTrainer(
        *garlic_settings(Config().override(FAST)), len(tensors.variables), len(tensors.static_features)
    )
    model = trainer.model
    batches = loader(parts["train"], 64, shuffle=True)

    reconstruction, prediction = snapshot(model.reconstruction_parameters()), snapshot(model.prediction_parameters())
    trainer.train_epoch(batches, PREDICTION)
    assert not any(changed(reconstruction, model.reconstruction_parameters()))
    assert all(changed(prediction, model.prediction_parameters()))

    reconstruction, prediction = snapshot(model.reconstruction_parameters()), snapshot(model.prediction_parameters())
    trainer.train_epoch(batches, RECONSTRUCTION)
    assert all(changed(reconstruction, model.reconstruction_parameters()))
    assert all(changed(prediction, model.prediction_parameters()))


def test_stage_switches_after_patience_and_early_stopping_ends_training(cohort):
    _, tensors, parts = cohort
    # With zero learning rates nothing improves after the first epoch, so the schedule alone drives the stages.
    config = Config().override({**FAST, "lr_cls": 0.0, "lr_rec": 0.0, "stage_patience": 1, "early_stopping": 4})
    trainer = AlternatingTrainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features))
    fitted = trainer.fit(parts["train"], parts["validation"])
    # A new stage starts from an infinite best loss, so its first epoch always counts as an improvement.
    assert [r.stage for r in fitted.history] == [RECONSTRUCTION, RECONSTRUCTION, PREDICTION, PREDICTION, RECONSTRUCTION]
    assert fitted.best_epoch == 1


def test_stage_switches_when_progress_falls_below_the_tolerance(cohort):
    _, tensors, parts = cohort
    # The losses do fall epoch after epoch here, but never by 90%: only the first epoch of a stage counts.
    config = Config().override({**FAST, "stage_patience": 2, "stage_tolerance": 0.9, "max_epochs": 5})
    fitted = AlternatingTrainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features)).fit(
        parts["train"], parts["validation"]
    )
    assert [r.stage for r in fitted.history] == [RECONSTRUCTION] * 3 + [PREDICTION] * 2
    assert fitted.history[1].val_loss < fitted.history[0].val_loss


@pytest.mark.parametrize("tolerance, epochs", [(1e-3, 4), (0.0, 6)])
def test_early_stopping_counts_only_gains_of_the_tolerance(cohort, monkeypatch, tolerance, epochs):
    _, tensors, parts = cohort
    # Every epoch beats the last, by less than 1e-3 after the first: the best epoch is still the last one run.
    scores = iter([0.70, 0.7004, 0.7008, 0.7009, 0.7010, 0.7011])
    monkeypatch.setattr(
        garlic.training.trainer,
        "binary_metrics",
        lambda labels, risk, weights=None: {"auroc": next(scores), "auprc": 0.5},
    )
    config = Config().override({**FAST, "early_stopping": 3, "early_stopping_tolerance": tolerance, "max_epochs": 6})
    fitted = AlternatingTrainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features)).fit(
        parts["train"], parts["validation"]
    )
    assert len(fitted.history) == epochs
    assert fitted.best_epoch == epochs


def test_class_weights_give_each_outcome_half_of_the_loss():
    labels = torch.tensor([0.0] * 7 + [1.0] * 3)
    negative, positive = class_weights(labels)
    assert negative * 7 == pytest.approx(5) and positive * 3 == pytest.approx(5)
    with pytest.raises(ValueError, match="both outcomes"):
        class_weights(torch.zeros(4))


def test_balanced_loss_weights_each_stay_by_its_outcome_before_the_offset(cohort):
    _, tensors, parts = cohort
    config = Config().override(FAST)
    model = AlternatingTrainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features)).model
    model.eval()  # the same logits in both passes: no dropout
    model.logit_offset.fill_(-1.5)
    batch = collate([parts["train"][i] for i in range(32)])
    with torch.no_grad():
        losses = stage_losses(model, batch, config, weights=(0.6, 3.0))
        raw = model(batch.values, batch.mask, batch.times, batch.lengths, batch.static).logits + 1.5
    labels = batch.labels
    expected = -(3.0 * labels * F.logsigmoid(raw) + 0.6 * (1 - labels) * F.logsigmoid(-raw)).mean()
    assert float(losses["bce"]) == pytest.approx(float(expected), rel=1e-5)


def test_balanced_training_keeps_risks_at_the_real_prevalence_and_reloads(cohort, tmp_path):
    _, tensors, parts = cohort
    config = Config().override({**FAST, "balance_classes": True, "max_epochs": 3})
    estimator = GarlicEstimator.of_run(config).fit(parts["train"], parts["validation"])
    fitted = estimator.fit_result_
    train_labels = parts["train"].labels
    positives = float(train_labels.sum())
    offset = float(fitted.model.logit_offset)
    assert offset == pytest.approx(np.log(positives / (len(train_labels) - positives)), rel=1e-6)

    risk = predict_proba(fitted.model, parts["validation"])
    labels = parts["validation"].labels.numpy()
    prevalence = labels.mean()
    balanced_odds = 1 / (1 + np.exp(-(np.log(risk / (1 - risk)) - offset)))  # what the classifier itself learned
    assert abs(risk.mean() - prevalence) < 0.05 < balanced_odds.mean() - prevalence
    assert binary_metrics(labels, risk)["auroc"] > 0.75

    # Saved as every method is (method.json, fitted.json, weights.pt) and read back: the same risks, explained.
    saved = fitted_on(GARLIC, estimator, config, parts["train"])
    folder = save_method(tmp_path / "model", saved)
    reloaded = load_method(folder)
    assert isinstance(reloaded.method, GarlicEstimator) and reloaded.explains
    assert float(reloaded.model.logit_offset) == offset
    np.testing.assert_array_equal(reloaded.predict_proba(reloaded.dataset(parts["validation"].tensors)), risk)
    # A folder GARLIC saved before it was saved as a method (model.json beside its weights) reads the same.
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / WEIGHTS).write_bytes((folder / WEIGHTS).read_bytes())
    write_json_atomic(
        legacy / LEGACY_DESCRIPTION,
        {
            "config": config.to_dict(),
            "num_variables": len(tensors.variables),
            "num_static": len(tensors.static_features),
            "variables": list(tensors.variables),
            "static_features": list(tensors.static_features),
            "normalisation": saved.normalisation.to_json(),
        },
    )
    old = load_method(legacy)
    assert old.name == GARLIC and old.variables == list(tensors.variables) and old.explains
    np.testing.assert_array_equal(old.predict_proba(old.dataset(parts["validation"].tensors)), risk)
    # Weights saved before the offset existed load as an unweighted model.
    weights = torch.load(folder / WEIGHTS, weights_only=True)
    del weights["logit_offset"]
    torch.save(weights, folder / WEIGHTS)
    assert float(load_method(folder).model.logit_offset) == 0.0


def test_a_frozen_group_keeps_its_learning_rate(cohort):
    _, tensors, parts = cohort
    # Two epochs a stage; lambda_cls 0 makes the reconstruction objective constant while its parameters are frozen,
    # which (with lr_patience 0) halved lr_rec at every prediction epoch before its schedule learned to wait.
    config = Config().override(
        {**FAST, "stage_patience": 1, "stage_tolerance": 0.9, "lambda_cls": 0.0, "lr_patience": 0, "max_epochs": 4}
    )
    trainer = AlternatingTrainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features))
    rates = []
    trainer.fit(
        parts["train"],
        parts["validation"],
        on_epoch=lambda r: rates.append((r.stage, trainer.optimisers[RECONSTRUCTION].param_groups[0]["lr"])),
    )
    assert [stage for stage, _ in rates] == [RECONSTRUCTION, RECONSTRUCTION, PREDICTION, PREDICTION]
    assert rates[2][1] == rates[3][1] == rates[1][1]


def test_the_cosine_schedule_warms_up_then_decays_every_group_to_zero_over_the_budget(cohort):
    assert cosine_factor(0.0) == 0.0 and cosine_factor(WARMUP / 2) == pytest.approx(0.5)
    assert cosine_factor(WARMUP) == 1.0 and cosine_factor((1 + WARMUP) / 2) == pytest.approx(0.5)
    assert cosine_factor(1.0) == pytest.approx(0.0, abs=1e-12)
    _, tensors, parts = cohort
    config = Config().override({**FAST, "lr_schedule": "cosine", "max_epochs": 4, "stage_patience": 0})
    trainer = AlternatingTrainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features))
    rates = []
    on_epoch = lambda r: rates.append([o.param_groups[0]["lr"] for o in trainer.optimisers.values()])  # noqa: E731
    fitted = trainer.fit(parts["train"], parts["validation"], on_epoch=on_epoch)
    assert [r.stage for r in fitted.history] == [RECONSTRUCTION, PREDICTION] * 2  # the frozen group follows too
    batches = -(-len(parts["train"]) // config.batch_size)
    for epoch, (reconstruction, prediction) in enumerate(rates):
        factor = cosine_factor((epoch + (batches - 1) / batches) / config.max_epochs)  # at the epoch's last batch
        assert reconstruction == pytest.approx(config.lr_rec * factor)
        assert prediction == pytest.approx(config.lr_cls * factor)
    assert not trainer.schedulers  # no plateau schedule beside it


def test_validation_losses_keep_the_reconstruction_error_apart_from_the_objective(cohort):
    _, tensors, parts = cohort
    config = Config().override(FAST)
    model = AlternatingTrainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features)).model
    checked = evaluate(model, parts["validation"], config)
    losses = checked["losses"]
    penalty = float(graph_penalty(model).detach())  # a parameter sum: detached, it is a plain number
    assert 0 < losses["mse"] < losses[RECONSTRUCTION]
    assert losses[RECONSTRUCTION] == pytest.approx(
        losses["mse"] + config.lambda_cls * losses["bce"] + config.lambda_graph * penalty
    )
    assert losses[PREDICTION] == losses["bce"]
    risk = predict_proba(model, parts["validation"])
    np.testing.assert_allclose(checked["probabilities"], risk, atol=1e-6)
    for i in (0, 7, len(risk) - 1):  # dataset order, whatever order the length-sorted batches ran in
        stay = collate([parts["validation"][i]])
        with torch.no_grad():
            alone = torch.sigmoid(model.predict_logits(stay.values, stay.mask, stay.times, stay.lengths, stay.static))
        assert float(alone) == pytest.approx(risk[i], abs=1e-5)


def test_training_is_deterministic_and_learns(cohort):
    _, tensors, parts = cohort
    config = Config().override({**FAST, "max_epochs": 3})
    results = []
    for _ in range(2):
        trainer = AlternatingTrainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features))
        fitted = trainer.fit(parts["train"], parts["validation"])
        results.append(predict_proba(fitted.model, parts["validation"]))
    np.testing.assert_array_equal(results[0], results[1])
    assert binary_metrics(parts["validation"].labels.numpy(), results[0])["auroc"] > 0.75


def test_tracked_run_logs_metrics_artifacts_and_reloads_to_the_same_predictions(cohort, tmp_path):
    root, tensors, parts = cohort
    store = tmp_path / "mlruns"
    config = Config().override({**FAST, "max_epochs": 3})
    run_id, results = runs.train(config, [0], data_root=root, store=store)

    use_store(store)
    run = mlflow.MlflowClient().get_run(run_id)
    assert run.data.params["dataset"] == "synthetic" and run.data.params["window_size"] == "3"
    for metric in ("test_auroc", "test_auprc", "test_brier", "test_ece"):
        assert np.isfinite(run.data.metrics[metric])
    history = mlflow.MlflowClient().get_metric_history(run_id, "val_auroc")
    assert [m.step for m in history] == [1, 2, 3]
    assert len(mlflow.MlflowClient().get_metric_history(run_id, "stage_is_prediction")) == 3
    artifacts = {
        a.path
        for folder in ("", "plots", "model", "predictions", "graph")
        for a in mlflow.MlflowClient().list_artifacts(run_id, folder)
    }
    assert {
        "config.json",
        "data_manifest.json",
        "plots/roc_pr.png",
        "plots/calibration.png",
        "plots/graph.png",
        "model/weights.pt",
        "model/method.json",
        "model/fitted.json",
        "predictions/test.csv",
        "graph/adjacency.csv",
    } <= artifacts

    logged = pd.read_csv(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="predictions/test.csv"))
    reloaded = load_predictor(run_id, store)
    risk = reloaded.predict_proba(reloaded.dataset(parts["test"].tensors))
    np.testing.assert_array_equal(logged["stay_id"], parts["test"].stay_ids)
    np.testing.assert_allclose(risk, logged["risk"], rtol=1e-6, atol=1e-7)
    assert results[0].test["auroc"] == pytest.approx(binary_metrics(logged["label"], logged["risk"])["auroc"])


def test_several_splits_nest_under_one_parent_run(cohort, tmp_path):
    root, _, _ = cohort
    store = tmp_path / "mlruns"
    config = Config().override({**FAST, "max_epochs": 1})
    parent, results = runs.train(config, [0, 1], data_root=root, store=store)
    use_store(store)
    children = mlflow.search_runs(
        filter_string=f"tags.mlflow.parentRunId = '{parent}'", search_all_experiments=True, output_format="list"
    )
    assert sorted(c.info.run_name for c in children) == ["five-split/split_0", "five-split/split_1"]
    metrics = mlflow.MlflowClient().get_run(parent).data.metrics
    aurocs = [r.test["auroc"] for r in results]
    assert metrics["test_auroc_mean"] == pytest.approx(np.mean(aurocs))
    assert metrics["test_auroc_std"] == pytest.approx(np.std(aurocs))
