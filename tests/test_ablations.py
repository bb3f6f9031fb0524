import mlflow
import numpy as np
import pytest
import torch

from experiments import study
from experiments.ablations import VARIANTS, main, run_variants
from garlic.config import Config
from garlic.data import IrregularDataset, collate
from garlic.model import Garlic, StepwiseProjection
from preprocessing import synthetic

TINY = {"hidden_dim": 16, "feature_dim": 4, "batch_size": 64, "lr_cls": 3e-3, "lr_rec": 3e-3, "max_epochs": 1}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    synthetic.generate(root / "processed" / "synthetic", n_stays=160, seed=4)
    return root


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store for the module: the command below finds the variants trained before it and reuses them."""
    return tmp_path_factory.mktemp("mlruns")


def command_config() -> Config:
    """What ``python -m experiments.ablations --max-epochs 1 --set ...TINY`` builds."""
    return Config.for_dataset("synthetic").override(TINY)


def test_every_variant_switches_off_exactly_its_part(data_root):
    loaded = study.load_cohort("synthetic", data_root, "five-split", [0])
    tensors, split = loaded.tensors, loaded.splits[0]
    batch = collate([IrregularDataset(tensors, split.normalisation)[i] for i in range(8)])
    base = Config().override(TINY)
    for name, switches in VARIANTS.items():
        config = base.override(switches)
        changed = {key for key, value in config.to_dict().items() if value != base.to_dict()[key]}
        assert changed == set(switches), name
        model = Garlic(len(tensors.variables), 0, config).eval()
        with torch.no_grad():
            logits = model(batch.values, batch.mask, batch.times, batch.lengths, batch.static).logits
        assert torch.isfinite(logits).all(), name
    assert isinstance(Garlic(12, 0, base.override(VARIANTS["no_gru"])).sequence, StepwiseProjection)
    no_graph = Garlic(12, 0, base.override(VARIANTS["no_graph"])).graph
    assert not isinstance(no_graph.adjacency, torch.nn.Parameter)


@pytest.mark.slow
def test_variants_run_on_the_same_split_and_resume(data_root, store):
    loaded = study.load_cohort("synthetic", data_root, "five-split", [0])
    experiment = study.open_experiment("ablations-synthetic", store)
    records = run_variants(command_config(), loaded, experiment, ["full", "no_graph"])
    assert list(records["variant"]) == ["full", "no_graph"]
    assert np.isfinite(records["test_auroc"]).all() and np.isfinite(records["test_ece_scaled"]).all()
    # The planted graph is scored only where a graph is learned.
    assert np.isfinite(records.loc[0, "edge_recovery_auroc"]) and np.isnan(records.loc[1, "edge_recovery_auroc"])
    again = run_variants(command_config(), loaded, experiment, ["full", "no_graph"])
    assert list(again["run_id"]) == list(records["run_id"])
    assert len(mlflow.search_runs(experiment_ids=[experiment])) == 2


def test_command_prints_the_table_and_logs_it(data_root, store, tmp_path, capsys):
    main(["--data-root", str(data_root), "--mlruns", str(store), "--splits", "0", "--max-epochs", "1",
          "--variants", "no_graph", "--out", str(tmp_path / "out")]
         + [f"--set={key}={value}" for key, value in TINY.items() if key != "max_epochs"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "| no_graph | 1 |" in printed
    assert len(mlflow.search_runs(experiment_names=["ablations-synthetic"])) == 3  # reused, + the summary run
    assert (tmp_path / "out" / "ablation_results.csv").is_file()
    summary = mlflow.search_runs(experiment_names=["ablations-synthetic"], filter_string="tags.kind = 'summary'",
                                 output_format="list")  # fmt: skip
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(summary[0].info.run_id)] == [
        "ablation_results.csv", "ablation_results.md"]  # fmt: skip
