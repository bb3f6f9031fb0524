"""GARLIC's reconstruction head as an imputer, beside simple imputers, on the test stays of a protocol's runs.

    python -m experiments.imputation --dataset physionet2012 --protocol raindrop --preset physionet2012-fast \\
        --mlruns STORE [STORE ...] --out docs/results/studies

For every finished run of the preset on the protocol (found in the stores as ``experiments.compare`` finds them),
on its split's test stays: ``HIDDEN_SHARE`` of the observed values are hidden (drawn with the split's index as seed:
the same cells for every method), each method imputes them from the values left, and the imputations are compared
with the hidden values:

- ``garlic``: the model's reconstruction head at the hidden cell, its prediction of the value from what every
  variable sent over the graph from the previous ``window_size`` steps; it reads no later step;
- ``locf``: the variable's last value left before the cell (the training mean where there is none);
- ``linear``: linear interpolation in time between the values left before and after the cell (the nearer one at a
  stay's ends, the training mean where there is none): the one method that reads later values;
- ``mean``: the training mean;
- ``saits``, ``brits`` (when named in ``--imputers``; the ``pypots`` extra): PyPOTS's SAITS (Du et al. 2023) and
  BRITS (Cao et al. 2018) imputers, trained on the training stays (their observed values, normalised, on the hourly
  grid of ``garlic.methods.field.hourly_grid``) and stopped early on the validation stays with ``HIDDEN_SHARE`` of
  their grid cells hidden; they impute the test stays' grid built from the values left, and a hidden cell takes the
  imputation of its hour and variable. On that grid an hour keeps its last value left, so a hidden cell whose hour
  still holds another value of its variable gets that value (a neighbour within the hour, earlier or later): the
  grid's resolution, which the per-step methods above do not have. Sizes: ``FIELD_IMPUTERS``.

Each run's errors are kept in ``OUT/imputation-<dataset>-<protocol>-by-run/`` as it finishes, and read back when
the same command runs again: a long study (PyPOTS's imputers take minutes a split) resumes where it stopped. Only
``garlic`` reads the run's model; the other methods read the split's stays and its training normalisation alone, so
a run trained again is imputed again by ``garlic`` and keeps the other methods' errors. ``--splits K ...`` trains the
missing PyPOTS imputers on those splits only (two processes can share a study's splits; ``--splits`` with no split
trains none and remakes the tables): the tables then give each method's errors over the runs that hold it.

Errors: ``mae`` on the original scale (overall it is dominated by the variables of large units), ``mre`` = sum |error|
/ sum |value|, and ``normalised_mae``, the errors divided by the training standard deviation after the training
clipping, the scale of SAITS's published P12 numbers (SAITS 0.186, BRITS 0.256, from its own preprocessing: they
sit beside ours for scale, not as a paired comparison). Mean +/- std over the runs; the per-run differences of
``garlic`` against the best other method; per variable in ``-variables.csv``.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from garlic.data.batches import IrregularDataset
from garlic.data.datasets import ensure_processed
from garlic.data.splits import load_splits
from garlic.evaluation import published
from garlic.evaluation.fit_and_test import split_parts
from garlic.evaluation.imputation import HIDDEN_SHARE, hide, reconstructed, simple_imputations
from garlic.evaluation.stats import mean_std
from garlic.io.atomic import atomic_file
from garlic.io.tensors import load_tensors
from garlic.methods.field import hourly_grid
from garlic.methods.saved import load_predictor
from garlic import studies

METHODS = ("garlic", "locf", "linear", "mean")
# PyPOTS's imputers: small enough for a CPU (SAITS's paper used d_model 256 on a GPU), the epochs' budget and
# patience of the field's classifiers (garlic.methods.field.FieldModel's defaults).
FIELD_IMPUTERS = {
    "saits": {"n_layers": 2, "d_model": 64, "n_heads": 4, "d_k": 16, "d_v": 16, "d_ffn": 128, "dropout": 0.1},
    "brits": {"rnn_hidden_size": 64},
}
FIELD_TRAINING = {"batch_size": 64, "epochs": 30, "patience": 5}


def field_imputation(
    name: str, parts: dict[str, IrregularDataset], left: IrregularDataset, hidden: np.ndarray, seed: int
) -> np.ndarray:
    """PyPOTS's imputer ``name`` trained on ``parts["train"]``, stopped early on ``parts["validation"]`` with a share
    of its grid hidden, imputing the test stays' values ``left``: its guess at each ``hidden`` cell [K], normalised."""
    from pypots.imputation import BRITS, SAITS  # the optional extra
    from pypots.utils.random import set_random_seed

    train = parts["train"]
    last = train.times.numpy()[np.arange(len(train)), np.maximum(train.lengths.numpy() - 1, 0)]
    hours = max(1, math.ceil(float(last.max())))
    grids = {part: hourly_grid(parts[part], hours) for part in ("train", "validation")}
    held_out = grids["validation"].copy()
    held_out[hide(~np.isnan(held_out), HIDDEN_SHARE, seed)] = np.nan
    set_random_seed(seed)
    model = {"saits": SAITS, "brits": BRITS}[name](
        n_steps=hours,
        n_features=held_out.shape[-1],
        device="cpu",
        saving_path=None,
        verbose=False,
        **FIELD_IMPUTERS[name],
        **FIELD_TRAINING,
    )
    model.fit({"X": grids["train"]}, {"X": held_out, "X_ori": grids["validation"]})
    imputed = model.predict({"X": hourly_grid(left, hours)})["imputation"]  # [N, hours, D]
    stay, step, variable = np.nonzero(hidden)
    hour = np.clip(np.floor(left.times.numpy()[stay, step]), 0, hours - 1).astype(np.int64)
    return imputed[stay, hour, variable]


