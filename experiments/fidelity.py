"""Feature-removal fidelity: are the values an explanation ranks highest the ones a model needs?

Per split k, all on the saved split k:

1. ``full``: GARLIC trained on all the data (train part), its best epoch chosen on validation, tested once. Its model
   is logged, so that a resumed study ranks with the very same model.
2. Importance: that full-data model of split k explains every stay of the cohort (the split's train, validation
   and test stays alike, since the reduced data set is a data set for all three parts). Methods: ``garlic`` (the
   built-in observation importance, garlic.explain.built_in), ``ig`` (Integrated Gradients, garlic.explain.integrated_gradients) and ``gbm``
   (model-agnostic, no GARLIC: each variable's grouped permutation importance for gradient boosting on per-stay
   summaries, fitted on the split's training part and measured on its validation part, given to every value of the
   variable; ``variable_importance``).
3. For each kept fraction f: per stay, keep the top f, the bottom f (per method) or a random f (once, shared by
   the methods; seeded by config seed, split and fraction) of the observed values, the rest made missing
   (garlic.explain.removal). Normalisation is refitted on the reduced training part, a fresh GARLIC is trained and
   selected exactly as in 1. and tested once on the reduced test part.

The paper's claim: full > top 50% > random 50% > bottom 50% in test AUROC/AUPRC; checked with Page's L test across
splits (garlic.evaluation.stats), and "top f is as good as full" with an equivalence test (TOST, ``EQUIVALENCE_MARGIN``):
paired on the same test stays (a reduced test part keeps every stay), the 90% bootstrap interval of top - full must
lie inside the margin, which is the two one-sided tests at 5% each. Which ranking keeps the most signal: each other
method's top f against the first method's, paired on the same test stays with a 95% bootstrap interval
(``fidelity_rankings``); every run's test metrics are in ``fidelity_runs``. Every condition on every split is one
MLflow run in the experiment ``fidelity-<dataset>`` (tags: study, condition, split, fraction, method, settings),
reused when already finished.

    python -m experiments.fidelity --dataset synthetic --splits 0 1 --max-epochs 3 --fractions 0.5

``--workers N`` runs the splits with an unfinished condition in N parallel processes, each this command narrowed to
its split (``garlic.training.workers``; ``--deadline MINUTES`` starts none after that), then writes the tables over the
splits whose conditions have all finished.

With ``--out``, that folder is also the study's run archive (``garlic.tracking.archive``: ``fidelity_runs`` and each
run's test risks): a split whose runs the store lacks is read from it when it has them all, so the tables are made
again from the repository alone.
"""

from __future__ import annotations

import argparse
import logging
import sys

import matplotlib.pyplot as plt
import mlflow
import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from garlic import studies
from garlic.config import Config
from garlic.data.batches import IrregularDataset, collate
from garlic.data.splits import Normalisation, Split
from garlic.evaluation import published
from garlic.evaluation.fit_and_test import TEST_METRICS, fit_and_test, split_parts
from garlic.evaluation.stats import page_trend, paired_comparisons, paired_difference
from garlic.explain.built_in import explain
from garlic.explain.integrated_gradients import DEFAULT_STEPS, ig_importance
from garlic.explain.removal import keep_mask, reduce
from garlic.methods.garlic import GarlicEstimator
from garlic.methods.saved import fitted_on, load_predictor, log_method
from garlic.methods.summary import STATISTICS, SummaryModel
from garlic.models.compact import Garlic
from garlic.tracking import queries
from garlic.tracking.archive import RunArchive, Unit
from garlic.tracking.run_contract import GARLIC
from garlic.training.device import resolve_device
from garlic.training.workers import Job, run_jobs

log = logging.getLogger("experiments.fidelity")

