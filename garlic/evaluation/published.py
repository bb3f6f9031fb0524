"""Every published number the project sets beside its own, in one place, each with where it was reported.

All are fractions (an AUROC of 86.4% is 0.864), test metrics of the paper or repository named, never re-run here.

- ``RESULTS``: the comparison tables' rows (``experiments.compare``), per cohort: method, protocol, AUROC and AUPRC
  as (mean, std);
- ``ABLATION_AUROC``: the GARLIC paper's ablation, per source and variant (``experiments.ablations``);
- ``FIDELITY``: the feature-removal trial the GARLIC paper reports for IMV-LSTM on P12 (``experiments.fidelity``);
- ``IMPUTATION_NMAE``: normalised MAE of imputers with 10% of observed values held out (``experiments.imputation``).
"""

from __future__ import annotations

from typing import NamedTuple


class Result(NamedTuple):
    method: str  # as the table shows it, "published: <model>"
    protocol: str
    auroc: tuple[float, float]  # mean, std
    auprc: tuple[float, float]
    source: str


SUMMARIES = "GARLIC paper (ICLR 2026), as reported in summaries of it"
RESULTS = {
    "physionet2012": [
        Result("published: GARLIC", "garlic-reference", (0.8640, 0.0086), (0.5689, 0.0175), "GARLIC paper (ICLR 2026)"),
        Result("published: GRU-D", "raindrop", (0.819, 0.021), (0.461, 0.047), "ViTST repository"),
        Result("published: SeFT", "raindrop", (0.739, 0.025), (0.311, 0.041), "ViTST repository"),
        Result("published: Raindrop", "raindrop", (0.828, 0.017), (0.440, 0.030), "ViTST repository"),
        Result("published: mTAND", "raindrop", (0.842, 0.008), (0.482, 0.034), "ViTST repository"),
        Result("published: ViTST", "raindrop", (0.851, 0.008), (0.511, 0.041), "ViTST repository"),
        Result("published: ISTS-PLM", "raindrop", (0.876, 0.014), (0.576, 0.033), "ISTS-PLM repository"),
        Result("published: KEDGN", "raindrop", (0.878, 0.011), (0.583, 0.032), "KEDGN as re-run in the TRIAGE paper"),
    ],
    "physionet2019-raindrop": [
        Result("published: GRU-D", "raindrop", (0.839, 0.017), (0.469, 0.021), "ViTST repository"),
        Result("published: SeFT", "raindrop", (0.812, 0.023), (0.419, 0.031), "ViTST repository"),
        Result("published: Raindrop", "raindrop", (0.870, 0.023), (0.518, 0.055), "ViTST repository"),
        Result("published: ViTST", "raindrop", (0.892, 0.020), (0.531, 0.034), "ViTST repository"),
        Result("published: ISTS-PLM", "raindrop", (0.894, 0.022), (0.569, 0.050), "ISTS-PLM repository"),
        Result("published: KEDGN", "raindrop", (0.922, 0.005), (0.620, 0.013), "KEDGN paper"),
    ],
    "physionet2019-garlic": [
        Result("published: GARLIC", "garlic-reference", (0.9096, 0.0084), (0.5529, 0.0245), SUMMARIES),
    ],
}

# Test AUROC of each variant (``experiments.ablations.VARIANTS`` names; "no alternating optimisation" is
# ``joint_training``), from summaries of the GARLIC paper.
ABLATION_AUROC = {
    "physionet2012": {
        "full": 0.8640,
        "no_missing_indicator": 0.8487,
        "no_decay": 0.8220,
        "no_per_variable_encoder": 0.8500,
        "no_graph": 0.8467,
        "no_gru": 0.7690,
        "joint_training": 0.8532,
    },
    "physionet2019": {
        "full": 0.9096,
        "no_missing_indicator": 0.8222,
        "no_decay": 0.8950,
        "no_per_variable_encoder": 0.8978,
        "no_graph": 0.8839,
        "no_gru": 0.7526,
        "joint_training": 0.9008,
    },
}

# IMV-LSTM on P12 with all values and with the top / a random / the bottom 50% kept, (AUROC, AUPRC), from summaries
# of the GARLIC paper.
FIDELITY = {
    "physionet2012": {
        "full": (0.8402, 0.4908),
        "top": (0.7623, 0.3446),
        "random": (0.7523, 0.3703),
        "bottom": (0.7012, 0.2683),
    },
}

# Normalised MAE with 10% of the observed values held out, as published by the SAITS paper (P12 only; its own
# preprocessing and masking).
IMPUTATION_NMAE = {"physionet2012": {"SAITS": 0.186, "BRITS": 0.256}}


def results(dataset: str, protocol: str) -> list[Result]:
    """The published rows of ``protocol`` on the cohort ``dataset``."""
    return [row for row in RESULTS.get(dataset, []) if row.protocol == protocol]
