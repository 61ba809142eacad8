"""What a libpq URI asks of this package, checked without connecting.

The URI carries two options of the project's own (see the package docstring), taken
out here before libpq sees it; what is left is libpq's, checked by libpq's own parser
so that a URI it would refuse is BadLocation at once, not a failure when first used.
"""

from __future__ import annotations

import socket
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.conninfo

from plumbing.storage import BadLocation, redacted

from .errors import first_line
from .names import check_schema

CONNECT_TIMEOUT_S: Final = 5  # to reach the server at all
DEFAULT_POOL_MAX: Final = 8


class Settings:
    """What a URI asks of the pool besides libpq's own parameters."""

    def __init__(self, url: str) -> None:
        self.display = redacted(url)
        try:
            parts = urlsplit(url)
            params = parse_qsl(parts.query, keep_blank_values=True)
        except ValueError as exc:
            raise BadLocation(f"{self.display}: not a valid PostgreSQL URI ({exc})") from None
        ours = {k: v for k, v in params if k in ("prepare", "pool_max", "schema")}
        self.conninfo = urlunsplit(
            parts._replace(query=urlencode([(k, v) for k, v in params if k not in ours]))
        )
        prepare = ours.get("prepare", "on")
        if prepare not in ("on", "off"):
            raise BadLocation(f"{self.display}: prepare must be on or off, not {prepare!r}")
        self.prepare = prepare == "on"
        pool_max = ours.get("pool_max", str(DEFAULT_POOL_MAX))
        if not pool_max.isdigit() or not 1 <= int(pool_max) <= 100:
            raise BadLocation(f"{self.display}: pool_max must be from 1 to 100, not {pool_max!r}")
        self.pool_max = int(pool_max)
        schema = ours.get("schema")
        try:
            self.schema = None if schema is None else check_schema(schema)
        except BadLocation as exc:
            raise BadLocation(f"{self.display}: {exc}") from None
        try:
            psycopg.conninfo.conninfo_to_dict(self.conninfo)
        except psycopg.ProgrammingError as exc:
            raise BadLocation(
                f"{self.display}: not a valid PostgreSQL URI ({first_line(exc)})"
            ) from None


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
