"""PostgreSQL for asyncio, shared by both sides' PostgreSQL backends.

One `PgDatabase` per store: a psycopg 3 connection pool on a libpq URI, the side's
versioned migrations, durable commits, a writability probe, wake-ups by LISTEN/NOTIFY
and the one place where driver errors become `StorageError`. The SQL of each side
stays in its own backend module.

Options the project adds to the URI (removed before libpq sees it):
- `prepare=off`: no server-side prepared statements, for PgBouncer in transaction
  mode (a prepared statement lives on one server connection, which such a pooler
  does not keep for a client).
- `pool_max=N`: the most connections the pool opens (default 8).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import select
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.conninfo
import psycopg.errors

import plumbing.group_commit
from plumbing.storage import BadLocation, StorageError, redacted

T = TypeVar("T")
C_in = TypeVar("C_in")
R_out = TypeVar("R_out")
Conn = psycopg.AsyncConnection[Any]

CONNECT_TIMEOUT_S: Final = 5  # to reach the server at all
POOL_WAIT_S: Final = 5.0  # for a connection of the pool, before a request fails (503)
LOCK_WAIT_MS: Final = 5_000  # the busy timeout's analogue: a lock waited for at most this
PROBE_LOCK_WAIT_MS: Final = 1_000
DEFAULT_POOL_MAX: Final = 8
VERSIONS_TABLE: Final = "schema_versions"  # one row per side; both sides may share a database

log = logging.getLogger("pg_tx")


class _QuietAbortedPipeline(logging.Filter):
    """psycopg warns when leaving a pipeline fails while an exception already leaves
    the block: "error ignored terminating <pipeline>: ..." when the closing sync
    fails ("pipeline aborted" after a failed statement, or the server's own words and
    CONTEXT lines when it went away), and "error ignored exiting <pipeline>: ..."
    when libpq cannot leave pipeline mode (the server ended the session while
    results were still due: "cannot exit pipeline mode while busy"). It logs them
    only while the block's own exception propagates, and that one is raised and
    translated anyway, so the warnings tell an operator nothing new and would put
    driver text into the services' logs."""

    QUIET = frozenset({"error ignored terminating %r: %s", "error ignored exiting %r: %s"})

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in self.QUIET


logging.getLogger("psycopg").addFilter(_QuietAbortedPipeline())


class Settings:
    """What a URI asks of the pool besides libpq's own parameters."""

    def __init__(self, url: str) -> None:
        self.display = redacted(url)
        try:
            parts = urlsplit(url)
            params = parse_qsl(parts.query, keep_blank_values=True)
        except ValueError as exc:
            raise BadLocation(f"{self.display}: not a valid PostgreSQL URI ({exc})") from None
        ours = {k: v for k, v in params if k in ("prepare", "pool_max")}
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
        try:
            psycopg.conninfo.conninfo_to_dict(self.conninfo)
        except psycopg.ProgrammingError as exc:
            raise BadLocation(
                f"{self.display}: not a valid PostgreSQL URI ({_first_line(exc)})"
            ) from None


def parse(url: str) -> Settings:
    """Check a PostgreSQL URI without connecting (BadLocation if libpq would refuse it)."""
    return Settings(url)


