"""What a training run records in MLflow to tie it to its data, and the check that the data are still those.

Every split run (the run that holds a model) logs these parameters:

- ``dataset``: the dataset's name (with the rest of the config);
- ``split``: ``<protocol>/split_<k>``, the saved split file ``splits/<protocol>/split_<k>.json`` of the dataset;
- ``seed``: the model seed it was trained with (with the rest of the config);
- ``data_folder``: the processed dataset folder it was trained from;
- ``split_digest``: SHA-256 of the split's train, validation and test stay ids (``Split.digest``);
- ``data_digest``: SHA-256 of the dataset's ``manifest.json`` content (files read, their checksums, counts).

A run that groups several splits (or seeds) also logs ``split_indices`` and ``seeds``, what ``--resume`` needs.
A run trained from a config file (``garlic train``, a preset of ``garlic/configs``) carries the tag ``preset``:
the file's stem (``physionet2012-best``), which names the run in the dashboard; its settings are the params above.
A GARLIC split run that ``garlic train`` finished carries the tag ``stages`` (``STAGES``): its training stages by
epoch. An hourly run also logs the alert policy it chose on validation (``alert_*``, ``docs/alerts.md``).

Artifacts (paths inside a run; the names below own them):

- ``config.json`` (``CONFIG``), ``data_manifest.json`` (``DATA_MANIFEST``): on the run that ``garlic train`` started;
- ``model/`` (``MODEL``): the saved method (``garlic.methods.model_files``), on every split run of one that is saved;
- ``predictions/<part>.csv`` (``predictions(part)``): ``stay_id, label, risk`` of the validation and test parts;
- ``plots/<name>`` (``plot(name)``): ROC/PR, calibration and graph figures;
- ``graph/adjacency.csv`` (``GRAPH``): the learned adjacency, rows the sources;
- ``explanations/`` (``EXPLANATIONS``, ``explanation(name)``): importance tables and figures; a run whose model
  has no built-in explanation has none, and its tag ``explanations`` (``EXPLANATIONS_TAG``) says why.

A unit of work is one method on one split of one dataset's data, with its settings (and model seed): the same unit
whichever command trains it (``garlic train``, the comparison table, a study) and whichever store or experiment holds
its run. ``UnitIdentity`` says what it is, once: the tags every unit's run carries (``UnitIdentity.tags``), by which
any path finds a finished one in any experiment of a store (``garlic.tracking.queries.finished_unit_run``), and the
name of its carried training state (``garlic.tracking.carry``).

Outside the MLflow artifacts, a split run that is training keeps its training state (for ``--resume``) at
``training_state_path(store, run_id)``: ``STORE/training-states/<run id>/training.pt``.

Re-running ``garlic preprocess`` replaces a dataset's folder, splits included, and a redrawn or changed split
would silently put training stays into a run's "test" part. So whatever re-reads a run's test stays
(``garlic evaluate``, the dashboard) calls ``verify_split`` first, which refuses a split or a dataset that is not
the one the run was trained on, and ``--resume`` calls ``verify_unchanged`` before it trains on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from garlic.data.splits import Split, read_split

DATASET = "dataset"
SPLIT = "split"
SEED = "seed"
DATA_FOLDER = "data_folder"
SPLIT_DIGEST = "split_digest"
DATA_DIGEST = "data_digest"
SPLIT_INDICES = "split_indices"
SEEDS = "seeds"
PRESET = "preset"
METHOD = "method"  # the tag naming a run's registered method (``garlic.methods.registry``); GARLIC's by default
SETTINGS = "settings"  # the tag of a unit's run: the digest of its settings (``UnitIdentity``)
STAGES = "stages"  # the tag of a GARLIC split run: its training stages by epoch ("reconstruction 1-3, ...")

CONFIG = "config.json"
DATA_MANIFEST = "data_manifest.json"
MODEL = "model"
GRAPH = "graph/adjacency.csv"
EXPLANATIONS = "explanations"
EXPLANATIONS_TAG = "explanations"
TRAINING_STATE = "training.pt"
GARLIC = "garlic"  # the registry's name of GARLIC, whose runs carry no ``METHOD`` tag


def method_tags(method: str) -> dict[str, str]:
    """The tags that name a run's method: none for GARLIC, whose runs predate the other methods'."""
    return {} if method == GARLIC else {METHOD: method}


def method_of(run) -> str:
    """The registered method an MLflow run trained (``method_tags`` read back)."""
    return run.data.tags.get(METHOD, GARLIC)


def method_params(method: str, config: dict, settings: dict) -> dict:
    """A run's parameters for its method: the dataset and protocol it ran on, its name where its runs are tagged with
    it (``method_tags``) and its settings (``MethodSpec.settings``; GARLIC's, the run's config, hold the dataset and
    protocol already)."""
    return {DATASET: config[DATASET], "split_protocol": config["split_protocol"], **method_tags(method), **settings}


@dataclass(frozen=True)
class UnitIdentity:
    """What a unit of work is: the registered ``method`` on the split ``split`` (``<protocol>/split_<k>``) of the
    data of ``data_digest`` (``manifest_digest``; ``dataset`` its name), trained with the settings of digest
    ``settings`` (``garlic.tracking.queries.settings_digest`` of ``MethodSpec.settings``: its arguments, a GARLIC
    preset's config, the model seed among them), and ``seed`` (a seeded method's model seed, named in its carried
    state; None for the others, whose seed, where they take one, is among their settings)."""

    method: str
    dataset: str
    split: str
    seed: int | None
    settings: str
    data_digest: str

    def tags(self) -> dict[str, str]:
        """The tags the unit's run carries, and by which it is found: every path writes and reads these (runs that
        the baselines' study wrote before also carry ``study``, which finding them does not ask for)."""
        return {
            DATASET: self.dataset,
            DATA_DIGEST: self.data_digest,
            METHOD: self.method,
            SPLIT: self.split,
            SETTINGS: self.settings,
        }

    def carried_name(self, data_digest_chars: int) -> str:
        """The file name of the unit's carried training state (``garlic.tracking.carry``): method, split, seed,
        settings digest and the first ``data_digest_chars`` of its data digest."""
        seed = "" if self.seed is None else f"-seed_{self.seed}"
        split = self.split.replace("/", "-")
        return f"{self.method}-{split}{seed}-{self.settings}-{self.data_digest[:data_digest_chars]}.pt"


