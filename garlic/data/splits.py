"""Fixed, saved train/validation/test splits, the protocols that name them, and the normalisation of each
training part.

Protocols (``PROTOCOLS``; each says which splits and which model seeds it runs):
- ``five-split``: five stratified 80/10/10 splits, split k drawn with ``random_state=k``; one model seed (the
  config's) per split. Stratified on the stay's label, or on what the dataset's manifest names in
  ``split_strata`` (the P19 ``hourly`` cohort: the label and the hospital system).
- ``raindrop``: the five published 80/10/10 splits of Raindrop (Zhang et al., ICLR 2022), the protocol of
  Raindrop, ViTST, KEDGN, ISTS-PLM and MTM on P12 (``physionet2012``) and P19 (its 38,803 stays: the
  ``physionet2019-raindrop`` cohort); split k is the file's split k + 1. One model seed per split.
- ``cross-hospital``: PhysioNet 2019 only. Split 0 trains and selects on hospital system A and tests on every stay
  of system B; split 1 the other way round. The source system's stays are drawn 80/10/10 (stratified,
  ``random_state=0``): train, validation, and a held-out tenth. One model seed per split.
- ``in-hospital``: the same two splits' train and validation parts, tested on the held-out tenth of the source
  system: trained on the same stays with the same seed, it is the same model, so the pair gives the drop from
  its own hospital to the other.
- ``subject-splits``: the dataset's own single split, as its source recorded it (a MEDS folder's
  ``metadata/subject_splits.parquet``: ``train``, ``tuning`` the validation part, ``held_out`` the test part); one
  model seed.
- ``garlic-reference``: the GARLIC reference code's single stratified split, of P12 (``physionet2012``) or of P19
  (its 40,331 stays: the ``physionet2019-garlic`` cohort), trained with model seeds 0-4: how the paper's mean +/-
  std was made. The reference code normalises over all stays; here, as for every protocol, normalisation is
  fitted on the training part only.

A published protocol is published for particular datasets: its stay-id lists ship in
``garlic/data/protocols/<dataset>/<name>.json.gz`` (public protocol files, no patient data), so a fresh clone runs
them without ``../shared``, and it runs only on a dataset it was published for: the ids name stays, and the
dataset's cohort rule decides which rows of them a model sees.

Each split is saved as ``splits/<protocol>/split_<k>.json`` next to the processed tables: the stay ids of each
part and the normalisation of the training part's observed values. Once saved, a split is read back, never redrawn,
so every experiment uses the same stays.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import warnings
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import numpy as np

from garlic.data.datasets import SOURCES, source_of
from garlic.io.tables import MANIFEST, read_manifest, write_json_atomic
from garlic.io.tensors import IrregularTensors

log = logging.getLogger(__name__)

PUBLISHED = Path(__file__).resolve().parent / "protocols"
PARTS = ("train", "validation", "test")


@dataclass(frozen=True)
class Protocol:
    """A named evaluation protocol: its splits, and the model seeds each split is trained with.

    ``seeds`` None means one run per split with the config's own seed. ``published`` names the shipped id file;
    ``hospital`` (cross-hospital, in-hospital) draws by hospital system; ``recorded`` takes the split the manifest's
    ``subject_splits`` holds; otherwise the splits are drawn (stratified, ``random_state`` = split index) from the
    processed dataset.
    """

    name: str
    splits: tuple[int, ...]
    seeds: tuple[int, ...] | None = None
    published: str | None = None
    hospital: bool = False
    recorded: bool = False


PROTOCOLS = {
    protocol.name: protocol
    for protocol in (
        Protocol("five-split", (0, 1, 2, 3, 4)),
        Protocol("raindrop", (0, 1, 2, 3, 4), published="raindrop"),
        Protocol("garlic-reference", (0,), seeds=(0, 1, 2, 3, 4), published="garlic-reference"),
        Protocol("cross-hospital", (0, 1), hospital=True),
        Protocol("in-hospital", (0, 1), hospital=True),
        Protocol("subject-splits", (0,), recorded=True),
    )
}
DIRECTIONS = (("A", "B"), ("B", "A"))  # cross-hospital split k: (trained and selected on, tested on)
RENAMED = {"reference": "garlic-reference"}  # ``reference`` was our split 0 with validation and test swapped


def protocol(name: str) -> Protocol:
    """The protocol called ``name``, or a ValueError listing the known ones."""
    if name in PROTOCOLS:
        return PROTOCOLS[name]
    hint = f" (`{name}` was replaced by `{RENAMED[name]}`, the reference code's own split)" if name in RENAMED else ""
    raise ValueError(f"unknown split protocol {name!r}{hint}; choose one of {', '.join(PROTOCOLS)}")


def published_for(name: str) -> list[str]:
    """The datasets the published protocol ``name`` ships splits for."""
    return sorted(path.parent.name for path in PUBLISHED.glob(f"*/{name}.json.gz"))


@cache
def published_ids(name: str, dataset: str) -> dict[int, dict[str, np.ndarray]]:
    """The shipped id lists of a published protocol on ``dataset``: split index (from 0) -> part -> sorted ids."""
    path = PUBLISHED / dataset / f"{name}.json.gz"
    if not path.is_file():
        raise ValueError(
            f"protocol {name!r} is not published for dataset {dataset!r}; it is for {', '.join(published_for(name))}"
        )
    payload = json.loads(gzip.decompress(path.read_bytes()))
    ordered = sorted(payload["splits"].items(), key=lambda item: int(item[0]))
    return {
        index: {part: np.sort(np.asarray(ids[part], dtype="int64")) for part in PARTS}
        for index, (_, ids) in enumerate(ordered)
    }


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
        with warnings.catch_warnings():  # a column with no value: said once below, not as numpy's empty-slice warning
            warnings.simplefilter("ignore", RuntimeWarning)
            static_mean = np.nan_to_num(np.nanmean(train.static, axis=0)) if len(train) else np.zeros(0)
            static_std = np.nan_to_num(np.nanstd(train.static, axis=0), nan=1.0)
        static_seen = (~np.isnan(train.static)).any(axis=0)
        unseen = [f"variable {name}" for name, seen in zip(train.variables, train.mask.any(axis=(0, 1))) if not seen]
        unseen += [f"static feature {name}" for name, seen in zip(train.static_features, static_seen) if not seen]
        if unseen:
            log.warning(
                "no value in the training part for %s: fitted as mean 0, standard deviation 1", ", ".join(unseen)
            )
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

    def standardise_static(self, static: np.ndarray) -> np.ndarray:
        """[..., S] raw static features -> standardised (float32), 0 where unknown."""
        return np.nan_to_num((static - self.static_mean) / self.static_std, nan=0.0).astype("float32")

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

    def digest(self) -> str:
        """SHA-256 of the three parts' stay ids: what a run records to prove which stays it was trained on."""
        return ids_digest({part: getattr(self, part) for part in PARTS})

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


