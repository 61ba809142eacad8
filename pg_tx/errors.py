"""The one place where driver errors become StorageError.

The services only know StorageError (plumbing.storage): psycopg's errors and the
pool's are translated here, at the boundary, each into one line that is fit for an
HTTP reply or a CLI message and tells an operator what went wrong, not how the
driver put it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import psycopg
import psycopg.errors

from plumbing.storage import StorageError, deadline_passed

from .pool import POOL_WAIT_S, DeadlinePassed, PoolTimeout


@contextlib.asynccontextmanager
async def translated(where: str) -> AsyncIterator[None]:
    """psycopg's and the pool's errors as StorageError, with a short reason; a call
    past the database's deadline as StorageTimeout."""
    try:
        yield
    except DeadlinePassed as exc:
        raise deadline_passed(where, exc.deadline_s) from exc
    except PoolTimeout as exc:
        reason = f"no free database connection in {POOL_WAIT_S:g} s"
        raise StorageError(f"{where}: {reason}", reason=reason) from exc
    except psycopg.Error as exc:
        raise storage_error(where, exc) from exc


def storage_error(where: str, exc: BaseException) -> StorageError:
    """A driver error as StorageError: `where` and what went wrong, with a reason a
    client may be told when it is one of those known (read-only, a full disk)."""
    return StorageError(f"{where}: {describe(exc)}", reason=_KNOWN.get(type(exc)))


# What a client may be told of these (an HTTP 503's reason): they name no object of
# the database and say what an operator would look at.
_KNOWN: dict[type[BaseException], str] = {
    psycopg.errors.ReadOnlySqlTransaction: "the database is read-only",
    psycopg.errors.LockNotAvailable: "locked by another transaction beyond the lock timeout",
    psycopg.errors.DiskFull: "the database server's disk is full",
}


def describe(exc: BaseException) -> str:
    """One line saying what went wrong, fit for an HTTP reply or a CLI message."""
    known = _KNOWN.get(type(exc))
    if known is not None:
        return known
    if isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("40"):
        # Class 40, transaction rollback: a deadlock, a serialization failure.
        return f"the server rolled the transaction back: {first_line(exc)}"
    if isinstance(exc, psycopg.OperationalError):
        return f"the database server cannot be used: {first_line(exc)}"
    return first_line(exc)


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (the driver's may go on with DETAIL and
    CONTEXT lines), or its type's name if it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def translated_sync(where: str) -> Iterator[None]:
    """The same translation for synchronous psycopg code (the caller's own
    connection, in accept_in (publisher.in_transaction))."""
    try:
        yield
    except psycopg.Error as exc:
        raise storage_error(where, exc) from exc
