"""Risk per stay from a trained model, in batches of stays sorted by length: little padding, and a stay's risk does
not depend on the stays batched with it."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from garlic.data.batches import IrregularDataset, batch_work, collate
from garlic.data.threads import on_chosen_threads

# The GRU runs over whole batches of 128 (the layers before it take a few stays at a time, ``Garlic.predict_logits``);
# batches of 256 or 512 were no faster on P12 here.
INFERENCE_BATCH = 128


def in_length_order(model: nn.Module, dataset: IrregularDataset, batch_size: int):
    """(positions in ``dataset``, batch on the model's device) for batches of stays sorted by length, each on the
    CPU threads the process's chooser picks for it (``garlic.data.threads``)."""
    device = next(model.parameters()).device
    order = torch.argsort(dataset.lengths, stable=True)
    batches = DataLoader(dataset, batch_size=batch_size, sampler=order.tolist(), collate_fn=collate)
    for start, batch in zip(range(0, len(dataset), batch_size), on_chosen_threads(batches, batch_work)):
        yield order[start : start + len(batch)], batch.to(device)


@torch.inference_mode()  # a few % faster than no_grad on P12 here: no version counters or view tracking
def predict_proba(model: nn.Module, dataset: IrregularDataset, batch_size: int = INFERENCE_BATCH) -> np.ndarray:
    """Risk per stay, in dataset order, of any network with ``predict_logits(values, mask, times, lengths, static)``:
    GARLIC of either architecture, the recurrent baselines; on a dataset with prediction times, a risk at each (in
    the order of ``dataset.prediction_times``), from a network that takes ``queries`` (GARLIC's compact one)."""
    model.eval()
    probabilities = torch.empty(len(dataset.targets))
    for positions, batch in in_length_order(model, dataset, batch_size):
        asked = {} if batch.queries is None else {"queries": batch.queries}
        logits = model.predict_logits(batch.values, batch.mask, batch.times, batch.lengths, batch.static, **asked)
        probabilities[positions if batch.queries is None else batch.queries.index.cpu()] = torch.sigmoid(logits).cpu()
    return probabilities.numpy()
