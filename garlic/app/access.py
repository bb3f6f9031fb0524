"""Who may open the dashboard: anyone on this machine when it listens on the loopback address only, and only
visitors who give the token in ``GARLIC_DASHBOARD_TOKEN`` when it listens wider.

The page holds patient records, so a server reachable from other machines without a login is refused, both by
``garlic dashboard`` (before it starts) and by the page itself (however Streamlit was started). With a token set,
``Gate`` stands in front of Streamlit's server: uploads are taken only from a page session that gave the token
(at most ``MAX_UPLOADS`` files and ``MAX_UPLOAD_BYTES`` a session), and the routes that serve data outside the
page (``/media/``, ``/_stcore/metrics``, components, static app files) are closed. ``Attempts`` bounds token
guessing, per visitor's address and overall.
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import threading
import time
from collections import defaultdict, deque

TOKEN_VARIABLE = "GARLIC_DASHBOARD_TOKEN"
MIN_TOKEN_LENGTH = 16
MIN_DISTINCT_CHARACTERS = 8  # `openssl rand -hex 16` has about 13; sixteen spaces or one letter repeated have 1
LOOPBACK_NAMES = {"localhost"}
MAX_UPLOADS, MAX_UPLOAD_BYTES = 50, 10 << 20  # a session's uploads in all: record files are under 100 kB
CLOSED_ROUTES = ("/media/", "/_stcore/metrics", "/component/", "/app/static/")
UPLOAD_ROUTE = "/_stcore/upload_file/"
log = logging.getLogger("garlic.dashboard")


class AccessError(ValueError):
    """A server address that would expose the page without a usable token; the message says what to do."""


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; False for every other address, and for none (all interfaces)."""
    if not host:
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def required_token(host: str | None, environment: dict[str, str] | None = None) -> str | None:
    """The token visitors must give for a server on ``host``: None on the loopback address without one set.

    Raises AccessError where the server would listen wider and no token of at least MIN_TOKEN_LENGTH
    characters is set. A token set for a loopback server is required too.
    """
    token = (os.environ if environment is None else environment).get(TOKEN_VARIABLE, "")
    if token and len(token) < MIN_TOKEN_LENGTH:
        raise AccessError(f"{TOKEN_VARIABLE} is {len(token)} characters long; use at least {MIN_TOKEN_LENGTH} "
                          "(for example: export GARLIC_DASHBOARD_TOKEN=$(openssl rand -hex 16))")  # fmt: skip
    if token and (len(set(token)) < MIN_DISTINCT_CHARACTERS or any(c.isspace() for c in token)):
        raise AccessError(f"{TOKEN_VARIABLE} is too easy to guess (spaces, or fewer than {MIN_DISTINCT_CHARACTERS} "
                          "different characters); use a random one, for example: export "
                          "GARLIC_DASHBOARD_TOKEN=$(openssl rand -hex 16)")  # fmt: skip
    if not token and not is_loopback(host):
        raise AccessError(f"listening on {host or 'every interface'} needs a login: set {TOKEN_VARIABLE} to a "
                          f"secret of at least {MIN_TOKEN_LENGTH} characters (for example: export "
                          "GARLIC_DASHBOARD_TOKEN=$(openssl rand -hex 16)), or keep the default "
                          "--host 127.0.0.1")  # fmt: skip
    return token or None


def token_matches(given: str, token: str) -> bool:
    """Constant-time comparison, so that the time taken does not tell how much of a guess was right."""
    return hmac.compare_digest(given.encode(), token.encode())


class Attempts:
    """Failed token guesses in the last ``window`` seconds: a visitor's address may make ``per_client`` of them, all
    visitors together ``overall``; past either, no guess is even checked until older ones age out."""

    def __init__(self, per_client: int = 5, overall: int = 20, window: float = 60.0, clock=time.monotonic):
        self.per_client, self.overall, self.window, self.clock = per_client, overall, window, clock
        self.failures: dict[str, deque[float]] = defaultdict(deque)
        self.lock = threading.Lock()  # the page runs one thread per session

    def _recent(self, client: str | None = None) -> int:
        cutoff = self.clock() - self.window
        for times in self.failures.values():
            while times and times[0] < cutoff:
                times.popleft()
        return len(self.failures[client]) if client is not None else sum(map(len, self.failures.values()))

    def blocked(self, client: str) -> bool:
        with self.lock:
            return self._recent(client) >= self.per_client or self._recent() >= self.overall

    def failed(self, client: str) -> int:
        """Record a wrong guess from ``client``; returns the wrong guesses of the window from every visitor."""
        with self.lock:
            self.failures[client].append(self.clock())
            return self._recent()


ATTEMPTS = Attempts()
ADMITTED: set[str] = set()  # Streamlit session ids whose visitor gave the token, in this server process


class Gate:
    """ASGI middleware in front of Streamlit's server when a token is set (see the module's docstring): a request
    it refuses gets 403 and never reaches Streamlit."""

    def __init__(self, app):
        self.app = app
        self.uploads: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # session id -> [files, bytes]

    def refusal(self, scope: dict) -> str | None:
        path = scope.get("path", "")
        if path.startswith(CLOSED_ROUTES):
            return "closed while a login token is set"
        if not path.startswith(UPLOAD_ROUTE):
            return None
        session = path[len(UPLOAD_ROUTE):].split("/", 1)[0]
        if session not in ADMITTED:
            return "an upload from a session that has not given the token"
        if scope.get("method") != "PUT":
            return None  # DELETE of one's own upload
        length = dict(scope.get("headers", [])).get(b"content-length")
        used = self.uploads[session]
        if length is None or used[0] >= MAX_UPLOADS or used[1] + int(length) > MAX_UPLOAD_BYTES:
            return f"uploads of a session are capped at {MAX_UPLOADS} files and {MAX_UPLOAD_BYTES >> 20} MB"
        used[0], used[1] = used[0] + 1, used[1] + int(length)
        return None

    async def __call__(self, scope, receive, send):
        reason = self.refusal(scope) if scope["type"] == "http" else None
        if reason is None:
            return await self.app(scope, receive, send)
        route = "/".join(scope.get("path", "").split("/")[:3])  # the route, not the session or file ids after it
        log.warning("refused %s %s/...: %s", scope.get("method"), route, reason)
        body = f"refused: {reason}".encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
