"""MLflow bookkeeping: a local store under ``mlruns/`` (SQLite + artifact folders, no server), one experiment per
dataset, runs started, claimed and ended, and a run's model folder logged. What the store holds is asked through
``garlic.tracking.queries``.

Browse it with ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db``.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Callable, Iterator

import mlflow
from mlflow.exceptions import MlflowException

from garlic.tracking.local_store import DATABASE, DEFAULT_STORE, MODEL_ARTIFACT
from garlic.io.locks import LockHeld, acquire, is_held, locked, release

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # progress bars are noise for a local copy


# Where the empty database every new store copies is kept (``empty_database``).
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "garlic"


class RunNotFoundError(LookupError):
    """A run id that the store does not hold, or a run without a model."""


def _store_lock(store: Path) -> Path:
    return store / f".{DATABASE}.lock"


def use_store(store: Path = DEFAULT_STORE) -> str:
    """Point MLflow at the local store in ``store`` (created when absent); returns the tracking URI.

    A new store's database is made under a lock, in a temporary file renamed into place once all of MLflow's tables
    exist: processes starting together on a new folder wait for one another, and one killed half-way leaves no
    database behind, only a temporary that the next one deletes. It is a copy of an empty database this MLflow
    version made once (``empty_database``), its default experiment pointed into ``store``: MLflow's own creation
    runs every schema migration, seconds for each new store.
    """
    store = Path(store).resolve()
    store.mkdir(parents=True, exist_ok=True)
    database = store / DATABASE
    if not database.is_file():
        with locked(_store_lock(store)):
            if not database.is_file():
                for stale in store.glob(f".{DATABASE}.*.creating"):  # left by a killed process: under the lock
                    stale.unlink()
                handle, temporary = tempfile.mkstemp(prefix=f".{DATABASE}.", suffix=".creating", dir=store)
                os.close(handle)
                try:
                    template = empty_database(CACHE)
                except OSError:  # no writable cache (a read-only home): the template is made in the store itself
                    template = empty_database(store)
                shutil.copyfile(template, temporary)
                with closing(sqlite3.connect(temporary)) as connection, connection:
                    connection.execute(
                        "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                        ((store / "artifacts" / "0").as_uri(),),
                    )  # as MLflow would have made it
                os.chmod(temporary, 0o644)
                os.replace(temporary, database)
    uri = f"sqlite:///{database}"
    mlflow.set_tracking_uri(uri)
    return uri


def empty_database(cache: Path) -> Path:
    """A new, empty MLflow database of the installed MLflow (its tables and default experiment) in ``cache``, made
    there once (``CACHE``: once per machine); ``use_store`` copies it for each new store."""
    template = cache / f"mlflow-{mlflow.__version__}-empty.db"
    if not template.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with locked(cache / f".{template.name}.lock"):
            if not template.is_file():
                from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # slow to import; rarely needed

                handle, temporary = tempfile.mkstemp(prefix=f".{template.name}.", suffix=".creating", dir=cache)
                os.close(handle)  # SQLite takes an empty file for a new database
                SqlAlchemyStore(f"sqlite:///{temporary}", (cache / "artifacts").as_uri()).engine.dispose()
                os.replace(temporary, template)
    return template


def use_experiment(name: str, store: Path = DEFAULT_STORE) -> str:
    """Make ``name`` the active experiment, its artifacts kept under ``store/artifacts/name``.

    Runs of it that a killed ``garlic train`` left RUNNING are marked FAILED on the way (``mark_dead_runs_failed``).
    """
    store = Path(store).resolve()
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        with locked(_store_lock(store)):  # two processes must not both create it
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                location = (store / "artifacts" / name).as_uri()
                client.create_experiment(name, artifact_location=location)
                experiment = client.get_experiment_by_name(name)
    mlflow.set_experiment(experiment_id=experiment.experiment_id)
    mark_dead_runs_failed(experiment.experiment_id, store)
    return experiment.experiment_id


class RunInUseError(ValueError):
    """The run is being trained by a live process."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during a tracked run, which was ended KILLED; ``run_id``: the outermost one of nested runs."""

    def __init__(self, run_id: str):
        super().__init__(run_id)
        self.run_id = run_id


@contextmanager
def tracked_run(**begin) -> Iterator[mlflow.ActiveRun]:
    """``mlflow.start_run(**begin)``, except that Ctrl-C ends the run KILLED (stopped by its user; ``resume`` takes
    it up), where MLflow would mark it FAILED, and goes on as ``RunInterrupted`` naming it."""
    with mlflow.start_run(**begin) as run:
        try:
            yield run
        except KeyboardInterrupt:  # a nested run's RunInterrupted too: the run around it is ended, and named, next
            mlflow.end_run("KILLED")  # ended here, MLflow's own exit leaves it as it is
            raise RunInterrupted(run.info.run_id) from None


def _run_lock(store: Path, run_id: str) -> Path:
    return Path(store).resolve() / "locks" / run_id


@contextmanager
def claim_run(store: Path, run_id: str) -> Iterator[None]:
    """Hold run ``run_id`` for the ``with`` block: another claim (a second ``--resume``) is refused meanwhile.

    The claim is a lock on ``STORE/locks/RUN_ID``, which the operating system releases when its process dies: a
    killed run can be claimed again at once. The file stays, marking the run as one that ``garlic train`` holds while
    it trains.
    """
    path = _run_lock(store, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle = acquire(path, wait=False)
    except LockHeld:
        raise RunInUseError(
            f"run {run_id} is being trained by another process right now; "
            "wait for it to end (or stop it) before resuming it"
        ) from None
    try:
        yield
    finally:
        release(handle)


def was_claimed(store: Path, run_id: str) -> bool:
    """Whether ``garlic train`` ever claimed run ``run_id`` (it does before it logs anything)."""
    return _run_lock(store, run_id).is_file()


def mark_dead_runs_failed(experiment_id: str, store: Path = DEFAULT_STORE) -> list[str]:
    """Mark FAILED the runs left RUNNING by a ``garlic train`` that died (no live process holds them); their ids.

    Only runs with a claim file are judged (with their split runs): a run logged by other code has no claim and is
    left as it is.
    """
    client = mlflow.MlflowClient()
    running = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'")
    dead = [
        r.info.run_id
        for r in running
        if was_claimed(store, r.info.run_id) and not is_held(_run_lock(store, r.info.run_id))
    ]
    dead += [r.info.run_id for r in running if r.data.tags.get("mlflow.parentRunId") in dead]
    for run_id in dead:
        client.set_terminated(run_id, status="FAILED")
    return dead


def log_model_folder(write: Callable[[Path], Path]) -> None:
    """Log the folder that ``write`` fills (a saved method: ``garlic.methods.saved``) as the active run's model
    artifact (``MODEL_ARTIFACT``)."""
    with tempfile.TemporaryDirectory() as folder:
        mlflow.log_artifacts(str(write(Path(folder))), MODEL_ARTIFACT)


def get_run(run_id: str) -> mlflow.entities.Run:
    try:
        return mlflow.MlflowClient().get_run(run_id)
    except MlflowException as exc:
        raise RunNotFoundError(f"no run {run_id!r} in the MLflow store {mlflow.get_tracking_uri()}") from exc
