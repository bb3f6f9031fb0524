"""experiments.search: an Optuna study on validation only, every trial an MLflow run, shared through its storage."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import optuna
import pandas as pd
import pytest
import sqlalchemy

from experiments import search
from garlic import studies
from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.data.datasets import processed_folder
from garlic.data.splits import Split
from garlic.methods.garlic import GarlicEstimator
from garlic.metrics.utility import choose_threshold, stay_lengths
from garlic.sources import synthetic
from garlic.tracking.store import use_store

TINY = ["--max-epochs", "2", "--set", "hidden_dim=16", "--set", "feature_dim=4"]
REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("search-data")
    synthetic.generate(processed_folder("synthetic", root), n_stays=300, seed=3)
    return root


@pytest.fixture
def no_test_part(monkeypatch):
    """Any attempt to build a split's test part fails the test: the search must never read it."""
    positions = Split.positions

    def guarded(self, tensors, part):
        assert part != "test", "the search built a test part"
        return positions(self, tensors, part)

    monkeypatch.setattr(Split, "positions", guarded)


@pytest.fixture
def presets(tmp_path, monkeypatch):
    """The shipped presets, copied to a folder the search writes its presets into (``search.CONFIG_DIR``)."""
    folder = tmp_path / "repository" / "experiments" / "configs"
    shutil.copytree(search.CONFIG_DIR, folder)
    monkeypatch.setattr(search, "CONFIG_DIR", folder)
    return folder


def arguments(data_root, store, *extra):
    return [
        "--dataset",
        "synthetic",
        "--preset",
        "synthetic",
        "--data-root",
        str(data_root),
        "--mlruns",
        str(store),
        "--space",
        "lr_cls",
        "dropout",
        "--sampler-seed",
        "0",
        *TINY,
        *extra,
    ]


