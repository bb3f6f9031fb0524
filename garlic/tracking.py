"""MLflow bookkeeping: a local store under ``mlruns/`` (SQLite + artifact folders, no server), one experiment per
dataset, and the model of a finished run loaded back with one call.

Browse it with ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db``.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException

from garlic.checkpoint import TrainedModel, load_model, save_model

DEFAULT_STORE = Path(os.environ.get("GARLIC_MLRUNS", "mlruns"))
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # progress bars are noise for a local copy
MODEL_ARTIFACT = "model"


class RunNotFoundError(LookupError):
    """A run id that the store does not hold, or a run without a model."""


def use_store(store: Path = DEFAULT_STORE) -> str:
    """Point MLflow at the local store in ``store`` (created when absent); returns the tracking URI."""
    store = Path(store).resolve()
    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    return uri


def use_experiment(name: str, store: Path = DEFAULT_STORE) -> str:
    """Make ``name`` the active experiment, its artifacts kept under ``store/artifacts/name``."""
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        location = (Path(store).resolve() / "artifacts" / name).as_uri()
        experiment_id = client.create_experiment(name, artifact_location=location)
    else:
        experiment_id = experiment.experiment_id
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def log_model(trained: TrainedModel) -> None:
    with tempfile.TemporaryDirectory() as folder:
        mlflow.log_artifacts(str(save_model(Path(folder), trained)), MODEL_ARTIFACT)


def get_run(run_id: str) -> mlflow.entities.Run:
    try:
        return mlflow.MlflowClient().get_run(run_id)
    except MlflowException as exc:
        raise RunNotFoundError(f"no run {run_id!r} in the MLflow store {mlflow.get_tracking_uri()}") from exc


def load_run_model(run_id: str, store: Path = DEFAULT_STORE, device: str = "cpu") -> TrainedModel:
    """The model logged by run ``run_id``, ready for prediction."""
    use_store(store)
    run = get_run(run_id)
    children = mlflow.search_runs(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{run_id}'",
        output_format="list",
    )
    if children:
        names = ", ".join(f"{c.info.run_id} ({c.info.run_name})" for c in children)
        raise RunNotFoundError(f"run {run_id} groups several splits; pick one of its split runs: {names}")
    try:
        folder = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=MODEL_ARTIFACT)
    except (MlflowException, OSError) as exc:
        raise RunNotFoundError(f"run {run_id} has no model artifact (did it finish?)") from exc
    return load_model(Path(folder), device=device)
