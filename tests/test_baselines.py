from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from experiments.baselines.run import main
from garlic import studies
from garlic.config import Config
from garlic.evaluation.fit_and_test import TEST_METRICS
from garlic.io.tables import write_processed
from garlic.io.tensors import IrregularTensors
from garlic.methods.recurrent import GRUD, DecayGRU, last_observed_before
from garlic.methods.summary import InputHours, SeverityScore, summary_features
from garlic.sources import synthetic
from garlic.tracking import run_contract

TINY = {"hidden_dim": 16, "feature_dim": 4, "batch_size": 64, "lr_cls": 3e-3, "lr_rec": 3e-3, "max_epochs": 1}


def test_summary_features_against_hand_computed_values():
    # One stay, 3 steps, 2 variables: v0 seen at steps 0 and 2 (5, 1); v1 never seen.
    mask = np.array([[[True, False], [False, False], [True, False]]])
    values = np.array([[[5.0, 0.0], [0.0, 0.0], [1.0, 0.0]]], dtype="float32")
    tensors = IrregularTensors(
        np.array([1]),
        values,
        mask,
        np.array([[0.0, 1.0, 2.0]], dtype="float32"),
        np.array([3]),
        np.zeros((1, 0), "float32"),
        np.array([1.0], "float32"),
        ["v0", "v1"],
        [],
    )
    features, names = summary_features(tensors)
    assert names[:2] == ["v0_first", "v1_first"] and names[-1] == "v1_count"
    by_name = dict(zip(names, features[0]))
    assert [by_name[f"v0_{s}"] for s in ("first", "last", "min", "max", "mean", "count")] == [5, 1, 1, 5, 3, 2]
    assert all(np.isnan(by_name[f"v1_{s}"]) for s in ("first", "last", "min", "max", "mean"))
    assert by_name["v1_count"] == 0


def hours_dataset(last_hours: np.ndarray, labels: np.ndarray):
    """Stays with one variable seen hourly up to ``last_hours``, as the methods receive them."""
    from garlic.data.batches import IrregularDataset
    from garlic.data.splits import Normalisation

    steps = int(last_hours.max()) + 1
    times = np.tile(np.arange(steps, dtype="float32"), (len(last_hours), 1))
    mask = times[:, :, None] <= last_hours[:, None, None]
    tensors = IrregularTensors(
        np.arange(len(labels)),
        np.where(mask, 1.0, 0.0).astype("float32"),
        mask,
        times,
        mask[:, :, 0].sum(axis=1),
        np.zeros((len(labels), 0), "float32"),
        labels.astype("float32"),
        ["v0"],
        [],
    )
    normalisation = Normalisation(
        np.zeros(1, "float32"), np.ones(1, "float32"), np.zeros(0, "float32"), np.ones(0, "float32")
    )
    return IrregularDataset(tensors, normalisation)


def test_input_hours_reads_the_length_of_the_window_and_nothing_else():
    rng = np.random.default_rng(0)
    labels = (rng.random(400) < 0.3).astype(int)
    # Positives cut before an onset (shorter windows), negatives kept whole: the length alone tells them apart.
    leaky = hours_dataset(np.where(labels == 1, rng.integers(4, 30, 400), rng.integers(20, 60, 400)), labels)
    assert InputHours().hours(leaky)[:, 0].tolist() == (leaky.tensors.lengths - 1).tolist()
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(labels, InputHours().fit(leaky, leaky).predict_proba(leaky)) > 0.85
    # One window for every stay (P12's 48 hours): one risk for all, an AUROC of 0.5.
    fixed = hours_dataset(np.full(400, 47), labels)
    risk = InputHours().fit(fixed, fixed).predict_proba(fixed)
    assert np.ptp(risk) == 0 and roc_auc_score(labels, risk) == 0.5


def test_last_observation_before_each_step():
    mask = torch.tensor([[[1.0], [0.0], [1.0], [0.0]]])
    step, seen = last_observed_before(mask)
    assert step[0, :, 0].tolist() == [0, 0, 0, 2] and seen[0, :, 0].tolist() == [False, True, True, True]


@pytest.mark.parametrize("model_class", [GRUD, DecayGRU])
def test_recurrent_baselines_ignore_padding(model_class):
    torch.manual_seed(0)
    model = model_class(3, hidden_dim=8).eval()
    values, mask = torch.randn(1, 4, 3), (torch.rand(1, 4, 3) < 0.6).float()
    times = torch.tensor([[0.0, 1.0, 2.5, 4.0]])
    padded = [torch.cat([x, torch.zeros_like(x[:, :2])], dim=1) for x in (values * mask, mask, times)]
    with torch.no_grad():
        short = model(values * mask, mask, times, torch.tensor([4]))
        long = model(*padded, torch.tensor([4]))
    torch.testing.assert_close(short, long)


