"""The field's models from PyPOTS (garlic.methods.field) as registered methods, on an hourly grid of the stays: each
trains as PyPOTS's own fit does, and a fit killed after an epoch or within one resumes to the same risks."""

import importlib.util
import json
import math

import mlflow
import numpy as np
import pytest
import torch

from garlic.cli import main as garlic_main
from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.data.splits import Normalisation
from garlic.methods import registry
from garlic.methods.contract import can_resume
from garlic.methods.field import FieldModel, build, hourly_grid
from garlic.tracking.store import use_store
from garlic.training.state import load_training_state, save_training_state
from garlic.training.trainer import Trainer
from helpers import synthetic_cohort, synthetic_root
from garlic.io.tensors import IrregularTensors

HAVE_PYPOTS = importlib.util.find_spec("pypots") is not None
needs_pypots = pytest.mark.skipif(not HAVE_PYPOTS, reason="needs the pypots extra: bin/setup pypots")


def test_the_hourly_grid_holds_each_hours_last_value_and_nan_where_none():
    # one stay, 2 variables: v0 at 0.2 h (1.0), 0.7 h (2.0) and 2.5 h (3.0); v1 at 1.1 h (5.0); then a step at 9 h
    times = np.array([[0.2, 0.7, 1.1, 2.5, 9.0]], dtype="float32")
    values = np.array([[[1, 0], [2, 0], [0, 5], [3, 0], [4, 0]]], dtype="float32")
    mask = values != 0
    tensors = IrregularTensors(
        np.array([7]),
        values,
        mask,
        times,
        np.array([5]),
        np.zeros((1, 0), "float32"),
        np.array([0.0], "float32"),
        ["v0", "v1"],
        [],
    )
    identity = Normalisation(np.zeros(2), np.ones(2), np.zeros(0), np.ones(0))
    grid = hourly_grid(IrregularDataset(tensors, identity), hours=4)
    expected = np.full((1, 4, 2), np.nan, dtype="float32")
    expected[0, 0, 0], expected[0, 1, 1], expected[0, 2, 0] = 2.0, 5.0, 3.0  # the later of 0.2 h and 0.7 h
    expected[0, 3, 0] = 4.0  # past the grid's last hour: in the last bin
    np.testing.assert_array_equal(grid, expected)


def test_a_method_whose_extra_is_missing_says_which_to_install(tmp_path, capsys):
    spec = registry.MethodSpec(
        "needs_extra",
        "a method of a missing package",
        "garlic.methods.field:FieldModel",
        fixed={"name": "brits"},
        needs_package="no_such_package_here",
    )
    registry.register(spec)
    try:
        with pytest.raises(SystemExit):
            garlic_main(["--data-root", str(tmp_path), "--mlruns", str(tmp_path), "train", "--method", "needs_extra"])
    finally:
        registry.METHODS.pop("needs_extra")
    assert "needs no_such_package_here, an optional extra: bin/setup no_such_package_here" in capsys.readouterr().err
    assert "needs_extra" not in registry.core_methods() and "pypots_raindrop" not in registry.core_methods()


@needs_pypots
def test_a_pypots_model_is_trained_tested_and_saved_by_garlic_train(tmp_path_factory, tmp_path, capsys):
    # one of the three (the quickest): each one's fit, risks and saved folder are tests/test_method_conformance.py's
    name = "brits"
    root = synthetic_root(tmp_path_factory, n_stays=120, seed=6)
    store = tmp_path / "mlruns"
    torch.set_num_threads(1)
    garlic_main(
        [
            "--data-root",
            str(root),
            "--mlruns",
            str(store),
            "train",
            "--method",
            f"pypots_{name}",
            "--dataset",
            "synthetic",
            "--set",
            "max_epochs=1",
        ]
    )
    use_store(store)
    (run,) = mlflow.search_runs(
        search_all_experiments=True, output_format="list", filter_string=f"tags.method = 'pypots_{name}'"
    )
    assert run.info.status == "FINISHED" and run.data.params["max_epochs"] == "1"
    assert 0 <= run.data.metrics["test_auroc"] <= 1 and np.isfinite(run.data.metrics["test_brier"])
    # its epoch's validation loss and scores are logged with the run, as GARLIC's are
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "val_bce")
    assert [m.step for m in history] == [1] and np.isfinite(history[0].value)
    assert "stage_is_prediction" not in run.data.metrics  # GARLIC's own, where its stages alternate
    # its model was saved with the run: read back, it scores the test stays as the run did
    capsys.readouterr()
    garlic_main(["--data-root", str(root), "--mlruns", str(store), "evaluate", "--run", run.info.run_id])
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["auroc"] == pytest.approx(run.data.metrics["test_auroc"], abs=1e-9)
    assert evaluated["brier"] == pytest.approx(run.data.metrics["test_brier"], abs=1e-9)


@needs_pypots
def test_raindrop_runs_on_pytorch_geometrics_scatter_where_torch_scatter_is_missing():
    from pypots.nn.modules.raindrop import layers

    from garlic.methods.field import raindrop_on_pyg_scatter

    raindrop_on_pyg_scatter()
    source, index = torch.randn(6, 3), torch.tensor([0, 2, 2, 1, 0, 2])
    expected = torch.zeros(3, 3).index_add_(0, index, source)
    torch.testing.assert_close(layers.scatter(source, index, dim=0, dim_size=3, reduce="add"), expected)