STRATA = ("label", "hospital_system")


def strata(tensors: IrregularTensors, names: list[str], dataset: str) -> np.ndarray:
    """Each stay's stratum: its values of ``names`` (of ``STRATA``) joined, e.g. "1|B"."""
    unknown = [name for name in names if name not in STRATA]
    if unknown:
        raise ValueError(f"cannot stratify splits on {unknown}; known: {', '.join(STRATA)}")
    columns = {
        "label": lambda: tensors.labels.astype(int).astype(str),
        "hospital_system": lambda: np.asarray(source_of(dataset).hospital_systems(tensors.stay_ids), str),
    }
    keys = [columns[name]() for name in names]
    return np.array(["|".join(parts) for parts in zip(*keys)]) if keys else np.zeros(len(tensors), str)


def _stratified_part(ids: np.ndarray, strata: np.ndarray, fraction: float, seed: int, protocol: str, index: int):
    """``train_test_split`` of ``ids`` stratified on ``strata`` (the kept part, the part split off, and their strata);
    a ValueError naming the split and the strata's sizes when there are too few stays of one stratum."""
    from sklearn.model_selection import train_test_split  # 2.5 s to import: only where a split is drawn

    try:
        return train_test_split(ids, strata, test_size=fraction, stratify=strata, random_state=seed)
    except ValueError as exc:
        values, counts = np.unique(strata, return_counts=True)
        sizes = ", ".join(
            f"{value:g}: {count}" if isinstance(value, np.floating) else f"{value}: {count}"
            for value, count in zip(values, counts)
        )
        raise ValueError(
            f"protocol {protocol!r} split {index}: {len(ids)} stays ({sizes}, by stratum) are too few to "
            f"split off {fraction:.0%} with every stratum in each part ({exc})"
        ) from None


