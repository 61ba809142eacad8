"""SQLite for asyncio, one trip to the database thread per transaction.

aiosqlite hops to its worker thread for every awaited call, so a transaction written
as one await per statement pays for BEGIN, each statement and COMMIT separately.
Here a whole transaction is a plain function that runs on that thread in one go.
Both sides use this module; their SQL stays in their own storage modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Self, TypeVar

import aiosqlite

import plumbing.group_commit
from plumbing.storage import StorageError

from .aiosqlite_internals import (
    AiosqliteChanged,
    check_internals,
    join_worker,
    raw_connection,
    run_on_worker,
)

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5_000
THREAD_JOIN_TIMEOUT_S = 5.0
# A write run inline that takes longer than this (or finds the write lock held
# elsewhere) sends the writes of the next INLINE_BACKOFF_S seconds to the database
# thread (see InlineWrites).
INLINE_SLOW_S = 0.005
INLINE_BACKOFF_S = 1.0

# WAL lets readers work while one writer commits. synchronous=FULL syncs the WAL on
# every commit: an ACK the sink sends after COMMIT then survives a power loss, not
# only a crash of the process (NORMAL would only promise the latter; `unsynced` asks
# for it around the writes that may be lost that way).
PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = FULL",
    f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}",
    "PRAGMA foreign_keys = ON",
)


# The writability probe: one row, updated in place by a committed transaction. Each
# side's migrations create `health` with that row.
PROBE_WRITE = "UPDATE health SET at = ? WHERE id = 1"


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

    @classmethod
    async def open(cls, path: str | Path, migrations: Sequence[str]) -> Database:
        """Open (or create) the file, set the pragmas and bring the schema up to date.

        Raises StorageError; its subclass AiosqliteChanged if the installed aiosqlite
        lacks the internals this module runs on (see aiosqlite_internals).
        """
        connection = await _connect(path)
        try:
            await check_internals(connection)
        except AiosqliteChanged:
            # With its internals changed, aiosqlite's own close() may fail too; the
            # error worth reporting is the one that says what changed.
            with contextlib.suppress(Exception):
                await connection.close()
            raise
        db = cls(connection, str(path))
        try:
            await db.run(lambda conn: _prepare(conn, migrations))
        except BaseException:
            await connection.close()
            raise
        return db

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(connection)` on the database thread and return its result;
        StorageError once close() has begun."""
        if self._closing:
            raise StorageError(f"{self.path}: the database is closed")
        self._submitted += 1
        try:
            # aiosqlite's private queue (see aiosqlite_internals): the only way to run
            # a whole transaction on its thread without a hop per statement.
            result = await run_on_worker(self._connection, self._call, fn)
        except sqlite3.Error as exc:
            raise StorageError(f"{self.path}: {exc}") from exc
        return result

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
                if not _is_busy(exc):
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

    def _probed(self, probe: asyncio.Future[None]) -> None:
        self._probing = None
        if not probe.cancelled():
            probe.exception()  # retrieved: its callers may all have stopped waiting

    def _probe(self, conn: sqlite3.Connection) -> None:
        """On the worker thread."""
        self._check_file()
        with transaction(conn):
            if conn.execute(PROBE_WRITE, (time.time(),)).rowcount != 1:
                raise StorageError(f"{self.path}: the health row is missing")

    def _check_file(self) -> None:
        if self._file is None:
            return  # not a file (an in-memory database)
        now = _identity(self.path)
        if now is None:
            raise StorageError(f"{self.path}: the database file is gone")
        if now != self._file:
            raise StorageError(f"{self.path}: the database file was replaced")
        for path in (self.path, f"{self.path}-wal"):
            if os.path.exists(path) and not os.access(path, os.W_OK):
                raise StorageError(f"{path}: the file is read-only")

    async def close(self) -> None:
        """Close the connection and stop its thread. A call made once this has begun
        (a group commit may still be forming when its service stops) raises
        StorageError, and never runs inline while the worker closes the connection."""
        self._closing = True
        await self._connection.close()


