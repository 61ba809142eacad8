"""dispatch against a real SQLite outbox, checked through independent sqlite3 connections.

The send callbacks here are plain functions: what is under test is the order, the
marks and the locks, not HTTP.
"""

from __future__ import annotations

import asyncio
import sqlite3
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support import as_event, entry_payload, event, query, sent_flags, sent_ids

from publisher import MAX_BATCH, NotAcknowledged, Outbox, dispatch
from shared import Event, canonical_json

WAIT_S = 5.0


def unsent_ids(db: Path) -> list[str]:
    return [r[0] for r in query(db, "SELECT id FROM outbox_entries WHERE sent = 0 ORDER BY seq")]


def is_sent(db: Path, event_id: str) -> int:
    flag: int = query(db, "SELECT sent FROM outbox_entries WHERE id = ?", (event_id,))[0][0]
    return flag


def write_with_no_wait(db: Path, event_id: str) -> None:
    """Take the write lock from an independent connection without waiting, insert, commit.

    Raises sqlite3.OperationalError ("database is locked") if anyone holds the lock.
    """
    conn = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO outbox_orders (id, sku, qty, accepted_at) VALUES (?, 'side', 1, 0)",
            (event_id,),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


order = partial(event, qty=7)  # the orders of these tests: qty 7 unless said


def recorded(event_id: str, sku: str = "snack", qty: int = 7) -> Event:
    """The order.placed event `order(event_id, sku, qty)` is recorded as: what dispatch
    hands to the send callback."""
    return as_event(order(event_id, sku, qty=qty))


async def ack(event: Event) -> bool:
    return True


async def accept_all(outbox: Outbox, *ids: str) -> None:
    for event_id in ids:
        assert await outbox.accept(order(event_id)) == "accepted"


class Recorder:
    """A send callback that ACKs and remembers what it was given."""

    def __init__(self) -> None:
        self.received: list[Event] = []

    async def __call__(self, event: Event) -> bool:
        self.received.append(event)
        return True

    @property
    def ids(self) -> list[str]:
        return [e["id"] for e in self.received]


