"""Are the drivers the bedside shows for an alert the ones the model needs? Feature removal at alerted hours, for
trained hourly runs of any method that explains (``garlic.explain.faithfulness``).

    python -m experiments.alert_faithfulness --mlruns STORE --runs RUN_ID [RUN_ID ...] [--max-alerts 1000]

For each run: its saved model, the stays of its split's ``--part`` (default test) read from the run's dataset under
``--data-root`` (refused when the split or dataset is not the one the run was trained on), and its alarm threshold
(the one of highest utility on validation that an hourly run logged, or ``--threshold``). At every alerted
prediction time (risk >= threshold; at most ``--max-alerts`` of them, drawn at random, seeded) the top, a random
and the bottom half of the variables observed by then, ranked by the model's own explanation at that hour (exact
tree SHAP values for gradient boosting, coefficient x standardised value for logistic regression, the built-in
signal importance for GARLIC), are removed from the record, and the model asked again at that hour. The table: per
run, the alerts measured, their mean risk, and the mean drop in risk under each removal. Faithful drivers give
top > random > bottom, as the per-stay fidelity study (``experiments.fidelity``) asks of whole stays.

``--max-stays N`` measures N of the part's stays drawn at random (seeded), read from the dataset's tables alone
(not its whole tensor cache, gigabytes for P19): a small measurement on a machine already busy.

``--out FILE`` writes the table as Markdown, with this command at its top.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from garlic.data.datasets import DEFAULT_DATA_ROOT, processed_folder
from garlic.data.splits import read_split
from garlic.explain.faithfulness import alert_faithfulness
from garlic.io.atomic import atomic_file
from garlic.io.tables import LABELS, OBSERVATIONS, STATIC, TASKS, ProcessedDataset, read_manifest
from garlic.io.tensors import IrregularTensors, load_tensors, tensorize
from garlic.methods.saved import load_predictor
from garlic.tracking import run_contract
from garlic.tracking.store import get_run, use_store

log = logging.getLogger("experiments.alert_faithfulness")
COLUMNS = ["run", "method", "split", "threshold", "alerts", "risk", "drop_top", "drop_random", "drop_bottom"]


def stays_of(folder: Path, ids: np.ndarray) -> IrregularTensors:
    """The tensors of the stays ``ids`` of the processed dataset in ``folder``, read from its tables for them alone."""
    manifest = read_manifest(folder)
    only = [("stay_id", "in", [int(i) for i in ids])]

    def table(name: str) -> pd.DataFrame:
        return pq.read_table(folder / name, filters=only).to_pandas()

    return tensorize(ProcessedDataset(observations=table(OBSERVATIONS), static=table(STATIC), labels=table(LABELS),
                                      variables=manifest["variables"], manifest=manifest,
                                      tasks=table(TASKS) if (folder / TASKS).is_file() else None))  # fmt: skip


def recorded_split(run_id: str, params: dict[str, str], folder: Path):
    """The run's split under ``folder``, checked as ``run_contract.verify_split`` checks it; a study's unit, which
    records its data digest but no split digest, has its split read by name after the data digest is checked."""
    manifest = read_manifest(folder)
    if run_contract.SPLIT_DIGEST in params or run_contract.DATA_DIGEST not in params:
        return run_contract.verify_split(run_id, params, folder, manifest)
    if run_contract.manifest_digest(manifest) != params[run_contract.DATA_DIGEST]:
        raise run_contract.StaleRunDataError(f"the dataset under {folder} is not the one run {run_id} was trained on")
    split = read_split(folder, *run_contract.parse_split_name(params[run_contract.SPLIT]))
    if split is None:
        raise run_contract.StaleRunDataError(f"run {run_id}'s split {params[run_contract.SPLIT]} is not saved under "
                                             f"{folder}")  # fmt: skip
    log.info("run %s records no split digest (a study's unit): split %s read by name, the data digest checked",
             run_id, params[run_contract.SPLIT])
    return split


def run_faithfulness(run_id: str, store: Path, data_root: Path, part: str = "test", threshold: float | None = None,
                     fraction: float = 0.5, max_alerts: int | None = None, seed: int = 0,
                     max_stays: int | None = None) -> dict:  # fmt: skip
    """One row of the table for the run ``run_id`` (the module's docstring)."""
    use_store(store)
    trained = load_predictor(run_id, store)
    run = get_run(run_id)
    params = {**run.data.tags, **run.data.params}  # a study's unit records its dataset and split as tags
    if threshold is None:
        threshold = run.data.metrics.get("threshold")
        if threshold is None:
            raise ValueError(f"run {run_id} logged no alarm threshold (not an hourly run): give one with --threshold")
    folder = processed_folder(params[run_contract.DATASET], data_root)
    split = recorded_split(run_id, params, folder)
    ids = getattr(split, part)
    if max_stays is not None and len(ids) > max_stays:
        tensors = stays_of(folder, np.sort(np.random.default_rng(seed).choice(ids, max_stays, replace=False)))
    else:
        tensors = load_tensors(folder)
        tensors = tensors.subset(split.positions(tensors, part))
    dataset = trained.dataset(tensors)
    log.info("run %s (%s): %d %s stays, alarm at risk >= %.4g", run_id, trained.name, len(dataset), part, threshold)
    measured = alert_faithfulness(trained.method, dataset, threshold, fraction, seed, max_alerts)
    return {"run": run_id, "method": trained.name, "split": params.get("split", ""), "threshold": threshold,
            **measured.to_dict()}  # fmt: skip


def markdown(table: pd.DataFrame, command: str) -> str:
    shown = table.assign(alerts=table["alerts"].astype(int)).round(4)
    lines = [f"`{command}`", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(row[column]) for column in COLUMNS) + " |" for _, row in shown.iterrows()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mlruns", type=Path, required=True, help="the MLflow store of the runs")
    parser.add_argument("--runs", nargs="+", required=True, help="hourly run ids (a split run each)")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--part", choices=["train", "validation", "test"], default="test")
    parser.add_argument("--threshold", type=float, help="alarm at risk >= this (default: each run's own)")
    parser.add_argument("--fraction", type=float, default=0.5, help="share of the observed variables removed")
    parser.add_argument("--max-alerts", type=int, default=1000, help="alerted hours measured per run, at most")
    parser.add_argument("--max-stays", type=int, help="stays of the part measured, at most (drawn at random)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="a Markdown file for the table")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = [run_faithfulness(run_id, args.mlruns, args.data_root, args.part, args.threshold, args.fraction,
                             args.max_alerts, args.seed, args.max_stays) for run_id in args.runs]  # fmt: skip
    table = pd.DataFrame(rows, columns=COLUMNS)
    command = "python -m experiments.alert_faithfulness " + " ".join(sys.argv[1:] if argv is None else argv)
    text = markdown(table, command)
    print(text)
    if args.out is not None:
        with atomic_file(args.out, "w") as out:
            out.write(text)
    return table


if __name__ == "__main__":
    main()
