"""Who may reach a server that holds patient records, the dashboard's as the live monitor's: anyone on this
machine when it listens on the loopback address only, and only clients that give the server's token (an
environment variable of its own) when it listens wider. ``Attempts`` bounds token guessing, per client address and
overall; ``port_number`` checks the port either listens on."""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import os
import threading
import time
from collections import defaultdict, deque

MONITOR_TOKEN = "GARLIC_MONITOR_TOKEN"  # the live service's (garlic monitor); the dashboard's is its own
MIN_TOKEN_LENGTH = 16
MIN_DISTINCT_CHARACTERS = 8  # `openssl rand -hex 16` has about 13; sixteen spaces or one letter repeated have 1
LOOPBACK_NAMES = {"localhost"}


class AccessError(ValueError):
    """A server address that would expose the records without a usable token; the message says what to do."""


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


def required_token(host: str | None, variable: str, environment: dict[str, str] | None = None) -> str | None:
    """The token clients must give for a server on ``host`` (read from the environment's ``variable``): None on
    the loopback address without one set.

    Raises AccessError where the server would listen wider and no token of at least MIN_TOKEN_LENGTH
    characters is set. A token set for a loopback server is required too.
    """
    token = (os.environ if environment is None else environment).get(variable, "")
    example = f"export {variable}=$(openssl rand -hex 16)"
    if token and len(token) < MIN_TOKEN_LENGTH:
        raise AccessError(
            f"{variable} is {len(token)} characters long; use at least {MIN_TOKEN_LENGTH} (for example: {example})"
        )
    if token and (len(set(token)) < MIN_DISTINCT_CHARACTERS or any(c.isspace() for c in token)):
        raise AccessError(
            f"{variable} is too easy to guess (spaces, or fewer than {MIN_DISTINCT_CHARACTERS} "
            f"different characters); use a random one, for example: {example}"
        )
    if not token and not is_loopback(host):
        raise AccessError(
            f"listening on {host or 'every interface'} needs a login: set {variable} to a secret of "
            f"at least {MIN_TOKEN_LENGTH} characters (for example: {example}), or keep the default "
            "--host 127.0.0.1"
        )
    return token or None


def token_matches(given: str, token: str) -> bool:
    """Constant-time comparison, so that the time taken does not tell how much of a guess was right."""
    return hmac.compare_digest(given.encode(), token.encode())


class Attempts:
    """Failed token guesses in the last ``window`` seconds: a client's address may make ``per_client`` of them, all
    clients together ``overall``; past either, no guess is even checked until older ones age out."""

    def __init__(self, per_client: int = 5, overall: int = 20, window: float = 60.0, clock=time.monotonic):
        self.per_client, self.overall, self.window, self.clock = per_client, overall, window, clock
        self.failures: dict[str, deque[float]] = defaultdict(deque)
        self.lock = threading.Lock()  # servers answer on several threads

    def _recent(self, client: str | None = None) -> int:
        cutoff = self.clock() - self.window
        for times in self.failures.values():
            while times and times[0] < cutoff:
                times.popleft()
        return len(self.failures[client]) if client is not None else sum(map(len, self.failures.values()))

    def blocked(self, client: str) -> bool:
        with self.lock:
            return self._recent(client) >= self.per_client or self._recent() >= self.overall

    def blocked_client(self, client: str) -> bool:
        """Whether ``client`` alone made ``per_client`` wrong guesses in the window: the others' guesses never
        count against it (the live service's rule)."""
        with self.lock:
            return self._recent(client) >= self.per_client

    def failed(self, client: str) -> int:
        """Record a wrong guess from ``client``; returns the wrong guesses of the window from every client."""
        with self.lock:
            self.failures[client].append(self.clock())
            return self._recent()


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535 (a larger one fails only after the server says it is ready)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return port
