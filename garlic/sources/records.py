"""Stand-alone record files of any supported format -> observation and static tables, chosen by file suffix (each
source with one-stay record files names its suffix and reader in its ``SOURCE``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from garlic.sources import discovered
from garlic.sources.raw import LeftOut


def readers() -> dict[str, Callable]:
    """Record-file suffix -> the reader of its source."""
    return {s.record_suffix: s.read_record_files for s in discovered().values() if s.record_suffix is not None}


def read_record_files(paths: list[Path], left_out: list[LeftOut] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """PhysioNet 2012 ``RECORDID.txt`` or PhysioNet 2019 ``pNNNNNN.psv`` records -> observation and static tables;
    a folder stands for the record files in it. Given ``left_out``, a record without an observation in the model's
    window is added there, with a warning, instead of refused (while one is left)."""
    known = readers()
    files = record_files(paths, *known)
    suffixes = {file.suffix.lower() for file in files}
    if len(suffixes) != 1:
        raise ValueError(f"record files must all be one format, one of {sorted(known)}; got {sorted(suffixes)}")
    return known[suffixes.pop()](files, left_out=left_out)


def record_files(paths: list[Path], *suffixes: str) -> list[Path]:
    """The files of ``paths`` (a folder stands for its files) whose names end in one of ``suffixes``; anything else
    is refused, naming it."""
    return [file for path in map(Path, paths) for file in _record_files(path, suffixes)]


def _record_files(path: Path, known: tuple[str, ...] | dict[str, Callable]) -> list[Path]:
    if path.is_dir():
        found = sorted(file for file in path.iterdir() if file.suffix.lower() in known and file.is_file())
        if not found:
            raise ValueError(f"{path} is a folder without record files ({', '.join(sorted(known))})")
        return found
    if path.suffix.lower() not in known:
        raise ValueError(f"{path}: not a record file; expected a name ending in {' or '.join(sorted(known))}")
    return [path]