def test_trials_are_tracked_runs_scored_on_validation_and_a_second_process_adds_to_the_study(
    data_root, tmp_path, no_test_part, capsys, presets
):
    store = tmp_path / "mlruns"
    search.main(arguments(data_root, store, "--splits", "0", "1", "--trials", "2", "--write-preset", "best"))
    storage = f"sqlite:///{store / 'optuna.db'}"
    found = optuna.load_study(study_name="search-synthetic-five-split", storage=storage)
    assert [t.state for t in found.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert set(found.best_params) == {"lr_cls", "dropout"}
    # the first trial is the preset itself, so that every other is compared with it on the same splits
    assert found.trials[0].params == {"lr_cls": 1e-3, "dropout": 0.2} and found.trials[0].user_attrs["starting_point"]
    assert found.trials[1].params != found.trials[0].params and not found.trials[1].user_attrs

    use_store(store)
    runs = mlflow.search_runs(experiment_names=["search-synthetic"], output_format="list")
    trials = {r.data.tags["trial"]: r for r in runs if r.info.run_name.startswith("trial_")}
    splits = [r for r in runs if not r.info.run_name.startswith("trial_")]
    assert sorted(trials) == ["0", "1"] and len(splits) == 4
    for trial in found.trials:
        run = trials[str(trial.number)]
        assert run.data.metrics["validation_auroc"] == pytest.approx(trial.value)
        assert float(run.data.params["lr_cls"]) == pytest.approx(trial.params["lr_cls"])
    for run in runs:  # nothing about the test parts is logged anywhere
        assert not [m for m in run.data.metrics if m.startswith("test")]
        assert not [a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "predictions")]
    assert {r.data.params["split"] for r in splits} == {"five-split/split_0", "five-split/split_1"}
    assert all("val_auroc" in r.data.metrics for r in splits)  # the per-epoch curves

    written = json.loads((presets / "best.json").read_text())
    assert written["lr_cls"] == found.best_params["lr_cls"] and written["max_epochs"] == 2
    assert Config.load(presets / "best.json").hidden_dim == 16
    assert "2 trials (2 complete)" in capsys.readouterr().out

    search.main(arguments(data_root, store, "--splits", "0", "1", "--trials", "1"))
    assert len(optuna.load_study(study_name="search-synthetic-five-split", storage=storage).trials) == 3
    with pytest.raises(SystemExit, match="searches other settings \\(splits\\)"):
        search.main(arguments(data_root, store, "--splits", "0", "--trials", "1"))

    # --trials 0 reports the study as it stands: budget, best trial, importances, every trial, the history figure
    report_dir = tmp_path / "report"
    search.main(arguments(data_root, store, "--splits", "0", "1", "--trials", "0", "--out", str(report_dir)))
    found = optuna.load_study(study_name="search-synthetic-five-split", storage=storage)
    assert len(found.trials) == 3
    page = (report_dir / "search-synthetic-five-split.md").read_text()
    assert "3 trials (3 complete)" in page and f"**Best:** trial {found.best_trial.number}," in page
    assert "--trials 0" in page and "| lr_cls |" in page and "| dropout |" in page
    assert (
        f"**Starting point** (the preset's own values): trial 0, validation AUROC {found.trials[0].value:.4f}" in page
    )
    trials = pd.read_csv(report_dir / "search-synthetic-five-split-trials.csv")
    assert trials["validation_auroc"].tolist() == pytest.approx([t.value for t in found.trials])
    assert (report_dir / "search-synthetic-five-split-history.png").read_bytes().startswith(b"\x89PNG")

    # The study is kept beside its report: a new machine's empty store takes it from there and adds to it.
    elsewhere = tmp_path / "elsewhere"
    search.main(arguments(data_root, elsewhere, "--splits", "0", "1", "--trials", "1", "--out", str(report_dir)))
    assert "restored from" in capsys.readouterr().out
    moved = optuna.load_study(study_name="search-synthetic-five-split", storage=f"sqlite:///{elsewhere / 'optuna.db'}")
    assert [(t.params, t.value) for t in moved.trials[:3]] == [(t.params, t.value) for t in found.trials]
    assert len(moved.trials) == 4 and moved.trials[0].user_attrs["starting_point"]
    assert moved.user_attrs["identity"] == found.user_attrs["identity"]
    assert "4 trials (4 complete)" in (report_dir / "search-synthetic-five-split.md").read_text()
    # A report needs no data: the study's journal alone, on a machine without the dataset
    bare, nowhere = tmp_path / "bare", tmp_path / "no-data"
    search.main(arguments(nowhere, bare, "--splits", "0", "1", "--trials", "0", "--out", str(report_dir)))
    assert "restored from" in capsys.readouterr().out and not nowhere.exists()
    assert "4 trials (4 complete)" in (report_dir / "search-synthetic-five-split.md").read_text()


def test_each_finished_trial_is_printed_and_kept_in_the_report_before_the_search_ends(
    data_root, tmp_path, capsys, monkeypatch
):
    scored = search.validation_score

    def lost_in_the_second_trial(config, tensors, split, trial, score):
        if trial is not None and trial.number == 1:
            raise KeyboardInterrupt  # Ctrl-C, or the machine gone, half-way through the search
        return scored(config, tensors, split, trial, score)

    monkeypatch.setattr(search, "validation_score", lost_in_the_second_trial)
    report_dir = tmp_path / "report"
    with pytest.raises(KeyboardInterrupt):
        search.main(
            arguments(data_root, tmp_path / "mlruns", "--splits", "0", "--trials", "3", "--out", str(report_dir))
        )
    first = optuna.load_study(
        study_name="search-synthetic-five-split", storage=f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}"
    ).trials[0]
    assert f"trial 0: complete, validation_auroc {first.value:.4f}; best so far trial 0, {first.value:.4f}" in (
        capsys.readouterr().out
    )
    assert "1 trials (1 complete)" in (report_dir / "search-synthetic-five-split.md").read_text()
    journal = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(report_dir / "search-synthetic-five-split.jsonl"))
    )
    kept = optuna.load_study(study_name="search-synthetic-five-split", storage=journal).trials
    assert [(t.params, t.value) for t in kept] == [(first.params, first.value)]


