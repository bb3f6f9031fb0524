"""How fast the hourly task is learned and scored: a method fitted on one hospital, then every hour of A+B scored.

    python -m experiments.benchmark_hourly --method hourly_gbm             # gradient boosting
    python -m experiments.benchmark_hourly --preset physionet2019-cpu      # GARLIC trained on every hour
    python -m experiments.benchmark_hourly --run RUN_ID --mlruns STORE     # a trained run's model: scoring only

On ``physionet2019-hourly``: the method is fitted on ``cross-hospital`` split ``--split`` (0: trained and selected
on hospital system A), then asked for a risk at every prediction time of every stay of both systems (about 1.55
million), as one dataset. It ends with one line:
``METHOD: fit on N stays F s; scored H hours of S stays in T s (R hours/s), T threads, CPU``.
With ``--run``, the model a run saved (``garlic.methods.saved.load_predictor``, normalised with its own training
statistics) is asked the same hours, and the line says ``loaded`` where the fit was.
Nothing is logged to MLflow and no test is read: this is speed only (the table's runs are
``experiments.early_warning``'s). Run it alone on the machine: another job beside it is timed too.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from garlic import studies
from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.data.datasets import DEFAULT_DATA_ROOT, processed_folder
from garlic.evaluation.fit_and_test import split_parts
from garlic.io.tables import LABELS
from garlic.methods import registry
from garlic.tracking.local_store import DEFAULT_STORE
from garlic.training.speed import cpu_name

DATASET = "physionet2019-hourly"


def measure(method_name: str, config: Config, split_index: int, data_root, threads: int) -> dict:
    """Seconds to fit ``method_name`` on the split's training part (selecting on its validation part), and to
    score every prediction time of the whole dataset."""
    cohort = studies.load_cohort(DATASET, data_root, "cross-hospital", [split_index])
    split = cohort.splits[0]
    labels = pd.read_parquet(processed_folder(DATASET, data_root) / LABELS)
    method = registry.method(method_name).create(registry.MethodContext(config, labels))
    parts = split_parts(cohort.tensors, split)
    with threadpool_limits(threads):
        started = time.perf_counter()
        method.fit(parts["train"], parts["validation"])
        fitted = time.perf_counter()
        risk = method.predict_proba(IrregularDataset(cohort.tensors, split.normalisation))
        scored = time.perf_counter()
    if len(risk) != len(cohort.tensors.prediction_times()) or not np.isfinite(risk).all():
        raise RuntimeError(f"{method_name} gave {len(risk)} risks for {len(cohort.tensors.prediction_times())} hours")
    return {
        "training_stays": len(parts["train"]),
        "fit_seconds": fitted - started,
        "hours": len(risk),
        "stays": len(cohort.tensors),
        "score_seconds": scored - fitted,
    }


def measure_run(run_id: str, store, data_root, threads: int) -> dict:
    """Seconds to score every prediction time of the whole dataset with the model run ``run_id`` saved."""
    from garlic.data.datasets import ensure_processed
    from garlic.io.tensors import load_tensors
    from garlic.methods.saved import load_predictor

    trained = load_predictor(run_id, store)
    tensors = load_tensors(ensure_processed(DATASET, data_root))
    with threadpool_limits(threads):
        started = time.perf_counter()
        risk = trained.predict_proba(trained.dataset(tensors))
        scored = time.perf_counter()
    if len(risk) != len(tensors.prediction_times()) or not np.isfinite(risk).all():
        raise RuntimeError(f"run {run_id} gave {len(risk)} risks for {len(tensors.prediction_times())} hours")
    return {"name": trained.name, "hours": len(risk), "stays": len(tensors), "score_seconds": scored - started}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    chosen = parser.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--method", help="a registry method that answers prediction times (hourly_gbm, ...)")
    chosen.add_argument("--preset", help="GARLIC with this preset (garlic/configs/), trained on every hour")
    chosen.add_argument("--run", help="a trained run of the hourly task: its saved model scores, nothing is fitted")
    parser.add_argument("--mlruns", default=DEFAULT_STORE, help="the store of --run")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the preset changed (repeatable)",
    )
    parser.add_argument("--split", type=int, default=0, help="cross-hospital split: 0 fits on A, 1 on B")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-root", default=DEFAULT_DATA_ROOT)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.run:
        try:
            result = measure_run(args.run, args.mlruns, args.data_root, args.threads)
        except (LookupError, ValueError) as exc:  # no such run, a run without a saved model, an unreadable one
            parser.error(str(exc))
        print(
            f"{result['name']} (run {args.run}): loaded; scored {result['hours']} hours of {result['stays']} stays "
            f"in {result['score_seconds']:.1f} s ({result['hours'] / result['score_seconds']:.0f} hours/s), "
            f"{args.threads} threads, {cpu_name()}"
        )
        return
    if args.preset:
        name, config = f"garlic ({args.preset})", studies.preset_config(args.preset, DATASET, args.overrides)
        method = "garlic"
    else:
        name, config, method = args.method, Config.for_dataset(DATASET), args.method
    result = measure(method, config, args.split, args.data_root, args.threads)
    print(
        f"{name}: fit on {result['training_stays']} stays {result['fit_seconds']:.1f} s; scored {result['hours']} "
        f"hours of {result['stays']} stays in {result['score_seconds']:.1f} s "
        f"({result['hours'] / result['score_seconds']:.0f} hours/s), {args.threads} threads, {cpu_name()}"
    )


if __name__ == "__main__":
    main()
