"""Tests of a claimed ordering of conditions measured on the same splits (each split is a block).

- Page's L test: one test of "condition 1 > condition 2 > ... > condition k" across all splits. Within each split
  the conditions are ranked 1 (worst) .. k (best, ties averaged); L = sum_j j * R_j, where R_j is the rank sum of
  the condition predicted to be j-th worst. A perfect ordering in every split gives the largest L, n * sum_j j^2.
- Paired comparisons of neighbours in the claimed order: mean difference, the number of splits where it holds and a
  one-sided paired t-test. With five splits these are descriptive rather than conclusive; Page's L is the test.

And the paired comparison every table and study makes of two methods on the same test stays
(``paired_difference``: the mean difference over splits, with a bootstrap interval over test stays).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from garlic.tracking.archive import Unit

# Resamples of the test stays behind every paired interval.
BOOTSTRAP = 1000


@dataclass
class PageResult:
    statistic: float  # Page's L
    p_value: float  # one-sided, for the claimed ordering
    method: str  # "exact" or "asymptotic" (scipy chooses exact for small designs)
    n_blocks: int
    n_conditions: int

    def __str__(self) -> str:
        return (
            f"Page's L = {self.statistic:g} over {self.n_blocks} splits x {self.n_conditions} conditions, "
            f"one-sided p = {self.p_value:.4g} ({self.method})"
        )


def page_l(scores: np.ndarray) -> float:
    """Page's L for ``scores`` [blocks, conditions] whose columns are in the predicted *increasing* order."""
    ranks = stats.rankdata(np.asarray(scores, dtype=float), axis=1)
    return float((np.arange(1, ranks.shape[1] + 1) * ranks.sum(axis=0)).sum())


def page_trend(table: pd.DataFrame, best_to_worst: list[str]) -> PageResult:
    """Page's test of ``best_to_worst[0] > best_to_worst[1] > ...`` on ``table`` (rows: splits, columns: conditions)."""
    increasing = table[list(reversed(best_to_worst))].to_numpy(dtype=float)
    if len(increasing) < 2:  # a screening split: L is defined, a test of it is not (scipy refuses one block)
        return PageResult(page_l(increasing), float("nan"), "not tested: one split", *increasing.shape)
    result = stats.page_trend_test(increasing)
    return PageResult(float(result.statistic), float(result.pvalue), result.method, *increasing.shape)


def paired_comparisons(table: pd.DataFrame, best_to_worst: list[str]) -> pd.DataFrame:
    """One row per neighbouring pair (better, worse): mean and std of the difference, splits agreeing, paired t p."""
    rows = []
    for better, worse in zip(best_to_worst, best_to_worst[1:]):
        difference = table[better].to_numpy(dtype=float) - table[worse].to_numpy(dtype=float)
        p_value = (
            stats.ttest_rel(table[better], table[worse], alternative="greater").pvalue
            if len(difference) > 1 and difference.std() > 0
            else float("nan")
        )
        rows.append(
            {
                "better": better,
                "worse": worse,
                "mean_difference": difference.mean(),
                "std_difference": difference.std(),
                "splits_agreeing": int((difference > 0).sum()),
                "splits": len(difference),
                "paired_t_p": float(p_value),
            }
        )
    return pd.DataFrame(rows)


def mean_std(values) -> str:
    """``mean +/- std`` (population std over splits, as the runs module logs it), or ``-`` without values."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return "-"
    return f"{values.mean():.4f} ± {values.std():.4f}"


def weighted_auroc(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUROC of ``scores`` [n] for ``labels`` [n] under each row of stay weights ``weights`` [B, n] -> [B].

    A bootstrap resample is a row of counts, so B resamples cost a few array passes instead of B sorts. Tied
    scores count one half, as ``sklearn.metrics.roc_auc_score(..., sample_weight=row)`` counts them.
    """
    positive, negative = _grouped(scores, labels, weights, descending=False)
    below = np.cumsum(negative, axis=1) - negative
    with np.errstate(invalid="ignore", divide="ignore"):  # NaN for a row holding one class only
        return (positive * (below + negative / 2)).sum(1) / (positive.sum(1) * negative.sum(1))


