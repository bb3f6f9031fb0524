"""Stand-alone record files of any supported format -> observation and static tables, chosen by file suffix."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from preprocessing import physionet2012, physionet2019
from preprocessing.raw import LeftOut

READERS = {".txt": physionet2012.read_record_files, ".psv": physionet2019.read_record_files}


def read_record_files(
    paths: list[Path], left_out: list[LeftOut] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """PhysioNet 2012 ``RECORDID.txt`` or PhysioNet 2019 ``pNNNNNN.psv`` records -> observation and static tables;
    a folder stands for the record files in it. Given ``left_out``, a record without an observation in the model's
    window is added there, with a warning, instead of refused (while one is left)."""
    files = [file for path in map(Path, paths) for file in _record_files(path)]
    suffixes = {file.suffix.lower() for file in files}
    if len(suffixes) != 1:
        raise ValueError(f"record files must all be one format, one of {sorted(READERS)}; got {sorted(suffixes)}")
    return READERS[suffixes.pop()](files, left_out=left_out)


def _record_files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(file for file in path.iterdir() if file.suffix.lower() in READERS and file.is_file())
        if not found:
            raise ValueError(f"{path} is a folder without record files ({', '.join(sorted(READERS))})")
        return found
    if path.suffix.lower() not in READERS:
        raise ValueError(f"{path}: not a record file; expected a name ending in {' or '.join(sorted(READERS))}")
    return [path]
