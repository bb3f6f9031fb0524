"""Plain helpers the test modules share (``from helpers import ...``; test modules never import one another):
where the real data are, the synthetic cohort, the dashboard's tiny tracked run, an independent raw reader of the
PhysioNet 2012 release, and random model batches. The fixtures built on them live in ``conftest.py``.

The raw reader parses the archives with ``tarfile`` and plain string splitting, without any code from
``garlic.sources``, so that tests can check the preprocessor against the release itself. The project's modules are
imported inside the helpers, so that collecting a test that needs none of them stays quick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

# The real data, beside the checkout (``../shared/data``); tests that need it skip when it is absent.
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
P12 = SHARED / "physionet2012"
HAVE_P12 = all((P12 / f"set-{s}.tar.gz").is_file() and (P12 / f"Outcomes-{s}.txt").is_file() for s in "abc")
requires_p12 = pytest.mark.skipif(
    not HAVE_P12, reason=f"the PhysioNet 2012 release is not at {P12} (set-{{a,b,c}}.tar.gz + Outcomes-{{a,b,c}}.txt)"
)


def synthetic_root(tmp_path_factory, n_stays: int, seed: int) -> Path:
    """A fresh data root whose ``processed/synthetic`` holds the synthetic cohort of ``n_stays`` stays from ``seed``."""
    from garlic.sources import synthetic

    root = tmp_path_factory.mktemp("data")
    synthetic.generate(root / "processed" / "synthetic", n_stays=n_stays, seed=seed)
    return root


@dataclass
class SyntheticCohort:
    """The synthetic cohort as the trainers take it: split 0 of the five-split protocol, normalised with its
    training statistics."""

    root: Path  # the data root (``synthetic_root``)
    tensors: object  # garlic.io.tensors.IrregularTensors
    split: object  # garlic.data.splits.Split
    parts: dict  # "train", "validation", "test" -> garlic.data.batches.IrregularDataset


def synthetic_cohort(tmp_path_factory, n_stays: int, seed: int) -> SyntheticCohort:
    from garlic.data.batches import IrregularDataset
    from garlic.data.splits import load_splits
    from garlic.io.tensors import load_tensors

    root = synthetic_root(tmp_path_factory, n_stays, seed)
    tensors = load_tensors(root / "processed" / "synthetic")
    split = load_splits(root / "processed" / "synthetic", tensors)[0]
    parts = {
        p: IrregularDataset(tensors.subset(split.positions(tensors, p)), split.normalisation)
        for p in ("train", "validation", "test")
    }
    return SyntheticCohort(root, tensors, split, parts)


@dataclass
class TinyRun:
    data_root: Path
    store: Path
    run_id: str


def tiny_run(tmp_path_factory, architecture: str = "compact") -> TinyRun:
    """A tiny synthetic run (300 stays, 2 epochs) of ``architecture`` in a temporary store, trained once per session
    and shared."""
    from garlic import runs
    from garlic.config import Config
    from garlic.data.datasets import processed_folder
    from garlic.sources import synthetic

    folder = tmp_path_factory.getbasetemp() / ("dashboard-run" if architecture == "compact" else f"{architecture}-run")
    done = folder / "run_id"
    if not done.is_file():
        synthetic.generate(processed_folder("synthetic", folder / "data"), n_stays=300, seed=3)
        config = Config.for_dataset("synthetic").override(
            {
                "hidden_dim": 16,
                "feature_dim": 4,
                "max_epochs": 2,
                "lr_cls": 5e-3,
                "lr_rec": 5e-3,
                "batch_size": 32,
                "device": "cpu",
                "architecture": architecture,
            }
        )
        run_id, _ = runs.train(config, data_root=folder / "data", store=folder / "mlruns")
        done.write_text(run_id)
    return TinyRun(folder / "data", folder / "mlruns", done.read_text())


def tiny_method_run(tmp_path_factory, method: str) -> TinyRun:
    """A registered method (``garlic train --method``) on split 0 of the tiny synthetic cohort, in its own store."""
    from garlic import runs
    from garlic.config import Config
    from garlic.data.datasets import processed_folder
    from garlic.sources import synthetic

    folder = tmp_path_factory.getbasetemp() / f"{method}-run"
    done = folder / "run_id"
    if not done.is_file():
        synthetic.generate(processed_folder("synthetic", folder / "data"), n_stays=300, seed=3)
        config = Config.for_dataset("synthetic").override({"max_epochs": 2, "device": "cpu"})
        run_id, _ = runs.train(config, [0], folder / "data", folder / "mlruns", method=method)
        done.write_text(run_id)
    return TinyRun(folder / "data", folder / "mlruns", done.read_text())


def record_files(processed: Path, stay_ids, folder: Path) -> list[str]:
    """The processed stays ``stay_ids`` of ``processed`` written back as PhysioNet 2012 record files in ``folder``
    (what ``garlic predict`` reads); their paths."""
    from garlic.sources import physionet2012
    from garlic.io.tables import read_processed

    tables = read_processed(processed)
    static = tables.static.set_index("stay_id")
    paths = []
    for stay in stay_ids:
        path = Path(folder) / f"{stay}.txt"
        observations = tables.observations[tables.observations["stay_id"] == stay]
        path.write_text(physionet2012.format_record(int(stay), observations, static.loc[stay].to_dict()))
        paths.append(str(path))
    return paths


def garlic_main(argv: list[str]) -> None:
    """``garlic`` (``garlic.cli.main``) run in this process, with the SIGTERM and SIGINT handlers that ``garlic train``
    sets put back after: a test spends no process start-up on what this process has imported."""
    import signal

    from garlic.cli import main

    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        main(argv)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)


def garlic_here(*args: str, root: Path):
    """``garlic`` run in this process (``garlic_main``) on ``root``'s data and store, for what its standard output
    and exit status show: a process would spend seconds importing what this one has loaded. Its log lines are not
    captured. Returns a ``subprocess.CompletedProcess``."""
    import io
    import subprocess
    from contextlib import redirect_stderr, redirect_stdout

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            garlic_main(["--data-root", str(root / "data"), "--mlruns", str(root / "mlruns"), *args])
            code = 0
        except SystemExit as stopped:
            code = stopped.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def run_without_model(store: Path) -> str:
    """A run that stopped before logging its model."""
    import mlflow

    from garlic.tracking.store import use_experiment, use_store

    use_store(store)
    use_experiment("synthetic", store)
    with mlflow.start_run(run_name="crashed") as run:
        mlflow.log_params({"dataset": "synthetic"})
    return run.info.run_id


# Written out here rather than imported, so that a change to the parser's list shows up as a failing test.
P12_TIME_SERIES = {
    "ALP",
    "ALT",
    "AST",
    "Albumin",
    "BUN",
    "Bilirubin",
    "Cholesterol",
    "Creatinine",
    "DiasABP",
    "FiO2",
    "GCS",
    "Glucose",
    "HCO3",
    "HCT",
    "HR",
    "K",
    "Lactate",
    "MAP",
    "MechVent",
    "Mg",
    "NIDiasABP",
    "NIMAP",
    "NISysABP",
    "Na",
    "PaCO2",
    "PaO2",
    "Platelets",
    "RespRate",
    "SaO2",
    "SysABP",
    "Temp",
    "TroponinI",
    "TroponinT",
    "Urine",
    "WBC",
    "pH",
}


@dataclass
class RawRelease:
    """What the release says, read without the preprocessor."""

    texts: dict[int, tuple[str, str]] = field(default_factory=dict)  # stay -> (set letter, file text)
    outcomes: dict[int, dict[str, str]] = field(default_factory=dict)  # stay -> outcomes row
    nameless: list[tuple[str, int]] = field(default_factory=list)  # (archive:member, line number)
    in_window: dict[int, list[tuple[float, str, float]]] = field(default_factory=dict)  # stay -> series rows <= 48 h


def raw_series(text: str) -> list[tuple[float, str, float]]:
    """A record's time-series rows within 48 h, parsed with plain string operations; Urine readings at one time
    add up to one row (two outputs charted together are both output)."""
    rows, urine = [], {}
    for line in text.splitlines()[1:]:
        fields = line.split(",")
        if len(fields) != 3 or fields[1] not in P12_TIME_SERIES:
            continue
        hours, minutes = fields[0].split(":")
        time = int(hours) + int(minutes) / 60
        if time <= 48 and fields[1] == "Urine":
            urine[time] = urine.get(time, 0.0) + float(fields[2])
        elif time <= 48:
            rows.append((time, fields[1], float(fields[2])))
    return rows + [(time, "Urine", total) for time, total in urine.items()]


def assert_frames_equal(left, right) -> None:
    """Same columns, dtypes and values (NaN equal to NaN); much faster than pandas' check on big categoricals."""
    assert list(left.columns) == list(right.columns)
    assert len(left) == len(right)
    for column in left.columns:
        a, b = left[column], right[column]
        assert a.dtype == b.dtype, column
        if isinstance(a.dtype, pd.CategoricalDtype):
            a, b = a.astype(str), b.astype(str)
        a, b = a.to_numpy(), b.to_numpy()
        if a.dtype.kind == "f":
            assert np.array_equal(a, b, equal_nan=True), column
        else:
            assert (a == b).all(), column


