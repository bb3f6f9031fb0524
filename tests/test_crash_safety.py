"""Concurrency and crashes: processes sharing a new MLflow store, and writers killed at the worst moment.

Each test uses real processes (started with the same interpreter) and real SIGKILLs at a chosen point, then checks
what the next run finds: the store works, a killed writer's leftovers are removed or put back, a live writer's work
is left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlflow
import pytest

from garlic.data.datasets import ensure_processed
from garlic.tracking.store import RunInUseError, claim_run, mark_dead_runs_failed, use_experiment, use_store
from garlic.sources import synthetic
from garlic.io.locks import acquire, release
from garlic.io.tables import MANIFEST, atomic_directory, recover
from garlic.io.tensors import TENSORS, load_tensors

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENT = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def python(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=ENVIRONMENT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def killed(script: str, *args: str) -> None:
    """Run ``script``, which SIGKILLs itself at the point under test; fail if it ended any other way."""
    process = python(script, *args)
    _, errors = process.communicate(timeout=120)
    assert process.returncode == -9, errors[-2000:]


STORE_USER = """
    import sys, time
    from pathlib import Path
    import mlflow
    from garlic.tracking.store import use_experiment, use_store
    store, name, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    (go.parent / f"ready-{name}").touch()
    while not go.exists():  # every process is imported and waiting: they start together
        time.sleep(0.005)
    use_store(store)
    use_experiment("synthetic", store)
    with mlflow.start_run(run_name=name):
        mlflow.log_param("who", name)