class PgDatabase:
    """A connection pool on one database, its schema brought up to date for one side."""

    def __init__(self, pool: Pool, settings: Settings, side: str) -> None:
        self.pool = pool
        self.settings = settings
        self.side = side

    @property
    def location(self) -> str:
        return self.settings.display

    @classmethod
    async def open(
        cls, url: str, *, side: str, migrations: Sequence[str], probe_table: str
    ) -> PgDatabase:
        """Connect, bring `side`'s schema to the newest of `migrations` (each applied
        once, in a transaction of its own, under an advisory lock so that processes
        starting together migrate once), and open the pool. StorageError if the
        server cannot be reached or its schema is newer than `migrations` knows."""
        settings = parse(url)
        kwargs = _connection_kwargs(settings, side)
        try:
            first = await psycopg.AsyncConnection.connect(settings.conninfo, **kwargs)
        except psycopg.Error as exc:
            raise StorageError(f"{settings.display}: cannot connect: {_first_line(exc)}") from exc
        try:
            async with _translated(settings.display):
                await _migrate(first, side, migrations)
        except BaseException:
            await _close_quietly(first)
            raise
        pool = Pool(settings, kwargs)
        pool.adopt(first)  # the pool's first connection
        db = cls(pool, settings, side)
        db._probe_table = probe_table
        return db

    _probe_table = ""

    # ------------------------------------------------------------------ transactions

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A connection of the pool, outside any transaction (autocommit off: the
        first statement begins one), with driver errors translated."""
        async with _translated(self.location), self.pool.connection() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def transaction(self, *, pipeline: bool = False) -> AsyncIterator[Conn]:
        """A transaction that commits on the way out (rolls back on an error), with
        every commit durable before it returns: synchronous_commit is set on for the
        transaction, whatever the server's or the role's default, and a lock is waited
        for at most LOCK_WAIT_MS.

        With `pipeline`, in psycopg's pipeline mode: BEGIN, the statements and COMMIT
        go to the server without waiting for each reply, in one round trip unless a
        result is fetched inside (which waits for the replies so far)."""
        async with self.connection() as conn, durable(conn, pipeline=pipeline):
            yield conn

    async def dedicated(self, application_name: str) -> Conn:
        """A connection of its own, outside the pool, in autocommit, for a session
        that must last (a session-level lock); the caller closes it. Its
        `application_name` is what pg_stat_activity shows for it."""
        kwargs = {**_connection_kwargs(self.settings, self.side), "autocommit": True}
        kwargs["application_name"] = application_name
        async with _translated(self.location):
            return await psycopg.AsyncConnection.connect(self.settings.conninfo, **kwargs)

    async def query(
        self, statement: bytes | str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """The rows of one statement run on its own (autocommit: one round trip, no
        BEGIN or COMMIT). For a read that needs no other read to agree with it."""
        query = statement.encode() if isinstance(statement, str) else statement
        async with self.connection() as conn:
            await conn.set_autocommit(True)
            try:
                cursor = await conn.execute(query, params)
                return await cursor.fetchall() if cursor.description is not None else []
            finally:
                await conn.set_autocommit(False)

    async def run(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """`await fn(conn)` inside one durable transaction; its result."""
        async with self.transaction() as conn:
            return await fn(conn)

    async def read(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """`await fn(conn)` in one read-only snapshot (REPEATABLE READ): several reads
        that must agree see one state."""
        async with self.connection() as conn, conn.transaction():
            await conn.execute(SNAPSHOT)
            return await fn(conn)

    async def check_writable(self) -> None:
        """Return when a durable write commits now, else StorageError with a short
        reason: a real update of the side's probe row, waiting at most
        PROBE_LOCK_WAIT_MS for its lock, committed and flushed (a rolled-back write
        would prove nothing of disk space)."""
        table = self._probe_table
        async with self.transaction() as conn:
            await conn.execute(f"SET LOCAL lock_timeout = {PROBE_LOCK_WAIT_MS}".encode())
            await conn.execute(f"UPDATE {table} SET at = %s WHERE id = 1".encode(), (time.time(),))

    async def close(self) -> None:
        await self.pool.close()

    # ------------------------------------------------------------------ wake-ups

    async def notifications(self, channel: str) -> AsyncIterator[None]:
        """Yield once per NOTIFY on `channel` received (several close together may be
        one), from a connection of its own that is opened again whenever it is lost.
        Only a signal: what changed is read from the tables. Behind a pooler that
        does not pass NOTIFY on, nothing arrives and polling carries on alone."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.settings.conninfo,
                    autocommit=True,
                    **_connection_kwargs(self.settings, self.side),
                )
            except psycopg.Error:
                await asyncio.sleep(1.0)
                continue
            try:
                await conn.execute(f"LISTEN {channel}".encode())
                yield None  # listening now: whatever was notified before is read anyway
                async for _ in conn.notifies():
                    yield None
            except psycopg.Error:
                await asyncio.sleep(1.0)  # the server went away: listen again when back
            finally:
                with contextlib.suppress(psycopg.Error):
                    await conn.close()


class GroupCommit(plumbing.group_commit.GroupCommit[C_in, R_out]):
    """Group commit (plumbing.group_commit) on a pooled connection: calls submitted
    while a group is being committed share the next transaction's round trips and
    its WAL flush.

    `commit(conn, calls)` gets a connection outside any transaction, makes one
    transaction of all the calls, and returns one outcome per call.
    """

    def __init__(
        self,
        db: PgDatabase,
        commit: Callable[[Conn, list[C_in]], Awaitable[list[R_out | Exception]]],
    ) -> None:
        async def run(calls: list[C_in]) -> list[R_out | Exception]:
            async with db.connection() as conn:
                return await commit(conn, calls)

        super().__init__(run)


class PoolTimeout(Exception):
    """Every connection of the pool was busy for POOL_WAIT_S."""


