"""The ``garlic`` command: download, preprocess, train, evaluate, predict, dashboard."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

from garlic.config import Config, ConfigError
from garlic.datasets import DATASETS, DEFAULT_DATA_ROOT, SOURCES
from garlic.tracking import DEFAULT_STORE, RunNotFoundError
from preprocessing.download import DownloadError
from preprocessing.tables import DatasetNotFoundError

log = logging.getLogger("garlic")
DASHBOARD_SERVER = Path(__file__).resolve().parents[1] / "app" / "serve.py"


def _download(args: argparse.Namespace) -> None:
    from preprocessing.download import download

    for outcome in download(args.dataset, args.to, args.base_url, args.only):
        print(f"{outcome.name}: {outcome.status}, SHA-256 {outcome.sha256}")
    if args.dataset == "physionet2019":
        print("checked against the release's SHA256SUMS.txt as served (no checksum is pinned for this release)")
    print(f"next: garlic preprocess {args.dataset} --source {args.to}")


def _preprocess(args: argparse.Namespace) -> None:
    from garlic.datasets import preprocess

    dataset, folder, manifest = preprocess(args.dataset, args.data_root, cohort=args.cohort, source=args.source,
                                           strict=args.strict, stays=args.stays, seed=args.seed)  # fmt: skip
    print(f"{dataset}: wrote {folder} ({json.dumps(manifest.get('counts', {}))})")
    print(f"next: garlic train --dataset {dataset}")


def _config(args: argparse.Namespace) -> Config:
    config = Config.load(args.config) if args.config else Config.for_dataset(args.dataset)
    overrides = [f"dataset={args.dataset}", *args.set]
    if args.protocol:
        overrides.append(f"split_protocol={args.protocol}")
    if args.device:
        overrides.append(f"device={args.device}")
    return config.override(overrides)


def _units(args: argparse.Namespace, config: Config) -> tuple[list[int], list[int] | None]:
    """The split indices and model seeds to train: the whole protocol, or split K (default 0) with one seed."""
    from garlic.splits import protocol

    chosen = protocol(config.split_protocol)
    if args.all_splits or (args.protocol and args.split is None):
        return list(chosen.splits), None if chosen.seeds is None else list(chosen.seeds)
    return [0 if args.split is None else args.split], None


def _stop_on_sigterm(number, frame) -> None:
    # An exception, unlike the default handler, lets MLflow mark the run as failed; `--resume` takes it up.
    raise SystemExit(128 + number)


def _train(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from garlic import distributed, runs

    if args.resume and (args.set or args.config or args.all_splits or args.split is not None or args.protocol):
        raise ConfigError(
            "--resume continues a run with its own config and splits; drop --set/--config/--split/--protocol"
        )
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    config = None if args.resume else _config(args)
    bars: dict[str, tqdm] = {}

    def progress(split: str, record) -> None:
        if split not in bars:
            total = config.max_epochs if config else None  # resumed: the run's config is read later
            bars[split] = tqdm(total=total, initial=record.epoch - 1, desc=split, unit="epoch", file=sys.stderr)
        bar = bars[split]
        bar.update(1)
        bar.set_postfix(stage=record.stage[:3], val_auroc=f"{record.val_auroc:.3f}",
                        val_auprc=f"{record.val_auprc:.3f}", s=f"{record.seconds:.1f}")  # fmt: skip

    with distributed.process_group(config.device if config else args.device or "auto"):
        if args.resume:
            run_id, results = runs.resume(args.resume, args.data_root, args.mlruns, progress, args.device)
        else:
            indices, seeds = _units(args, config)
            run_id, results = runs.train(config, indices, args.data_root, args.mlruns, progress, seeds=seeds)
    if run_id is None:  # a helper rank under torchrun: rank 0 reports
        return
    for bar in bars.values():
        bar.close()
    for result in results:
        scores = ", ".join(f"{k} {v:.4f}" for k, v in result.test.items())
        print(f"{result.split} (run {result.run_id}, best epoch {result.best_epoch}): test {scores}")
    print(f"run {run_id}; browse with: mlflow ui --backend-store-uri sqlite:///{Path(args.mlruns).resolve()}/mlflow.db")


def _evaluate(args: argparse.Namespace) -> None:
    from garlic.runs import evaluate_run

    print(json.dumps(evaluate_run(args.run, args.mlruns), indent=2))


def _predict(args: argparse.Namespace) -> None:
    from garlic.inference import predict_tables
    from garlic.tracking import load_run_model
    from preprocessing.records import read_record_files

    trained = load_run_model(args.run, args.mlruns)
    observations, static = read_record_files(args.input)
    risks = predict_tables(trained, observations, static)
    if args.output:
        risks.to_csv(args.output, index=False)
    else:
        risks.to_csv(sys.stdout, index=False)


def _dashboard(args: argparse.Namespace) -> None:
    command = [sys.executable, str(DASHBOARD_SERVER), "--host", args.host, "--port", str(args.port),
               "--mlruns", str(args.mlruns), "--data-root", str(args.data_root)]  # fmt: skip
    if args.run:
        command += ["--run", args.run]
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
    server = subprocess.Popen(command)
    for number in pending:  # a signal that came while the server was being started
        server.send_signal(number)
    status = server.wait()
    raise SystemExit(128 - status if status < 0 else status)  # killed by signal N: 128 + N, as a shell reports it


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="garlic", description=__doc__)
    main.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT, help="where processed datasets live")
    main.add_argument("--mlruns", type=Path, default=DEFAULT_STORE, help="the local MLflow store")
    main.add_argument("-v", "--verbose", action="store_true")
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
    cohorts = "; ".join(f"{s.name}: {'|'.join(s.cohorts)}, default {s.cohorts[0]}" for s in SOURCES.values() if s.cohorts)
    prep.add_argument("--cohort", help=f"named cohort, its own dataset and folder ({cohorts})")
    prep.add_argument("--strict", action="store_true", help="stop at the first bad line instead of skipping it")
    prep.add_argument("--stays", type=int, help="synthetic: number of stays (default 2000)")
    prep.add_argument("--seed", type=int, help="synthetic: generator seed (default 0)")
    prep.set_defaults(handler=_preprocess)

    train = commands.add_parser("train", help="train GARLIC on fixed splits, tracked in MLflow")
    train.add_argument("--dataset", choices=DATASETS, default="synthetic")
    which = train.add_mutually_exclusive_group()
    which.add_argument("--split", type=int, help="train on split K (default 0)")
    which.add_argument("--all-splits", action="store_true",
                       help="train on every split (and model seed) of the protocol")  # fmt: skip
    train.add_argument("--protocol", metavar="NAME",
                       help="five-split, raindrop or garlic-reference; alone, it runs the whole protocol")  # fmt: skip
    train.add_argument("--config", type=Path, help="a JSON config (default: experiments/configs/DATASET.json)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    train.add_argument("--device", choices=["auto", "cpu", "cuda"])
    train.add_argument("--resume", metavar="RUN_ID", help="continue this killed run from its last epoch checkpoint")
    train.set_defaults(handler=_train)

    evaluate = commands.add_parser("evaluate", help="re-evaluate a finished run on its test split")
    evaluate.add_argument("--run", required=True, help="MLflow run id")
    evaluate.set_defaults(handler=_evaluate)

    predict = commands.add_parser("predict", help="risk per stay for record files, as CSV")
    predict.add_argument("--run", required=True, help="MLflow run id")
    predict.add_argument("--input", nargs="+", required=True, type=Path, help="PhysioNet 2012 .txt / 2019 .psv")
    predict.add_argument("--output", type=Path, help="CSV file (default: standard output)")
    predict.set_defaults(handler=_predict)

    dashboard = commands.add_parser("dashboard", help="the bedside dashboard (Streamlit)")
    dashboard.add_argument("--run", help="MLflow run id (default: the newest run with a model)")
    dashboard.add_argument("--host", default="127.0.0.1",
                           help="address to listen on (default 127.0.0.1, this machine only); any other address "
                                "needs a login token in GARLIC_DASHBOARD_TOKEN (docs/dashboard.md)")  # fmt: skip
    dashboard.add_argument("--port", type=int, default=8501)
    dashboard.set_defaults(handler=_dashboard)
    return main


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        args.handler(args)
    except (ConfigError, DatasetNotFoundError, DownloadError, RunNotFoundError, FileNotFoundError, ValueError) as exc:
        print(f"garlic: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