def test_the_objective_can_weigh_auprc_beside_auroc_and_a_study_keeps_the_one_it_began_with(
    data_root, tmp_path, no_test_part
):
    store, report_dir = tmp_path / "mlruns", tmp_path / "report"
    mixed = ["--splits", "0", "--study", "mixed", "--out", str(report_dir)]
    search.main(arguments(data_root, store, *mixed, "--trials", "1", "--objective", "auroc+auprc"))
    storage = f"sqlite:///{store / 'optuna.db'}"
    (trial,) = optuna.load_study(study_name="mixed", storage=storage).trials
    use_store(store)
    runs = mlflow.search_runs(experiment_names=["search-synthetic"], output_format="list")
    (split_run,) = [run for run in runs if not run.info.run_name.startswith("trial_")]
    client = mlflow.MlflowClient()
    auroc, auprc = (
        {m.step: m.value for m in client.get_metric_history(split_run.info.run_id, name)}
        for name in ("val_auroc", "val_auprc")
    )
    assert any(trial.value == pytest.approx((auroc[epoch] + auprc[epoch]) / 2) for epoch in auroc)
    assert not any(trial.value == pytest.approx(value) for value in auroc.values())
    assert split_run.data.metrics["validation_auroc_auprc"] == pytest.approx(trial.value)
    assert "scored by its mean of validation AUROC and AUPRC at that epoch" in (report_dir / "mixed.md").read_text()
    assert "validation_auroc_auprc" in pd.read_csv(report_dir / "mixed-trials.csv").columns

    with pytest.raises(SystemExit, match="searches other settings \\(objective\\)"):
        search.main(arguments(data_root, store, *mixed, "--trials", "0"))
    # a study made before the objective was a choice searched AUROC, and goes on as such
    found = optuna.load_study(study_name="mixed", storage=storage)
    identity = found.user_attrs["identity"]
    found.set_user_attr("identity", {key: value for key, value in identity.items() if key != "objective"})
    search.main(arguments(data_root, store, *mixed, "--trials", "0"))
    with pytest.raises(SystemExit, match="searches other settings \\(objective\\)"):
        search.main(arguments(data_root, store, *mixed, "--trials", "0", "--objective", "auroc+auprc"))


def test_a_pruned_trial_stops_training_and_its_runs_end_killed(data_root, tmp_path, no_test_part, capsys):
    base = studies.preset_config("synthetic", "synthetic", ["max_epochs=3", "hidden_dim=16", "feature_dim=4"])
    cohort = studies.load_cohort("synthetic", data_root, "five-split", [0])
    studies.open_experiment("search-synthetic", tmp_path / "mlruns")
    always = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=2.0))
    always.optimize(
        search.objective(base, cohort, ["dropout"], "pruned", "auroc", tmp_path / "mlruns"),
        n_trials=1,
        callbacks=[search.after_each_trial(None, "")],
    )
    (trial,) = always.trials
    assert trial.state == optuna.trial.TrialState.PRUNED and list(trial.intermediate_values) == [1]
    assert f"trial 0: pruned at epoch 1 ({trial.intermediate_values[1]:.4f})\n" in capsys.readouterr().out
    runs = mlflow.search_runs(experiment_names=["search-synthetic"], output_format="list")
    assert len(runs) == 2 and all(r.info.status == "KILLED" and r.data.tags["pruned"] == "true" for r in runs)


def test_a_trial_whose_process_died_is_marked_failed_when_the_study_is_opened_and_a_live_one_is_not(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(search, "HEARTBEAT_SECONDS", 1)
    monkeypatch.setattr(search, "GRACE_SECONDS", 1)
    url, identity = f"sqlite:///{tmp_path / 'optuna.db'}", {"preset": "synthetic"}
    first = search.open_study("search", url, identity, 0)
    dead = first.ask()
    first._storage.record_heartbeat(dead._trial_id)  # what optimize's heartbeat thread records, then silence
    time.sleep(2.5)
    alive = first.ask()
    first._storage.record_heartbeat(alive._trial_id)
    states = [t.state for t in search.open_study("search", url, identity, 0).trials]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING]