class Pool:
    """Up to `pool_max` connections, opened on demand and kept while healthy.

    psycopg_pool reconnects in the background with a growing delay, so while the
    server is away a request waits out the whole pool timeout, and once it is back
    the next one may still wait for the delay. Here a request that finds no healthy
    idle connection opens one itself, at once: it fails within the connect timeout
    while the server is away (503, not a hang), and succeeds as soon as it is back.
    An idle connection is checked without a round trip: a server that ended the
    session (shut down, terminated it) has left something to read on its socket.
    """

    def __init__(self, settings: Settings, kwargs: dict[str, Any]) -> None:
        self._conninfo = settings.conninfo
        self._kwargs = kwargs
        self._max = settings.pool_max
        self._idle: collections.deque[Conn] = collections.deque()
        self._count = 0  # connections open or being opened
        self._freed = asyncio.Condition()
        self._closed = False

    def adopt(self, conn: Conn) -> None:
        """Keep `conn`, idle outside any transaction, as one of the pool's."""
        self._idle.append(conn)
        self._count += 1

    async def _connect(self) -> Conn:
        return await psycopg.AsyncConnection.connect(self._conninfo, **self._kwargs)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        conn = await self._get()
        try:
            yield conn
        finally:
            await self._put(conn)

    async def _get(self) -> Conn:
        if self._closed:
            raise StorageError("the database connections are closed")
        deadline = time.monotonic() + POOL_WAIT_S
        while True:
            while self._idle:
                conn = self._idle.pop()  # the most recently used: warm, and the others expire
                if _healthy(conn):
                    return conn
                self._count -= 1
                await _close_quietly(conn)
            if self._count < self._max:
                self._count += 1
                try:
                    return await self._connect()
                except BaseException:
                    self._count -= 1
                    raise
            async with self._freed:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolTimeout()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), left)

    async def _put(self, conn: Conn) -> None:
        status = conn.info.transaction_status
        if not self._closed and status == psycopg.pq.TransactionStatus.INERROR:
            with contextlib.suppress(psycopg.Error):
                await conn.rollback()
            status = conn.info.transaction_status
        if self._closed or conn.closed or status != psycopg.pq.TransactionStatus.IDLE:
            self._count -= 1
            await _close_quietly(conn)
        else:
            self._idle.append(conn)
        async with self._freed:
            self._freed.notify()

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            await _close_quietly(self._idle.pop())
        self._count = 0


def _healthy(conn: Conn) -> bool:
    """An idle connection the server has not ended: open, and nothing waiting on its
    socket (an idle session is sent nothing unless it is being closed)."""
    if conn.closed or conn.broken:
        return False
    try:
        poller = select.poll()  # not select(): a busy process has descriptors above 1024
        poller.register(conn.pgconn.socket, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError, psycopg.Error):
        return False


async def close_quietly(conn: Conn) -> None:
    """Close a connection, whatever state it or the server is in."""
    await _close_quietly(conn)


async def _close_quietly(conn: Conn) -> None:
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()


@contextlib.asynccontextmanager
async def durable(conn: Conn, *, pipeline: bool = False) -> AsyncIterator[Conn]:
    """A durable transaction (see PgDatabase.transaction) on a connection the caller
    holds; in pipeline mode with `pipeline`. Driver errors are the caller's to
    translate."""
    if pipeline:
        async with conn.pipeline(), conn.transaction():
            await conn.execute(DURABLE)
            yield conn
    else:
        async with conn.transaction():
            await conn.execute(DURABLE)
            yield conn


async def in_one_round_trip(
    conn: Conn, statement: bytes, params: dict[str, Any], *, flush: bool = True
) -> tuple[Any, ...] | None:
    """`statement` in a durable transaction of its own (with `flush` False, one whose
    COMMIT does not wait for the WAL flush: UNFLUSHED), and its first row: BEGIN,
    the settings (DURABLE), the statement and COMMIT as one simple query, so one
    message each way (in pipeline mode psycopg sends each statement and the sync as
    messages of their own, and a row must be fetched before the COMMIT can be sent:
    two round trips). `conn` is one the caller holds, outside any transaction. The
    parameters are bound client side (psycopg's ClientCursor quotes them; a list is
    written as an array literal first, see `array_literal`). An error
    in the statement skips the COMMIT: the transaction is then rolled back here and
    the (driver's) error raised, for the caller to translate."""
    await conn.set_autocommit(True)  # the text has its own BEGIN and COMMIT
    try:
        cursor = psycopg.AsyncClientCursor(conn)
        bound = {k: array_literal(v) if isinstance(v, list) else v for k, v in params.items()}
        settings = DURABLE if flush else UNFLUSHED
        await cursor.execute(b"BEGIN;" + settings + b";" + statement + b";COMMIT", bound)
        cursor.nextset()  # past BEGIN's and the settings' results
        cursor.nextset()
        row: tuple[Any, ...] | None = await cursor.fetchone()
        return row
    finally:
        await _back_to_transactions(conn)


