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
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aiosqlite

A = TypeVar("A")
T = TypeVar("T")


def run_on_worker(
    connection: aiosqlite.Connection, fn: Callable[[A], T], arg: A
) -> Coroutine[Any, Any, T]:
    """`fn(arg)` run on the connection's worker thread, to be awaited.

    Returns aiosqlite's own coroutine, not a wrapper: the hot path gets no extra frame.
    """
    coroutine: Coroutine[Any, Any, T] = connection._execute(fn, arg)  # type: ignore[no-untyped-call]
    return coroutine


def raw_connection(connection: aiosqlite.Connection) -> sqlite3.Connection:
    """The sqlite3 connection of a connected `connection` (ValueError once closed)."""
    return connection._conn


async def join_worker(connection: aiosqlite.Connection, timeout_s: float) -> None:
    """Wait, off the loop's thread, up to `timeout_s` for the worker thread to end."""
    await asyncio.to_thread(connection._thread.join, timeout_s)
