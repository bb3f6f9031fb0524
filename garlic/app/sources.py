"""Where the dashboard's data come from: the MLflow store, the data root, and uploaded record files. Nothing else.

A run names its dataset and split; the stays are looked up under the configured data root (not at the folder the
run was trained from, which may be anywhere), so the page never reads outside the folders it was given.
"""

from __future__ import annotations

import io
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urlparse

import mlflow
import pandas as pd
import pyarrow.parquet as pq
from mlflow.exceptions import MlflowException

from garlic.data.batches import IrregularDataset
from garlic.data.datasets import processed_folder
from garlic.data.splits import split_path
from garlic.inference import tensors_for_model
from garlic.tracking import queries, run_contract
from garlic.methods.saved import SavedMethod, load_predictor
from garlic.tracking.store import RunNotFoundError, get_run, use_store
from garlic.sources.records import read_record_files
from garlic.io.tables import LABELS, read_manifest
from garlic.metrics.utility import DT_OPTIMAL
from garlic.io.tensors import load_tensors

STORE_DATABASE = "mlflow.db"
UPLOAD_NAME = re.compile(r"^(\d+\.txt|p\d+\.psv)$")
MAX_UPLOAD_BYTES = 1024 * 1024  # a PhysioNet 2012 record is under 100 kB, a 2019 one under 50 kB
ABSOLUTE_PATH = re.compile(r"(?:file://)?(?<![\w.])/[^\s'\",:;()]+")


class UploadError(ValueError):
    """An uploaded file that cannot be read as one stay for this model; the message says why."""


class OutsideFoldersError(RunNotFoundError):
    """A run that points the page at a file outside the MLflow store or the data root; refused."""


def inside(path: Path, folder: Path, what: str) -> Path:
    """``path`` resolved (links and ``..`` followed), or OutsideFoldersError if that leaves ``folder``."""
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(Path(folder).resolve()):
        raise OutsideFoldersError(f"{what} points outside the configured folders: refused")
    return resolved


def without_paths(message: str, folders: dict[str, Path]) -> str:
    """``message`` with the server's absolute paths taken out, for the page.

    Paths under a configured folder keep their place in it (``folders`` maps a label such as 'the data root' to
    the folder); any other absolute path is cut to its last part.
    """
    for label, folder in sorted(folders.items(), key=lambda item: -len(str(Path(item[1]).resolve()))):
        for form in {str(Path(folder).resolve()), str(folder)}:
            if Path(form).is_absolute():
                message = message.replace(f"file://{form}", label).replace(form, label)
    return ABSOLUTE_PATH.sub(lambda match: "…/" + match.group(0).rstrip("/").rsplit("/", 1)[-1], message)


def _artifacts_inside(store: Path, run: mlflow.entities.Run) -> None:
    """The run's artifacts must live in the store's own folder (the page reads nothing else)."""
    uri = urlparse(run.info.artifact_uri)
    if uri.scheme not in ("", "file"):
        raise OutsideFoldersError(f"run {run.info.run_id} keeps its artifacts outside the MLflow store: refused")
    inside(Path(unquote(uri.path)), store, f"run {run.info.run_id}'s artifact location")


@dataclass
class RunChoice:
    run_id: str
    label: str  # short enough for the sidebar's run list
    details: str  # the rest, shown under it


def open_store(store: Path) -> None:
    """Point MLflow at ``store``; an absent store is an error here rather than a new empty one."""
    if not (Path(store) / STORE_DATABASE).is_file():
        raise RunNotFoundError(f"no MLflow store at {store} (no {STORE_DATABASE}); train a model first")
    use_store(store)


def runs_with_models(store: Path) -> list[RunChoice]:
    """Every run in the store that logged a model, newest first."""
    open_store(store)
    return [RunChoice(run.info.run_id, *_run_label(run)) for run in queries.runs_with_models()]


