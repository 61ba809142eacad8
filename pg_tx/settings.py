"""What a libpq URI asks of this package, checked without connecting.

The URI carries options of the project's own (see the package docstring), taken
out here before libpq sees it; what is left is libpq's, checked by libpq's own parser
so that a URI it would refuse is BadLocation at once, not a failure when first used.
"""

from __future__ import annotations

import re
import socket
from typing import Any, Final
from urllib.parse import unquote, urlsplit

import psycopg
import psycopg.conninfo

from plumbing.storage import BadLocation, redacted

from .errors import first_line
from .names import check_schema

CONNECT_TIMEOUT_S: Final = 5  # to reach the server at all
DEFAULT_POOL_MAX: Final = 8
# Every call on the database (a connection of the pool, waited for or opened, and its
# whole use) ends within this (`deadline=SECONDS` in the URI): a server that stops
# answering (stopped, a stalled disk, a black-holed network whose TCP connection stays
# open) fails a request with 503 instead of hanging it. Above LOCK_WAIT_MS, so that a
# lock waited for out of its time says so itself.
DEFAULT_DEADLINE_S: Final = 6.0
MAX_DEADLINE_S: Final = 3600.0
_OURS: Final = ("prepare", "pool_max", "schema", "deadline")
_DECIMAL: Final = re.compile(r"[0-9]+(\.[0-9]+)?")


class Settings:
    """What a URI asks of the pool besides libpq's own parameters."""

    def __init__(self, url: str) -> None:
        self.display = redacted(url)
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise BadLocation(f"{self.display}: not a valid PostgreSQL URI ({exc})") from None
        # Each parameter as written: libpq decodes %XX but not + (a space is %20), so
        # its own are passed on untouched and only the project's are decoded here.
        pairs = [part.partition("=") for part in parts.query.split("&") if part]
        ours: dict[str, str] = {}
        for key, _, value in pairs:
            if unquote(key) in _OURS:
                if unquote(key) in ours:
                    raise BadLocation(f"{self.display}: {unquote(key)} is given twice")
                ours[unquote(key)] = unquote(value)
        theirs = "&".join(f"{k}={v}" for k, _, v in pairs if unquote(k) not in _OURS)
        # The URI as written up to its query (urlunsplit would drop the "//" of an empty
        # host, postgresql:///db, which libpq reads as its local socket).
        base = url.split("?", 1)[0]
        self.conninfo = f"{base}?{theirs}" if theirs else base
        prepare = ours.get("prepare", "on")
        if prepare not in ("on", "off"):
            raise BadLocation(f"{self.display}: prepare must be on or off, not {prepare!r}")
        self.prepare = prepare == "on"
        pool_max = ours.get("pool_max", str(DEFAULT_POOL_MAX))
        if not pool_max.isdigit() or not 1 <= int(pool_max) <= 100:
            raise BadLocation(f"{self.display}: pool_max must be from 1 to 100, not {pool_max!r}")
        self.pool_max = int(pool_max)
        self.deadline_s = _deadline(self.display, ours.get("deadline"))
        schema = ours.get("schema")
        try:
            self.schema = None if schema is None else check_schema(schema)
        except BadLocation as exc:
            raise BadLocation(f"{self.display}: {exc}") from None
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.conninfo)
        except psycopg.ProgrammingError as exc:
            raise BadLocation(
                f"{self.display}: not a valid PostgreSQL URI ({first_line(exc)})"
            ) from None
        _check_libpq_values(self.display, params)


# sslmode's values, as libpq takes them; it refuses any other only when it connects.
_SSLMODES: Final = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _check_libpq_values(display: str, params: dict[str, Any]) -> None:
    """BadLocation for the values libpq parses but refuses only on connecting, so a
    mistyped port or sslmode is a usage error, not a server that cannot be reached."""
    for port in str(params.get("port") or "").split(","):
        if port and (not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535):
            raise BadLocation(f"{display}: the port must be from 1 to 65535, not {port!r}")
    sslmode = params.get("sslmode")
    if sslmode is not None and sslmode not in _SSLMODES:
        raise BadLocation(
            f"{display}: sslmode must be one of {', '.join(_SSLMODES)}, not {sslmode!r}"
        )


def _deadline(display: str, text: str | None) -> float:
    """The `deadline` parameter in seconds (DEFAULT_DEADLINE_S without one): a
    decimal number above 0 and at most MAX_DEADLINE_S, else BadLocation."""
    if text is None:
        return DEFAULT_DEADLINE_S
    if _DECIMAL.fullmatch(text) is None or not 0 < float(text) <= MAX_DEADLINE_S:
        raise BadLocation(
            f"{display}: deadline must be a number of seconds above 0 and at most"
            f" {MAX_DEADLINE_S:g}, not {text!r}"
        )
    return float(text)


def parse(url: str) -> Settings:
    """Check a PostgreSQL URI without connecting (BadLocation if libpq would refuse it)."""
    return Settings(url)


def connection_kwargs(settings: Settings, side: str) -> dict[str, Any]:
    """What every connection to the database is opened with, besides the conninfo."""
    kwargs: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "application_name": f"outbox-{side}@{socket.gethostname()}"[:63],
    }
    if not settings.prepare:
        kwargs["prepare_threshold"] = None
    return kwargs
