"""Stand-alone record files of any supported format -> observation and static tables, chosen by file suffix."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from preprocessing import physionet2012, physionet2019

READERS = {".txt": physionet2012.read_record_files, ".psv": physionet2019.read_record_files}


def read_record_files(paths: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """PhysioNet 2012 ``RECORDID.txt`` or PhysioNet 2019 ``pNNNNNN.psv`` records -> observation and static tables."""
    suffixes = {Path(p).suffix.lower() for p in paths}
    if len(suffixes) != 1 or next(iter(suffixes)) not in READERS:
        raise ValueError(
            f"record files must all be one format, one of {sorted(READERS)}; got suffixes {sorted(suffixes)}"
        )
    return READERS[suffixes.pop()](paths)
