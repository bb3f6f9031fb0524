from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from experiments.ablations import VARIANTS, main, run_variants, unit_tags, with_published
from garlic import runs, studies
from garlic.tracking.archive import study_archive
from garlic.config import Config
from garlic.data.batches import IrregularDataset, collate
from garlic.models.compact import Garlic, StepwiseProjection
from garlic.models.network_config import NetworkConfig
from garlic.training.losses import PREDICTION, RECONSTRUCTION
from garlic.training.schedules import make_trainer
from helpers import synthetic_cohort, synthetic_root, garlic_settings

TINY = {"hidden_dim": 16, "feature_dim": 4, "batch_size": 64, "lr_cls": 3e-3, "lr_rec": 3e-3, "max_epochs": 1}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return synthetic_root(tmp_path_factory, n_stays=160, seed=4)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store for the module: the command below finds the variants trained before it and reuses them."""
    return tmp_path_factory.mktemp("mlruns")


def command_config() -> Config:
    """What ``python -m experiments.ablations --max-epochs 1 --set ...TINY`` builds."""
    return Config.for_dataset("synthetic").override(TINY)


def test_every_variant_switches_off_exactly_its_part(data_root):
    loaded = studies.load_cohort("synthetic", data_root, "five-split", [0])
    tensors, split = loaded.tensors, loaded.splits[0]
    batch = collate([IrregularDataset(tensors, split.normalisation)[i] for i in range(8)])
    base = Config().override(TINY)
    for name, switches in VARIANTS.items():
        config = base.override(switches)
        changed = {key for key, value in config.to_dict().items() if value != base.to_dict()[key]}
        assert changed == set(switches), name
        model = Garlic(len(tensors.variables), 0, NetworkConfig.from_run(config)).eval()
        with torch.no_grad():
            logits = model(batch.values, batch.mask, batch.times, batch.lengths, batch.static).logits
        assert torch.isfinite(logits).all(), name
    assert isinstance(
        Garlic(12, 0, NetworkConfig.from_run(base.override(VARIANTS["no_gru"]))).sequence, StepwiseProjection
    )
    no_graph = Garlic(12, 0, NetworkConfig.from_run(base.override(VARIANTS["no_graph"]))).graph
    assert not isinstance(no_graph.adjacency, torch.nn.Parameter)


@pytest.mark.parametrize("alternating", [True, False])
def test_joint_training_stays_in_the_reconstruction_stage_and_trains_the_graph_every_epoch(
    tmp_path_factory, alternating
):
    """The switches of the model are tested in test_model.py; this is the schedule's (``joint_training``)."""
    cohort = synthetic_cohort(tmp_path_factory, n_stays=120, seed=6)
    # A stage needs a 99% drop of its objective in an epoch to continue: the alternating schedule switches early.
    config = Config().override(
        {**TINY, "max_epochs": 3, "stage_patience": 1, "stage_tolerance": 0.99, "alternating": alternating}
    )
    trainer = make_trainer(*garlic_settings(config), len(cohort.tensors.variables), len(cohort.tensors.static_features))
    graphs = []
    result = trainer.fit(
        cohort.parts["train"],
        cohort.parts["validation"],
        on_epoch=lambda record: graphs.append(trainer.model.graph.adjacency.detach().clone()),
    )
    stages = [record.stage for record in result.history]
    if alternating:
        assert stages[0] == RECONSTRUCTION and PREDICTION in stages, stages
    else:
        assert stages == [RECONSTRUCTION] * 3
        assert all(not torch.equal(before, after) for before, after in zip(graphs, graphs[1:]))


