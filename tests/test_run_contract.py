"""A run records the stays it used; evaluation and the dashboard refuse data or splits that are not those."""

import ast
import shutil
from pathlib import Path

import mlflow
import pytest

from garlic.app import sources
from garlic import runs
from garlic.config import Config
from garlic.data.splits import load_splits
from garlic.tracking import run_contract
from garlic.tracking.run_contract import StaleRunDataError, parse_split_name
from garlic.methods.saved import load_predictor
from garlic.tracking.store import use_store
from garlic.sources import synthetic
from garlic.io.tensors import load_tensors

TINY = {"hidden_dim": 16, "feature_dim": 4, "lr_cls": 3e-3, "lr_rec": 3e-3, "batch_size": 64, "max_epochs": 1}


@pytest.fixture(scope="module")
def protocol_run(tmp_path_factory):
    """Split 0 of the five-split protocol trained with two model seeds: one parent, two nested runs."""
    root = tmp_path_factory.mktemp("contract")
    synthetic.generate(root / "processed" / "synthetic", n_stays=300, seed=5)
    store = root / "mlruns"
    parent, results = runs.train(
        Config().override(TINY), [0], data_root=root, store=store, seeds=[3, 4], preset="tiny-preset"
    )
    return root, store, parent, results


def children(store, parent):
    use_store(store)
    found = mlflow.search_runs(
        filter_string=f"tags.mlflow.parentRunId = '{parent}'", search_all_experiments=True, output_format="list"
    )
    return {run.info.run_name: run for run in found}


def test_each_seed_of_a_protocol_is_a_nested_run_with_its_own_seed(protocol_run):
    root, store, parent, results = protocol_run
    runs_by_name = children(store, parent)
    assert sorted(runs_by_name) == ["five-split/split_0/seed_3", "five-split/split_0/seed_4"]
    assert [r.split for r in results] == ["five-split/split_0/seed_3", "five-split/split_0/seed_4"]
    for seed in (3, 4):
        params = runs_by_name[f"five-split/split_0/seed_{seed}"].data.params
        assert params["seed"] == str(seed) and params["split"] == "five-split/split_0"
    assert results[0].test["auroc"] != results[1].test["auroc"]  # different seeds, different models
    parent_params = mlflow.MlflowClient().get_run(parent).data.params
    assert parent_params["seeds"] == "3,4" and parent_params["split_indices"] == "0"


def test_a_run_and_its_split_runs_carry_their_preset_which_names_them_in_the_dashboard(protocol_run):
    root, store, parent, _ = protocol_run
    split_runs = children(store, parent)
    for run in [mlflow.MlflowClient().get_run(parent), *split_runs.values()]:
        assert run.data.tags[run_contract.PRESET] == "tiny-preset"
    labels = {choice.run_id: choice.label for choice in sources.runs_with_models(store)}
    assert {labels[run.info.run_id].split(" · ")[0] for run in split_runs.values()} == {"tiny-preset"}


def test_a_nested_split_run_is_evaluated_by_its_own_id(protocol_run):
    root, store, parent, results = protocol_run
    run = children(store, parent)["five-split/split_0/seed_3"]
    assert run.data.params["data_folder"] == str(root / "processed" / "synthetic")  # on the split run itself
    evaluated = runs.evaluate_run(run.info.run_id, store, root)
    assert evaluated["auroc"] == pytest.approx(run.data.metrics["test_auroc"], abs=1e-9)


def test_evaluate_and_dashboard_refuse_a_dataset_preprocessed_again(protocol_run, tmp_path):
    root, store, parent, _ = protocol_run
    run = children(store, parent)["five-split/split_0/seed_4"]
    folder = root / "processed" / "synthetic"
    backup = tmp_path / "backup"
    shutil.copytree(folder, backup)
    try:
        # Preprocessed again from a larger cohort: the folder, its splits included, is replaced.
        synthetic.generate(folder, n_stays=400, seed=5)
        with pytest.raises(StaleRunDataError, match="no longer saved"):
            runs.evaluate_run(run.info.run_id, store, root)
        # Training anew draws a fresh split 0 there, with other stays: still refused for the old run.
        load_splits(folder, load_tensors(folder), "five-split")
        with pytest.raises(StaleRunDataError, match="holds other stays"):
            runs.evaluate_run(run.info.run_id, store, root)
        trained = load_predictor(run.info.run_id, store)
        with pytest.raises(StaleRunDataError, match="holds other stays"):
            sources.test_split(trained, run, root)
    finally:
        shutil.rmtree(folder)
        shutil.copytree(backup, folder)
    assert runs.evaluate_run(run.info.run_id, store, root)["n_test"] > 0  # the original data: accepted again


def test_a_changed_manifest_with_the_same_split_is_refused(protocol_run, tmp_path):
    root, store, parent, _ = protocol_run
    run = children(store, parent)["five-split/split_0/seed_3"]
    manifest = root / "processed" / "synthetic" / "manifest.json"
    original = manifest.read_text()
    try:
        manifest.write_text(original.replace('"counts"', '"counts_of_another_extraction"', 1))
        with pytest.raises(StaleRunDataError, match="manifest.json differs"):
            runs.evaluate_run(run.info.run_id, store, root)
    finally:
        manifest.write_text(original)


@pytest.mark.parametrize("name", ["../../etc/split_0", "five-split/../split_0", "five-split", "a/split_x", ""])
def test_split_names_that_are_not_a_protocol_and_index_are_refused(name):
    with pytest.raises(ValueError, match="is not a split name"):
        parse_split_name(name)


def test_split_names_parse():
    assert parse_split_name("garlic-reference/split_0") == ("garlic-reference", 0)


def test_a_run_is_not_resumed_on_a_split_that_changed(tmp_path):
    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=200, seed=1)
    store = tmp_path / "mlruns"
    run_id, _ = runs.train(Config().override(TINY), [0], data_root=tmp_path, store=store)
    use_store(store)
    mlflow.MlflowClient().set_terminated(run_id, "FAILED")  # as a killed run is left
    synthetic.generate(tmp_path / "processed" / "synthetic", n_stays=250, seed=1)  # preprocessed again
    with pytest.raises(StaleRunDataError, match="the stays of split five-split/split_0 in .* changed since it started"):
        runs.resume(run_id, tmp_path, store)


def test_every_tag_the_cli_writes_is_one_the_run_contract_declares():
    # What a run records is run_contract's: a tag the CLI writes by a bare string would be one nobody declared.
    cli = Path(run_contract.__file__).parents[1] / "cli.py"
    written = [
        node.args[1]
        for node in ast.walk(ast.parse(cli.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "set_tag"
    ]
    assert written, "garlic train writes its stages tag"
    for tag in written:
        assert isinstance(tag, ast.Attribute) and ast.unparse(tag.value) == "run_contract", ast.unparse(tag)
        assert hasattr(run_contract, tag.attr), tag.attr
