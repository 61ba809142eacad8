"""The database handle of one store: PgDatabase, what a PostgreSQL backend holds.

It ties the other modules together for a side: opens the pool on a URI with the
side's schema up to date, lends connections and durable transactions with driver
errors translated, probes writability, and listens for wake-ups (LISTEN/NOTIFY).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import psycopg

from plumbing.schema import VERSIONS_TABLE, Schema
from plumbing.storage import BadLocation, StorageError

from .errors import first_line, translated
from .migrations import LEGACY_VERSIONS_TABLE, migrate, side_is_there
from .names import Qualify, qualifier
from .pool import Conn, Pool, close_quietly
from .settings import Settings, connection_kwargs, parse
from .transactions import SNAPSHOT, durable

T = TypeVar("T")

PROBE_LOCK_WAIT_MS: Final = 1_000


class PgDatabase:
    """A connection pool on one database, its schema brought up to date for one side."""

    def __init__(self, pool: Pool, settings: Settings, side: str) -> None:
        self.pool = pool
        self.settings = settings
        self.side = side
        # The side's table names written in its schema (pg_tx.names), set by open.
        self.qualify: Qualify = qualifier(None, ())

    @property
    def location(self) -> str:
        return self.settings.display

    @classmethod
    async def open(cls, url: str, schema: Schema, *, create: bool = True) -> PgDatabase:
        """Connect, bring the side's tables to the newest `schema` (those still to
        apply together in one transaction, under an advisory lock so that processes
        starting together migrate once), and open the pool. With a schema named in
        the URI (`schema=NAME`), it is created if missing and every table of the side
        is named in it (`qualify`). StorageError if the server cannot be reached or
        its schema is newer than this program knows. Without `create`, a database (or
        schema) that holds none of the side's tables is BadLocation, and nothing is
        created in it: for the commands that read or change what is there."""
        settings = parse(url)
        kwargs = connection_kwargs(settings, schema.side)
        qualify = qualifier(
            settings.schema, {*schema.tables, VERSIONS_TABLE, LEGACY_VERSIONS_TABLE}
        )
        try:
            first = await psycopg.AsyncConnection.connect(settings.conninfo, **kwargs)
        except psycopg.Error as exc:
            raise StorageError(f"{settings.display}: cannot connect: {first_line(exc)}") from exc
        try:
            async with translated(settings.display):
                if not create and not await side_is_there(first, schema, qualify):
                    where = (
                        "this database"
                        if settings.schema is None
                        else f"schema {settings.schema!r}"
                    )
                    raise BadLocation(
                        f"{settings.display}: the {schema.side}'s tables are not in {where}"
                        " (serve and accept make them): check the database and the schema"
                    )
                await first.rollback()  # the look ends its transaction: nothing was written
                if settings.schema is not None:
                    await first.execute(f'CREATE SCHEMA IF NOT EXISTS "{settings.schema}"'.encode())
                    await first.commit()
                await migrate(first, schema, qualify)
        except BaseException:
            await close_quietly(first)
            raise
        pool = Pool(settings, kwargs)
        async with translated(settings.display):
            await pool.adopt(first)  # the pool's first connection, after the migrations
        db = cls(pool, settings, schema.side)
        db.qualify = qualify
        db._probe_table = qualify(schema.probe_table)
        return db

    _probe_table = ""

    # ------------------------------------------------------------------ transactions

    @contextlib.asynccontextmanager
    async def connection(self, *, bounded: bool = True) -> AsyncIterator[Conn]:
        """A connection of the pool, outside any transaction (autocommit off: the
        first statement begins one), with driver errors translated. The call, the
        wait for the connection included, ends within the URI's deadline (see
        Pool.connection; StorageTimeout past it) unless `bounded` is False: for a
        migration, which may rightly take longer."""
        async with translated(self.location), self.pool.connection(bounded=bounded) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def transaction(
        self, *, pipeline: bool = False, bounded: bool = True
    ) -> AsyncIterator[Conn]:
        """A transaction that commits on the way out (rolls back on an error), with
        every commit durable before it returns: synchronous_commit is set on for the
        transaction, whatever the server's or the role's default, and a lock is waited
        for at most LOCK_WAIT_MS.

        With `pipeline`, in psycopg's pipeline mode: BEGIN, the statements and COMMIT
        go to the server without waiting for each reply, in one round trip unless a
        result is fetched inside (which waits for the replies so far). `bounded`:
        as for `connection`."""
        async with self.connection(bounded=bounded) as conn, durable(conn, pipeline=pipeline):
            if not bounded:  # the server's statement_timeout (bound_statements) too
                await conn.execute(b"SET LOCAL statement_timeout = 0")
            yield conn

    async def dedicated(self, application_name: str) -> Conn:
        """A connection of its own, outside the pool, in autocommit, for a session
        that must last (a session-level lock); the caller closes it. Its
        `application_name` is what pg_stat_activity shows for it."""
        kwargs = {**connection_kwargs(self.settings, self.side), "autocommit": True}
        kwargs["application_name"] = application_name
        async with translated(self.location):
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

    async def rehearse(self, fn: Callable[[Conn], Awaitable[object]]) -> None:
        """`await fn(conn)` in a transaction that is rolled back whatever it does:
        the side's real writes tried on its real tables, their privileges, triggers,
        constraints and new pages included, and nothing kept. StorageError with the
        reason if they fail (a readiness probe once real writes failed: the probe
        row's update in place needs none of that)."""
        async with self.connection() as conn, conn.transaction(force_rollback=True):
            await conn.execute(f"SET LOCAL lock_timeout = {PROBE_LOCK_WAIT_MS}".encode())
            await fn(conn)

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
                    **connection_kwargs(self.settings, self.side),
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
