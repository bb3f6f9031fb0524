"""A seeded synthetic ICU cohort with known structure: the built-in default data set.

Each stay has a latent deterioration ``z(t)`` that drifts up or down over 48 hours. A few variables read it
directly; the rest only feel it through a planted, time-lagged dependency graph (``source`` at ``t - lag`` moves
``target`` at ``t``). Vital signs are charted together about hourly with dropouts, labs in draws every 4-12 hours
with some tests left out; the outcome depends on the deterioration at 48 hours. The tables are the same as the
real preprocessors write; the planted graph is in the manifest so that learned graphs and explanations can be
scored against the truth. Variables carry PhysioNet 2012 parameter names, so a synthetic stay can be written as a
PhysioNet 2012 record file and read back (``physionet2012.format_record``), as uploads and ``garlic predict`` do:
``generate`` writes a few new stays, simulated apart from the cohort, as such files into ``example-records/``, ready
for ``garlic predict`` and the dashboard's upload right after the first training.

Cohorts (``garlic preprocess synthetic --cohort NAME``):
- ``outcome`` (default, the dataset ``synthetic``): one prediction per stay from its 48 hours.
- ``hourly`` (``synthetic-hourly``): the same stays, tables and label, with a prediction time at every whole hour
  from the first observation to hour 48, as PhysioNet 2012's ``hourly`` cohort: a small dataset with several
  prediction times per stay (exported to MEDS, the usual label file of several rows per subject).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from garlic.io.tables import atomic_directory, read_manifest, write_processed
from garlic.sources import Source
from garlic.sources.physionet2012 import format_record, hourly_tasks

HOURS = 48
VITALS = ["HR", "SysABP", "RespRate", "Temp", "SaO2"]
LABS = ["Lactate", "Creatinine", "BUN", "WBC", "Platelets", "GCS", "Glucose"]
VARIABLES = VITALS + LABS
SCALE = {  # (mean, standard deviation) in clinical units
    "HR": (85, 15),
    "SysABP": (120, 20),
    "RespRate": (18, 4),
    "Temp": (37.0, 0.7),
    "SaO2": (96, 2),
    "Lactate": (1.8, 1.0),
    "Creatinine": (1.2, 0.6),
    "BUN": (20, 10),
    "WBC": (10, 4),
    "Platelets": (220, 80),
    "GCS": (13, 2.5),
    "Glucose": (130, 40),
}
COHORTS = ("outcome", "hourly")
HOURLY_TASK = {  # what the ``hourly`` cohort's manifest says of its task (``garlic.io.tables.TASKS``)
    "prediction_times": f"every whole hour from the first observation to hour {HOURS}",
    "label": "the stay's deterioration outcome",
    "score": "auroc",
}
EXAMPLE_RECORDS = "example-records"
EXAMPLE_IDS = [900_001, 900_002, 900_003]  # outside the cohort's 100000.. range: stays no split has seen
# How strongly each variable reads the latent deterioration directly.
LOADING = {"Lactate": 1.0, "Creatinine": 0.8, "Temp": 0.6, "SysABP": -0.7}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    lag_hours: int
    weight: float


PLANTED_GRAPH = [
    Edge("Lactate", "HR", 2, 0.7),
    Edge("HR", "RespRate", 1, 0.6),
    Edge("RespRate", "SaO2", 1, -0.6),
    Edge("Creatinine", "BUN", 4, 0.8),
    Edge("SysABP", "GCS", 3, 0.6),
    Edge("Temp", "WBC", 6, 0.7),
    Edge("WBC", "Platelets", 6, -0.5),
    Edge("Lactate", "Glucose", 2, 0.5),
]


def simulate(n_stays: int = 2000, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Observations, static and label tables for ``n_stays`` stays; the same seed gives the same cohort."""
    if n_stays < 1:
        raise ValueError(f"--stays must be at least 1, got {n_stays}")
    rng = np.random.default_rng(seed)
    d = len(VARIABLES)
    position = {name: i for i, name in enumerate(VARIABLES)}

    age = rng.normal(64, 16, n_stays).clip(18, 95)
    severity = rng.normal(0, 1, n_stays) + 0.02 * (age - 64)
    hours = np.arange(HOURS + 1)
    drift = severity[:, None] * (hours / HOURS) ** 1.3
    latent = drift + np.cumsum(rng.normal(0, 0.15, (n_stays, HOURS + 1)), axis=1)

    loading = np.zeros(d)
    for name, weight in LOADING.items():
        loading[position[name]] = weight
    state = np.zeros((n_stays, HOURS + 1, d))
    noise = rng.normal(0, 0.35, (n_stays, HOURS + 1, d))
    for hour in hours:  # the generator steps through time; the model never does
        state[:, hour] = loading * latent[:, hour, None] + noise[:, hour]
        if hour:
            state[:, hour] += 0.5 * state[:, hour - 1]
        for edge in PLANTED_GRAPH:
            if hour >= edge.lag_hours:
                state[:, hour, position[edge.target]] += (
                    edge.weight * state[:, hour - edge.lag_hours, position[edge.source]]
                )

    # The dynamics above inflate each variable's spread well past 1 (and the values past physiology, e.g. negative
    # heart rates); rescale so that SCALE's standard deviations hold. Per-variable scaling keeps every correlation.
    state /= state.std(axis=(0, 1))

    risk = 1.6 * latent[:, -1] - 2.2
    labels = (rng.random(n_stays) < 1 / (1 + np.exp(-risk))).astype("int8")

    stays, steps, variables = [], [], []
    charted = rng.random((n_stays, HOURS + 1)) < 0.8  # a whole vitals round happens or not
    vital_present = rng.random((n_stays, HOURS + 1, len(VITALS))) < 0.9
    s, h, v = np.nonzero(charted[:, :, None] & vital_present)
    stays.append(s), steps.append(h), variables.append(v)
    draw_gap = rng.integers(4, 13, (n_stays, HOURS))
    draw_hours = np.cumsum(draw_gap, axis=1) - rng.integers(0, 4, (n_stays, 1))
    drawn = (draw_hours >= 0) & (draw_hours <= HOURS)
    lab_present = rng.random((n_stays, HOURS, len(LABS))) < 0.75
    s, k, v = np.nonzero(drawn[:, :, None] & lab_present)
    stays.append(s), steps.append(draw_hours[s, k]), variables.append(v + len(VITALS))
    stay, step, variable = (np.concatenate(a) for a in (stays, steps, variables))

    # Charting happens at a jittered minute within the hour, the same minute for all values of one round.
    minute = rng.integers(0, 60, (n_stays, HOURS + 1))
    time = np.minimum(step + minute[stay, step] / 60.0, HOURS)
    mean = np.array([SCALE[n][0] for n in VARIABLES])
    std = np.array([SCALE[n][1] for n in VARIABLES])
    value = mean[variable] + std[variable] * state[stay, step, variable]
    gcs = variable == position["GCS"]
    value[gcs] = np.clip(np.round(value[gcs]), 3, 15)
    # Lab values are concentrations and counts: keep them above a small positive floor, as real labs are.
    lab = variable >= len(VITALS)
    value[lab] = np.maximum(value[lab], 0.05 * mean[variable[lab]])
    saturation = variable == position["SaO2"]
    value[saturation] = np.minimum(value[saturation], 100)

    stay_ids = 100_000 + np.arange(n_stays)
    observations = pd.DataFrame(
        {
            "stay_id": stay_ids[stay],
            "time": time.astype("float32"),
            "variable": np.array(VARIABLES)[variable],
            "value": value.astype("float32"),
        }
    ).sort_values(["stay_id", "time"], kind="stable", ignore_index=True)
    static = pd.DataFrame(
        {
            "stay_id": stay_ids,
            "Age": age.round(),
            "Gender": rng.integers(0, 2, n_stays).astype(float),
            "Height": rng.normal(170, 10, n_stays).round(1),
            "ICUType": rng.integers(1, 5, n_stays).astype(float),
            "Weight": rng.normal(80, 15, n_stays).round(1),
        }
    )
    return observations, static, pd.DataFrame({"stay_id": stay_ids, "label": labels})


