"""Fixed, saved train/validation/test splits and the normalisation statistics of their training part.

Protocols:
- ``five-split``: five stratified 80/10/10 splits, split k drawn with ``random_state=k`` (the paper reports
  mean +/- std over five splits).
- ``reference``: the reference implementation's single stratified split, ``random_state=0``.

Each split is saved as ``splits/<protocol>/split_<k>.json`` next to the processed tables: the stay ids of each
part and the per-variable mean and standard deviation of the training part's observed values. Once saved, a split
is read back, never redrawn, so every experiment uses the same stays.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

from preprocessing.tables import write_json_atomic
from preprocessing.tensors import IrregularTensors

PROTOCOLS = {"five-split": [0, 1, 2, 3, 4], "reference": [0]}


@dataclass
class Normalisation:
    """Per-variable statistics of the training stays' observed values (and of their static features)."""

    value_mean: np.ndarray
    value_std: np.ndarray
    static_mean: np.ndarray
    static_std: np.ndarray

    @classmethod
    def fit(cls, train: IrregularTensors) -> "Normalisation":
        observed = train.mask.sum(axis=(0, 1))
        total = np.where(train.mask, train.values, 0.0).sum(axis=(0, 1), dtype="float64")
        mean = np.divide(total, observed, out=np.zeros_like(total), where=observed > 0)
        centred = np.where(train.mask, train.values - mean, 0.0)
        variance = np.divide((centred**2).sum(axis=(0, 1), dtype="float64"), observed,
                             out=np.ones_like(total), where=observed > 0)  # fmt: skip
        static_mean = np.nan_to_num(np.nanmean(train.static, axis=0)) if len(train) else np.zeros(0)
        static_std = np.nan_to_num(np.nanstd(train.static, axis=0), nan=1.0)
        return cls(
            value_mean=mean.astype("float32"),
            value_std=_positive(np.sqrt(variance)).astype("float32"),
            static_mean=static_mean.astype("float32"),
            static_std=_positive(static_std).astype("float32"),
        )


def _positive(std: np.ndarray) -> np.ndarray:
    return np.where(std > 1e-8, std, 1.0)


@dataclass
class Split:
    protocol: str
    index: int
    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray
    normalisation: Normalisation

    @property
    def name(self) -> str:
        return f"{self.protocol}/split_{self.index}"

    def positions(self, tensors: IrregularTensors, part: str) -> np.ndarray:
        """Row positions in ``tensors`` of this split's ``part`` ('train', 'validation' or 'test')."""
        wanted = getattr(self, part)
        if not np.isin(wanted, tensors.stay_ids).all():
            raise ValueError(f"split {self.name} names stays that the dataset does not hold; re-create the split")
        return np.searchsorted(tensors.stay_ids, wanted)

    def to_json(self) -> dict:
        return {
            "protocol": self.protocol,
            "index": self.index,
            "train": self.train.tolist(),
            "validation": self.validation.tolist(),
            "test": self.test.tolist(),
            "normalisation": {k: v.tolist() for k, v in asdict(self.normalisation).items()},
        }

    @classmethod
    def from_json(cls, payload: dict) -> "Split":
        return cls(
            protocol=payload["protocol"],
            index=payload["index"],
            train=np.asarray(payload["train"], dtype="int64"),
            validation=np.asarray(payload["validation"], dtype="int64"),
            test=np.asarray(payload["test"], dtype="int64"),
            normalisation=Normalisation(**{k: np.asarray(v, dtype="float32")
                                           for k, v in payload["normalisation"].items()}),  # fmt: skip
        )


def draw_split(tensors: IrregularTensors, protocol: str, index: int) -> Split:
    """Stratified 80/10/10 split of the stays, drawn with ``random_state=index``."""
    stay_ids, labels = tensors.stay_ids, tensors.labels
    train, rest, _, rest_labels = train_test_split(
        stay_ids, labels, test_size=0.2, stratify=labels, random_state=index
    )
    validation, test = train_test_split(rest, test_size=0.5, stratify=rest_labels, random_state=index)
    train, validation, test = np.sort(train), np.sort(validation), np.sort(test)
    normalisation = Normalisation.fit(tensors.subset(np.searchsorted(stay_ids, train)))
    return Split(protocol, index, train, validation, test, normalisation)


def load_splits(folder: Path, tensors: IrregularTensors, protocol: str = "five-split") -> list[Split]:
    """The protocol's splits, read from ``folder/splits`` or drawn and saved there on first use."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown split protocol {protocol!r}; choose one of {sorted(PROTOCOLS)}")
    splits = []
    for index in PROTOCOLS[protocol]:
        path = Path(folder) / "splits" / protocol / f"split_{index}.json"
        if path.is_file():
            split = Split.from_json(json.loads(path.read_text()))
        else:
            split = draw_split(tensors, protocol, index)
            write_json_atomic(path, split.to_json())
        splits.append(split)
    return splits