def array_literal(values: Sequence[str | int | float | bool | None]) -> str:
    """An array's text form (`{"a",NULL,"b\\"c"}`), for a parameter the statement
    casts (`%(ids)s::text[]`). psycopg quotes a list element by element in Python,
    about ten times slower than this for a group's arrays; the literal is then quoted
    once, as any string. Elements are strings (double-quoted, `"` and `\\` escaped),
    None (NULL), booleans and numbers."""
    return "{" + ",".join(map(_array_element, values)) + "}"


def _array_element(value: str | int | float | bool | None) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | float) and math.isfinite(value):
        return repr(value)
    raise TypeError(f"no array literal for {value!r}")


async def _back_to_transactions(conn: Conn) -> None:
    """Leave `conn` as the pool lends it (idle, autocommit off), or closed so that
    the pool drops it."""
    try:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await conn.execute(b"ROLLBACK")
        await conn.set_autocommit(False)
    except psycopg.Error:
        await conn.close()


def _transaction_settings(synchronous_commit: str) -> bytes:
    """One transaction's settings: whether its COMMIT waits for the WAL flush, and
    a lock waited for at most LOCK_WAIT_MS (the busy timeout's analogue), not forever."""
    return (
        f"SELECT set_config('synchronous_commit', '{synchronous_commit}', true),"
        f" set_config('lock_timeout', '{LOCK_WAIT_MS}', true)"
    ).encode()


# For one transaction: its commit waits for the WAL flush.
DURABLE: Final = _transaction_settings("on")
# For a transaction whose loss in a crash of the server costs no more than making it
# again (the publisher's marks of pending entries: an entry whose mark is lost is
# pending again, sent again, and the sink answers with a duplicate ACK): its COMMIT
# returns before the WAL is flushed.
# The WAL writer flushes it within three wal_writer_delay (200 ms by default), and
# any durable commit after it flushes it too, as the WAL is flushed in order; a crash
# of the client loses nothing, the server has the commit.
UNFLUSHED: Final = _transaction_settings("off")
SNAPSHOT: Final = b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"


def _connection_kwargs(settings: Settings, side: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "application_name": f"outbox-{side}@{socket.gethostname()}"[:63],
    }
    if not settings.prepare:
        kwargs["prepare_threshold"] = None
    return kwargs


async def _migrate(conn: Conn, side: str, migrations: Sequence[str]) -> None:
    async with conn.transaction():
        # One migrating process at a time per database (both sides share the lock).
        await conn.execute(b"SELECT pg_advisory_xact_lock(hashtext('outbox-relay schema'))")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE} ("
            " side TEXT PRIMARY KEY, version INTEGER NOT NULL)".encode()
        )
        row = await (
            await conn.execute(
                f"SELECT version FROM {VERSIONS_TABLE} WHERE side = %s".encode(), (side,)
            )
        ).fetchone()
        version = 0 if row is None else int(row[0])
        if version > len(migrations):
            raise StorageError(
                f"the {side} schema is version {version}, newer than this program knows"
                f" ({len(migrations)}): run the release that wrote it, or a newer one"
            )
        for number, script in enumerate(migrations[version:], start=version + 1):
            await conn.execute(script.encode())
            await conn.execute(
                f"INSERT INTO {VERSIONS_TABLE} (side, version) VALUES (%s, %s)"
                " ON CONFLICT (side) DO UPDATE SET version = excluded.version".encode(),
                (side, number),
            )


@contextlib.asynccontextmanager
async def _translated(where: str) -> AsyncIterator[None]:
    """psycopg's and the pool's errors as StorageError, with a short reason."""
    try:
        yield
    except PoolTimeout as exc:
        raise StorageError(f"{where}: no free database connection in {POOL_WAIT_S:g} s") from exc
    except psycopg.Error as exc:
        raise StorageError(f"{where}: {describe(exc)}") from exc


def describe(exc: BaseException) -> str:
    """One line saying what went wrong, fit for an HTTP reply or a CLI message."""
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return "the database is read-only"
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return "locked by another transaction beyond the lock timeout"
    if isinstance(exc, psycopg.errors.DiskFull):
        return "the database server's disk is full"
    if isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("40"):
        # Class 40, transaction rollback: a deadlock, a serialization failure.
        return f"the server rolled the transaction back: {_first_line(exc)}"
    if isinstance(exc, psycopg.OperationalError):
        return f"the database server cannot be used: {_first_line(exc)}"
    return _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def translated_sync(where: str) -> Iterator[None]:
    """The same translation for synchronous psycopg code (the caller's own
    connection, in the embedding API)."""
    try:
        yield
    except psycopg.Error as exc:
        raise StorageError(f"{where}: {describe(exc)}") from exc


__all__ = [
    "Conn",
    "GroupCommit",
    "PgDatabase",
    "Pool",
    "PoolTimeout",
    "Settings",
    "array_literal",
    "close_quietly",
    "describe",
    "durable",
    "parse",
    "translated_sync",
]