STUDY = "fidelity"
METHODS = ("garlic", "ig", "gbm")
PERMUTATION_REPEATS = 5
CLAIMED_ORDER = ["full", "top", "random", "bottom"]
# How far top f may fall from (or rise above) full and still count as "as good" (TOST). Ours: the summaries of the
# paper we have do not state its margin. 0.01 AUROC is about the spread of one model over seeds on P12.
EQUIVALENCE_MARGIN = {"auroc": 0.01, "auprc": 0.02}


def importance_map(
    model: Garlic, dataset: IrregularDataset, method: str, ig_steps: int = DEFAULT_STEPS, batch_size: int = 128
) -> np.ndarray:
    """[N, T, D] observation importance of every stay of ``dataset`` under ``method`` ('garlic' or 'ig')."""
    tensors = dataset.tensors
    importance = np.zeros(tensors.values.shape, dtype="float32")
    order = np.argsort(tensors.lengths, kind="stable")  # similar lengths together: little padding per batch
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = collate([dataset[int(i)] for i in rows])
        if method == "garlic":
            scores = explain(model, batch, tensors.variables).observation
        elif method == "ig":
            scores = ig_importance(model, batch, ig_steps)
        else:
            raise ValueError(f"unknown importance method {method!r} for a GARLIC model; choose 'garlic' or 'ig'")
        importance[rows, : scores.shape[1]] = scores.cpu().numpy()
    return importance


def variable_importance(
    train: IrregularDataset, validation: IrregularDataset, seed: int, repeats: int = PERMUTATION_REPEATS
) -> np.ndarray:
    """[D] each variable's grouped permutation importance for gradient boosting on per-stay summaries
    (``SummaryModel("gbm")``, fitted on ``train``): the mean drop in ``validation`` AUROC when the variable's six
    summaries are shuffled together across stays. It sees no time: every value of a variable ranks alike."""
    model = SummaryModel("gbm", seed=seed).fit(train, validation)
    features, labels = model.features(validation), validation.labels.numpy()
    variables = len(validation.tensors.variables)

    def auroc(table: np.ndarray) -> float:
        return roc_auc_score(labels, model.model_.predict_proba(table[:, model.kept_])[:, 1])

    full, generator = auroc(features), np.random.default_rng(seed)
    drops = np.zeros(variables)
    for variable in range(variables):
        columns = [statistic * variables + variable for statistic in range(len(STATISTICS))]  # ``summary_features``
        for _ in range(repeats):
            shuffled = features.copy()
            shuffled[:, columns] = features[generator.permutation(len(features))][:, columns]
            drops[variable] += (full - auroc(shuffled)) / repeats
    return drops


def random_seed(config: Config, split: Split, fraction: float) -> list[int]:
    """The random condition's seed: fixed by config seed, split and fraction, so a resumed study draws the same."""
    return [config.seed, split.index, round(fraction * 1000)]


