"""Every use of aiosqlite's private names, in one place.

sqlite_tx needs three things aiosqlite has no public way to do, so it uses three of
its private names, here and nowhere else in the project:

- `Connection._execute(fn, *args)`, the queue of the worker thread: the only way to
  run a plain function there, so that a whole transaction is one hop, not one per
  statement (the public methods each queue one sqlite3 call);
- `Connection._conn`, the sqlite3 connection itself: the function run on the worker
  thread needs it, and so does `Database.run_inline` on the loop's thread;
- `Connection._thread`, the worker thread: after a failed connect aiosqlite stops it
  without waiting, and a public `close()` does nothing once the connect has failed.

`check_internals` checks a connected connection has them, in the shape relied on;
`Database.open` calls it on every connection it opens. If it fails, aiosqlite has
changed: install a release in `SUPPORTED`, or update this module for the new one.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import sqlite3
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

import aiosqlite

from plumbing.storage import StorageError

A = TypeVar("A")
T = TypeVar("T")

# The releases this module was written and tested against. The pin in pyproject.toml
# says the same (a test checks they agree). `_thread` is new in 0.22: before it the
# Connection was itself the Thread.
SUPPORTED: Final = "aiosqlite>=0.22,<0.23"


class AiosqliteChanged(StorageError):
    """The installed aiosqlite lacks the internals sqlite_tx relies on, or they changed."""


def run_on_worker(
    connection: aiosqlite.Connection, fn: Callable[[A], T], arg: A
) -> Coroutine[Any, Any, T]:
    """`fn(arg)` run on the connection's worker thread, to be awaited (`_execute`).

    Returns aiosqlite's own coroutine, not a wrapper: the hot path gets no extra frame.
    """
    coroutine: Coroutine[Any, Any, T] = connection._execute(fn, arg)  # type: ignore[no-untyped-call]
    return coroutine


def raw_connection(connection: aiosqlite.Connection) -> sqlite3.Connection:
    """The sqlite3 connection of a connected `connection` (`_conn`; ValueError once closed)."""
    return connection._conn


async def join_worker(connection: aiosqlite.Connection, timeout_s: float) -> None:
    """Wait, off the loop's thread, up to `timeout_s` for the worker thread (`_thread`) to end."""
    await asyncio.to_thread(_worker_thread(connection).join, timeout_s)


async def check_internals(connection: aiosqlite.Connection) -> None:
    """Raise AiosqliteChanged unless the connected `connection` has the private names
    used here, in the shape relied on. Costs one trip to the worker thread."""
    thread = _worker_thread(connection)
    execute = _checked_execute(connection)
    _checked_conn(connection)
    try:
        ident = await execute(threading.get_ident)
    except Exception as exc:
        raise _changed(f"Connection._execute(fn) failed: {exc!r}") from exc
    if ident != thread.ident or ident == threading.get_ident():
        raise _changed("Connection._execute(fn) does not run fn on Connection._thread")


def _changed(what: str) -> AiosqliteChanged:
    """The error for an aiosqlite whose internals differ: which release, what, and what to do."""
    return AiosqliteChanged(
        f"aiosqlite {_installed_version()} is not supported by sqlite_tx: {what}. "
        f"Install {SUPPORTED} (the pin in pyproject.toml), "
        "or update sqlite_tx/aiosqlite_internals.py for this release."
    )


def _worker_thread(connection: aiosqlite.Connection) -> threading.Thread:
    thread = getattr(connection, "_thread", None)
    if not isinstance(thread, threading.Thread):
        raise _changed(f"Connection._thread is {_shape(thread)}, expected a threading.Thread")
    return thread


def _checked_execute(connection: aiosqlite.Connection) -> Callable[..., Coroutine[Any, Any, Any]]:
    execute = getattr(connection, "_execute", None)
    if not inspect.iscoroutinefunction(execute):
        raise _changed(f"Connection._execute is {_shape(execute)}, expected a coroutine function")
    try:
        inspect.signature(execute).bind(len, ())
    except (TypeError, ValueError) as exc:
        raise _changed(f"Connection._execute no longer takes (fn, *args): {exc}") from exc
    return execute


def _checked_conn(connection: aiosqlite.Connection) -> None:
    try:
        conn = getattr(connection, "_conn", None)
    except Exception as exc:  # the property itself may raise
        raise _changed(f"reading Connection._conn failed: {exc!r}") from exc
    if not isinstance(conn, sqlite3.Connection):
        raise _changed(f"Connection._conn is {_shape(conn)}, expected a sqlite3.Connection")


def _shape(value: object) -> str:
    return "missing" if value is None else f"of type {type(value).__name__}"


def _installed_version() -> str:
    # The module imported, which may not be the distribution installed (PYTHONPATH).
    version = getattr(aiosqlite, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version("aiosqlite")
    except importlib.metadata.PackageNotFoundError:
        return "of unknown version"
