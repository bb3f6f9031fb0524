import pytest
import torch

from garlic.graph import summary_graph


def test_summary_graph_keeps_directed_weighted_edges_above_the_threshold():
    weights = torch.tensor([[0.5, 0.3, 0.0], [0.05, 0.6, 0.2], [0.0, 0.4, 0.7]])
    data = summary_graph(weights, ["HR", "MAP", "GCS"], min_weight=0.1)
    edges = {(data.names[s], data.names[t]): float(w) for (s, t), w in zip(data.edge_index.T.tolist(), data.edge_weight)}
    assert edges == {("HR", "MAP"): pytest.approx(0.3), ("MAP", "GCS"): pytest.approx(0.2),
                     ("GCS", "MAP"): pytest.approx(0.4)}  # fmt: skip
    assert data.num_nodes == 3
    with_loops = summary_graph(weights, ["HR", "MAP", "GCS"], min_weight=0.1, self_loops=True)
    assert with_loops.edge_index.shape[1] == 6