@pytest.mark.parametrize(
    "url, reason",
    [
        ("optuna.db", "is not a database URL"),
        ("nosuchdb://host/study", "SQLAlchemy knows no database 'nosuchdb'"),
        ("sqlite:////no/such/folder/optuna.db", "the folder /no/such/folder of the SQLite file does not exist"),
        ("mysql://user@localhost/study", "the driver of mysql is not installed"),
    ],
)
def test_a_storage_url_that_cannot_be_opened_is_one_line_before_anything_loads(tmp_path, capsys, url, reason):
    with pytest.raises(SystemExit) as stopped:
        search.main(arguments(tmp_path / "no-data", tmp_path / "mlruns", "--storage", url))
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in error
    assert (
        error.strip().splitlines()[-1].startswith(f"python -m experiments.search: error: argument --storage: {reason}")
    )
    assert not (tmp_path / "no-data").exists() and not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize(
    "name, refusal",
    [
        ("synthetic", "--write-preset synthetic: {folder}/synthetic.json exists; choose another name, or delete it"),
        ("../../../x", "--write-preset ../../../x: a preset's name is letters, digits, '-' and '_'"),
        ("x.json", "--write-preset x.json: a preset's name is letters, digits, '-' and '_'"),
    ],
)
def test_write_preset_refuses_an_existing_preset_and_a_path_before_anything_is_searched(
    data_root, tmp_path, presets, capsys, name, refusal
):
    shipped = {path.name: path.read_bytes() for path in presets.iterdir()}
    with pytest.raises(SystemExit):
        search.main(arguments(data_root, tmp_path / "mlruns", "--trials", "1", "--write-preset", name))
    assert refusal.format(folder=presets) in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in presets.iterdir()} == shipped
    assert not list(tmp_path.rglob("x.json")) and not (tmp_path / "mlruns" / "optuna.db").exists()  # nothing searched


def test_the_report_and_a_refusal_show_the_storage_without_its_password(data_root, tmp_path, monkeypatch, capsys):
    local = f"sqlite:///{tmp_path / 'optuna.db'}"
    made = search.rdb_storage
    monkeypatch.setattr(search, "rdb_storage", lambda url: made(local))  # a database server, here a file
    monkeypatch.setattr(search, "storage_url", lambda text: text)  # whose driver (psycopg) is not installed here
    server = "postgresql://searcher:s3cret@db.example.org:5432/optuna"
    report_dir = tmp_path / "report"
    search.main(
        arguments(data_root, tmp_path / "mlruns", "--trials", "0", "--storage", server, "--out", str(report_dir))
    )
    page = (report_dir / "search-synthetic-five-split.md").read_text()
    assert "--storage 'postgresql://searcher:***@db.example.org:5432/optuna'" in page
    with pytest.raises(SystemExit) as refused:
        search.main(arguments(data_root, tmp_path / "mlruns", "--trials", "0", f"--storage={server}", "--splits", "1"))
    assert "in postgresql://searcher:***@db.example.org:5432/optuna searches other settings" in str(refused.value)
    everything = [page, str(refused.value), *capsys.readouterr()]
    everything += [path.read_text() for path in report_dir.iterdir() if path.suffix in (".md", ".csv", ".jsonl")]
    assert not [text for text in everything if "s3cret" in text]


START_AT_ONCE = """
import sys, time
from pathlib import Path
from alembic.runtime.migration import MigrationContext
from experiments import search

heads = MigrationContext.get_current_heads
def slowly_read_heads(self):  # a slow disk: the other process reads the new schema's version meanwhile
    read = heads(self)
    time.sleep(1)
    return read
MigrationContext.get_current_heads = slowly_read_heads
while not Path(sys.argv[2]).exists():
    time.sleep(0.01)
search.open_study("together", sys.argv[1], {"preset": "synthetic"}, 0, {"dropout": 0.2})
"""


