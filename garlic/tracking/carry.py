"""The training states of unfinished units, carried where they outlive their store (``--carry DIR``: durable storage
beside a scratch store, or a working tree that a cut-off machine's work is committed to, e.g. ``docs/results/unfinished``).

A resumable fit saves its state in its MLflow store after every epoch and within long ones
(``run_contract.training_state_path``), named by its run; the store lives and dies with one machine. With a carry
folder, every save is also copied there, named by the unit it belongs to (``run_contract.UnitIdentity``): its method,
split, model seed, settings and data, none of which depends on a store. A unit started in another store (a later run's, on a fresh machine)
with no state of its own goes on from its carried state, in a new run: exactly where it stopped, but with the per-epoch
metrics of the epochs before in the old run only. A carried state is removed once its unit has finished, so the folder
holds the units under way and nothing else.

    CARRY/<method>-<protocol>-split_<k>[-seed_<s>]-<settings digest>-<data digest>.pt
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from garlic.io.atomic import atomic_file
from garlic.tracking.run_contract import UnitIdentity

DATA_DIGEST_CHARS = 12
_DATA_DIGEST = re.compile(rf"-([0-9a-f]{{{DATA_DIGEST_CHARS}}})$")  # how a unit's file name ends


def check_folder(folder: Path | None) -> None:
    """Refuse (``ValueError``) a carry folder that is a file."""
    if folder is not None and Path(folder).exists() and not Path(folder).is_dir():
        raise ValueError(f"--carry {folder} is a file; it names the folder the training states are carried in")


def unit_state(folder: Path | None, unit: UnitIdentity) -> Path | None:
    """Where ``unit``'s state is carried in ``folder``; None without a folder (nothing carried)."""
    return None if folder is None else Path(folder) / unit.carried_name(DATA_DIGEST_CHARS)


def of_data(path: Path, data_digests: set[str]) -> bool:
    """Whether the carried state ``path`` is a unit of the data of one of ``data_digests`` (manifest digests); a file
    not named as a unit's is taken for any data's, so that a report still names it."""
    named = _DATA_DIGEST.search(Path(path).stem)
    return named is None or named.group(1) in {digest[:DATA_DIGEST_CHARS] for digest in data_digests}


def resume_from(carried: Path | None, state: Path) -> Path | None:
    """The state a unit's fit goes on from: its run's own (``state``), else the unit's carried one, else none (read
    with ``garlic.training.state.load_training_state``, which names the file it refuses)."""
    for path in (state, carried):
        if path is not None and path.is_file():
            return path
    return None


def carry(carried: Path | None, state: Path) -> None:
    """Copy the state a fit has just saved (``state``) to its carried place."""
    if carried is not None:
        with open(state, "rb") as read, atomic_file(carried, "wb") as write:
            shutil.copyfileobj(read, write)


def finish(carried: Path | None) -> None:
    """The unit has finished: its carried state goes."""
    if carried is not None:
        carried.unlink(missing_ok=True)
