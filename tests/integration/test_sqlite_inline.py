"""Database.run_inline, and the sink that commits on the event loop's thread.

Real SQLite files; the write lock is held, and every outcome read, through independent
sqlite3 connections; the sink is served by create_app on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from support import eventually, placed, try_write_lock

from shared import Receipt
from sink.backends.sqlite import SqliteInbox
from sink.store import Incoming
from sqlite_tx import BUSY_TIMEOUT_MS, Database, StorageError, transaction

if TYPE_CHECKING:
    from conftest import Query, ServeSink

EVENT: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}
WAIT_S = 2.0
PENDING_S = 0.3  # long enough for a call that is not waiting for the lock to finish
TICK_S = 0.01
MAX_STALL_S = 0.25  # far below the 5 s a lock wait on the loop's thread would take


class Boom(Exception):
    pass


@dataclass
class Writer:
    """A transaction that inserts one row; notes the thread of every call."""

    name: str
    threads: list[int] = field(default_factory=list)

    def __call__(self, conn: sqlite3.Connection) -> int:
        self.threads.append(threading.get_ident())
        with transaction(conn):
            rowid = conn.execute("INSERT INTO items (name) VALUES (?)", (self.name,)).lastrowid
        assert rowid is not None
        return rowid


@dataclass
class Ticker:
    """A 10 ms sleep loop: how often the event loop came back to it, and its longest gap."""

    ticks: int = 0
    longest_gap_s: float = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(TICK_S)
            now = loop.time()
            self.longest_gap_s = max(self.longest_gap_s, now - last)
            self.ticks += 1
            last = now


@contextlib.asynccontextmanager
async def ticking() -> AsyncIterator[Ticker]:
    ticker = Ticker()
    task = asyncio.create_task(ticker.run())
    try:
        yield ticker
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.contextmanager
def write_lock(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the write lock; ROLLBACK on it releases the lock."""
    conn = sqlite3.connect(path, timeout=WAIT_S, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()


async def busy_timeout_ms(db: Database) -> int:
    value: int = await db.run(lambda conn: conn.execute("PRAGMA busy_timeout").fetchone()[0])
    return value


async def cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def names(db_rows: Query, path: Path) -> list[str]:
    return [r[0] for r in db_rows(path, "SELECT name FROM items ORDER BY id")]


# ---------------------------------------------------------------- run_inline, no contention


async def test_run_inline_commits_on_the_loop_thread_and_restores_the_busy_timeout(
    items_db: Database, items_path: Path, db_rows: Query
) -> None:
    writer = Writer("a")

    rowid = await items_db.run_inline(writer)

    assert writer.threads == [threading.get_ident()]
    assert db_rows(items_path, "SELECT id, name FROM items") == [(rowid, "a")]
    assert await busy_timeout_ms(items_db) == BUSY_TIMEOUT_MS == 5_000
    try_write_lock(items_path)


async def test_an_exception_from_fn_propagates_unchanged_and_writes_nothing(
    items_db: Database, items_path: Path, db_rows: Query
) -> None:
    error = Boom("after the write")
    threads: list[int] = []

    def write_then_fail(conn: sqlite3.Connection) -> None:
        threads.append(threading.get_ident())
        with transaction(conn):
            conn.execute("INSERT INTO items (name) VALUES ('lost')")
            raise error

    with pytest.raises(Boom) as excinfo:
        await items_db.run_inline(write_then_fail)

    assert excinfo.value is error
    assert threads == [threading.get_ident()]
    assert names(db_rows, items_path) == []
    assert await busy_timeout_ms(items_db) == BUSY_TIMEOUT_MS
    try_write_lock(items_path)
    await items_db.run_inline(Writer("after"))
    assert names(db_rows, items_path) == ["after"]


@pytest.mark.parametrize(
    ("statement", "cause"),
    [
        ("INSERT INTO no_such_table (x) VALUES (1)", sqlite3.OperationalError),
        ("INSERT INTO items (name) VALUES ('known')", sqlite3.IntegrityError),
    ],
    ids=["missing-table", "unique-violation"],
)
async def test_a_sqlite_error_other_than_busy_is_a_storage_error_raised_inline(
    items_db: Database, items_path: Path, db_rows: Query, statement: str, cause: type[sqlite3.Error]
) -> None:
    await items_db.run_inline(Writer("known"))
    threads: list[int] = []

    def write_then_fail(conn: sqlite3.Connection) -> None:
        threads.append(threading.get_ident())
        with transaction(conn):
            conn.execute("INSERT INTO items (name) VALUES ('lost')")
            conn.execute(statement)

    with pytest.raises(StorageError) as excinfo:
        await items_db.run_inline(write_then_fail)

    assert type(excinfo.value.__cause__) is cause
    assert str(items_path) in str(excinfo.value)
    # Raised where it ran, on the loop's thread: not retried on the worker thread.
    assert threads == [threading.get_ident()]
    assert names(db_rows, items_path) == ["known"]
    assert await busy_timeout_ms(items_db) == BUSY_TIMEOUT_MS
    try_write_lock(items_path)


# ---------------------------------------------------------------- run_inline under contention


async def test_a_held_write_lock_sends_the_call_to_the_worker_thread_without_stalling_the_loop(
    items_db: Database, items_path: Path, db_rows: Query
) -> None:
    writer = Writer("waited")
    with write_lock(items_path) as lock:
        async with ticking() as ticker:
            call = asyncio.create_task(items_db.run_inline(writer))
            try:
                await asyncio.sleep(PENDING_S)
                assert not call.done(), "run_inline finished while the lock was held"
                assert names(db_rows, items_path) == []
                lock.execute("ROLLBACK")
                rowid = await asyncio.wait_for(call, WAIT_S)
            finally:
                await cancel(call)
        assert ticker.longest_gap_s < MAX_STALL_S
        assert ticker.ticks >= PENDING_S / TICK_S / 3

    loop_thread = threading.get_ident()
    # Tried once inline (BEGIN IMMEDIATE was refused at once), then run on the worker.
    assert len(writer.threads) == 2
    assert writer.threads[0] == loop_thread != writer.threads[1]
    assert db_rows(items_path, "SELECT id, name FROM items") == [(rowid, "waited")]
    assert await busy_timeout_ms(items_db) == BUSY_TIMEOUT_MS


async def test_calls_made_while_the_lock_is_held_all_commit_in_order_once_it_is_released(
    items_db: Database, items_path: Path, db_rows: Query
) -> None:
    writers = [Writer(f"w{n}") for n in range(5)]
    with write_lock(items_path) as lock:
        calls = [asyncio.create_task(items_db.run_inline(w)) for w in writers]
        try:
            await asyncio.sleep(PENDING_S)
            assert not any(call.done() for call in calls)
            lock.execute("ROLLBACK")
            async with asyncio.timeout(WAIT_S):
                rowids = await asyncio.gather(*calls)
        finally:
            for call in calls:
                await cancel(call)

    assert db_rows(items_path, "SELECT id, name FROM items ORDER BY id") == [
        (rowid, w.name) for rowid, w in zip(rowids, writers, strict=True)
    ]
    # Once the first call is on the worker thread, the others queue behind it there.
    loop_thread = threading.get_ident()
    assert all(loop_thread not in w.threads for w in writers[1:])
    assert await busy_timeout_ms(items_db) == BUSY_TIMEOUT_MS


def held_open(
    started: threading.Event, release: threading.Event
) -> Callable[[sqlite3.Connection], None]:
    """A transaction that writes 'slow', says so, and stays open until released."""

    def slow(conn: sqlite3.Connection) -> None:
        with transaction(conn):
            conn.execute("INSERT INTO items (name) VALUES ('slow')")
            started.set()
            release.wait(WAIT_S)

    return slow


async def test_a_call_running_on_the_worker_thread_keeps_run_inline_off_the_connection(
    items_db: Database, items_path: Path, db_rows: Query
) -> None:
    started, release = threading.Event(), threading.Event()
    slow = held_open(started, release)

    running = asyncio.create_task(items_db.run(slow))
    writer = Writer("quick")
    try:
        await eventually(started.is_set, WAIT_S)
        # Inline, its BEGIN would run inside the worker's open transaction and fail.
        call = asyncio.create_task(items_db.run_inline(writer))
        await asyncio.sleep(PENDING_S)
        assert not call.done(), "run_inline did not wait for the call on the worker thread"
    finally:
        release.set()
    await asyncio.wait_for(running, WAIT_S)
    await asyncio.wait_for(call, WAIT_S)

    assert names(db_rows, items_path) == ["slow", "quick"]
    assert len(writer.threads) == 1
    assert writer.threads[0] != threading.get_ident()
    assert await busy_timeout_ms(items_db) == BUSY_TIMEOUT_MS


async def test_a_cancelled_call_still_on_the_worker_thread_keeps_run_inline_off_the_connection(
    items_db: Database, items_path: Path, db_rows: Query
) -> None:
    started, release = threading.Event(), threading.Event()
    slow = held_open(started, release)

    running = asyncio.create_task(items_db.run(slow))
    try:
        await eventually(started.is_set, WAIT_S)
        await cancel(running)
        call = asyncio.create_task(items_db.run_inline(Writer("quick")))
        await asyncio.sleep(0)
    finally:
        release.set()
        await items_db.run(lambda conn: None)  # the worker thread has finished `slow`
    await asyncio.wait_for(call, WAIT_S)

    assert names(db_rows, items_path) == ["slow", "quick"]


async def test_a_call_once_close_has_begun_is_refused_and_never_runs_inline(
    items_db: Database, items_path: Path, db_rows: Query
) -> None:
    """A group commit still forming when its service stops may be handed over after
    close began: it is refused with a StorageError and never touches the connection
    (inline, it raced the worker's close of the same sqlite3 connection, and the
    interpreter crashed when that was tried)."""
    closing = asyncio.create_task(items_db.close())
    await asyncio.sleep(0)  # close handed to the worker thread, not yet done
    inline, worker = Writer("inline"), Writer("worker")
    with pytest.raises(StorageError, match="the database is closed"):
        await asyncio.wait_for(items_db.run_inline(inline), WAIT_S)
    with pytest.raises(StorageError, match="the database is closed"):
        await asyncio.wait_for(items_db.run(worker), WAIT_S)
    await asyncio.wait_for(closing, WAIT_S)
    assert inline.threads == [] and worker.threads == []
    assert names(db_rows, items_path) == []


# ---------------------------------------------------------------- the sink


async def test_healthz_answers_while_a_post_waits_for_the_write_lock(
    serve_sink: ServeSink, sink_db: Path, client: aiohttp.ClientSession, db_rows: Query
) -> None:
    base = await serve_sink(sink_db)
    with write_lock(sink_db) as lock:
        async with ticking() as ticker:
            sending = asyncio.create_task(client.post(f"{base}/events", json=EVENT))
            try:
                await asyncio.sleep(PENDING_S)
                assert not sending.done(), "the sink replied while it could not commit"
                async with asyncio.timeout(1.0), client.get(f"{base}/healthz") as health:
                    assert health.status == 200
                    assert await health.json() == {"status": "ok"}
                assert not sending.done()
                assert db_rows(sink_db, "SELECT id FROM inbox_events") == []
                lock.execute("ROLLBACK")
                async with await asyncio.wait_for(sending, WAIT_S) as response:
                    status, ack = response.status, await response.json()
            finally:
                await cancel(sending)
        assert ticker.longest_gap_s < MAX_STALL_S

    assert status == 200
    assert (ack["ack"], ack["status"]) == ("order-1", "applied")
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]


async def test_a_batch_that_waited_for_the_write_lock_applies_every_event(
    inbox: SqliteInbox, sink_db: Path, db_rows: Query
) -> None:
    orders = [placed("e0", qty=1), placed("e1", "juice", 2), placed("e2", qty=4)]
    events = [Incoming.checked(one) for one in orders]
    with write_lock(sink_db) as lock:
        call = asyncio.create_task(inbox.receive_batch(events))
        try:
            await asyncio.sleep(PENDING_S)
            assert not call.done()
            lock.execute("ROLLBACK")
            receipt = await asyncio.wait_for(call, WAIT_S)
        finally:
            await cancel(call)

    assert [r.receipt for r in receipt.received] == [Receipt.APPLIED] * 3
    assert receipt.stopped is None
    assert db_rows(sink_db, "SELECT id FROM inbox_events ORDER BY rowid") == [
        ("e0",),
        ("e1",),
        ("e2",),
    ]
    assert dict(db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory")) == {
        "snack": 5,
        "juice": 2,
    }
