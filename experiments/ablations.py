"""Ablations: the paper's variants of GARLIC, each a config switch, trained and tested on the same saved splits.

Every variant on every split is one MLflow run in the experiment ``ablations-<dataset>`` (tags: study, variant,
split, settings), reused when already finished. Three tables are logged as artifacts of a summary run and, with
``--out``, written as CSV and Markdown (the first two are also printed):

- ``ablation_results``: mean +/- std over splits of test AUROC, AUPRC, Brier, ECE before/after temperature scaling
  (on the synthetic cohort also the planted-edge recovery AUROC), with the paper's AUROC beside it (P12, P19);
- ``ablation_paired``: each variant against the full model, paired on the same splits and test stays: the mean
  difference and a 95% bootstrap interval over test stays (``garlic.evaluation.stats.paired_difference``; an interval
  holding 0 is a tie, and a variant whose risks equal the full model's on every split is ``identical``: a switch
  that changed nothing, such as ``joint_training`` on a schedule whose first stage never ends);
- ``ablation_runs``: every run's test metrics, so that the tables can be read without the store.

With ``--out``, that folder is also the study's run archive (``garlic.tracking.archive``: the runs table and each
run's test risks), read where the store lacks a run: the tables are made again from the repository alone. Each unit
is kept there as soon as it has finished, and with ``--carry DIR`` an unfinished one's training state is carried
beyond the store (``garlic.tracking.carry``), so that a unit cut off with its machine goes on in the next run, on another machine.

    python -m experiments.ablations --dataset synthetic --splits 0 1 --max-epochs 3

``--workers N`` trains the unfinished (variant, split) units in N parallel processes, each this command narrowed
to its unit (``garlic.training.workers``: one per core on a CPU; many on one GPU with ``--device cuda``, and
``--deadline MINUTES`` to start none after that), then writes the tables of what finished.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlflow
import pandas as pd

from garlic import runs, studies
from garlic.config import Config
from garlic.evaluation import published
from garlic.evaluation.fit_and_test import TEST_METRICS, split_parts
from garlic.evaluation.stats import paired_difference
from garlic.methods.garlic import GarlicEstimator
from garlic.tracking import carry, queries, run_contract
from garlic.tracking.archive import RunArchive, Unit
from garlic.training.workers import Job, run_jobs

STUDY = "ablation"
# Variant name -> the config switches it turns off; "full" is the paper's model.
VARIANTS = {
    "full": {},
    "no_missing_indicator": {"use_missing_indicator": False},
    "no_decay": {"use_decay": False},
    "no_per_variable_encoder": {"per_variable_encoder": False},
    "no_graph": {"use_graph": False},
    "no_gru": {"use_gru": False},
    "joint_training": {"alternating": False},
}


def unit_tags(config: Config, variant: str, split: int) -> dict:
    """What identifies the run of ``variant`` on ``split``: its settings by digest, told apart as GARLIC's units are
    (``queries.identifying_config``: a config key added since a unit was archived, at the value that trains as before,
    leaves its digest alone)."""
    return {
        "study": STUDY,
        "dataset": config.dataset,
        "variant": variant,
        "split": split,
        "settings": queries.settings_digest(queries.identifying_config(config.override(VARIANTS[variant]))),
    }


def run_variants(
    config: Config,
    cohort: studies.Cohort,
    experiment_id: str,
    store: Path,
    variants: list[str],
    train: bool = True,
    archive: RunArchive | None = None,
    carried: Path | None = None,
) -> pd.DataFrame:
    """One row per (variant, split) with its test metrics: a finished run of the store, else one of the ``archive``,
    else (with ``train``) trained now, its training state also carried in ``carried`` (``garlic.tracking.carry``)."""
    records = []
    for name in variants:
        variant = config.override(VARIANTS[name])
        for split in cohort.splits:
            tags = unit_tags(config, name, split.index)

            def work(variant=variant, split=split, settings=tags["settings"]) -> dict[str, float]:
                mlflow.log_params(variant.to_dict() | {"split_name": split.name})
                estimator = GarlicEstimator.of_run(variant, cohort.planted, explain=False)
                state = (
                    None
                    if carried is None
                    else carry.unit_state(
                        carried,
                        run_contract.UnitIdentity(
                            f"{STUDY}-{name}",
                            config.dataset,
                            split.name,
                            None,
                            settings,
                            archive.data_digest,
                        ),
                    )
                )
                return runs.fit_and_test_resuming(estimator, split_parts(cohort.tensors, split), variant, store, state)

            if queries.finished_run(experiment_id, {k: str(v) for k, v in tags.items()}) is None:
                kept = archive.row(variant=name, split=split.index, settings=tags["settings"]) if archive else None
                if kept is not None:
                    records.append(kept)
                if kept is not None or not train:
                    continue
            metrics, run_id, _ = studies.resumable(experiment_id, tags, f"{name}/split_{split.index}", work, store)
            records.append(
                {"variant": name, "split": split.index, "run_id": run_id, "settings": tags["settings"], **metrics}
            )
            if archive is not None:  # now, not at the call's end: the machine may not last through seven units
                archive.predictions(store, run_id)
                archive.keep_rows(pd.DataFrame(records[-1:]), ["variant", "split", "settings"])
    return pd.DataFrame(records)


def train_in_workers(
    argv: list[str],
    config: Config,
    cohort: studies.Cohort,
    experiment_id: str,
    variants: list[str],
    workers: int,
    store,
    minutes: float | None,
    archive: RunArchive,
) -> None:
    """The units finished neither in the store nor in the ``archive``, each as this command (``argv``) narrowed to
    it, in ``workers`` processes."""
    jobs = []
    for split in cohort.splits:  # split by split, so that a deadline leaves whole splits to pair
        for name in variants:
            tags = unit_tags(config, name, split.index)
            if (
                queries.finished_run(experiment_id, {k: str(v) for k, v in tags.items()}) is not None
                or archive.row(variant=name, split=split.index, settings=tags["settings"]) is not None
            ):
                continue
            unit = f"ablation-{config.dataset}-{name}-split_{split.index}-{tags['settings']}"
            command = [
                sys.executable,
                "-m",
                "experiments.ablations",
                *argv,
                "--variants",
                name,
                "--splits",
                str(split.index),
                "--workers",
                "1",
                "--train-only",
            ]
            jobs.append(
                Job(
                    f"{name}/split_{split.index}",
                    command,
                    Path(store) / "locks" / unit,
                    Path(store) / "logs" / f"{unit}.log",
                )
            )
    run_jobs(jobs, workers, minutes)


def paired_against_full(records: pd.DataFrame, predictions: studies.Predictions) -> pd.DataFrame:
    """Each variant minus the full model, per metric, over the splits both ran: the mean difference and its 95%
    bootstrap interval over test stays, each split's stays drawn once for both (``stats.paired_difference``)."""
    units: dict[str, list[Unit]] = {}
    for row in records.itertuples():
        units.setdefault(row.variant, []).append(
            Unit(row.variant, "ablation", int(row.split), None, row.run_id, "", {}, predictions(row.run_id))
        )
    rows = []
    full_splits = {unit.split for unit in units.get("full", [])}
    for variant, ours in units.items():
        ours = [unit for unit in ours if unit.split in full_splits]  # a split whose full run has not finished: none
        if variant == "full" or not ours:
            continue
        for metric in ("auroc", "auprc"):
            rows.append(
                {
                    "variant": variant,
                    "metric": metric,
                    "splits": len(ours),
                    **paired_difference(ours, units["full"], metric),
                }
            )
    paired = pd.DataFrame(rows, columns=["variant", "metric", "splits", "difference", "ci_low", "ci_high", "verdict"])
    return paired.round({"difference": 4, "ci_low": 4, "ci_high": 4})