@needs_pypots
def test_seft_on_the_observed_cells_gives_the_risks_and_gradients_of_pypots_whole_grid_set(monkeypatch):
    from pypots.nn.modules.seft import BackboneSeFT

    from garlic.methods import field

    monkeypatch.setattr(field, "SET_CHUNK", 2)  # the 5 stays in 3 chunks of similar counts
    torch.manual_seed(3)
    stays, steps, variables = 5, 6, 4
    observed = torch.rand(stays, steps, variables) < 0.3
    observed[0] = False
    observed[0, 2, 1] = True  # a stay of one cell
    observed[1] = True  # one observed throughout: no padding
    grid = torch.randn(stays, steps, variables) * observed  # missing cells zero-filled, as PyPOTS passes them
    mask = observed.float()
    ours = build(FieldModel("seft", hidden_dim=16, dropout=0.0, device="cpu"), steps, variables).model.backbone
    pypots = BackboneSeFT(steps, variables, 2, n_layers=2, n_heads=2, d_model=16, d_ffn=32, dropout=0.0)
    pypots.load_state_dict(ours.state_dict())  # the same weights, PyPOTS's own forward

    ours.eval(), pypots.eval()
    torch.testing.assert_close(ours(grid, mask), pypots(grid, mask), rtol=1e-5, atol=1e-6)
    ours.train(), pypots.train()
    for model in (ours, pypots):
        model.zero_grad()
        torch.log_softmax(model(grid, mask), dim=1)[:, 1].sum().backward()
    for (name, mine), theirs in zip(ours.named_parameters(), pypots.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-6, msg=name)


@needs_pypots
def test_seft_gives_a_stay_without_observations_the_seeds_answer_not_nan():
    torch.manual_seed(4)
    observed = torch.rand(4, 6, 3) < 0.4
    observed[[0, 2]] = False  # two stays of no data
    grid, mask = torch.randn(4, 6, 3) * observed, observed.float()
    ours = build(FieldModel("seft", hidden_dim=16, dropout=0.0, device="cpu"), 6, 3).model.backbone
    logits = ours(grid, mask)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[0], logits[2])  # nothing to tell them apart
    torch.testing.assert_close(logits[[1, 3]], ours(grid[[1, 3]], mask[[1, 3]]))  # the others as without them
    pma = ours.pma  # the pooling of no element: attention adds 0 to the seeds
    seeds = pma.norm1(pma.seeds[0])
    torch.testing.assert_close(logits[0], ours.classifier(pma.norm2(seeds + pma.ffn(seeds)).reshape(-1)))
    logits.sum().backward()
    assert all(torch.isfinite(parameter.grad).all() for parameter in ours.parameters() if parameter.grad is not None)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    torch.set_num_threads(1)
    return synthetic_cohort(tmp_path_factory, n_stays=120, seed=8)


@needs_pypots
@pytest.mark.parametrize("name", ["raindrop", "seft"])
def test_a_field_model_trains_as_pypots_own_fit_and_a_killed_fit_resumes_to_the_same_risks(
    cohort, tmp_path, monkeypatch, name
):
    def first(part: str, stays: int) -> IrregularDataset:  # a few stays: SeFT attends over every observation
        dataset = cohort.parts[part]
        return IrregularDataset(dataset.tensors.subset(np.arange(stays)), dataset.normalisation)

    train, validation, test = first("train", 48), first("validation", 12), first("test", 12)
    # 2 epochs of 2 batches. Raindrop draws its dropout (SeFT's would spend most of its time).
    settings = {
        "hidden_dim": 8,
        "dropout": 0.2 if name == "raindrop" else 0.0,
        "batch_size": 24,
        "max_epochs": 2,
        "patience": 1,
        "device": "cpu",
    }
    assert can_resume(FieldModel(name))
    config = Config()  # the run's config the states are checked against: the method's own settings are not in it
    saved = []

    def save(state: dict) -> None:  # after every batch (checkpoint_seconds 0) and every epoch, as runs write them
        underway, epochs_done = state.get("epoch_pass"), state["progress"]["epoch"]
        saved.append(
            tmp_path / (f"{epochs_done + 1}-{underway['batches_done']}.pt" if underway else f"{epochs_done}-end.pt")
        )
        save_training_state(saved[-1], state, config)

    monkeypatch.setattr(Trainer, "checkpoint_seconds", 0.0)
    whole = FieldModel(name, **settings)
    whole.set_training_hooks(on_state=save)
    expected = whole.fit(train, validation).predict_proba(test)

    # PyPOTS's own fit of the same model and seed gives the same risks: states taken change nothing, either
    grid = {
        part: {"X": hourly_grid(data, whole.hours_), "y": data.labels.numpy().astype(np.int64)}
        for part, data in (("train", train), ("val", validation))
    }
    own = build(whole, whole.hours_, whole.num_variables_)
    own.fit(grid["train"], grid["val"])
    np.testing.assert_array_equal(own.predict_proba({"X": hourly_grid(test, whole.hours_)})[:, 1], expected)

    per_epoch = math.ceil(len(train) / settings["batch_size"])
    assert [path.stem for path in saved] == [
        f"{epoch}-{done}" for epoch in (1, 2) for done in [*range(1, per_epoch + 1), "end"]
    ]
    # a fit killed after epoch 1, or within epoch 2 after its first batch, leaves that state: continued from it, in a
    # fresh model (its seed drawn again, then the state's random state), it ends with the same risks
    for state in (tmp_path / "1-end.pt", tmp_path / "2-1.pt"):
        resumed = FieldModel(name, **settings)
        resumed.set_training_hooks(resume=load_training_state(state, config))
        np.testing.assert_array_equal(resumed.fit(train, validation).predict_proba(test), expected)
