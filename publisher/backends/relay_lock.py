"""One relay per SQLite outbox: an exclusive `flock` on a file beside the database.

The kernel drops a `flock` when the last descriptor of it closes, which happens when
the process ends in any way (SIGKILL included), so a relay that died never blocks
the next one and there is no stale lock to clean up. The file itself is left in
place: removing it would let a process that opened the old file and one that
creates a new one both "hold" a lock. The holder writes who it is into the file, so
a refused relay can name it. The descriptor is not inherited by child processes.

`flock` is advisory and local: it holds between processes on one host, and not on
network file systems that do not pass it on (SQLite's own locking has the same
limit there).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Final

from plumbing.cli import utc_text
from plumbing.storage import StorageError
from publisher.errors import RelayAlreadyRunning

SUFFIX: Final = ".relay-lock"
HOLDER_BYTES: Final = 4096  # a holder's record is far smaller; read no more than this


def lock_path(db_path: str) -> str:
    return db_path + SUFFIX


@contextlib.asynccontextmanager
async def relay_lock(db_path: str, owner: str) -> AsyncIterator[None]:
    """Hold the relay lock of the outbox at `db_path` until the block ends.

    RelayAlreadyRunning (naming the holder) if another holds it; StorageError if the
    lock file cannot be opened. Takes no time to decide: it never waits.
    """
    path = lock_path(db_path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StorageError(f"cannot open the relay lock {path}: {exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RelayAlreadyRunning(db_path, _holder(fd)) from None
        _write_holder(fd, owner)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released on purpose: nobody to name any more
    finally:
        os.close(fd)  # drops the lock


def _write_holder(fd: int, owner: str) -> None:
    since = utc_text(time.time(), "seconds")
    record = {"pid": os.getpid(), "host": socket.gethostname(), "owner": owner, "since": since}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)


def _holder(fd: int) -> str:
    """Who holds the lock, as its record says."""
    raw = os.pread(fd, HOLDER_BYTES, 0)
    try:
        record = json.loads(raw)
        return (
            f"{record['owner']}, process {record['pid']} on host {record['host']}"
            f" since {record['since']}"
        )
    except (ValueError, TypeError, KeyError):
        # Locked a moment ago, its record not written yet (or not ours to read).
        return "a process that has not said who it is yet"
