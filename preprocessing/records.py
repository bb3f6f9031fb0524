"""Stand-alone record files of any supported format -> observation and static tables, chosen by file suffix."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from preprocessing import physionet2012

READERS = {".txt": physionet2012.read_record_files}


def read_record_files(paths: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """PhysioNet 2012 ``.txt`` records (and PhysioNet 2019 ``.psv`` where that reader is present) -> tables."""
    suffixes = {Path(p).suffix.lower() for p in paths}
    if len(suffixes) != 1 or next(iter(suffixes)) not in READERS:
        raise ValueError(
            f"record files must all be one format, one of {sorted(READERS)}; got suffixes {sorted(suffixes)}"
        )
    return READERS[suffixes.pop()](paths)
