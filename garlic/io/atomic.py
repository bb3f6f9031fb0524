"""Files written atomically: a reader sees the previous content or the new one, never a half-written file.

Every file is written into a temporary beside it (``.NAME.XXXXXXXX`` + ``suffix``, so on the same filesystem), then
renamed into place with ``os.replace``. A writer that fails, SIGTERM included (it arrives as ``SystemExit``), removes
its temporary. A writer killed outright (SIGKILL) cannot: with ``locked=True`` its temporary is locked while it is
written, so that ``remove_stale_temporaries`` can tell a dead writer's leftovers from a live writer's work.
Published files are readable by all (0644), as the files around them.

Folders (a processed dataset) are published the same way, by ``garlic.io.tables.atomic_directory``.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from garlic.io.locks import acquire, is_held, locked, release


def _temporary_pattern(path: Path, suffix: str) -> str:
    return f".{glob.escape(path.name)}.*{glob.escape(suffix)}"


@contextmanager
def atomic_file(path: Path, mode: str = "wb", suffix: str = "", lock: bool = False) -> Iterator[IO]:
    """An open temporary file (``mode`` "wb" or "w") that replaces ``path`` when the ``with`` block succeeds.

    ``lock`` holds a lock on the temporary while it is written (taken under the folder's lock, so that no sweep ever
    sees it unlocked); ``remove_stale_temporaries(path, suffix)`` then removes only what killed writers left.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    held = None
    if lock:
        with locked(path.parent):
            handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
            held = acquire(Path(temporary))
    else:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(handle, mode) as out:
            yield out
        os.chmod(temporary, 0o644)  # mkstemp's private 0600 would hide the file from other users
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    finally:
        if held is not None:
            release(held)


def remove_stale_temporaries(path: Path, suffix: str = "") -> None:
    """Delete the temporaries of ``path`` that killed writers left (those written with ``lock=True``; a live writer
    keeps its temporary locked)."""
    path = Path(path)
    pattern = _temporary_pattern(path, suffix)
    if not list(path.parent.glob(pattern)):
        return  # the usual case: nothing to lock (and the folder may be read-only)
    with locked(path.parent):
        for temporary in path.parent.glob(pattern):
            if not is_held(temporary):
                temporary.unlink(missing_ok=True)


def write_json_atomic(path: Path, payload: dict) -> None:
    """``payload`` as indented JSON with sorted keys, atomically."""
    with atomic_file(path, "w") as out:
        json.dump(payload, out, indent=2, sort_keys=True)