@pytest.mark.slow
def test_variants_run_on_the_same_split_and_resume(data_root, store):
    loaded = studies.load_cohort("synthetic", data_root, "five-split", [0])
    experiment = studies.open_experiment("ablations-synthetic", store)
    records = run_variants(command_config(), loaded, experiment, store, ["full", "no_graph"])
    assert list(records["variant"]) == ["full", "no_graph"]
    assert np.isfinite(records["test_auroc"]).all() and np.isfinite(records["test_ece_scaled"]).all()
    # The planted graph is scored only where a graph is learned.
    assert np.isfinite(records.loc[0, "edge_recovery_auroc"]) and np.isnan(records.loc[1, "edge_recovery_auroc"])
    again = run_variants(command_config(), loaded, experiment, store, ["full", "no_graph"])
    assert list(again["run_id"]) == list(records["run_id"])
    assert len(mlflow.search_runs(experiment_ids=[experiment])) == 2


def test_command_prints_the_tables_pairs_each_variant_with_the_full_model_and_logs_them(
    data_root, store, tmp_path, capsys
):
    main(
        [
            "--data-root",
            str(data_root),
            "--mlruns",
            str(store),
            "--splits",
            "0",
            "--max-epochs",
            "1",
            "--variants",
            "full",
            "no_graph",
            "--out",
            str(tmp_path / "out"),
        ]
        + [f"--set={key}={value}" for key, value in TINY.items() if key != "max_epochs"]
    )
    printed = capsys.readouterr().out
    assert "| no_graph | 1 |" in printed and "| no_graph | auroc | 1 |" in printed
    assert len(mlflow.search_runs(experiment_names=["ablations-synthetic"])) == 3  # reused, + the summary run
    runs = pd.read_csv(tmp_path / "out" / "ablation_runs.csv").set_index("variant")
    paired = pd.read_csv(tmp_path / "out" / "ablation_paired.csv").set_index("metric")
    assert list(paired["variant"]) == ["no_graph", "no_graph"]
    for metric in ("auroc", "auprc"):  # one split: the mean difference is that split's, inside its interval
        expected = runs.loc["no_graph", f"test_{metric}"] - runs.loc["full", f"test_{metric}"]
        assert paired.loc[metric, "difference"] == pytest.approx(expected, abs=1e-4)
        assert paired.loc[metric, "ci_low"] <= paired.loc[metric, "difference"] <= paired.loc[metric, "ci_high"]
    assert "published_auroc" not in pd.read_csv(tmp_path / "out" / "ablation_results.csv")  # no paper numbers here
    summary = mlflow.search_runs(
        experiment_names=["ablations-synthetic"], filter_string="tags.kind = 'summary'", output_format="list"
    )
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(summary[0].info.run_id)] == [
        f"ablation_{name}.{kind}" for name in ("paired", "results", "runs") for kind in ("csv", "md")
    ]


def test_the_tables_are_made_again_from_the_run_archive_without_the_store(data_root, store, tmp_path, capsys):
    out, empty = tmp_path / "out", tmp_path / "empty-store"
    arguments = ["--data-root", str(data_root), "--splits", "0", "--max-epochs", "1", "--out", str(out)] + [
        f"--set={key}={value}" for key, value in TINY.items() if key != "max_epochs"
    ]
    main([*arguments, "--mlruns", str(store), "--variants", "full", "no_graph"])
    names = ("ablation_results", "ablation_paired", "ablation_runs")
    made = {name: pd.read_csv(out / f"{name}.csv") for name in names}
    assert sorted(p.name for p in (out / "risks").iterdir()) == sorted(
        f"{r}.csv.gz" for r in made["ablation_runs"].run_id
    )

    # another machine: the repository's folder, no store. Nothing is trained and the same tables come out.
    main([*arguments, "--mlruns", str(empty), "--variants", "full", "no_graph"])
    assert list(mlflow.search_runs(experiment_names=["ablations-synthetic"])["tags.kind"]) == ["summary"]
    for name in names:
        pd.testing.assert_frame_equal(pd.read_csv(out / f"{name}.csv"), made[name], check_like=True)

    # a narrower call keeps the other variant's archived run
    main([*arguments, "--mlruns", str(empty), "--variants", "full"])
    assert sorted(pd.read_csv(out / "ablation_runs.csv")["variant"]) == ["full", "no_graph"]

    # runs made on other data are never read back: with none left, nothing is tabulated (and nothing trained here)
    runs = pd.read_csv(out / "ablation_runs.csv").assign(data_digest="other data")
    runs.to_csv(out / "ablation_runs.csv", index=False)
    with pytest.raises(SystemExit, match="no ablation run has finished"):
        main([*arguments, "--mlruns", str(empty), "--variants", "full", "--workers", "2", "--deadline", "0"])
    # nor dropped from it when a run on this data is added
    archive = study_archive(out, "ablation_runs", "synthetic", data_root)
    assert archive.on_this_data().empty and len(archive.runs) == 2
    table = archive.runs_table(
        pd.DataFrame([{"variant": "full", "split": 0, "settings": "new", "run_id": "r"}]),
        ["variant", "split", "settings"],
    )
    assert len(table) == 3 and set(table["data_digest"]) == {"other data", archive.data_digest}
    capsys.readouterr()


