"""Exclusive file locks (``flock``) that the operating system releases when their process dies.

A lock held by a killed process is therefore never stale: whoever comes next gets it. That is what lets a later
run tell the leftovers of a dead process (a staging folder, a temporary file, a run marked RUNNING) from the work of
a live one: it tries the lock without waiting. A lock belongs to one open file, so two opens in one process (two
threads, say) exclude each other too.
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class LockHeld(BlockingIOError):
    """The lock is held by another process (or another open file of this one)."""


class LinkedLock(ValueError):
    """A lock file that is a symbolic link: taking it would write (or create) wherever the link points."""


def _open(path: Path, create: bool) -> int:
    if path.is_dir() and not path.is_symlink():
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:  # O_NOFOLLOW on a link
            raise
        raise LinkedLock(
            f"{path} is a symbolic link; a lock is never taken through one. Remove it and run the same command again"
        ) from None


def acquire(path: Path, wait: bool = True, create: bool = True) -> int:
    """Lock ``path`` (a file, created when absent and ``create``, or a folder); returns the descriptor to release.

    Raises ``LockHeld`` when ``wait`` is false and another holder has it. Links are never followed.
    """
    handle = _open(Path(path), create)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError as exc:
        os.close(handle)
        raise LockHeld(f"{path} is locked by another process") from exc
    except BaseException:
        os.close(handle)
        raise
    return handle


def release(handle: int) -> None:
    os.close(handle)


@contextmanager
def locked(path: Path, wait: bool = True, remove: bool = False) -> Iterator[None]:
    """Hold the lock on ``path`` for the ``with`` block; ``remove`` deletes the lock file on the way out.

    With ``remove``, a holder may find that the file it locked was deleted meanwhile by the previous holder; it then
    locks the file now at ``path`` instead, so two holders never hold two different files of one name.
    """
    path = Path(path)
    while True:
        handle = acquire(path, wait)
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        held = os.fstat(handle)
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            break
        release(handle)
    try:
        yield
    finally:
        if remove:
            path.unlink(missing_ok=True)
        release(handle)


def is_held(path: Path) -> bool:
    """Whether a live process holds the lock on ``path`` (an absent path is not held)."""
    try:
        handle = acquire(path, wait=False, create=False)
    except LockHeld:
        return True
    except FileNotFoundError:
        return False
    release(handle)
    return False
