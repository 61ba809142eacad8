"""Writing inside a caller's own transaction, on either side: the outbox entry a
program publishes with its own rows (publisher.in_transaction) and the inbox row a
consumer records with its effects (sink.in_transaction).

What both need, whatever they write: which connection the caller passed, found
without importing a driver (or SQLAlchemy) the caller has not imported; whether that
connection is in a transaction at all (a connection in autocommit outside one would
commit each statement on its own, and the caller's rows would not commit with ours);
and the driver's errors, SQLAlchemy's wrapping of them included, as StorageError.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple, TypeVar

from plumbing.storage import StorageError

# The classes taken, by module and name: looked up in sys.modules, so that a driver
# (or SQLAlchemy) the caller has not imported is never imported here to find out.
SQLALCHEMY_SYNC: Final = (("sqlalchemy.engine", "Connection"), ("sqlalchemy.orm", "Session"))
SQLALCHEMY_ASYNC: Final = (
    ("sqlalchemy.ext.asyncio", "AsyncConnection"),
    ("sqlalchemy.ext.asyncio", "AsyncSession"),
)
PSYCOPG_ANY: Final = (("psycopg", "Connection"), ("psycopg", "AsyncConnection"))

T = TypeVar("T")


class NotInTransaction(ValueError):
    """The connection would commit each statement on its own (autocommit outside a
    transaction): the event and the caller's rows would not commit together."""


def is_one_of(conn: Any, classes: tuple[tuple[str, str], ...]) -> bool:
    """Whether `conn` is an instance of one of `classes` (module, name) among the
    modules imported so far."""
    for module_name, name in classes:
        module = sys.modules.get(module_name)
        if module is not None and isinstance(conn, getattr(module, name)):
            return True
    return False


def check_psycopg_transaction(conn: Any) -> None:
    """NotInTransaction for a psycopg connection (sync or async) in autocommit mode
    outside a transaction block."""
    from psycopg.pq import TransactionStatus

    if conn.closed:  # its info would raise the driver's own OperationalError
        raise StorageError("the PostgreSQL connection given is closed")
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise NotInTransaction(
            "the connection is in autocommit mode outside a transaction:"
            " open one first (with conn.transaction(): ...)"
        )


def check_sqlite_transaction(driver: Any) -> None:
    """NotInTransaction for a sqlite3 connection (or aiosqlite's, which answers the
    same attributes) that would commit each statement on its own: no transaction
    open, and none begun by its next write (isolation_level None, or Python 3.12's
    autocommit=True)."""
    import sqlite3

    try:
        in_transaction = driver.in_transaction
    except sqlite3.ProgrammingError as exc:  # a closed connection
        raise StorageError(f"the sqlite3 connection given cannot be used: {exc}") from exc
    if not in_transaction and (
        driver.isolation_level is None or getattr(driver, "autocommit", None) is True
    ):
        raise NotInTransaction(
            "the sqlite3 connection is in autocommit mode outside a transaction:"
            ' execute "BEGIN IMMEDIATE" first'
        )


@contextlib.contextmanager
def tables_hinted(advice: str) -> Iterator[None]:
    """A StorageError whose driver error (or SQLAlchemy's around it) says a table is
    not there, PostgreSQL's undefined_table or SQLite's "no such table", raised again
    with `advice` after its message: the side's tables were never made in that
    database, or are in a schema not named."""
    try:
        yield
    except StorageError as exc:
        cause = exc.__cause__
        driver_error = getattr(cause, "orig", None) or cause
        missing = getattr(driver_error, "sqlstate", None) == "42P01" or str(
            driver_error
        ).startswith("no such table")
        if missing:
            raise StorageError(f"{exc}{advice}", reason=exc.reason) from cause
        raise


def pg_where(conn: Any) -> str:
    """The database a psycopg connection is on, as error messages name it."""
    return f"PostgreSQL database {conn.info.dbname!r} on {conn.info.host}:{conn.info.port}"


def pg_failed(driver: Any, exc: BaseException) -> StorageError:
    """What pg_tx.translated_sync makes of a psycopg error, for one SQLAlchemy wrapped."""
    import pg_tx

    return pg_tx.storage_error(pg_where(driver), exc)


class DriverSql(NamedTuple):
    """A SQLAlchemy Connection as the backends' paths use a driver's: `execute(sql,
    params)` runs their driver-style SQL (its paramstyle, the driver's) through
    `exec_driver_sql`, in SQLAlchemy's transaction; the result has `fetchone()`."""

    execute: Callable[[str, Any], Any]


def sqlalchemy_connection(conn: Any) -> tuple[Any, Any]:
    """The SQLAlchemy Connection of a Connection or a Session (or of the sync side of
    an async one, under run_sync), and the driver's own connection under it."""
    from sqlalchemy import orm

    connection = conn.connection() if isinstance(conn, orm.Session) else conn
    return connection, connection.connection.driver_connection


def autobegin(connection: Any) -> None:
    """Begin the SQLAlchemy Connection's transaction if it has none yet, as its next
    statement would (autobegin): done before the checks so that they see the
    transaction as it will be (a "begin" event that emits BEGIN, the SQLite recipe).
    It is the caller's still, to commit or roll back."""
    if not connection.in_transaction():
        connection.begin()


def sqlalchemy_backend(
    dialect: Any,
    driver: Any,
    on_sqlite: T,
    on_postgres: T,
    sqlite_failed: Callable[[BaseException], StorageError],
    postgres_failed: Callable[[Any, BaseException], StorageError] = pg_failed,
) -> tuple[T, Callable[[BaseException], StorageError]]:
    """A side's path for a SQLAlchemy dialect and its driver's connection (`on_sqlite`
    or `on_postgres`), and what a driver error becomes on it (`sqlite_failed`, or
    `postgres_failed` given the driver's connection); TypeError for one not taken."""
    if dialect.name == "sqlite":  # pysqlite, aiosqlite: sqlite3's paramstyles
        return on_sqlite, sqlite_failed
    if dialect.name == "postgresql" and is_one_of(driver, PSYCOPG_ANY):
        return on_postgres, functools.partial(postgres_failed, driver)
    raise TypeError(
        "SQLAlchemy is taken on SQLite (sqlite, sqlite+aiosqlite) and on PostgreSQL"
        f" through psycopg (postgresql+psycopg), not on {dialect.name}+{dialect.driver}"
    )


@contextlib.contextmanager
def driver_errors(failed: Callable[[BaseException], StorageError]) -> Iterator[None]:
    """SQLAlchemy's wrapping of a driver error (DBAPIError) as the StorageError the
    driver's own error becomes; a connection outside any transaction told what to do
    in SQLAlchemy's terms, not its driver's."""
    from sqlalchemy.exc import DBAPIError

    try:
        yield
    except DBAPIError as exc:
        raise failed(exc.orig or exc) from exc
    except NotInTransaction as exc:
        raise NotInTransaction(
            "the SQLAlchemy connection commits each statement on its own (isolation_level"
            ' "AUTOCOMMIT"): use one without it, in a transaction (with conn.begin(): ...'
            " or a Session)"
        ) from exc