def test_the_papers_auroc_sits_beside_each_variant_on_p12_and_p19():
    table = pd.DataFrame({"variant": ["full", "no_gru", "joint_training"]})
    assert list(with_published(table, "physionet2012")["published_auroc"]) == [0.8640, 0.7690, 0.8532]
    assert list(with_published(table, "physionet2019-raindrop")["published_auroc"]) == [0.9096, 0.7526, 0.9008]
    assert "published_auroc" not in with_published(table, "mimic3-garlic")


def test_workers_train_each_unfinished_unit_in_its_own_process_then_tabulate(data_root, tmp_path, capsys):
    store, carried = tmp_path / "mlruns", tmp_path / "unfinished"
    main(
        [
            "--data-root",
            str(data_root),
            "--mlruns",
            str(store),
            "--splits",
            "0",
            "--max-epochs",
            "1",
            "--variants",
            "full",
            "no_gru",
            "--workers",
            "2",
            "--out",
            str(tmp_path / "out"),
            "--carry",
            str(carried),
        ]
        + [f"--set={key}={value}" for key, value in TINY.items() if key != "max_epochs"]
    )
    printed = capsys.readouterr().out
    assert "full/split_0: done" in printed and "no_gru/split_0: done" in printed
    assert carried.is_dir() and not any(carried.iterdir())  # each worker carried its state, gone once finished
    assert len(list((store / "logs").glob("ablation-synthetic-*.log"))) == 2  # one process per unit
    runs = mlflow.search_runs(experiment_names=["ablations-synthetic"], output_format="list")
    units = [r for r in runs if r.data.tags.get("kind") != "summary"]
    assert sorted(r.data.tags["variant"] for r in units) == ["full", "no_gru"]
    assert all(r.info.status == "FINISHED" for r in units)
    paired = pd.read_csv(tmp_path / "out" / "ablation_paired.csv")
    assert list(paired["variant"]) == ["no_gru", "no_gru"]

    main(
        [
            "--data-root",
            str(data_root),
            "--mlruns",
            str(store),
            "--splits",
            "0",
            "--max-epochs",
            "1",
            "--variants",
            "full",
            "no_gru",
            "--workers",
            "2",
        ]
        + [f"--set={key}={value}" for key, value in TINY.items() if key != "max_epochs"]
    )
    assert "running 0 units" in capsys.readouterr().out  # both finished: nothing trained again