class InlineWrites:
    """Whether a write may commit inline now (Database.run_inline), judged by how long
    the last ones took: `allowed`, and `timed(fn)` to run a write so that it counts.

    Inline, a commit saves the two hand-offs to the database thread, and on a quick
    disk they cost more than the commit: on the thread each statement gives the GIL
    up, and while the loop runs Python it waits to take it back. But an inline commit
    holds the loop for as long as it runs. One that takes longer than `slow_s` (a slow
    disk, a WAL checkpoint), or that finds the write lock held by another connection,
    sends the writes of the next `backoff_s` seconds to the database thread; the first
    write after that tries inline again. Only a run on the thread that wrapped it (the
    loop's) counts: where run_inline hands the write to the database thread instead,
    its time there includes waits for the GIL that held nobody up. The time kept is one
    float, written whole.
    """

    def __init__(
        self,
        slow_s: float = INLINE_SLOW_S,
        backoff_s: float = INLINE_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slow_s = slow_s
        self._backoff_s = backoff_s
        self._clock = clock
        self._thread_until = -math.inf

    @property
    def allowed(self) -> bool:
        """False while backing off after a slow write."""
        return self._clock() >= self._thread_until

    def timed(self, fn: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
        """`fn`, timed if it runs on this thread: if it took longer than slow_s (its
        failure included) or failed with SQLITE_BUSY, writes go to the database thread
        for backoff_s from its end. Called on the event loop's thread."""
        here = threading.get_ident()

        def run(conn: sqlite3.Connection) -> T:
            if threading.get_ident() != here:
                return fn(conn)
            started = self._clock()
            busy = False
            try:
                return fn(conn)
            except sqlite3.OperationalError as exc:
                busy = _is_busy(exc)
                raise
            finally:
                ended = self._clock()
                if busy or ended - started > self._slow_s:
                    self._thread_until = ended + self._backoff_s

        return run


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY or one of its extended codes (some errors the sqlite3 module raises
    itself carry no code at all)."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY


def _identity(path: str) -> tuple[int, int] | None:
    """The device and inode of the file at `path`, None if there is none."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


C_in = TypeVar("C_in")
R_out = TypeVar("R_out")
GroupFn = Callable[[sqlite3.Connection, list[C_in]], list[R_out | Exception]]


class GroupCommit(plumbing.group_commit.GroupCommit[C_in, R_out]):
    """Group commit on the database thread: calls submitted while a transaction runs
    wait, and are then run together in the next one, so they share one fsync.

    `commit(conn, calls)` runs on the database thread, makes one transaction of all
    the calls, and returns one outcome per call (see plumbing.group_commit).
    """

    def __init__(self, db: Database, commit: GroupFn[C_in, R_out]) -> None:
        async def run(calls: list[C_in]) -> list[R_out | Exception]:
            return await db.run(functools.partial(_group, commit, calls))

        super().__init__(run)


def _group(
    commit: GroupFn[C_in, R_out], calls: list[C_in], conn: sqlite3.Connection
) -> list[R_out | Exception]:
    return commit(conn, calls)


@contextmanager
def unsynced(conn: sqlite3.Connection) -> Iterator[None]:
    """The transactions inside commit without syncing the WAL (synchronous=NORMAL),
    then FULL again. Such a commit survives the end of the process, as any commit in
    WAL mode does (its frames are in the file before COMMIT returns), but a power
    loss or an OS crash may undo it, with every later commit that did not sync
    either: the WAL is replayed in order up to its last frame on disk, so the next
    synced commit makes every commit before it durable too. Only for writes whose
    loss costs no more than making them again. Outside WAL mode (a file system that
    refused it, an in-memory database) this changes nothing: with a rollback
    journal, NORMAL could corrupt the file in a power loss, not only lose the last
    commits. The level can only change between transactions: `transaction` never
    leaves one open, not even when its COMMIT fails."""
    (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
    if mode != "wal":
        yield
        return
    conn.execute("PRAGMA synchronous = NORMAL")
    try:
        yield
    finally:
        conn.execute("PRAGMA synchronous = FULL")


@contextmanager
def transaction(
    conn: sqlite3.Connection, *, immediate: bool = True
) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception, a failed COMMIT's too.

    IMMEDIATE takes the write lock up front, so a read-then-write transaction never
    fails halfway with SQLITE_BUSY when another connection wrote in between. Reads
    that only need one consistent view pass immediate=False and take no write lock.
    A COMMIT that fails (a deferred constraint, a busy or full disk) can leave the
    transaction open: it is rolled back then, so the connection never holds a
    transaction (and its locks) nobody will end.
    """
    conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


async def _connect(path: str | Path) -> aiosqlite.Connection:
    # isolation_level=None: the sqlite3 module opens no implicit transactions,
    # so a read holds no lock once it has fetched, and BEGIN is ours to say.
    # check_same_thread=False: run_inline uses the connection on the event loop's
    # thread, never while a call is running on the worker thread.
    connection = aiosqlite.connect(str(path), isolation_level=None, check_same_thread=False)
    # aiosqlite stops its worker thread after a failed or cancelled connect but does
    # not wait for it; unwaited, the thread may report to an event loop already
    # closed (a cancelled open is still opening the file on that thread).
    try:
        await connection
    except BaseException as exc:
        await join_worker(connection, THREAD_JOIN_TIMEOUT_S)
        if isinstance(exc, sqlite3.Error):
            raise StorageError(f"cannot open {path}: {exc}") from exc
        raise
    return connection


def _prepare(conn: sqlite3.Connection, migrations: Sequence[str]) -> None:
    for pragma in PRAGMAS:
        conn.execute(pragma)
    with transaction(conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > len(migrations):
            raise StorageError(
                f"schema version {version} is newer than this program knows ({len(migrations)})"
            )
        for number, script in enumerate(migrations[version:], start=version + 1):
            for statement in _statements(script):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number}")


def _statements(script: str) -> list[str]:
    # executescript() would COMMIT our transaction; split on ';' instead (no ';' in our DDL
    # except as terminators).
    return [part.strip() for part in script.split(";") if part.strip()]


class SqliteFile:
    """What every SQLite backend is on top of its interface: one file, opened with its
    migrations, and closed. `connect` is what a backend's factory awaits."""

    MIGRATIONS: ClassVar[Sequence[str]] = ()

    def __init__(self, db: Database) -> None:
        self._db = db

    @classmethod
    async def connect(cls, path: str | Path) -> Self:
        """Open (or create) the file and bring its schema up to date."""
        return cls(await Database.open(path, cls.MIGRATIONS))

    @property
    def location(self) -> str:
        return self._db.path

    @property
    def path(self) -> str:
        return self._db.path

    async def check_writable(self) -> None:
        """Return if the database can take a write now, else StorageError (see
        Database.check_writable)."""
        await self._db.check_writable()

    async def close(self) -> None:
        await self._db.close()


__all__ = [
    "BUSY_TIMEOUT_MS",
    "PROBE_WRITE",
    "AiosqliteChanged",
    "Database",
    "InlineWrites",
    "SqliteFile",
    "StorageError",
    "transaction",
    "unsynced",
]