def test_two_processes_starting_together_on_a_new_sqlite_storage_both_open_the_study(tmp_path):
    url, go = f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path / "go"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", START_AT_ONCE, url, str(go)], cwd=REPOSITORY, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    time.sleep(1)
    go.touch()
    errors = [process.communicate(timeout=120)[1] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], errors
    together = optuna.load_study(study_name="together", storage=url)
    assert together.user_attrs["identity"] == {"preset": "synthetic"}
    assert [trial.system_attrs["fixed_params"] for trial in together.trials] == [{"dropout": 0.2}]  # not one each


INTERRUPTED = """
import sys, time
from pathlib import Path
from experiments import search

def held(config, tensors, split, trial, score):  # a trial that takes long
    Path(sys.argv[1]).touch()
    time.sleep(300)

search.validation_score = held
search.main(sys.argv[2:])
"""


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_search_leaves_no_trial_run_running(data_root, tmp_path, signal_number):
    store, started = tmp_path / "mlruns", tmp_path / "started"
    process = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED, str(started), *arguments(data_root, store, "--trials", "1")], cwd=REPOSITORY
    )
    deadline = time.monotonic() + 120
    while not started.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), "the trial never started"
    process.send_signal(signal_number)
    assert process.wait(timeout=60) == (143 if signal_number == signal.SIGTERM else -signal.SIGKILL)
    use_store(store)
    runs = mlflow.search_runs(experiment_names=["search-synthetic"], output_format="list")
    assert sorted(run.info.run_name for run in runs) == ["five-split/split_0", "trial_0"]
    if signal_number == signal.SIGKILL:  # nothing could end them: the next search's start does
        assert {run.info.status for run in runs} == {"RUNNING"}
        studies.open_experiment("search-synthetic", store)
        runs = mlflow.search_runs(experiment_names=["search-synthetic"], output_format="list")
    assert {run.info.status for run in runs} == {"FAILED"}


def test_a_database_server_is_opened_again_when_another_process_made_its_schema_meanwhile(monkeypatch):
    opened = []

    def racing(url, **settings):  # the second of two processes that made the schema at once
        opened.append(url)
        if len(opened) == 1:
            raise sqlalchemy.exc.IntegrityError("INSERT INTO alembic_version", {}, Exception("UNIQUE failed"))
        return "the storage"

    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    assert search.rdb_storage("postgresql://searcher:s3cret@db.example.org/optuna") == "the storage"
    assert len(opened) == 2


def test_the_utility_objective_is_the_selected_epochs_validation_utility_at_its_best_threshold(tmp_path, no_test_part):
    root = tmp_path / "data"
    synthetic.generate(processed_folder("synthetic-hourly", root), n_stays=120, seed=3, cohort="hourly")
    config = studies.preset_config("synthetic", "synthetic-hourly", ["max_epochs=2", "hidden_dim=16", "feature_dim=4"])
    cohort = studies.load_cohort("synthetic-hourly", root, "five-split", [0])
    (split,) = cohort.splits
    scored = search.validation_score(config, cohort.tensors, split, None, search.OBJECTIVES["utility"])

    train, validation = (
        IrregularDataset(cohort.tensors.subset(split.positions(cohort.tensors, part)), split.normalisation)
        for part in ("train", "validation")
    )
    estimator = GarlicEstimator.of_run(config, explain=False).fit(train, validation)
    times = validation.prediction_times
    risks = np.asarray(estimator.predict_proba(validation), dtype=np.float64)
    best = choose_threshold(times.label, risks, stay_lengths(times.stay))
    assert len(np.unique(times.stay)) < len(times.label)  # several hours a stay: the utility sums them per stay
    assert scored == pytest.approx(best.normalised_utility)
    # another threshold than the best scores less: the objective is the best one's
    worse = choose_threshold(times.label, np.zeros_like(risks), stay_lengths(times.stay)).normalised_utility
    assert scored >= worse
