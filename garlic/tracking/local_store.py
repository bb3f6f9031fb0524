"""The local MLflow store as files, read without importing MLflow: where it is, and the model folder of a finished run.

Importing MLflow and opening its store (SQLAlchemy, its schema check) takes seconds, most of a one-stay
``garlic predict`` on a busy machine; a run's model in a local store is a folder that the store's SQLite database
names. ``stored_model_folder`` reads that name with Python's own ``sqlite3``, and answers only what it is sure of:
anything else (no such run, a run that groups splits, artifacts elsewhere than on this disk, a database it cannot
read) is left to MLflow (``garlic.tracking.queries.download_run_model``), whose errors name the problem. And
``database_error``: the SQLite error under an exception, which the command line and the dashboard report as a
store that cannot be used.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from garlic.tracking import run_contract

DEFAULT_STORE = Path(os.environ.get("GARLIC_MLRUNS", "mlruns"))
DATABASE = "mlflow.db"
MODEL_ARTIFACT = run_contract.MODEL
# MLflow's tables, as its SQLAlchemy store has kept them since its first schema: a run, and the runs naming it parent.
RUN_ARTIFACTS = "SELECT artifact_uri FROM runs WHERE run_uuid = ? AND lifecycle_stage = 'active'"
SPLIT_RUNS = "SELECT 1 FROM tags WHERE key = 'mlflow.parentRunId' AND value = ?"


def stored_model_folder(run_id: str, store: Path = DEFAULT_STORE) -> Path | None:
    """The model folder that split run ``run_id`` logged into the local ``store``, or None when MLflow must answer."""
    database = Path(store).resolve() / DATABASE
    if not database.is_file():
        return None
    try:
        with closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True)) as connection:  # never writes
            found = connection.execute(RUN_ARTIFACTS, (run_id,)).fetchone()
            groups_splits = connection.execute(SPLIT_RUNS, (run_id,)).fetchone()
    except sqlite3.Error:  # damaged, locked, or another MLflow's schema
        return None
    if found is None or groups_splits is not None or not found[0]:
        return None
    location = urlparse(found[0])
    if location.scheme != "file" or location.netloc not in ("", "localhost"):
        return None
    folder = Path(url2pathname(location.path)) / MODEL_ARTIFACT
    return folder if folder.is_dir() else None


def database_error(exc: BaseException) -> sqlite3.DatabaseError | None:
    """The SQLite error under ``exc`` (SQLAlchemy keeps it as ``orig``, MLflow as the cause), None when none is. An
    error raised ``from None`` has said what went wrong itself (the live store's): its context is not followed."""
    for _ in range(10):  # a chain is short; a cycle is not followed forever
        if exc is None or isinstance(exc, sqlite3.DatabaseError):
            return exc
        exc = getattr(exc, "orig", None) or exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return None
