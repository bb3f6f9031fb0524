"""`garlic dashboard` as a process: where it listens, who it lets in, and that stopping it stops its server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from garlic.app.access import AccessError, Attempts, is_loopback, required_token

REPO = Path(__file__).resolve().parents[1]
PORTS = range(8615, 8620)


def free_port() -> int:
    for port in PORTS:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return port
    pytest.skip(f"no free port in {PORTS}")


def listening_addresses(port: int) -> set[str]:
    """The local addresses of every socket listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
            return response.read() == b"ok"
    except OSError:
        return False


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def garlic(*arguments: str, env_extra: dict[str, str] | None = None, **options) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    environment.pop("GARLIC_DASHBOARD_TOKEN", None)
    environment |= env_extra or {}
    return subprocess.Popen([sys.executable, "-m", "garlic.cli", *arguments], cwd=REPO, env=environment, **options)


def test_only_loopback_addresses_go_without_a_token():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("example.org")
    assert required_token("127.0.0.1", {}) is None
    with pytest.raises(AccessError, match="GARLIC_DASHBOARD_TOKEN"):
        required_token("0.0.0.0", {})
    with pytest.raises(AccessError, match="at least 16"):
        required_token("0.0.0.0", {"GARLIC_DASHBOARD_TOKEN": "short"})
    assert required_token("0.0.0.0", {"GARLIC_DASHBOARD_TOKEN": "0123456789abcdef"}) == "0123456789abcdef"


def test_a_wider_address_without_a_token_is_refused_before_anything_starts(tmp_path):
    port = free_port()
    refused = garlic(
        "--mlruns",
        str(tmp_path / "mlruns"),
        "dashboard",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = refused.communicate(timeout=120)
    assert refused.returncode == 2, (out, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("garlic dashboard: error:") and "GARLIC_DASHBOARD_TOKEN" in line
    assert not listening_addresses(port)


@contextmanager
def serving(tmp_path: Path, env_extra: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen, int, Path]]:
    """``garlic dashboard`` on a free port, once it answers its health check: (process, port, its log); killed
    afterwards if it is still running."""
    port, log = free_port(), tmp_path / "server.log"
    dashboard = garlic(
        "--mlruns",
        str(tmp_path / "mlruns"),
        "--data-root",
        str(tmp_path / "data"),
        "dashboard",
        "--port",
        str(port),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env_extra=env_extra,
    )
    try:
        deadline = time.monotonic() + 120
        while not healthy(port):
            assert dashboard.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield dashboard, port, log
    finally:
        if dashboard.poll() is None:
            dashboard.kill()


@pytest.mark.slow
def test_a_sigkill_of_garlic_dashboard_stops_its_server_and_frees_the_port(tmp_path):
    with serving(tmp_path) as (dashboard, port, _):
        (server,) = children(dashboard.pid)
        dashboard.kill()  # SIGKILL: nothing to forward; once the server kept the port
        dashboard.wait(timeout=10)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    assert not Path(f"/proc/{server}").exists(), "the Streamlit server outlived a SIGKILL of `garlic dashboard`"
    assert not listening_addresses(port) and not healthy(port)


def test_warm_up_leaves_a_damaged_store_for_the_page_to_report(tmp_path):
    from garlic.app import serve

    (tmp_path / "mlflow.db").write_bytes(b"\x00not sqlite\xff" * 4096)
    serve.warm_up(serve.settings(["--mlruns", str(tmp_path)]))  # once: the server died before it listened


@pytest.mark.parametrize("token", [" " * 16, "a" * 20, "abababababababab", "abcdefgh ijklmnop"])
def test_a_token_easy_to_guess_is_refused(token):
    with pytest.raises(AccessError, match="too easy to guess"):
        required_token("0.0.0.0", {"GARLIC_DASHBOARD_TOKEN": token})
    assert required_token("0.0.0.0", {"GARLIC_DASHBOARD_TOKEN": "3f9a1c0e7b2d4a68"}) == "3f9a1c0e7b2d4a68"


def test_token_guesses_are_limited_per_address_and_overall():
    now = [0.0]
    attempts = Attempts(per_client=3, overall=5, window=60, clock=lambda: now[0])
    for _ in range(3):
        assert not attempts.blocked("10.0.0.1")
        attempts.failed("10.0.0.1")
    assert attempts.blocked("10.0.0.1") and not attempts.blocked("10.0.0.2")
    attempts.failed("10.0.0.2")
    attempts.failed("10.0.0.3")
    assert attempts.blocked("10.0.0.4")  # five wrong guesses in a minute from all: nobody's guess is checked
    now[0] = 61.0
    assert not attempts.blocked("10.0.0.1") and not attempts.blocked("10.0.0.4")


@pytest.mark.slow
def test_on_loopback_with_a_token_only_the_login_page_is_served_without_it_and_sigterm_stops_the_server(tmp_path):
    def status(port: int, path: str, method: str = "GET", data: bytes | None = None) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=data)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    # One server for both checks: each start costs seconds of imports before it listens.
    with serving(tmp_path, {"GARLIC_DASHBOARD_TOKEN": "3f9a1c0e7b2d4a68c5"}) as (dashboard, port, log):
        loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc writes them
        assert listening_addresses(port) and listening_addresses(port) <= loopback, listening_addresses(port)
        assert status(port, "/") == 200  # the login page
        assert status(port, "/_stcore/metrics") == 403  # once served to anyone
        assert status(port, "/media/0123abcd.png") == 403  # a model plot's address
        # 200 PUTs of 1 MB were once accepted on a session that never gave the token
        assert status(port, "/_stcore/upload_file/some-session/some-file", "PUT", b"x" * 1000) == 403
        (server,) = children(dashboard.pid)
        dashboard.send_signal(signal.SIGTERM)  # as a service manager stops it
        assert dashboard.wait(timeout=30) == 0
    assert not Path(f"/proc/{server}").exists(), "the Streamlit server outlived `garlic dashboard`"
    assert not listening_addresses(port) and not healthy(port)
    assert not (tmp_path / "mlruns").exists()  # the dashboard reads the store; it does not make one
    assert (
        "refused PUT /_stcore/upload_file/...: an upload from a session that has not given the token" in log.read_text()
    )
