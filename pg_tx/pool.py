"""The connection pool: psycopg connections to one database, opened on demand, each
use of one bounded by the database's deadline.

Not psycopg_pool, whose reconnection in the background makes a request wait while
the server is away and after it is back (see Pool). `Conn`, the connection every
module of this package takes, is the pool's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import select
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

import psycopg
import psycopg.errors

from plumbing.storage import StorageError

if TYPE_CHECKING:
    from .settings import Settings

Conn = psycopg.AsyncConnection[Any]

POOL_WAIT_S: Final = 5.0  # for a connection of the pool, before a request fails (503)


class PoolTimeout(Exception):
    """Every connection of the pool was busy for POOL_WAIT_S."""


class DeadlinePassed(Exception):
    """The database did not answer within the deadline; the connection in use was cut
    and is not used again."""

    def __init__(self, deadline_s: float) -> None:
        super().__init__(f"the database did not answer within {deadline_s:g} s")
        self.deadline_s = deadline_s


# What a session reports (ParameterStatus, PostgreSQL 14 and later) when every
# transaction of it is read-only: its database or role defaulted to read-only when it
# began, or the server is a hot standby. Such a session stays so for life, whatever
# the server's setting is now: it is dropped, not lent again.
_READ_ONLY_PARAMETERS: Final = (b"default_transaction_read_only", b"in_hot_standby")


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
        self.deadline_s = settings.deadline_s
        # Not behind a pooler in transaction mode (prepare=off): a session setting would
        # stay on a server connection that the pooler then lends to other clients.
        self._bound_statements = settings.prepare
        self._idle: collections.deque[Conn] = collections.deque()
        self._count = 0  # connections open or being opened
        self._freed = asyncio.Condition()
        self._closed = False

    async def adopt(self, conn: Conn) -> None:
        """Keep `conn`, idle outside any transaction, as one of the pool's (closed if
        it cannot be made so)."""
        await self._bound(conn)
        self._idle.append(conn)
        self._count += 1

    async def _connect(self) -> Conn:
        conn = await psycopg.AsyncConnection.connect(self._conninfo, **self._kwargs)
        await self._bound(conn)
        return conn

    async def _bound(self, conn: Conn) -> None:
        """Each connection of the pool as `_bound_statements` says (bound_statements)."""
        if not self._bound_statements:
            return
        try:
            await bound_statements(conn, self.deadline_s)
        except BaseException:
            await close_quietly(conn)
            raise

    @contextlib.asynccontextmanager
    async def connection(self, *, bounded: bool = True) -> AsyncIterator[Conn]:
        """A connection, for one call: the wait for it, its opening and the block all
        end within `deadline_s` of the call (`bounded`; not for a migration, which
        may rightly take longer). Past it, a connection in use is cut (its socket
        shut down: psycopg's wait then fails at once, where a cancellation would
        have it send a cancel request and wait again) and DeadlinePassed is raised
        for the block's error; the connection is closed, never lent again."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self.deadline_s if bounded else None
        conn = await self._get(due)
        cut = _Cut(conn)
        timer = None if due is None else loop.call_at(due, cut)
        discard = False
        try:
            yield conn
        except BaseException as exc:
            discard = _read_only_error(exc)
            if cut.done and isinstance(exc, psycopg.Error | StorageError):
                raise DeadlinePassed(self.deadline_s) from exc
            raise
        finally:
            try:
                if not (discard or cut.done or self._closed):
                    await _out_of_failed_transaction(conn)  # before the deadline too
            finally:
                if timer is not None:
                    timer.cancel()
                await self._put(conn, discard=discard or cut.done)

    async def _get(self, due: float | None) -> Conn:
        if self._closed:
            raise StorageError("the database connections are closed")
        loop = asyncio.get_running_loop()
        waited_until = loop.time() + POOL_WAIT_S
        until = waited_until if due is None else min(waited_until, due)
        while True:
            while self._idle:
                conn = self._idle.pop()  # the most recently used: warm, and the others expire
                if _healthy(conn):
                    return conn
                self._count -= 1
                await close_quietly(conn)
            if self._count < self._max:
                self._count += 1
                try:
                    async with asyncio.timeout_at(due):
                        return await self._connect()
                except TimeoutError:
                    self._count -= 1
                    raise DeadlinePassed(self.deadline_s) from None
                except BaseException:
                    self._count -= 1
                    raise
            async with self._freed:
                left = until - loop.time()
                if left <= 0:
                    if until < waited_until:
                        raise DeadlinePassed(self.deadline_s)
                    raise PoolTimeout()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), left)

    async def _put(self, conn: Conn, *, discard: bool = False) -> None:
        """Keep `conn` for the next call if it is fit to be lent: idle outside a
        transaction, open, not read-only, not to be discarded; else close it."""
        if (
            discard
            or self._closed
            or conn.closed
            or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            or _read_only(conn)
        ):
            self._count -= 1
            await close_quietly(conn)
        else:
            self._idle.append(conn)
        async with self._freed:
            self._freed.notify()

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            await close_quietly(self._idle.pop())
        self._count = 0


async def _out_of_failed_transaction(conn: Conn) -> None:
    """Roll back a transaction that an error left open (a connection that cannot is
    left as it is, and the pool drops it)."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        with contextlib.suppress(psycopg.Error):
            await conn.rollback()


class _Cut:
    """Called when a connection's deadline passes: shuts its socket down, so that
    whatever waits on it (a query, a COMMIT, a pipeline's sync) fails at once
    ("server closed the connection"), however long the server stays silent."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self.done = False

    def __call__(self) -> None:
        self.done = True
        with contextlib.suppress(OSError, ValueError, psycopg.Error):
            sock = socket.socket(fileno=self._conn.pgconn.socket)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.detach()  # the descriptor stays libpq's, to close


def _read_only(conn: Conn) -> bool:
    """Whether the session says every transaction of it is read-only (see
    _READ_ONLY_PARAMETERS)."""
    try:
        return any(conn.pgconn.parameter_status(p) == b"on" for p in _READ_ONLY_PARAMETERS)
    except psycopg.Error:
        return True


def _read_only_error(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from, is a write refused because the
    transaction is read-only (what a server before 14, which reports no such
    parameter, tells of a read-only session)."""
    for _ in range(8):  # a chain of causes is short; a cycle must not loop for ever
        if exc is None:
            return False
        if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _healthy(conn: Conn) -> bool:
    """An idle connection the server has not ended: open, and nothing waiting on its
    socket (an idle session is sent nothing unless it is being closed)."""
    if conn.closed or conn.broken or _read_only(conn):
        return False
    try:
        poller = select.poll()  # not select(): a busy process has descriptors above 1024
        poller.register(conn.pgconn.socket, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError, psycopg.Error):
        return False


async def bound_statements(conn: Conn, deadline_s: float) -> None:
    """The server ends a statement of this session that runs past the deadline. The
    pool cuts a connection whose call passed it, but a server does not notice a
    closed socket while a statement runs: a handler's slow statement, or one waiting
    for a lock of its own setting, would go on, hold its rows and commit what was
    sent with it, long after the caller was answered 503. (A transaction that must
    run longer, a registry's schema at start, sets it off for itself.) A session
    setting: not made behind a pooler in transaction mode (`prepare=off`), whose
    server connections other clients share."""
    await conn.execute(f"SET statement_timeout = {max(1, round(deadline_s * 1000))}".encode())
    await conn.commit()


async def close_quietly(conn: Conn) -> None:
    """Close a connection, whatever state it or the server is in."""
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()
