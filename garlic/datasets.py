"""Where each named dataset's processed tables live, and the built-in synthetic cohort made on first use."""
from __future__ import annotations

import os
from pathlib import Path

from preprocessing import synthetic
from preprocessing.tables import DatasetNotFoundError, MANIFEST

DATASETS = ("synthetic", "physionet2012", "physionet2019", "mimic3")
DEFAULT_DATA_ROOT = Path(os.environ.get("GARLIC_DATA_ROOT", "data"))


def processed_folder(dataset: str, data_root: Path = DEFAULT_DATA_ROOT) -> Path:
    if dataset not in DATASETS:
        raise DatasetNotFoundError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    return Path(data_root) / "processed" / dataset


def ensure_processed(dataset: str, data_root: Path = DEFAULT_DATA_ROOT) -> Path:
    """The dataset's processed folder; the synthetic cohort is generated when absent, real data must be prepared."""
    folder = processed_folder(dataset, data_root)
    if (folder / MANIFEST).is_file():
        return folder
    if dataset == "synthetic":
        synthetic.generate(folder)
        return folder
    raise DatasetNotFoundError(
        f"dataset {dataset!r} has not been preprocessed into {folder}; "
        f"run `garlic preprocess {dataset} --source PATH_TO_RAW_DATA` first"
    )