def draw_split(tensors: IrregularTensors, protocol: str, index: int, stratum: np.ndarray | None = None) -> Split:
    """80/10/10 split of the stays, drawn with ``random_state=index``, stratified on ``stratum`` (default: the
    label)."""
    labels = tensors.labels if stratum is None else stratum
    train, rest, _, rest_labels = _stratified_part(tensors.stay_ids, labels, 0.2, index, protocol, index)
    validation, test, _, _ = _stratified_part(rest, rest_labels, 0.5, index, protocol, index)
    return fitted_split(tensors, protocol, index, np.sort(train), np.sort(validation), np.sort(test))


def hospital_split(tensors: IrregularTensors, protocol: str, index: int, dataset: str) -> Split:
    """Split ``index`` of ``cross-hospital`` or ``in-hospital`` (see the module's docstring)."""
    source, target = DIRECTIONS[index]
    systems = source_of(dataset).hospital_systems(tensors.stay_ids)
    home = systems == source
    train, rest, _, rest_labels = _stratified_part(
        tensors.stay_ids[home], tensors.labels[home], 0.2, 0, protocol, index
    )
    validation, held_out, _, _ = _stratified_part(rest, rest_labels, 0.5, 0, protocol, index)
    test = tensors.stay_ids[systems == target] if protocol == "cross-hospital" else held_out
    return fitted_split(tensors, protocol, index, np.sort(train), np.sort(validation), np.sort(test))


def stays_not_held(name: str, index: int, stay_ids: np.ndarray, dataset: str) -> str | None:
    """Why ``dataset``'s ``stay_ids`` cannot hold split ``index`` of the published protocol ``name`` (not published
    for it, or the first part naming stays it lacks), None when it holds them all."""
    if dataset not in published_for(name):
        return f"protocol {name!r} is not published for dataset {dataset!r}; it is for {', '.join(published_for(name))}"
    ids = published_ids(name, dataset)[index]
    for part in PARTS:
        missing = np.setdiff1d(ids[part], stay_ids)
        if len(missing):
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            return (
                f"protocol {name!r} split {index} names {len(missing)} {part} stays that the processed dataset "
                f"{dataset!r} does not hold ({shown}); it needs the complete release the protocol was made on"
            )
    return None


def not_applicable(protocol_name: str, stay_ids: np.ndarray, dataset: str, manifest: dict | None = None) -> str | None:
    """Why the protocol cannot run on ``dataset``'s ``stay_ids`` (published for other datasets, a published split
    naming stays it lacks, or no split recorded in its ``manifest``), None when it can: a check that needs no split
    to be made."""
    chosen = protocol(protocol_name)
    if chosen.recorded:
        return None if (manifest or {}).get("subject_splits") is not None else _none_recorded(protocol_name, dataset)
    if chosen.hospital:
        hospital_systems = source_of(dataset).hospital_systems
        if hospital_systems is None:
            with_systems = ", ".join(name for name, source in SOURCES.items() if source.hospital_systems)
            return f"protocol {protocol_name!r} needs hospital systems, which only {with_systems} has"
        held = set(hospital_systems(stay_ids).tolist())
        return None if held == {"A", "B"} else f"protocol {protocol_name!r} needs stays of both hospital systems"
    if not chosen.published:
        return None
    reasons = (stays_not_held(chosen.published, index, stay_ids, dataset) for index in chosen.splits)
    return next((reason for reason in reasons if reason), None)


def published_split(tensors: IrregularTensors, name: str, index: int, dataset: str) -> Split:
    """Split ``index`` of the published protocol ``name`` on ``dataset``, refused when it does not apply."""
    reason = stays_not_held(name, index, tensors.stay_ids, dataset)
    if reason:
        raise ValueError(reason)
    ids = published_ids(name, dataset)[index]
    return fitted_split(tensors, name, index, ids["train"], ids["validation"], ids["test"])


def _none_recorded(name: str, dataset: str) -> str:
    return (
        f"protocol {name!r} takes the split a dataset's source recorded, and {dataset!r} has none (a MEDS "
        "folder records it in metadata/subject_splits.parquet)"
    )


def recorded_split(tensors: IrregularTensors, name: str, dataset: str, manifest: dict) -> Split:
    """The split the dataset's source recorded (``manifest["subject_splits"]``: part -> stay ids)."""
    recorded = manifest.get("subject_splits")
    if recorded is None:
        raise ValueError(_none_recorded(name, dataset))
    parts = [np.intersect1d(np.asarray(recorded[part], dtype="int64"), tensors.stay_ids) for part in PARTS]
    empty = [part for part, ids in zip(PARTS, parts) if not len(ids)]
    if empty:
        raise ValueError(
            f"the split recorded for {dataset!r} has no {empty[0]} stay; protocol {name!r} needs all three parts"
        )
    return fitted_split(tensors, name, 0, *parts)


