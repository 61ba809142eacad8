"""How a database file is opened: the connection's flags, its pragmas, its schema.

Every connection the package opens is opened here, so the promises the rest relies
on (no implicit transactions, WAL, commits synced, a bounded wait for the lock) are
made in one place.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import aiosqlite

from plumbing.schema import Schema
from plumbing.storage import StorageError

from .aiosqlite_internals import join_worker
from .migrations import migrate

BUSY_TIMEOUT_MS = 5_000
THREAD_JOIN_TIMEOUT_S = 5.0

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


async def connect(path: str | Path) -> aiosqlite.Connection:
    """An aiosqlite connection to the file at `path`, its worker thread started;
    StorageError if SQLite cannot open it."""
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


def prepare(conn: sqlite3.Connection, schema: Schema) -> None:
    """Set the pragmas, add our functions and bring the schema up to date (on the
    database thread)."""
    for pragma in PRAGMAS:
        conn.execute(pragma)
    conn.create_function("sha256_hex", 1, sha256_hex, deterministic=True)
    migrate(conn, schema)


def sha256_hex(text: str | None) -> str | None:
    """SQL `sha256_hex(text)`: SHA-256 of the text's UTF-8 form, in hex (PostgreSQL's
    `encode(sha256(convert_to(text, 'UTF8')), 'hex')`); NULL for NULL."""
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()
