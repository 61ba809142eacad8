"""The chaos verdict over orders and generic events together: two real databases written
by the real outbox and inbox, on both backends (the `databases` fixture), read back by
read_verdict; then changed behind the services' backs, as a fault would leave them."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from chaos.dbs import is_postgres
from chaos.feed import Feed, Item, canonical, order_item
from chaos.verdict import Ordering, Verdict, line_orders, read_verdict
from publisher import Outbox
from shared import Event, Order
from sink import Inbox

if TYPE_CHECKING:
    from conftest import Databases

ORDER_1 = order_item(Order(id="o-1", sku="snack", qty=3))
ORDER_2 = order_item(Order(id="o-2", sku="juice", qty=2))


def event(event_id: str, key: str | None, data: dict[str, Any]) -> Item:
    body = Event(id=event_id, type="payment.captured", data=data)
    if key is not None:
        body["key"] = key
    return Item(dict(body), canonical(body))


# By seq: an order of snack, an event of snack's lane, a keyless event, an event of
# acct-7, an order of juice, a second keyless event.
ITEMS = [
    ORDER_1,
    event("e-1", "snack", {"amount": 1.0, "note": "Grüße 🦄", "😀": 1, "ﬁ": 2}),
    event("e-2", None, {"deep": {"x": [1e21, -0.0, 1.5e-7]}, "t": "line\u2028sep"}),
    event("e-3", "acct-7", {"n": 9007199254740991}),
    ORDER_2,
    event("e-4", None, {"text": "𝄞"}),
]
BY_ID = {item.id: item for item in ITEMS}
PUBLISHED = {item.id: item.canonical for item in ITEMS}
EXPECTED = {i.id: (i.order["sku"], i.order["qty"]) for i in ITEMS if i.order is not None}


async def record(databases: Databases, items: list[Item]) -> None:
    """Orders through the order intake, events through the event intake, in this order."""
    async with Outbox.open(databases.source) as outbox:
        for item in items:
            intake = outbox.accept_many if item.order is not None else outbox.publish_many
            assert await intake([item.body]) == ["accepted"]


async def apply(databases: Databases, *ids: str, items: dict[str, Item] = BY_ID) -> None:
    """The sink applies these events in this order (an order as the order.placed event
    it is recorded as); then every one is marked sent."""
    async with Inbox.open(databases.sink) as inbox:
        for event_id in ids:
            await inbox.receive(json.loads(items[event_id].canonical))
    async with Outbox.open(databases.source) as outbox:
        for event_id in ids:
            await outbox.mark_sent(event_id)


def change(db: Path | str, sql: str, params: tuple[object, ...] = ()) -> int:
    if is_postgres(db):
        import psycopg

        with psycopg.connect(str(db), autocommit=True) as pg:
            return pg.execute(sql.replace("?", "%s"), params).rowcount
    conn = sqlite3.connect(db, timeout=5)
    try:
        with conn:
            return conn.execute(sql, params).rowcount
    finally:
        conn.close()


def verdict(databases: Databases, ordering: Ordering = "global", **published: str) -> Verdict:
    return read_verdict(
        databases.source,
        databases.sink,
        EXPECTED,
        ordering,
        published={**PUBLISHED, **published},
    )


@pytest.fixture
async def recorded(databases: Databases) -> Databases:
    await record(databases, ITEMS)
    async with Inbox.open(databases.sink):
        pass  # the sink's schema exists before any delivery
    return databases


async def test_orders_and_events_all_delivered_are_ok(recorded: Databases) -> None:
    await apply(recorded, *BY_ID)

    found = verdict(recorded, "key")

    assert found.ok is True, found
    assert (found.accepted, found.generic, found.delivered) == (6, 4, 6)
    assert (found.lost, found.applied_twice, found.payload_mismatches, found.unknown) == (
        0,
        0,
        0,
        0,
    )
    assert found.inventory_ok is True  # snack 3, juice 2: events change no inventory


async def test_the_stored_payloads_are_the_runners_canonical_forms(recorded: Databases) -> None:
    await apply(recorded, *BY_ID)

    assert verdict(recorded).payload_mismatches == 0  # the outbox's, the inbox's and ours


async def test_an_event_payload_changed_in_the_inbox_is_a_mismatch(recorded: Databases) -> None:
    await apply(recorded, *BY_ID)
    stored = BY_ID["e-1"].canonical.replace("🦄", "\\ud83e\\udd84")  # same JSON, other text
    assert (
        change(recorded.sink, "UPDATE inbox_events SET payload = ? WHERE id = 'e-1'", (stored,))
        == 1
    )

    found = verdict(recorded)

    assert (found.payload_mismatches, found.lost, found.ok) == (1, 0, False)


async def test_an_event_other_than_the_runner_published_is_a_mismatch(recorded: Databases) -> None:
    await apply(recorded, *BY_ID)

    found = verdict(recorded, **{"e-3": BY_ID["e-3"].canonical.replace("991", "990")})

    assert (found.payload_mismatches, found.ok) == (1, False)


async def test_an_event_the_sink_never_applied_is_lost(recorded: Databases) -> None:
    await apply(recorded, "o-1", "e-1", "e-2", "o-2", "e-4")
    async with Outbox.open(recorded.source) as outbox:
        await outbox.mark_sent("e-3")  # marked, but the sink never got it

    found = verdict(recorded)

    assert (found.lost, found.inventory_ok, found.ok) == (1, True, False)


async def test_an_event_never_recorded_by_the_outbox_is_lost(recorded: Databases) -> None:
    await apply(recorded, *BY_ID)

    found = verdict(recorded, **{"e-9": '{"data":{},"id":"e-9","type":"x"}'})

    assert (found.lost, found.ok) == (1, False)


async def test_an_inbox_row_nobody_published_is_unknown(recorded: Databases) -> None:
    await apply(recorded, *BY_ID)
    async with Inbox.open(recorded.sink) as inbox:
        await inbox.receive({"id": "ghost", "type": "shipment.sent", "data": {}})

    found = verdict(recorded)

    assert (found.unknown, found.lost, found.ok) == (1, 0, False)


@pytest.mark.parametrize("ordering", ["key", "sku"])
async def test_lines_by_key_keep_keyless_events_on_their_own_line(
    recorded: Databases, ordering: Ordering
) -> None:
    # e-4 (keyless) before e-2 (keyless, earlier); snack's and acct-7's lines in order;
    # the order between lines is free in order by key.
    await apply(recorded, "e-3", "e-4", "o-1", "o-2", "e-2", "e-1")

    lines = line_orders(recorded.source, recorded.sink, ordering)

    assert {name: (line.applied, line.inversions) for name, line in lines.items()} == {
        "*": (2, 1),
        "acct-7": (1, 0),
        "juice": (1, 0),
        "snack": (2, 0),
    }
    assert verdict(recorded, ordering).order_inversions == 1
    assert verdict(recorded, "global").order_inversions > 1


async def test_an_order_and_an_event_of_one_key_share_its_line(recorded: Databases) -> None:
    await apply(recorded, "e-1", "o-1", "e-2", "e-3", "o-2", "e-4")  # e-1 before o-1: snack

    lines = line_orders(recorded.source, recorded.sink, "key")

    assert (lines["snack"].applied, lines["snack"].inversions) == (2, 1)


async def test_a_drawn_feed_is_recorded_and_read_back_as_published(databases: Databases) -> None:
    feed = Feed("mixed", 5, random.Random(5), ("snack", "juice"))
    items = [feed.item(index) for index in range(40)]
    await record(databases, items)
    await apply(databases, *(item.id for item in items), items={i.id: i for i in items})

    expected = {i.id: (i.order["sku"], i.order["qty"]) for i in items if i.order}
    published = {item.id: item.canonical for item in items}
    found = read_verdict(databases.source, databases.sink, expected, "key", published=published)

    assert found.ok is True, found
    assert 0 < found.generic < 40 and found.accepted == 40
