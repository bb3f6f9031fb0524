import mlflow
import numpy as np
import pytest
import torch

from garlic.config import Config
from garlic.data.batches import IrregularDataset, collate
from garlic.data.splits import load_splits
from garlic.explain.built_in import explain, normalised_graph
from garlic.explain.integrated_gradients import GRADIENTS, gradient_explanation, ig_importance, integrated_gradients
from garlic.explain.report import edge_recovery_auroc, log_explanations, observation_table, signal_table
from garlic.models.architectures import build_model
from garlic.models.compact import Garlic
from garlic.models.network_config import NetworkConfig
from garlic.tracking.store import use_experiment, use_store
from garlic.sources import synthetic
from garlic.io.tensors import load_tensors
from helpers import synthetic_root

SMALL = {"hidden_dim": 16, "feature_dim": 4, "dropout": 0.0}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """An untrained (seeded) model and a batch of 24 synthetic stays: the properties below hold for any weights."""
    folder = synthetic_root(tmp_path_factory, n_stays=60, seed=3) / "processed" / "synthetic"
    tensors = load_tensors(folder)
    split = load_splits(folder, tensors)[0]
    dataset = IrregularDataset(tensors, split.normalisation)
    torch.manual_seed(0)
    model = Garlic(len(tensors.variables), 0, NetworkConfig.from_run(Config().override(SMALL))).eval()
    # A trained encoder has non-zero biases; at its all-zero initial bias, features vanish near the all-missing input
    # and the layer norm after them turns steep there, which only a long integration path resolves.
    torch.nn.init.normal_(model.encoder.bias)
    batch = collate([dataset[i] for i in range(24)])
    return model, batch, dataset, tensors, split


def test_explanation_shapes(setup):
    model, batch, _, tensors, _ = setup
    b, t, d = batch.values.shape
    explanation = explain(model, batch, tensors.variables)
    assert explanation.observation.shape == (b, t, d)
    assert explanation.signal.shape == (b, d)
    assert explanation.edges.shape == (b, d, d)
    assert explanation.graph.shape == (d, d)
    assert explanation.risk.shape == (b,)
    assert explanation.cohort_signal().index.tolist() != []


def test_importance_is_zero_where_nothing_was_observed_and_sums_to_one_per_stay(setup):
    model, batch, _, tensors, _ = setup
    explanation = explain(model, batch, tensors.variables)
    observation = explanation.observation
    assert (observation >= 0).all()
    assert (observation[batch.mask == 0] == 0).all()  # unobserved cells and padding steps alike
    torch.testing.assert_close(observation.sum(dim=(1, 2)), torch.ones(len(batch)))
    torch.testing.assert_close(explanation.signal, observation.sum(1))
    torch.testing.assert_close(explanation.graph.sum(0), torch.ones(len(tensors.variables)))  # over sources


def test_a_stay_with_no_observation_gets_no_importance(setup):
    model, batch, _, tensors, _ = setup
    empty = type(batch)(**{**batch.__dict__, "mask": batch.mask.clone(), "values": batch.values.clone()})
    empty.mask[0] = 0
    empty.values[0] = 0
    explanation = explain(model, empty, tensors.variables)
    assert (explanation.observation[0] == 0).all()
    torch.testing.assert_close(explanation.observation[1:].sum(dim=(1, 2)), torch.ones(len(batch) - 1))


def test_a_stay_is_explained_the_same_alone_or_in_a_batch(setup):
    model, batch, dataset, tensors, _ = setup
    alone = collate([dataset[5]])
    steps = int(alone.lengths[0])
    together = explain(model, batch, tensors.variables).observation[5, :steps]
    torch.testing.assert_close(explain(model, alone, tensors.variables).observation[0, :steps], together)


def test_normalised_graph_is_the_absolute_adjacency_over_its_column_sum(setup):
    model, _, _, _, _ = setup
    adjacency = model.graph.adjacency.detach().abs()
    torch.testing.assert_close(normalised_graph(model), adjacency / adjacency.sum(0, keepdim=True))


def test_edge_recovery_auroc_against_hand_made_graphs():
    variables = ["A", "B", "C"]
    planted = [{"source": "A", "target": "B"}]
    # Off-diagonal pairs: A->B (planted) and five others. A->B ranked first: 1.0; last: 0.0; tied with two: 0.8.
    best = np.array([[9, 5, 1], [2, 9, 3], [4, 1.5, 9]])
    assert edge_recovery_auroc(best, variables, planted) == 1.0
    worst = np.array([[9, 0.5, 1], [2, 9, 3], [4, 1.5, 9]])
    assert edge_recovery_auroc(worst, variables, planted) == 0.0
    tied = np.array([[9, 2, 1], [2, 9, 0], [2, 0, 9]])  # beats 3 of 5, ties 2: (3 + 0.5 * 2) / 5
    assert edge_recovery_auroc(tied, variables, planted) == pytest.approx(0.8)