class WatchedStore:
    """The real Outbox, with a record of what pending() returned and what was marked."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.batches: list[list[Event]] = []
        self.marked: list[str] = []

    async def pending(self, limit: int = MAX_BATCH) -> list[Event]:
        batch = await self.outbox.pending(limit)
        self.batches.append(batch)
        return batch

    async def mark_sent(self, event_id: str) -> None:
        self.marked.append(event_id)
        await self.outbox.mark_sent(event_id)


# ---------------------------------------------------------------- the happy path


async def test_dispatch_sends_in_order_and_marks_each(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "z", "a", "m")
    send = Recorder()
    assert await dispatch(outbox, send) == ["z", "a", "m"]
    assert send.ids == ["z", "a", "m"]
    assert sent_flags(db) == {"z": 1, "a": 1, "m": 1}


async def test_dispatch_sends_the_stored_events(outbox: Outbox) -> None:
    await outbox.accept(order("a", "snack", qty=7))
    await outbox.accept(order("b", "tea", qty=2))
    send = Recorder()
    await dispatch(outbox, send)
    assert send.received == [recorded("a", "snack", qty=7), recorded("b", "tea", qty=2)]


async def test_dispatch_of_an_empty_outbox_returns_nothing(outbox: Outbox) -> None:
    send = Recorder()
    assert await dispatch(outbox, send) == []
    assert send.received == []


async def test_dispatch_skips_entries_already_sent(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a", "b", "c")
    await outbox.mark_sent("b")
    send = Recorder()
    assert await dispatch(outbox, send) == ["a", "c"]
    assert send.ids == ["a", "c"]
    assert unsent_ids(db) == []


async def test_a_second_dispatch_sends_nothing_again(outbox: Outbox) -> None:
    await accept_all(outbox, "a", "b")
    assert await dispatch(outbox, ack) == ["a", "b"]
    send = Recorder()
    assert await dispatch(outbox, send) == []
    assert send.received == []


async def test_dispatch_limit_bounds_one_batch(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a", "b", "c", "d")
    assert await dispatch(outbox, ack, limit=3) == ["a", "b", "c"]
    assert unsent_ids(db) == ["d"]
    assert await dispatch(outbox, ack, limit=3) == ["d"]


async def test_dispatch_sends_at_most_max_batch(outbox: Outbox, db: Path) -> None:
    ids = [f"e{n:02d}" for n in range(MAX_BATCH + 2)]
    await accept_all(outbox, *ids)
    assert await dispatch(outbox, ack) == ids[:MAX_BATCH]
    assert unsent_ids(db) == ids[MAX_BATCH:]


@pytest.mark.parametrize("limit", [0, 17, -1, True, 1.0, "16", None])
async def test_dispatch_refuses_a_bad_limit_before_sending(
    outbox: Outbox, db: Path, limit: Any
) -> None:
    await accept_all(outbox, "a")
    send = Recorder()
    with pytest.raises(ValueError):
        await dispatch(outbox, send, limit=limit)
    assert send.received == []
    assert unsent_ids(db) == ["a"]


# ---------------------------------------------------------------- stop on the first failure


async def test_failure_propagates_the_same_exception_and_stops(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a", "b", "c")
    error = ConnectionResetError("sink went away")
    attempted: list[str] = []

    async def send(event: Event) -> bool:
        attempted.append(event["id"])
        if event["id"] == "b":
            raise error
        return True

    with pytest.raises(ConnectionResetError) as excinfo:
        await dispatch(outbox, send)

    assert excinfo.value is error
    assert attempted == ["a", "b"]
    assert sent_flags(db) == {"a": 1, "b": 0, "c": 0}


async def test_the_next_dispatch_resumes_at_the_failed_entry(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a", "b", "c")

    async def fail_on_b(event: Event) -> bool:
        if event["id"] == "b":
            raise RuntimeError("b failed")
        return True

    with pytest.raises(RuntimeError):
        await dispatch(outbox, fail_on_b)

    send = Recorder()
    assert await dispatch(outbox, send) == ["b", "c"]
    assert send.ids == ["b", "c"]
    assert sent_flags(db) == {"a": 1, "b": 1, "c": 1}


async def test_failure_on_the_first_entry_marks_nothing(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a", "b")
    error = TimeoutError("no reply")

    async def send(event: Event) -> bool:
        raise error

    with pytest.raises(TimeoutError) as excinfo:
        await dispatch(outbox, send)
    assert excinfo.value is error
    assert sent_ids(db) == []


@pytest.mark.parametrize("result", [1, "true", {"ack": "b"}, None, False, 0, [True], "True"])
async def test_only_a_strict_true_counts_as_an_ack(
    outbox: Outbox, db: Path, result: object
) -> None:
    await accept_all(outbox, "a", "b", "c")
    attempted: list[str] = []

    async def send(event: Event) -> object:
        attempted.append(event["id"])
        return result if event["id"] == "b" else True

    with pytest.raises(NotAcknowledged) as excinfo:
        await dispatch(outbox, send)

    assert "'b'" in str(excinfo.value)
    assert attempted == ["a", "b"]
    assert sent_flags(db) == {"a": 1, "b": 0, "c": 0}


# ---------------------------------------------------------------- copies out, originals in


async def test_a_send_that_changes_the_id_cannot_redirect_the_mark(
    outbox: Outbox, db: Path
) -> None:
    await accept_all(outbox, "a", "b", "c")

    async def send(event: Event) -> bool:
        if event["id"] == "b":
            event["id"] = "c"
        return True

    assert await dispatch(outbox, send, limit=2) == ["a", "b"]
    assert sent_flags(db) == {"a": 1, "b": 1, "c": 0}


async def test_the_callback_receives_a_copy(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a", "b")
    store = WatchedStore(outbox)
    send = Recorder()

    await dispatch(store, send)

    (batch,) = store.batches
    assert [e["id"] for e in batch] == ["a", "b"]
    for original, given in zip(batch, send.received, strict=True):
        assert given is not original
        assert given == original
    assert store.marked == ["a", "b"]


async def test_mutating_the_argument_changes_neither_the_batch_nor_the_store(
    outbox: Outbox, db: Path
) -> None:
    await accept_all(outbox, "a", "b")
    store = WatchedStore(outbox)

    async def send(event: Event) -> bool:
        event["data"]["qty"] = 999
        event["data"]["sku"] = "changed"
        event["key"] = "changed"
        event["type"] = "changed"
        event["id"] = "zzz"
        return False

    with pytest.raises(NotAcknowledged):
        await dispatch(store, send)

    assert store.batches == [[recorded("a"), recorded("b")]]
    assert await outbox.pending() == [recorded("a"), recorded("b")]
    assert query(db, f"SELECT id, {entry_payload(db)} FROM outbox_entries ORDER BY id") == [
        ("a", canonical_json(recorded("a"))),
        ("b", canonical_json(recorded("b"))),
    ]
    assert query(db, "SELECT id, sku, qty FROM outbox_orders ORDER BY id") == [
        ("a", "snack", 7),
        ("b", "snack", 7),
    ]


# ---------------------------------------------------------------- the after-delivery hook


async def test_sync_hook_runs_after_the_ack_and_before_the_mark(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a", "b")
    steps: list[str] = []

    async def send(event: Event) -> bool:
        steps.append(f"send {event['id']}")
        return True

    def hook(event_id: str) -> None:
        steps.append(f"hook {event_id} sent={is_sent(db, event_id)}")

    assert await dispatch(outbox, send, after_delivery=hook) == ["a", "b"]
    assert steps == ["send a", "hook a sent=0", "send b", "hook b sent=0"]
    assert sent_ids(db) == ["a", "b"]


async def test_async_hook_is_awaited_before_the_mark(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a", "b")
    steps: list[str] = []

    async def hook(event_id: str) -> None:
        await asyncio.sleep(0)
        steps.append(f"hook {event_id} sent={is_sent(db, event_id)}")
        await asyncio.sleep(0)
        steps.append(f"hook {event_id} done sent={is_sent(db, event_id)}")

    assert await dispatch(outbox, ack, after_delivery=hook) == ["a", "b"]
    assert steps == [
        "hook a sent=0",
        "hook a done sent=0",
        "hook b sent=0",
        "hook b done sent=0",
    ]
    assert sent_ids(db) == ["a", "b"]


async def test_hook_gets_the_selected_id_even_if_send_changed_it(outbox: Outbox) -> None:
    await accept_all(outbox, "a", "b")
    hooked: list[str] = []

    async def send(event: Event) -> bool:
        event["id"] = "b"
        return True

    await dispatch(outbox, send, limit=1, after_delivery=hooked.append)
    assert hooked == ["a"]


async def test_hook_does_not_run_when_the_send_fails(outbox: Outbox) -> None:
    await accept_all(outbox, "a")
    hooked: list[str] = []

    async def send(event: Event) -> object:
        return None

    with pytest.raises(NotAcknowledged):
        await dispatch(outbox, send, after_delivery=hooked.append)
    assert hooked == []


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_failing_hook_leaves_the_entry_unsent(outbox: Outbox, db: Path, kind: str) -> None:
    await accept_all(outbox, "a", "b", "c")
    error = SystemError("stop right here")

    def sync_hook(event_id: str) -> None:
        if event_id == "b":
            raise error

    async def async_hook(event_id: str) -> None:
        sync_hook(event_id)

    hook = sync_hook if kind == "sync" else async_hook
    with pytest.raises(SystemError) as excinfo:
        await dispatch(outbox, ack, after_delivery=hook)

    assert excinfo.value is error
    assert sent_flags(db) == {"a": 1, "b": 0, "c": 0}


# ---------------------------------------------------------------- no lock while sending


async def test_another_connection_can_write_during_a_send(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a", "b")
    written: list[str] = []

    async def send(event: Event) -> bool:
        side = f"side-{event['id']}"
        write_with_no_wait(db, side)
        written.append(side)
        return True

    assert await dispatch(outbox, send) == ["a", "b"]
    assert written == ["side-a", "side-b"]
    assert {"side-a", "side-b"} <= {r[0] for r in query(db, "SELECT id FROM outbox_orders")}


async def test_no_reader_snapshot_is_held_during_a_send(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a")
    busy: list[int] = []

    async def send(event: Event) -> bool:
        conn = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            busy.append(conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0])
        finally:
            conn.close()
        return True

    await dispatch(outbox, send)
    assert busy == [0]


async def test_another_connection_can_write_while_a_send_hangs(outbox: Outbox, db: Path) -> None:
    await accept_all(outbox, "a", "b")
    outcome: list[str] = []

    async def hanging_send(event: Event) -> bool:
        sleeper = asyncio.ensure_future(asyncio.sleep(0.05))
        await asyncio.sleep(0)
        write_with_no_wait(db, f"during-{event['id']}")
        await sleeper
        write_with_no_wait(db, f"after-{event['id']}")
        outcome.append(event["id"])
        return True

    assert await dispatch(outbox, hanging_send, limit=1) == ["a"]
    assert outcome == ["a"]
    assert {"during-a", "after-a"} <= {r[0] for r in query(db, "SELECT id FROM outbox_orders")}


async def test_writes_in_a_parallel_task_succeed_while_send_is_blocked(
    outbox: Outbox, db: Path
) -> None:
    await accept_all(outbox, "a")
    started = asyncio.Event()
    release = asyncio.Event()

    async def blocked_send(event: Event) -> bool:
        started.set()
        await release.wait()
        return True

    task = asyncio.create_task(dispatch(outbox, blocked_send))
    try:
        await asyncio.wait_for(started.wait(), WAIT_S)
        for n in range(3):
            await asyncio.sleep(0.01)
            write_with_no_wait(db, f"side-{n}")
        assert not task.done()
        assert is_sent(db, "a") == 0
    finally:
        release.set()
        result = await asyncio.wait_for(task, WAIT_S)
    assert result == ["a"]
    assert is_sent(db, "a") == 1


async def test_accept_completes_while_another_tasks_send_is_blocked(
    outbox: Outbox, db: Path
) -> None:
    await accept_all(outbox, "a")
    started = asyncio.Event()
    release = asyncio.Event()

    async def blocked_send(event: Event) -> bool:
        started.set()
        await release.wait()
        return True

    task = asyncio.create_task(dispatch(outbox, blocked_send))
    try:
        await asyncio.wait_for(started.wait(), WAIT_S)
        async with Outbox.open(db) as intake:
            accepted = await asyncio.wait_for(intake.accept(order("new-1")), 1.0)
        same_connection = await asyncio.wait_for(outbox.accept(order("new-2")), 1.0)
        assert (accepted, same_connection) == ("accepted", "accepted")
        assert not task.done()
        assert unsent_ids(db) == ["a", "new-1", "new-2"]
    finally:
        release.set()
        result = await asyncio.wait_for(task, WAIT_S)

    assert result == ["a"]
    assert unsent_ids(db) == ["new-1", "new-2"]
    assert await dispatch(outbox, ack) == ["new-1", "new-2"]