def impute_split(trained, tensors, split, seed: int, imputers: list[str] = ()) -> tuple[dict, pd.DataFrame]:
    """Hide, impute and score on the split's test stays: overall errors per method, and MAE per method and variable;
    ``imputers``: PyPOTS's (``FIELD_IMPUTERS``) beside the others."""
    raw_test = tensors.subset(split.positions(tensors, "test"))
    test, raw = trained.dataset(raw_test), raw_test.values
    hidden = hide(test.mask.numpy() > 0, HIDDEN_SHARE, seed)
    left = test.mask * torch.from_numpy(~hidden)
    values = test.values * left
    imputations = simple_imputations(values, left, test.times)
    imputations["garlic"] = reconstructed(trained.model, values, left, test.times, test.lengths, test.static)
    imputations = {method: imputations[method].numpy()[hidden] for method in METHODS}
    if imputers:
        parts = split_parts(tensors, split, trained.normalisation)
        kept = replace(raw_test, mask=raw_test.mask & ~hidden, values=np.where(hidden, 0, raw_test.values))
        for name in imputers:
            imputations[name] = field_imputation(name, parts, trained.dataset(kept), hidden, seed)
    normalisation = trained.normalisation
    truth_normalised, truth = test.values.numpy()[hidden], raw[hidden]
    variable = np.nonzero(hidden)[2]
    overall, per_variable = {}, []
    for method, guess in imputations.items():
        original = guess * normalisation.value_std[variable] + normalisation.value_mean[variable]
        error = np.abs(original - truth)
        overall[method] = {
            "normalised_mae": float(np.abs(guess - truth_normalised).mean()),
            "mae": float(error.mean()),
            "mre": float(error.sum() / np.abs(truth).sum()),
        }
        per_variable.append(
            pd.DataFrame({"method": method, "variable": np.asarray(tensors.variables)[variable], "error": error})
            .groupby(["method", "variable"], as_index=False)
            .mean()
        )
    return overall | {"hidden": int(hidden.sum())}, pd.concat(per_variable, ignore_index=True)


