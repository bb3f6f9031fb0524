"""A watched folder of the datasets' own record files, growing line by line as a bedside export writes them: each
PhysioNet 2012 ``RECORDID.txt`` or PhysioNet 2019 ``pNNNNNN.psv`` is one bed (its record id), and every complete
line added to it is taken into the ward's store like a FHIR reading (``garlic monitor --watch FOLDER``).

The folder is looked at every second. A file whose size or time changed is read again up to its last complete
line by the project's own reader for its format (``garlic.sources.records``, as ``garlic predict`` reads it; an
hourly run's ``.psv`` as ``garlic predict --hourly`` reads it), and its readings of the model's inputs are stored:
those already held count once (``LiveStore.add``), so reading the whole file again costs no repeat. A bed is
admitted when its file is first seen; its record's times are hours since then. A file that cannot be read yet is
logged by name and read again when it changes; a file larger than a record may be (``raw.MAX_RECORD_BYTES``) or
not a regular file (a pipe, a device) is left out, and beyond ``MAX_FILES`` the least recently changed (a warning
says how many).
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd

from garlic.live.fhir import Observed, Stay
from garlic.live.monitor import Monitor
from garlic.sources.raw import read_record_file

RECORD_NAME = re.compile(r"^(\d+\.txt|p\d+\.psv)$")
MAX_FILES = 2000
POLL_SECONDS = 1.0
log = logging.getLogger("garlic.live")


def complete_lines(path: Path) -> bytes:
    """The file up to and including its last newline: a line still being written is left for later. Read as every
    record file is (``garlic.sources.raw.read_record_file``): a pipe or a device of that name is refused, not read."""
    data = read_record_file(path)
    if isinstance(data, str):
        raise ValueError(f"{path.name}: {data}")
    return data[: data.rfind(b"\n") + 1]


def read_tables(name: str, data: bytes, hourly: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Observations and static rows of one record file's ``data``, by the project's reader for its name."""
    from garlic.sources.physionet2019 import read_hourly_record_files
    from garlic.sources.records import read_record_files

    with tempfile.TemporaryDirectory(prefix="garlic-watch-") as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            if hourly and name.endswith(".psv"):
                observations, static, _ = read_hourly_record_files([path])
                return observations, static
            return read_record_files([path], left_out=[])
        except ValueError as exc:  # the readers name the file: the watched one, not its temporary copy
            raise ValueError(str(exc).replace(str(path), name)) from None


class FolderWatcher:
    """Takes the readings of ``folder``'s record files into ``monitor``'s store, for a model of inputs ``names``."""

    def __init__(self, folder: Path, monitor: Monitor, names: list[str], hourly: bool = False):
        if not Path(folder).is_dir():
            raise ValueError(f"--watch {folder}: not a folder")
        self.folder, self.monitor, self.names, self.hourly = Path(folder), monitor, set(names), hourly
        self.seen: dict[str, tuple[int, int]] = {}  # file name -> (size, modification time) when last read
        self.left_out = 0  # record files beyond MAX_FILES at the last scan, said when it changes
        self.stopping = threading.Event()

    def scan(self) -> int:
        """Read every record file that changed since the last scan; the readings stored. Beyond ``MAX_FILES``, the
        most recently changed are read: a folder that keeps the files of discharged stays grows past the cap, and
        its newest beds are the ones that must not be left out."""
        stored = 0
        statuses = {}
        for entry in self.folder.iterdir():
            if RECORD_NAME.match(entry.name):
                try:
                    statuses[entry] = entry.stat()
                except OSError:  # removed meanwhile
                    continue
        newest = sorted(statuses, key=lambda path: statuses[path].st_mtime_ns, reverse=True)[:MAX_FILES]
        if len(statuses) - len(newest) != self.left_out:
            self.left_out = len(statuses) - len(newest)
            if self.left_out:
                log.warning(
                    "%d record files left out: the watched folder holds %d, and the %d most recently changed are read",
                    self.left_out,
                    len(statuses),
                    MAX_FILES,
                )
        for path in sorted(newest):
            status = statuses[path]
            signature = (status.st_size, status.st_mtime_ns)
            if self.seen.get(path.name) == signature:
                continue
            self.seen[path.name] = signature
            try:
                stored += self.take(path)
            except (OSError, ValueError) as exc:
                log.warning("%s cannot be read yet: %s", path.name, str(exc)[:300])
        return stored

    def take(self, path: Path) -> int:
        observations, static = read_tables(path.name, complete_lines(path), self.hourly)
        if static.empty:
            return 0
        bed = str(int(static["stay_id"].iloc[0]))
        admitted = self.monitor.store.admitted(bed)
        if admitted is None:
            admitted = datetime.now(timezone.utc).replace(microsecond=0)
            self.monitor.store.admit(Stay(bed, True, admitted, None))
        descriptors = static.drop(columns="stay_id").melt(var_name="variable", value_name="value").dropna()
        rows = pd.concat([descriptors.assign(time=0.0), observations[["time", "variable", "value"]]])
        rows = rows[rows["variable"].astype(str).isin(self.names)]
        readings = [
            Observed(bed, str(variable), admitted + timedelta(hours=float(time)), float(value))
            for variable, time, value in zip(rows["variable"], rows["time"], rows["value"])
        ]
        return self.monitor.take(readings)[0]

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.scan()
            except Exception:  # a failed scan is tried again; what is stored stays stored
                log.exception("scanning the watched folder failed; trying again")
            self.stopping.wait(POLL_SECONDS)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="garlic-live-watch", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.stopping.set()
