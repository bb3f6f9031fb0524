"""What a change of the code did to a preset's runs: two run archives of one dataset, paired on the same test stays.

    git worktree add /tmp/before 970017e     # the archive as it was before the change
    python -m experiments.pair_archives --dataset physionet2012 --method physionet2012-fast \\
        --before /tmp/before/docs/results --after docs/results --out docs/results/fused-kernels-physionet2012.md

``--before`` and ``--after`` are folders holding ``<dataset>-runs`` (``experiments.compare --out``). For every
protocol on which both keep runs of ``--method`` (the same splits and model seeds), the table gives each archive's
mean test AUROC and AUPRC and the paired difference, after minus before, with its 95% bootstrap interval over test
stays (``garlic.evaluation.stats.paired_difference``; an interval holding 0 is a tie, and runs whose risks are equal to
the last bit are "identical"). Nothing is trained: it reads the risks the runs were tested with.
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
from garlic.tracking.archive import Unit, archived, open_archive


def paired_row(before: list[Unit], after: list[Unit]) -> dict | None:
    """One protocol: both archives' means over the shared runs and after - before, paired; None if none is shared."""
    shared = {(unit.split, unit.seed) for unit in before} & {(unit.split, unit.seed) for unit in after}
    if not shared:
        return None
    before = [unit for unit in before if (unit.split, unit.seed) in shared]
    after = [unit for unit in after if (unit.split, unit.seed) in shared]
    row = {"protocol": after[0].protocol, "runs": len(after)}
    for metric in ("auroc", "auprc"):
        row[f"before_{metric}"] = round(float(np.mean([unit.metrics[metric] for unit in before])), 4)
        row[f"after_{metric}"] = round(float(np.mean([unit.metrics[metric] for unit in after])), 4)
    for metric in ("auroc", "auprc"):
        row[f"{metric}_after_minus_before"] = paired_text(after, before, metric)
    return row


def pair(dataset: str, method: str, before: Path, after: Path, data_root: Path) -> pd.DataFrame:
    archives = [open_archive(folder, dataset, data_root) for folder in (before, after)]
    protocols = sorted(set.intersection(*(set(a.runs.loc[a.runs["method"].eq(method), "protocol"]) for a in archives)))
    rows = [paired_row(*(archived(archive, method, protocol) for archive in archives)) for protocol in protocols]
    rows = [row for row in rows if row is not None]
    if not rows:
        raise ValueError(f"{before} and {after} share no run of {method} on {dataset}")
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.pair_archives",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dataset", required=True, type=dataset_name)
    parser.add_argument("--method", required=True, help="the preset (or method) whose runs both archives keep")
    parser.add_argument("--before", type=Path, required=True, help="a folder holding <dataset>-runs: the old runs")
    parser.add_argument("--after", type=Path, required=True, help="a folder holding <dataset>-runs: the new runs")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--out", type=Path, help="also write the table, with this command, to this markdown file")
    args = parser.parse_args(argv)
    try:
        table = pair(args.dataset, args.method, args.before, args.after, args.data_root)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    command = "python -m experiments.pair_archives " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = (
        f"# {args.method} on {args.dataset}: new runs against the archived ones\n\nMade by (from two run "
        f"archives, nothing trained):\n\n```bash\n{command}\n```\n\n{studies.markdown(table)}\n"
    )
    print(text)
    if args.out:
        with atomic_file(args.out, "w") as out:
            out.write(text)


if __name__ == "__main__":
    main()