def random_batch(seed: int = 0, lengths=(12, 7, 3, 1, 9), variables: int = 4, static_features: int = 3):
    """A batch of len(lengths) random stays for the model tests: values, mask, times [B, T(, D)], lengths, static.

    T is the longest length; padded steps have no observation and time 0.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    batch, steps = len(lengths), int(lengths.max())
    real = torch.arange(steps)[None, :] < lengths[:, None]
    mask = (torch.rand(batch, steps, variables, generator=generator) < 0.4).float() * real[:, :, None]
    values = torch.randn(batch, steps, variables, generator=generator) * mask
    times = torch.cumsum(torch.rand(batch, steps, generator=generator) * 2, dim=1) * real
    static = torch.randn(batch, static_features, generator=generator)
    return values, mask, times, lengths, static


def error_line(stderr: str) -> str:
    """The one line of a refusal: the last, after the lines that said what the command was loading."""
    *steps, error = stderr.strip().splitlines()
    assert all(line.startswith("garlic: ") and line.endswith(" ...") for line in steps), stderr
    return error


def garlic_settings(config):
    """GARLIC's network and training settings (``NetworkConfig``, ``TrainingConfig``) of the run config ``config``, as
    ``make_trainer`` and the trainers take them."""
    from garlic.models.network_config import NetworkConfig
    from garlic.training.training_config import TrainingConfig

    return NetworkConfig.from_run(config), TrainingConfig.from_run(config)
