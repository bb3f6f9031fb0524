"""Session fixtures: the real PhysioNet 2012 release, read once without the preprocessor (``helpers.RawRelease``)
and preprocessed once per test session. Plain helpers live in ``helpers.py``.

Torch runs one thread in the tests and in the commands they start, as the user would set it (``OMP_NUM_THREADS``):
left to choose (``garlic.data.threads``), a fit picks its threads from what the other test workers keep busy,
and two fits meant to be the same differ in their last bits. The tests of that choice clear it
(``tests/test_threads.py``).
"""

from __future__ import annotations

import csv
import os
import tarfile
from pathlib import Path

import pytest

from helpers import HAVE_P12, P12, RawRelease, raw_series

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: it reads it once


@pytest.fixture(scope="session")
def p12_raw() -> RawRelease:
    if not HAVE_P12:
        pytest.skip(f"the PhysioNet 2012 release is not at {P12}")
    raw = RawRelease()
    for letter in "abc":
        archive_name = f"set-{letter}.tar.gz"
        with tarfile.open(P12 / archive_name, "r:gz") as archive:
            for member in archive:
                if not member.isfile() or not member.name.endswith(".txt"):
                    continue
                text = archive.extractfile(member).read().decode()
                stay = int(Path(member.name).stem)
                raw.texts[stay] = (letter, text)
                if ",," in text:
                    for number, line in enumerate(text.splitlines(), start=1):
                        if line.count(",") == 2 and line.split(",")[1] == "":
                            raw.nameless.append((f"{archive_name}:{member.name}", number))
                raw.in_window[stay] = raw_series(text)
        with open(P12 / f"Outcomes-{letter}.txt", newline="") as handle:
            for row in csv.DictReader(handle):
                raw.outcomes[int(row["RecordID"])] = row
    return raw


@pytest.fixture(scope="session")
def p12_processed(tmp_path_factory) -> Path:
    """The whole release preprocessed once per session (about 10 s)."""
    if not HAVE_P12:
        pytest.skip(f"the PhysioNet 2012 release is not at {P12}")
    from garlic.sources.physionet2012 import preprocess

    destination = tmp_path_factory.mktemp("processed") / "physionet2012"  # as ``processed/<dataset>``
    preprocess(P12, destination)
    return destination


@pytest.fixture(scope="session")
def p12_dataset(p12_processed):
    from garlic.io.tables import read_processed

    return read_processed(p12_processed)


@pytest.fixture(scope="session")
def p12_tensors(p12_processed):
    from garlic.io.tensors import load_tensors

    return load_tensors(p12_processed)
