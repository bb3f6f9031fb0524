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
- ``mean``: the training mean.

Errors: ``mae`` on the original scale (overall it is dominated by the variables of large units), ``mre`` = sum |error|
/ sum |value|, and ``normalised_mae``, the errors divided by the training standard deviation after the training
clipping, the scale of SAITS's published P12 numbers (SAITS 0.186, BRITS 0.256, from its own preprocessing: they
sit beside ours for scale, not as a paired comparison). Mean +/- std over the runs; the per-run differences of
``garlic`` against the best other method; per variable in ``-variables.csv``.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from experiments import published
from experiments.compare import stored_runs
from experiments.stats import mean_std
from garlic.data.datasets import DATASETS, DEFAULT_DATA_ROOT, ensure_processed
from garlic.data.splits import load_splits
from garlic.tracking.store import load_run_model
from preprocessing.atomic import atomic_file
from preprocessing.tensors import load_tensors

HIDDEN_SHARE = 0.1
METHODS = ("garlic", "locf", "linear", "mean")
BATCH = 128


def hide(mask: np.ndarray, share: float, seed: int) -> np.ndarray:
    """Boolean [N, T, D]: round(share * observed) of the observed cells of ``mask``, drawn without replacement."""
    observed = np.flatnonzero(mask)
    chosen = np.random.default_rng(seed).choice(observed, size=round(share * len(observed)), replace=False)
    hidden = np.zeros(mask.size, dtype=bool)
    hidden[chosen] = True
    return hidden.reshape(mask.shape)


def simple_imputations(values: torch.Tensor, mask: torch.Tensor, times: torch.Tensor) -> dict[str, torch.Tensor]:
    """``locf``, ``linear`` and ``mean`` at every cell from the values left (normalised, so the training mean is 0).

    values, mask [N, T, D] (the cells left), times [N, T] -> method -> [N, T, D]
    """
    steps = values.shape[1]
    index = torch.arange(steps)[None, :, None].expand_as(mask)
    observed = mask.bool()
    before = torch.where(observed, index, -1).cummax(1).values  # last step left at or before t
    before = torch.cat([torch.full_like(before[:, :1], -1), before[:, :-1]], 1)  # ... strictly before t
    after = torch.where(observed, index, steps).flip(1).cummin(1).values.flip(1)  # first at or after t
    after = torch.cat([after[:, 1:], torch.full_like(after[:, :1], steps)], 1)  # ... strictly after t
    has_before, has_after = before >= 0, after < steps
    previous = values.gather(1, before.clamp(min=0))
    following = values.gather(1, after.clamp(max=steps - 1))
    time = times[:, :, None].expand_as(values)
    time_before, time_after = time.gather(1, before.clamp(min=0)), time.gather(1, after.clamp(max=steps - 1))
    fraction = ((time - time_before) / (time_after - time_before).clamp(min=1e-6)).clamp(0, 1)
    between = previous + (following - previous) * fraction
    locf = torch.where(has_before, previous, 0.0)
    ends = torch.where(has_before, previous, torch.where(has_after, following, 0.0))
    return {"locf": locf, "linear": torch.where(has_before & has_after, between, ends), "mean": torch.zeros_like(values)}


@torch.no_grad()
def reconstructed(model, values, mask, times, lengths, static) -> torch.Tensor:
    """The model's reconstruction head at every cell, in batches of stays of similar length. -> [N, T, D]"""
    model.eval()
    result = torch.zeros_like(values)
    for chunk in torch.argsort(lengths, stable=True).split(BATCH):
        steps = max(int(lengths[chunk].max()), 1)
        output = model(values[chunk, :steps], mask[chunk, :steps], times[chunk, :steps], lengths[chunk], static[chunk])
        result[chunk, :steps] = output.reconstruction
    return result


