"""The aiosqlite internals sqlite_tx relies on, checked on real connections of this process.

A different aiosqlite release cannot be installed in a test, so a changed release is
simulated by deleting or replacing one private name on a real, opened connection (or
on its class, for a property), and undone before the connection is closed.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from plumbing.schema import history
from sqlite_tx import AiosqliteChanged, Database, StorageError
from sqlite_tx.aiosqlite_internals import (
    SUPPORTED,
    check_internals,
    join_worker,
    raw_connection,
    run_on_worker,
)

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"
SCHEMA = history(
    "items", ("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)",)
)
JOIN_TIMEOUT_S = 5.0
SHORT_JOIN_S = 0.2

Change = Callable[[pytest.MonkeyPatch, aiosqlite.Connection], None]


@pytest.fixture
async def connection(tmp_path: Path) -> AsyncIterator[aiosqlite.Connection]:
    # As sqlite_tx opens it: the raw connection is also used on the loop's thread.
    conn = await aiosqlite.connect(
        tmp_path / "store.db", isolation_level=None, check_same_thread=False
    )
    try:
        yield conn
    finally:
        await conn.close()


def assert_clear(error: AiosqliteChanged, what: str) -> None:
    """The message names the release found, what changed and what to do."""
    message = str(error)
    assert f"aiosqlite {aiosqlite.__version__} " in message
    assert what in message
    assert f"Install {SUPPORTED} (the pin in pyproject.toml)" in message
    assert "update sqlite_tx/aiosqlite_internals.py" in message


# ---------------------------------------------------------------- the installed release


async def test_the_installed_aiosqlite_passes_the_check(
    connection: aiosqlite.Connection,
) -> None:
    await check_internals(connection)


def test_the_installed_aiosqlite_is_in_the_supported_range() -> None:
    version = tuple(int(part) for part in aiosqlite.__version__.split(".")[:2])
    low, high = (tuple(map(int, v.split("."))) for v in re.findall(r"\d+\.\d+", SUPPORTED))
    assert low <= version < high


def test_the_pin_in_pyproject_is_the_supported_range() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    assert [d for d in dependencies if d.startswith("aiosqlite")] == [SUPPORTED]


async def test_run_on_worker_runs_the_function_on_the_worker_thread(
    connection: aiosqlite.Connection,
) -> None:
    def where(conn: sqlite3.Connection) -> tuple[int, int]:
        return threading.get_ident(), conn.execute("SELECT 40 + 2").fetchone()[0]

    ident, answer = await run_on_worker(connection, where, raw_connection(connection))

    assert answer == 42
    assert ident != threading.get_ident()


async def test_raw_connection_is_the_one_aiosqlite_itself_uses(
    connection: aiosqlite.Connection,
) -> None:
    raw_connection(connection).execute("PRAGMA user_version = 7")
    async with connection.execute("PRAGMA user_version") as cursor:
        assert await cursor.fetchone() == (7,)


async def test_join_worker_waits_for_a_live_worker_thread(
    connection: aiosqlite.Connection,
) -> None:
    started = time.monotonic()
    await join_worker(connection, SHORT_JOIN_S)
    assert time.monotonic() - started >= SHORT_JOIN_S


async def test_join_worker_returns_once_the_thread_of_a_failed_connect_ends(
    tmp_path: Path,
) -> None:
    connection = aiosqlite.connect(tmp_path / "missing" / "store.db")
    with pytest.raises(sqlite3.OperationalError):
        await connection
    started = time.monotonic()
    await join_worker(connection, JOIN_TIMEOUT_S)
    assert time.monotonic() - started < JOIN_TIMEOUT_S / 2


# ---------------------------------------------------------------- a changed release


async def _plain_execute(self: aiosqlite.Connection, fn: Any, *args: Any) -> Any:
    return fn(*args)  # on the loop's thread, not the worker's


async def _execute_without_args(self: aiosqlite.Connection, fn: Any) -> Any:
    return await ORIGINAL_EXECUTE(self, fn)


ORIGINAL_EXECUTE = aiosqlite.Connection._execute

CHANGES: dict[str, tuple[Change, str]] = {
    "_execute removed": (
        lambda mp, conn: mp.delattr(aiosqlite.Connection, "_execute"),
        "Connection._execute is missing, expected a coroutine function",
    ),
    "_execute made a plain function": (
        lambda mp, conn: mp.setattr(conn, "_execute", lambda fn, *args: fn(*args)),
        "Connection._execute is of type function, expected a coroutine function",
    ),
    "_execute without *args": (
        lambda mp, conn: mp.setattr(aiosqlite.Connection, "_execute", _execute_without_args),
        "Connection._execute no longer takes (fn, *args)",
    ),
    "_execute off the worker thread": (
        lambda mp, conn: mp.setattr(aiosqlite.Connection, "_execute", _plain_execute),
        "Connection._execute(fn) does not run fn on Connection._thread",
    ),
    "_conn removed": (
        lambda mp, conn: mp.delattr(aiosqlite.Connection, "_conn"),
        "Connection._conn is missing, expected a sqlite3.Connection",
    ),
    "_conn a wrapper": (
        lambda mp, conn: mp.setattr(aiosqlite.Connection, "_conn", property(lambda s: object())),
        "Connection._conn is of type object, expected a sqlite3.Connection",
    ),
    "_conn raising": (
        lambda mp, conn: mp.setattr(aiosqlite.Connection, "_conn", property(lambda s: 1 / 0)),
        "reading Connection._conn failed: ZeroDivisionError",
    ),
    "_thread removed": (
        lambda mp, conn: mp.delattr(conn, "_thread"),
        "Connection._thread is missing, expected a threading.Thread",
    ),
    "_thread not a Thread": (
        lambda mp, conn: mp.setattr(conn, "_thread", object()),
        "Connection._thread is of type object, expected a threading.Thread",
    ),
}


@pytest.mark.parametrize("change", CHANGES.keys())
async def test_a_changed_internal_fails_the_check_with_a_clear_message(
    connection: aiosqlite.Connection, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    simulate, what = CHANGES[change]
    with monkeypatch.context() as mp:
        simulate(mp, connection)
        with pytest.raises(AiosqliteChanged) as excinfo:
            await check_internals(connection)
    assert_clear(excinfo.value, what)


async def test_join_worker_reports_a_changed_thread_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection = aiosqlite.connect(tmp_path / "missing" / "store.db")
    with pytest.raises(sqlite3.OperationalError):
        await connection
    with monkeypatch.context() as mp:
        mp.delattr(connection, "_thread")
        with pytest.raises(AiosqliteChanged) as excinfo:
            await join_worker(connection, JOIN_TIMEOUT_S)
    await join_worker(connection, JOIN_TIMEOUT_S)
    assert_clear(excinfo.value, "Connection._thread is missing")


async def test_database_open_reports_a_changed_internal_as_one_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = set(threading.enumerate())
    with monkeypatch.context() as mp:
        mp.setattr(aiosqlite.Connection, "_execute", _execute_without_args)
        with pytest.raises(StorageError) as excinfo:
            await Database.open(tmp_path / "store.db", SCHEMA)

    assert type(excinfo.value) is AiosqliteChanged
    assert_clear(excinfo.value, "Connection._execute no longer takes (fn, *args)")
    # The connection it opened is closed again: its worker thread ends.
    for thread in set(threading.enumerate()) - before:
        thread.join(JOIN_TIMEOUT_S)
        assert not thread.is_alive()