def kept_errors(done: Path, run_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The overall and per-variable errors that ``done``'s files hold and that still stand for run ``run_id``: every
    method's, except ``garlic``'s when they came from another run's model (empty tables when nothing is kept)."""
    paths = [Path(f"{done}-{kind}.csv") for kind in ("overall", "variables")]
    if not all(path.is_file() for path in paths):
        return pd.DataFrame(columns=["method"]), pd.DataFrame(columns=["method"])
    overall, variables = (pd.read_csv(path) for path in paths)
    if (overall["method"].eq("garlic") & overall["run_id"].ne(run_id)).any():
        overall, variables = overall[overall["method"].ne("garlic")], variables[variables["method"].ne("garlic")]
    return overall, variables


def merged(kept: pd.DataFrame, new: pd.DataFrame, methods: tuple[str, ...]) -> pd.DataFrame:
    """``kept``'s rows of the methods that ``new`` lacks, and ``new``'s, in the order of ``methods`` (the others
    after them)."""
    rows = new if kept.empty else pd.concat([kept[~kept["method"].isin(new["method"])], new], ignore_index=True)
    order = {method: position for position, method in enumerate(methods)}
    return rows.sort_values("method", key=lambda m: m.map(order).fillna(len(order)), kind="stable", ignore_index=True)


def report(command: str, title: str, runs: pd.DataFrame, dataset: str) -> str:
    lines = [
        f"# Imputation: {title}",
        "",
        "Made by:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"{runs['run'].nunique()} runs; on each, {HIDDEN_SHARE:.0%} of the test stays' observed values hidden "
        f"({int(runs['hidden'].iloc[0]):,} on the first), imputed from the rest. Mean +/- std over the runs.",
        "",
        "| method | runs | normalised MAE | MAE (original units) | MRE |",
        "|---|---|---|---|---|",
    ]
    for method, group in runs.groupby("method", sort=False):
        lines.append(
            f"| {method} | {len(group)} | {mean_std(group['normalised_mae'])} | {mean_std(group['mae'])} | "
            f"{mean_std(group['mre'])} |"
        )
    for name, value in published.IMPUTATION_NMAE.get(dataset, {}).items():
        lines.append(f"| published: {name} (its own preprocessing) |  | {value:.3f} |  |  |")
    by_run = runs.pivot(index="run", columns="method", values="normalised_mae")
    best = by_run.drop(columns="garlic").mean().idxmin()
    lines.append("")
    # locf reads the same past as the head; the best method may read later values too (linear does).
    for other, why in (("locf", "which reads the same past"), (best, "the best other method")):
        difference = (by_run["garlic"] - by_run[other]).dropna()  # over the runs that hold both
        lines.append(
            f"- GARLIC against {other} ({why}), normalised MAE per run: "
            + ", ".join(f"{d:+.3f}" for d in difference)
            + f"; mean {difference.mean():+.3f} (negative: "
            "GARLIC closer)."
        )
        if other == best:
            break
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.imputation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    studies.add_preset_runs_arguments(parser, "runs' models")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--imputers",
        nargs="*",
        choices=sorted(FIELD_IMPUTERS),
        default=[],
        help="PyPOTS's imputers to train beside the others (the pypots extra; minutes a split on a CPU)",
    )
    parser.add_argument(
        "--splits",
        type=int,
        nargs="*",
        metavar="K",
        help="train the missing --imputers on these splits only (default: every split)",
    )
    args = parser.parse_args(argv)
    found = studies.preset_runs(args)
    folder = ensure_processed(args.dataset, args.data_root)
    tensors = load_tensors(folder)
    splits = load_splits(folder, tensors, args.protocol, args.dataset)
    methods = (*METHODS, *args.imputers)
    stem = args.out / f"imputation-{args.dataset}-{args.protocol}"
    rows, variables = [], []
    for index, seed, store, run in found:
        name = f"split_{index}/seed_{seed}"
        done = Path(f"{stem}-by-run") / f"split_{index}-seed_{seed}"
        overall, per_variable = kept_errors(done, run.info.run_id)
        trainable = args.splits is None or index in args.splits
        to_train = [m for m in args.imputers if trainable and m not in set(overall["method"])]
        if to_train or not set(METHODS) <= set(overall["method"]):
            trained = load_predictor(run.info.run_id, store)
            scores, errors = impute_split(trained, tensors, splits[index], seed=index, imputers=to_train)
            scored = pd.DataFrame(
                [
                    {"run": name, "run_id": run.info.run_id, "method": m, "hidden": scores["hidden"], **scores[m]}
                    for m in (*METHODS, *to_train)
                ]
            )
            overall = merged(overall, scored, methods)
            per_variable = merged(per_variable, errors.assign(run=name), methods)
            for kind, table in (("overall", overall), ("variables", per_variable)):
                with atomic_file(Path(f"{done}-{kind}.csv"), "w") as file:
                    table.to_csv(file, index=False)
        rows += overall[overall["method"].isin(methods)].drop(columns="run_id").to_dict("records")
        variables.append(per_variable[per_variable["method"].isin(methods)])
    runs = pd.DataFrame(rows)
    per_variable = pd.concat(variables).groupby(["method", "variable"], as_index=False)["error"].mean()
    command = "python -m experiments.imputation " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = report(command, f"{args.preset} on {args.protocol} ({args.dataset})", runs, args.dataset)
    args.out.mkdir(parents=True, exist_ok=True)
    tables = {f"{stem}-runs.csv": runs, f"{stem}-variables.csv": per_variable.rename(columns={"error": "mae"})}
    for path, table in tables.items():
        with atomic_file(Path(path), "w") as file:
            table.to_csv(file, index=False)
    with atomic_file(Path(f"{stem}.md"), "w") as file:
        file.write(text)
    print(text)


if __name__ == "__main__":
    main()