def training_state_path(store: Path, run_id: str) -> Path:
    """Where a split run's training state lives while it trains (``garlic.training.state``), outside MLflow."""
    return Path(store) / "training-states" / run_id / TRAINING_STATE


def predictions(part: str) -> str:
    return f"predictions/{part}.csv"


def plot(name: str) -> str:
    return f"plots/{name}"


def explanation(name: str) -> str:
    return f"{EXPLANATIONS}/{name}"


class StaleRunDataError(ValueError):
    """The data or split under a run's name are not the ones it was trained on."""


def manifest_digest(manifest: dict) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def split_params(split: Split, folder: Path, manifest: dict) -> dict[str, str]:
    """The parameters a split run logs about the stays it is trained and tested on."""
    return {
        SPLIT: split.name,
        DATA_FOLDER: str(folder),
        SPLIT_DIGEST: split.digest(),
        DATA_DIGEST: manifest_digest(manifest),
    }


def parse_split_name(name: str) -> tuple[str, int]:
    """``'<protocol>/split_<k>'`` -> (protocol, k); a ValueError for anything else (a path, ``..``)."""
    protocol, separator, index = name.partition("/split_")
    if not separator or not index.isdigit() or not protocol or "/" in protocol or protocol in {".", ".."}:
        raise ValueError(f"{name!r} is not a split name of the form '<protocol>/split_<k>'")
    return protocol, int(index)


def verify_split(run_id: str, params: dict[str, str], folder: Path, manifest: dict) -> Split:
    """The run's saved split in ``folder``, after checking that it and the dataset are the ones the run used.

    Raises StaleRunDataError, saying what changed, when the split file is gone, holds other stays, or the dataset's
    manifest differs; or when the run predates these records and so cannot be checked.
    """
    if SPLIT_DIGEST not in params or DATA_DIGEST not in params:
        raise StaleRunDataError(
            f"run {run_id} records no split or data digest (trained before runs recorded them), so its test stays "
            "cannot be told apart from its training stays; train it again"
        )
    protocol, index = parse_split_name(params[SPLIT])
    split = read_split(folder, protocol, index)
    if split is None:
        raise StaleRunDataError(
            f"run {run_id} was trained on split {params[SPLIT]}, which is no longer saved under {folder} (was the "
            "dataset preprocessed again?); a new split would mix its training and test stays"
        )
    if split.digest() != params[SPLIT_DIGEST]:
        raise StaleRunDataError(
            f"the saved split {params[SPLIT]} under {folder} holds other stays than run {run_id} was trained on "
            "(the dataset was preprocessed again or the split redrawn); its test part would overlap the run's "
            "training part"
        )
    if manifest_digest(manifest) != params[DATA_DIGEST]:
        raise StaleRunDataError(
            f"the dataset under {folder} is not the one run {run_id} was trained on (its manifest.json differs: "
            "preprocessed again from other files or with other settings)"
        )
    return split


def verify_unchanged(run_id: str, logged: dict[str, str], record: dict[str, str]) -> None:
    """Refuse to go on training run ``run_id`` (resumed) when its split or dataset changed since it started."""
    for key, what in ((SPLIT_DIGEST, f"stays of split {record[SPLIT]}"), (DATA_DIGEST, "dataset")):
        if key in logged and logged[key] != record[key]:
            raise StaleRunDataError(
                f"run {run_id} cannot be resumed: the {what} in {record[DATA_FOLDER]} changed since it started "
                "(preprocessed again?), and going on would mix the two; start a new run"
            )
