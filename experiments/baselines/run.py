"""Every baseline (and GARLIC itself) on the same saved splits, in one table.

Methods (``--methods``; default: every one of the registry, ``garlic.methods.registry``, that needs no optional extra):
- ``saps``, ``sofa``: the SAPS-I and SOFA scores of the outcomes file (PhysioNet 2012 only), mapped to a risk by a
  logistic fit on the training part;
- ``logreg``, ``gbm``: logistic regression and gradient boosting on per-stay summary features (first, last, min,
  max, mean and count of each variable); ``logreg_static``, ``gbm_static``: the same with the dataset's static
  features (P12: age, gender, height, ICU type, weight) beside them;
- ``grud``: GRU-D; ``decay_gru``: decay imputation + GRU, without the graph;
- ``last_values``: logistic regression on each variable's last observed value (``garlic/methods/template.py``, the
  method a new one is copied from);
- ``garlic``: the full model with the dataset's preset, for reference;
- ``pypots_raindrop``, ``pypots_seft``, ``pypots_brits``: the field's models from PyPOTS
  (``garlic.methods.field``; the ``pypots`` extra), when named;
- any method registered later (``docs/adding-a-model.md``).

Each method on each split is one MLflow run in the dataset's experiment, tagged with its unit's identity
(``garlic.tracking.run_contract.UnitIdentity``), reused when any path finished it before (``garlic.studies.Baselines``);
the table's summary run is in the experiment ``baselines-<dataset>``. The table holds mean +/- std over splits of test AUROC, AUPRC, Brier and
ECE, ECE and Brier after temperature scaling fitted on validation, and the paper's published numbers where they
exist (labelled "paper"; left blank otherwise rather than guessed).

    python -m experiments.baselines --dataset synthetic --splits 0 1 --max-epochs 3
"""

from __future__ import annotations

import argparse
import logging

import pandas as pd

from garlic import studies
from garlic.evaluation import published
from garlic.methods import registry


def with_paper_numbers(table: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """The GARLIC paper's own numbers on ``dataset`` (``published.RESULTS``, "mean ± std" in percent) beside the
    ``garlic`` row."""
    paper = next((row for row in published.RESULTS.get(dataset, []) if row.method == "published: GARLIC"), None)
    percent = lambda pair: f"{100 * pair[0]:.2f} ± {100 * pair[1]:.2f}"  # noqa: E731
    numbers = {"paper_auroc": percent(paper.auroc), "paper_auprc": percent(paper.auprc)} if paper else {}
    paper = pd.DataFrame(
        [numbers if method == "garlic" else {} for method in table["method"]], columns=["paper_auroc", "paper_auprc"]
    )
    return pd.concat([table.reset_index(drop=True), paper], axis=1)


def main(argv: list[str] | None = None) -> None:
    registered = "\n".join(f"  {name}: {spec.description}" for name, spec in registry.METHODS.items())
    parser = argparse.ArgumentParser(
        prog="python -m experiments.baselines",
        description=__doc__,
        epilog=f"registered methods (garlic.methods.registry):\n{registered}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    studies.add_common_arguments(parser)
    parser.add_argument("--methods", nargs="+", choices=list(registry.METHODS), default=registry.core_methods())
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    config = studies.study_config(args)
    cohort = studies.load_cohort(args.dataset, args.data_root, config.split_protocol, args.splits)
    experiment_id = studies.open_experiment(f"baselines-{args.dataset}", args.mlruns)
    records = studies.Baselines(config, cohort, args.data_root, args.mlruns).run(args.methods)
    table = with_paper_numbers(studies.results_table(records, ["method"]), args.dataset)
    tables = {"baseline_results": table}
    summary = studies.log_summary(
        experiment_id,
        "summary",
        tables,
        {},
        {"study": studies.BASELINE_STUDY, "kind": "summary", "dataset": args.dataset},
    )
    studies.write_tables(args.out, tables)
    print(
        f"baseline_results (test metrics; paper numbers in %)\n{studies.markdown(table)}\n\n"
        f"summary run {summary} in experiment baselines-{args.dataset}"
    )


if __name__ == "__main__":
    main()
