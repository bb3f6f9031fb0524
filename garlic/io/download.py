"""Verified downloads of the open-access releases from PhysioNet, resumable, never leaving a corrupt file in place.

Each file is fetched into ``DIR/.NAME.partial`` (continued with an HTTP Range request when a partial file is
already there), its SHA-256 checked, and only then renamed to ``DIR/NAME``, where its bytes are checked once more. A
file that fails the check is deleted, never kept; a file already in place that passes the check is not fetched again.
While a file is fetched its name is locked (``DIR/.NAME.lock``): a second download of it waits, then finds it done.
A partial file that is a link is refused, never followed. A transfer larger than the file's expected size is cut off
and deleted, and one not done by its deadline stops (keeping what it got, to resume).

Where the checksums come from:

- PhysioNet 2012: the six files' SHA-256 are pinned below (the official 1.0.0 bytes), so a download is checked
  against values fixed in this code, whatever the server says.
- PhysioNet 2019: nothing is pinned, because no copy of the official files was at hand to compute them from. The
  release's own checksum list, ``SHA256SUMS.txt`` (PhysioNet publishes one for every project), is fetched first
  over HTTPS, and every ``training/training_setA|B/pNNNNNN.psv`` is checked against it. That catches truncated and
  corrupted transfers, but it trusts the server for the list itself; the command says so when it runs.
- MIMIC-III needs credentialed access: ``credentialed_access_help`` explains how to get it and where the files go.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import logging
import os
import re
import socket
import stat
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from garlic.io.locks import locked

log = logging.getLogger(__name__)

CHUNK = 1 << 20
TIMEOUT_SECONDS = 60  # the longest wait for any one answer from the server
DEADLINE_SECONDS = 15 * 60  # the longest a whole file may take (6.5 MB in 15 min: 7 kB/s)
USER_AGENT = "garlic-icu-download/1"

PHYSIONET2012_URL = "https://physionet.org/files/challenge-2012/1.0.0/"
PHYSIONET2012_SHA256 = {
    "set-a.tar.gz": "28aff9276b5a864608836f4f2dd3791d3feedcc57178620ecb66bb7e8e439d3d",
    "set-b.tar.gz": "639ab95b809aa849cc083b1675a5f1b345547d7c670c88f3a15b61e3c489105e",
    "set-c.tar.gz": "a94afd695f573b365f0188cc5adb88f972e7742426c5e2fcf84c765dbb0ec0a3",
    "Outcomes-a.txt": "2613ea60ccda29f87571a7d6b09ad130858a8ccd66325bd073365925026883c2",
    "Outcomes-b.txt": "1305f29734da374a809483229a99f33a9230aa8d4fa74b1a2d6ad788136423d5",
    "Outcomes-c.txt": "0b32dcb7753c0f18f2f5fde498a28618b8879c5e527ce0dae8ad120dd7e205c9",
}
PHYSIONET2012_BYTES = {
    "set-a.tar.gz": 6_550_746,
    "set-b.tar.gz": 6_571_309,
    "set-c.tar.gz": 6_576_841,
    "Outcomes-a.txt": 79_219,
    "Outcomes-b.txt": 79_149,
    "Outcomes-c.txt": 79_191,
}
PHYSIONET2019_URL = "https://physionet.org/files/challenge-2019/1.0.0/"
PHYSIONET2019_SUMS = "SHA256SUMS.txt"
# Only the training records are taken from the list; ``training/`` is dropped so that the files land as
# ``DIR/training_setA/p000001.psv``, the layout ``garlic preprocess physionet2019`` reads.
_P19_MEMBER = re.compile(r"^training/(training_set[AB]/p\d{6}\.psv)$")
_SUMS_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")
P19_RECORD_MAX_BYTES = 1 << 20  # the list gives no sizes; the largest training_setA record is 55 kB
DOWNLOADABLE = ("physionet2012", "physionet2019")


class DownloadError(RuntimeError):
    """A download that could not be completed or verified; the message says what happened and what to do."""


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # "downloaded", "resumed" or "already verified"
    sha256: str


def _request(url: str, start: int = 0) -> urllib.request.Request:
    headers = {"User-Agent": USER_AGENT}
    if start:
        headers["Range"] = f"bytes={start}-"
    return urllib.request.Request(url, headers=headers)


def _network_error(url: str, exc: Exception, partial: Path) -> DownloadError:
    kept = partial.lstat().st_size if partial.is_file() and not partial.is_symlink() else 0
    if isinstance(exc, urllib.error.HTTPError):
        what = f"the server answered HTTP {exc.code} ({exc.reason})"
        if exc.code in (401, 403):
            what += "; the file may need credentialed access"
    else:
        reason = getattr(exc, "reason", exc)
        what = f"the network failed ({reason})"
    advice = (
        f"{kept:,} bytes are kept in {partial}; run the same command again to resume"
        if kept
        else ("check the connection (or proxy settings) and run the same command again")
    )
    return DownloadError(f"could not download {url}: {what}. {advice}")


class _TooLarge(Exception):
    pass


class _TooSlow(Exception):
    pass


def _open_no_link(path: Path, flags: int) -> int:
    """``os.open`` that never follows a link at ``path``: a link there is refused with a ``DownloadError``."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DownloadError(
                f"{path} is a symbolic link; refusing to write through it or read it. "
                "Remove it and run the same command again"
            ) from None
        raise


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with os.fdopen(_open_no_link(path, os.O_RDONLY), "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _kept_bytes(partial: Path) -> int:
    """The size of the partial file (0 when absent); anything but a plain file there is refused."""
    try:
        found = partial.lstat()
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(found.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(found.st_mode) else "not a regular file"
        raise DownloadError(
            f"{partial} is {kind}; refusing to write through it. Remove it and run the same command again"
        )
    return found.st_size


class _Deadline:
    """An opener whose connections are shut down at ``deadline`` (``time.monotonic()``), whatever they are doing.

    urllib's timeout bounds each wait for a byte, so a server that sends its status line and then one header byte
    every few seconds never trips it; this bounds the whole request. Use as ``with _Deadline(d) as opener``.
    """

    def __init__(self, deadline: float):
        self.connections: list[http.client.HTTPConnection] = []
        self.expired = False
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._expire)
        self.timer.daemon = True

    def _expire(self) -> None:
        self.expired = True
        for connection in list(self.connections):
            _shut(connection.sock)

    def _tracked(self, connection_class: type) -> type:
        watch = self

        class Tracked(connection_class):
            def connect(self) -> None:
                super().connect()
                watch.connections.append(self)
                if watch.expired:  # connected after the deadline passed
                    _shut(self.sock)

        return Tracked

    def __enter__(self) -> urllib.request.OpenerDirector:
        watch = self

        def watched(handler: type) -> urllib.request.BaseHandler:
            class Watched(handler):
                def do_open(self, http_class, request, **options):
                    return super().do_open(watch._tracked(http_class), request, **options)

            return Watched()

        self.timer.start()
        return urllib.request.build_opener(watched(urllib.request.HTTPHandler), watched(urllib.request.HTTPSHandler))

    def __exit__(self, *exc) -> None:
        self.timer.cancel()


def _shut(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass


def _fetch(url: str, partial: Path, max_bytes: int | None, deadline: float) -> bool:
    """Fetch ``url`` into ``partial``, continuing what it holds; return whether an earlier part was reused.

    Raises ``_TooLarge`` past ``max_bytes`` in all and ``_TooSlow`` past the ``time.monotonic()`` ``deadline``.
    """
    start = _kept_bytes(partial)
    timeout = max(0.001, min(TIMEOUT_SECONDS, deadline - time.monotonic()))
    with _Deadline(deadline) as opener:
        try:
            response = opener.open(_request(url, start), timeout=timeout)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and start:  # the partial file already holds every byte (or more): let the check decide
                return True
            raise
        return _receive(response, url, partial, start, max_bytes, deadline)


def _receive(
    response: http.client.HTTPResponse, url: str, partial: Path, start: int, max_bytes: int | None, deadline: float
) -> bool:
    """Write ``response``'s body into ``partial`` (appended to its ``start`` bytes when the server resumed)."""
    with response:
        resumed = start > 0 and response.status == 206
        if start and not resumed:
            log.info("%s: the server ignored the range request; starting over", url)
        offset = start if resumed else 0
        expected = response.headers.get("Content-Length")
        if max_bytes is not None and expected is not None and offset + int(expected) > max_bytes:
            raise _TooLarge(offset + int(expected))
        received = 0
        append = os.O_APPEND if resumed else os.O_TRUNC
        with os.fdopen(_open_no_link(partial, os.O_WRONLY | os.O_CREAT | append), "wb") as out:
            while block := response.read1(CHUNK):  # read1: a trickling server still returns, so the clock is seen
                received += len(block)
                if max_bytes is not None and offset + received > max_bytes:
                    raise _TooLarge(offset + received)
                out.write(block)
                if time.monotonic() > deadline:
                    raise _TooSlow(offset + received)
        if time.monotonic() > deadline:  # the connection was shut at the deadline, ending the body early
            raise _TooSlow(offset + received)
    # urllib returns a short body without complaint when the server hangs up early: that is a network failure.
    if expected is not None and received < int(expected):
        raise ConnectionError(f"the connection closed after {received:,} of {int(expected):,} bytes")
    return resumed


def _fetch_and_hash(
    url: str, partial: Path, max_bytes: int | None, deadline: float, seconds: float
) -> tuple[bool, str]:
    try:
        resumed = _fetch(url, partial, max_bytes, deadline)
    except _TooLarge as exc:
        partial.unlink(missing_ok=True)
        raise DownloadError(
            f"{url}: the server sent more than the expected {max_bytes:,} bytes (at least "
            f"{exc.args[0]:,}); refused, and nothing was kept"
        ) from None
    except (_TooSlow, urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as exc:
        if not isinstance(exc, _TooSlow) and time.monotonic() < deadline:
            raise _network_error(url, exc, partial) from exc
        kept = _kept_bytes(partial)
        raise DownloadError(
            f"could not download {url}: not done within its deadline of {seconds:g} s (the server "
            f"is too slow); {kept:,} bytes are kept in {partial}: run the same command again to "
            "resume"
        ) from None
    return resumed, _sha256_file(partial)


def download_file(
    url: str, destination: Path, sha256: str, max_bytes: int | None = None, deadline_s: float = DEADLINE_SECONDS
) -> Outcome:
    """``url`` -> ``destination``, verified against ``sha256``; a resumed copy that fails is fetched once afresh.

    ``max_bytes`` caps the file's size (its expected size, where known); ``deadline_s`` bounds the whole transfer.
    Another process (or thread) fetching the same ``destination`` is waited for.
    """
    destination = Path(destination)
    if destination.is_dir():
        raise DownloadError(
            f"{destination} is a folder, where the downloaded file would go; move it away and run the "
            "same command again"
        )
    destination.parent.mkdir(parents=True, exist_ok=True)
    with locked(destination.with_name(f".{destination.name}.lock"), remove=True):
        return _download_locked(url, destination, sha256, max_bytes, deadline_s)


def _download_locked(url: str, destination: Path, sha256: str, max_bytes: int | None, seconds: float) -> Outcome:
    if destination.is_file() and not destination.is_symlink() and _sha256_file(destination) == sha256:
        return Outcome(destination.name, "already verified", sha256)
    deadline = time.monotonic() + seconds
    partial = destination.with_name(f".{destination.name}.partial")
    resumed, actual = _fetch_and_hash(url, partial, max_bytes, deadline, seconds)
    if actual != sha256 and resumed:  # the kept part may be what is wrong: one fresh try
        log.warning("%s: the resumed copy failed its checksum; downloading it again from the start", url)
        partial.unlink()
        resumed, actual = _fetch_and_hash(url, partial, max_bytes, deadline, seconds)
    if actual != sha256:
        partial.unlink()
        raise DownloadError(
            f"{url}: checksum mismatch (expected SHA-256 {sha256}, got {actual}); the file was deleted. "
            "The transfer was truncated or corrupted, or the server holds other bytes than the official release."
        )
    os.replace(partial, destination)
    in_place = _sha256_file(destination)  # what a reader will find: changed if something else writes there
    if in_place != sha256:
        destination.unlink(missing_ok=True)
        raise DownloadError(
            f"{destination}: its bytes changed after they were verified (SHA-256 {in_place}); the "
            "file was deleted. Is another program writing there? Run the command again"
        )
    return Outcome(destination.name, "resumed" if resumed else "downloaded", sha256)


def _join(base_url: str, name: str) -> str:
    return base_url.rstrip("/") + "/" + name


def download_physionet2012(
    to: Path, base_url: str = PHYSIONET2012_URL, names: list[str] | None = None, deadline_s: float = DEADLINE_SECONDS
) -> list[Outcome]:
    """The PhysioNet 2012 release (or the files ``names`` of it), each checked against its pinned SHA-256 and size.

    ``deadline_s`` bounds each file's transfer.
    """
    names = list(PHYSIONET2012_SHA256) if names is None else names
    unknown = sorted(set(names) - set(PHYSIONET2012_SHA256))
    if unknown:
        raise DownloadError(f"not in the PhysioNet 2012 release: {unknown}; it has {sorted(PHYSIONET2012_SHA256)}")
    return [
        download_file(_join(base_url, n), Path(to) / n, PHYSIONET2012_SHA256[n], PHYSIONET2012_BYTES[n], deadline_s)
        for n in names
    ]


def parse_checksums(text: str, origin: str) -> dict[str, str]:
    """A ``sha256sum`` listing -> {relative path: digest}; a malformed line or a path leaving the folder is refused."""
    sums = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _SUMS_LINE.match(line)
        if not match:
            raise DownloadError(f"{origin} line {number}: expected 'SHA256  PATH', got {line[:80]!r}")
        path = PurePosixPath(match.group(2))
        if path.is_absolute() or ".." in path.parts or "\\" in match.group(2):
            raise DownloadError(f"{origin} line {number}: path {match.group(2)!r} leaves the release folder; refused")
        sums[str(path)] = match.group(1).lower()
    return sums


def _fetch_text(url: str, deadline_s: float, limit: int = 64 << 20) -> str:
    deadline = time.monotonic() + deadline_s
    data = bytearray()
    try:
        with (
            _Deadline(deadline) as opener,
            opener.open(_request(url), timeout=min(TIMEOUT_SECONDS, deadline_s)) as (response),
        ):
            while (block := response.read1(CHUNK)) and len(data) <= limit and time.monotonic() <= deadline:
                data += block
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as exc:
        if time.monotonic() < deadline:
            raise _network_error(url, exc, Path(os.devnull)) from exc
    if len(data) > limit:
        raise DownloadError(f"{url}: larger than {limit:,} bytes; not a checksum list")
    if time.monotonic() > deadline:
        raise DownloadError(
            f"could not download {url}: not done within its deadline of {deadline_s:g} s (the "
            "server is too slow); run the same command again"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DownloadError(f"{url}: not UTF-8 text ({exc}); not a checksum list") from exc


def download_physionet2019(
    to: Path,
    base_url: str = PHYSIONET2019_URL,
    sets: tuple[str, ...] = ("A", "B"),
    workers: int = 8,
    deadline_s: float = DEADLINE_SECONDS,
) -> list[Outcome]:
    """The 2019 training records, each checked against the release's own ``SHA256SUMS.txt`` (fetched first).

    ``deadline_s`` bounds the list's transfer and each record's; a record is capped at ``P19_RECORD_MAX_BYTES``.
    """
    sums_url = _join(base_url, PHYSIONET2019_SUMS)
    sums = parse_checksums(_fetch_text(sums_url, deadline_s), sums_url)
    wanted = {}
    for path, digest in sums.items():
        match = _P19_MEMBER.match(path)
        if match and match.group(1)[len("training_set")] in sets:
            wanted[match.group(1)] = (path, digest)
    if not wanted:
        raise DownloadError(f"{sums_url} lists no training/training_set{{{','.join(sets)}}}/pNNNNNN.psv file")
    log.warning(
        "physionet2019: %d files, checked against %s as served (no checksum is pinned for this release)",
        len(wanted),
        sums_url,
    )
    with ThreadPoolExecutor(max_workers=workers) as pool:
        jobs = [
            pool.submit(
                download_file, _join(base_url, path), Path(to) / local, digest, P19_RECORD_MAX_BYTES, deadline_s
            )
            for local, (path, digest) in sorted(wanted.items())
        ]
        return [job.result() for job in jobs]


def credentialed_access_help(to: Path) -> str:
    return (
        "MIMIC-III cannot be downloaded anonymously: it needs credentialed access on PhysioNet.\n"
        "  1. Create a PhysioNet account and apply for credentialing (https://physionet.org/settings/credentialing/),\n"
        "     which includes the CITI 'Data or Specimens Only Research' course.\n"
        "  2. Sign the data use agreement on https://physionet.org/content/mimiciii/1.4/ .\n"
        "  3. Download the tables there (for example: wget -r -N -c -np --user YOUR_USERNAME --ask-password\n"
        "     https://physionet.org/files/mimiciii/1.4/ ) and check them with the SHA256SUMS.txt listed on that page.\n"
        f"  4. Put the TABLE.csv.gz files (ADMISSIONS, ICUSTAYS, PATIENTS, CHARTEVENTS, LABEVENTS, OUTPUTEVENTS,\n"
        f"     INPUTEVENTS_CV, INPUTEVENTS_MV) in one folder, e.g. {Path(to)}, then run:\n"
        f"     garlic preprocess mimic3 --source {Path(to)}\n"
        "The open 100-patient demo (https://physionet.org/content/mimiciii-demo/1.4/) needs no credentials."
    )


def download(
    dataset: str,
    to: Path,
    base_url: str | None = None,
    only: list[str] | None = None,
    deadline_s: float = DEADLINE_SECONDS,
) -> list[Outcome]:
    """Fetch ``dataset`` (or, for PhysioNet 2012, the files ``only``) into ``to``, each file within ``deadline_s``.

    ``base_url`` replaces the official address: a mirror, or a local test server.
    """
    if dataset == "physionet2012":
        return download_physionet2012(to, base_url or PHYSIONET2012_URL, only, deadline_s)
    if dataset == "physionet2019":
        if only:
            raise DownloadError("physionet2019 is fetched whole (every training record the release lists)")
        return download_physionet2019(to, base_url or PHYSIONET2019_URL, deadline_s=deadline_s)
    if dataset == "mimic3":
        raise DownloadError(credentialed_access_help(to))
    raise DownloadError(f"unknown dataset {dataset!r}; downloadable: {', '.join(DOWNLOADABLE)} (mimic3: see its help)")
