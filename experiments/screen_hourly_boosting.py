"""Screen boosting settings for ``hourly_gbm_utility`` on one split's validation stays, the test never asked.

    python -m experiments.screen_hourly_boosting --protocol five-split --split 0 \
        --setting '{"learning_rate": 0.05, "max_iter": 200, "max_leaf_nodes": 7}'

Each ``--setting`` (keyword arguments of scikit-learn's ``HistGradientBoostingClassifier``) is fitted as
``garlic.methods.hourly.HourlyModel`` fits each of its built-in candidates (its features, its utility target and
weights, the columns it keeps), on the split's training part of ``physionet2019-hourly``; each prints one JSON line:
its validation utility at the threshold of highest utility there (what the early-warning table's "validation
utility" reads), its weighted validation AUROC (what the method picks its candidate by) and its minutes. A setting
that wins here becomes a candidate of the method, and the method's units are trained again: a screen chooses; it
does not make a row.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import roc_auc_score

from garlic import studies
from garlic.data.datasets import DEFAULT_DATA_ROOT
from garlic.evaluation.fit_and_test import split_parts
from garlic.methods.hourly import HourlyModel
from garlic.metrics.utility import choose_threshold, stay_lengths

DATASET = "physionet2019-hourly"


def screen(settings: list[dict], protocol: str, split: int, data_root) -> list[dict]:
    """Each setting fitted on the split's training part and scored on its validation part."""
    cohort = studies.load_cohort(DATASET, data_root, protocol, [split])
    parts = split_parts(cohort.tensors, cohort.splits[0])
    train, validation = parts["train"], parts["validation"]
    method = HourlyModel("gbm", target="utility")
    features = method.features(train)
    kept = ~np.isnan(features).all(axis=0)
    targets, weights = method.targets(train), method.sample_weights(train)
    held_out = method.features(validation)[:, kept]
    held_out_targets, held_out_weights = method.targets(validation), method.sample_weights(validation)
    times = validation.prediction_times
    results = []
    for setting in settings:
        start = time.perf_counter()
        model = HistGradientBoostingClassifier(**setting, early_stopping=False, random_state=method.seed)
        model.fit(features[:, kept], targets, sample_weight=weights)
        risks = model.predict_proba(held_out)[:, 1]
        choice = choose_threshold(times.label, risks, stay_lengths(times.stay))
        results.append(
            {
                "protocol": protocol,
                "split": split,
                "setting": setting,
                "validation_utility": choice.normalised_utility,
                "weighted_validation_auroc": roc_auc_score(held_out_targets, risks, sample_weight=held_out_weights),
                "minutes": (time.perf_counter() - start) / 60,
            }
        )
        print(json.dumps(results[-1]), flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", default="five-split")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument(
        "--setting",
        action="append",
        required=True,
        type=json.loads,
        metavar="JSON",
        help="keyword arguments of HistGradientBoostingClassifier; repeat for more",
    )
    parser.add_argument("--data-root", default=DEFAULT_DATA_ROOT)
    args = parser.parse_args(argv)
    screen(args.setting, args.protocol, args.split, args.data_root)


if __name__ == "__main__":
    main()