def test_severity_score_maps_unknown_scores_to_the_training_median():
    def part(stays, labels):
        return SimpleNamespace(stay_ids=np.array(stays), labels=torch.tensor(labels))

    # Stays 1-5 train (5 has no score: -1), 6-7 validate, 8-10 test; stay 8's score is unknown, stay 10's is 15.
    scores = pd.Series([5, 10, 20, 25, -1, np.nan, 30, -1, 30, 15], index=range(1, 11), dtype=float)
    train, validation = part([1, 2, 3, 4, 5], [0, 0, 1, 1, 1.0]), part([6, 7], [0, 1.0])
    test = part([8, 9, 10], [0, 1, 0.0])
    fitted = SeverityScore(scores).fit(train, validation)
    assert fitted.median_ == 15.0 and np.isnan(fitted.known(test)).sum() == 1
    risk = fitted.predict_proba(test)
    assert risk[0] == risk[2] < risk[1]  # the unknown score is read as the training median


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """A small synthetic cohort whose labels table also carries SAPS-I and SOFA columns, as PhysioNet 2012's does."""
    root = tmp_path_factory.mktemp("data")
    observations, static, labels = synthetic.simulate(200, seed=5)
    rng = np.random.default_rng(0)
    labels["SAPS-I"] = (14 + 6 * labels["label"] + rng.normal(0, 4, len(labels))).round()
    labels["SOFA"] = (6 + 3 * labels["label"] + rng.normal(0, 3, len(labels))).round()
    labels.loc[:9, "SAPS-I"] = -1  # unknown, as the outcomes file writes it
    write_processed(
        root / "processed" / "synthetic", observations, static, labels, synthetic.VARIABLES, {"dataset": "synthetic"}
    )
    return root


@pytest.mark.slow
def test_the_baselines_runner_logs_each_methods_test_predictions_and_reuses_a_finished_run(data_root, tmp_path):
    config = Config().override(TINY)
    loaded = studies.load_cohort("synthetic", data_root, "five-split", [0])
    runner = studies.Baselines(config, loaded, data_root, tmp_path / "mlruns")
    methods = ["saps", "sofa", "logreg"]  # each method's own fit and risks: tests/test_method_conformance.py
    records = runner.run(methods)
    assert list(records["method"]) == methods
    for metric in TEST_METRICS:
        assert np.isfinite(records[metric]).all(), metric
    # Every method's predictions come out of the one pipeline: stay ids beside label and risk, in the test part.
    split = loaded.splits[0]
    for run_id in records["run_id"]:
        local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=run_contract.predictions("test"))
        predictions = pd.read_csv(local)
        assert list(predictions.columns) == ["stay_id", "label", "risk"]
        assert sorted(predictions["stay_id"]) == sorted(split.test)
    # The scores were made to carry the label: their AUROC is well above chance.
    assert (records.set_index("method").loc[["saps", "sofa", "logreg"], "test_auroc"] > 0.7).all()
    again = runner.run(["logreg"])
    assert again.loc[0, "run_id"] == records.loc[2, "run_id"]


def test_command_prints_the_table_with_paper_columns(data_root, tmp_path, capsys):
    main(
        [
            "--data-root",
            str(data_root),
            "--mlruns",
            str(tmp_path / "mlruns"),
            "--splits",
            "0",
            "1",
            "--methods",
            "saps",
            "logreg",
        ]
    )
    printed = capsys.readouterr().out
    assert "| method | splits | auroc | auprc | brier | ece |" in printed and "paper_auroc" in printed
    assert "| saps | 2 |" in printed and "| logreg | 2 |" in printed
    # the units in the dataset's experiment, where `garlic train` keeps its runs; the table's summary in its own
    assert len(mlflow.search_runs(experiment_names=["synthetic"])) == 4  # 2 methods x 2 splits
    assert len(mlflow.search_runs(experiment_names=["baselines-synthetic"])) == 1


@pytest.mark.parametrize("kind", ["gbm", "logreg"])
def test_a_variable_never_observed_in_training_is_left_out_instead_of_failing(kind):
    from garlic.methods.summary import SummaryModel

    generator = np.random.default_rng(0)
    stays, steps = 120, 6

    def part(never_seen: bool) -> SimpleNamespace:
        mask = generator.random((stays, steps, 3)) < 0.5
        mask[:, :, 2] &= not never_seen  # variable 2: not once in the training part, seen elsewhere
        values = generator.normal(size=mask.shape).astype("float32")
        labels = (values[:, :, 0] * mask[:, :, 0]).sum(1) > 0
        times = np.tile(np.arange(steps, dtype="float32"), (stays, 1))
        tensors = IrregularTensors(
            np.arange(stays),
            values,
            mask,
            times,
            np.full(stays, steps),
            np.zeros((stays, 0), "float32"),
            labels.astype("float32"),
            ["v0", "v1", "v2"],
            [],
        )
        return SimpleNamespace(tensors=tensors, labels=torch.tensor(labels.astype("float32")))

    train, validation = part(never_seen=True), part(never_seen=False)
    model = SummaryModel(kind).fit(train, validation)
    assert model.kept_.sum() == 18 - 5  # v2's first, last, min, max and mean; its count (0) is a value
    risks = model.predict_proba(validation)
    assert risks.shape == (stays,) and np.isfinite(risks).all()
    assert model.chosen_["validation_auroc"] > 0.7  # v0 carries the label