def test_tables_list_every_observed_value_in_original_units_as_the_model_saw_it(setup):
    model, batch, _, tensors, split = setup
    explanation = explain(model, batch, tensors.variables)
    stay_ids = tensors.stay_ids[:24]
    table = observation_table(explanation, batch, stay_ids, split.normalisation)
    assert len(table) == int(batch.mask.sum())
    stay, step, variable = np.nonzero(tensors.mask[:24])
    norm = split.normalisation
    seen = np.clip(tensors.values[:24][stay, step, variable], norm.value_low[variable], norm.value_high[variable])
    np.testing.assert_allclose(np.sort(table["value"].to_numpy()), np.sort(seen), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(table.groupby("stay_id")["importance"].sum(), 1.0, rtol=1e-5)
    signals = signal_table(explanation, stay_ids)
    assert len(signals) == 24 * len(tensors.variables)


def test_explanations_are_logged_with_edge_recovery_on_the_synthetic_cohort(setup, tmp_path):
    model, _, dataset, _, _ = setup
    use_store(tmp_path / "mlruns")
    use_experiment("explain-test", tmp_path / "mlruns")
    planted = [edge.__dict__ for edge in synthetic.PLANTED_GRAPH]
    with mlflow.start_run() as run:
        summary = log_explanations(model, dataset, planted=planted)
    assert 0.0 <= summary["edge_recovery_auroc"] <= 1.0
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "explanations")}
    assert {
        "explanations/observation_importance.parquet",
        "explanations/summary_graph.csv",
        "explanations/signal_importance.png",
    } <= logged


def test_integrated_gradients_shapes_zero_off_observations_and_normalisation(setup):
    model, batch, _, _, _ = setup
    importance = ig_importance(model, batch, steps=4)
    assert importance.shape == batch.values.shape
    assert (importance[batch.mask == 0] == 0).all()
    torch.testing.assert_close(importance.sum(dim=(1, 2)), torch.ones(len(batch)))


def plain_integrated_gradients(model, batch, steps):
    """The formula of garlic.explain.integrated_gradients written out: (x dF/dx + m dF/dm) averaged at the midpoints alpha = (i + 0.5)
    / steps of the path from the empty stay."""
    total = torch.zeros_like(batch.values)
    for alpha in (torch.arange(steps, dtype=torch.float32) + 0.5) / steps:
        values, mask = (alpha * batch.values).requires_grad_(), (alpha * batch.mask).requires_grad_()
        logits = model(values, mask, batch.times, batch.lengths, batch.static).logits
        value_grad, mask_grad = torch.autograd.grad(logits.sum(), (values, mask))
        total += value_grad * batch.values + mask_grad * batch.mask
    return total / steps


def test_captums_integrated_gradients_are_the_formula(setup):
    model, batch, _, _, _ = setup
    model.eval()
    batch = type(batch)(**{name: None if tensor is None else tensor[:6] for name, tensor in batch.__dict__.items()})
    torch.testing.assert_close(
        integrated_gradients(model, batch, steps=5), plain_integrated_gradients(model, batch, 5), rtol=1e-4, atol=1e-6
    )


def test_integrated_gradients_are_complete(setup):
    """Summed over cells, IG gives logit(stay) - logit(nothing observed), up to the path integral's small error."""
    model, batch, _, _, _ = setup
    batch = type(batch)(**{name: None if tensor is None else tensor[:4] for name, tensor in batch.__dict__.items()})
    attribution = integrated_gradients(model, batch, steps=16)
    with torch.no_grad():
        logits = model(batch.values, batch.mask, batch.times, batch.lengths, batch.static).logits
        empty = model(batch.values * 0, batch.mask * 0, batch.times, batch.lengths, batch.static).logits
    gap = logits - empty
    torch.testing.assert_close(attribution.sum(dim=(1, 2)), gap, atol=0.02 * float(gap.abs().max()), rtol=0)


def test_a_reference_model_is_explained_by_integrated_gradients_without_edges(setup):
    """The reference architecture has no built-in explanation; the one it allows: IG per observed value, summed over
    time per variable, its risks those of the model, and no edges."""
    _, batch, _, tensors, _ = setup
    torch.manual_seed(0)
    config = Config().override({**SMALL, "architecture": "reference", "schedule": "reference"})
    model = build_model(len(tensors.variables), 0, NetworkConfig.from_run(config)).eval()
    model.prepare(batch.times, batch.lengths)
    assert model.explanation_unavailable is not None
    explained = gradient_explanation(model, batch, tensors.variables, steps=4)
    assert explained.method == GRADIENTS and explained.edges is None and explained.graph is None
    torch.testing.assert_close(explained.observation, ig_importance(model, batch, steps=4))
    torch.testing.assert_close(explained.signal, explained.observation.sum(1))
    with torch.no_grad():
        logits = model(batch.values, batch.mask, batch.times, batch.lengths, batch.static).logits
    torch.testing.assert_close(explained.risk, torch.sigmoid(logits))
    assert explained.signal.sum(1).gt(0.99).sum() == batch.mask.flatten(1).any(1).sum()  # a share per observed stay