class FidelityStudy:
    """The conditions of one data set, run split by split; ``records`` collects one row per (condition, split)."""

    def __init__(
        self,
        config: Config,
        cohort: studies.Cohort,
        experiment_id: str,
        store,
        methods,
        fractions,
        ig_steps: int = DEFAULT_STEPS,
        train: bool = True,
        archive: RunArchive | None = None,
    ):
        """Without ``train``, ``run`` only gathers the splits whose conditions have all finished, in the store or
        all in the ``archive``."""
        self.config, self.cohort, self.experiment_id, self.store = config, cohort, experiment_id, store
        self.archive = archive
        self.methods, self.fractions, self.ig_steps, self.train = list(methods), sorted(fractions), ig_steps, train
        self.records: list[dict] = []

    def plan(self) -> list[tuple[str, str, float]]:
        """(condition, method, fraction) of every run a split needs, the full-data model first."""
        return [("full", "garlic", 1.0)] + [
            (condition, method, fraction)
            for fraction in self.fractions
            for condition, method in [("random", "random")] + [(c, m) for m in self.methods for c in ("top", "bottom")]
        ]

    def finished_runs(self, split: Split) -> list[mlflow.entities.Run | None]:
        """The finished run of each of ``plan()`` on ``split``, None where there is none yet."""
        return [
            queries.finished_run(self.experiment_id, {k: str(v) for k, v in self.tags(split, *unit).items()})
            for unit in self.plan()
        ]

    def archived_runs(self, split: Split) -> list[dict | None]:
        """The archived run of each of ``plan()`` on ``split``, None where the archive has none."""
        if self.archive is None:
            return [None] * len(self.plan())
        return [
            self.archive.row(
                split=split.index,
                condition=condition,
                method=method,
                fraction=fraction,
                settings=self.tags(split, condition, method, fraction)["settings"],
            )
            for condition, method, fraction in self.plan()
        ]

    def from_archive(self, split: Split) -> list[dict] | None:
        """The split's runs from the archive when the store lacks one of them and the archive has them all (the
        archive cannot rank: a split is taken whole from one place), else None."""
        if all(run is not None for run in self.finished_runs(split)):
            return None
        kept = self.archived_runs(split)
        return kept if all(row is not None for row in kept) else None

    def tags(self, split: Split, condition: str, method: str, fraction: float) -> dict:
        # told apart as GARLIC's units are: a config key added since a unit was archived leaves its digest alone
        settings = queries.identifying_config(self.config) | ({"ig_steps": self.ig_steps} if method == "ig" else {})
        return {
            "study": STUDY,
            "dataset": self.config.dataset,
            "condition": condition,
            "split": split.index,
            "fraction": f"{fraction:g}",
            "method": method,
            "settings": queries.settings_digest(settings),
        }

    def _record(self, split: Split, condition: str, method: str, fraction: float, metrics: dict, run_id: str) -> None:
        settings = self.tags(split, condition, method, fraction)["settings"]
        self.records.append(
            {
                "split": split.index,
                "method": method,
                "condition": condition,
                "fraction": fraction,
                "run_id": run_id,
                "settings": settings,
                **metrics,
            }
        )

    def run_split(self, split: Split) -> None:
        tensors, config = self.cohort.tensors, self.config
        trained: dict[str, Garlic] = {}

        def full() -> dict[str, float]:
            mlflow.log_params(config.to_dict() | {"split_name": split.name})
            estimator = GarlicEstimator.of_run(config, self.cohort.planted, explain=False)
            parts = split_parts(tensors, split)
            metrics = fit_and_test(estimator, parts)
            log_method(fitted_on(GARLIC, estimator, config, parts["train"]))  # ranked with when the split resumes
            trained["model"] = estimator.model
            return metrics

        tags = self.tags(split, "full", "garlic", 1.0)
        metrics, full_run, reused = studies.resumable(self.experiment_id, tags, f"full/split_{split.index}", full)
        self._record(split, "full", "garlic", 1.0, metrics, full_run)
        importance: dict[str, np.ndarray] = {}

        def ranking(method: str) -> np.ndarray:
            """Importance from the full-data model of this split (``gbm``: from the split's training and validation
            parts), computed once and only when a condition needs it."""
            if method in importance:
                return importance[method]
            log.info("split %d: %s importance of %d stays", split.index, method, len(tensors))
            if method == "gbm":
                parts = split_parts(tensors, split)
                weights = variable_importance(parts["train"], parts["validation"], config.seed)
                importance[method] = np.where(tensors.mask, weights.astype("float32"), np.float32(0))
                return importance[method]
            if "model" not in trained:  # the full run was found finished: rank with the model it logged
                trained["model"] = load_predictor(full_run, self.store).model.to(resolve_device(config.device))
            cohort = IrregularDataset(tensors, split.normalisation)
            importance[method] = importance_map(trained["model"], cohort, method, self.ig_steps)
            return importance[method]

        for condition, method, fraction in self.plan()[1:]:  # after the full-data model

            def reduced(condition=condition, method=method, fraction=fraction) -> dict[str, float]:
                scores = None if condition == "random" else ranking(method)
                keep = keep_mask(tensors.mask, scores, fraction, condition, random_seed(config, split, fraction))
                smaller = reduce(tensors, keep)
                normalisation = Normalisation.fit(smaller.subset(split.positions(smaller, "train")))
                kept_share = float(keep.sum() / max(tensors.mask.sum(), 1))
                mlflow.log_params(
                    config.to_dict()
                    | {"split_name": split.name, "full_run": full_run, "kept_share_of_observed": kept_share}
                )
                estimator = GarlicEstimator.of_run(config, explain=False)
                return fit_and_test(estimator, split_parts(smaller, split, normalisation))

            tags = self.tags(split, condition, method, fraction)
            name = f"{condition}-{method}-{fraction:g}/split_{split.index}"
            metrics, run_id, _ = studies.resumable(self.experiment_id, tags, name, reduced)
            self._record(split, condition, method, fraction, metrics, run_id)

    def run(self) -> pd.DataFrame:
        for split in self.cohort.splits:
            kept = self.from_archive(split)
            if kept is not None:
                self.records += kept
                continue
            if self.train:
                self.run_split(split)
                continue
            found = self.finished_runs(split)
            if any(run is None for run in found):
                log.warning(
                    "split %d: %d of %d conditions unfinished; left out",
                    split.index,
                    sum(run is None for run in found),
                    len(found),
                )
                continue
            for (condition, method, fraction), run in zip(self.plan(), found):
                self._record(split, condition, method, fraction, dict(run.data.metrics), run.info.run_id)
        return pd.DataFrame(self.records)


