"""The inbox on a real SQLite file, checked through independent connections."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from shared import Conflict, InvalidEvent, Receipt
from sink import Inbox
from sqlite_tx import StorageError

if TYPE_CHECKING:
    from conftest import Query

EVENT: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sink.db"


@pytest.fixture
async def inbox(db: Path) -> AsyncIterator[Inbox]:
    async with Inbox.open(db) as opened:
        yield opened


def snapshot(db_rows: Query, db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    return (
        db_rows(db, "SELECT * FROM inbox ORDER BY id"),
        db_rows(db, "SELECT * FROM inventory ORDER BY sku"),
    )


def execute(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db, timeout=5, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


FAIL_INSERT = (
    "CREATE TRIGGER fail_insert BEFORE INSERT ON inventory BEGIN SELECT RAISE(ABORT, 'boom'); END"
)
FAIL_UPDATE = (
    "CREATE TRIGGER fail_update BEFORE UPDATE ON inventory BEGIN SELECT RAISE(ABORT, 'boom'); END"
)


async def test_first_receive_applies_and_the_same_event_again_is_a_duplicate(
    inbox: Inbox, db: Path, db_rows: Query
) -> None:
    assert await inbox.receive(dict(EVENT)) is Receipt.APPLIED
    assert await inbox.receive(dict(EVENT)) is Receipt.DUPLICATE

    assert await inbox.inventory("snack") == 7
    assert db_rows(db, "SELECT qty FROM inventory WHERE sku = 'snack'") == [(7,)]
    assert db_rows(db, "SELECT id, deliveries FROM inbox") == [("order-1", 2)]


async def test_duplicate_updates_the_delivery_record_only(inbox: Inbox) -> None:
    await inbox.receive(dict(EVENT))
    first = await inbox.record("order-1")
    await inbox.receive(dict(EVENT))
    second = await inbox.record("order-1")

    assert first is not None and second is not None
    assert (first.deliveries, second.deliveries) == (1, 2)
    assert second.received_at == first.received_at
    assert second.last_delivery_at >= first.last_delivery_at
    assert second.digest == first.digest
    assert await inbox.count() == 1


async def test_events_for_the_same_sku_add_up(inbox: Inbox, db: Path, db_rows: Query) -> None:
    await inbox.receive({"id": "a", "sku": "snack", "qty": 7})
    await inbox.receive({"id": "b", "sku": "snack", "qty": 5})
    await inbox.receive({"id": "c", "sku": "drink", "qty": 1})

    assert await inbox.inventory("snack") == 12
    assert db_rows(db, "SELECT sku, qty FROM inventory ORDER BY sku") == [
        ("drink", 1),
        ("snack", 12),
    ]


async def test_inventory_of_an_unknown_sku_is_zero(inbox: Inbox) -> None:
    assert await inbox.inventory("never-seen") == 0
    assert await inbox.record("never-seen") is None


@pytest.mark.parametrize(
    "changed",
    [{"qty": 8}, {"sku": "drink"}],
    ids=["other-qty", "other-sku"],
)
async def test_conflicting_payload_raises_and_changes_nothing(
    inbox: Inbox, db: Path, db_rows: Query, changed: dict[str, Any]
) -> None:
    await inbox.receive(dict(EVENT))
    before = snapshot(db_rows, db)

    with pytest.raises(Conflict) as caught:
        await inbox.receive({**EVENT, **changed})

    assert caught.value.event_id == "order-1"
    assert snapshot(db_rows, db) == before
    assert db_rows(db, "SELECT deliveries FROM inbox WHERE id = 'order-1'") == [(1,)]


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"id": "x", "sku": "snack", "qty": True}, "qty"),
        ({"id": "x", "sku": "snack", "qty": 0}, "qty"),
        ({"id": "x", "sku": "snack", "qty": 7.0}, "qty"),
        ({"id": "x", "sku": "snack"}, "qty"),
        ({"id": "x", "sku": "snack", "qty": 7, "extra": 1}, "extra"),
        ({"id": "-x", "sku": "snack", "qty": 7}, "id"),
        ({"id": "x", "sku": "sn ack", "qty": 7}, "sku"),
        (["x", "snack", 7], "event"),
    ],
)
async def test_invalid_event_raises_and_changes_nothing(
    inbox: Inbox, db: Path, db_rows: Query, event: object, field: str
) -> None:
    await inbox.receive(dict(EVENT))
    before = snapshot(db_rows, db)

    with pytest.raises(InvalidEvent) as caught:
        await inbox.receive(event)

    assert caught.value.field == field
    assert snapshot(db_rows, db) == before


async def test_receive_is_atomic_when_the_inventory_insert_fails(
    inbox: Inbox, db: Path, db_rows: Query
) -> None:
    execute(db, FAIL_INSERT, FAIL_UPDATE)

    with pytest.raises(StorageError, match="boom"):
        await inbox.receive(dict(EVENT))

    assert db_rows(db, "SELECT id FROM inbox WHERE id = 'order-1'") == []
    assert db_rows(db, "SELECT * FROM inventory") == []

    execute(db, "DROP TRIGGER fail_insert", "DROP TRIGGER fail_update")
    assert await inbox.receive(dict(EVENT)) is Receipt.APPLIED
    assert db_rows(db, "SELECT id, deliveries FROM inbox") == [("order-1", 1)]
    assert db_rows(db, "SELECT sku, qty FROM inventory") == [("snack", 7)]


async def test_receive_is_atomic_when_the_inventory_update_fails(
    inbox: Inbox, db: Path, db_rows: Query
) -> None:
    await inbox.receive({"id": "first", "sku": "snack", "qty": 3})
    execute(db, FAIL_UPDATE)

    with pytest.raises(StorageError, match="boom"):
        await inbox.receive(dict(EVENT))

    assert db_rows(db, "SELECT id FROM inbox ORDER BY id") == [("first",)]
    assert db_rows(db, "SELECT sku, qty FROM inventory") == [("snack", 3)]

    execute(db, "DROP TRIGGER fail_update")
    assert await inbox.receive(dict(EVENT)) is Receipt.APPLIED
    assert await inbox.receive(dict(EVENT)) is Receipt.DUPLICATE
    assert db_rows(db, "SELECT sku, qty FROM inventory") == [("snack", 10)]


async def test_database_is_in_wal_mode_seen_from_another_connection(
    inbox: Inbox, db: Path, db_rows: Query
) -> None:
    await inbox.receive(dict(EVENT))
    assert db_rows(db, "PRAGMA journal_mode") == [("wal",)]


async def test_committed_events_survive_closing_and_reopening(db: Path, db_rows: Query) -> None:
    async with Inbox.open(db) as first:
        await first.receive(dict(EVENT))

    async with Inbox.open(db) as second:
        assert await second.receive(dict(EVENT)) is Receipt.DUPLICATE
        assert await second.inventory("snack") == 7
    assert db_rows(db, "SELECT deliveries FROM inbox WHERE id = 'order-1'") == [(2,)]


async def test_two_connections_racing_on_one_id_apply_it_once(db: Path, db_rows: Query) -> None:
    async with Inbox.open(db) as one, Inbox.open(db) as two:
        receipts = await asyncio.gather(
            *(inbox.receive(dict(EVENT)) for _ in range(10) for inbox in (one, two))
        )

    assert sorted(receipts) == sorted([Receipt.APPLIED] + [Receipt.DUPLICATE] * 19)
    assert db_rows(db, "SELECT qty FROM inventory WHERE sku = 'snack'") == [(7,)]
    assert db_rows(db, "SELECT deliveries FROM inbox") == [(20,)]
