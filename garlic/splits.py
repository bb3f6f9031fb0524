"""Fixed, saved train/validation/test splits and the normalisation statistics of their training part.

Protocols:
- ``five-split``: five stratified 80/10/10 splits, split k drawn with ``random_state=k`` (the paper reports
  mean +/- std over five splits).
- ``reference``: the reference implementation's single stratified split, ``random_state=0``.

Each split is saved as ``splits/<protocol>/split_<k>.json`` next to the processed tables: the stay ids of each
part and the normalisation of the training part's observed values. Once saved, a split is read back, never redrawn,
so every experiment uses the same stays.
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
    """Per-variable statistics of the training stays' observed values (and of their static features).

    Values are first clipped to the training part's ``CLIP_PERCENTILES``, then standardised with the mean and
    standard deviation of the clipped training values. Raw ICU records hold unit slips and typing errors (a pH of
    735, a temperature of -17.8): unclipped, a few such values set a variable's standard deviation, and on P12
    pH 7.0 and pH 7.6 then lie 0.1 standard deviations apart. ``value_low`` and
    ``value_high`` are None for statistics saved before clipping was introduced; those apply no clipping.
    """

    value_mean: np.ndarray
    value_std: np.ndarray
    static_mean: np.ndarray
    static_std: np.ndarray
    value_low: np.ndarray | None = None
    value_high: np.ndarray | None = None

    CLIP_PERCENTILES = (0.1, 99.9)

    @classmethod
    def fit(cls, train: IrregularTensors) -> "Normalisation":
        # One variable at a time: each observed column is small, where a masked percentile over [N, T, D] is not.
        columns = (train.values[..., d][train.mask[..., d]] for d in range(train.values.shape[-1]))
        low, high, mean, std = np.array([_clipped_statistics(c, cls.CLIP_PERCENTILES) for c in columns]).T
        static_mean = np.nan_to_num(np.nanmean(train.static, axis=0)) if len(train) else np.zeros(0)
        static_std = np.nan_to_num(np.nanstd(train.static, axis=0), nan=1.0)
        return cls(
            value_mean=mean.astype("float32"),
            value_std=_positive(std).astype("float32"),
            static_mean=static_mean.astype("float32"),
            static_std=_positive(static_std).astype("float32"),
            value_low=low.astype("float32"),
            value_high=high.astype("float32"),
        )

    def standardise(self, values: np.ndarray) -> np.ndarray:
        """[..., D] raw values -> clipped and standardised values (float32)."""
        if self.value_low is not None:
            values = np.clip(values, self.value_low, self.value_high)
        return ((values - self.value_mean) / self.value_std).astype("float32")

    def to_json(self) -> dict:
        return {k: v.tolist() for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, payload: dict) -> "Normalisation":
        return cls(**{k: np.asarray(v, dtype="float32") for k, v in payload.items()})


def _clipped_statistics(column: np.ndarray, percentiles: tuple[float, float]) -> tuple[float, float, float, float]:
    """(low, high, mean, std) of one variable's observed values, clipped to their own percentiles."""
    if len(column) == 0:
        return 0.0, 0.0, 0.0, 1.0
    low, high = np.percentile(column, percentiles)
    clipped = np.clip(column, low, high).astype("float64")
    return low, high, clipped.mean(), clipped.std()


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
            "normalisation": self.normalisation.to_json(),
        }

    @classmethod
    def from_json(cls, payload: dict) -> "Split":
        return cls(
            protocol=payload["protocol"],
            index=payload["index"],
            train=np.asarray(payload["train"], dtype="int64"),
            validation=np.asarray(payload["validation"], dtype="int64"),
            test=np.asarray(payload["test"], dtype="int64"),
            normalisation=Normalisation.from_json(payload["normalisation"]),
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
            if split.normalisation.value_low is None:  # saved before clipping: same stays, statistics refitted
                split.normalisation = Normalisation.fit(tensors.subset(split.positions(tensors, "train")))
                write_json_atomic(path, split.to_json())
        else:
            split = draw_split(tensors, protocol, index)
            write_json_atomic(path, split.to_json())
        splits.append(split)
    return splits
