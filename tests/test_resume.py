"""Resumable training: a fit continued from any epoch's training state, or from one written within an epoch, ends
exactly where an uninterrupted one does, and ``garlic train --resume RUN_ID`` takes up a killed run (SIGKILL or
SIGTERM) in the same MLflow run; a run still training cannot be resumed a second time, and a dead one is marked
FAILED."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import weakref
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

import garlic.cli
from garlic.tracking import run_contract
from garlic import runs
from garlic.config import Config
from garlic.methods.recurrent import DecayGRU, RecurrentModel, RecurrentTrainer
from garlic.models.predict import predict_proba
from garlic.tracking.store import RunInUseError, claim_run, use_experiment, use_store, was_claimed
from garlic.training.state import load_training_state, save_training_state
from garlic.training.alternating import AlternatingTrainer
from garlic.training.schedules import make_trainer
from garlic.training.trainer import Trainer
from helpers import garlic_main, synthetic_cohort, garlic_settings

SMALL = {"hidden_dim": 16, "feature_dim": 4, "lr_cls": 3e-3, "lr_rec": 3e-3, "batch_size": 32, "max_epochs": 4}
GARLIC = [sys.executable, "-m", "garlic.cli"]
# One thread per process, here and in the subprocesses: on a busy machine several threads per process mostly wait.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    cohort = synthetic_cohort(tmp_path_factory, n_stays=240, seed=3)
    return cohort.root, cohort.tensors, cohort.parts


@pytest.mark.parametrize("lr_schedule", ["plateau", "cosine"])
def test_a_fit_continued_from_any_epochs_training_state_ends_exactly_as_the_uninterrupted_fit(
    cohort, tmp_path, lr_schedule
):
    _, tensors, parts = cohort
    # The reconstruction-stage loss cannot improve (lr_rec and lambda_cls 0), so with patience 1 the stage switches
    # (and the best weights reload) after epoch 2: the saved states fall before, at and after a switch. Dropout is on.
    config = Config().override(
        {**SMALL, "stage_patience": 1, "lr_rec": 0.0, "lambda_cls": 0.0, "lr_schedule": lr_schedule}
    )
    sizes = len(tensors.variables), len(tensors.static_features)

    def save(state: dict) -> None:  # the state holds the live tensors: written at once, as the runs do
        save_training_state(tmp_path / f"epoch{state['progress']['epoch']}.pt", state, config)

    whole = AlternatingTrainer(*garlic_settings(config), *sizes).fit(parts["train"], parts["validation"], on_state=save)
    expected = predict_proba(whole.model, parts["validation"])
    assert [r.stage for r in whole.history] == ["reconstruction"] * 2 + ["prediction"] * 2

    for epoch in (1, 2, 3):
        path = tmp_path / f"epoch{epoch}.pt"
        continued = AlternatingTrainer(*garlic_settings(config), *sizes).fit(
            parts["train"], parts["validation"], resume=load_training_state(path, config)
        )
        np.testing.assert_array_equal(predict_proba(continued.model, parts["validation"]), expected)
        assert continued.best_epoch == whole.best_epoch
        assert [r.val_auroc for r in continued.history] == [r.val_auroc for r in whole.history]


class Stopped(Exception):
    """Raised after an epoch, or within one, as a crash would: the fit ends with its last training state kept."""


def _fits(name: str, tensors, epochs: int) -> tuple[Callable[[], Trainer], Config]:
    """A maker of fresh trainers of schedule ``name`` that train ``epochs``, and the config their states are saved
    under (GARLIC's; the recurrent baselines have none: the trainer's own is no ``Config``)."""
    sizes = len(tensors.variables), len(tensors.static_features)
    if name == "recurrent":
        settings = RecurrentModel("decay_gru", hidden_dim=8, batch_size=32, max_epochs=epochs)

        def recurrent() -> Trainer:
            torch.manual_seed(settings.seed)
            return RecurrentTrainer(DecayGRU(sizes[0], settings.hidden_dim), settings, torch.device("cpu"))

        return recurrent, Config()
    # The compact schedule as in the test above: the stage switches after epoch 2; per-batch cosine rates.
    config = Config().override(
        {**SMALL, "max_epochs": epochs, "stage_patience": 1, "lr_rec": 0.0, "lambda_cls": 0.0, "lr_schedule": "cosine"}
        if name == "compact"
        else {**SMALL, "max_epochs": epochs, "architecture": "reference", "schedule": "reference"}
    )
    return lambda: make_trainer(*garlic_settings(config), *sizes), config


def _assert_same_fit(got, want, validation) -> None:
    np.testing.assert_array_equal(predict_proba(got.model, validation), predict_proba(want.model, validation))
    assert got.best_epoch == want.best_epoch
    untimed = lambda fit: [asdict(record) | {"seconds": None} for record in fit.history]  # noqa: E731
    np.testing.assert_equal(untimed(got), untimed(want))  # exactly, NaN (no reconstruction) matching NaN


# GARLIC is killed in epoch 3, in its second stage; the others in their last epoch.
@pytest.mark.parametrize(("schedule", "epochs"), [("compact", 3), ("reference", 2), ("recurrent", 2)])
def test_a_fit_killed_within_an_epoch_resumes_from_its_last_batch_and_ends_as_the_uninterrupted_fit(
    cohort, tmp_path, monkeypatch, schedule, epochs
):
    _, tensors, parts = cohort
    train, validation = parts["train"], parts["validation"]
    fresh, config = _fits(schedule, tensors, epochs)
    whole = fresh().fit(train, validation)
    if schedule == "compact":
        assert [r.stage for r in whole.history] == ["reconstruction"] * 2 + ["prediction"]
    path = tmp_path / "training.pt"

    def save_then_die(state: dict) -> None:  # killed after 2 batches of the last epoch, once that state is written
        save_training_state(path, state, config)
        underway = state.get("epoch_pass")
        if underway is not None and state["progress"]["epoch"] == epochs - 1 and underway["batches_done"] == 2:
            raise Stopped

    with monkeypatch.context() as patched:
        patched.setattr(Trainer, "checkpoint_seconds", 0.0)
        # A state after every batch changes nothing: the fit reads its state, never draws or changes anything for it.
        states = []
        checkpointed = fresh().fit(train, validation, on_state=states.append)
        _assert_same_fit(checkpointed, whole, validation)
        per_epoch = -(-len(train) // 32)
        done = [state["epoch_pass"]["batches_done"] if "epoch_pass" in state else "end" for state in states]
        assert done == [*range(1, per_epoch + 1), "end"] * epochs
        with pytest.raises(Stopped):
            fresh().fit(train, validation, on_state=save_then_die)
    resumed = fresh().fit(train, validation, resume=load_training_state(path, config))
    _assert_same_fit(resumed, whole, validation)

    # A state within an epoch is checked as the rest of it is.
    state = torch.load(path, weights_only=True)
    torch.save({**state, "epoch_pass": {**state["epoch_pass"], "tally": []}}, path)
    with pytest.raises(ValueError, match=f"{path}: not a training state \\(lacks or garbles epoch_pass.tally\\)"):
        load_training_state(path, config)


def test_a_state_saved_before_a_config_key_existed_resumes_at_its_default_only(tmp_path):
    path, config = tmp_path / "training.pt", Config.for_dataset("synthetic")
    state = {
        "progress": {},
        "model": {},
        "best_model": {},
        "optimisers": {},
        "schedulers": {},
        "sampler_epoch": 0,
        "rng": [],
        "cuda_rng": [],
    }
    older = {key: value for key, value in config.to_dict().items() if key != "hours_input"}
    torch.save({**state, "config": older}, path)
    assert load_training_state(path, config)["sampler_epoch"] == 0
    with pytest.raises(ValueError, match="another configuration \\(hours_input False there, True in this run\\)"):
        load_training_state(path, config.override({"hours_input": True}))


def test_an_unreadable_training_state_is_refused_with_its_name(tmp_path):
    path = tmp_path / "training.pt"
    path.write_bytes(b"not a training state")
    with pytest.raises(ValueError, match=f"{path}: not a readable training state"):
        load_training_state(path, Config())
    # Arbitrary objects never load: weights_only=True refuses them.
    torch.save({"payload": Path("x")}, path)
    with pytest.raises(ValueError, match="not a readable training state"):
        load_training_state(path, Config())


def _stopped_run(root: Path, store: Path, settings: dict) -> Path:
    """A run of ``settings`` stopped after its first epoch; the path of its training state."""

    def stop(split: str, record) -> None:
        if record.epoch == 2:
            raise Stopped

    with pytest.raises(Stopped):
        runs.train(Config.for_dataset("synthetic").override(settings), [0], data_root=root, store=store, on_epoch=stop)
    (state,) = (store / "training-states").glob(f"*/{run_contract.TRAINING_STATE}")
    return state


def test_resuming_with_another_configurations_state_or_a_wrong_one_is_one_line_naming_the_file(
    cohort, tmp_path, capsys
):
    root, _, _ = cohort
    state = _stopped_run(root, tmp_path / "mlruns", SMALL)
    other = _stopped_run(root, tmp_path / "other", {**SMALL, "hidden_dim": 8})
    run_id = state.parent.name
    resume = ["--data-root", str(root), "--mlruns", str(tmp_path / "mlruns"), "train", "--resume", run_id]
    for written, message in [
        (
            lambda: state.write_bytes(other.read_bytes()),
            "a training state of another configuration (hidden_dim 8 there, 16 in this run)",
        ),
        (lambda: torch.save({"model": {}}, state), "not a training state (lacks or garbles progress, best_model"),
    ]:
        written()
        with pytest.raises(SystemExit) as stopped:
            garlic_main(resume)
        error = capsys.readouterr().err
        assert stopped.value.code == 2 and "Traceback" not in error
        assert error.strip().splitlines()[-1].startswith(f"garlic: error: {state}: {message}"), error[-2000:]
    use_store(tmp_path / "mlruns")
    assert mlflow.MlflowClient().get_run(run_id).info.status == "FAILED"  # refused, and resumable once mended


def _epoch_of(state: Path) -> int:
    try:
        return load_training_state(state, Config.for_dataset("synthetic").override(SMALL))["progress"]["epoch"]
    except ValueError:
        return 0


STOPPED_BY = {signal.SIGKILL: -signal.SIGKILL, signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}


def _start_and_kill(root: Path, store: Path, sent: signal.Signals, *options: str) -> tuple[str, str]:
    """Start ``garlic train [options]``, stop it with ``sent`` as soon as its first training state exists (looked
    for, not read: a first read in this process once took longer than the run's last epochs); return the run id and
    what the command wrote to its standard error."""
    settings = [item for key, value in SMALL.items() for item in ("--set", f"{key}={value}")]
    command = [*GARLIC, "--data-root", str(root), "--mlruns", str(store), "train", *settings, *options]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ONE_THREAD)
    deadline = time.monotonic() + 240
    states = store / "training-states"
    while time.monotonic() < deadline and process.poll() is None:
        if states.is_dir() and any(states.glob(f"*/{run_contract.TRAINING_STATE}")):
            os.kill(process.pid, sent)
            break
        time.sleep(0.05)
    _, errors = process.communicate(timeout=60)
    assert process.returncode == STOPPED_BY[sent], errors.decode()[-2000:]
    (state,) = states.glob(f"*/{run_contract.TRAINING_STATE}")
    assert 1 <= _epoch_of(state) < SMALL["max_epochs"]
    return state.parent.name, errors.decode()


@pytest.fixture(scope="module")
def uninterrupted(cohort, tmp_path_factory):
    root, _, _ = cohort
    store = tmp_path_factory.mktemp("whole") / "mlruns"
    run_id, _ = runs.train(Config.for_dataset("synthetic").override(SMALL), [0], data_root=root, store=store)
    return store, run_id


def _logged(store: Path, run_id: str) -> dict:
    use_store(store)
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    tables = {
        name: pd.read_csv(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=f"predictions/{name}.csv"))
        for name in ("validation", "test")
    }
    history = {m.step: m.value for m in client.get_metric_history(run_id, "val_auroc")}
    return {"run": run, "tables": tables, "history": history}


def _assert_logged_as_uninterrupted(store: Path, run_id: str, uninterrupted: tuple[Path, str]) -> None:
    got, want = _logged(store, run_id), _logged(*uninterrupted)
    assert got["run"].info.status == "FINISHED"
    for name in ("validation", "test"):
        pd.testing.assert_frame_equal(got["tables"][name], want["tables"][name], check_exact=True)
    assert got["history"] == want["history"] and sorted(got["history"]) == [1, 2, 3, 4]
    for metric in ("test_auroc", "test_auprc", "test_brier", "test_ece", "best_epoch"):
        assert got["run"].data.metrics[metric] == want["run"].data.metrics[metric]
    assert not run_contract.training_state_path(store, run_id).parent.exists()  # a finished run keeps no state


@pytest.mark.parametrize("sent", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["SIGKILL", "SIGTERM", "Ctrl-C"])
def test_a_killed_run_resumes_in_the_same_mlflow_run_and_ends_as_the_uninterrupted_run(
    cohort, uninterrupted, tmp_path, sent, capsys
):
    root, _, _ = cohort
    store = tmp_path / "mlruns"
    run_id, errors = _start_and_kill(root, store, sent)
    use_store(store)
    # SIGTERM ends the run cleanly enough for MLflow to mark it failed, Ctrl-C marks it killed (by its user); SIGKILL
    # leaves it "running". All resume.
    status = {signal.SIGKILL: "RUNNING", signal.SIGTERM: "FAILED", signal.SIGINT: "KILLED"}[sent]
    assert mlflow.MlflowClient().get_run(run_id).info.status == status

    if sent == signal.SIGINT:  # one line, no traceback, saying how to go on; and that command goes on
        assert "Traceback" not in errors
        said = errors.strip().splitlines()[-1]
        resume = re.fullmatch(
            rf"garlic: interrupted: run {run_id} is marked KILLED; continue it where it stopped "
            rf"with: \S+ (--data-root \S+ --mlruns \S+ train --resume {run_id})",
            said,
        )
        assert resume is not None, said
        garlic_main(resume.group(1).split())
    elif sent == signal.SIGKILL:  # through the command line once (in this process: a process only adds its start-up)
        garlic_main(["--data-root", str(root), "--mlruns", str(store), "train", "--resume", run_id])
        assert f"run {run_id}" in capsys.readouterr().out
    else:
        assert runs.resume(run_id, root, store)[0] == run_id

    _assert_logged_as_uninterrupted(store, run_id, uninterrupted)
    with pytest.raises(ValueError, match="has finished; there is nothing to resume"):
        runs.resume(run_id, root, store)


def test_a_run_that_died_within_an_epoch_resumes_from_that_epochs_last_state_and_ends_as_the_uninterrupted_run(
    cohort, uninterrupted, tmp_path, monkeypatch
):
    root, _, _ = cohort
    store = tmp_path / "mlruns"
    save = runs.save_training_state

    def save_then_die(path: Path, state: dict, config: Config) -> None:  # after 2 batches of epoch 3
        save(path, state, config)
        if state["progress"]["epoch"] == 2 and state.get("epoch_pass", {}).get("batches_done") == 2:
            raise Stopped

    with monkeypatch.context() as patched:
        patched.setattr(Trainer, "checkpoint_seconds", 0.0)
        patched.setattr(runs, "save_training_state", save_then_die)
        with pytest.raises(Stopped):
            runs.train(Config.for_dataset("synthetic").override(SMALL), [0], data_root=root, store=store)
    (state,) = (store / "training-states").glob(f"*/{run_contract.TRAINING_STATE}")
    run_id, trained = state.parent.name, []
    assert runs.resume(run_id, root, store, lambda split, record: trained.append(record.epoch))[0] == run_id
    assert trained == [3, 4]
    _assert_logged_as_uninterrupted(store, run_id, uninterrupted)


def test_a_sigterm_that_python_drops_in_a_weakref_callback_still_stops_the_run_at_the_next_epoch(
    cohort, tmp_path, monkeypatch
):
    root, _, _ = cohort
    store = tmp_path / "mlruns"
    dropped, progress = [], garlic.cli._Progress.__call__

    def signalled_inside_a_weakref_callback(self, split: str, record) -> None:
        progress(self, split, record)
        if record.epoch == 1:  # as when SIGTERM lands in SQLAlchemy's clean-up of a collected object

            class Collected:
                pass

            def callback(_) -> None:
                os.kill(os.getpid(), signal.SIGTERM)
                sum(range(1000))  # the handler runs here, between two of the callback's instructions

            collected = Collected()
            reference = weakref.ref(collected, callback)
            del collected
            assert reference() is None

    monkeypatch.setattr(garlic.cli._Progress, "__call__", signalled_inside_a_weakref_callback)
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    settings = [item for key, value in {**SMALL, "max_epochs": 6}.items() for item in ("--set", f"{key}={value}")]
    with pytest.raises(SystemExit) as stopped:
        garlic_main(["--data-root", str(root), "--mlruns", str(store), "train", *settings])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert [type(event.exc_value) for event in dropped] == [SystemExit]  # Python dropped the handler's exception
    use_store(store)
    (run,) = [
        run
        for run in mlflow.search_runs(search_all_experiments=True, output_format="list")
        if run_contract.SPLIT_DIGEST in run.data.params
    ]
    assert run.info.status == "FAILED"  # resumable
    assert [m.step for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, "val_auroc")] == [1, 2]


def test_resuming_a_run_that_is_still_training_is_refused_and_its_history_stays_whole(cohort, tmp_path):
    root, _, _ = cohort
    store = tmp_path / "mlruns"
    refusals = []

    def try_to_resume(split: str, record) -> None:  # while the run trains, as a second `--resume` would
        with pytest.raises(RunInUseError, match="is being trained by another process") as caught:
            runs.resume(mlflow.active_run().info.run_id, root, store)
        refusals.append(str(caught.value))

    config = Config.for_dataset("synthetic").override({**SMALL, "max_epochs": 2})
    run_id, _ = runs.train(config, [0], data_root=root, store=store, on_epoch=try_to_resume)
    assert len(refusals) == 2 and run_id in refusals[0]
    logged = _logged(store, run_id)
    assert logged["run"].info.status == "FINISHED" and sorted(logged["history"]) == [1, 2]
    assert [m.step for m in mlflow.MlflowClient().get_metric_history(run_id, "val_auroc")] == [1, 2]


def test_refusing_to_resume_another_processs_run_leaves_no_claim_and_never_changes_its_status(tmp_path, capsys):
    store = tmp_path / "mlruns"
    use_store(store)
    experiment = use_experiment("synthetic", store)
    client = mlflow.MlflowClient()
    # A run that other code is logging (never claimed), and a split run of a run that `garlic train` trains now.
    foreign = client.create_run(experiment).info.run_id
    parent = client.create_run(experiment).info.run_id
    split = client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
    with claim_run(store, parent):
        for attempt in range(2):  # the second try once judged the first try's claim file a dead run's
            for run_id, refusal in (
                (foreign, "was not started by `garlic train`"),
                (split, f"one split of run {parent}"),
            ):
                with pytest.raises(SystemExit) as stopped:
                    garlic_main(["--mlruns", str(store), "train", "--resume", run_id])
                assert stopped.value.code == 2 and refusal in capsys.readouterr().err
                assert not was_claimed(store, run_id)
        use_experiment("synthetic", store)  # what the next `garlic train` does first: judges claimed runs
        assert {client.get_run(r).info.status for r in (foreign, parent, split)} == {"RUNNING"}


DIE_AFTER_LOGGING = """
    import json, os, signal, sys
    from pathlib import Path
    import mlflow
    from garlic.tracking import run_contract
    from garlic import runs
    from garlic.config import Config
    log_dict = mlflow.log_dict
    def log_then_die(payload, name):
        log_dict(payload, name)
        if name == sys.argv[3]:
            os.kill(os.getpid(), signal.SIGKILL)
    mlflow.log_dict = log_then_die
    config = Config.for_dataset("synthetic").override(json.loads(sys.argv[4]))
    runs.train(config, [0], data_root=Path(sys.argv[1]), store=Path(sys.argv[2]))
"""


@pytest.mark.parametrize("last_logged", ["data_manifest.json", "config.json"])
def test_a_run_killed_while_it_logs_its_set_up_is_marked_failed_and_resumes_when_it_can(
    cohort, uninterrupted, tmp_path, last_logged
):
    root, _, _ = cohort
    store = tmp_path / "mlruns"
    command = [
        sys.executable,
        "-c",
        textwrap.dedent(DIE_AFTER_LOGGING),
        str(root),
        str(store),
        last_logged,
        json.dumps(SMALL),
    ]
    died = subprocess.run(command, capture_output=True, text=True, timeout=300, env=ONE_THREAD)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    use_store(store)
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "RUNNING"
    use_experiment("synthetic", store)  # what the next `garlic train` does first: a dead run is marked so
    assert mlflow.MlflowClient().get_run(run.info.run_id).info.status == "FAILED"

    if last_logged == "config.json":  # killed before its splits were logged: nothing to resume from
        with pytest.raises(ValueError, match="killed before it logged its config and splits.*marked FAILED"):
            runs.resume(run.info.run_id, root, store)
        return
    assert runs.resume(run.info.run_id, root, store)[0] == run.info.run_id
    got, want = _logged(store, run.info.run_id), _logged(*uninterrupted)
    assert got["run"].info.status == "FINISHED" and got["history"] == want["history"]
    assert got["run"].data.metrics["test_auroc"] == want["run"].data.metrics["test_auroc"]


def test_a_method_run_killed_within_its_second_split_resumes_there_keeping_its_finished_split(
    cohort, tmp_path, monkeypatch
):
    # Every method goes through the one tracked path: a GRU-D run over two splits that died within the epoch of its
    # second split is taken up by `resume` in the same MLflow run; the finished split is kept as it was, the other
    # goes on from its last state, with the run's own settings, and ends as that split trained uninterrupted.
    root, _, _ = cohort
    store = tmp_path / "mlruns"
    config = Config.for_dataset("synthetic").override({"max_epochs": 1, "device": "cpu"})

    def train(splits, store):
        return runs.train(config, splits, data_root=root, store=store, method="grud", method_settings={"hidden_dim": 8})

    save, deaths = runs.save_training_state, []

    def dies_after_two_batches_of_the_second_split(path: Path, state: dict, config: Config) -> None:
        save(path, state, config)
        if state.get("epoch_pass", {}).get("batches_done") == 2:
            deaths.append(path)
            if len(deaths) == 2:
                raise KeyboardInterrupt("killed")

    with monkeypatch.context() as patched:
        patched.setattr(Trainer, "checkpoint_seconds", 0.0)
        patched.setattr(runs, "save_training_state", dies_after_two_batches_of_the_second_split)
        with pytest.raises(KeyboardInterrupt):
            train([0, 1], store)
    use_store(store)
    (parent,) = mlflow.search_runs(
        search_all_experiments=True,
        output_format="list",
        filter_string="tags.method = 'grud' and attributes.run_name = 'grud-synthetic'",
    )
    first = runs._split_runs(parent.info.run_id)["five-split/split_0"]
    assert first.info.status == "FINISHED" and deaths[1].is_file()

    with monkeypatch.context() as patched:  # the states written on the way say where the resumed split went on from
        patched.setattr(Trainer, "checkpoint_seconds", 0.0)
        written = []
        patched.setattr(
            runs,
            "save_training_state",
            lambda path, state, config: written.append(state.get("epoch_pass", {}).get("batches_done")),
        )
        run_id, results = runs.resume(parent.info.run_id, data_root=root, store=store)
    assert written == [3, None]  # the third and last batch, then the end of the epoch
    assert run_id == parent.info.run_id
    assert [r.split for r in results] == ["five-split/split_0", "five-split/split_1"]
    assert results[0].run_id == first.info.run_id and results[0].test["auroc"] == first.data.metrics["test_auroc"]
    assert mlflow.get_run(run_id).info.status == "FINISHED"
    assert mlflow.get_run(results[1].run_id).data.tags[run_contract.METHOD] == "grud"
    # the split resumed takes the method's own settings that the run was started with, and ends as if never killed
    assert runs.load_predictor(results[1].run_id, store).method.hidden_dim == 8
    _, (whole,) = train([1], tmp_path / "whole")
    assert results[1].test == whole.test


def test_a_study_unit_stopped_half_way_goes_on_in_its_own_run_and_ends_as_the_uninterrupted_one(
    cohort, tmp_path, monkeypatch
):
    # The studies' units (experiments.compare's methods, early_warning's GARLIC presets, the ablations) keep their
    # fit's state as `garlic train` does: a machine that goes away costs the epoch under way, not the unit.
    from garlic import studies

    root, _, _ = cohort
    config = Config.for_dataset("synthetic").override({**SMALL, "max_epochs": 3, "split_protocol": "five-split"})
    loaded = studies.load_cohort("synthetic", root, "five-split", [0])

    def unit_in(store: Path) -> studies.Baselines:
        return studies.Baselines(config, loaded, root, store)

    whole = unit_in(tmp_path / "whole").run(["garlic"])
    saved = runs.save_training_state

    def save_then_die(path, state, config):  # the first state is saved, then the machine goes away
        saved(path, state, config)
        raise KeyboardInterrupt("the machine went away")

    store = tmp_path / "stopped"
    monkeypatch.setattr(runs, "save_training_state", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        unit_in(store).run(["garlic"])
    monkeypatch.undo()
    (stopped,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    state = run_contract.training_state_path(store, stopped.info.run_id)
    assert stopped.info.status != "FINISHED" and state.is_file()
    resumed = unit_in(store).run(["garlic"])
    assert list(resumed["run_id"]) == [stopped.info.run_id] and not state.exists()
    assert mlflow.get_run(stopped.info.run_id).info.status == "FINISHED"
    tested = [column for column in whole.columns if column.startswith("test_")]
    pd.testing.assert_frame_equal(resumed[tested], whole[tested])


def test_a_unit_whose_store_is_gone_goes_on_from_its_carried_state_in_a_fresh_store_and_ends_as_the_uninterrupted_run(
    cohort, uninterrupted, tmp_path
):
    # The next session's machine has none of this one's store: only the repository, with the carried state in it.
    root, _, _ = cohort
    config, carried = Config.for_dataset("synthetic").override(SMALL), tmp_path / "unfinished"

    def dies_in_epoch_3(split, record):  # epoch 2's state is saved, and carried, before epoch 3 reports
        if record.epoch == 3:
            raise Stopped

    with pytest.raises(Stopped):
        runs.train(config, [0], data_root=root, store=tmp_path / "gone", on_epoch=dies_in_epoch_3, carry=carried)
    (state,) = carried.iterdir()
    assert state.name.startswith("garlic-five-split-split_0-seed_") and load_training_state(state, config)
    other, trained = config.override({"hidden_dim": 8, "max_epochs": 2}), []  # another unit leaves it alone
    runs.train(
        other,
        [0],
        data_root=root,
        store=tmp_path / "other",
        carry=carried,
        on_epoch=lambda split, record: trained.append(record.epoch),
    )
    assert trained == [1, 2] and list(carried.iterdir()) == [state]
    trained = []
    run_id, _ = runs.train(
        config,
        [0],
        data_root=root,
        store=tmp_path / "fresh",
        on_epoch=lambda split, record: trained.append(record.epoch),
        carry=carried,
    )
    assert trained == [3, 4] and list(carried.iterdir()) == []  # a finished unit carries nothing
    got, want = _logged(tmp_path / "fresh", run_id), _logged(*uninterrupted)
    for name in ("validation", "test"):
        pd.testing.assert_frame_equal(got["tables"][name], want["tables"][name], check_exact=True)
    for metric in ("test_auroc", "test_auprc", "test_brier", "test_ece", "best_epoch"):
        assert got["run"].data.metrics[metric] == want["run"].data.metrics[metric]
    assert got["run"].data.params["split"] == want["run"].data.params["split"]  # the new run says what it trained on


def test_garlic_train_carries_a_killed_units_state_and_a_fresh_store_goes_on_from_it(
    cohort, uninterrupted, tmp_path, capsys
):
    # The workers of experiments.compare --carry are `garlic train --carry DIR` processes.
    root, _, _ = cohort
    carried = tmp_path / "unfinished"
    with pytest.raises(SystemExit):
        garlic_main(
            ["--data-root", str(root), "--mlruns", str(tmp_path / "mlruns"), "train", "--carry", str(Path(__file__))]
        )
    assert "is a file; it names the folder" in capsys.readouterr().err
    _start_and_kill(root, tmp_path / "gone", signal.SIGKILL, "--carry", str(carried))
    (state,) = carried.iterdir()
    stopped_after = _epoch_of(state)
    settings = [item for key, value in SMALL.items() for item in ("--set", f"{key}={value}")]
    fresh = tmp_path / "fresh"
    garlic_main(["--data-root", str(root), "--mlruns", str(fresh), "train", *settings, "--carry", str(carried)])
    run_id = re.search(r"run ([0-9a-f]{32})", capsys.readouterr().out).group(1)
    got, want = _logged(fresh, run_id), _logged(*uninterrupted)
    for name in ("validation", "test"):
        pd.testing.assert_frame_equal(got["tables"][name], want["tables"][name], check_exact=True)
    assert got["run"].data.metrics["best_epoch"] == want["run"].data.metrics["best_epoch"]
    assert sorted(got["history"]) == list(range(stopped_after + 1, 5))  # went on where it stopped
    assert not any(carried.iterdir())  # a finished unit carries nothing


def test_a_study_unit_whose_store_is_gone_goes_on_from_its_carried_state_and_ends_as_the_uninterrupted_one(
    cohort, tmp_path, monkeypatch
):
    # Raindrop's and SeFT's splits (experiments.compare --carry) take longer than some sessions do.
    from garlic import studies

    root, _, _ = cohort
    config = Config.for_dataset("synthetic").override({**SMALL, "max_epochs": 3, "split_protocol": "five-split"})
    loaded = studies.load_cohort("synthetic", root, "five-split", [0])
    carried = tmp_path / "unfinished"

    def unit_in(store: Path) -> studies.Baselines:
        return studies.Baselines(config, loaded, root, store, carried)

    whole = unit_in(tmp_path / "whole").run(["decay_gru"])
    assert list(carried.iterdir()) == []
    saved = runs.save_training_state

    def save_then_die(path, state, config):  # the second epoch's state is saved, then the machine goes away
        saved(path, state, config)
        if state["progress"]["epoch"] == 2:
            raise KeyboardInterrupt("the machine went away")

    monkeypatch.setattr(runs, "save_training_state", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        unit_in(tmp_path / "gone").run(["decay_gru"])
    monkeypatch.undo()
    (state,) = carried.iterdir()
    assert state.name.startswith("decay_gru-five-split-split_0-")
    resumed = unit_in(tmp_path / "fresh").run(["decay_gru"])
    assert list(carried.iterdir()) == []
    use_store(tmp_path / "fresh")
    steps = [m.step for m in mlflow.MlflowClient().get_metric_history(resumed["run_id"][0], "val_auroc")]
    assert 1 not in steps and steps[-1] == 3  # the first epoch was trained in the store that is gone
    tested = [column for column in whole.columns if column.startswith("test_")]
    pd.testing.assert_frame_equal(resumed[tested], whole[tested])
    state.write_bytes(b"not a state")  # a damaged carried state is refused, naming it
    with pytest.raises(ValueError, match=f"{state}: not a readable training state"):
        unit_in(tmp_path / "third").run(["decay_gru"])
