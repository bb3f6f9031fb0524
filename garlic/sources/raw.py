"""Raw records of the one-file-per-stay releases (PhysioNet 2012 and 2019), shared by their parsers.

Both parsers read every record of a set in one pyarrow CSV pass over ``prefixed_rows``: each data line is
prefixed with its record's index, so the whole set is one table. Records the fast reader cannot take whole go to
the parser's line-by-line reader, which reports each rejected line as a ``Skip`` naming its file and line.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

import numpy as np

# Tables store values as float32: anything larger in magnitude would silently become inf there.
FLOAT32_MAX = float(np.finfo(np.float32).max)
# The largest measurement of either PhysioNet release is 36,400 (an AST in IU/L; the widest negative, a
# HospAdmTime of -5,367 h). A value past +-100,000 (a heart rate of 3e38) is corruption, not a clinical outlier: its
# line is skipped and counted like any unreadable one. Nothing narrower is applied: the published protocols keep
# the releases' own entry errors (a pH of 735, an FiO2 of 4,000), and so does this.
MAX_MEASUREMENT = 100_000.0
# A record line is tens of bytes. A longer one is damage, and one longer than pyarrow's 1 MiB block would stop
# the one-pass reader with an error that names no file: such records go to the line-by-line reader instead.
MAX_LINE_BYTES = 1 << 16
# One stay's record file, of any format: the largest P12 record is 24 kB and the largest P19 one 55 kB, so a
# larger file (or archive member) is not a record, and reading it whole could take all memory. All of a source's
# records are held at once (one parsing pass): their sum is bounded too, at 8 times the complete P19 (255 MB).
MAX_RECORD_BYTES = 2 << 20
MAX_SOURCE_BYTES = 2 << 30


@dataclass
class Record:
    """One stay's raw text; ``origin`` names it in messages (``set-a.tar.gz:set-a/132539.txt``)."""

    origin: str
    stay_id: int
    text: bytes


@dataclass
class Skip:
    """A rejected line (or file, when ``line`` is 1 or None) and why."""

    origin: str
    line: int | None
    reason: str

    def __str__(self) -> str:
        where = self.origin if self.line is None else f"{self.origin} line {self.line}"
        return f"{where}: {self.reason}"


log = logging.getLogger(__name__)
MAX_STAY_ID = np.iinfo(np.int64).max


def member_stay_id(member_name: str, origin: str, pattern: re.Pattern, error: type[Exception]) -> int | None:
    """The stay id in a record's file name (``pattern`` group 1), None for other files; refuses escaping paths and
    ids beyond the int64 that every table stores them as."""
    path = PurePosixPath(member_name)
    if path.is_absolute() or ".." in path.parts:
        raise error(f"{origin}: archive member {member_name!r} escapes its folder; refusing the archive")
    match = pattern.match(path.name)
    if match is None:
        return None
    stay_id = int(match.group(1))
    if stay_id > MAX_STAY_ID:
        raise error(f"{origin}: the record id in {path.name!r} is too large (at most {MAX_STAY_ID}, a 64-bit integer)")
    return stay_id


BYTE_ORDER_MARK = b"\xef\xbb\xbf"


def header_differs(first_line: bytes, expected: str) -> str:
    """Why a record's first line is not its header ``expected``, naming a byte-order mark when it starts with one."""
    if first_line.startswith(BYTE_ORDER_MARK):
        return (
            f"expected header {expected!r}; the first line starts with a byte-order mark (save the file as UTF-8 "
            "without one)"
        )
    return f"expected header {expected!r}; the first line differs"


def too_large(size: int) -> str | None:
    """Why a record file (or archive member) of ``size`` bytes is not read, None when it may be."""
    if size > MAX_RECORD_BYTES:
        return f"{size:,} bytes, more than the {MAX_RECORD_BYTES:,} a record file may have; not read"
    return None