def impute_split(trained, tensors, split, seed: int) -> tuple[dict, pd.DataFrame]:
    """Hide, impute and score on the split's test stays: overall errors per method, and MAE per method and variable."""
    test = trained.dataset(tensors.subset(split.positions(tensors, "test")))
    raw = tensors.subset(split.positions(tensors, "test")).values
    hidden = hide(test.mask.numpy() > 0, HIDDEN_SHARE, seed)
    left = test.mask * torch.from_numpy(~hidden)
    values = test.values * left
    imputations = simple_imputations(values, left, test.times)
    imputations["garlic"] = reconstructed(trained.model, values, left, test.times, test.lengths, test.static)
    normalisation = trained.normalisation
    truth_normalised, truth = test.values.numpy()[hidden], raw[hidden]
    variable = np.nonzero(hidden)[2]
    overall, per_variable = {}, []
    for method in METHODS:
        guess = imputations[method].numpy()[hidden]
        original = guess * normalisation.value_std[variable] + normalisation.value_mean[variable]
        error = np.abs(original - truth)
        overall[method] = {"normalised_mae": float(np.abs(guess - truth_normalised).mean()),
                           "mae": float(error.mean()), "mre": float(error.sum() / np.abs(truth).sum())}  # fmt: skip
        per_variable.append(pd.DataFrame({"method": method, "variable": np.asarray(tensors.variables)[variable],
                                          "error": error}).groupby(["method", "variable"], as_index=False).mean())  # fmt: skip
    return overall | {"hidden": int(hidden.sum())}, pd.concat(per_variable, ignore_index=True)


def report(command: str, title: str, runs: pd.DataFrame, dataset: str) -> str:
    lines = [f"# Imputation: {title}", "", "Made by:", "", "```bash", command, "```", "",
             f"{len(runs) // len(METHODS)} runs; on each, {HIDDEN_SHARE:.0%} of the test stays' observed values hidden "
             f"({int(runs['hidden'].iloc[0]):,} on the first), imputed from the rest. Mean +/- std over the runs.", "",
             "| method | normalised MAE | MAE (original units) | MRE |", "|---|---|---|---|"]  # fmt: skip
    for method, group in runs.groupby("method", sort=False):
        lines.append(f"| {method} | {mean_std(group['normalised_mae'])} | {mean_std(group['mae'])} | "
                     f"{mean_std(group['mre'])} |")  # fmt: skip
    for name, value in published.IMPUTATION_NMAE.get(dataset, {}).items():
        lines.append(f"| published: {name} (its own preprocessing) | {value:.3f} |  |  |")
    by_run = runs.pivot(index="run", columns="method", values="normalised_mae")
    best = by_run.drop(columns="garlic").mean().idxmin()
    lines.append("")
    # locf reads the same past as the head; the best method may read later values too (linear does).
    for other, why in (("locf", "which reads the same past"), (best, "the best other method")):
        difference = by_run["garlic"] - by_run[other]
        lines.append(f"- GARLIC against {other} ({why}), normalised MAE per run: "
                     + ", ".join(f"{d:+.3f}" for d in difference) + f"; mean {difference.mean():+.3f} (negative: "
                     "GARLIC closer).")  # fmt: skip
        if other == best:
            break
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.imputation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--dataset", choices=DATASETS, required=True)
    parser.add_argument("--protocol", required=True)
    parser.add_argument("--preset", required=True, help="the GARLIC preset whose runs' models are read")
    parser.add_argument("--mlruns", type=Path, nargs="+", required=True, help="the stores holding the runs")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    found = stored_runs(args.preset, args.dataset, args.protocol, args.mlruns, args.data_root)
    if not found:
        raise SystemExit(f"no finished run of {args.preset} on {args.protocol} ({args.dataset}) in the stores given")
    folder = ensure_processed(args.dataset, args.data_root)
    tensors = load_tensors(folder)
    splits = load_splits(folder, tensors, args.protocol, args.dataset)
    rows, variables = [], []
    for index, seed, store, run in found:
        trained = load_run_model(run.info.run_id, store)
        overall, per_variable = impute_split(trained, tensors, splits[index], seed=index)
        name = f"split_{index}/seed_{seed}"
        rows += [{"run": name, "method": m, "hidden": overall["hidden"], **overall[m]} for m in METHODS]
        variables.append(per_variable.assign(run=name))
    runs = pd.DataFrame(rows)
    per_variable = pd.concat(variables).groupby(["method", "variable"], as_index=False)["error"].mean()
    stem = args.out / f"imputation-{args.dataset}-{args.protocol}"
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
