"""Who may open the dashboard: anyone on this machine when it listens on the loopback address only, and only
visitors who give the token in ``GARLIC_DASHBOARD_TOKEN`` when it listens wider.

The page holds patient records, so a server reachable from other machines without a login is refused, both by
``garlic dashboard`` (before it starts) and by the page itself (however Streamlit was started).
"""
from __future__ import annotations

import hmac
import ipaddress
import os

TOKEN_VARIABLE = "GARLIC_DASHBOARD_TOKEN"
MIN_TOKEN_LENGTH = 16
LOOPBACK_NAMES = {"localhost"}


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
    if not token and not is_loopback(host):
        raise AccessError(f"listening on {host or 'every interface'} needs a login: set {TOKEN_VARIABLE} to a "
                          f"secret of at least {MIN_TOKEN_LENGTH} characters (for example: export "
                          "GARLIC_DASHBOARD_TOKEN=$(openssl rand -hex 16)), or keep the default "
                          "--host 127.0.0.1")  # fmt: skip
    return token or None


def token_matches(given: str, token: str) -> bool:
    """Constant-time comparison, so that the time taken does not tell how much of a guess was right."""
    return hmac.compare_digest(given.encode(), token.encode())
