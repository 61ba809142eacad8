"""What both services need to know of storage without knowing a backend: the error a
storage failure is reported as, and which backend a `--db` value names.

Each side has one factory (`Outbox.open`, `Inbox.open`) that reads the location
with `parse_location` and opens the backend it names; nothing else looks at it.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Generic, Literal, Protocol, Self, TypeVar
from urllib.parse import parse_qsl, urlsplit

SQLITE_SCHEME: Final = "sqlite:"
POSTGRES_SCHEMES: Final = ("postgresql://", "postgres://")
# A scheme followed by "//": anything else with a colon is a file name.
_URL_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")

Backend = Literal["sqlite", "postgres"]


# What a readiness trial of a side's real writes (check_real_writes) writes and rolls
# back: an ID no event can have (shared.event's rules: no spaces or parentheses).
TRIAL_ID: Final = "(readiness trial)"
TRIAL_TYPE: Final = "readiness.trial"


class StorageError(Exception):
    """The database could not be opened or used. `reason`, when the storage layer
    knows one a client may be told (the message itself names the database's
    location, which is not a client's business): what an HTTP 503 says."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class StorageTimeout(StorageError):
    """The database did not answer within the deadline of a call (a server stopped
    or unreachable with its connections still open): the call was abandoned, and
    whatever it may have committed is found again as any retry finds it (an ID
    already known). `reason` is what a client may be told, without the location."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, reason=reason)
        self.reason: str = reason


def deadline_passed(location: str, seconds: float) -> StorageTimeout:
    """What a caller gets once a database call's deadline of `seconds` has passed."""
    reason = f"the database did not answer within {seconds:g} s"
    return StorageTimeout(f"{location}: {reason}", reason=reason)


class BadLocation(ValueError):
    """The database location is not one this program can open."""


@dataclass(frozen=True)
class Location:
    """Which backend to open, and where: a file path for SQLite, a libpq URI for
    PostgreSQL."""

    backend: Backend
    target: str


def parse_location(text: str) -> Location:
    """The backend and target a `--db` value (or OUTBOX_DB) names.

    A plain path, `sqlite:PATH` or `sqlite:///PATH` is a SQLite file; a
    `postgresql://` (or `postgres://`) URL is a PostgreSQL database, checked when it
    is opened; any other URL is refused.
    """
    if not text:
        raise BadLocation("the database location is empty")
    if text.startswith(SQLITE_SCHEME):
        return Location("sqlite", _parameterless(_sqlite_path(text[len(SQLITE_SCHEME) :], text)))
    if text.startswith(POSTGRES_SCHEMES):
        return Location("postgres", text)
    scheme = _URL_RE.match(text)
    if scheme is not None:
        raise BadLocation(
            f"unknown database URL scheme {scheme[0]!r}: give a file path or a postgresql:// URL"
        )
    return Location("sqlite", _parameterless(text))


# A query after a file name (`source.db?schema=relay`): parameters a SQLite file does
# not take, which would otherwise become part of a new file's name.
_PARAMETERS: Final = re.compile(r"\?[^/?]*=[^/]*$")


def _parameterless(path: str) -> str:
    if _PARAMETERS.search(path) and not os.path.exists(path):  # a file so named is taken
        raise BadLocation(
            f"{path!r}: a SQLite file takes no parameters (those after ?): name the file"
            " alone, or give a postgresql:// URI"
        )
    return path


def with_schema(text: str, schema: str | None) -> str:
    """A `--db` value with `--schema NAME` applied: the PostgreSQL URI with
    `schema=NAME` among its parameters (pg_tx names every table of ours in it).
    BadLocation for a SQLite file (a file has no schemas) or a URI that names
    another schema already."""
    if schema is None:
        return text
    if parse_location(text).backend != "postgres":
        raise BadLocation("--schema is for a PostgreSQL database; a SQLite file has none")
    parts = urlsplit(text)
    named = [value for key, value in parse_qsl(parts.query) if key == "schema"]
    if named and named != [schema]:
        raise BadLocation(f"--schema {schema!r} and the URI's schema={named[0]!r} differ")
    if named:
        return text
    # Appended to the text as written: urlunsplit would drop the "//" of an empty host
    # (postgresql:///db, libpq's local socket).
    return f"{text}&schema={schema}" if parts.query else f"{text.split('?', 1)[0]}?schema={schema}"


def redacted(url: str) -> str:
    """A database URL fit for a message or a log: any password replaced by `***`."""
    return _PASSWORD_RE.sub(r"\1***@", _PASSWORD_PARAM_RE.sub(r"\1***", url))


# user:password@ in the authority, and password=... among the query parameters.
_PASSWORD_RE: Final = re.compile(r"^([a-z]+://[^:/@?]*:)[^@/?]*@")
_PASSWORD_PARAM_RE: Final = re.compile(r"([?&]password=)[^&]*")


def _sqlite_path(rest: str, text: str) -> str:
    if rest.startswith("//"):  # sqlite:///abs/path: an empty host, then the path
        host, slash, path = rest[2:].partition("/")
        if host:
            raise BadLocation(f"{text!r}: a SQLite URL names no host")
        rest = slash + path
    if not rest:
        raise BadLocation(f"{text!r}: the SQLite URL names no file")
    return rest


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


class Opening(Generic[C]):
    """What `X.open(...)` returns: await it, or use it with `async with`."""

    def __init__(self, opener: Callable[[], Awaitable[C]]) -> None:
        self._opener = opener
        self._opened: C | None = None

    def __await__(self) -> Generator[Any, None, C]:
        return self._opener().__await__()

    async def __aenter__(self) -> C:
        self._opened = await self._opener()
        return self._opened

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._opened is not None:
            await self._opened.close()


class ClosesOnExit:
    """Mixin: `async with obj:` closes it on the way out (`close` is the subclass's)."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class StoreBase(ClosesOnExit, ABC):
    """What every store of either side is besides its own operations: somewhere,
    closable (`async with` closes it), and able to say whether it can take a write."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the store lives, for messages (a file path, a URL without secrets)."""

    @abstractmethod
    async def close(self) -> None:
        """Close the connection(s); `async with` calls it on the way out."""

    @abstractmethod
    async def check_writable(self) -> None:
        """Return when the database can take a write now; raise StorageError, with a
        short reason, when it cannot (a full disk, a read-only file, locked beyond the
        busy timeout, the database gone). For a readiness check: cheap enough to call
        every second, and honest (a write rolled back proves nothing of disk space)."""

    async def check_real_writes(self) -> None:
        """Return when the store's real writes can be made now, else StorageError
        with the reason: what readiness asks once a real write failed, since
        `check_writable` writes only its probe row (no new page, no privilege on
        the real tables, none of their triggers). A backend that can try its real
        writes without keeping them does so; by default, `check_writable`."""
        await self.check_writable()
