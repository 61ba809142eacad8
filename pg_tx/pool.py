"""The connection pool: psycopg connections to one database, opened on demand.

Not psycopg_pool, whose reconnection in the background makes a request wait while
the server is away and after it is back (see Pool). `Conn`, the connection every
module of this package takes, is the pool's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import select
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

import psycopg

from plumbing.storage import StorageError

if TYPE_CHECKING:
    from .settings import Settings

Conn = psycopg.AsyncConnection[Any]

POOL_WAIT_S: Final = 5.0  # for a connection of the pool, before a request fails (503)


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
                await close_quietly(conn)
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
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()
