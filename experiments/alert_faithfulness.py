"""Are the drivers the bedside shows for an alert the ones the model needs? Feature removal at alerted hours, for
trained hourly runs of any method that explains (``garlic.evaluation.faithfulness``).

    python -m experiments.alert_faithfulness --mlruns STORE --runs RUN_ID [RUN_ID ...] [--max-alerts 1000]

For each run: its saved model, the stays of its split's ``--part`` (default test) read from the run's dataset under
``--data-root`` (refused when the split or dataset is not the one the run was trained on), and its alarm threshold
(the one of highest utility on validation that an hourly run logged, or ``--threshold``). At every alerted
prediction time (risk >= threshold; at most ``--max-alerts`` of them, drawn at random, seeded) the top, a random
and the bottom half of the variables observed by then, ranked by the model's own explanation at that hour (exact
tree SHAP values for gradient boosting, coefficient x standardised value for logistic regression, integrated
gradients for GARLIC), are removed from the record, and the model asked again at that hour. The table: per
run, the alerts measured, their mean risk, and the mean drop in risk under each removal. Faithful drivers give
top > random > bottom, as the per-stay fidelity study (``experiments.fidelity``) asks of whole stays.

``--max-stays N`` measures N of the part's stays drawn at random (seeded), read from the dataset's tables alone
(not its whole tensor cache, gigabytes for P19): a small measurement on a machine already busy.

Where no run saved its model (a study's units save none), ``--fit NAME [NAME ...]`` fits hourly models afresh on
a sample of one split, instead of ``--runs`` or beside them (one table, the fitted rows first): ``--train-stays`` and ``--validation-stays`` of its parts (read from the tables, as
``--max-stays`` of its test part), each setting chosen on validation and the alarm threshold of highest utility
there (the task must be scored by the Sepsis Challenge's utility), then measured alike. Smaller than the published
models' data: a check of the explanations, not of the models' accuracy.

    python -m experiments.alert_faithfulness --fit hourly_logreg_utility hourly_gbm_utility \
        --dataset physionet2019-hourly --split five-split/split_0 --train-stays 4000 --validation-stays 1000 \
        --max-stays 1000 --max-alerts 1000

``--fit-presets PRESET [PRESET ...]`` fits GARLIC with each preset on the same sample, alike, and measures it twice:
its drivers ranked as the bedside ranks them, by the signed integrated gradients of that hour's logit summed per
variable (a row ``garlic+PRESET``: ``garlic.methods.drivers.row_gradients``), and by its built-in signal importance
of the record up to the hour (``garlic+PRESET, built-in signal importance``).

``--out FILE.md`` writes the table as Markdown, with this command at its top, and its rows as ``FILE.csv``
beside it (the early-warning table reads ``alert-faithfulness.csv`` from its own folder).
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from garlic.data.batches import IrregularDataset
from garlic.data.datasets import DEFAULT_DATA_ROOT, processed_folder
from garlic.data.splits import read_split
from garlic.evaluation.faithfulness import alert_faithfulness
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

    return tensorize(
        ProcessedDataset(
            observations=table(OBSERVATIONS),
            static=table(STATIC),
            labels=table(LABELS),
            variables=manifest["variables"],
            manifest=manifest,
            tasks=table(TASKS) if (folder / TASKS).is_file() else None,
        )
    )


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
        raise run_contract.StaleRunDataError(
            f"run {run_id}'s split {params[run_contract.SPLIT]} is not saved under {folder}"
        )
    log.info(
        "run %s records no split digest (a study's unit): split %s read by name, the data digest checked",
        run_id,
        params[run_contract.SPLIT],
    )
    return split


def run_faithfulness(
    run_id: str,
    store: Path,
    data_root: Path,
    part: str = "test",
    threshold: float | None = None,
    fraction: float = 0.5,
    max_alerts: int | None = None,
    seed: int = 0,
    max_stays: int | None = None,
) -> dict:
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
    return {
        "run": run_id,
        "method": trained.name,
        "split": params.get("split", ""),
        "threshold": threshold,
        **measured.to_dict(),
    }


def fitted_faithfulness(
    names: list[str],
    dataset: str,
    split_name: str,
    data_root: Path,
    train_stays: int,
    validation_stays: int,
    test_stays: int,
    fraction: float = 0.5,
    max_alerts: int | None = None,
    seed: int = 0,
    presets: list[str] = (),
) -> list[dict]:
    """The table's rows for hourly models ``names`` and GARLIC with each of ``presets`` (a row ``garlic+PRESET``),
    fitted on a sample of the split ``split_name`` (the module's docstring)."""
    from garlic.methods.drivers import row_importance, row_signal_importance
    from garlic.methods.garlic import GarlicEstimator
    from garlic.methods.hourly import HourlyModel
    from garlic.metrics.utility import SEPSIS_UTILITY, choose_threshold, stay_lengths
    from garlic.studies import preset_config

    folder = processed_folder(dataset, data_root)
    split = read_split(folder, *run_contract.parse_split_name(split_name))
    if split is None:
        raise ValueError(f"split {split_name} is not saved under {folder}: train a run on it first")
    rng = np.random.default_rng(seed)
    sizes = {"train": train_stays, "validation": validation_stays, "test": test_stays}
    parts = {}
    for part, size in sizes.items():
        ids = getattr(split, part)
        ids = np.sort(rng.choice(ids, size, replace=False)) if size < len(ids) else np.sort(ids)
        parts[part] = IrregularDataset(stays_of(folder, ids), split.normalisation)
    times = parts["validation"].prediction_times
    if times.score != SEPSIS_UTILITY:
        raise ValueError(
            f"--fit chooses the alarm threshold by the utility, but {dataset}'s task is scored by "
            f"{times.score or 'its labels alone'}"
        )
    models = {}  # each row's name -> a fresh model, every name checked before anything is fitted
    for name in names:
        kind, target = _hourly_kind(name)
        models[name] = partial(HourlyModel, kind, seed=seed, target=target)
    for preset in presets:
        config = preset_config(preset, dataset, [f"seed={seed}"])
        models[f"garlic+{preset}"] = partial(GarlicEstimator.of_run, config, explain=False)
    # GARLIC is measured twice, one fit: by its bedside drivers (integrated gradients), and by its built-in signal
    # importance, which they replaced
    ways = {
        f"garlic+{preset}": {"": row_importance, "built-in signal importance": row_signal_importance}
        for preset in presets
    }
    rows = []
    for name, made in models.items():
        model = made().fit(parts["train"], parts["validation"])
        risk = model.predict_proba(parts["validation"])
        threshold = choose_threshold(times.label, risk, stay_lengths(times.stay)).threshold
        log.info("%s fitted on %d stays, alarm at risk >= %.4g", name, len(parts["train"]), threshold)
        for way, explain in ways.get(name, {"": row_importance}).items():
            measured = alert_faithfulness(model, parts["test"], threshold, fraction, seed, max_alerts, explain)
            rows.append(
                {
                    "run": f"fitted on {train_stays} stays",
                    "method": f"{name}, {way}" if way else name,
                    "split": split_name,
                    "threshold": threshold,
                    **measured.to_dict(),
                }
            )
    return rows


def _hourly_kind(name: str) -> tuple[str, str]:
    """(kind, target) of an hourly model's registry name: hourly_gbm_utility -> ('gbm', 'utility')."""
    kind, _, target = name.removeprefix("hourly_").partition("_")
    if not name.startswith("hourly_") or kind not in ("gbm", "logreg") or target not in ("", "utility"):
        raise ValueError(f"--fit takes hourly_gbm, hourly_logreg and their _utility forms, got {name!r}")
    return kind, target or "label"


def markdown(table: pd.DataFrame, command: str) -> str:
    """The page: the command, what was removed and how, the table, and each run's share of its risk that removing
    its top drivers took away."""
    shown = table.assign(alerts=table["alerts"].astype(int)).round(4)
    lines = [
        "# Are an alert's drivers the ones the model needs?",
        "",
        f"`{command}`",
        "",
        "At each alerted hour measured (risk at or above the run's threshold), half of the variables observed by "
        "then (rounded up) are removed from the record, ranked by the model's own explanation at that hour, and the "
        "model asked again at that hour; a drop is the risk before minus after. Faithful drivers give top > random "
        "> bottom (`experiments/alert_faithfulness.py` says how the stays and models were chosen). A run read `fitted on "
        "N stays` is a model fitted afresh on a sample of the split's training stays, its settings and threshold "
        "chosen on validation: a check of the explanations, not of the published models' accuracy.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(str(row[column]) for column in COLUMNS) + " |" for _, row in shown.iterrows()]
    lines.append("")
    for row in table.itertuples():
        order = (
            "top > random > bottom" if row.drop_top > row.drop_random > row.drop_bottom else "not top > random > bottom"
        )
        lines.append(
            f"- {row.method} ({row.split}): {order}; removing the top half took away {row.drop_top / row.risk:.0%} "
            f"of the mean risk, a random half {row.drop_random / row.risk:.0%}."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", default=[], help="hourly run ids (a split run each, with its saved model)")
    parser.add_argument(
        "--fit", nargs="+", default=[], metavar="NAME", help="hourly models fitted afresh on a sample of --split"
    )
    parser.add_argument("--mlruns", type=Path, help="the MLflow store of the runs")
    parser.add_argument(
        "--fit-presets", nargs="+", default=[], metavar="PRESET", help="GARLIC with these presets, fitted as --fit's"
    )
    parser.add_argument("--dataset", default="physionet2019-hourly", help="with --fit")
    parser.add_argument("--split", default="five-split/split_0", help="with --fit: the saved split sampled")
    parser.add_argument("--train-stays", type=int, default=4000, help="with --fit")
    parser.add_argument("--validation-stays", type=int, default=1000, help="with --fit")
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
    if not args.runs and not args.fit and not args.fit_presets:
        parser.error("name the hourly models measured: --runs (saved runs), --fit (fitted afresh), or both")
    if args.runs and args.mlruns is None:
        parser.error("--runs needs --mlruns, the store that holds them")
    rows = []
    if args.fit or args.fit_presets:
        rows += fitted_faithfulness(
            args.fit,
            args.dataset,
            args.split,
            args.data_root,
            args.train_stays,
            args.validation_stays,
            args.max_stays or 1000,
            args.fraction,
            args.max_alerts,
            args.seed,
            args.fit_presets,
        )
    rows += [
        run_faithfulness(
            run_id,
            args.mlruns,
            args.data_root,
            args.part,
            args.threshold,
            args.fraction,
            args.max_alerts,
            args.seed,
            args.max_stays,
        )
        for run_id in args.runs
    ]
    table = pd.DataFrame(rows, columns=COLUMNS)
    command = "python -m experiments.alert_faithfulness " + " ".join(sys.argv[1:] if argv is None else argv)
    text = markdown(table, command)
    print(text)
    if args.out is not None:
        with atomic_file(args.out, "w") as out:
            out.write(text)
        with atomic_file(args.out.with_suffix(".csv"), "w") as out:
            table.assign(command=command).to_csv(out, index=False, float_format="%.6g")
    return table


if __name__ == "__main__":
    main()