def test_a_variant_whose_store_is_gone_goes_on_from_its_carried_state_and_ends_as_the_uninterrupted_one(
    data_root, tmp_path, monkeypatch
):
    # The P19 ablation units take about an hour each: one cut off with its session goes on in the next.
    loaded = studies.load_cohort("synthetic", data_root, "five-split", [0])
    config, carried = command_config().override({"max_epochs": 3}), tmp_path / "unfinished"
    archive = study_archive(None, "ablation_runs", "synthetic", data_root)

    def variants_in(store):
        experiment = studies.open_experiment("ablations-synthetic", store)
        return run_variants(config, loaded, experiment, store, ["no_graph"], archive=archive, carried=carried)

    whole = variants_in(tmp_path / "whole")
    saved = runs.save_training_state

    def save_then_die(path, state, config):
        saved(path, state, config)
        if state["progress"]["epoch"] == 2:
            raise KeyboardInterrupt("the machine went away")

    monkeypatch.setattr(runs, "save_training_state", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        variants_in(tmp_path / "gone")
    monkeypatch.undo()
    (state,) = carried.iterdir()
    assert state.name.startswith("ablation-no_graph-five-split-split_0-")
    resumed = variants_in(tmp_path / "fresh")
    assert list(carried.iterdir()) == []
    steps = [m.step for m in mlflow.MlflowClient().get_metric_history(resumed["run_id"][0], "val_auroc")]
    assert 1 not in steps and steps[-1] == 3
    tested = [column for column in whole.columns if column.startswith("test_")]
    pd.testing.assert_frame_equal(resumed[tested], whole[tested])


def test_each_variant_is_archived_as_it_finishes_so_a_call_cut_off_later_loses_none(data_root, tmp_path, monkeypatch):
    loaded = studies.load_cohort("synthetic", data_root, "five-split", [0])
    out = tmp_path / "out"
    archive = study_archive(out, "ablation_runs", "synthetic", data_root)
    experiment = studies.open_experiment("ablations-synthetic", tmp_path / "gone")
    fit = runs.fit_and_test_resuming

    def cut_off_in_no_graph(estimator, parts, variant, store, carried=None):
        if not variant.use_graph:
            raise KeyboardInterrupt("the machine went away")
        return fit(estimator, parts, variant, store, carried)

    monkeypatch.setattr(runs, "fit_and_test_resuming", cut_off_in_no_graph)
    with pytest.raises(KeyboardInterrupt):
        run_variants(command_config(), loaded, experiment, tmp_path / "gone", ["full", "no_graph"], archive=archive)
    kept = pd.read_csv(out / "ablation_runs.csv")
    assert list(kept["variant"]) == ["full"] and (out / "risks" / f"{kept['run_id'][0]}.csv.gz").is_file()
    monkeypatch.undo()
    # the next machine, its store empty, trains the variant that was cut off and reads the other from the archive
    again = study_archive(out, "ablation_runs", "synthetic", data_root)
    fresh = studies.open_experiment("ablations-synthetic", tmp_path / "fresh")
    records = run_variants(command_config(), loaded, fresh, tmp_path / "fresh", ["full", "no_graph"], archive=again)
    assert list(records["variant"]) == ["full", "no_graph"] and records["run_id"][0] == kept["run_id"][0]
    assert len(mlflow.search_runs(experiment_ids=[fresh])) == 1
    assert sorted(pd.read_csv(out / "ablation_runs.csv")["variant"]) == ["full", "no_graph"]


def test_a_variant_archived_before_a_config_key_was_added_is_found_by_the_same_digest():
    # The committed study's units were archived before `hours_input` and `hourly_target` existed; at the values that
    # train as before, those keys leave a variant's digest alone, so the study is made again from its archive.
    archive = Path(__file__).resolve().parents[1] / "docs" / "results" / "studies" / "ablations-physionet2012-raindrop"
    kept = pd.read_csv(archive / "ablation_runs.csv", dtype=str).set_index(["variant", "split"])
    config = studies.preset_config("physionet2012-fast", "physionet2012", ["split_protocol=raindrop"])
    for variant in VARIANTS:
        assert unit_tags(config, variant, 0)["settings"] == kept.loc[(variant, "0"), "settings"], variant
    other = config.override({"hourly_target": "utility"})  # a value that trains otherwise: another unit
    assert unit_tags(other, "full", 0)["settings"] != kept.loc[("full", "0"), "settings"]
