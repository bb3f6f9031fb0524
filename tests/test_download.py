"""Verified, resumable downloads, against a local HTTP server on 127.0.0.1 (never the real PhysioNet).

The server serves the shared PhysioNet 2012 release under ``/good/``, a corrupted and a truncated copy under
``/bad/``, a connection that breaks off half-way under ``/flaky/``, and a small PhysioNet 2019-style release (with
its ``SHA256SUMS.txt``) under ``/p19/``. It honours HTTP Range requests and records every request it gets. Routes
under ``/slow/`` send their bytes in ten pieces 50 ms apart, under ``/trickle/`` one byte every 50 ms, and under
``/nolength/`` without a Content-Length header.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from garlic import cli
from garlic.io.download import (
    PHYSIONET2012_SHA256,
    DownloadError,
    download,
    download_file,
    download_physionet2012,
    download_physionet2019,
)
from helpers import SHARED

P12 = SHARED / "physionet2012"
P19_ZIP = SHARED / "physionet2019" / "training_setA.zip"
requires_p12 = pytest.mark.skipif(
    not all((P12 / name).is_file() for name in PHYSIONET2012_SHA256),
    reason=f"the PhysioNet 2012 release is not at {P12}",
)
requires_p19 = pytest.mark.skipif(not P19_ZIP.is_file(), reason=f"the PhysioNet 2019 sample is not at {P19_ZIP}")


class Server:
    """Routes: URL path -> bytes (or a file); ``/flaky/`` routes send half their bytes, then hang up."""

    def __init__(self):
        self.routes: dict[str, bytes | Path] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Range")))
                if self.path.startswith("/headers-trickle/"):  # a status line, then one header byte at a time
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    for byte in b"X-Slow: " + b"a" * 10_000:
                        try:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                        except OSError:  # the client hung up
                            return
                        time.sleep(0.05)
                    return
                body = server.routes.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                data = body.read_bytes() if isinstance(body, Path) else body
                start = int(self.headers["Range"].split("=")[1].split("-")[0]) if self.headers.get("Range") else 0
                if start >= len(data) and start:
                    self.send_response(416)
                    self.end_headers()
                    return
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                if not self.path.startswith("/nolength/"):
                    self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if self.path.startswith("/flaky/"):
                    self.wfile.write(data[start : len(data) // 2])
                    self.wfile.flush()
                    self.connection.close()
                    return
                piece = {"/slow/": -(-len(data) // 10), "/trickle/": 1}.get(self.path[: self.path.find("/", 1) + 1])
                if piece is None:
                    self.wfile.write(data[start:])
                    return
                for at in range(start, len(data), piece):
                    try:
                        self.wfile.write(data[at : at + piece])
                        self.wfile.flush()
                    except OSError:  # the client hung up
                        return
                    time.sleep(0.05)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def gets(self, prefix: str) -> list[tuple[str, str | None]]:
        return [r for r in self.requests if r[0].startswith(prefix)]


@pytest.fixture
def server():
    serving = Server()
    serving.thread.start()
    yield serving
    serving.httpd.shutdown()
    serving.httpd.server_close()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_no_partial(folder: Path) -> None:
    assert not list(folder.glob(".*.partial")), sorted(p.name for p in folder.iterdir())


@requires_p12
def test_the_verified_release_lands_and_is_not_fetched_again(server, tmp_path):
    for name in PHYSIONET2012_SHA256:
        server.routes[f"/good/{name}"] = P12 / name
    outcomes = download_physionet2012(tmp_path, f"{server.url}/good/")
    assert {o.name: o.status for o in outcomes} == dict.fromkeys(PHYSIONET2012_SHA256, "downloaded")
    for name, digest in PHYSIONET2012_SHA256.items():
        assert sha256((tmp_path / name).read_bytes()) == digest
    assert_no_partial(tmp_path)

    asked = len(server.requests)
    again = download_physionet2012(tmp_path, f"{server.url}/good/")
    assert {o.status for o in again} == {"already verified"} and len(server.requests) == asked


@requires_p12
@pytest.mark.parametrize(
    "name, damage",
    [
        ("Outcomes-a.txt", lambda data: data[:1000] + bytes([data[1000] ^ 1]) + data[1001:]),  # one bit flipped
        ("set-a.tar.gz", lambda data: data[: len(data) // 3]),  # truncated
    ],
)
def test_corrupted_and_truncated_files_are_refused_and_deleted(server, tmp_path, name, damage):
    server.routes[f"/bad/{name}"] = damage((P12 / name).read_bytes())
    with pytest.raises(DownloadError, match=f"{name}: checksum mismatch .*deleted"):
        download_physionet2012(tmp_path, f"{server.url}/bad/", names=[name])
    assert list(tmp_path.iterdir()) == []  # neither the file nor a partial copy is left


@requires_p12
def test_a_broken_connection_keeps_the_part_and_the_next_run_resumes_it_with_a_range_request(server, tmp_path):
    name = "set-b.tar.gz"
    server.routes[f"/flaky/{name}"] = server.routes[f"/good/{name}"] = P12 / name
    with pytest.raises(DownloadError, match="run the same command again to resume"):
        download_physionet2012(tmp_path, f"{server.url}/flaky/", names=[name])
    partial = tmp_path / f".{name}.partial"
    half = (P12 / name).stat().st_size // 2
    assert partial.stat().st_size == half and not (tmp_path / name).exists()

    (outcome,) = download_physionet2012(tmp_path, f"{server.url}/good/", names=[name])
    assert outcome.status == "resumed"
    assert server.gets("/good/") == [(f"/good/{name}", f"bytes={half}-")]
    assert sha256((tmp_path / name).read_bytes()) == PHYSIONET2012_SHA256[name]
    assert_no_partial(tmp_path)


def test_a_corrupt_partial_file_is_discarded_and_fetched_afresh(server, tmp_path):
    data = b"0123456789" * 1000
    server.routes["/f.bin"] = data
    (tmp_path / ".f.bin.partial").write_bytes(b"garbage!")
    outcome = download_file(f"{server.url}/f.bin", tmp_path / "f.bin", sha256(data))
    assert outcome.status == "downloaded" and (tmp_path / "f.bin").read_bytes() == data
    assert [r[1] for r in server.requests] == ["bytes=8-", None]
    assert_no_partial(tmp_path)


def test_a_partial_file_already_complete_is_accepted(server, tmp_path):
    data = b"complete"
    server.routes["/f.bin"] = data
    (tmp_path / ".f.bin.partial").write_bytes(data)
    assert download_file(f"{server.url}/f.bin", tmp_path / "f.bin", sha256(data)).status == "resumed"
    assert (tmp_path / "f.bin").read_bytes() == data


def test_network_failures_are_explained_plainly(server, tmp_path):
    with pytest.raises(DownloadError, match=r"could not download .*HTTP 404"):
        download_file(f"{server.url}/missing.bin", tmp_path / "x", "0" * 64)
    server.httpd.server_close()  # nothing listens on the port any more
    with pytest.raises(DownloadError, match=r"the network failed .*check the connection"):
        download_file(f"{server.url}/f.bin", tmp_path / "x", "0" * 64)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def p19_release(server):
    """Three real 2019 records served the way PhysioNet lays them out, with the release's checksum list."""
    if not P19_ZIP.is_file():
        pytest.skip(f"the PhysioNet 2019 sample is not at {P19_ZIP}")
    with zipfile.ZipFile(P19_ZIP) as archive:
        members = sorted(n for n in archive.namelist() if n.endswith(".psv"))[:3]
        files = {f"training/{m}": archive.read(m) for m in members}
    sums = "".join(f"{sha256(data)}  {path}\n" for path, data in files.items())
    sums += f"{sha256(b'x')}  LICENSE.txt\n"  # listed but not a training record: not fetched
    for path, data in files.items():
        server.routes[f"/p19/{path}"] = data
    return files, sums


