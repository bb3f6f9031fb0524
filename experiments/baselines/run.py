"""Every baseline (and GARLIC itself) on the same saved splits, in one table.

Methods (``--methods``; default: every one of the registry, ``garlic.methods.registry``, that needs no optional extra):
- ``saps``, ``sofa``: the SAPS-I and SOFA scores of the outcomes file (PhysioNet 2012 only), mapped to a risk by a
  logistic fit on the training part;
- ``logreg``, ``gbm``: logistic regression and gradient boosting on per-stay summary features (first, last, min,
  max, mean and count of each variable); ``logreg_static``, ``gbm_static``: the same with the dataset's static
  features (P12: age, gender, height, ICU type, weight) beside them;
- ``grud``: GRU-D; ``decay_gru``: decay imputation + GRU, without the graph;
- ``garlic``: the full model with the dataset's preset, for reference;
- ``pypots_raindrop``, ``pypots_seft``, ``pypots_brits``: the field's models from PyPOTS
  (``garlic.methods.field``; the ``pypots`` extra), when named;
- any method registered later (``docs/adding-a-model.md``).

Each method on each split is one MLflow run in the experiment ``baselines-<dataset>`` (tags: study, method, split,
settings), reused when already finished. The table holds mean +/- std over splits of test AUROC, AUPRC, Brier and
ECE, ECE and Brier after temperature scaling fitted on validation, and the paper's published numbers where they
exist (labelled "paper"; left blank otherwise rather than guessed).

    python -m experiments.baselines --dataset synthetic --splits 0 1 --max-epochs 3
"""
from __future__ import annotations

import argparse
import logging

import mlflow
import pandas as pd
import pyarrow.parquet as pq

from experiments import published, study
from garlic.config import Config
from garlic.data.datasets import processed_folder
from garlic.evaluation.fit_and_test import fit_and_test, split_parts
from garlic.methods import registry
from garlic.methods.contract import Method
from garlic.tracking.run_contract import manifest_digest
from garlic.io.tables import LABELS, read_manifest

STUDY = "baseline"


class Baselines:
    """The registered methods (``garlic.methods.registry``) on a cohort's splits, each unit a resumable MLflow run."""

    def __init__(self, config: Config, cohort: study.Cohort, experiment_id: str, data_root):
        self.config, self.cohort, self.experiment_id = config, cohort, experiment_id
        folder = processed_folder(config.dataset, data_root)
        self.context = registry.MethodContext(config, pq.read_table(folder / LABELS).to_pandas())
        self.data_digest = manifest_digest(read_manifest(folder))  # a run on other data is never reused

    def available(self, methods: list[str]) -> list[str]:
        """``methods`` less those the dataset cannot feed (the severity scores: only PhysioNet 2012 ships them)."""
        missing = [m for m in methods if not registry.method(m).available(self.context.labels)]
        if missing:
            logging.getLogger("experiments").warning("%s has no column for %s; skipped", self.config.dataset, missing)
        return [m for m in methods if m not in missing]

    def settings(self, method: str) -> dict:
        return registry.method(method).settings(self.context)

    def method(self, name: str) -> Method:
        """A fresh, unfitted ``name`` (a method of ``garlic.evaluation.fit_and_test``)."""
        return registry.method(name).create(self.context)

    def run(self, methods: list[str], train: bool = True, skip: set[tuple[str, int]] = frozenset()) -> pd.DataFrame:
        """One record per method and split: reused from a finished run of the experiment, else fitted and tested
        (with ``train`` False, left out); a (method, split index) in ``skip`` (found elsewhere) is left out."""
        records = []
        for method in self.available(methods):
            for split in self.cohort.splits:
                if (method, split.index) in skip:
                    continue
                def work(method=method, split=split) -> dict[str, float]:
                    mlflow.log_params(self.settings(method) | {"split_name": split.name})
                    return fit_and_test(self.method(method), split_parts(self.cohort.tensors, split))

                tags = {"study": STUDY, "dataset": self.config.dataset, "data_digest": self.data_digest,
                        "method": method, "split": split.name,
                        "settings": study.settings_digest(self.settings(method))}  # fmt: skip
                if not train and study.finished_run(self.experiment_id, tags) is None:
                    continue
                metrics, run_id, _ = study.resumable(self.experiment_id, tags, f"{method}/split_{split.index}", work)
                records.append({"method": method, "split": split.index, "run_id": run_id, **metrics})
        return pd.DataFrame(records)


def with_paper_numbers(table: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """The GARLIC paper's own numbers on ``dataset`` (``published.RESULTS``, "mean ± std" in percent) beside the
    ``garlic`` row."""
    paper = next((row for row in published.RESULTS.get(dataset, []) if row.method == "published: GARLIC"), None)
    percent = lambda pair: f"{100 * pair[0]:.2f} ± {100 * pair[1]:.2f}"  # noqa: E731
    numbers = {"paper_auroc": percent(paper.auroc), "paper_auprc": percent(paper.auprc)} if paper else {}
    paper = pd.DataFrame([numbers if method == "garlic" else {} for method in table["method"]],
                         columns=["paper_auroc", "paper_auprc"])  # fmt: skip
    return pd.concat([table.reset_index(drop=True), paper], axis=1)


def main(argv: list[str] | None = None) -> None:
    registered = "\n".join(f"  {name}: {spec.description}" for name, spec in registry.METHODS.items())
    parser = argparse.ArgumentParser(prog="python -m experiments.baselines", description=__doc__,
                                     epilog=f"registered methods (garlic.methods.registry):\n{registered}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    study.add_common_arguments(parser)
    parser.add_argument("--methods", nargs="+", choices=list(registry.METHODS), default=registry.core_methods())
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    config = study.study_config(args)
    cohort = study.load_cohort(args.dataset, args.data_root, config.split_protocol, args.splits)
    experiment_id = study.open_experiment(f"baselines-{args.dataset}", args.mlruns)
    records = Baselines(config, cohort, experiment_id, args.data_root).run(args.methods)
    table = with_paper_numbers(study.results_table(records, ["method"]), args.dataset)
    tables = {"baseline_results": table}
    summary = study.log_summary(experiment_id, "summary", tables, {},
                                {"study": STUDY, "kind": "summary", "dataset": args.dataset})  # fmt: skip
    study.write_tables(args.out, tables)
    print(f"baseline_results (test metrics; paper numbers in %)\n{study.markdown(table)}\n\n"
          f"summary run {summary} in experiment baselines-{args.dataset}")


if __name__ == "__main__":
    main()
