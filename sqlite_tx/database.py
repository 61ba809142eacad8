"""The database handle of one file: Database, one connection and its worker thread.

aiosqlite hops to its worker thread for every awaited call, so a transaction written
as one await per statement pays for BEGIN, each statement and COMMIT separately.
Here a whole transaction is a plain function that runs on that thread in one go
(`run`), or on the event loop's thread when that is quicker and safe (`run_inline`);
the connection's busy timeout follows the thread it runs on. The writability probe
is here too: it needs the connection and the file it was opened on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import aiosqlite

from plumbing.group_commit import Deadline
from plumbing.schema import Schema
from plumbing.storage import StorageError, deadline_passed

from .aiosqlite_internals import (
    AiosqliteChanged,
    check_internals,
    join_worker,
    raw_connection,
    run_on_worker,
)
from .connect import BUSY_TIMEOUT_MS, THREAD_JOIN_TIMEOUT_S, connect, prepare
from .transactions import is_busy, transaction

T = TypeVar("T")

log = logging.getLogger(__name__)

# The writability probe: one row of the side's probe table (Schema.probe_table),
# updated in place by a committed transaction.
PROBE_WRITE = "UPDATE {table} SET at = ? WHERE id = 1"
# How long a call may take, counted from when it is asked: the busy timeout a
# statement waits for the write lock, and a second more. Calls run one at a time on
# the database thread, so one queued behind a call that waits for the lock would wait
# for both; it gives up at this deadline instead, on its caller's behalf (the call
# still runs, and what it commits stays committed: a retry finds it).
CALL_DEADLINE_S = BUSY_TIMEOUT_MS / 1000 + 1.0


class Database:
    """One SQLite connection, owned by aiosqlite's worker thread."""

    def __init__(self, connection: aiosqlite.Connection, path: str) -> None:
        self._connection = connection
        self.path = path
        # Calls handed to the worker thread, and calls it has finished: each counter is
        # written by one thread only. A cancelled await does not stop the worker, so
        # only the worker can say when the connection is free again.
        self._submitted = 0
        self._finished = 0
        self._closing = False  # set by close(): no call may start after it
        # The busy timeout the connection has now: 0 while used inline (never wait on
        # the loop), BUSY_TIMEOUT_MS on the worker thread. Switched only when the side
        # changes, so back-to-back calls on one side run no PRAGMA at all.
        self._busy_timeout_ms = BUSY_TIMEOUT_MS
        self._file = _identity(self.path)  # the file opened, to tell if it goes away
        self._probing: asyncio.Future[None] | None = None  # the probe in progress
        self._probe_write = ""  # set by open

    @classmethod
    async def open(cls, path: str | Path, schema: Schema) -> Database:
        """Open (or create) the file, set the pragmas and bring the schema up to date.

        Raises StorageError; its subclass AiosqliteChanged if the installed aiosqlite
        lacks the internals this module runs on (see aiosqlite_internals).
        """
        connection = await connect(path)
        try:
            await check_internals(connection)
        except AiosqliteChanged:
            # With its internals changed, aiosqlite's own close() may fail too; the
            # error worth reporting is the one that says what changed.
            with contextlib.suppress(Exception):
                await connection.close()
            raise
        except BaseException:  # cancelled: no worker thread may outlive this call
            await connection.close()
            await join_worker(connection, THREAD_JOIN_TIMEOUT_S)
            raise
        db = cls(connection, str(path))
        if db._file is not None and not _writable(db.path):
            # SQLite opened it read-only, and the connection stays so once the file is
            # fixed: said now, and by the probe (_probe) while it lasts.
            log.warning(
                "%s cannot be written: SQLite opened it read-only for as long as this"
                " process runs; restart it once the file can be written",
                db.path,
                extra={"db": db.path},
            )
        db._probe_write = PROBE_WRITE.format(table=schema.probe_table)
        try:
            await db.run(lambda conn: prepare(conn, schema), bounded=False)
        except BaseException:
            await connection.close()
            raise
        return db

    async def run(self, fn: Callable[[sqlite3.Connection], T], *, bounded: bool = True) -> T:
        """Run `fn(connection)` on the database thread and return its result;
        StorageError once close() has begun. `bounded`: StorageTimeout once
        CALL_DEADLINE_S has passed since the call was asked (`deadline`); not for the
        schema's migrations when the file is opened, which take what they take."""
        if self._closing:
            raise StorageError(f"{self.path}: the database is closed")
        self._submitted += 1
        # aiosqlite's private queue (see aiosqlite_internals): the only way to run a
        # whole transaction on its thread without a hop per statement.
        work = run_on_worker(self._connection, self._call, fn)
        if not bounded:
            try:
                return await work
            except sqlite3.Error as exc:
                raise StorageError(f"{self.path}: {exc}") from exc
        # The wait is given up at the deadline (asyncio.timeout: a timer, no task); the
        # worker still runs the call, and aiosqlite drops the outcome of an awaited
        # future that was cancelled.
        timeout = asyncio.timeout(CALL_DEADLINE_S)
        try:
            async with timeout:
                return await work
        except TimeoutError:
            if timeout.expired():
                raise deadline_passed(self.path, CALL_DEADLINE_S) from None
            raise
        except sqlite3.Error as exc:
            raise StorageError(f"{self.path}: {exc}") from exc

    @property
    def deadline(self) -> Deadline:
        """A call's deadline, and the error its caller gets when it passes."""
        return CALL_DEADLINE_S, functools.partial(deadline_passed, self.path, CALL_DEADLINE_S)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """On the worker thread."""
        try:
            conn = raw_connection(self._connection)
            self._set_busy_timeout(conn, BUSY_TIMEOUT_MS)
            return fn(conn)
        finally:
            self._finished += 1

    def _set_busy_timeout(self, conn: sqlite3.Connection, ms: int) -> None:
        if self._busy_timeout_ms != ms:
            conn.execute(f"PRAGMA busy_timeout = {ms}")
            self._busy_timeout_ms = ms

    async def run_inline(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run a transaction `fn(connection)` on the calling (event loop) thread.

        For writes whose callers cannot answer before their commit anyway: it saves
        the two thread hand-offs, which on a quick disk cost more than the commit
        (see InlineWrites, which also says when a write should not run here). The
        lock is never waited for here: `fn` must begin with BEGIN IMMEDIATE, and if
        another connection holds the write lock (or a call is still running on the
        worker thread) the whole call goes to the worker thread, which waits for the
        lock up to the busy timeout without stalling the loop. Once close() has
        begun, the call is refused there (StorageError) and never runs here.
        """
        if self._submitted == self._finished and not self._closing:
            conn = raw_connection(self._connection)
            try:
                self._set_busy_timeout(conn, 0)
                return fn(conn)
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise StorageError(f"{self.path}: {exc}") from exc
            except sqlite3.Error as exc:
                raise StorageError(f"{self.path}: {exc}") from exc
        return await self.run(fn)  # the worker sets the busy timeout back first

    async def check_writable(self) -> None:
        """Return if the database can take a write now; StorageError saying why not.

        Why this is enough: a write that is rolled back proves nothing (in WAL mode
        SQLite keeps the pages in memory and never touches the disk), so this commits
        one: the health row updated in place, on the worker thread like every write,
        with the same busy timeout and synchronous=FULL. The commit appends a frame
        to the WAL and syncs it, so a full disk (no block for the frame), a read-only
        or immutable WAL, a file system gone read-only or an I/O error fail it as they
        would fail an order; a write lock held elsewhere beyond the busy timeout fails
        it as "database is locked". What a commit cannot see is checked beside it:
        the main file made read-only or immutable (the WAL still takes commits until
        a checkpoint fails, and a new connection, `publisher accept` say, cannot write
        at all), and the file removed or replaced (the connection would go on writing
        to an unlinked inode, lost on close). One small fsync'ed commit: cheap enough
        to run every second.

        Callers while a probe is in progress share it: with the lock held elsewhere a
        probe takes the busy timeout, and a probe a second must not queue up on the
        database thread in front of real work.
        """
        if self._probing is None:
            self._probing = asyncio.ensure_future(self.run(self._probe))
            self._probing.add_done_callback(self._probed)
        await asyncio.shield(self._probing)

    async def rehearse(self, fn: Callable[[sqlite3.Connection], object]) -> None:
        """`fn(connection)` in a transaction rolled back whatever it does, on the worker
        thread: a side's real writes tried on its real tables (their triggers,
        constraints and indexes), nothing kept; StorageError if they fail. It says
        nothing of the disk, which a rolled back write never reaches: that is
        check_writable's, which readiness asks first."""
        await self.run(functools.partial(_rolled_back, fn))

    def _probed(self, probe: asyncio.Future[None]) -> None:
        self._probing = None
        if not probe.cancelled():
            probe.exception()  # retrieved: its callers may all have stopped waiting

    def _probe(self, conn: sqlite3.Connection) -> None:
        """On the worker thread. A write refused as read-only although the file can be
        written now says why: the connection was opened while it could not be."""
        self._check_file()
        try:
            with transaction(conn):
                if conn.execute(self._probe_write, (time.time(),)).rowcount != 1:
                    raise StorageError(f"{self.path}: the health row is missing")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_READONLY and _writable(self.path):
                raise StorageError(
                    f"{self.path} could not be written when this process opened it, so"
                    " SQLite opened it read-only for as long as it runs: restart once"
                    " it can be written"
                ) from exc
            raise

    def _check_file(self) -> None:
        if self._file is None:
            return  # not a file (an in-memory database)
        now = _identity(self.path)
        if now is None:
            raise StorageError(f"{self.path}: the database file is gone")
        if now != self._file:
            raise StorageError(f"{self.path}: the database file was replaced")
        for path in (self.path, f"{self.path}-wal"):
            if os.path.exists(path) and not _writable(path):
                raise StorageError(f"{path}: the file is read-only")

    async def close(self) -> None:
        """Close the connection and stop its thread. A call made once this has begun
        (a group commit may still be forming when its service stops) raises
        StorageError, and never runs inline while the worker closes the connection."""
        self._closing = True
        await self._connection.close()


def _rolled_back(fn: Callable[[sqlite3.Connection], object], conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        fn(conn)
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _writable(path: str) -> bool:
    """Whether this process may write the file at `path` (mode bits, an immutable file,
    a read-only file system), asked without opening it: closing a descriptor of a
    file drops every lock this process holds on it, SQLite's connections' included."""
    return os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)


def _identity(path: str) -> tuple[int, int] | None:
    """The device and inode of the file at `path`, None if there is none."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino
