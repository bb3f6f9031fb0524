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

import logging
from collections import defaultdict

from garlic.live.access import AccessError, Attempts, is_loopback, token_matches  # noqa: F401  (the page's rule)
from garlic.live.access import required_token as server_token

TOKEN_VARIABLE = "GARLIC_DASHBOARD_TOKEN"
MAX_UPLOADS, MAX_UPLOAD_BYTES = 50, 10 << 20  # a session's uploads in all: record files are under 100 kB
CLOSED_ROUTES = ("/media/", "/_stcore/metrics", "/component/", "/app/static/")
UPLOAD_ROUTE = "/_stcore/upload_file/"
log = logging.getLogger("garlic.dashboard")


def required_token(host: str | None, environment: dict[str, str] | None = None) -> str | None:
    """The token visitors must give for a dashboard on ``host`` (``garlic.live.access.required_token`` with
    ``GARLIC_DASHBOARD_TOKEN``)."""
    return server_token(host, TOKEN_VARIABLE, environment)


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
        session = path[len(UPLOAD_ROUTE) :].split("/", 1)[0]
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
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
