"""The ``garlic`` command: download, preprocess, export, train, evaluate, predict, score-utility, dashboard, monitor,
feed.

Parsing the command line imports nothing heavy (no torch, MLflow, pandas or Streamlit): ``--help`` and a mistyped
option answer at once, and each command imports what it uses.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from garlic.config import Config, ConfigError
from garlic.data.datasets import DEFAULT_DATA_ROOT, SOURCES, dataset_name, dataset_names, processed_folder
from garlic.live.access import port_number
from garlic.tracking.local_store import database_error
from garlic.training.workers import PARENT_ENV, die_with_parent

log = logging.getLogger("garlic")
DESCRIPTION = (
    "GARLIC-ICU: download and preprocess ICU data, train and evaluate GARLIC, predict, open the dashboard, "
    "score a live ward."
)
STORE_FILE = "mlflow.db"  # the SQLite file of a local MLflow store (garlic.tracking.store.use_store)
UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES}  # a full disk, a read-only store: one line
LEFT_OUT = 3  # exit status of a `garlic predict` that wrote its risks but left records out (2: nothing written)
# Errors that bad input causes, reported in one line: (module, class), looked up only once the module is loaded.
USER_ERRORS = (("garlic.tracking.store", "RunNotFoundError"), ("garlic.io.download", "DownloadError"))


def _say(message: str) -> None:
    print(f"garlic: {message}", file=sys.stderr, flush=True)


def _folder(path: Path, option: str, variable: str, given: bool) -> Path:
    """The folder that ``option`` (``given``), else the environment's ``variable``, else the default names; refused in
    one line when it is a file, where every later step would fail deep inside, with a traceback."""
    if path.exists() and not path.is_dir():
        named_by = option if given else f"${variable}" if variable in os.environ else f"the default {option}"
        raise ConfigError(f"{named_by} {path} is a file, not a folder")
    return path


def _store(args: argparse.Namespace) -> Path:
    """The MLflow store folder: ``--mlruns``, else ``GARLIC_MLRUNS``, else ``mlruns`` (``garlic.tracking.store``)."""
    if args.mlruns is not None:
        return _folder(Path(args.mlruns), "--mlruns", "GARLIC_MLRUNS", given=True)
    from garlic.tracking.local_store import DEFAULT_STORE

    return _folder(DEFAULT_STORE, "--mlruns", "GARLIC_MLRUNS", given=False)


def _existing_store(args: argparse.Namespace) -> Path:
    """The store, refusing one that does not exist: reading runs must not leave an empty store behind."""
    store = _store(args)
    if not (store / STORE_FILE).is_file():
        raise ConfigError(
            f"no MLflow store in {store.resolve()} (no {STORE_FILE}); run `garlic train` first, or "
            f"point --mlruns or GARLIC_MLRUNS at the store that holds the run"
        )
    return store


def _shown(path: Path) -> str:
    """``path`` as a user here would type it: relative when below the current folder."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _program(name: str) -> str:
    """How to call the venv's ``name`` from here (its file next to this Python): not every shell has it on PATH."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        return f"{_shown(Path(sys.executable))} -m {'garlic.cli' if name == 'garlic' else name}"
    return _shown(path)


def _download(args: argparse.Namespace) -> None:
    from garlic.io.download import download

    for outcome in download(args.dataset, args.to, args.base_url, args.only):
        print(f"{outcome.name}: {outcome.status}, SHA-256 {outcome.sha256}")
    if args.dataset == "physionet2019":
        print("checked against the release's SHA256SUMS.txt as served (no checksum is pinned for this release)")
    print(f"next: garlic preprocess {args.dataset} --source {args.to}")


def _preprocess(args: argparse.Namespace) -> None:
    from garlic.data.datasets import preprocess

    dataset, folder, manifest = preprocess(
        args.dataset,
        args.data_root,
        cohort=args.cohort,
        source=args.source,
        named=args.name,
        strict=args.strict,
        stays=args.stays,
        seed=args.seed,
        drop_share=args.drop_share,
        drop_sensors=args.drop_sensors,
        labels=args.labels,
        window_hours=args.window_hours,
        variables=args.variables,
        static=args.static,
    )
    print(f"{dataset}: wrote {folder} ({json.dumps(manifest.get('counts', {}))})")
    print(f"next: garlic train --dataset {dataset}")


def _export(args: argparse.Namespace) -> None:
    """A processed dataset as a MEDS folder: data shards, codes, one label file and the subject splits of split
    ``--split`` of ``--protocol`` (made and saved as ``garlic train`` would, when not saved yet)."""
    from garlic.data.datasets import ensure_processed
    from garlic.data.splits import PARTS, chosen_splits, load_splits
    from garlic.io.meds import write_meds
    from garlic.io.tables import read_processed
    from garlic.io.tensors import load_tensors

    folder = ensure_processed(args.dataset, args.data_root)
    split = chosen_splits(load_splits(folder, load_tensors(folder), args.protocol), [args.split], args.protocol)[0]
    parts = {part: getattr(split, part) for part in PARTS}
    written = write_meds(args.to, read_processed(folder), args.dataset, parts)
    print(
        f"{args.dataset}: wrote {args.to} ({written['events']} events in {written['shards']} shard(s), "
        f"{written['labels']} label rows; subject splits: {split.name})"
    )
    # with the dataset's own lists: read back, its columns come in the same order (docs/own-data.md)
    print(
        f"next: garlic preprocess meds --source {shlex.quote(str(args.to))} "
        f"{' '.join(map(shlex.quote, written['preprocess_options']))}"
    )


def _config(args: argparse.Namespace, assignments: list[str] | None = None) -> Config:
    """The run's config: ``assignments`` (``--set``'s for the config; default: all of them) and an explicit
    ``--dataset`` beat ``--config FILE``, which beats the preset."""
    given = {"dataset": args.dataset} if args.dataset else {}
    config = Config.load(args.config, **given) if args.config else Config.for_dataset(args.dataset or "synthetic")
    overrides = list(args.set if assignments is None else assignments)
    if args.protocol:
        overrides.append(f"split_protocol={args.protocol}")
    if args.device:
        overrides.append(f"device={args.device}")
    return config.override(overrides)


def _units(args: argparse.Namespace, protocol_name: str) -> tuple[list[int], list[int] | None]:
    """The split indices and model seeds to train: the whole protocol, or split K (default 0) with one seed."""
    from garlic.data.splits import protocol

    chosen = protocol(protocol_name)
    if args.all_splits or (args.protocol and args.split is None):
        return list(chosen.splits), None if chosen.seeds is None else list(chosen.seeds)
    return [0 if args.split is None else args.split], None


class _Stopping:
    """SIGTERM ends the process as ``SystemExit(143)``: an exception, unlike the default handler, lets MLflow mark the
    run as failed, and ``--resume`` takes it up. SIGINT (Ctrl-C) ends it as ``KeyboardInterrupt``, which ends the run
    KILLED (``garlic.tracking.store.tracked_run``); ``main`` says how to resume it. Python drops an exception raised
    while it runs a finaliser or a weakref callback, and the signal can land there (it did, in SQLAlchemy's: a worker
    stopped at its deadline trained on to its last epoch). So the signal is also kept, and raised again at the end of
    every epoch (``checked``)."""

    def __init__(self):
        self.received: int | None = None
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self._handle)

    def _handle(self, number: int, frame) -> None:
        self.received = number
        self._stop()

    def _stop(self) -> None:
        if self.received == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + self.received)

    def checked(self, on_epoch: Callable[[str, object], None]) -> Callable[[str, object], None]:
        """``on_epoch(split, record)`` that first raises a signal received earlier."""

        def checked_on_epoch(split: str, record) -> None:
            if self.received is not None:
                self._stop()
            on_epoch(split, record)

        return checked_on_epoch


def _stage_spans(run_id: str) -> str:
    """The stages of a split run, from its logged ``stage_is_prediction`` metric: 'reconstruction 1-9, ...'."""
    import mlflow

    history = sorted(mlflow.MlflowClient().get_metric_history(run_id, "stage_is_prediction"), key=lambda m: m.step)
    spans: list[list] = []
    for metric in history:
        stage = "prediction" if metric.value else "reconstruction"
        if spans and spans[-1][0] == stage:
            spans[-1][2] = metric.step
        else:
            spans.append([stage, metric.step, metric.step])
    return ", ".join(f"{stage} {first}-{last}" if first != last else f"{stage} {first}" for stage, first, last in spans)


def _check_binary(dataset: str, data_root: Path) -> None:
    """Refuse a processed dataset of several classes before anything is made for its run (``tables.check_binary``;
    ``garlic.runs.train`` checks it again for its other callers)."""
    from garlic.io.tables import MANIFEST, check_binary, read_manifest

    folder = processed_folder(dataset, data_root)
    if (folder / MANIFEST).is_file():
        check_binary(read_manifest(folder), dataset)


def _prepare(dataset: str, protocol_name: str, data_root: Path) -> None:
    """Say what the first run of ``dataset`` makes (the synthetic cohort, the tensor cache, ``protocol_name``'s splits)
    as it starts."""
    from garlic.data.datasets import ensure_processed
    from garlic.sources.synthetic import EXAMPLE_RECORDS
    from garlic.io.tables import MANIFEST
    from garlic.io.tensors import TENSORS

    folder = processed_folder(dataset, data_root)
    if dataset == "synthetic" and not (folder / MANIFEST).is_file():
        start = time.perf_counter()
        _say(f"generating the synthetic cohort in {folder} (first run only) ...")
        ensure_processed(dataset, data_root)
        _say(
            f"generated it in {time.perf_counter() - start:.1f} s, and new stays to try `garlic predict` and the "
            f"dashboard's upload on: {folder / EXAMPLE_RECORDS}"
        )
    making = [f"the tensor cache {folder / TENSORS}"] if not (folder / TENSORS).is_file() else []
    if not (folder / "splits" / protocol_name).is_dir():
        making.append(f"the saved {protocol_name} splits in {folder / 'splits'}")
    if making and (folder / MANIFEST).is_file():
        _say(f"making {' and '.join(making)} (first run only) ...")


class _Progress:
    """Training as the console shows it: a bar per split with the epoch, the stage, validation AUROC and AUPRC and
    the measured seconds per epoch, redrawn every few seconds with the batches the running epoch has done
    (``EpochPass.running``), so that a slow epoch shows where it is (the first one included: the bar exists from
    the start). Called as ``on_epoch(split, record)``."""

    REDRAW_SECONDS = 5.0
    FORMAT = "{desc}: epoch {n_fmt}/{total_fmt} |{bar:12}| {elapsed} elapsed{postfix}"
    WITHOUT_EPOCHS = "{desc}: {elapsed} elapsed"

    def __init__(self, max_epochs: int | None, enabled: bool = True, counts_epochs: bool = True):
        """``counts_epochs`` False: a method fitted in one go, whose bar shows only the time elapsed."""
        self.max_epochs, self.enabled = max_epochs, enabled
        self.bar_format = self.FORMAT if counts_epochs else self.WITHOUT_EPOCHS
        self.bars: dict = {}
        self.seconds: dict[str, list[float]] = {}
        self.stages: dict[str, str] = {}
        self.summaries: dict[str, str] = {}  # split: the postfix its last epoch set
        self.last: str | None = None  # the split whose epoch ended last
        self.waiting = None
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def __enter__(self) -> "_Progress":
        if self.enabled:
            self.waiting = self._bar("training", 0)  # the first split's, named when its first epoch ends
            threading.Thread(target=self._redraw, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        with self.lock:
            for bar in self._open():
                bar.close()

    def _bar(self, name: str, done: int):
        from tqdm import tqdm

        return tqdm(total=self.max_epochs, initial=done, desc=name, bar_format=self.bar_format, file=sys.stderr)

    def _open(self) -> list:
        return [*self.bars.values(), *([self.waiting] if self.waiting is not None else [])]

    def _redraw(self) -> None:
        while not self.stopped.wait(self.REDRAW_SECONDS):
            with self.lock:
                if self.bar_format == self.FORMAT:
                    self._show_running_epoch()
                for bar in self._open():
                    bar.refresh()

    def _show_running_epoch(self) -> None:
        """The running epoch's batches done, on its split's bar: the bar last updated where the epoch follows its
        last, else a bar for a split yet to finish an epoch (the first split's from the start, another made now)."""
        from garlic.training.trainer import EpochPass

        running = EpochPass.running
        if running is None:
            return
        bar, summary = self.bars.get(self.last), self.summaries.get(self.last)
        if bar is None or bar.n != running.epoch - 1:
            if self.waiting is None:
                self.waiting = self._bar("training", running.epoch - 1)
            bar, summary = self.waiting, None
        shown = [summary, f"epoch {running.epoch}: {running.done}/{len(running)} batches"]
        bar.set_postfix_str(", ".join(part for part in shown if part), refresh=False)

    def __call__(self, split: str, record) -> None:
        if not self.enabled:
            return
        with self.lock:
            bar = self.bars.get(split)
            if bar is None:
                bar = self.waiting if self.waiting is not None else self._bar(split, record.epoch - 1)
                self.waiting = None
                bar.set_description_str(split)
                bar.n = record.epoch - 1  # a resumed split starts where it stopped
                self.bars[split] = bar
            if self.stages.get(split, record.stage) != record.stage:
                bar.write(f"{split}: epoch {record.epoch} switches to the {record.stage} stage", file=sys.stderr)
            self.stages[split] = record.stage
            seconds = self.seconds.setdefault(split, [])
            seconds.append(record.seconds)
            pace = sum(seconds) / len(seconds)
            left = f", at most {pace * (bar.total - record.epoch):.0f} s left" if bar.total else ""
            self.summaries[split] = (
                f"{record.stage}, val AUROC {record.val_auroc:.3f} AUPRC "
                f"{record.val_auprc:.3f}, {pace:.1f} s/epoch{left}"
            )
            bar.set_postfix_str(self.summaries[split], refresh=False)
            bar.update(1)
            self.last = split
            if bar.total is not None and bar.n >= bar.total:
                bar.write(
                    f"{split}: testing the selected epoch, writing plots, explanations and the model ...",
                    file=sys.stderr,
                )


def _train(args: argparse.Namespace) -> None:
    """``garlic train [--method NAME]``: any method of the registry, GARLIC by default, through ``garlic.runs.train``."""
    if args.resume and (args.set or args.config or args.all_splits or args.split is not None or args.protocol):
        raise ConfigError(
            "--resume continues a run with its own config and splits; drop --set/--config/--split/--protocol"
        )
    from garlic.tracking.carry import check_folder

    check_folder(args.carry)  # a ValueError: one line, as every bad argument
    if args.resume:
        _say(f"resuming run {args.resume}; loading torch, scikit-learn and MLflow ...")
        config, preset_name, method_settings = None, None, None
    else:
        shown = "GARLIC" if args.method == "garlic" else args.method
        _say(f"training {shown}; loading torch, scikit-learn and MLflow ...")  # before the imports: a few seconds
        from garlic.methods import registry

        spec = registry.method(args.method)  # an unknown method or a missing extra is named before any work
        spec.check_installed()
        assignments, method_settings = spec.parse_settings(args.set)  # the method's own settings, the config's
        config = _config(args, assignments)
        _check_binary(config.dataset, args.data_root)
        indices, seeds = _units(args, config.split_protocol)
        which = f"split {indices[0]}" if len(indices) == 1 else f"splits {', '.join(map(str, indices))}"
        preset = Config.preset_path(config.dataset)
        source = args.config or (_shown(preset) if preset else "built-in defaults")
        preset_name = Path(args.config).stem if args.config else preset.stem if preset else None
        # A method fitted in one go (gradient boosting, logistic regression ...) has no epochs to count.
        epochs = config.max_epochs if hasattr(spec.method_class, "set_training_hooks") else None
        budget = f", at most {epochs} epochs" if epochs else ""
        _say(f"dataset {config.dataset}, {which} of the {config.split_protocol} protocol{budget} (config: {source})")
        if not spec.seeded:  # a method other than GARLIC: one run per split, whatever seeds the protocol names
            seeds, preset_name = None, None
    from garlic.training.device import resolve_device

    resolve_device(config.device if config else args.device or "auto")  # before a store is made or data read
    store = _store(args)
    if not (store / STORE_FILE).is_file():
        _say(f"creating a new MLflow store in {store.resolve()}")

    from garlic.training import distributed
    from garlic import runs

    stopping = _Stopping()
    with distributed.process_group(config.device if config else args.device or "auto"):
        if args.resume:
            with _Progress(None, enabled=distributed.is_main()) as progress:  # the run's config is read later
                run_id, results = runs.resume(
                    args.resume, args.data_root, store, stopping.checked(progress), args.device, args.carry
                )
        else:
            with distributed.main_first():
                if distributed.is_main():
                    _prepare(config.dataset, config.split_protocol, args.data_root)
            with _Progress(epochs, enabled=distributed.is_main(), counts_epochs=epochs is not None) as progress:
                run_id, results = runs.train(
                    config,
                    indices,
                    args.data_root,
                    store,
                    stopping.checked(progress),
                    seeds=seeds,
                    preset=preset_name,
                    method=args.method,
                    method_settings=method_settings,
                    carry=args.carry,
                )
    if run_id is None:  # a helper rank under torchrun: rank 0 reports
        return
    import mlflow

    from garlic.tracking import run_contract

    for result in results:
        scores = ", ".join(f"{k} {v:.4f}" for k, v in result.test.items())
        if result.best_epoch is None:  # a method without epochs
            print(f"{result.split} (run {result.run_id}): test {scores}")
            continue
        spans = _stage_spans(result.run_id)
        mlflow.MlflowClient().set_tag(result.run_id, run_contract.STAGES, spans)
        print(f"{result.split} (run {result.run_id}, best epoch {result.best_epoch}): test {scores}")
        if spans:
            print(f"{result.split} stages by epoch: {spans}")
    garlic = " ".join([_program("garlic"), *_where(args)])
    print(f"run {run_id}")
    print(f"next: the bedside dashboard on this run: {garlic} dashboard --run {run_id}   (http://localhost:8501)")
    # One server process, not MLflow's default four: one reader needs no more, and it answers twice as soon.
    print(
        f"      every metric and plot in MLflow: {_program('python')} -m mlflow ui --workers 1 --backend-store-uri "
        f"sqlite:///{store.resolve() / STORE_FILE}"
    )


def _where(args: argparse.Namespace) -> list[str]:
    """The options that a later command on the same data and store needs (``--data-root``, ``--mlruns``)."""
    where = [f"--data-root {args.data_root}"] if args.data_root != DEFAULT_DATA_ROOT else []
    return where + ([f"--mlruns {args.mlruns}"] if args.mlruns is not None else [])


def _interrupted(args: argparse.Namespace, interrupt: KeyboardInterrupt) -> str:
    """What Ctrl-C stopped, in one line: the run it ended KILLED (``RunInterrupted``) and how to go on with it."""
    run_id = getattr(interrupt, "run_id", None)
    if run_id is None:
        return "interrupted"
    resume = " ".join([_program("garlic"), *_where(args), "train", "--resume", run_id])
    return f"interrupted: run {run_id} is marked KILLED; continue it where it stopped with: {resume}"


def _evaluate(args: argparse.Namespace) -> None:
    store = _existing_store(args)
    _say(f"evaluating run {args.run}; loading torch, scikit-learn and MLflow ...")  # before the imports: seconds
    from garlic.runs import evaluate_run

    print(json.dumps(evaluate_run(args.run, store, args.data_root, say=_say), indent=2))


def _predict(args: argparse.Namespace) -> None:
    if args.threshold is not None and not 0 < args.threshold <= 1:
        raise ValueError(f"--threshold is a risk in (0, 1], got {args.threshold}")
    if args.window_hours is not None and not args.window_hours > 0:
        raise ValueError(f"--window-hours must be a positive number of hours, got {args.window_hours}")
    policy_flags = (
        ("--profile", args.profile),
        ("--band", args.band),
        ("--quiet-hours", args.quiet_hours),
        ("--margin", args.margin),
    )
    unused = [
        flag
        for flag, value, used in (
            ("--threshold", args.threshold, args.hourly or args.labels),
            ("--window-hours", args.window_hours, args.labels),
            ("--split", args.split, args.labels),
            *((flag, value, args.hourly) for flag, value in policy_flags),
        )
        if value is not None and not used
    ]
    if unused:
        raise ValueError(
            f"{' and '.join(unused)}: a per-stay prediction has no alarm or window to set; "
            "--threshold goes with --hourly or --labels, --window-hours and --split with --labels, the alert "
            "policy's --profile, --band, --quiet-hours and --margin with --hourly"
        )
    store = _existing_store(args)
    # The model code, not MLflow's nor scikit-learn's: a one-stay predict (a user's first try, a live service) reads
    # the model's folder straight from the store (garlic.tracking.local_store).
    _say(f"predicting with run {args.run}; loading torch and the model code ...")
    import numpy as np
    import pandas as pd

    from garlic.inference import predict_tables
    from garlic.methods.saved import load_predictor
    from garlic.sources.raw import LeftOut
    from garlic.sources.records import read_record_files

    if args.hourly:
        return _predict_hourly(args, store)
    if args.labels is not None:
        return _predict_meds(args, store)
    _say(f"reading run {args.run}'s model from {_shown(store)} ...")
    trained = load_predictor(args.run, store)
    shown = [_shown(path) for path in args.input]
    _say(f"reading the records in {', '.join(shown[:3])}{f' and {len(shown) - 3} more' if len(shown) > 3 else ''} ...")
    left_out: list[LeftOut] = []  # one record without an observation blocks no other
    observations, static = read_record_files(args.input, left_out=left_out)
    stays = static["stay_id"].nunique()
    _say(f"scoring {stays} stay{'s' if stays != 1 else ''} ...")
    risks = predict_tables(trained, observations, static).assign(left_out="")
    unscored = pd.DataFrame(
        {"stay_id": [r.stay_id for r in left_out], "risk": np.nan, "left_out": [r.reason for r in left_out]}
    )
    risks = pd.concat([risks, unscored], ignore_index=True) if left_out else risks
    risks.to_csv(args.output or sys.stdout, index=False)
    if left_out:
        print(
            f"garlic: {len(left_out)} of {len(risks)} records left out, with no risk (rows with an empty risk): "
            f"{', '.join(r.origin for r in left_out)}",
            file=sys.stderr,
        )
        raise SystemExit(LEFT_OUT)


def _predict_hourly(args: argparse.Namespace, store: Path) -> None:
    """``garlic predict --hourly``: the Sepsis Challenge's prediction files, one per record, in ``--output``."""
    from garlic.inference import (
        ALARM_DRIVERS,
        TOP_DRIVERS,
        predict_hourly,
        write_alarm_drivers,
        write_hourly_predictions,
    )
    from garlic.methods.contract import unexplained_reason
    from garlic.methods.saved import load_predictor
    from garlic.sources.physionet2019 import read_hourly_record_files
    from garlic.sources.records import record_files

    if args.output is None:
        raise ValueError("--hourly writes one prediction file per record: name their folder with --output")
    found = _policy(args, store)
    trained = load_predictor(args.run, store)
    observations, static, tasks = read_hourly_record_files(record_files(args.input, ".psv"))
    _say(
        f"scoring {len(tasks)} hours of {static['stay_id'].nunique()} stays; {found.policy.describe()} "
        f"({found.chosen_by}) ..."
    )
    risks = predict_hourly(trained, observations, static, tasks, drivers=TOP_DRIVERS)
    written = write_hourly_predictions(args.output, risks, found.policy)
    _say(f"wrote {len(written)} prediction files in {_shown(args.output)}")
    if "drivers" in risks:
        alarms = write_alarm_drivers(args.output / ALARM_DRIVERS, risks, found.policy)
        _say(f"wrote the top drivers of its {alarms} alarmed hours in {_shown(args.output / ALARM_DRIVERS)}")
    else:
        _say(
            f"{trained.name} gives no drivers of its alarms"
            + (f": {unexplained_reason(trained.method)}" if unexplained_reason(trained.method) else "")
        )


def _predict_meds(args: argparse.Namespace, store: Path) -> None:
    """``garlic predict --labels``: a MEDS folder's label rows scored, written in the MEDS prediction schema."""
    from garlic.inference import predict_meds
    from garlic.io.meds import SUBJECT_SPLITS, read_labels, read_subject_splits, shards, write_predictions
    from garlic.io.tables import MANIFEST, read_manifest
    from garlic.methods.saved import load_predictor
    from garlic.sources.meds import read_tables

    if args.output is None or len(args.input) != 1:
        raise ValueError(
            "--labels scores a MEDS folder: give that one folder as --input, and the Parquet file to write as --output"
        )
    trained = load_predictor(args.run, store)
    window = args.window_hours
    if window is None:
        folder = processed_folder(trained.config.dataset, args.data_root)
        window = read_manifest(folder).get("window_hours") if (folder / MANIFEST).is_file() else None
        if window is None:
            raise ValueError(
                f"the window of run {args.run}'s dataset {trained.config.dataset} is not known here (no "
                f"{folder}); give the --window-hours it was preprocessed with"
            )
    label_rows = read_labels(args.labels)
    if args.split is not None:
        splits = read_subject_splits(args.input[0])
        if splits is None:
            raise ValueError(f"--split {args.split}: {_shown(args.input[0] / SUBJECT_SPLITS)} is absent")
        label_rows = label_rows[label_rows["subject_id"].isin(splits["subject_id"][splits["split"] == args.split])]
        if label_rows.empty:
            raise ValueError(f"--split {args.split}: no label row of {_shown(args.labels)} has a subject in it")
    _say(f"reading {_shown(args.input[0])} for {len(label_rows)} label rows, a window of {window:g} h ...")
    tables = read_tables(shards(args.input[0]), label_rows, float(window), trained.variables, trained.static_features)
    risks = predict_meds(trained, tables)
    threshold = args.threshold
    if threshold is None:
        try:
            threshold = _run_threshold(args.run, store)
        except ValueError:
            threshold = None  # a per-stay run chose none: the probabilities alone, as meds-evaluation accepts
    write_predictions(args.output, risks, threshold)
    _say(
        f"wrote {len(risks)} predictions to {_shown(args.output)}"
        + ("" if threshold is None else f", predicted true at risk >= {threshold:.4g}")
    )
    missing = len(label_rows) - len(risks)
    if missing:
        _say(
            f"{missing} of {len(label_rows)} label rows left out, with no prediction: their subjects have neither "
            "an event of the model's variables in the window nor a static feature"
        )
        raise SystemExit(LEFT_OUT)


def _run_threshold(run_id: str, store: Path) -> float:
    """The alarm threshold the run chose on validation (its ``threshold`` metric)."""
    from garlic.tracking.store import use_store

    use_store(store)
    import mlflow

    threshold = mlflow.MlflowClient().get_run(run_id).data.metrics.get("threshold")
    if threshold is None:
        raise ValueError(
            f"run {run_id} logged no alarm threshold (it was not trained on an hourly task); give one with --threshold"
        )
    return threshold


def _score_utility(args: argparse.Namespace) -> None:
    from garlic.metrics.utility import read_folders

    print(read_folders(args.labels, args.predictions).scores().table())


def _calibrate(args: argparse.Namespace) -> None:
    """``garlic calibrate``: a run's alert policy set on a site's own record files, written as a site profile."""
    targets = [
        flag
        for flag, value in (
            ("--alerts-per-day", args.alerts_per_day),
            ("--sensitivity", args.sensitivity),
            ("--labelled", args.labelled or None),
        )
        if value is not None
    ]
    if len(targets) != 1:
        raise ValueError(
            "set the threshold for one target: --alerts-per-day X (no labels needed), --sensitivity S or "
            f"--labelled (the highest utility), got {' and '.join(targets) or 'none'}"
        )
    store = _existing_store(args)
    _say(f"calibrating run {args.run} on {_shown(args.site)}; loading torch and the model code ...")
    from garlic.evaluation import alerting
    from garlic.inference import predict_each_hour
    from garlic.methods.saved import load_predictor
    from garlic.sources.physionet2019 import read_hourly_record_files
    from garlic.sources.records import read_record_files, record_files

    found = alerting.policy_for(args.run, store, band=args.band, quiet_hours=args.quiet_hours, margin=args.margin)
    trained = load_predictor(args.run, store)
    if found.hourly:  # the Challenge's files: every row a prediction time, with its SepsisLabel
        observations, static, tasks = read_hourly_record_files(record_files([args.site], ".psv"))
    else:
        observations, static = read_record_files([args.site])
        tasks = None
    if static.empty:
        raise ValueError(f"{args.site}: no record file with an observation to calibrate on")
    labelled = args.sensitivity is not None or args.labelled
    if labelled and not found.hourly:
        raise ValueError(
            f"run {args.run} gives one risk per stay: its alerts have no hourly labels to set a "
            "sensitivity or a utility on; use --alerts-per-day"
        )
    _say(f"scoring every hour of {static['stay_id'].nunique()} stays ...")
    risks = predict_each_hour(trained, observations, static, tasks)
    if labelled:
        risks = risks.merge(tasks, on=["stay_id", "time"], how="left", validate="one_to_one")
    settings = {"band": found.policy.band, "quiet_hours": found.policy.quiet_hours, "margin": found.policy.margin}
    choice = alerting.choose(risks, alerts_per_day=args.alerts_per_day, sensitivity=args.sensitivity, **settings)
    written = alerting.write_profile(
        args.profile, args.run, Path(args.site).name, choice, risks["stay_id"].nunique(), len(risks)
    )
    scored = ", ".join(f"{name} {value:.3g}" for name, value in choice.scores.items())
    print(
        f"{choice.policy.describe()}; chosen for {choice.chosen_by} on "
        f"{risks['stay_id'].nunique()} stays ({scored}); wrote {_shown(written)}"
    )


def _score_alerts(args: argparse.Namespace) -> None:
    """The files' alarms (``PredictedLabel``) counted per alert (``garlic.metrics.alerts``), printed as
    score-utility prints: a line of names, a line of values."""
    from garlic.metrics.alerts import alert_parts, alert_scores
    from garlic.metrics.utility import read_folders

    files = read_folders(args.labels, args.predictions)
    scores = alert_scores(alert_parts(files.labels, files.predictions, files.lengths))
    names = (
        "Sensitivity",
        "PPV",
        "Lead hours (median)",
        "Lead hours (Q1)",
        "Lead hours (Q3)",
        "Alerts per 100 patient-days",
        "Share of stays alerted",
        "Utility",
    )
    values = [*scores.values(), files.scores().utility]
    print("|".join(names) + "\n" + "|".join(f"{value:.6g}" for value in values))


def _dashboard(args: argparse.Namespace) -> None:
    command = [
        sys.executable,
        "-m",
        "garlic.app.serve",
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--mlruns",
        str(_store(args)),
        "--data-root",
        str(args.data_root),
    ]
    if args.run:
        command += ["--run", args.run]
    if args.ward:
        command += ["--ward", args.ward]
    if args.profile:
        command += ["--profile", str(args.profile)]
    server: subprocess.Popen | None = None
    pending: list[int] = []

    def forward(number, frame) -> None:
        # Stopping `garlic dashboard` stops the server: without this the server outlived it, holding the port.
        if server is None:
            pending.append(number)
        else:
            server.send_signal(number)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, forward)
    # A SIGKILL cannot be forwarded: the server then learns of it from the kernel (``die_with_parent``).
    server = subprocess.Popen(command, env=os.environ | {PARENT_ENV: str(os.getpid())})
    for number in pending:  # a signal that came while the server was being started
        server.send_signal(number)
    status = server.wait()
    raise SystemExit(128 - status if status < 0 else status)  # killed by signal N: 128 + N, as a shell reports it


def _policy(args: argparse.Namespace, store: Path):
    """The run's alert policy (``garlic.evaluation.alerting.policy_for``): its own, or ``--profile``'s, with the
    settings given on the command line in their place."""
    from garlic.evaluation.alerting import policy_for

    return policy_for(
        args.run,
        store,
        args.profile,
        threshold=args.threshold,
        band=args.band,
        quiet_hours=args.quiet_hours,
        margin=args.margin,
    )


def _live_store(args: argparse.Namespace) -> str:
    """``--store``, else a SQLite file for the run under ``live/`` (made here)."""
    if args.store:
        return args.store
    folder = Path("live")
    folder.mkdir(exist_ok=True)
    return f"sqlite:///{folder / args.run}.sqlite"


def _monitor(args: argparse.Namespace) -> None:
    from garlic.live.access import MONITOR_TOKEN, required_token

    token = required_token(args.host, MONITOR_TOKEN)  # refused before anything is loaded
    if args.scorers < 1:
        raise ConfigError("--scorers must be at least 1")
    if args.scorers > 1 and not (args.store or "").startswith("postgresql"):
        raise ConfigError(
            f"--scorers {args.scorers} needs a PostgreSQL store (--store postgresql+psycopg://...): "
            "SQLite has one writer, so one scorer"
        )
    store = _existing_store(args)
    try:
        import fhir.resources  # noqa: F401  (the optional extra `live`)
    except ImportError:
        raise ConfigError(
            "garlic monitor validates FHIR R4 with fhir.resources, which is not installed: run "
            "bin/setup live (or pip install -e '.[live]')"
        ) from None
    _say(f"loading run {args.run}'s model; loading torch and the model code ...")
    from garlic.live.codes import Codes
    from garlic.live.monitor import Monitor
    from garlic.live.scoring import BedScorer
    from garlic.live.service import serve
    from garlic.live.store import LiveStore
    from garlic.live.values import Ranges
    from garlic.methods.saved import load_predictor

    ranges = Ranges(args.ranges)  # a site's table that cannot be read is refused before the model loads
    trained = load_predictor(args.run, store)
    codes = Codes(trained.config.dataset, trained.variables + trained.static_features, args.codes, ranges)
    found = _policy(args, store)
    hourly = found.hourly
    live = LiveStore(_live_store(args), args.run)
    scorer = BedScorer(trained, hourly, step_memory=args.step_memory << 20)
    shard = (args.score_only or 0, args.scorers) if args.scorers > 1 else None
    monitor = Monitor(live, scorer, found.policy, shard=shard)
    if args.score_only is not None:  # one of --scorers' processes: the scoring loop only, until the service stops
        _say(
            f"scorer {args.score_only + 1} of {args.scorers} scoring store "
            f"{live.engine.url.render_as_string(hide_password=True)}"
        )
        print("ready", flush=True)  # the service serves once every scorer is ready (its only line on stdout)
        monitor.run()
        return
    if scorer.unexplained:
        _say(f"{trained.name} shows no drivers: {scorer.unexplained}")
    if scorer.steps is not None:
        steps = scorer.steps
        _say(
            f"step states for up to {steps.capacity:,} beds ({steps.bed_bytes / 1024:.1f} kB each, at most "
            f"{steps.capacity * steps.bed_bytes / 2**20:.0f} MB; --step-memory); a bed beyond is rebuilt from its "
            "readings"
        )
    _say(
        f"{'hourly' if hourly else 'per-stay'} model {trained.name}; {found.policy.describe()} ({found.chosen_by}); "
        f"store {live.engine.url.render_as_string(hide_password=True)}, {monitor.pending} readings left to score"
    )
    watcher = None
    if args.watch is not None:
        from garlic.live.watch import FolderWatcher

        watcher = FolderWatcher(args.watch, monitor, codes.names, hourly)
        _say(f"taking the record files in {_shown(args.watch)} as they grow")
    scorers = [
        subprocess.Popen(
            [sys.executable, "-m", "garlic.cli", *args.argv, "--score-only", str(number)],
            env=os.environ | {PARENT_ENV: str(os.getpid())},
            stdout=subprocess.PIPE,
        )
        for number in range(1, args.scorers)
    ]
    for number, process in enumerate(scorers, 2):  # served once all score: else their beds wait for a takeover
        if process.stdout.readline().strip() != b"ready":
            for other in scorers:
                other.terminate()
            raise ConfigError(f"scorer {number} of {args.scorers} stopped before it was ready (its error is above)")
    if scorers:
        _say(f"{args.scorers} scorers: this process and {len(scorers)} more, each bed scored by one at a time")
    _say(f"serving http://{args.host}:{args.port}/ (FHIR R4 at /fhir, the ward at /ward); Ctrl-C stops it")
    try:
        serve(monitor, codes, args.host, args.port, token, watcher)
    finally:
        for process in scorers:
            process.terminate()
        for process in scorers:
            process.wait(30)


def _feed(args: argparse.Namespace) -> None:
    from garlic.live.codes import Codes
    from garlic.live.access import MONITOR_TOKEN
    from garlic.live.feed import Client, feed, recorded_stays

    store = _existing_store(args)
    client = Client(args.url, os.environ.get(MONITOR_TOKEN) or None, say=_say)
    dataset, observations, static = recorded_stays(args.run, store, args.data_root, args.beds)
    names = sorted(set(observations["variable"].astype(str))) + [c for c in static.columns if c != "stay_id"]
    _say(f"feeding {len(static)} test stays of run {args.run} to {args.url} at {args.speed:g} times real time ...")
    fed = feed(client, observations, static, Codes(dataset, names, args.codes), args.speed, say=_say)
    print(f"beds {fed.beds}, readings sent {fed.sent}, stored {fed.stored}, repeats {fed.repeats}")


def add_policy_arguments(command: argparse.ArgumentParser) -> None:
    """The alert policy's settings (``garlic.metrics.alert_policy``), each replacing the run's or the profile's."""
    command.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="a site profile of this run (garlic calibrate): its alert policy, instead of the run's",
    )
    command.add_argument(
        "--threshold",
        type=float,
        help="alert at risk >= this (default: the run's policy, chosen on its validation stays)",
    )
    command.add_argument("--band", type=float, help="an alert clears below threshold x (1 - band) (default: the run's)")
    command.add_argument(
        "--quiet-hours",
        type=float,
        metavar="H",
        help="a cleared alert stays quiet for H hours ... (default: the run's)",
    )
    command.add_argument(
        "--margin", type=float, help="... unless the risk reaches threshold x (1 + margin) (default: the run's)"
    )


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="garlic", description=DESCRIPTION)
    main.add_argument(
        "--data-root",
        type=Path,
        default=DEFAULT_DATA_ROOT,
        help="where processed datasets live (default: $GARLIC_DATA_ROOT, else data)",
    )
    main.add_argument("--mlruns", type=Path, help="the local MLflow store (default: $GARLIC_MLRUNS, else mlruns)")
    main.add_argument("-v", "--verbose", action="store_true", help="log each step")
    commands = main.add_subparsers(dest="command", required=True)

    fetch = commands.add_parser("download", help="fetch an open-access release from PhysioNet, verified")
    fetch.add_argument("dataset", choices=["physionet2012", "physionet2019", "mimic3"])
    fetch.add_argument("--to", type=Path, required=True, help="the folder the release lands in")
    fetch.add_argument("--base-url", help="a mirror of the release folder (default: physionet.org)")
    fetch.add_argument("--only", nargs="+", metavar="FILE", help="physionet2012: just these files of the release")
    fetch.set_defaults(handler=_download)

    prep = commands.add_parser("preprocess", help="raw records -> processed tables")
    prep.add_argument("dataset", choices=SOURCES, help="the source; one with cohorts writes DATASET-COHORT")
    prep.add_argument("--source", type=Path, help="the raw release folder")
    cohorts = "; ".join(
        f"{s.name}: {'|'.join(s.cohorts)}, default {s.cohorts[0]}" for s in SOURCES.values() if s.cohorts
    )
    prep.add_argument("--cohort", help=f"named cohort, its own dataset and folder ({cohorts})")
    prep.add_argument("--strict", action="store_true", help="stop at the first bad line instead of skipping it")
    prep.add_argument("--stays", type=int, help="synthetic: number of stays (default 2000)")
    prep.add_argument(
        "--seed",
        type=int,
        help="synthetic: generator seed; uea: seed of the values dropped and the validation draw (default 0)",
    )
    prep.add_argument(
        "--drop-share",
        type=float,
        help="uea: share of each series' values removed at random (default 0.6, as Raindrop's PAM)",
    )
    prep.add_argument(
        "--drop-sensors", type=int, help="uea: variables of each series removed whole, at random (default 0)"
    )
    prep.add_argument("--name", help="meds: the dataset's name NAME, written as meds-NAME (default: meds)")
    prep.add_argument("--labels", type=Path, help="meds: the label file, or a folder of them (docs/own-data.md)")
    prep.add_argument(
        "--window-hours", type=float, help="meds: the input's span before the first prediction time (default 48)"
    )
    prep.add_argument(
        "--variables",
        metavar="FILE|N",
        help="meds: a file of codes, one a line, or N: the N most "
        "frequent numeric codes of the training subjects (default 40)",
    )
    prep.add_argument(
        "--static",
        type=Path,
        metavar="FILE",
        help="meds: a file of static codes, one a line (default: every numeric code with no time)",
    )
    prep.set_defaults(handler=_preprocess)

    export = commands.add_parser("export", help="a processed dataset -> another format (MEDS)")
    export.add_argument("format", choices=["meds"])
    export.add_argument("--dataset", type=dataset_name, required=True, metavar="NAME", help=dataset_names())
    export.add_argument(
        "--to",
        type=Path,
        required=True,
        help="the MEDS folder to write: a new or empty one, or an earlier export (replaced whole)",
    )
    export.add_argument("--protocol", default="five-split", help="whose split becomes the subject splits")
    export.add_argument("--split", type=int, default=0, help="which split of --protocol (default 0)")
    export.set_defaults(handler=_export)

    train = commands.add_parser("train", help="train GARLIC on fixed splits, tracked in MLflow")
    train.add_argument(
        "--dataset",
        type=dataset_name,
        metavar="NAME",
        help=f"{dataset_names()} (default: the --config file's, else synthetic)",
    )
    which = train.add_mutually_exclusive_group()
    which.add_argument("--split", type=int, help="train on split K (default 0)")
    which.add_argument(
        "--all-splits", action="store_true", help="train on every split (and model seed) of the protocol"
    )
    train.add_argument(
        "--protocol", metavar="NAME", help="five-split, raindrop or garlic-reference; alone, it runs the whole protocol"
    )
    train.add_argument(
        "--config",
        type=Path,
        help="a JSON config, or a shipped preset's name (physionet2012-fast; default: garlic/configs/DATASET.json)",
    )
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, or one of the method's own settings (grud's hidden_dim)",
    )
    train.add_argument("--device", choices=["auto", "cpu", "cuda"])
    train.add_argument(
        "--method",
        default="garlic",
        metavar="NAME",
        help="a method of the registry, garlic.methods.registry (gbm_static, grud, ...; default garlic)",
    )
    train.add_argument(
        "--resume", metavar="RUN_ID", help="continue this killed run from its last epoch's training state"
    )
    train.add_argument(
        "--carry",
        type=Path,
        metavar="DIR",
        help="also keep each unfinished unit's training state in this folder, beyond the store, and go "
        "on from it where the store has no run of the unit (garlic.tracking.carry)",
    )
    train.set_defaults(handler=_train)

    evaluate = commands.add_parser("evaluate", help="re-evaluate a finished run on its test split")
    evaluate.add_argument("--run", required=True, help="MLflow run id")
    evaluate.set_defaults(handler=_evaluate)

    predict = commands.add_parser(
        "predict",
        help="risk per stay for record files, as CSV (stay_id, risk, left_out); exit status 3 when a "
        "record had to be left out (a row with an empty risk and the reason names it)",
    )
    predict.add_argument("--run", required=True, help="MLflow run id")
    predict.add_argument(
        "--input",
        nargs="+",
        required=True,
        type=Path,
        help="PhysioNet 2012 .txt / 2019 .psv, or with --labels a MEDS folder",
    )
    predict.add_argument(
        "--output",
        type=Path,
        help="CSV file (default: standard output); with --hourly, a folder; with --labels, a Parquet file",
    )
    predict.add_argument(
        "--hourly",
        action="store_true",
        help="a risk and an alarm at every hour of each .psv record, written as the Sepsis "
        "Challenge's prediction files (pNNNNNN.psv) in --output, with the top drivers of every "
        "alarmed hour in alarm-drivers.csv where the model explains; needs an hourly run",
    )
    add_policy_arguments(predict)  # --hourly: the alarms are the alert policy's; --labels: --threshold alone
    predict.add_argument(
        "--labels",
        type=Path,
        help="MEDS: --input is a MEDS folder, this its label file(s); writes "
        "the MEDS prediction schema (Parquet) to --output (docs/own-data.md)",
    )
    predict.add_argument(
        "--window-hours",
        type=float,
        help="with --labels: the input window (default: the run's dataset's, under --data-root)",
    )
    predict.add_argument(
        "--split",
        choices=["train", "tuning", "held_out"],
        help="with --labels: only the label rows of this split's subjects (the MEDS folder's subject_splits)",
    )
    predict.set_defaults(handler=_predict)

    score = commands.add_parser(
        "score-utility",
        help="the PhysioNet 2019 Challenge's scores of hourly predictions (AUROC, AUPRC, accuracy, "
        "F-measure, normalised utility), printed as its evaluation prints them",
    )
    score.add_argument("--labels", required=True, type=Path, help="folder of label files pNNNNNN.psv (SepsisLabel)")
    score.add_argument(
        "--predictions",
        required=True,
        type=Path,
        help="folder of prediction files of the same names (PredictedProbability|PredictedLabel)",
    )
    score.set_defaults(handler=_score_utility)

    calibrate = commands.add_parser(
        "calibrate",
        help="set a run's alert threshold on a new hospital's own record files, for a burden or on its "
        "labels, and write a site profile that monitor, predict --hourly and the dashboard read (docs/alerts.md)",
    )
    calibrate.add_argument("--run", required=True, help="MLflow run id")
    calibrate.add_argument(
        "--site",
        required=True,
        type=Path,
        metavar="FOLDER",
        help="the site's record files (P19 .psv for an hourly run, P12 .txt or .psv otherwise)",
    )
    calibrate.add_argument(
        "--alerts-per-day",
        type=float,
        metavar="X",
        help="the lowest threshold raising at most X alerts per patient-day on the site's stays "
        "(0.3: 30 per 100 patient-days; no labels needed)",
    )
    calibrate.add_argument(
        "--sensitivity",
        type=float,
        metavar="S",
        help="the highest threshold whose alerts find S of the septic stays (SepsisLabel)",
    )
    calibrate.add_argument(
        "--labelled", action="store_true", help="the threshold of highest Challenge utility on the files' SepsisLabel"
    )
    calibrate.add_argument("--band", type=float, help="the policy's band (default: the run's)")
    calibrate.add_argument(
        "--quiet-hours", type=float, metavar="H", help="the policy's quiet hours (default: the run's)"
    )
    calibrate.add_argument("--margin", type=float, help="the policy's margin (default: the run's)")
    calibrate.add_argument(
        "--profile", required=True, type=Path, metavar="FILE", help="the site profile to write (JSON)"
    )
    calibrate.set_defaults(handler=_calibrate)

    alerts = commands.add_parser(
        "score-alerts",
        help="hourly predictions' alarms counted per alert: sensitivity, PPV, lead time, alerts per "
        "100 patient-days, share of stays alerted (docs/alerts.md), and the Challenge's utility",
    )
    alerts.add_argument("--labels", required=True, type=Path, help="folder of label files pNNNNNN.psv (SepsisLabel)")
    alerts.add_argument(
        "--predictions",
        required=True,
        type=Path,
        help="folder of prediction files of the same names (PredictedProbability|PredictedLabel)",
    )
    alerts.set_defaults(handler=_score_alerts)

    dashboard = commands.add_parser("dashboard", help="the bedside dashboard (Streamlit)")
    dashboard.add_argument("--run", help="MLflow run id (default: the newest run with a model)")
    dashboard.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only); any other address "
        "needs a login token in GARLIC_DASHBOARD_TOKEN (docs/dashboard.md)",
    )
    dashboard.add_argument("--port", type=port_number, default=8501)
    dashboard.add_argument(
        "--ward",
        metavar="URL",
        help="the live ward's store (garlic monitor --store, e.g. "
        "sqlite:///live/RUN_ID.sqlite): adds the ward view, every bed live",
    )
    dashboard.add_argument(
        "--profile", type=Path, metavar="FILE", help="a site profile of the run (garlic calibrate): alert by its policy"
    )
    dashboard.set_defaults(handler=_dashboard)

    monitor = commands.add_parser(
        "monitor", help="the live ward: a FHIR R4 service scoring every bed as its readings arrive (docs/live.md)"
    )
    monitor.add_argument("--run", required=True, help="MLflow run id whose model scores the ward")
    monitor.add_argument(
        "--store", help="SQLAlchemy URL of the ward's database (default: sqlite:///live/RUN_ID.sqlite)"
    )
    monitor.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only); any other address "
        "needs a token in GARLIC_MONITOR_TOKEN (docs/live.md)",
    )
    monitor.add_argument("--port", type=port_number, default=8600)
    add_policy_arguments(monitor)
    monitor.add_argument(
        "--watch",
        type=Path,
        metavar="FOLDER",
        help="also take the readings of the record files (P12 .txt, P19 .psv) in FOLDER as they grow, one bed per file",
    )
    monitor.add_argument(
        "--codes",
        type=Path,
        metavar="FILE",
        help="the hospital's own code table (CSV: variable, system, code, unit), read instead of "
        "garlic/live/codes.csv (docs/live.md)",
    )
    monitor.add_argument(
        "--ranges",
        type=Path,
        metavar="FILE",
        help="the site's own plausible ranges (CSV: variable, low, high, and optionally unit, "
        "source), each row instead of garlic/live/ranges.csv's for its variable",
    )
    monitor.add_argument(
        "--scorers",
        type=int,
        default=1,
        metavar="K",
        help="scoring processes over one PostgreSQL store (default 1; SQLite: 1), each bed scored "
        "by one of them at a time, in order (docs/live.md, Under load)",
    )
    monitor.add_argument(
        "--step-memory",
        type=int,
        default=1024,
        metavar="MB",
        help="memory for the beds' step states (default 1024 MB); beds beyond are rebuilt from "
        "their readings when scored",
    )
    monitor.add_argument("--score-only", type=int, help=argparse.SUPPRESS)  # one of --scorers' processes
    monitor.set_defaults(handler=_monitor)

    feeder = commands.add_parser(
        "feed", help="stream a run's recorded test stays into `garlic monitor` as FHIR Observations"
    )
    feeder.add_argument("--run", required=True, help="MLflow run id whose test stays are fed")
    feeder.add_argument("--beds", type=int, default=50, help="how many test stays, one bed each (default 50)")
    feeder.add_argument("--speed", type=float, default=3600, help="times real time (default 3600: an hour a second)")
    feeder.add_argument("--url", default="http://127.0.0.1:8600", help="the service (default http://127.0.0.1:8600)")
    feeder.add_argument(
        "--codes",
        type=Path,
        metavar="FILE",
        help="send the codes of this table, as the monitor's --codes reads them (default: garlic/live/codes.csv)",
    )
    feeder.set_defaults(handler=_feed)
    return main


