"""The learned variable graph handed to graph tooling, as a PyTorch Geometric ``Data`` object.

The model itself keeps the dense adjacency (fast on a CPU for a few dozen variables); this is the bridge for users
who want to analyse or reuse the summary graph with PyG (centralities, GNN layers, exports).
"""
from __future__ import annotations

import torch
from torch_geometric.data import Data
from torch_geometric.utils import dense_to_sparse


def summary_graph(graph: torch.Tensor, variables: list[str], min_weight: float = 0.0, self_loops: bool = False) -> Data:
    """[D, D] weights (row = source, column = target) -> Data(edge_index [2, E], edge_weight [E], names).

    Keeps edges whose weight exceeds ``min_weight``; self-loops only when asked for.
    """
    weights = graph.detach().clone().float()
    if not self_loops:
        weights.fill_diagonal_(0.0)
    weights = torch.where(weights > min_weight, weights, torch.zeros_like(weights))
    edge_index, edge_weight = dense_to_sparse(weights)
    return Data(edge_index=edge_index, edge_weight=edge_weight, num_nodes=len(variables), names=list(variables))
