"""Transactions on a plain sqlite3 connection, run on whichever thread holds it.

The functions a backend runs on the database thread (or inline) open and end their
transactions with these: `transaction` never leaves one open, `unsynced` relaxes the
WAL's sync between transactions, and `is_busy` tells the write lock held elsewhere
from other errors.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


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


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY or one of its extended codes (some errors the sqlite3 module raises
    itself carry no code at all)."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