def weighted_average_precision(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Average precision (sum over thresholds of recall gain x precision) under each row of ``weights`` -> [B],
    as ``sklearn.metrics.average_precision_score(..., sample_weight=row)``."""
    positive, negative = _grouped(scores, labels, weights, descending=True)
    true, false = np.cumsum(positive, axis=1), np.cumsum(negative, axis=1)
    precision = np.divide(true, true + false, out=np.zeros_like(true), where=(true + false) > 0)
    with np.errstate(invalid="ignore", divide="ignore"):  # NaN for a row without a positive
        return (positive * precision).sum(1) / positive.sum(1)


def _grouped(scores, labels, weights, descending: bool) -> tuple[np.ndarray, np.ndarray]:
    """Positive and negative weight [B, G] of each distinct score, in ascending (or descending) score order."""
    order = np.argsort(-scores if descending else scores, kind="stable")
    ordered = scores[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    weights = np.asarray(weights, dtype=float)[:, order]
    is_positive = np.asarray(labels, dtype=bool)[order]
    positive = np.add.reduceat(weights * is_positive, starts, axis=1)
    negative = np.add.reduceat(weights * ~is_positive, starts, axis=1)
    return positive, negative


def paired_difference(
    ours: list[Unit], theirs: list[Unit], metric: str, seed: int = 0, level: float = 0.95
) -> dict[str, float]:
    """Mean over ``ours`` of (ours - the baseline on the same split), with a ``level`` bootstrap interval over test
    stays.

    Each resample draws every split's test stays with replacement once (as counts) and scores both models on the
    same draw; a unit trained with several seeds on one split shares that split's draws. Where ``theirs`` has a
    unit of the same split and model seed (another preset), that one is the baseline.
    """
    score = weighted_auroc if metric == "auroc" else weighted_average_precision
    by_split = {u.split: u for u in theirs}
    by_unit = {(u.split, u.seed): u for u in theirs}
    generator = np.random.default_rng(seed)
    draws = {}
    for split, unit in by_split.items():
        stays = len(unit.predictions)
        draws[split] = generator.multinomial(stays, np.full(stays, 1 / stays), size=BOOTSTRAP)
    observed, resampled, identical = [], np.zeros(BOOTSTRAP), True
    for unit in ours:
        baseline = by_unit.get((unit.split, unit.seed), by_split[unit.split]).predictions
        joined = unit.predictions.merge(baseline, on="stay_id", suffixes=("", "_baseline"))
        same_stays = len(joined) == len(unit.predictions) == len(baseline)
        if not same_stays or not (joined["label"] == joined["label_baseline"]).all():
            raise ValueError(f"{unit.method} and the baseline do not share the test stays of split {unit.split}")
        joined = joined.set_index("stay_id").loc[baseline["stay_id"]]  # the order the draws count in
        labels, risk, other = (joined[c].to_numpy() for c in ("label", "risk", "risk_baseline"))
        identical &= bool(np.array_equal(risk, other))
        everyone = np.ones((1, len(labels)))
        observed.append(float(score(risk, labels, everyone)[0] - score(other, labels, everyone)[0]))
        resampled += score(risk, labels, draws[unit.split]) - score(other, labels, draws[unit.split])
    resampled /= len(ours)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(resampled[np.isfinite(resampled)], [tail, 100 - tail])  # a one-class draw scores nothing
    # The same risks on every split: nothing was compared (the two are one model), which a "tie" would hide.
    verdict = "identical" if identical else "win" if low > 0 else "loss" if high < 0 else "tie"
    return {"difference": float(np.mean(observed)), "ci_low": float(low), "ci_high": float(high), "verdict": verdict}


def paired_text(units: list[Unit], baseline: list[Unit], metric: str) -> str:
    """``units`` minus ``baseline`` in ``metric``, paired: ``+0.0012 [-0.0040, +0.0065] tie``."""
    paired = paired_difference(units, baseline, metric)
    return f"{paired['difference']:+.4f} [{paired['ci_low']:+.4f}, {paired['ci_high']:+.4f}] {paired['verdict']}"
