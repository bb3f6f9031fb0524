"""Is GARLIC's learned variable graph an explanation or noise? Its stability over a protocol's runs, beside what the
data say without a model.

    python -m experiments.graph_study --dataset physionet2019-raindrop --protocol raindrop --preset physionet2019-cpu \\
        --mlruns STORE [STORE ...] --out docs/results

For every finished run of the preset on the protocol (each split and model seed; ``experiments.compare`` finds them
in the stores exactly as the comparison table does), the logged adjacency (``graph/adjacency.csv``) read as the
explanation reads it, the summary graph |A_ij| / sum_i |A_ij| (``garlic.explain.built_in.normalised_adjacency``):

- **stability**: for every pair of runs, how many of their ``--top`` strongest edges (source -> target, no
  self-loops) they share, beside what two random sets of that size share on average (top^2 / D(D - 1));
- **recurring edges**: the edges in the top of at least half of the runs, with how many runs and their mean weight;
- **the diagonal**: how much of each target's incoming weight is its own (a graph whose weight sits on the diagonal
  says little about other variables);
- **the data without a model**: the lag-one correlation of every pair over the first run's training stays (the
  source's last value before a step against the target's value observed at that step, values normalised with
  training statistics), its top edges by |correlation|, and how many of them the recurring model edges share.

Writes ``OUT/graph-<dataset>-<protocol>.md`` with the command, ``-pairs.csv`` (shared edges per pair of runs),
``-edges.csv`` (every off-diagonal edge: runs in whose top it is, mean weight, lag-one correlation) and
``-recurring.png``.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from garlic.data.batches import IrregularDataset  # noqa: E402
from garlic.data.datasets import ensure_processed  # noqa: E402
from garlic.data.splits import load_splits  # noqa: E402
from garlic.explain.built_in import normalised_adjacency  # noqa: E402
from garlic.io.atomic import atomic_file  # noqa: E402
from garlic.io.tensors import load_tensors  # noqa: E402
from garlic import studies  # noqa: E402
from garlic.tracking import plots, run_contract  # noqa: E402
from garlic.tracking.store import use_store  # noqa: E402

CORRELATION_STAYS = 5000  # training stays the lag-one correlations are computed on (the first run's split, seeded)


def run_graphs(runs: list[tuple[int, int, Path, mlflow.entities.Run]]) -> dict[str, np.ndarray]:
    """'split_<k>/seed_<s>' -> the summary graph [D, D] (row = source) of each of the finished ``runs``
    (``studies.preset_runs``: one at least), and 'variables' -> their names."""
    graphs = {}
    for index, seed, store, run in runs:
        use_store(store)
        path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=run_contract.GRAPH)
        adjacency = pd.read_csv(path, index_col=0)
        graphs[f"split_{index}/seed_{seed}"] = normalised_adjacency(torch.tensor(adjacency.to_numpy())).numpy()
        variables = list(adjacency.columns)
    return graphs | {"variables": variables}


def top_edges(weights: np.ndarray, top: int) -> set[tuple[int, int]]:
    """The ``top`` largest off-diagonal entries of [D, D] ``weights``, as (source, target)."""
    off = np.asarray(weights, dtype=float).copy()
    np.fill_diagonal(off, -np.inf)
    flat = np.argsort(off, axis=None)[::-1][:top]
    return {divmod(int(i), off.shape[1]) for i in flat}


def lag_one_correlation(dataset: IrregularDataset) -> np.ndarray:
    """[D, D]: Pearson correlation of source i's last value before step t (carried forward) with target j's value
    observed at step t, over every step of every stay where both exist (NaN for a pair that never does)."""
    values, mask = dataset.values.double(), dataset.mask.bool()
    steps = torch.arange(values.shape[1])[None, :, None]
    last = torch.where(mask, steps, -1).cummax(1).values  # each cell's latest observed step so far
    before = torch.cat([torch.full_like(last[:, :1], -1), last[:, :-1]], 1)  # ... strictly before the step
    source_seen = before >= 0
    source = values.gather(1, before.clamp(min=0)) * source_seen
    s, ms = source.reshape(-1, values.shape[2]), source_seen.reshape(-1, values.shape[2]).double()
    t, mt = (values * mask).reshape(-1, values.shape[2]), mask.reshape(-1, values.shape[2]).double()
    n = ms.T @ mt  # pairs counted per (source, target)
    sum_s, sum_t = s.T @ mt, ms.T @ t
    sum_ss, sum_tt, sum_st = (s * s).T @ mt, ms.T @ (t * t), s.T @ t
    covariance = sum_st / n - (sum_s / n) * (sum_t / n)
    variance_s = sum_ss / n - (sum_s / n) ** 2
    variance_t = sum_tt / n - (sum_t / n) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return (covariance / (variance_s * variance_t).sqrt()).numpy()


def correlation_graph(dataset_name: str, protocol_name: str, data_root: Path) -> np.ndarray:
    folder = ensure_processed(dataset_name, data_root)
    tensors = load_tensors(folder)
    split = load_splits(folder, tensors, protocol_name, dataset_name)[0]
    positions = split.positions(tensors, "train")
    positions = np.random.default_rng(0).permutation(positions)[:CORRELATION_STAYS]
    return lag_one_correlation(IrregularDataset(tensors.subset(np.sort(positions)), split.normalisation))


def graph_stability(graphs: dict[str, np.ndarray], variables: list[str], correlation: np.ndarray, top: int):
    """The pairs table, the edge table, and the summary numbers (see the module docstring)."""
    runs = list(graphs)
    tops = {run: top_edges(graphs[run], top) for run in runs}
    pairs = pd.DataFrame(
        [{"run_a": a, "run_b": b, "shared": len(tops[a] & tops[b])} for a, b in itertools.combinations(runs, 2)]
    )
    d = len(variables)
    off = ~np.eye(d, dtype=bool)
    source, target = np.nonzero(off)
    in_top = np.array([sum((i, j) in tops[run] for run in runs) for i, j in zip(source, target)])
    mean_weight = np.mean([graphs[run][off] for run in runs], axis=0)
    edges = pd.DataFrame(
        {
            "source": np.asarray(variables)[source],
            "target": np.asarray(variables)[target],
            "runs_in_top": in_top,
            "mean_weight": mean_weight,
            "lag_one_correlation": correlation[off],
        }
    )
    edges = edges.sort_values(["runs_in_top", "mean_weight"], ascending=False, ignore_index=True)
    recurring = edges[edges["runs_in_top"] >= max(2, -(-len(runs) // 2))]
    by_data = top_edges(np.nan_to_num(np.abs(correlation), nan=-1.0), top)
    model_edges = {(variables.index(s), variables.index(t)) for s, t in zip(recurring["source"], recurring["target"])}
    numbers = {
        "runs": len(runs),
        "variables": d,
        "shared_mean": float(pairs["shared"].mean()) if len(pairs) else float("nan"),
        "shared_min": int(pairs["shared"].min()) if len(pairs) else 0,
        "shared_max": int(pairs["shared"].max()) if len(pairs) else 0,
        "shared_by_chance": top * top / (d * (d - 1)),
        "recurring": len(recurring),
        "diagonal_share": float(np.mean([np.diag(graphs[run]).mean() for run in runs])),
        "recurring_in_data_top": len(model_edges & by_data),
        "data_top_by_chance": len(model_edges) * top / (d * (d - 1)),
        "weight_vs_correlation": float(
            pd.Series(mean_weight).corr(pd.Series(np.abs(correlation[off])), method="spearman")
        ),
    }
    return pairs, edges, recurring, numbers


def recurring_figure(recurring: pd.DataFrame, variables: list[str], runs: int) -> plt.Figure:
    """The recurring edges on a circle, line width following how many runs have them in their top."""
    edges = [
        (variables.index(row.source), variables.index(row.target), 0.5 + 3 * row.runs_in_top / runs)
        for row in recurring.itertuples()
    ]
    return plots.edges_figure(variables, edges, f"Edges in the top of at least half of {runs} runs (source -> target)")


def report(command: str, name: str, numbers: dict, recurring: pd.DataFrame, top: int) -> str:
    n = numbers
    lines = [
        f"# The learned graph: {name}",
        "",
        "Made by:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"{n['runs']} runs, {n['variables']} variables. The summary graph is |A_ij| / sum_i |A_ij| (where each "
        "target's messages come from), from each run's logged adjacency.",
        "",
        f"- **Stability**: two runs share {n['shared_mean']:.1f} of their {top} strongest edges on average "
        f"(from {n['shared_min']} to {n['shared_max']} over the pairs); two random sets of {top} edges would "
        f"share {n['shared_by_chance']:.2f}.",
        f"- **The diagonal** holds {n['diagonal_share']:.1%} of a target's incoming weight on average (its own "
        "message): what is left for the other variables is small.",
        f"- **Recurring edges** (in the top {top} of at least half of the runs): {n['recurring']}.",
        f"- **Against the data**: {n['recurring_in_data_top']} of the recurring edges are among the {top} "
        f"strongest lag-one correlations of the training stays (by chance: {n['data_top_by_chance']:.2f}); the "
        f"rank correlation of the mean edge weight with |lag-one correlation| over all pairs is "
        f"{n['weight_vs_correlation']:.2f}.",
        "",
        "| source | target | runs in top | mean weight | lag-one correlation |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.source} | {r.target} | {r.runs_in_top} | {r.mean_weight:.4f} | {r.lag_one_correlation:.3f} |"
        for r in recurring.itertuples()
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.graph_study",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    studies.add_preset_runs_arguments(parser, "runs")
    parser.add_argument("--top", type=int, default=20, help="strongest edges compared per run (default 20)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    graphs = run_graphs(studies.preset_runs(args))
    variables = graphs.pop("variables")
    if len(graphs) < 2:
        raise SystemExit(f"only {len(graphs)} run of {args.preset} on {args.protocol}: stability needs two or more")
    correlation = correlation_graph(args.dataset, args.protocol, args.data_root)
    pairs, edges, recurring, numbers = graph_stability(graphs, variables, correlation, args.top)
    name = f"graph-{args.dataset}-{args.protocol}"
    command = "python -m experiments.graph_study " + shlex.join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    for suffix, table in (("pairs", pairs), ("edges", edges)):
        with atomic_file(args.out / f"{name}-{suffix}.csv", "w") as file:
            table.to_csv(file, index=False)
    figure = recurring_figure(recurring, variables, len(graphs))
    with atomic_file(args.out / f"{name}-recurring.png") as file:
        figure.savefig(file, format="png", dpi=120, bbox_inches="tight")
    plt.close(figure)
    text = report(command, f"{args.preset} on {args.protocol} ({args.dataset})", numbers, recurring, args.top)
    with atomic_file(args.out / f"{name}.md", "w") as file:
        file.write(text)
    print(text)


if __name__ == "__main__":
    main()
