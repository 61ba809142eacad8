"""The Outbox against real SQLite files, checked through independent sqlite3 connections."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from publisher import MAX_BATCH, Outbox, UnknownEntry
from shared import Conflict, InvalidEvent, canonical_json
from sqlite_tx import StorageError


def rows(path: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows read through a fresh connection, closed afterwards."""
    conn = sqlite3.connect(path, timeout=5)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def execute(path: Path, *statements: str) -> None:
    """Run statements through a fresh autocommit connection."""
    conn = sqlite3.connect(path, timeout=5, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def contents(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of both tables, in a fixed order."""
    return {
        "orders": rows(path, "SELECT * FROM orders ORDER BY id"),
        "outbox": rows(path, "SELECT * FROM outbox ORDER BY seq"),
    }


def count(path: Path, table: str) -> int:
    n: int = rows(path, f"SELECT count(*) FROM {table}")[0][0]
    return n


def unsent(path: Path) -> list[str]:
    return [r[0] for r in rows(path, "SELECT id FROM outbox WHERE sent = 0 ORDER BY seq")]


def wal_file(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def order(event_id: str, sku: str = "snack", qty: int = 7) -> dict[str, Any]:
    return {"id": event_id, "sku": sku, "qty": qty}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "source.db"


@pytest.fixture
async def outbox(path: Path) -> AsyncIterator[Outbox]:
    async with Outbox.open(path) as opened:
        yield opened


# ---------------------------------------------------------------- opening


async def test_open_creates_orders_and_outbox_tables(outbox: Outbox, path: Path) -> None:
    names = {r[0] for r in rows(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"orders", "outbox"} <= names
    assert "inbox" not in names
    columns = {r[1] for r in rows(path, "PRAGMA table_info(outbox)")}
    assert {"seq", "id", "payload", "sent"} <= columns


async def test_outbox_seq_is_autoincrement(outbox: Outbox, path: Path) -> None:
    (ddl,) = rows(path, "SELECT sql FROM sqlite_master WHERE name = 'outbox'")[0]
    assert "AUTOINCREMENT" in ddl.upper()
    await outbox.accept(order("a"))
    await outbox.accept(order("b"))
    execute(path, "DELETE FROM outbox WHERE id = 'b'")
    await outbox.accept(order("c"))
    seqs = dict(rows(path, "SELECT id, seq FROM outbox"))
    assert seqs["c"] > seqs["a"] + 1  # the seq of the deleted entry is never reused


async def test_open_uses_wal_journal_mode(outbox: Outbox, path: Path) -> None:
    assert rows(path, "PRAGMA journal_mode") == [("wal",)]


async def test_open_sets_synchronous_full_on_its_connection(outbox: Outbox) -> None:
    synchronous = await outbox._db.run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
    assert synchronous == 2  # FULL


async def test_await_open_returns_an_outbox(path: Path) -> None:
    outbox = await Outbox.open(path)
    try:
        assert await outbox.accept(order("a")) == "accepted"
        assert outbox.path == str(path)
    finally:
        await outbox.close()
    assert count(path, "orders") == 1


async def test_async_with_open_closes_on_exit(path: Path) -> None:
    async with Outbox.open(path) as outbox:
        assert isinstance(outbox, Outbox)
        await outbox.accept(order("a"))
        assert wal_file(path).exists()
    # The last connection to close checkpoints the WAL and deletes it.
    assert not wal_file(path).exists()
    assert count(path, "outbox") == 1


async def test_reopening_keeps_the_data(path: Path) -> None:
    async with Outbox.open(path) as outbox:
        await outbox.accept(order("a"))
        await outbox.accept(order("b"))
        await outbox.mark_sent("a")
    async with Outbox.open(path) as outbox:
        assert await outbox.pending() == [order("b")]
        assert await outbox.accept(order("a")) == "duplicate"
    assert count(path, "orders") == 2


async def test_opening_a_file_that_is_not_a_database_is_a_storage_error(path: Path) -> None:
    path.write_bytes(b"garbage, not SQLite\n" * 200)
    try:
        outbox = await Outbox.open(path)
    except StorageError:
        return
    await outbox.close()
    pytest.fail("a garbage file opened as an outbox")


# ---------------------------------------------------------------- accept


async def test_accept_writes_the_order_and_its_outbox_entry(outbox: Outbox, path: Path) -> None:
    assert await outbox.accept(order("a", "snack", 7)) == "accepted"
    assert rows(path, "SELECT id, sku, qty FROM orders") == [("a", "snack", 7)]
    assert rows(path, "SELECT id, payload, sent FROM outbox") == [
        ("a", canonical_json({"id": "a", "sku": "snack", "qty": 7}), 0)
    ]


async def test_same_payload_again_is_a_harmless_duplicate(outbox: Outbox, path: Path) -> None:
    assert await outbox.accept(order("a")) == "accepted"
    before = contents(path)
    assert await outbox.accept(order("a")) == "duplicate"
    assert await outbox.accept({"qty": 7, "sku": "snack", "id": "a"}) == "duplicate"
    assert contents(path) == before
    assert (count(path, "orders"), count(path, "outbox")) == (1, 1)


async def test_duplicate_of_a_sent_entry_does_not_queue_it_again(
    outbox: Outbox, path: Path
) -> None:
    await outbox.accept(order("a"))
    await outbox.mark_sent("a")
    assert await outbox.accept(order("a")) == "duplicate"
    assert await outbox.pending() == []
    assert unsent(path) == []


@pytest.mark.parametrize("changed", [order("a", qty=8), order("a", sku="other")])
async def test_same_id_with_another_payload_is_a_conflict(
    outbox: Outbox, path: Path, changed: dict[str, Any]
) -> None:
    await outbox.accept(order("a"))
    before = contents(path)
    with pytest.raises(Conflict) as excinfo:
        await outbox.accept(changed)
    assert excinfo.value.event_id == "a"
    assert contents(path) == before


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"id": "a", "sku": "snack"}, "qty"),
        ({"id": "a", "sku": "snack", "qty": 7.0}, "qty"),
        ({"id": "a", "sku": "snack", "qty": True}, "qty"),
        ({"id": "-a", "sku": "snack", "qty": 7}, "id"),
        ({"id": "a", "sku": "snack", "qty": 7, "note": "x"}, "note"),
        (["a", "snack", 7], "event"),
    ],
)
async def test_invalid_event_is_refused_and_changes_nothing(
    outbox: Outbox, path: Path, event: object, field: str
) -> None:
    await outbox.accept(order("existing"))
    before = contents(path)
    with pytest.raises(InvalidEvent) as excinfo:
        await outbox.accept(event)
    assert excinfo.value.field == field
    assert contents(path) == before


async def test_accept_stores_a_copy_not_the_callers_object(outbox: Outbox, path: Path) -> None:
    event = order("a")
    await outbox.accept(event)
    event["qty"] = 99
    assert await outbox.pending() == [order("a")]
    assert rows(path, "SELECT qty FROM orders") == [(7,)]


async def test_accept_is_atomic_when_the_outbox_insert_fails(outbox: Outbox, path: Path) -> None:
    execute(
        path,
        "CREATE TRIGGER refuse_outbox BEFORE INSERT ON outbox"
        " BEGIN SELECT RAISE(ABORT, 'boom'); END",
    )
    with pytest.raises(StorageError, match="boom"):
        await outbox.accept(order("a"))
    assert rows(path, "SELECT * FROM orders WHERE id = 'a'") == []
    assert count(path, "outbox") == 0

    execute(path, "DROP TRIGGER refuse_outbox")
    assert await outbox.accept(order("a")) == "accepted"
    assert (count(path, "orders"), count(path, "outbox")) == (1, 1)


async def test_accept_is_atomic_when_the_order_insert_fails(outbox: Outbox, path: Path) -> None:
    execute(
        path,
        "CREATE TRIGGER refuse_orders BEFORE INSERT ON orders"
        " BEGIN SELECT RAISE(ABORT, 'no orders'); END",
    )
    with pytest.raises(StorageError):
        await outbox.accept(order("a"))
    assert (count(path, "orders"), count(path, "outbox")) == (0, 0)


async def test_failed_intake_leaves_no_lock_behind(outbox: Outbox, path: Path) -> None:
    execute(
        path,
        "CREATE TRIGGER refuse_outbox BEFORE INSERT ON outbox"
        " BEGIN SELECT RAISE(ABORT, 'boom'); END",
    )
    with pytest.raises(StorageError):
        await outbox.accept(order("a"))
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders (id, sku, qty, accepted_at) VALUES ('x', 's', 1, 0)")
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert rows(path, "SELECT id FROM orders") == [("x",)]


# ---------------------------------------------------------------- pending


async def test_pending_is_in_insertion_order_not_id_order(outbox: Outbox) -> None:
    for event_id in ["z", "a", "m"]:
        await outbox.accept(order(event_id))
    assert [e["id"] for e in await outbox.pending()] == ["z", "a", "m"]


async def test_pending_ignores_accepted_at_timestamps(outbox: Outbox, path: Path) -> None:
    for event_id in ["z", "a", "m"]:
        await outbox.accept(order(event_id))
    execute(path, "UPDATE orders SET accepted_at = 0", "UPDATE outbox SET queued_at = 0")
    assert [e["id"] for e in await outbox.pending()] == ["z", "a", "m"]


async def test_pending_returns_exactly_id_sku_qty(outbox: Outbox) -> None:
    await outbox.accept(order("a", "snack", 7))
    (event,) = await outbox.pending()
    assert event == {"id": "a", "sku": "snack", "qty": 7}
    assert set(event) == {"id", "sku", "qty"}
    assert type(event["qty"]) is int


async def test_pending_of_an_empty_outbox_is_empty(outbox: Outbox) -> None:
    assert await outbox.pending() == []


async def test_pending_limit_bounds_the_batch(outbox: Outbox) -> None:
    ids = [f"e{n:02d}" for n in range(MAX_BATCH + 4)]
    for event_id in ids:
        await outbox.accept(order(event_id))
    assert [e["id"] for e in await outbox.pending(1)] == ids[:1]
    assert [e["id"] for e in await outbox.pending(3)] == ids[:3]
    assert [e["id"] for e in await outbox.pending(MAX_BATCH)] == ids[:MAX_BATCH]
    assert [e["id"] for e in await outbox.pending()] == ids[:MAX_BATCH]


@pytest.mark.parametrize("limit", [0, 17, -1, True, 1.0, "16", None])
async def test_pending_refuses_a_bad_limit(outbox: Outbox, limit: Any) -> None:
    await outbox.accept(order("a"))
    with pytest.raises(ValueError):
        await outbox.pending(limit)


async def test_pending_changes_nothing(outbox: Outbox, path: Path) -> None:
    for event_id in ["z", "a", "m"]:
        await outbox.accept(order(event_id))
    await outbox.mark_sent("a")
    before = contents(path)
    first = await outbox.pending()
    second = await outbox.pending()
    assert first == second == [order("z"), order("m")]
    assert contents(path) == before


async def test_pending_leaves_no_lock_or_snapshot_behind(outbox: Outbox, path: Path) -> None:
    for event_id in ["a", "b"]:
        await outbox.accept(order(event_id))
    assert len(await outbox.pending()) == 2
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("COMMIT")
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        conn.close()
    assert busy == 0


async def test_pending_skips_sent_entries(outbox: Outbox) -> None:
    for event_id in ["a", "b", "c"]:
        await outbox.accept(order(event_id))
    await outbox.mark_sent("b")
    assert [e["id"] for e in await outbox.pending()] == ["a", "c"]
    await outbox.mark_sent("a")
    await outbox.mark_sent("c")
    assert await outbox.pending() == []


async def test_pending_returns_fresh_dicts_each_time(outbox: Outbox) -> None:
    await outbox.accept(order("a"))
    (first,) = await outbox.pending()
    first["id"] = "changed"
    assert await outbox.pending() == [order("a")]


# ---------------------------------------------------------------- mark_sent


async def test_mark_sent_marks_the_entry(outbox: Outbox, path: Path) -> None:
    await outbox.accept(order("a"))
    await outbox.accept(order("b"))
    await outbox.mark_sent("a")
    assert rows(path, "SELECT id, sent FROM outbox ORDER BY seq") == [("a", 1), ("b", 0)]
    assert rows(path, "SELECT sent_at IS NOT NULL FROM outbox WHERE id = 'a'") == [(1,)]


async def test_mark_sent_keeps_the_ack(outbox: Outbox, path: Path) -> None:
    await outbox.accept(order("a"))
    await outbox.mark_sent("a", {"ack": "a", "status": "applied"})
    (ack,) = rows(path, "SELECT ack FROM outbox WHERE id = 'a'")[0]
    assert ack is not None
    assert '"ack": "a"' in ack


async def test_mark_sent_is_idempotent(outbox: Outbox, path: Path) -> None:
    await outbox.accept(order("a"))
    await outbox.mark_sent("a")
    before = contents(path)
    await outbox.mark_sent("a")
    assert contents(path) == before
    assert rows(path, "SELECT sent FROM outbox") == [(1,)]


async def test_mark_sent_of_an_unknown_id_is_unknown_entry(outbox: Outbox, path: Path) -> None:
    await outbox.accept(order("a"))
    before = contents(path)
    with pytest.raises(UnknownEntry) as excinfo:
        await outbox.mark_sent("nope")
    assert excinfo.value.event_id == "nope"
    assert isinstance(excinfo.value, LookupError)
    assert contents(path) == before


async def test_mark_sent_does_not_touch_the_order(outbox: Outbox, path: Path) -> None:
    await outbox.accept(order("a"))
    before = rows(path, "SELECT * FROM orders")
    await outbox.mark_sent("a")
    assert rows(path, "SELECT * FROM orders") == before
