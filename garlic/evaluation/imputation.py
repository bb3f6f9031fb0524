"""Hidden values imputed, the measure of an imputer on a dataset's observed values (``experiments.imputation`` on
P12 and P19, ``experiments.uea`` on the UEA sets): ``hide`` draws the values to hide, ``simple_imputations`` gives
the simple imputers' guesses from the values left and ``reconstructed`` a GARLIC network's reconstruction head."""

from __future__ import annotations

import numpy as np
import torch

HIDDEN_SHARE = 0.1  # of the observed values, hidden and imputed from the rest
BATCH = 128


def hide(mask: np.ndarray, share: float, seed: int) -> np.ndarray:
    """Boolean [N, T, D]: round(share * observed) of the observed cells of ``mask``, drawn without replacement."""
    observed = np.flatnonzero(mask)
    chosen = np.random.default_rng(seed).choice(observed, size=round(share * len(observed)), replace=False)
    hidden = np.zeros(mask.size, dtype=bool)
    hidden[chosen] = True
    return hidden.reshape(mask.shape)


def simple_imputations(values: torch.Tensor, mask: torch.Tensor, times: torch.Tensor) -> dict[str, torch.Tensor]:
    """``locf``, ``linear`` and ``mean`` at every cell from the values left (normalised, so the training mean is 0).

    values, mask [N, T, D] (the cells left), times [N, T] -> method -> [N, T, D]
    """
    steps = values.shape[1]
    index = torch.arange(steps)[None, :, None].expand_as(mask)
    observed = mask.bool()
    before = torch.where(observed, index, -1).cummax(1).values  # last step left at or before t
    before = torch.cat([torch.full_like(before[:, :1], -1), before[:, :-1]], 1)  # ... strictly before t
    after = torch.where(observed, index, steps).flip(1).cummin(1).values.flip(1)  # first at or after t
    after = torch.cat([after[:, 1:], torch.full_like(after[:, :1], steps)], 1)  # ... strictly after t
    has_before, has_after = before >= 0, after < steps
    previous = values.gather(1, before.clamp(min=0))
    following = values.gather(1, after.clamp(max=steps - 1))
    time = times[:, :, None].expand_as(values)
    time_before, time_after = time.gather(1, before.clamp(min=0)), time.gather(1, after.clamp(max=steps - 1))
    fraction = ((time - time_before) / (time_after - time_before).clamp(min=1e-6)).clamp(0, 1)
    between = previous + (following - previous) * fraction
    locf = torch.where(has_before, previous, 0.0)
    ends = torch.where(has_before, previous, torch.where(has_after, following, 0.0))
    return {
        "locf": locf,
        "linear": torch.where(has_before & has_after, between, ends),
        "mean": torch.zeros_like(values),
    }


@torch.no_grad()
def reconstructed(model, values, mask, times, lengths, static) -> torch.Tensor:
    """The model's reconstruction head at every cell, in batches of stays of similar length. -> [N, T, D]"""
    model.eval()
    result = torch.zeros_like(values)
    for chunk in torch.argsort(lengths, stable=True).split(BATCH):
        steps = max(int(lengths[chunk].max()), 1)
        output = model(values[chunk, :steps], mask[chunk, :steps], times[chunk, :steps], lengths[chunk], static[chunk])
        result[chunk, :steps] = output.reconstruction
    return result
