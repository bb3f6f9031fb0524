"""Ablations: the paper's variants of GARLIC, each a config switch, trained and tested on the same saved splits.

Every variant on every split is one MLflow run in the experiment ``ablations-<dataset>`` (tags: study, variant,
split, settings), reused when already finished. The final table (mean +/- std over splits of test AUROC, AUPRC,
Brier, ECE before/after temperature scaling, and on the synthetic cohort the planted-edge recovery AUROC) is
printed and logged as an artifact of a summary run.

    python -m experiments.ablations --dataset synthetic --splits 0 1 --max-epochs 3
"""
from __future__ import annotations

import argparse
import logging

import mlflow
import pandas as pd

from experiments import study
from garlic.config import Config
from garlic.estimator import GarlicEstimator
from garlic.pipeline import TEST_METRICS, fit_and_test, split_parts

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


def run_variants(config: Config, cohort: study.Cohort, experiment_id: str, variants: list[str]) -> pd.DataFrame:
    """One row per (variant, split) with its test metrics."""
    records = []
    for name in variants:
        variant = config.override(VARIANTS[name])
        for split in cohort.splits:
            def work(variant=variant, split=split) -> dict[str, float]:
                mlflow.log_params(variant.to_dict() | {"split_name": split.name})
                estimator = GarlicEstimator(variant, cohort.planted, explain=False, keep_model=False)
                return fit_and_test(estimator, split_parts(cohort.tensors, split))

            tags = {"study": STUDY, "dataset": config.dataset, "variant": name, "split": split.index,
                    "settings": study.settings_digest(variant.to_dict())}  # fmt: skip
            metrics, run_id, _ = study.resumable(experiment_id, tags, f"{name}/split_{split.index}", work)
            records.append({"variant": name, "split": split.index, "run_id": run_id, **metrics})
    return pd.DataFrame(records)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.ablations", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    study.add_common_arguments(parser)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    config = study.study_config(args)
    cohort = study.load_cohort(args.dataset, args.data_root, config.split_protocol, args.splits)
    experiment_id = study.open_experiment(f"ablations-{args.dataset}", args.mlruns)
    records = run_variants(config, cohort, experiment_id, args.variants)
    table = study.results_table(records, ["variant"], TEST_METRICS + ("edge_recovery_auroc",))
    tables = {"ablation_results": table}
    summary = study.log_summary(experiment_id, "summary", tables, {},
                                {"study": STUDY, "kind": "summary", "dataset": args.dataset})  # fmt: skip
    study.write_tables(args.out, tables)
    print(f"ablation_results\n{study.markdown(table)}\n\nsummary run {summary} in experiment ablations-{args.dataset}")


if __name__ == "__main__":
    main()
