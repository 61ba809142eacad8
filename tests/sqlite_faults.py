"""Ways a SQLite file stops taking writes, made for real where this machine allows it.

Shared by the outbox and inbox backends of the behaviour suites and the readiness
tests: `unwritable`, and
`SqliteFileAccess`, what both SQLite backends are as a test reaches them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

Fault = Literal["read-only", "locked", "gone"]
FAULTS: list[Fault] = ["read-only", "locked", "gone"]
Row = tuple[Any, ...]
Write = Literal["INSERT", "UPDATE"]


class SqliteFileAccess:
    """A SQLite file in the test's temporary directory, reached with the sqlite3
    module: a fresh connection for every read or write, closed afterwards."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def location(self) -> str:
        return str(self.path)

    def query(self, sql: str, *params: object) -> list[Row]:
        conn = sqlite3.connect(self.path, timeout=5)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def execute(self, *statements: str) -> None:
        conn = sqlite3.connect(self.path, timeout=5, isolation_level=None)
        try:
            for statement in statements:
                conn.execute(statement)
        finally:
            conn.close()

    @contextlib.contextmanager
    def refusing(self, table: str, writes: tuple[Write, ...], message: str) -> Iterator[None]:
        """Triggers make every write of these kinds to `table` fail with `message`."""
        text = message.replace("'", "''")
        triggers = [f"refuse_{table}_{write.lower()}" for write in writes]
        self.execute(
            *(
                f"CREATE TRIGGER {trigger} BEFORE {write} ON {table}"
                f" BEGIN SELECT RAISE(ABORT, '{text}'); END"
                for trigger, write in zip(triggers, writes, strict=True)
            )
        )
        try:
            yield
        finally:
            self.execute(*(f"DROP TRIGGER {trigger}" for trigger in triggers))

    def unwritable(self, fault: Fault) -> contextlib.AbstractContextManager[None]:
        return unwritable(self.path, fault)

    def others_cannot_write(self) -> bool:
        return other_writer_fails(self.path)


@contextlib.contextmanager
def unwritable(path: Path, fault: Fault) -> Iterator[None]:
    """While inside, the database at `path` cannot take a write; left, it can again.

    read-only: `chattr +i` on the file for root (root writes through any mode bits),
    `chmod 0444` for anyone else; where neither holds (a file system without
    attributes), a trigger refusing the probe's write stands in. locked: another
    connection holds the write lock. gone: the files are moved away (and back)."""
    if fault == "read-only":
        with _read_only(path):
            yield
    elif fault == "locked":
        with _write_locked(path):
            yield
    else:
        with _moved_away(path):
            yield


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[None]:
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    chattr = shutil.which("chattr")
    if chattr is not None and subprocess.run([chattr, "+i", str(path)]).returncode == 0:
        try:
            yield
        finally:
            subprocess.run([chattr, "-i", str(path)], check=True)
        return
    with _refusing_health_writes(path):  # the stand-in
        yield


@contextlib.contextmanager
def _refusing_health_writes(path: Path) -> Iterator[None]:
    conn = sqlite3.connect(path, timeout=5, isolation_level=None)
    try:
        conn.execute(
            f"CREATE TRIGGER read_only BEFORE UPDATE ON {_probe_table(conn)}"
            " BEGIN SELECT RAISE(ABORT, 'attempt to write a readonly database'); END"
        )
        try:
            yield
        finally:
            conn.execute("DROP TRIGGER read_only")
    finally:
        conn.close()


@contextlib.contextmanager
def _write_locked(path: Path) -> Iterator[None]:
    conn = sqlite3.connect(path, timeout=5, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.close()


@contextlib.contextmanager
def _moved_away(path: Path) -> Iterator[None]:
    moved = []
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if name.exists():
            aside = name.with_name(name.name + ".aside")
            name.rename(aside)
            moved.append((aside, name))
    try:
        yield
    finally:
        for aside, name in moved:
            aside.rename(name)


def other_writer_fails(path: Path) -> bool:
    """Whether a write through a connection of our own fails now (without waiting)."""
    if not path.exists():
        return True
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute(f"UPDATE {_probe_table(conn)} SET at = at WHERE id = 1")
    except sqlite3.Error:
        return True
    finally:
        conn.close()
    return False


def _probe_table(conn: sqlite3.Connection) -> str:
    """The file's writability probe table: the outbox's or the inbox's."""
    row = conn.execute(
        "SELECT name FROM sqlite_master WHERE name IN ('outbox_health', 'inbox_health')"
    ).fetchone()
    assert row is not None, "neither side's probe table is in the file"
    return str(row[0])