def test_physionet2019_files_are_checked_against_the_release_checksum_list(server, tmp_path, p19_release):
    files, sums = p19_release
    server.routes["/p19/SHA256SUMS.txt"] = sums.encode()
    outcomes = download_physionet2019(tmp_path, f"{server.url}/p19/", workers=2)
    assert len(outcomes) == len(files)
    for path, data in files.items():
        assert (tmp_path / path.removeprefix("training/")).read_bytes() == data

    from garlic.sources.physionet2019 import locate_sets

    assert set(locate_sets(tmp_path)) == {"A"}


def test_physionet2019_refuses_a_file_that_differs_from_the_list(server, tmp_path, p19_release):
    files, sums = p19_release
    server.routes["/p19/SHA256SUMS.txt"] = sums.encode()
    first = next(iter(files))
    server.routes[f"/p19/{first}"] = files[first] + b"1|2|3\n"
    with pytest.raises(DownloadError, match="checksum mismatch"):
        download_physionet2019(tmp_path, f"{server.url}/p19/", workers=1)
    assert not (tmp_path / first.removeprefix("training/")).exists()


@pytest.mark.parametrize(
    "line",
    [
        f"{'a' * 64}  training/../../etc/passwd",
        f"{'a' * 64}  /etc/passwd",
        "not a checksum line",
    ],
)
def test_a_hostile_checksum_list_is_refused_before_anything_is_fetched(server, tmp_path, line):
    server.routes["/p19/SHA256SUMS.txt"] = f"{'b' * 64}  training/training_setA/p000001.psv\n{line}\n".encode()
    with pytest.raises(DownloadError, match="SHA256SUMS.txt line 2"):
        download_physionet2019(tmp_path, f"{server.url}/p19/")
    assert server.gets("/p19/training") == [] and list(tmp_path.iterdir()) == []