def condition_table(records: pd.DataFrame, method: str, fraction: float, metric: str) -> pd.DataFrame:
    """Rows: splits; columns: full, top, random, bottom (the ranking method's top/bottom, the shared random)."""
    wanted = (records["condition"] == "full") | (
        (records["fraction"] == fraction) & ((records["method"] == method) | (records["condition"] == "random"))
    )
    return records[wanted].pivot_table(index="split", columns="condition", values=metric)[CLAIMED_ORDER]


def ordering_tests(records: pd.DataFrame, methods, fractions) -> pd.DataFrame:
    """Page's L test of full > top > random > bottom, and the neighbouring pairs, per method, fraction and metric."""
    rows = []
    for method in methods:
        for fraction in fractions:
            for metric in ("test_auroc", "test_auprc"):
                table = condition_table(records, method, fraction, metric)
                page = page_trend(table, CLAIMED_ORDER)
                pairs = paired_comparisons(table, CLAIMED_ORDER)
                agreeing = "; ".join(f"{r.better}>{r.worse} {r.splits_agreeing}/{r.splits}" for r in pairs.itertuples())
                rows.append(
                    {
                        "method": method,
                        "fraction": fraction,
                        "metric": metric.removeprefix("test_"),
                        "splits": page.n_blocks,
                        "page_L": page.statistic,
                        "page_L_max": page.n_blocks * sum(j * j for j in range(1, len(CLAIMED_ORDER) + 1)),
                        "p_value": float(f"{page.p_value:.4g}"),
                        "pairs_agreeing": agreeing,
                    }
                )
    return pd.DataFrame(rows)


def _units(records: pd.DataFrame, predictions: studies.Predictions) -> dict[tuple, list[Unit]]:
    """The runs of ``records`` with their test predictions, by (condition, method, fraction); ``full`` by
    ("full",)."""
    groups: dict[tuple, list[Unit]] = {}
    for row in records.itertuples():
        key = ("full",) if row.condition == "full" else (row.condition, row.method, row.fraction)
        unit = Unit(row.condition, "fidelity", int(row.split), None, row.run_id, "", {}, predictions(row.run_id))
        groups.setdefault(key, []).append(unit)
    return groups