def _run_label(run: mlflow.entities.Run) -> tuple[str, str]:
    """The label for the sidebar's list, short enough not to be cut off, and the details shown under it:
    ('synthetic · AUROC 0.844 · 588844e2', 'five-split/split_0 · started 2026-01-31 14:05 UTC · run 5888…'); the
    preset the run was trained from names it where it has one (``physionet2012-best · AUROC …``)."""
    params = run.data.params
    started = datetime.fromtimestamp(run.info.start_time / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    method = run_contract.method_of(run)  # GARLIC's unit runs carry its name too: its dataset names them
    named = method if method != run_contract.GARLIC else params.get("dataset", "?")
    label = [run.data.tags.get(run_contract.PRESET) or named]
    if "test_auroc" in run.data.metrics:
        label.append(f"AUROC {run.data.metrics['test_auroc']:.3f}")
    details = [params.get("split", "no split"), f"started {started}", f"run {run.info.run_id}"]
    return " · ".join([*label, run.info.run_id[:8]]), " · ".join(details)


def load_run(store: Path, run_id: str) -> tuple[SavedMethod, mlflow.entities.Run]:
    """The run's model and its record; RunNotFoundError (with the reason) when either is missing or unusable."""
    open_store(store)
    run = get_run(run_id)
    _artifacts_inside(store, run)
    try:
        trained = load_predictor(run_id, store)
    except (OSError, KeyError, ValueError, RuntimeError) as exc:  # a model folder that does not load
        raise RunNotFoundError(f"run {run_id} has a model artifact that cannot be loaded: {exc!r}") from exc
    return trained, run


def predictions(store: Path, run_id: str, part: str) -> pd.DataFrame:
    """The run's logged predictions for ``part`` ('validation' or 'test'): stay_id, label, risk."""
    open_store(store)
    _artifacts_inside(store, get_run(run_id))
    try:
        text = mlflow.artifacts.load_text(f"runs:/{run_id}/{run_contract.predictions(part)}")
    except (MlflowException, OSError) as exc:
        raise RunNotFoundError(f"run {run_id} has no {run_contract.predictions(part)}") from exc
    return pd.read_csv(io.StringIO(text))


def per_stay(predictions: pd.DataFrame) -> pd.DataFrame:
    """A run's predictions one row per stay (stay_id, label, risk): an hourly run's (a row per prediction time, with
    ``time``) as the stay's highest risk and whether any hour is labelled; a per-stay run's as they are."""
    if "time" not in predictions:
        return predictions
    return predictions.groupby("stay_id", as_index=False, sort=False).agg(label=("label", "max"), risk=("risk", "max"))


def onset_hours(run: mlflow.entities.Run, data_root: Path) -> pd.Series:
    """The sepsis onset hour of each septic stay of the run's dataset (by stay id; empty for a dataset without
    one): the first SepsisLabel 1 plus 6 hours, as the Sepsis Challenge places it (``garlic.metrics.utility``)."""
    dataset = run.data.params.get(run_contract.DATASET)
    if dataset is None:
        return pd.Series(dtype=float)
    path = inside(processed_folder(dataset, data_root), data_root, f"run {run.info.run_id}'s dataset") / LABELS
    columns = pq.read_schema(path).names if path.is_file() else []
    if "first_septic_hour" not in columns:
        return pd.Series(dtype=float)
    labels = pq.read_table(path, columns=["stay_id", "first_septic_hour"]).to_pandas().dropna()
    return labels.set_index("stay_id")["first_septic_hour"] - DT_OPTIMAL


def artifact_bytes(store: Path, run_id: str, path: str) -> bytes | None:
    """A file the run logged (a plot), or None when it has none at ``path``."""
    open_store(store)
    _artifacts_inside(store, get_run(run_id))
    with tempfile.TemporaryDirectory(prefix="garlic-artifact-") as folder:
        try:
            local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path, dst_path=folder)
        except (MlflowException, OSError):
            return None
        return Path(local).read_bytes()


def test_split(trained: SavedMethod, run: mlflow.entities.Run, data_root: Path) -> IrregularDataset:
    """The run's test stays, from its dataset under ``data_root`` and its saved split, ready for the model.

    Refused (``StaleRunDataError``) when that split or dataset is not the one the run was trained on.
    """
    params = run.data.params
    if run_contract.DATASET not in params or run_contract.SPLIT not in params:
        raise RunNotFoundError(f"run {run.info.run_id} does not name its dataset and split")
    run_id, split_name = run.info.run_id, params[run_contract.SPLIT]
    folder = inside(processed_folder(params[run_contract.DATASET], data_root), data_root, f"run {run_id}'s dataset")
    inside(
        split_path(folder, *run_contract.parse_split_name(split_name)),
        folder / "splits",
        f"run {run_id}'s split {split_name!r}",
    )
    split = run_contract.verify_split(run_id, params, folder, read_manifest(folder))
    tensors = load_tensors(folder)
    return trained.dataset(tensors.subset(split.positions(tensors, "test")))


def read_upload(name: str, data: bytes, trained: SavedMethod) -> IrregularDataset:
    """One uploaded record file (``RECORDID.txt`` or ``pNNNNNN.psv``) -> the stay, ready for the model.

    The bytes are written under a fresh temporary folder with the checked base name, and only that file is read.
    """
    base = re.split(r"[/\\]", name)[-1]
    if not UPLOAD_NAME.match(base):
        raise UploadError(
            f"{name!r} is not a record file name: expected a PhysioNet 2012 RECORDID.txt (e.g. 132539.txt) "
            "or a PhysioNet 2019 pNNNNNN.psv (e.g. p000001.psv)"
        )
    if len(data) > MAX_UPLOAD_BYTES:
        raise UploadError(
            f"{base} is {len(data) / 1e6:.1f} MB; one stay's record is under 0.1 MB "
            f"(at most {MAX_UPLOAD_BYTES // 1024} kB accepted)"
        )
    with tempfile.TemporaryDirectory(prefix="garlic-upload-") as folder:
        path = Path(folder) / base
        path.write_bytes(data)
        try:
            observations, static = read_record_files([path])
            tensors = tensors_for_model(trained, observations, static)
        except ValueError as exc:  # the readers' errors name the file: name it as uploaded, not the temporary path
            raise UploadError(str(exc).replace(str(path), base)) from exc
    if tensors.lengths.max(initial=0) == 0:
        raise UploadError(f"{base}: no observation of the model's variables in the first 48 hours")
    return trained.dataset(tensors)
