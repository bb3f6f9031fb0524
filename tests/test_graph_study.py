"""experiments.graph_study: the stability numbers and the data's lag-one correlations, against plain computations."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from experiments.graph_study import graph_stability, lag_one_correlation, top_edges


def test_top_edges_leave_out_self_loops():
    weights = np.array([[9.0, 1.0, 5.0], [4.0, 9.0, 0.0], [2.0, 3.0, 9.0]])
    assert top_edges(weights, 3) == {(0, 2), (1, 0), (2, 1)}


def test_lag_one_correlation_is_the_pairs_pearson_correlation_written_out():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(6, 9, 3, generator=generator)
    mask = (torch.rand(6, 9, 3, generator=generator) < 0.6).float()
    got = lag_one_correlation(SimpleNamespace(values=values * mask, mask=mask))
    for i in range(3):
        for j in range(3):
            sources, targets = [], []
            for stay in range(6):
                last = None
                for step in range(9):
                    if mask[stay, step, j] and last is not None:
                        sources.append(last)
                        targets.append(float(values[stay, step, j]))
                    if mask[stay, step, i]:
                        last = float(values[stay, step, i])
            assert got[i, j] == pytest.approx(np.corrcoef(sources, targets)[0, 1], abs=1e-9)


def test_stability_counts_shared_and_recurring_edges():
    rng = np.random.default_rng(0)
    variables = [f"v{k}" for k in range(6)]
    same = rng.random((6, 6))
    other = rng.random((6, 6))
    graphs = {"a": same, "b": same.copy(), "c": other}
    pairs, edges, recurring, numbers = graph_stability(graphs, variables, rng.random((6, 6)), top=4)
    shared = dict(zip(zip(pairs["run_a"], pairs["run_b"]), pairs["shared"]))
    assert shared[("a", "b")] == 4  # the same graph twice: the same top edges
    assert shared[("a", "c")] == len(top_edges(same, 4) & top_edges(other, 4))
    assert set(zip(recurring["source"], recurring["target"])) >= {
        (variables[i], variables[j]) for i, j in top_edges(same, 4)
    }
    assert len(edges) == 30 and numbers["runs"] == 3
    assert numbers["shared_by_chance"] == pytest.approx(16 / 30)
    assert numbers["diagonal_share"] == pytest.approx(np.mean([np.diag(g).mean() for g in graphs.values()]))
