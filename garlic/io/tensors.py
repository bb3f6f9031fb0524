"""Processed tables -> padded irregular tensors, cached next to the tables as one uncompressed ``.npz``.

Per stay the time axis is the sorted union of its observation times; a cell with no measurement has mask 0 and
value 0. A stay with no observation at all (a cohort may keep one for its static features, as Raindrop's P19
cohort does) is a single step at hour 0 with nothing observed. When a variable is recorded twice at the same time,
the later row wins; volumes, which add up, reach here already summed (``tables.sum_simultaneous``).

The prediction times of a dataset with a tasks table (``tables.TASKS``) ride along as flat arrays
(``PredictionTimes``); a dataset without one asks for a risk per stay at the end of its input.
"""

from __future__ import annotations

import hashlib
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from garlic.io.atomic import atomic_file, remove_stale_temporaries
from garlic.io.tables import (
    LABELS,
    MANIFEST,
    OBSERVATIONS,
    STATIC,
    TASKS,
    ProcessedDataset,
    read_manifest,
    read_processed,
)

TENSORS = "tensors.npz"
log = logging.getLogger(__name__)


@dataclass
class PredictionTimes:
    """The times at which a risk is asked for, M of them, sorted by stay and then time.

    stay  [M] int64   the stay's position in its tensors
    time  [M] float32 hours since admission: the input is what the stay recorded up to this time
    label [M] float32 0/1 the outcome to predict at that time (NaN for times to answer, not to score)
    score how the risks at these times are scored beyond AUROC and AUPRC: the manifest's ``task["score"]``
          ("sepsis-utility": the Sepsis Challenge's utility over each stay's hours), "" for none
    """

    stay: np.ndarray
    time: np.ndarray
    label: np.ndarray
    score: str = ""

    def __len__(self) -> int:
        return len(self.stay)

    def of_stays(self, index: np.ndarray, stays: int) -> "PredictionTimes":
        """The rows of the stays at positions ``index`` (of ``stays``), renumbered to their order in ``index``."""
        position = np.full(stays, -1, dtype="int64")
        position[np.asarray(index)] = np.arange(len(index))
        new_stay = position[self.stay]
        kept = np.flatnonzero(new_stay >= 0)
        kept = kept[np.argsort(new_stay[kept], kind="stable")]  # time order within a stay is kept
        return PredictionTimes(new_stay[kept], self.time[kept], self.label[kept], self.score)


@dataclass
class IrregularTensors:
    """A whole cohort as padded arrays. N stays, T the longest stay's steps, D variables, S static features.

    values  [N, T, D] float32, 0 where not observed
    mask    [N, T, D] bool, True where observed
    times   [N, T]    float32 hours since admission, 0 in padding
    lengths [N]       int64 number of real time steps
    static  [N, S]    float32, NaN where unknown
    labels  [N]       float32 0/1
    task    the dataset's prediction times (``PredictionTimes``), or None: one risk per stay from its whole input
    """

    stay_ids: np.ndarray
    values: np.ndarray
    mask: np.ndarray
    times: np.ndarray
    lengths: np.ndarray
    static: np.ndarray
    labels: np.ndarray
    variables: list[str]
    static_features: list[str]
    task: PredictionTimes | None = None

    def __len__(self) -> int:
        return len(self.stay_ids)

    def prediction_times(self) -> PredictionTimes:
        """Where a risk is asked for: the task's rows, or one per stay at the end of its input with its label."""
        if self.task is not None:
            return self.task
        stays = np.arange(len(self))
        end = self.times[stays, np.maximum(self.lengths - 1, 0)] if self.times.size else np.zeros(len(self), "float32")
        return PredictionTimes(stays, end.astype("float32"), self.labels.astype("float32"))

    def subset(self, index: np.ndarray) -> "IrregularTensors":
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        return IrregularTensors(
            stay_ids=self.stay_ids[index],
            values=self.values[index],
            mask=self.mask[index],
            times=self.times[index],
            lengths=self.lengths[index],
            static=self.static[index],
            labels=self.labels[index],
            variables=self.variables,
            static_features=self.static_features,
            task=None if self.task is None else self.task.of_stays(index, len(self)),
        )

    def cut_at_prediction_times(self) -> "IrregularTensors":
        """One stay per prediction time (M stays, no task): the m-th holds only its stay's observations at time <=
        its time, with that time's label, so that a model of whole stays answers every prediction time (each
        prefix as a stay of its own, as if the record had ended there)."""
        times = self.prediction_times()
        stay_times = self.times[times.stay]  # [M, T]
        real = np.arange(self.times.shape[1])[None, :] < self.lengths[times.stay][:, None]
        lengths = (real & (stay_times <= times.time[:, None])).sum(axis=1)  # times are sorted within a stay
        kept = np.arange(self.times.shape[1])[None, :] < lengths[:, None]  # [M, T]
        return IrregularTensors(
            stay_ids=self.stay_ids[times.stay],
            values=np.where(kept[..., None], self.values[times.stay], 0).astype(self.values.dtype),
            mask=kept[..., None] & self.mask[times.stay],
            times=np.where(kept, stay_times, 0).astype(self.times.dtype),
            lengths=lengths.astype(self.lengths.dtype),
            static=self.static[times.stay],
            labels=times.label.astype(self.labels.dtype),
            variables=self.variables,
            static_features=self.static_features,
        )


