"""What a seed ensemble of a GARLIC preset scores, read from the run archive: nothing is trained.

    python -m experiments.seed_ensemble --dataset physionet2012 --protocol garlic-reference \\
        --presets physionet2012-fast physionet2012-reference-fast --against gbm_static --out docs/results

For each preset and each split of the protocol with two or more model seeds in the archive
(``OUT/<dataset>-runs``, kept by ``experiments.compare --out``; ``compare --seeds 0 1 2 3 4`` trains them on a
protocol of one seed per split, such as ``raindrop``), the ensemble's risk for a stay is the mean of its
seeds' risks. It is scored on the split's test stays beside the seeds scored alone, and paired with the ``--against``
method on the same stays (``garlic.evaluation.stats.paired_difference``: the mean difference over splits and a 95%
bootstrap interval over test stays; an interval holding 0 is a tie). An ensemble of K seeds costs K models'
inference per stay. The test parts were read when the seeds were tested; combining the archived risks reads them
again, so the ensemble is a diagnosis of a direction, not a model selected on validation.

With ``--blend`` a second table blends each split's ensemble with the ``--against`` method: the mean of the two
risks per stay, equal weights, nothing fitted (one fixed rule, so no choice is made on the test stays). It is a
row of its own, not a GARLIC model: it asks whether GARLIC's risks carry anything that gradient boosting's lack.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from garlic import studies
from garlic.data.datasets import DEFAULT_DATA_ROOT, dataset_name
from garlic.evaluation.stats import paired_text
from garlic.io.atomic import atomic_file
from garlic.metrics import binary_metrics
from garlic.tracking.archive import Unit, archived, open_archive


def mean_risk(units: list[Unit], method: str) -> Unit:
    """The mean of ``units``' risks per stay (runs of one split, on the same test stays), scored as ``method``."""
    first = units[0]
    risks = pd.concat([unit.predictions.set_index("stay_id")["risk"] for unit in units], axis=1)  # [stays, units]
    if risks.isna().any().any() or len(risks) != len(first.predictions):
        names = " and ".join(sorted({unit.method for unit in units}))
        raise ValueError(f"the runs of {names} on {first.protocol}/split_{first.split} do not share test stays")
    mean = risks.mean(axis=1).loc[first.predictions["stay_id"]].to_numpy()
    predictions = first.predictions[["stay_id", "label"]].assign(risk=mean)
    metrics = binary_metrics(predictions["label"].to_numpy(), predictions["risk"].to_numpy())
    return Unit(method, first.protocol, first.split, None, "", first.settings, metrics, predictions)


def ensemble(seeds: list[Unit]) -> Unit:
    """The mean of the seeds' risks per stay (the seeds of one split, on the same test stays)."""
    return mean_risk(seeds, f"{seeds[0].method} ensemble of {len(seeds)}")


def by_split(seeds: list[Unit]) -> dict[int, list[Unit]]:
    """The seeds of each split that has two or more (an ensemble's splits)."""
    splits: dict[int, list[Unit]] = {}
    for unit in seeds:
        splits.setdefault(unit.split, []).append(unit)
    kept = {split: units for split, units in splits.items() if len(units) > 1}
    if not kept:
        raise ValueError(f"{seeds[0].method} on {seeds[0].protocol}: no split has two or more seeds archived")
    return kept


def ensemble_row(seeds: list[Unit], baseline: list[Unit], against: str) -> dict:
    """One preset on one protocol: its seeds alone, their ensembles per split, and both paired with ``baseline``."""
    splits = by_split(seeds)
    ensembles = [ensemble(units) for units in splits.values()]
    counts = sorted({len(units) for units in splits.values()})
    row = {
        "preset": seeds[0].method,
        "protocol": seeds[0].protocol,
        "splits": len(ensembles),
        "seeds": "/".join(map(str, counts)),
    }
    for metric in ("auroc", "auprc"):
        alone = [unit.metrics[metric] for units in splits.values() for unit in units]
        row[f"single_{metric}"] = f"{np.mean(alone):.4f} ± {np.std(alone):.4f}"
        row[f"ensemble_{metric}"] = round(float(np.mean([unit.metrics[metric] for unit in ensembles])), 4)
    for metric in ("auroc", "auprc"):
        row[f"{metric}_vs_{against}"] = paired_text(ensembles, baseline, metric)
    return row