def made_split(
    tensors: IrregularTensors, chosen: Protocol, index: int, dataset: str, manifest: dict | None = None
) -> Split:
    """Split ``index`` of the protocol, made from its published ids, by hospital system, from the split the
    ``manifest`` records, or drawn (stratified on the manifest's ``split_strata``, default the label)."""
    manifest = manifest or {}
    strata_names = manifest.get("split_strata")
    if chosen.recorded:
        return recorded_split(tensors, chosen.name, dataset, manifest)
    if chosen.published:
        return published_split(tensors, chosen.published, index, dataset)
    if chosen.hospital:
        reason = not_applicable(chosen.name, tensors.stay_ids, dataset)
        if reason:
            raise ValueError(reason)
        return hospital_split(tensors, chosen.name, index, dataset)
    stratum = None if strata_names in (None, ["label"]) else strata(tensors, strata_names, dataset)
    return draw_split(tensors, chosen.name, index, stratum)


def fitted_split(tensors: IrregularTensors, protocol: str, index: int, *parts: np.ndarray) -> Split:
    train, validation, test = parts
    normalisation = Normalisation.fit(tensors.subset(np.searchsorted(tensors.stay_ids, train)))
    return Split(protocol, index, train, validation, test, normalisation)


def split_path(folder: Path, protocol: str, index: int) -> Path:
    return Path(folder) / "splits" / protocol / f"split_{index}.json"


def read_split(folder: Path, protocol: str, index: int) -> Split | None:
    """The saved split, or None when it has not been saved (this never draws one). A damaged one is refused, never
    drawn again in its place: runs were tested on the stays it names."""
    path = split_path(folder, protocol, index)
    if not path.is_file():
        return None
    try:
        return Split.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as damage:  # not UTF-8, not JSON, not a split's fields
        raise ValueError(
            f"{path}: not a saved split ({type(damage).__name__}: {damage}); restore it from a copy, "
            "or delete it to have it made again: a drawn split comes back the same from its seed, a "
            "published one from the shipped id lists"
        ) from None


def load_splits(
    folder: Path, tensors: IrregularTensors, protocol_name: str = "five-split", dataset: str | None = None
) -> list[Split]:
    """The protocol's splits of ``dataset``'s ``tensors``, read from ``folder/splits`` or made and saved there on
    first use. ``dataset`` defaults to the folder's name (``processed/<dataset>``).

    A published protocol's saved split must still hold the published stays; one that does not is refused. A
    drawn split is stratified on what the manifest's ``split_strata`` names (default: the label).
    """
    chosen = protocol(protocol_name)
    dataset = dataset or Path(folder).name
    manifest_path = Path(folder) / MANIFEST
    manifest = read_manifest(folder) if manifest_path.is_file() else {}
    splits = []
    for index in chosen.splits:
        path = split_path(folder, chosen.name, index)
        split = read_split(folder, chosen.name, index)
        if split is None:
            split = made_split(tensors, chosen, index, dataset, manifest)
            write_json_atomic(path, split.to_json())
        elif chosen.published and split.digest() != published_split_digest(chosen.published, index, dataset):
            raise ValueError(
                f"{path} does not hold the stays of the published {chosen.name!r} split {index}; "
                "delete it to have it made again from the shipped id lists"
            )
        elif split.normalisation.value_low is None:  # saved before clipping: same stays, statistics refitted
            split.normalisation = Normalisation.fit(tensors.subset(split.positions(tensors, "train")))
            write_json_atomic(path, split.to_json())
        splits.append(split)
    return splits


def chosen_splits(splits: list[Split], indices: list[int], protocol_name: str) -> list[Split]:
    """``splits[k]`` for every k of ``indices``, refusing indices the protocol does not have."""
    unknown = [k for k in indices if not 0 <= k < len(splits)]
    if unknown:
        raise ValueError(f"protocol {protocol_name!r} has splits 0..{len(splits) - 1}; got {unknown}")
    return [splits[k] for k in indices]


def ids_digest(parts: dict[str, np.ndarray]) -> str:
    """SHA-256 of the stay ids of the three parts (sorted within each part), as hex."""
    text = json.dumps({part: np.sort(np.asarray(parts[part], dtype="int64")).tolist() for part in PARTS})
    return hashlib.sha256(text.encode()).hexdigest()


def published_split_digest(name: str, index: int, dataset: str) -> str:
    return ids_digest(published_ids(name, dataset)[index])
