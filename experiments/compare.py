"""One table: every method on every protocol, with paired differences against the best simple baseline. This script
reads the command line; the table is made by ``garlic.studies.comparison`` from the units that
``garlic.studies.comparison_units`` gathers or trains.

    python -m experiments.compare --dataset physionet2012 --protocols five-split raindrop garlic-reference

Methods:
- the methods of the registry (``garlic.methods.registry``, ``--methods``): by default the severity scores (SAPS-I, SOFA)
  and the simple baselines (logistic regression and gradient boosting on per-stay summaries, each with and without
  the static features); GRU-D, decay + GRU or a newly registered model when asked;
- GARLIC presets (``--presets``, files of ``garlic/configs/``; a row is named by the file's stem, e.g.
  ``physionet2012`` for the paper config), trained through ``garlic.runs.train``, the one train-select-test-log
  path: one run per split and model seed of the protocol (``--seeds`` gives other model seeds, for every protocol:
  ``experiments.seed_ensemble`` then scores their ensemble from the run archive).

Protocols (``--protocols``, default: every one that applies to the dataset): a protocol that does not apply (a
published one naming stays the dataset lacks, e.g. ``raindrop`` on synthetic data) is refused before anything trains.
A source's table (``--dataset physionet2019``, ``TABLE_COHORTS``) runs each protocol on its own cohort: ``raindrop``
on ``physionet2019-raindrop``, ``garlic-reference`` on ``physionet2019-garlic``, the others on
``physionet2019-raindrop``; one table, a run archive per cohort.

With ``--workers N`` the missing GARLIC units are trained first, in N parallel ``garlic train`` processes (the CPU
threads shared out evenly; one per core is the fastest on a CPU), all into the first store.

With ``--out``, every unit of the table is also kept in ``OUT/<dataset>-runs/`` (``garlic.tracking.archive``: test
metrics and risks, no outcomes), to be committed beside the table. A unit that no store holds is read back from
there, so the table can be made again, and extended, after the stores that trained it are gone. A row of the
table already at ``OUT`` that neither gives (measured before the archive existed) is kept, and the report names it.
A call naming fewer methods, presets or protocols than the table at ``OUT`` holds (one new method, say) extends it
rather than cutting it: the rows it does not name are made from the units the run archive keeps of them, and the
report names them. A damaged archive (``garlic.tracking.archive.DamagedArchiveError``) is refused in one line.

Resumable from MLflow (``garlic.tracking.queries``): a unit is done when any of the ``--mlruns`` stores holds a
FINISHED run of it, in any experiment, whichever command trained it (this table, ``garlic train``, a study): its run
carries the unit's identity (``garlic.tracking.run_contract.UnitIdentity``: method, split, settings and data), and a
GARLIC split run that ``garlic train`` finished before runs carried it is found by its split, seed and config on the
same data (``run_contract.DATA_DIGEST``). Runs trained in parallel into separate stores are gathered by listing every
store; new work goes into the first, in the dataset's experiment, and a GARLIC unit that another live process trains
into it (``garlic.studies.comparison_units.unit_lock``) is left to that process. A unit whose run stopped half-way in
the first store (killed, or its machine gone) with its training state kept is resumed from its last state
(``queries.interrupted_unit``, ``garlic.runs.run_unit``), in the same MLflow run, not trained again from the start.
Each unit is kept in the run archive as soon as it has finished; with ``--carry DIR`` an unfinished unit's training
state is kept there too, outside the store, and a store that has no run of the unit (a later run's, on a fresh
machine) goes on from it (``garlic.tracking.carry``; with ``--workers``, each worker's ``garlic train --carry DIR``);
the report then says how far each carried unit has come ("Under way"). ``--no-train`` only gathers, and names what is missing;
``--splits K ...`` trains only those splits and gathers the others: two calls, each into its own store with its own
splits, train one method's splits on two cores (a registered method trains in its call's process), and a last
``--no-train`` call naming both stores makes the whole table.

The table (test AUROC, AUPRC mean +/- std over the protocol's runs, mean Brier and ECE) is logged to MLflow and,
with ``--out``, written as ``<dataset>.md``, ``<dataset>.csv`` and ``<dataset>-paired.csv`` (the paired
differences). Published numbers sit beside ours, marked as published. Every GARLIC preset is compared, paired on the
same test stays, with the protocol's best simple baseline (highest mean, per metric): the mean difference over the
protocol's runs and a 95% bootstrap interval over test stays (each resample redraws every split's test stays; a
difference whose interval holds 0 is a tie).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from garlic import studies
from garlic.data.datasets import DEFAULT_DATA_ROOT, dataset_name, ensure_processed, processed_folder
from garlic.data.splits import PROTOCOLS, not_applicable, protocol
from garlic.io.tables import DatasetNotFoundError, read_manifest
from garlic.io.tensors import load_tensors
from garlic.methods import registry
from garlic.studies import comparison, preset_config
from garlic.studies.comparison_units import BASELINES, TABLE_COHORTS, protocol_dataset
from garlic.tracking.archive import DamagedArchiveError
from garlic.tracking.store import DEFAULT_STORE
from garlic.training.workers import add_worker_arguments, check_worker_arguments


def applicable_protocols(
    parser: argparse.ArgumentParser, dataset: str, data_root: Path, asked: list[str] | None
) -> list[str]:
    """The protocols asked for, each checked to apply to the dataset it runs on (``protocol_dataset``: a published
    one names stays the dataset must hold) before anything is trained; without ``--protocols``, every protocol that
    applies."""
    stay_ids = {}

    def reason_refused(name: str) -> str | None:
        on = protocol_dataset(dataset, name)
        if on not in stay_ids:
            try:
                stay_ids[on] = load_tensors(ensure_processed(on, data_root)).stay_ids
            except DatasetNotFoundError as exc:
                stay_ids[on] = exc
        if isinstance(stay_ids[on], Exception):
            return str(stay_ids[on])
        return not_applicable(name, stay_ids[on], on, read_manifest(processed_folder(on, data_root)))

    refused = {name: reason for name in asked or PROTOCOLS if (reason := reason_refused(name))}
    applicable = [name for name in asked or PROTOCOLS if name not in refused]
    if asked and refused:
        name, reason = next(iter(refused.items()))
        parser.error(f"--protocols {name} does not apply to --dataset {dataset}: {reason}")
    if not applicable:
        parser.error(f"no protocol applies to --dataset {dataset}: " + "; ".join(refused.values()))
    for name, reason in refused.items():
        print(f"protocol {name} left out: it does not apply to --dataset {dataset} ({reason})", file=sys.stderr)
    return applicable


def main(argv: list[str] | None = None) -> None:
    try:
        compare_command(argv)
    except DamagedArchiveError as error:
        raise SystemExit(str(error)) from None


def compare_command(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dataset",
        type=lambda text: text if text in TABLE_COHORTS else dataset_name(text),
        default="physionet2012",
        help="a dataset, or a source (physionet2019) whose protocols each run on their own cohort",
    )
    parser.add_argument(
        "--protocols", nargs="+", choices=list(PROTOCOLS), help="default: every protocol that applies to the dataset"
    )
    parser.add_argument(
        "--methods",
        nargs="*",
        choices=[m for m in registry.METHODS if m != "garlic"],
        default=list(BASELINES),
        help="methods of the registry (garlic.methods.registry); GARLIC: --presets",
    )
    parser.add_argument("--presets", nargs="*", default=None, help="GARLIC presets (default: the dataset's own)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    parser.add_argument(
        "--seeds",
        type=studies.count,
        nargs="+",
        metavar="K",
        help="model seeds of every GARLIC preset on every protocol, in place of the protocol's "
        "(five on garlic-reference, the preset's one elsewhere): the runs of a seed ensemble",
    )
    parser.add_argument(
        "--splits",
        type=studies.count,
        nargs="+",
        metavar="K",
        help="train only these splits of each protocol; the others are gathered where a store or "
        "the run archive holds them, else listed as missing (one split to screen on, or the "
        "splits that one core trains beside another call's)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--data-root", type=studies.folder, default=DEFAULT_DATA_ROOT)
    parser.add_argument(
        "--mlruns",
        type=studies.folder,
        nargs="+",
        default=[DEFAULT_STORE],
        help="stores to gather finished runs from; new runs go into the first",
    )
    parser.add_argument("--no-train", action="store_true", help="only gather finished runs; list what is missing")
    studies.add_carry_argument(parser)
    add_worker_arguments(parser, "the missing GARLIC units")
    parser.add_argument(
        "--against",
        metavar="PRESET",
        help="also pair every other preset with this one (one of --presets), on the same splits and model seeds",
    )
    parser.add_argument(
        "--out",
        type=studies.folder,
        help="folder for <dataset>.md, .csv, -paired.csv and the run "
        "archive <dataset>-runs/ of each dataset (e.g. docs/results)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    overrides = [*args.set, *([f"device={args.device}"] if args.device else [])]
    presets = [args.dataset] if args.presets is None else args.presets

    check_worker_arguments(parser, args)
    studies.check_carry_argument(parser, args)
    if args.against is not None and args.against not in presets:
        parser.error(f"--against names one of the --presets ({', '.join(presets)}), got {args.against!r}")
    args.protocols = applicable_protocols(parser, args.dataset, args.data_root, args.protocols)
    for name in args.protocols if args.splits else []:
        if unknown := sorted(set(args.splits) - set(protocol(name).splits)):
            parser.error(
                f"--splits {' '.join(map(str, unknown))}: protocol {name} has splits "
                f"{', '.join(map(str, protocol(name).splits))}"
            )
    datasets = {name: protocol_dataset(args.dataset, name) for name in args.protocols}  # protocol -> its dataset
    try:
        configs = {
            dataset: {name: preset_config(name, dataset, overrides) for name in presets}
            for dataset in dict.fromkeys(datasets.values())
        }
    except ValueError as refused:  # an unknown preset, one of another dataset, a bad --set
        parser.error(str(refused))
    command = "python -m experiments.compare " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(comparison.make_table(args, datasets, configs, presets, overrides, command))


if __name__ == "__main__":
    main()
