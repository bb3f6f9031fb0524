"""Figures logged with every run: ROC and precision-recall curves, reliability diagram, learned graph; and the
alert burden curves of hourly runs."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.metrics import precision_recall_curve, roc_curve  # noqa: E402

from garlic.metrics import binary_metrics  # noqa: E402


def roc_pr_figure(labels: np.ndarray, probabilities: np.ndarray) -> plt.Figure:
    scores = binary_metrics(labels, probabilities)
    figure, (roc, pr) = plt.subplots(1, 2, figsize=(9, 4))
    fpr, tpr, _ = roc_curve(labels, probabilities)
    roc.plot(fpr, tpr, label=f"AUROC {scores['auroc']:.3f}")
    roc.plot([0, 1], [0, 1], linestyle="--", color="grey")
    roc.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC")
    precision, recall, _ = precision_recall_curve(labels, probabilities)
    pr.plot(recall, precision, label=f"AUPRC {scores['auprc']:.3f}")
    pr.axhline(np.mean(labels), linestyle="--", color="grey")
    pr.set(xlabel="recall", ylabel="precision", title="Precision-recall")
    for axis in (roc, pr):
        axis.legend(loc="lower right" if axis is roc else "upper right")
    figure.tight_layout()
    return figure


def reliability_figure(labels: np.ndarray, probabilities: np.ndarray, bins: int = 10) -> plt.Figure:
    which = np.minimum((np.asarray(probabilities) * bins).astype(int), bins - 1)
    count = np.bincount(which, minlength=bins)
    filled = count > 0
    observed = np.bincount(which, labels, bins)[filled] / count[filled]
    predicted = np.bincount(which, probabilities, bins)[filled] / count[filled]
    scores = binary_metrics(labels, probabilities)
    figure, axis = plt.subplots(figsize=(4.5, 4.5))
    axis.plot([0, 1], [0, 1], linestyle="--", color="grey")
    axis.plot(predicted, observed, marker="o", label=f"ECE {scores['ece']:.3f}, Brier {scores['brier']:.3f}")
    axis.set(xlabel="predicted risk", ylabel="observed rate", title="Calibration", xlim=(0, 1), ylim=(0, 1))
    axis.legend(loc="upper left")
    figure.tight_layout()
    return figure


def burden_figure(curves: dict, chosen: dict, title: str) -> plt.Figure:
    """Per method (``curves``: name -> a frame of ``threshold, sensitivity, ppv, alerts_per_100_days``, one row
    a threshold of its alert policy), sensitivity and PPV against alerts per 100 patient-days, each method's chosen
    operating point (``chosen``: name -> (alerts per 100 days, sensitivity, PPV)) marked: what a bedside team
    looks at to pick its burden."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), sharex=True)
    for index, (name, curve) in enumerate(curves.items()):
        color = f"C{index}"
        shown = curve[(curve["alerts_per_100_days"] > 0) & np.isfinite(curve["alerts_per_100_days"])]
        left.plot(shown["alerts_per_100_days"], shown["sensitivity"], color=color, label=name)
        right.plot(shown["alerts_per_100_days"], shown["ppv"], color=color, label=name)
        if name in chosen:
            burden, sensitivity, ppv = chosen[name]
            left.plot([burden], [sensitivity], marker="o", color=color, markeredgecolor="black")
            right.plot([burden], [ppv], marker="o", color=color, markeredgecolor="black")
    left.set(
        xscale="log",
        xlabel="alerts per 100 patient-days",
        ylabel="sensitivity (septic stays with a true alert)",
        ylim=(0, 1),
        title="Sensitivity",
    )
    right.set(
        xscale="log",
        xlabel="alerts per 100 patient-days",
        ylabel="PPV (true alerts / alerts)",
        ylim=(0, 1),
        title="PPV",
    )
    left.legend(loc="upper left", fontsize="small")
    figure.suptitle(f"{title}; dots: the operating point chosen on validation")
    figure.tight_layout()
    return figure


def graph_figure(adjacency: np.ndarray, variables: list[str]) -> plt.Figure:
    """Heat map of the learned adjacency: row = source variable, column = target variable."""
    size = max(5.0, 0.22 * len(variables))
    figure, axis = plt.subplots(figsize=(size + 1, size))
    limit = float(np.abs(adjacency).max()) or 1.0
    image = axis.imshow(adjacency, cmap="RdBu_r", vmin=-limit, vmax=limit)
    axis.set_xticks(range(len(variables)), variables, rotation=90, fontsize=7)
    axis.set_yticks(range(len(variables)), variables, fontsize=7)
    axis.set(xlabel="target", ylabel="source", title="Learned variable graph")
    figure.colorbar(image, ax=axis, shrink=0.8)
    figure.tight_layout()
    return figure


def edges_figure(variables: list[str], edges: list[tuple[int, int, float]], title: str) -> plt.Figure:
    """The variables on a circle and ``edges`` (source index, target index, line width) as arrows between them."""
    angle = np.linspace(0, 2 * np.pi, len(variables), endpoint=False)
    x, y = np.cos(angle), np.sin(angle)
    figure, axis = plt.subplots(figsize=(6, 6))
    for i, j, width in edges:
        axis.annotate(
            "", xy=(x[j], y[j]), xytext=(x[i], y[i]), arrowprops={"arrowstyle": "->", "lw": width, "alpha": 0.7}
        )
    axis.scatter(x, y, s=30, color="tab:orange", zorder=3)
    for name, px, py in zip(variables, x, y):
        axis.text(px * 1.1, py * 1.1, name, ha="center", va="center", fontsize=7)
    axis.set(title=title, xlim=(-1.3, 1.3), ylim=(-1.3, 1.3))
    axis.axis("off")
    return figure