def test_mimic3_explains_credentialed_access(tmp_path):
    with pytest.raises(DownloadError, match="credentialed access") as caught:
        download("mimic3", tmp_path / "mimic")
    assert "garlic preprocess mimic3 --source" in str(caught.value)


@requires_p12
def test_the_cli_downloads_and_reports(server, tmp_path, capsys):
    server.routes["/good/Outcomes-c.txt"] = P12 / "Outcomes-c.txt"
    server.routes["/bad/Outcomes-c.txt"] = b"RecordID\n"
    cli.main(
        [
            "download",
            "physionet2012",
            "--to",
            str(tmp_path / "a"),
            "--base-url",
            f"{server.url}/good/",
            "--only",
            "Outcomes-c.txt",
        ]
    )
    assert "Outcomes-c.txt: downloaded, SHA-256 0b32dcb7" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_code:
        cli.main(
            [
                "download",
                "physionet2012",
                "--to",
                str(tmp_path / "b"),
                "--base-url",
                f"{server.url}/bad/",
                "--only",
                "Outcomes-c.txt",
            ]
        )
    assert exit_code.value.code == 2 and "checksum mismatch" in capsys.readouterr().err


def test_a_partial_file_that_is_a_link_is_refused_and_its_target_left_alone(server, tmp_path):
    data = b"0123456789" * 100
    server.routes["/f.bin"] = data
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    (tmp_path / ".f.bin.partial").symlink_to(victim)
    with pytest.raises(DownloadError, match=r"\.f\.bin\.partial is a symbolic link; refusing to write through it"):
        download_file(f"{server.url}/f.bin", tmp_path / "f.bin", sha256(data))
    assert victim.read_bytes() == b"precious" and not (tmp_path / "f.bin").exists()

    (tmp_path / ".f.bin.partial").unlink()  # a dangling link: following it would create its target
    (tmp_path / ".f.bin.partial").symlink_to(tmp_path / "made-through-the-link")
    with pytest.raises(DownloadError, match="symbolic link"):
        download_file(f"{server.url}/f.bin", tmp_path / "f.bin", sha256(data))
    assert not (tmp_path / "made-through-the-link").exists() and server.requests == []


def test_two_downloads_of_one_file_at_once_leave_the_verified_bytes(server, tmp_path):
    data = os.urandom(3 << 20)  # several reads of CHUNK bytes, 50 ms apart
    server.routes["/slow/f.bin"] = data
    destination = tmp_path / "f.bin"
    outcomes, errors = [], []

    def fetch() -> None:
        try:
            outcomes.append(download_file(f"{server.url}/slow/f.bin", destination, sha256(data)).status)
        except Exception as exc:  # noqa: BLE001 - any failure of either thread is the finding
            errors.append(repr(exc))

    first = threading.Thread(target=fetch)
    first.start()
    partial = tmp_path / ".f.bin.partial"
    while not (partial.exists() and partial.stat().st_size) and first.is_alive():
        time.sleep(0.005)
    second = threading.Thread(target=fetch)  # starts while the first is half-way
    second.start()
    first.join(30)
    second.join(30)
    assert errors == [] and sorted(outcomes) == ["already verified", "downloaded"]
    assert destination.read_bytes() == data and len(server.gets("/slow/")) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]  # no partial, no lock file