def read_record_file(path: Path) -> bytes | str:
    """The bytes of a record file, or why it cannot be one: not a regular file (a FIFO would block the reader, a
    link to ``/dev/zero`` never end, a symlink loop or folder has no bytes), or larger than ``MAX_RECORD_BYTES``.
    Opened without blocking and checked on the open file, so nothing can be swapped in between."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return "no such record file"
        return "a symbolic link loop; not read" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
    kind = os.fstat(handle).st_mode
    if not stat.S_ISREG(kind):
        os.close(handle)
        named = "a folder" if stat.S_ISDIR(kind) else "a FIFO" if stat.S_ISFIFO(kind) else "a device or socket"
        return f"not a regular file ({named}); not read"
    with os.fdopen(handle, "rb") as file:
        data = file.read(MAX_RECORD_BYTES + 1)
    return too_large(len(data)) or data


def folder_records(
    folder: Path, glob: str, stay_id_of: Callable[[str, str], int | None], skipped: list[Skip]
) -> Iterator[Record]:
    """The records of a folder source: its files matching ``glob``, in name order, whose name gives a stay id
    (``stay_id_of(name, path)``); a file that cannot be a record (``read_record_file``) is added to ``skipped``."""
    for file in sorted(folder.glob(glob)):
        stay_id = stay_id_of(file.name, str(file))
        if stay_id is None:
            continue
        data, origin = read_record_file(file), f"{folder.name}/{file.name}"
        if isinstance(data, str):
            skipped.append(Skip(origin, None, data))
        else:
            yield Record(origin, stay_id, data)


def tar_records(
    archive_path: Path, stay_id_of: Callable[[str, str], int | None], skipped: list[Skip]
) -> Iterator[Record]:
    """The records of a ``.tar.gz`` source, in archive order; a member too large for a record is added to
    ``skipped`` unread."""
    with tarfile.open(archive_path, "r:gz") as archive:
        for member in archive:
            stay_id = stay_id_of(member.name, archive_path.name)
            if stay_id is None or not member.isfile():
                continue
            origin = f"{archive_path.name}:{member.name}"
            if reason := too_large(member.size):
                skipped.append(Skip(origin, None, reason))
                continue
            yield Record(origin, stay_id, archive.extractfile(member).read())


class SourceBudget:
    """Counts the bytes of the records read from one source (all its sets); past ``MAX_SOURCE_BYTES`` an ``error``
    names the record that crossed it. ``budget(records)`` passes the records through."""

    def __init__(self, error: type[Exception]):
        self.error, self.spent = error, 0

    def __call__(self, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            self.spent += len(record.text)
            if self.spent > MAX_SOURCE_BYTES:
                raise self.error(
                    f"{record.origin}: the records read so far add up to more than {MAX_SOURCE_BYTES:,} "
                    "bytes, far more than any release holds; not read further"
                )
            yield record


def records_from_files(paths: list[Path], pattern: re.Pattern, error: type[Exception], expected: str) -> list[Record]:
    """Stand-alone record files (uploads, ``garlic predict``); a file that cannot be read (``read_record_file``)
    or one not named like ``expected`` (e.g. ``RECORDID.txt``) is an ``error``."""
    records = []
    for path in map(Path, paths):
        stay_id = member_stay_id(path.name, str(path), pattern, error)
        if stay_id is None:
            raise error(f"{path}: expected a record file named {expected}")
        data = read_record_file(path)
        if isinstance(data, str):
            raise error(f"{path}: {data}")
        records.append(Record(str(path), stay_id, data))
    refuse_repeated_stays(records, error)
    return records


def records_digest(records: list[Record]) -> str:
    """One SHA-256 over records' ids and bytes: the manifest's digest of a source read from a folder."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(b"%d\n%d\n" % (record.stay_id, len(record.text)))
        digest.update(record.text)
    return digest.hexdigest()


def refuse_repeated_stays(records: list[Record], error: type[Exception]) -> None:
    """One file per stay: an ``error`` naming the first two files of a stay id otherwise."""
    seen: dict[int, str] = {}
    for record in records:
        if record.stay_id in seen:
            raise error(f"stay {record.stay_id} is in two files: {seen[record.stay_id]} and {record.origin}")
        seen[record.stay_id] = record.origin


