"""A new reading's cost in the live ward: one step from the bed's step state (``garlic.models.steps``) against one
explained pass over the bed's whole stay (what the ward ran per reading before), on real stays, one bed, and whether
both give the same risk and signal importance.

    python -m experiments.benchmark_steps --dataset physionet2012 --data-root data

A compact GARLIC with the dataset's config and random weights (the cost and the equality do not depend on training)
takes a median stay and the longest one of the processed dataset step by step, comparing its risk and signal
importance with ``garlic.explain.built_in.explain`` on the stay cut after every 5th step; then it times the last
step (with risk and drivers) against one explained pass and one risk-only pass (``predict_logits``) over the stay.
It ends with one line per stay:

    S steps over H h: step X ms, explained pass Y ms, risk-only pass Z ms

Not a test: its numbers depend on what else the machine runs (``OMP_NUM_THREADS=1`` for the ward's one thread).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from garlic.config import Config
from garlic.data.batches import IrregularDataset, collate
from garlic.data.datasets import DEFAULT_DATA_ROOT, processed_folder
from garlic.data.splits import Normalisation
from garlic.explain.built_in import explain
from garlic.io.tensors import load_tensors
from garlic.models import steps
from garlic.models.compact import Garlic
from garlic.models.network_config import NetworkConfig


def median_ms(run, repeats: int = 30) -> float:
    taken = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        taken.append(time.perf_counter() - start)
    return float(np.median(taken)) * 1e3


@torch.no_grad()
def main(argv: list[str] | None = None) -> None:
    options = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--dataset", default="physionet2012")
    options.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    args = options.parse_args(argv)
    torch.manual_seed(0)
    tensors = load_tensors(processed_folder(args.dataset, args.data_root))
    normalisation = Normalisation.fit(tensors.subset(np.arange(min(2000, len(tensors)))))
    model = Garlic(
        len(tensors.variables), len(tensors.static_features), NetworkConfig.from_run(Config.for_dataset(args.dataset))
    ).eval()
    for parameter in model.parameters():  # away from the initial weights, where some terms vanish
        parameter.add_(torch.randn_like(parameter) * 0.1)
    order = np.argsort(tensors.lengths, kind="stable")
    chosen = tensors.subset(np.array([order[len(order) // 2], order[-1]]))
    stays = IrregularDataset(chosen, normalisation)
    worst_risk = worst_signal = 0.0
    lines = []
    for index in range(len(stays)):
        stay = collate([stays[index]])
        length = int(stay.lengths[0])
        state = steps.start(model)
        for step in range(length):
            before = state
            state = steps.advance(
                model, state, stay.values[:, step], stay.mask[:, step], stay.times[:, step], explain=True
            )
            if step % 5 == 0 or step == length - 1:
                cut = collate(
                    [
                        {
                            **stays[index],
                            "values": stays[index]["values"][: step + 1],
                            "mask": stays[index]["mask"][: step + 1],
                            "times": stays[index]["times"][: step + 1],
                            "lengths": torch.tensor(step + 1),
                        }
                    ]
                )
                one_pass = explain(model, cut, tensors.variables)
                risk = torch.sigmoid(steps.logits(model, state, stay.static))
                worst_risk = max(worst_risk, float((risk - one_pass.risk).abs().max()))
                worst_signal = max(worst_signal, float((steps.signal_importance(state) - one_pass.signal).abs().max()))

        def last_step():
            after = steps.advance(model, before, stay.values[:, -1], stay.mask[:, -1], stay.times[:, -1], explain=True)
            return steps.logits(model, after, stay.static), steps.signal_importance(after)

        def risk_only():
            return model.predict_logits(stay.values, stay.mask, stay.times, stay.lengths, stay.static)

        lines.append(
            f"{length} steps over {float(stay.times[0, -1]):.1f} h: step {median_ms(last_step):.2f} ms, "
            f"explained pass {median_ms(lambda: explain(model, stay, tensors.variables)):.2f} ms, "
            f"risk-only pass {median_ms(risk_only):.2f} ms"
        )
    print(f"largest difference from the one pass: risk {worst_risk:.1e}, signal importance {worst_signal:.1e}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