def blend_row(seeds: list[Unit], baseline: list[Unit], against: str) -> dict:
    """Each split's ensemble blended with ``baseline``'s run of that split (the mean risk), paired with ``baseline``."""
    theirs = {unit.split: unit for unit in baseline}
    ensembles = [ensemble(units) for split, units in by_split(seeds).items() if split in theirs]
    blends = [mean_risk([mine, theirs[mine.split]], f"{mine.method} + {against}") for mine in ensembles]
    if not blends:
        raise ValueError(f"{against} has no run on a split of {seeds[0].method}'s ensembles")
    row = {"blend": f"{blends[0].method} (mean risk)", "protocol": seeds[0].protocol, "splits": len(blends)}
    for metric in ("auroc", "auprc"):
        row[f"blend_{metric}"] = round(float(np.mean([unit.metrics[metric] for unit in blends])), 4)
    for metric in ("auroc", "auprc"):
        row[f"{metric}_vs_{against}"] = paired_text(blends, baseline, metric)
    return row


def ensemble_tables(args: argparse.Namespace, name: str) -> dict[str, pd.DataFrame]:
    """The table ``name`` (each preset's ensembles) and, with ``--blend``, ``name-blend``, from the run archive."""
    archive = open_archive(args.out, args.dataset, args.data_root)
    baseline = archived(archive, args.against, args.protocol)
    if not baseline:
        raise SystemExit(f"{archive.folder} keeps no {args.against} run on {args.protocol}")
    presets = {}
    for preset in args.presets:
        presets[preset] = archived(archive, preset, args.protocol)
        if not presets[preset]:
            raise SystemExit(f"{archive.folder} keeps no {preset} run on {args.protocol}")
    tables = {name: pd.DataFrame([ensemble_row(seeds, baseline, args.against) for seeds in presets.values()])}
    if args.blend:
        tables[f"{name}-blend"] = pd.DataFrame([blend_row(seeds, baseline, args.against) for seeds in presets.values()])
    return tables


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.seed_ensemble",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dataset", required=True, type=dataset_name)
    parser.add_argument("--protocol", required=True, help="a protocol whose splits have several seeds archived")
    parser.add_argument("--presets", nargs="+", required=True, help="GARLIC presets kept in the archive")
    parser.add_argument("--against", default="gbm_static", help="the method to pair with (default gbm_static)")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument(
        "--blend",
        action="store_true",
        help="also each ensemble blended with --against (the mean risk per stay), as a table of its own",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/results"),
        help="the folder holding <dataset>-runs; ensemble-<dataset>.md is written there",
    )
    args = parser.parse_args(argv)
    name = f"ensemble-{args.dataset}-{args.protocol}"
    try:  # a damaged archive, or runs that cannot make an ensemble: one line, not a traceback
        tables = ensemble_tables(args, name)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    command = "python -m experiments.seed_ensemble " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = (
        f"# Seed ensembles: {args.dataset} {args.protocol}\n\nMade by (from the run archive, nothing trained):\n\n"
        f"```bash\n{command}\n```\n\n{studies.markdown(tables[name])}\n"
    )
    if args.blend:
        text += (
            f"\n## Blended with {args.against}\n\nThe mean of the ensemble's and {args.against}'s risks per stay "
            f"(equal weights, nothing fitted), paired with {args.against} on the same test stays. A row of its "
            f"own, not a GARLIC model.\n\n{studies.markdown(tables[f'{name}-blend'])}\n"
        )
    for table_name, table in tables.items():
        with atomic_file(args.out / f"{table_name}.csv", "w") as file:
            table.to_csv(file, index=False)
    with atomic_file(args.out / f"{name}.md", "w") as file:
        file.write(text)
    print(text)


if __name__ == "__main__":
    main()