def generate(destination: Path, n_stays: int = 2000, seed: int = 0, cohort: str = COHORTS[0]) -> dict:
    """Write the synthetic cohort's tables to ``destination``; return its manifest."""
    observations, static, labels = simulate(n_stays, seed)
    manifest = {
        "dataset": "synthetic",
        "source": {"generator": "garlic.sources.synthetic", "n_stays": n_stays, "seed": seed},
        "window_hours": float(HOURS),
        "label": "deterioration outcome",
        "ground_truth_graph": [edge.__dict__ for edge in PLANTED_GRAPH],
        "direct_loadings": LOADING,
    }
    tasks = None
    if cohort == "hourly":  # the default cohort's manifest stays as it was, so its runs keep their data digest
        tasks = hourly_tasks(observations, labels, HOURS)
        manifest |= {"cohort": cohort, "task": HOURLY_TASK}
    write_processed(Path(destination), observations, static, labels, VARIABLES, manifest, tasks)
    write_example_records(Path(destination) / EXAMPLE_RECORDS, seed)
    return read_manifest(Path(destination))  # as written, with the counts that write_processed adds


def write_example_records(folder: Path, seed: int = 0) -> list[Path]:
    """New stays as PhysioNet 2012 record files ``EXAMPLE_IDS[i].txt`` in ``folder`` (replaced atomically).

    They come from another run of the generator (200 stays, so that its rescaling matches the cohort's), not from the
    cohort: no model trained on the cohort has seen them.
    """
    observations, static, _ = simulate(200, seed + 1)
    first = static["stay_id"].iloc[: len(EXAMPLE_IDS)].tolist()
    with atomic_directory(folder) as staging:
        for stay, new_id in zip(first, EXAMPLE_IDS):
            values = static.set_index("stay_id").loc[stay].to_dict()
            record = format_record(new_id, observations[observations["stay_id"] == stay], values)
            (staging / f"{new_id}.txt").write_text(record)
    return [folder / f"{new_id}.txt" for new_id in EXAMPLE_IDS]


SOURCE = Source(
    "synthetic",
    lambda destination, cohort, stays=2000, seed=0: generate(destination, n_stays=stays, seed=seed, cohort=cohort),
    options=frozenset({"stays", "seed"}),
    cohorts=COHORTS,
    plain_default=True,
)