def with_published(table: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """The results table with the paper's AUROC of each variant beside it (``published.ABLATION_AUROC``), where the
    paper has the dataset."""
    paper = published.ABLATION_AUROC.get(dataset.partition("-")[0])
    if paper is None:
        return table
    return table.assign(published_auroc=[paper.get(variant) for variant in table["variant"]])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.ablations",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    studies.add_common_arguments(parser)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    studies.add_carry_argument(parser)
    studies.add_worker_study_arguments(parser, "the unfinished units")
    args = parser.parse_args(argv)
    studies.check_carry_argument(parser, args)
    config, cohort, experiment_id, archive = studies.start_study(parser, args, "ablations", "ablation_runs")
    if args.workers > 1:
        train_in_workers(
            list(sys.argv[1:] if argv is None else argv),
            config,
            cohort,
            experiment_id,
            args.variants,
            args.workers,
            args.mlruns,
            args.deadline,
            archive,
        )
    records = run_variants(
        config, cohort, experiment_id, args.mlruns, args.variants, args.workers == 1, archive, args.carry
    )
    if args.train_only:
        return
    if records.empty:
        raise SystemExit(f"no ablation run has finished in {args.mlruns} or {args.out}: nothing to tabulate")
    table = studies.results_table(records, ["variant"], TEST_METRICS + ("edge_recovery_auroc",))
    paired = paired_against_full(records, lambda run_id: archive.predictions(args.mlruns, run_id))
    tables = {
        "ablation_results": with_published(table, args.dataset),
        "ablation_paired": paired,
        "ablation_runs": archive.runs_table(records, ["variant", "split", "settings"]),
    }
    summary = studies.log_summary(
        experiment_id, "summary", tables, {}, {"study": STUDY, "kind": "summary", "dataset": args.dataset}
    )
    studies.write_tables(args.out, tables)
    for name in ("ablation_results", "ablation_paired"):
        print(f"{name}\n{studies.markdown(tables[name])}\n")
    print(f"summary run {summary} in experiment ablations-{args.dataset}")


if __name__ == "__main__":
    main()