@dataclass(frozen=True)
class LeftOut:
    """A record given for prediction that got no risk, and why."""

    stay_id: int
    origin: str
    reason: str


def records_with_observations(
    records: list[Record],
    observed: np.ndarray,
    window: str,
    error: type[Exception],
    left_out: list[LeftOut] | None = None,
) -> list[int]:
    """The stay ids of the stand-alone ``records`` that hold a time-series value inside the model's input ``window``:
    a risk computed from no observation at all would be a number made of nothing. Any other record is an ``error``
    naming the file(s); given a ``left_out`` list (many records given to ``garlic predict``) it is added there, with
    a warning naming it, so that one empty record does not block the others, unless no record is left."""
    observed = set(np.asarray(observed).tolist())
    empty = [record for record in records if record.stay_id not in observed]
    if empty and not (left_out is not None and len(empty) < len(records)):
        more = f" (and {len(empty) - 1} more: {', '.join(r.origin for r in empty[1:])})" if len(empty) > 1 else ""
        raise error(
            f"{empty[0].origin}: no observation of a time-series variable in {window}; no risk can be "
            f"computed from it{more}"
        )
    for record in empty:
        log.warning("%s: no observation of a time-series variable in %s; left out, with no risk", record.origin, window)
        left_out.append(LeftOut(record.stay_id, record.origin, f"no observation of a time-series variable in {window}"))
    return [record.stay_id for record in records if record.stay_id in observed]


def line_too_long(line: bytes) -> str | None:
    """The reason a line is rejected for its length alone, without quoting it."""
    if len(line) > MAX_LINE_BYTES:
        return f"line of {len(line):,} bytes, longer than the {MAX_LINE_BYTES:,} a record line may have"
    return None


def parse_value(text: str, name: str, limit: float = MAX_MEASUREMENT) -> float | str:
    """One measurement's text -> its value, or the reason it is rejected (not a number, not finite, beyond +-limit)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or "_" in text:  # Python reads 1_000 as 1000; no record writes a number that way
        return f"unparseable value {text!r} for {name}"
    if not np.isfinite(value):
        return f"non-finite value {text!r} for {name}"
    if abs(value) > limit:
        return f"value {text!r} for {name} is beyond +-{limit:,.0f}, more than any measurement can be"
    return value


def _is_utf8(text: bytes) -> bool:
    if text.isascii():
        return True
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def prefixed_rows(records: list[Record], header: bytes, delimiter: bytes) -> tuple[bytes, set[int]]:
    """All records' data lines as one CSV buffer, each line led by its record's index and ``delimiter``.

    Returns the buffer and the indices of records left out of it for a line-by-line look: a header other than
    ``header``, a lone CR (it would end a CSV row in mid-line), bytes that are not UTF-8 (the CSV reader cannot
    even report such a row) or a line longer than ``MAX_LINE_BYTES``.
    """
    suspicious: set[int] = set()
    chunks = []
    for index, record in enumerate(records):
        first, _, body = record.text.replace(b"\r\n", b"\n").partition(b"\n")
        too_long = len(body) > MAX_LINE_BYTES and max(map(len, body.split(b"\n"))) > MAX_LINE_BYTES
        if first.strip() != header or b"\r" in body or not _is_utf8(body) or too_long:
            suspicious.add(index)
            continue
        body = body.rstrip(b"\n")
        if body:
            prefix = b"%d%s" % (index, delimiter)
            chunks.append(prefix + body.replace(b"\n", b"\n" + prefix) + b"\n")
    return b"".join(chunks), suspicious


def log_skips(skips: list[Skip], log: logging.Logger) -> None:
    """One warning per kind of skip (numbers and quoted text set aside), with its first place and its count."""
    by_reason: dict[str, list[Skip]] = {}
    for skip in skips:
        by_reason.setdefault(re.sub(r"'.*'|\d+", "…", skip.reason), []).append(skip)
    for group in by_reason.values():
        log.warning("skipped %d line(s) like %s (all listed in the manifest)", len(group), group[0])