"""


def test_processes_starting_together_on_a_new_store_all_succeed_and_the_store_works(tmp_path):
    store, go, names = tmp_path / "mlruns", tmp_path / "go", [f"p{k}" for k in range(3)]
    processes = [python(STORE_USER, str(store), name, str(go)) for name in names]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < len(names) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    for process in processes:
        _, errors = process.communicate(timeout=120)
        assert process.returncode == 0, errors[-2000:]

    use_store(store)
    (experiment,) = [e for e in mlflow.search_experiments() if e.name == "synthetic"]
    finished = mlflow.search_runs([experiment.experiment_id], output_format="list")
    assert sorted(r.data.params["who"] for r in finished) == names
    assert {r.info.status for r in finished} == {"FINISHED"}


def test_a_store_whose_creation_was_killed_is_created_afresh(tmp_path):
    store = tmp_path / "mlruns"
    killed(
        """
        import os, shutil, signal, sys
        from garlic.tracking.store import use_store
        copy = shutil.copyfile
        def die(source, destination):  # the new database half-made: copied from the empty one, not yet pointed
            copy(source, destination)
            os.kill(os.getpid(), signal.SIGKILL)
        shutil.copyfile = die
        use_store(sys.argv[1])
    """,
        str(store),
    )
    assert not (store / "mlflow.db").exists()  # nothing a later run could mistake for a store
    assert list(store.glob(".mlflow.db.*.creating"))

    use_store(store)
    experiment = use_experiment("after-a-killed-creation", store)  # not an earlier test's active experiment
    with mlflow.start_run(experiment_id=experiment):
        mlflow.log_param("works", 1)
    assert mlflow.search_runs([experiment], output_format="list")[0].data.params == {"works": "1"}
    assert not list(store.glob("*.creating"))  # the killed process's temporary is gone


def _staging(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def test_a_preprocessing_killed_while_writing_leaves_a_staging_folder_that_the_next_run_removes(tmp_path):
    folder = tmp_path / "processed" / "synthetic"
    killed(
        """
        import os, signal, sys
        import pyarrow.parquet as pq
        from garlic.sources import synthetic
        write = pq.write_table
        def write_then_die(*args, **kwargs):
            write(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
        pq.write_table = write_then_die
        synthetic.generate(sys.argv[1], n_stays=40, seed=1)
    """,
        str(folder),
    )
    assert len(_staging(folder)) == 1 and not folder.exists()

    with atomic_directory(tmp_path / "processed" / "other") as live:  # a live writer's staging is left alone
        recover(live.parent / "other")
        assert live.is_dir()
    assert ensure_processed("synthetic", tmp_path) == folder
    assert _staging(folder) == [] and (folder / MANIFEST).is_file()


def test_a_preprocessing_killed_between_its_two_renames_gets_the_dataset_back_not_a_new_cohort(tmp_path):
    folder = tmp_path / "processed" / "synthetic"
    synthetic.generate(folder, n_stays=40, seed=1)
    before = json.loads((folder / MANIFEST).read_text())
    killed(
        """
        import os, signal, sys
        from pathlib import Path
        from garlic.io import tables
        from garlic.sources import synthetic
        destination, replace = Path(sys.argv[1]), os.replace
        def replace_then_die(source, target):
            replace(source, target)
            if Path(source) == destination:  # the old folder is retired, the new one not yet in place
                os.kill(os.getpid(), signal.SIGKILL)
        tables.os.replace = replace_then_die
        synthetic.generate(destination, n_stays=50, seed=2)
    """,
        str(folder),
    )
    assert not folder.exists() and any(".retired-" in name for name in _staging(folder))

    assert ensure_processed("synthetic", tmp_path) == folder
    assert json.loads((folder / MANIFEST).read_text()) == before  # the 40-stay cohort, not a default one
    assert _staging(folder) == []


def test_a_tensor_cache_write_killed_midway_leaves_a_temporary_that_the_next_load_removes(tmp_path):
    folder = tmp_path / "synthetic"
    synthetic.generate(folder, n_stays=40, seed=1)
    killed(
        """
        import os, signal, sys
        import numpy as np
        from garlic.io import tensors
        def write_some_then_die(out, **arrays):
            out.write(b"x" * 4096)
            out.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        tensors.np.savez = write_some_then_die
        tensors.load_tensors(sys.argv[1])
    """,
        str(folder),
    )
    (stale,) = folder.glob(f".{TENSORS}.*.npz")

    live = folder / f".{TENSORS}.live.npz"  # a temporary some live writer holds
    live.write_bytes(b"")
    held = acquire(live)
    try:
        assert len(load_tensors(folder)) == 40
    finally:
        release(held)
    assert not stale.exists() and live.exists() and (folder / TENSORS).is_file()


def test_only_claimed_runs_whose_process_is_gone_are_marked_failed_with_their_split_runs(tmp_path):
    store = tmp_path / "mlruns"
    use_store(store)
    experiment = use_experiment("synthetic", store)
    client = mlflow.MlflowClient()
    dead, live, unclaimed = (client.create_run(experiment).info.run_id for _ in range(3))
    split = client.create_run(experiment, tags={"mlflow.parentRunId": dead}).info.run_id
    with claim_run(store, dead):  # claimed by a process that has gone: its lock is free, its claim file stays
        pass
    with claim_run(store, live):
        assert sorted(mark_dead_runs_failed(experiment, store)) == sorted([dead, split])
        with pytest.raises(RunInUseError, match=f"run {live} is being trained by another process"):
            with claim_run(store, live):
                pass
    status = {run_id: client.get_run(run_id).info.status for run_id in (dead, split, live, unclaimed)}
    assert status == {dead: "FAILED", split: "FAILED", live: "RUNNING", unclaimed: "RUNNING"}


def test_without_a_writable_cache_a_new_store_makes_its_own_empty_database(tmp_path, monkeypatch):
    cache = tmp_path / "not-a-folder"  # as a read-only home would, refuses the cache folder (even to root)
    cache.write_text("")
    monkeypatch.setattr("garlic.tracking.store.CACHE", cache / "garlic")
    store = tmp_path / "mlruns"
    use_store(store)
    experiment = use_experiment("with-its-own-template", store)
    with mlflow.start_run(experiment_id=experiment):
        mlflow.log_param("works", 1)
    assert mlflow.search_runs([experiment], output_format="list")[0].data.params == {"works": "1"}
    assert list(store.glob("mlflow-*-empty.db"))  # made in the store itself