# Set by a program that runs ``garlic`` as its worker (``experiments.compare --workers``): the worker ends with it.
def main(argv: list[str] | None = None) -> None:
    die_with_parent()
    args = parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a command's own worker processes are given
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        _folder(Path(args.data_root), "--data-root", "GARLIC_DATA_ROOT", args.data_root is not DEFAULT_DATA_ROOT)
        args.handler(args)
    except KeyboardInterrupt as interrupt:  # Ctrl-C: what it stopped, not where in the code
        _say(_interrupted(args, interrupt))
        raise SystemExit(128 + signal.SIGINT) from None
    except Exception as exc:
        damaged = database_error(exc)
        if damaged is not None:
            print(
                f"garlic: error: the MLflow store {_store(args)} cannot be used: {damaged} (a damaged, read-only "
                "or full database: restore it from a copy, free space or fix its permissions, or give another "
                "--mlruns)",
                file=sys.stderr,
            )
            raise SystemExit(2) from None
        if isinstance(exc, OSError) and exc.errno in UNWRITABLE:
            print(
                f"garlic: error: cannot write {exc.filename or 'a file'}: {exc.strerror} (free space or make it "
                "writable; a training stopped this way continues with garlic train --resume RUN_ID)",
                file=sys.stderr,
            )
            raise SystemExit(2) from None
        if not _user_error(exc):
            raise
        print(f"garlic: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _user_error(exc: Exception) -> bool:
    """Whether ``exc`` is bad input (reported in one line) rather than a bug (reported with its traceback)."""
    loaded = [getattr(sys.modules[module], name) for module, name in USER_ERRORS if module in sys.modules]
    return isinstance(exc, (ConfigError, FileNotFoundError, ValueError, *loaded))


if __name__ == "__main__":
    main()