def equivalence_tests(records: pd.DataFrame, methods, fractions, predictions: studies.Predictions) -> pd.DataFrame:
    """TOST of top f against full, per method, fraction and metric: the mean over splits of top - full on the same
    test stays, its 90% bootstrap interval over those stays, and "equivalent" when the interval lies inside
    +/- ``EQUIVALENCE_MARGIN`` ("not shown" otherwise: too wide an interval, or a real difference)."""
    units = _units(records, predictions)
    full = units[("full",)]
    rows = []
    for method in methods:
        for fraction in fractions:
            top = units.get(("top", method, fraction), [])
            for metric, margin in EQUIVALENCE_MARGIN.items():
                paired = paired_difference(top, full, metric, level=0.90)
                inside = -margin < paired["ci_low"] and paired["ci_high"] < margin
                rows.append(
                    {
                        "method": method,
                        "fraction": fraction,
                        "metric": metric,
                        "splits": len(top),
                        "top_minus_full": round(paired["difference"], 4),
                        "ci90_low": round(paired["ci_low"], 4),
                        "ci90_high": round(paired["ci_high"], 4),
                        "margin": margin,
                        "verdict": "equivalent" if inside else "not shown",
                    }
                )
    return pd.DataFrame(rows)


def ranking_comparison(records: pd.DataFrame, methods, fractions, predictions: studies.Predictions) -> pd.DataFrame:
    """Which ranking keeps the most signal: each other method's top f against the first method's (the built-in
    importance), paired on the same test stays (a reduced test part keeps every stay): the mean difference over
    splits and its 95% bootstrap interval (an interval holding 0 is a tie)."""
    if len(methods) < 2:
        return pd.DataFrame(
            columns=["method", "against", "fraction", "metric", "splits", "difference", "ci_low", "ci_high", "verdict"]
        )
    units = _units(records, predictions)
    rows = []
    for method in methods[1:]:
        for fraction in fractions:
            ours, theirs = units.get(("top", method, fraction), []), units.get(("top", methods[0], fraction), [])
            for metric in ("auroc", "auprc"):
                rows.append(
                    {
                        "method": method,
                        "against": methods[0],
                        "fraction": fraction,
                        "metric": metric,
                        "splits": len(ours),
                        **paired_difference(ours, theirs, metric),
                    }
                )
    return pd.DataFrame(rows).round({"difference": 4, "ci_low": 4, "ci_high": 4})


def runs_table(records: pd.DataFrame) -> pd.DataFrame:
    """Every run's test metrics, so that the tables can be read without the store."""
    columns = ["split", "method", "condition", "fraction", "run_id", "settings", *TEST_METRICS]
    return records[columns].sort_values(["split", "condition", "method", "fraction"]).reset_index(drop=True)