def tensorize(dataset: ProcessedDataset) -> IrregularTensors:
    """Vectorised over all observations: no loop over stays, steps or variables."""
    labels = dataset.labels.sort_values("stay_id")
    stay_ids = labels["stay_id"].to_numpy("int64")
    obs = dataset.observations
    variable = obs["variable"]
    if isinstance(variable.dtype, pd.CategoricalDtype):  # as read from Parquet: recode without a string pass
        code = variable.cat.set_categories(dataset.variables).cat.codes.to_numpy()
    else:
        code = pd.Categorical(variable, categories=dataset.variables).codes
    if (code < 0).any():
        unknown = sorted(set(variable[code < 0].astype(str)))
        raise ValueError(f"observations name variables outside the dataset's variable list: {unknown}")
    obs = obs.assign(code=code)
    obs = obs.sort_values(["stay_id", "time"], kind="stable")
    obs = obs.drop_duplicates(["stay_id", "time", "code"], keep="last")

    stay = np.searchsorted(stay_ids, obs["stay_id"].to_numpy())
    time = obs["time"].to_numpy("float32")
    new_step = np.ones(len(obs), dtype=bool)
    new_step[1:] = (stay[1:] != stay[:-1]) | (time[1:] != time[:-1])
    step = np.cumsum(new_step) - 1
    steps_observed = np.bincount(stay[new_step], minlength=len(stay_ids)).astype("int64")
    first_step = np.concatenate([[0], np.cumsum(steps_observed)[:-1]])
    step_in_stay = step - first_step[stay]
    lengths = np.maximum(steps_observed, 1)  # a stay with no observation: one empty step at hour 0

    n, t, d = len(stay_ids), int(lengths.max(initial=0)), len(dataset.variables)
    values = np.zeros((n, t, d), dtype="float32")
    mask = np.zeros((n, t, d), dtype=bool)
    times = np.zeros((n, t), dtype="float32")
    code = obs["code"].to_numpy()
    values[stay, step_in_stay, code] = obs["value"].to_numpy("float32")
    mask[stay, step_in_stay, code] = True
    times[stay[new_step], step_in_stay[new_step]] = time[new_step]

    static = dataset.static.set_index("stay_id").reindex(stay_ids)[dataset.static_features]
    return IrregularTensors(
        stay_ids=stay_ids,
        values=values,
        mask=mask,
        times=times,
        lengths=lengths,
        static=static.to_numpy("float32"),
        labels=labels["label"].to_numpy("float32"),
        variables=list(dataset.variables),
        static_features=list(dataset.static_features),
        task=None if dataset.tasks is None else _prediction_times(dataset, stay_ids),
    )