def test_bytes_changed_after_the_check_are_caught_in_place(server, tmp_path, monkeypatch):
    data = b"0123456789" * 100
    server.routes["/f.bin"] = data
    from garlic.io import download as module

    replace = os.replace

    def replace_then_append(source, target):  # a writer that ignores the lock keeps writing the file
        replace(source, target)
        with open(target, "ab") as late:
            late.write(b"late bytes")

    monkeypatch.setattr(module.os, "replace", replace_then_append)
    with pytest.raises(DownloadError, match="f.bin: its bytes changed after they were verified"):
        download_file(f"{server.url}/f.bin", tmp_path / "f.bin", sha256(data))
    assert not (tmp_path / "f.bin").exists()


@pytest.mark.parametrize("route", ["/f.bin", "/nolength/f.bin"])
def test_a_file_larger_than_expected_is_cut_off_and_deleted(server, tmp_path, route):
    data = b"x" * 300_000
    server.routes[route] = data
    with pytest.raises(DownloadError, match="sent more than the expected 1,000 bytes.*nothing was kept"):
        download_file(f"{server.url}{route}", tmp_path / "f.bin", sha256(data), max_bytes=1_000)
    assert list(tmp_path.iterdir()) == []


def test_the_physionet2012_files_are_capped_at_their_release_size(server, tmp_path):
    server.routes["/big/Outcomes-a.txt"] = b"RecordID,In-hospital_death\n" * 20_000  # 540 kB for a 79 kB file
    with pytest.raises(DownloadError, match="more than the expected 79,219 bytes"):
        download_physionet2012(tmp_path, f"{server.url}/big/", names=["Outcomes-a.txt"])
    assert list(tmp_path.iterdir()) == []


def test_a_trickling_server_meets_the_deadline_and_the_part_is_kept_to_resume(server, tmp_path):
    data = b"y" * 1_000
    server.routes["/trickle/f.bin"] = server.routes["/f.bin"] = data
    started = time.monotonic()
    with pytest.raises(DownloadError, match=r"not done within its deadline of 0.3 s .*run the same command again"):
        download_file(f"{server.url}/trickle/f.bin", tmp_path / "f.bin", sha256(data), deadline_s=0.3)
    assert time.monotonic() - started < 3
    kept = (tmp_path / ".f.bin.partial").stat().st_size
    assert 0 < kept < len(data)
    assert download_file(f"{server.url}/f.bin", tmp_path / "f.bin", sha256(data)).status == "resumed"
    assert (tmp_path / "f.bin").read_bytes() == data


def test_a_trickling_checksum_list_meets_the_deadline(server, tmp_path):
    server.routes["/trickle/SHA256SUMS.txt"] = f"{'b' * 64}  training/training_setA/p000001.psv\n".encode()
    with pytest.raises(DownloadError, match="SHA256SUMS.txt: not done within its deadline of 0.2 s"):
        download_physionet2019(tmp_path, f"{server.url}/trickle/", deadline_s=0.2)


@pytest.mark.parametrize("fetch", ["file", "checksum list"])
def test_a_server_trickling_its_headers_meets_the_deadline_too(server, tmp_path, fetch):
    started = time.monotonic()
    with pytest.raises(DownloadError, match="not done within its deadline of 0.5 s"):
        if fetch == "file":
            download_file(f"{server.url}/headers-trickle/f.bin", tmp_path / "f.bin", "0" * 64, deadline_s=0.5)
        else:
            download_physionet2019(tmp_path, f"{server.url}/headers-trickle/", deadline_s=0.5)
    assert time.monotonic() - started < 3  # each header byte came within the per-read timeout: once this hung


def test_a_folder_at_the_destination_or_a_linked_lock_is_refused_before_anything_is_fetched(server, tmp_path):
    data = b"z" * 100
    server.routes["/f.bin"] = data
    (tmp_path / "f.bin").mkdir()
    with pytest.raises(DownloadError, match=r"f\.bin is a folder, where the downloaded file would go"):
        download_file(f"{server.url}/f.bin", tmp_path / "f.bin", sha256(data))
    (tmp_path / "elsewhere").write_text("not ours")
    (tmp_path / ".g.bin.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=r"\.g\.bin\.lock is a symbolic link; a lock is never taken through one"):
        download_file(f"{server.url}/f.bin", tmp_path / "g.bin", sha256(data))
    assert (tmp_path / "elsewhere").read_text() == "not ours" and server.gets("/f.bin") == []