def results_table(records: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Mean +/- std over splits per method, condition and fraction; on P12 the published IMV-LSTM trial beside the
    full and 50% rows (``published.FIDELITY``, AUROC / AUPRC)."""
    ordered = records.assign(order=records["condition"].map(CLAIMED_ORDER.index))
    ordered = ordered.sort_values(["fraction", "order", "method"], ascending=[False, True, True], kind="stable")
    table = studies.results_table(ordered, ["method", "condition", "fraction"])
    paper = published.FIDELITY.get(dataset)
    if paper is None:
        return table
    shown = [
        f"{paper[c][0]:.3f} / {paper[c][1]:.3f}" if c == "full" or f == 0.5 else None
        for c, f in zip(table["condition"], table["fraction"])
    ]
    return table.assign(published_imv_lstm=shown)


def fraction_figure(records: pd.DataFrame, methods) -> plt.Figure:
    """Test AUROC and AUPRC against the kept fraction: top / bottom per method, random, and the full-data model."""
    metrics = ("test_auroc", "test_auprc")
    figure, axes = plt.subplots(
        len(metrics), len(methods), figsize=(4.5 * len(methods), 3.6 * len(metrics)), squeeze=False
    )
    full = records[records["condition"] == "full"]
    for row, metric in enumerate(metrics):
        for column, method in enumerate(methods):
            axis = axes[row, column]
            for condition, colour in (("top", "tab:green"), ("random", "tab:grey"), ("bottom", "tab:red")):
                chosen = records[
                    (records["condition"] == condition) & ((records["method"] == method) | (condition == "random"))
                ]
                summary = chosen.groupby("fraction")[metric].agg(["mean", "std"]).fillna(0.0)
                axis.errorbar(
                    summary.index,
                    summary["mean"],
                    yerr=summary["std"],
                    marker="o",
                    capsize=3,
                    color=colour,
                    label=condition,
                )
            mean, std = full[metric].mean(), full[metric].std(ddof=0)
            axis.axhline(mean, color="tab:blue", label="full data")
            axis.axhspan(mean - std, mean + std, color="tab:blue", alpha=0.12)
            axis.set(
                xlabel="kept fraction of observed values",
                ylabel=metric.removeprefix("test_").upper(),
                title=f"ranked by {method}",
            )
            axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.fidelity", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    studies.add_common_arguments(parser)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.5], help="kept fractions, e.g. 0.1 0.3 0.5")
    parser.add_argument("--ig-steps", type=int, default=DEFAULT_STEPS, help="Integrated Gradients path steps")
    studies.add_worker_study_arguments(parser, "the unfinished splits")
    args = parser.parse_args(argv)
    config, cohort, experiment_id, archive = studies.start_study(parser, args, STUDY, "fidelity_runs")
    runner = FidelityStudy(
        config,
        cohort,
        experiment_id,
        args.mlruns,
        args.methods,
        args.fractions,
        args.ig_steps,
        train=args.workers == 1,
        archive=archive,
    )
    if args.workers > 1:
        argv = list(sys.argv[1:] if argv is None else argv)
        jobs = []
        for split in cohort.splits:
            if runner.from_archive(split) is None and any(run is None for run in runner.finished_runs(split)):
                unit = f"fidelity-{args.dataset}-split_{split.index}-{queries.settings_digest(config.to_dict())}"
                command = [
                    sys.executable,
                    "-m",
                    "experiments.fidelity",
                    *argv,
                    "--splits",
                    str(split.index),
                    "--workers",
                    "1",
                    "--train-only",
                ]
                jobs.append(
                    Job(
                        f"split_{split.index}",
                        command,
                        args.mlruns / "locks" / unit,
                        args.mlruns / "logs" / f"{unit}.log",
                    )
                )
        run_jobs(jobs, args.workers, args.deadline)
    records = runner.run()
    if args.train_only:
        return

    def predictions(run_id: str) -> pd.DataFrame:
        return archive.predictions(args.mlruns, run_id)

    if records.empty:
        raise SystemExit(f"no split of the fidelity study has finished in {args.mlruns}: nothing to tabulate")
    tables = {
        "fidelity_results": results_table(records, args.dataset),
        "fidelity_ordering": ordering_tests(records, args.methods, runner.fractions),
        "fidelity_equivalence": equivalence_tests(records, args.methods, runner.fractions, predictions),
        "fidelity_rankings": ranking_comparison(records, args.methods, runner.fractions, predictions),
        "fidelity_runs": archive.runs_table(
            runs_table(records), ["split", "method", "condition", "fraction", "settings"]
        ),
    }
    summary = studies.log_summary(
        experiment_id,
        "summary",
        tables,
        {"fidelity_by_fraction.png": fraction_figure(records, args.methods)},
        {"study": STUDY, "kind": "summary", "dataset": args.dataset},
    )
    studies.write_tables(args.out, tables)
    for name, table in tables.items():
        print(f"\n{name}\n{studies.markdown(table)}")
    print(f"\nsummary run {summary} in experiment {STUDY}-{args.dataset}")


if __name__ == "__main__":
    main()