def _prediction_times(dataset: ProcessedDataset, stay_ids: np.ndarray) -> PredictionTimes:
    tasks = dataset.tasks.sort_values(["stay_id", "time"], kind="stable")
    return PredictionTimes(
        stay=np.searchsorted(stay_ids, tasks["stay_id"].to_numpy("int64")),
        time=tasks["time"].to_numpy("float32"),
        # prediction times to answer, not to score (``garlic predict``), may come without labels: NaN
        label=tasks["label"].to_numpy("float32") if "label" in tasks else np.full(len(tasks), np.nan, "float32"),
        score=dataset.manifest.get("task", {}).get("score", ""),
    )


def _fingerprint(folder: Path) -> str:
    """A digest of the manifest and the tables: any change to what the tensors are built from shows."""
    digest = hashlib.sha256()
    for name in (MANIFEST, OBSERVATIONS, STATIC, LABELS, *([TASKS] if (folder / TASKS).is_file() else [])):
        data = (folder / name).read_bytes()
        digest.update(b"%s %d\n" % (name.encode(), len(data)))
        digest.update(data)
    return digest.hexdigest()


TASK_ARRAYS = ("stay", "time", "label", "score")


def save_tensors(tensors: IrregularTensors, path: Path, fingerprint: str) -> None:
    """Write the cache atomically: into a locked temporary beside ``path``, then renamed into place."""
    with atomic_file(path, suffix=".npz", lock=True) as out:
        np.savez(
            out,
            stay_ids=tensors.stay_ids,
            values=tensors.values,
            mask=tensors.mask,
            times=tensors.times,
            lengths=tensors.lengths,
            static=tensors.static,
            labels=tensors.labels,
            variables=np.array(tensors.variables, dtype=str),
            static_features=np.array(tensors.static_features, dtype=str),
            fingerprint=np.array(fingerprint),
            **(
                {}
                if tensors.task is None
                else {f"task_{key}": np.asarray(getattr(tensors.task, key)) for key in TASK_ARRAYS}
            ),
        )


def load_tensors(folder: Path) -> IrregularTensors:
    """The cohort's tensors, built from the tables on first use and reloaded from the cache afterwards.

    The cache records a digest of the manifest and tables it was built from, so any change to them invalidates it.
    """
    folder = Path(folder)
    read_manifest(folder)  # a clear error when the folder is not a processed dataset
    fingerprint = _fingerprint(folder)
    cache = folder / TENSORS
    remove_stale_temporaries(cache, suffix=".npz")
    if cache.is_file():
        try:
            cached = _cached_tensors(cache, fingerprint)
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as damage:
            # Written atomically, a cache is damaged only from outside (a copy cut short, a disk error); it is
            # derived from the tables, so it is made again rather than refused.
            log.warning("the tensor cache %s cannot be read (%s): making it again from the tables", cache, damage)
            cached = None
        if cached is not None:
            return cached
    tensors = tensorize(read_processed(folder))
    save_tensors(tensors, cache, fingerprint)
    return tensors


def _cached_tensors(cache: Path, fingerprint: str) -> IrregularTensors | None:
    """The tensors of the cache file, None when it was made from other tables than those of ``fingerprint``."""
    with np.load(cache, allow_pickle=False) as stored:
        if str(stored["fingerprint"]) != fingerprint:
            return None
        arrays = {key: stored[key] for key in stored.files if key != "fingerprint"}
    arrays["variables"] = arrays["variables"].tolist()
    arrays["static_features"] = arrays["static_features"].tolist()
    task = {key: arrays.pop(f"task_{key}") for key in TASK_ARRAYS if f"task_{key}" in arrays}
    if task:
        task["score"] = str(task["score"])
    return IrregularTensors(**arrays, task=PredictionTimes(**task) if task else None)
