"""The behaviour every inbox backend must show, whatever it stores in.

Each test runs once per backend in `BACKENDS`: it gets an inbox opened with
`Inbox.open(backend.location)` and checks what reached the `inbox` and `inventory`
tables through a connection of its own (`backend.query`), as another process would
see them. What only one backend has (SQLite's WAL, inline commits and group commits,
lock waits; PostgreSQL's shared transactions, races between connections, durability
on a server that does not flush) is tested in tests/integration with that backend.

A new backend plugs in with one class that implements `Backend` and one factory in
`BACKENDS` (tests/behaviour/inbox_backends.py); the tests are not copied. The SQL
here uses `?` placeholders and the dialect SQLite and PostgreSQL share; a backend
whose driver wants another placeholder style translates it in `query`. The tests
read the columns of today's schema (inbox: id, type, payload, received_at,
deliveries, last_delivery_at, applied_seq; inventory: sku, qty), which the chaos
verdict reads too; a backend keeps their names and meaning.

Events are of any type: most tests use orders (`order.placed` events, whose effect
is on the inventory), and the section "events of any type" checks events of other
types, keys and data (nested, unicode, floats) beside them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from inbox_backends import BACKENDS, FAULTS, Backend, Fault, Row, SqliteBackend, Write
from support import in_progress, json_of_python

import sink.store
from plumbing.storage import StorageError
from shared import (
    GLOBAL_LINE,
    Conflict,
    Event,
    InvalidEvent,
    Lease,
    PredecessorMissing,
    Receipt,
    StaleLease,
    canonical_json,
    order_event,
)
from shared import payload_digest as digest
from sink import Inbox
from sink.handlers import HandlerFailed
from sink.store import Incoming


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    with BACKENDS[request.param](request) as opened:
        yield opened


@pytest.fixture
async def inbox(backend: Backend) -> AsyncIterator[Inbox]:
    async with Inbox.open(backend.location) as opened:
        yield opened


# ---------------------------------------------------------------- helpers


def event(event_id: str, sku: str = "snack", qty: int = 1) -> Event:
    """An order, as the `order.placed` event it is recorded as."""
    return order_event({"id": event_id, "sku": sku, "qty": qty})


def incoming(one: Event) -> Incoming:
    """An event as the inbox takes it, validated (as Inbox.receive validates)."""
    return Incoming.checked(one)


def taken(*events: Event) -> list[Incoming]:
    """Events as the inbox takes them."""
    return [incoming(one) for one in events]


def changed(one: Event, **data: object) -> Event:
    """`one` with these fields of its data changed."""
    return {**one, "data": {**one["data"], **data}}


EVENT: Event = event("order-1", qty=7)
Snapshot = tuple[list[Row], list[Row]]


def snapshot(backend: Backend) -> Snapshot:
    """Every row of both tables, in a fixed order."""
    return (
        backend.query("SELECT * FROM inbox_events ORDER BY id"),
        backend.query("SELECT * FROM inbox_inventory ORDER BY sku"),
    )


def stock(backend: Backend) -> dict[str, int]:
    return dict(backend.query("SELECT sku, qty FROM inbox_inventory"))


# ---------------------------------------------------------------- receive


async def test_first_receive_applies_and_the_same_event_again_is_a_duplicate(
    inbox: Inbox, backend: Backend
) -> None:
    assert await inbox.receive(dict(EVENT)) is Receipt.APPLIED
    assert await inbox.receive(dict(EVENT)) is Receipt.DUPLICATE

    assert await inbox.inventory("snack") == 7
    assert backend.query("SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(7,)]
    assert backend.query("SELECT id, deliveries FROM inbox_events") == [("order-1", 2)]


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


async def test_the_digest_is_of_the_stored_payload_also_for_a_duplicate(
    inbox: Inbox, backend: Backend
) -> None:
    reordered = {"data": {"sku": "snack", "qty": 7}, "key": "snack", "id": "order-1"}
    applied = await inbox.receive_with_digest(incoming({**reordered, "type": "order.placed"}))
    again = await inbox.receive_with_digest(incoming(dict(EVENT)))

    assert (applied.receipt, applied.digest) == (Receipt.APPLIED, digest(EVENT))
    assert (again.receipt, again.digest) == (Receipt.DUPLICATE, digest(EVENT))
    assert backend.query("SELECT payload FROM inbox_events") == [(canonical_json(EVENT),)]
    record = await inbox.record("order-1")
    assert record is not None and (record.id, record.digest) == ("order-1", digest(EVENT))


async def test_events_for_the_same_sku_add_up(inbox: Inbox, backend: Backend) -> None:
    await inbox.receive(event("a", qty=7))
    await inbox.receive(event("b", qty=5))
    await inbox.receive(event("c", "drink"))

    assert await inbox.inventory("snack") == 12
    assert backend.query("SELECT sku, qty FROM inbox_inventory ORDER BY sku") == [
        ("drink", 1),
        ("snack", 12),
    ]
    assert await inbox.count() == 3


async def test_inventory_of_an_unknown_sku_is_zero(inbox: Inbox) -> None:
    assert await inbox.inventory("never-seen") == 0
    assert await inbox.record("never-seen") is None
    assert await inbox.count() == 0


@pytest.mark.parametrize(
    "other",
    [
        changed(EVENT, qty=8),
        changed(EVENT, sku="drink"),
        {**EVENT, "key": "drink"},
        {**EVENT, "type": "order.cancelled"},
        {"id": "order-1", "type": "order.placed", "data": EVENT["data"]},
    ],
    ids=["other-qty", "other-sku", "other-key", "other-type", "no-key"],
)
async def test_conflicting_payload_raises_and_changes_nothing(
    inbox: Inbox, backend: Backend, other: Event
) -> None:
    await inbox.receive(dict(EVENT))
    before = snapshot(backend)

    with pytest.raises(Conflict) as caught:
        await inbox.receive(other)

    assert caught.value.event_id == "order-1"
    assert snapshot(backend) == before
    assert backend.query("SELECT deliveries FROM inbox_events WHERE id = 'order-1'") == [(1,)]


VALID: dict[str, Any] = {"id": "x", "type": "thing.done", "key": "k", "data": {}}


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"id": "x", "sku": "snack", "qty": 7}, "/type"),  # an order is not an event
        ({**VALID, "extra": 1}, "/extra"),
        ({**VALID, "id": "-x"}, "/id"),
        ({**VALID, "type": "thing done"}, "/type"),
        ({**VALID, "key": "k k"}, "/key"),
        ({**VALID, "data": [1]}, "/data"),
        ({**VALID, "data": {"a": [1, {"b": float("nan")}]}}, "/data/a/1/b"),
        ({**VALID, "data": {"n": 2**53}}, "/data/n"),
        ({**VALID, "data": {"s": "\ud800"}}, "/data/s"),
        (["x", "snack", 7], ""),
    ],
    ids=[
        "order",
        "extra",
        "bad-id",
        "bad-type",
        "bad-key",
        "data-array",
        "nan",
        "big-int",
        "lone-surrogate",
        "array",
    ],
)
async def test_invalid_event_raises_and_changes_nothing(
    inbox: Inbox, backend: Backend, event: object, field: str
) -> None:
    await inbox.receive(dict(EVENT))
    before = snapshot(backend)

    with pytest.raises(InvalidEvent) as caught:
        await inbox.receive(event)

    assert caught.value.field == field
    assert snapshot(backend) == before


# ---------------------------------------------------------------- events of any type

# Events of other types than orders: with and without a key, nested data, text
# outside ASCII and outside the Basic Multilingual Plane, escapes, floats (RFC 8785
# writes them as ECMAScript does: 1e+21, -0 as 0), null and booleans.
OTHERS: list[Event] = [
    {
        "id": "p-123",
        "type": "payment.captured",
        "key": "c-9",
        "data": {
            "amount": 12.5,
            "currency": "EUR",
            "customer": {"id": "c-9", "name": "Zoë Ångström", "tags": ["vip", "北京"]},
        },
    },
    {
        "id": "s-1",
        "type": "shipment.sent",
        "data": {"parcels": [1, 2.25, -0.0, 1e21, 3.0], "note": None, "flags": [True, False]},
    },
    {
        "id": "u:1",
        "type": "user.renamed",
        "key": "u:1",
        # Keys outside the BMP sort by UTF-16 code units: 😀 (D83D DE00) before ﬀ (FB00).
        "data": {"from": 'a"b\\c\n\t', "to": "é", "\u00e9": {"€": {}, "z": [[]]}, "ﬀ": 2, "😀": 1},
    },
]
OTHER_IDS = [one["id"] for one in OTHERS]


def stored(one: Event) -> Event:
    """The event as the inbox gives it back: its canonical form, parsed."""
    parsed: Event = json.loads(canonical_json(one))
    return parsed


async def test_events_of_any_type_are_stored_in_canonical_form_with_their_type(
    inbox: Inbox, backend: Backend
) -> None:
    for one in OTHERS:
        assert await inbox.receive(one) is Receipt.APPLIED

    rows = backend.query("SELECT id, type, payload FROM inbox_events ORDER BY applied_seq")
    assert rows == [(one["id"], one["type"], canonical_json(one)) for one in OTHERS]
    assert backend.query("SELECT * FROM inbox_inventory") == []  # no order: no effect
    for one in OTHERS:
        record = await inbox.record(one["id"])
        assert record is not None
        assert (record.event, record.digest) == (stored(one), digest(one))
        assert ("key" in record.event) == ("key" in one)
    assert await inbox.count() == len(OTHERS)


async def test_an_event_of_any_type_again_is_a_duplicate_and_changed_a_conflict(
    inbox: Inbox, backend: Backend
) -> None:
    for one in OTHERS:
        await inbox.receive(one)
    before = backend.query("SELECT id, payload FROM inbox_events ORDER BY id")

    for one in OTHERS:
        # The same event, its data's members in another order: the same canonical form.
        reordered = {**one, "data": dict(reversed(list(one["data"].items())))}
        again = await inbox.receive_with_digest(incoming(reordered))
        assert (again.receipt, again.digest) == (Receipt.DUPLICATE, digest(one))
    for other in (
        changed(OTHERS[0], amount=12.51),
        changed(OTHERS[1], note=""),
        {**OTHERS[2], "key": "u:2"},
        {**OTHERS[0], "type": "payment.refunded"},
    ):
        with pytest.raises(Conflict):
            await inbox.receive(other)

    assert backend.query("SELECT id, payload FROM inbox_events ORDER BY id") == before
    delivered = dict(backend.query("SELECT id, deliveries FROM inbox_events"))
    assert delivered == dict.fromkeys(OTHER_IDS, 2)


@pytest.mark.parametrize(
    "data",
    [{"sku": "snack", "qty": 0}, {"sku": "snack", "qty": 2, "gift": True}, {"sku": "snack"}],
    ids=["zero-qty", "more-fields", "no-qty"],
)
async def test_an_order_placed_event_whose_data_is_no_order_is_recorded_without_effect(
    inbox: Inbox, backend: Backend, data: dict[str, Any]
) -> None:
    odd: Event = {"id": "odd", "type": "order.placed", "key": "snack", "data": data}

    assert await inbox.receive(odd) is Receipt.APPLIED

    assert backend.query("SELECT id, type FROM inbox_events") == [("odd", "order.placed")]
    assert stock(backend) == {}


@pytest.mark.parametrize("requests", [0, 2], ids=["alone", "shared"])
async def test_a_batch_mixing_orders_and_other_events_applies_only_the_orders_to_the_stock(
    inbox: Inbox, backend: Backend, requests: int
) -> None:
    first = [event("o1", "tea", 2), OTHERS[0], event("o2", "tea", 3), OTHERS[1]]
    # A redelivery in the second batch: applied event by event, not all as new.
    second = [OTHERS[1], event("o3", "corn", 5), OTHERS[2], event("o1", "tea", 2)]
    third = [OTHERS[2], changed(OTHERS[0], amount=1), event("o4", "corn", 7)]

    with in_progress(inbox, requests):
        receipts = [await inbox.receive_batch(taken(*batch)) for batch in (first, second, third)]

    assert [[r.receipt.value for r in got.received] for got in receipts] == [
        ["applied"] * 4,
        ["duplicate", "applied", "applied", "duplicate"],
        ["duplicate"],
    ]
    assert receipts[2].stopped is not None and receipts[2].stopped.event_id == "p-123"
    assert [r.digest for r in receipts[1].received] == [digest(one) for one in second]
    assert backend.ids_in_arrival_order() == ["o1", "p-123", "o2", "s-1", "o3", "u:1"]
    assert stock(backend) == {"tea": 5, "corn": 5}
    types = dict(backend.query("SELECT id, type FROM inbox_events"))
    assert types == {
        "o1": "order.placed",
        "o2": "order.placed",
        "o3": "order.placed",
        "p-123": "payment.captured",
        "s-1": "shipment.sent",
        "u:1": "user.renamed",
    }


async def test_calls_of_orders_and_other_events_in_progress_together_each_get_their_own(
    inbox: Inbox, backend: Backend
) -> None:
    # Committed together where a backend shares commits: the calls' orders and other
    # events in one transaction (on PostgreSQL in one statement).
    calls = [[OTHERS[0]], [event("o1", "tea", 2), OTHERS[1]], [OTHERS[2]], [event("o2", "tea", 3)]]
    with in_progress(inbox, len(calls)):
        async with asyncio.timeout(5):
            got = await asyncio.gather(*(inbox.receive_batch(taken(*c)) for c in calls))

    assert [[r.receipt for r in g.received] for g in got] == [
        [Receipt.APPLIED] * len(call) for call in calls
    ]
    assert sorted(backend.ids_in_arrival_order()) == sorted([*OTHER_IDS, "o1", "o2"])
    assert stock(backend) == {"tea": 5}


# ---------------------------------------------------------------- one transaction


async def test_receive_is_atomic_when_the_inventory_insert_fails(
    inbox: Inbox, backend: Backend
) -> None:
    with backend.refusing("inbox_inventory", ("INSERT", "UPDATE"), "boom"):
        with pytest.raises(HandlerFailed, match="boom"):
            await inbox.receive(dict(EVENT))

        assert backend.query("SELECT id FROM inbox_events WHERE id = 'order-1'") == []
        assert backend.query("SELECT * FROM inbox_inventory") == []

    assert await inbox.receive(dict(EVENT)) is Receipt.APPLIED
    assert backend.query("SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]
    assert backend.query("SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]


async def test_receive_is_atomic_when_the_inventory_update_fails(
    inbox: Inbox, backend: Backend
) -> None:
    await inbox.receive(event("first", qty=3))
    with backend.refusing("inbox_inventory", ("UPDATE",), "boom"):
        with pytest.raises(HandlerFailed, match="boom"):
            await inbox.receive(dict(EVENT))

        assert backend.query("SELECT id FROM inbox_events ORDER BY id") == [("first",)]
        assert backend.query("SELECT sku, qty FROM inbox_inventory") == [("snack", 3)]

    assert await inbox.receive(dict(EVENT)) is Receipt.APPLIED
    assert await inbox.receive(dict(EVENT)) is Receipt.DUPLICATE
    assert backend.query("SELECT sku, qty FROM inbox_inventory") == [("snack", 10)]


async def test_committed_events_survive_closing_and_reopening(backend: Backend) -> None:
    async with Inbox.open(backend.location) as first:
        await first.receive(dict(EVENT))

    async with Inbox.open(backend.location) as second:
        assert await second.receive(dict(EVENT)) is Receipt.DUPLICATE
        assert await second.inventory("snack") == 7
    assert backend.query("SELECT deliveries FROM inbox_events WHERE id = 'order-1'") == [(2,)]


async def test_two_connections_racing_on_one_id_apply_it_once(backend: Backend) -> None:
    async with Inbox.open(backend.location) as one, Inbox.open(backend.location) as two:
        receipts = await asyncio.gather(
            *(inbox.receive(dict(EVENT)) for _ in range(10) for inbox in (one, two))
        )

    assert sorted(receipts) == sorted([Receipt.APPLIED] + [Receipt.DUPLICATE] * 19)
    assert backend.query("SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(7,)]
    assert backend.query("SELECT deliveries FROM inbox_events") == [(20,)]


# ---------------------------------------------------------------- batches


async def test_a_new_id_twice_in_one_batch_is_applied_then_duplicate_and_counted_once(
    inbox: Inbox, backend: Backend
) -> None:
    # Every ID is new to the inbox, yet the batch is not all-new: a repeats in it.
    a, b = event("a", qty=3), event("b", "juice", 5)

    receipt = await inbox.receive_batch(taken(a, b, a))

    assert [(r.receipt, r.digest) for r in receipt.received] == [
        (Receipt.APPLIED, digest(a)),
        (Receipt.APPLIED, digest(b)),
        (Receipt.DUPLICATE, digest(a)),
    ]
    assert receipt.stopped is None
    deliveries = backend.query("SELECT id, deliveries FROM inbox_events ORDER BY id")
    assert deliveries == [("a", 2), ("b", 1)]
    assert backend.ids_in_arrival_order() == ["a", "b"]
    assert stock(backend) == {"snack": 3, "juice": 5}


async def test_a_new_id_again_in_one_batch_with_another_payload_stops_the_batch_there(
    inbox: Inbox, backend: Backend
) -> None:
    a, b, c = event("a", qty=3), event("b", "juice", 5), event("c", "tea", 11)

    receipt = await inbox.receive_batch(taken(a, b, changed(a, qty=4), c))

    assert [r.receipt for r in receipt.received] == [Receipt.APPLIED, Receipt.APPLIED]
    assert isinstance(receipt.stopped, Conflict)
    assert receipt.stopped.event_id == "a"
    assert backend.ids_in_arrival_order() == ["a", "b"]
    assert backend.query("SELECT id, payload, deliveries FROM inbox_events ORDER BY id") == [
        ("a", canonical_json(a), 1),
        ("b", canonical_json(b), 1),
    ]
    assert stock(backend) == {"snack": 3, "juice": 5}


async def test_an_empty_batch_changes_nothing_and_checks_no_predecessor(
    inbox: Inbox, backend: Backend
) -> None:
    await inbox.receive(dict(EVENT))
    before = snapshot(backend)

    for after in (None, "ghost"):
        receipt = await inbox.receive_batch([], after=after)
        assert (receipt.received, receipt.stopped) == ([], None)

    assert snapshot(backend) == before


async def test_concurrent_batches_each_succeed_or_fail_on_their_own(
    inbox: Inbox, backend: Backend
) -> None:
    # With other writes in progress a backend may commit these together; each call
    # still gets its own receipts, and a conflict stops only the call it is in.
    known = event("known", "tea", 9)
    await inbox.receive_batch(taken(known))
    calls = [
        [event("a0", "apple", 1), changed(known, qty=10), event("a2", "apple", 2)],
        [event("b0", "bean", 4), known],
        [event("c0", "corn", 16), event("x", "fig", 1)],
        [event("x", "fig", 1)],
    ]

    with in_progress(inbox, 2):
        async with asyncio.timeout(5):
            got = await asyncio.gather(*(inbox.receive_batch(taken(*c)) for c in calls))

    assert [r.receipt for r in got[0].received] == [Receipt.APPLIED]
    assert got[0].stopped is not None and got[0].stopped.event_id == "known"
    assert [r.receipt for r in got[1].received] == [Receipt.APPLIED, Receipt.DUPLICATE]
    fig = sorted(r.receipt for g in got[2:] for r in g.received if r.digest == digest(calls[3][0]))
    assert fig == [Receipt.APPLIED, Receipt.DUPLICATE]  # x: applied by one, once
    assert all(g.stopped is None for g in got[1:])
    assert sorted(backend.ids_in_arrival_order()) == ["a0", "b0", "c0", "known", "x"]
    assert backend.query("SELECT deliveries FROM inbox_events WHERE id = 'known'") == [(2,)]
    assert stock(backend) == {"tea": 9, "apple": 1, "bean": 4, "corn": 16, "fig": 1}


async def test_applied_seq_is_the_order_of_first_application_and_a_duplicate_keeps_its_own(
    inbox: Inbox, backend: Backend
) -> None:
    await inbox.receive_batch(taken(event("c"), event("a")))
    await inbox.receive(event("b"))
    first_a = await inbox.record("a")
    await inbox.receive_batch(taken(event("a"), event("d"), event("c")))  # a and c again
    stopped = await inbox.receive_batch(
        taken(event("e"), event("f"), event("d", qty=2), event("g"))
    )

    assert stopped.stopped is not None and stopped.stopped.event_id == "d"
    rows = backend.query("SELECT id, applied_seq FROM inbox_events ORDER BY applied_seq")
    assert [event_id for event_id, _ in rows] == ["c", "a", "b", "d", "e", "f"]
    numbers = [number for _, number in rows]
    assert numbers[0] >= 1 and numbers == sorted(set(numbers))  # increasing, never shared
    records = {event_id: await inbox.record(event_id) for event_id, _ in rows}
    assert {i: r.applied_seq for i, r in records.items() if r is not None} == dict(rows)
    assert first_a is not None and first_a.applied_seq == dict(rows)["a"]
    assert backend.query("SELECT deliveries FROM inbox_events WHERE id = 'a'") == [(2,)]


# ---------------------------------------------------------------- lookups and predecessors


async def test_knows_says_whether_the_inbox_holds_an_event(inbox: Inbox, backend: Backend) -> None:
    assert await inbox.knows("e1") is False
    await inbox.receive_batch(taken(event("e1")))

    assert await inbox.knows("e1") is True
    assert await inbox.knows("E1") is False
    assert await inbox.knows("e2") is False
    assert backend.query("SELECT deliveries FROM inbox_events WHERE id = 'e1'") == [(1,)]


async def test_knows_finds_what_an_earlier_process_applied(backend: Backend) -> None:
    async with Inbox.open(backend.location) as first:
        await first.receive_batch(taken(event("e1")))
    async with Inbox.open(backend.location) as reopened:
        assert await reopened.knows("e1") is True
        assert await reopened.knows("e2") is False


@pytest.mark.parametrize("requests", [0, 2], ids=["alone", "shared"])
async def test_a_batch_naming_an_unknown_predecessor_raises_and_changes_nothing(
    inbox: Inbox, backend: Backend, requests: int
) -> None:
    known = event("k0", "tea", 5)
    await inbox.receive_batch(taken(known))
    before = snapshot(backend)

    with in_progress(inbox, requests):
        with pytest.raises(PredecessorMissing) as raised:
            await inbox.receive_batch(
                taken(event("n1", "tea", 1), known, event("n2", "corn", 2)), after="ghost"
            )
        assert raised.value.after == "ghost"
        with pytest.raises(PredecessorMissing):
            await inbox.receive_with_digest(incoming(event("n3")), after="ghost")

        assert snapshot(backend) == before  # not even the duplicate was counted
        receipt = await inbox.receive_batch(taken(event("n1")), after="k0")
    assert [r.receipt for r in receipt.received] == [Receipt.APPLIED]
    assert backend.ids_in_arrival_order() == ["k0", "n1"]


# ---------------------------------------------------------------- leases (Outbox-Lease)

SOURCE = "outbox-a"
SHARED = pytest.mark.parametrize("requests", [0, 2], ids=["alone", "shared"])


def lease(epoch: int, line: str = GLOBAL_LINE, source: str = SOURCE) -> Lease:
    return Lease(source, line, epoch)


def fences(backend: Backend) -> list[Row]:
    return backend.query("SELECT source, line, epoch FROM inbox_lease_fences ORDER BY source, line")


@SHARED
async def test_a_lease_epoch_is_recorded_and_raised_by_a_higher_one(
    inbox: Inbox, backend: Backend, requests: int
) -> None:
    with in_progress(inbox, requests):
        first = await inbox.receive_batch(taken(event("e1")), lease=lease(3))
        assert fences(backend) == [(SOURCE, GLOBAL_LINE, 3)]
        again = await inbox.receive_batch(taken(event("e2")), lease=lease(3))  # equal: accepted
        higher = await inbox.receive_with_digest(incoming(event("e3")), lease=lease(7))
    assert [r.receipt for r in [*first.received, *again.received, higher]] == [Receipt.APPLIED] * 3
    assert fences(backend) == [(SOURCE, GLOBAL_LINE, 7)]
    assert backend.ids_in_arrival_order() == ["e1", "e2", "e3"]


@SHARED
async def test_a_lower_epoch_is_refused_and_applies_nothing(
    inbox: Inbox, backend: Backend, requests: int
) -> None:
    await inbox.receive_batch(taken(event("e1", "tea", 2)), lease=lease(5))
    before = snapshot(backend)

    with in_progress(inbox, requests):
        with pytest.raises(StaleLease) as raised:
            await inbox.receive_batch(taken(event("e2", "tea", 4), event("e3")), lease=lease(4))
        with pytest.raises(StaleLease):
            await inbox.receive_with_digest(incoming(event("e4")), lease=lease(1))

    stale = raised.value
    assert (stale.source, stale.line, stale.epoch, stale.seen) == (SOURCE, GLOBAL_LINE, 4, 5)
    assert snapshot(backend) == before
    assert fences(backend) == [(SOURCE, GLOBAL_LINE, 5)]


@SHARED
async def test_a_stale_duplicate_is_refused_too_and_not_counted(
    inbox: Inbox, backend: Backend, requests: int
) -> None:
    await inbox.receive_batch(taken(event("e1")), lease=lease(1))
    await inbox.receive_batch(taken(event("e2")), lease=lease(2))
    before = snapshot(backend)

    with in_progress(inbox, requests), pytest.raises(StaleLease):
        await inbox.receive_batch(taken(event("e1")), lease=lease(1))  # applied before, by epoch 1

    assert snapshot(backend) == before  # deliveries not counted
    receipt = await inbox.receive_batch(taken(event("e1")), lease=lease(2))
    assert [r.receipt for r in receipt.received] == [Receipt.DUPLICATE]


async def test_lines_and_sources_are_fenced_apart(inbox: Inbox, backend: Backend) -> None:
    await inbox.receive_batch(taken(event("a1", "apple")), lease=lease(9, "apple"))
    await inbox.receive_batch(taken(event("g1")), lease=lease(9))
    # A lower epoch on another line of the same source, or on the same line of
    # another source, is that line's first.
    await inbox.receive_batch(taken(event("b1", "bean")), lease=lease(2, "bean"))
    await inbox.receive_batch(taken(event("a2", "apple")), lease=lease(1, "apple", "outbox-b"))
    with pytest.raises(StaleLease):
        await inbox.receive_batch(taken(event("a3", "apple")), lease=lease(8, "apple"))

    assert fences(backend) == [
        (SOURCE, GLOBAL_LINE, 9),
        (SOURCE, "apple", 9),
        (SOURCE, "bean", 2),
        ("outbox-b", "apple", 1),
    ]
    assert sorted(backend.ids_in_arrival_order()) == ["a1", "a2", "b1", "g1"]


@SHARED
async def test_a_request_without_a_lease_is_not_checked(
    inbox: Inbox, backend: Backend, requests: int
) -> None:
    await inbox.receive_batch(taken(event("e1")), lease=lease(5))
    with in_progress(inbox, requests):
        receipt = await inbox.receive_batch(taken(event("e2"), event("e1")))
    assert [r.receipt for r in receipt.received] == [Receipt.APPLIED, Receipt.DUPLICATE]
    assert fences(backend) == [(SOURCE, GLOBAL_LINE, 5)]


@SHARED
async def test_a_stale_lease_is_refused_before_a_missing_predecessor(
    inbox: Inbox, backend: Backend, requests: int
) -> None:
    await inbox.receive_batch(taken(event("e1")), lease=lease(2))
    with in_progress(inbox, requests):
        with pytest.raises(StaleLease):
            await inbox.receive_batch(taken(event("e2")), after="ghost", lease=lease(1))
        with pytest.raises(PredecessorMissing):
            await inbox.receive_batch(taken(event("e2")), after="ghost", lease=lease(2))
        receipt = await inbox.receive_batch(taken(event("e2")), after="e1", lease=lease(2))
    assert [r.receipt for r in receipt.received] == [Receipt.APPLIED]
    assert backend.ids_in_arrival_order() == ["e1", "e2"]


async def test_concurrent_calls_of_one_line_apply_no_lower_epoch_after_a_higher_one(
    inbox: Inbox, backend: Backend
) -> None:
    # Calls in progress together may be committed together (a group commit); each
    # gets its own outcome, and none of epoch 4 is applied after one of epoch 5.
    calls = [(f"e{n}", 4 + n % 2) for n in range(12)]
    with in_progress(inbox, len(calls)):
        async with asyncio.timeout(5):
            got = await asyncio.gather(
                *(inbox.receive_batch(taken(event(i)), lease=lease(e)) for i, e in calls),
                return_exceptions=True,
            )

    applied = {
        i
        for (i, _), outcome in zip(calls, got, strict=True)
        if not isinstance(outcome, BaseException)
    }
    refused = [o for o in got if isinstance(o, BaseException)]
    assert refused, "every call applied: the epochs were not compared"
    assert all(isinstance(o, StaleLease) and (o.epoch, o.seen) == (4, 5) for o in refused)
    order = backend.ids_in_arrival_order()
    assert sorted(order) == sorted(applied)
    epochs = [dict(calls)[i] for i in order]
    assert epochs == sorted(epochs), order  # every 4 before every 5
    assert fences(backend) == [(SOURCE, GLOBAL_LINE, 5)]


async def test_the_location_is_where_it_was_opened(inbox: Inbox, backend: Backend) -> None:
    assert inbox.location == backend.location


# ---------------------------------------------------------------- beside the user's own tables

# Tables a user's database may hold already, with the names an inbox could have
# wanted and shapes of the user's own: the inbox's tables are named inbox_...
USERS_OWN = (
    "CREATE TABLE inbox (message TEXT PRIMARY KEY, body TEXT)",
    "CREATE TABLE inventory (item TEXT, count INTEGER)",
    "CREATE TABLE orders (n INTEGER PRIMARY KEY, total INTEGER)",
    "CREATE TABLE health (probe TEXT)",
    "INSERT INTO inbox VALUES ('m-1', 'hello')",
    "INSERT INTO inventory VALUES ('snack', 40)",
    "INSERT INTO orders VALUES (1, 999)",
)


async def test_the_inbox_opens_beside_the_users_own_tables_and_leaves_them_alone(
    backend: Backend,
) -> None:
    backend.execute(*USERS_OWN)
    sqlite = isinstance(backend, SqliteBackend)
    if sqlite:  # a setting of the user's file, which the inbox does not use
        backend.execute("PRAGMA user_version = 7")
    async with Inbox.open(backend.location) as inbox:
        assert await inbox.receive(event("o-1", "snack", 2)) is Receipt.APPLIED
        assert await inbox.receive(dict(EVENT)) is Receipt.APPLIED
        assert await inbox.inventory("snack") == 2 + EVENT["data"]["qty"]
        assert await inbox.count() == 2
    async with Inbox.open(backend.location) as inbox:  # opened again: nothing to migrate
        assert await inbox.receive(event("o-1", "snack", 2)) is Receipt.DUPLICATE
    assert backend.query("SELECT message, body FROM inbox") == [("m-1", "hello")]
    assert backend.query("SELECT item, count FROM inventory") == [("snack", 40)]
    assert backend.query("SELECT n, total FROM orders") == [(1, 999)]
    assert backend.query("SELECT probe FROM health") == []
    assert backend.query("SELECT sku, qty FROM inbox_inventory") == [("snack", 9)]
    assert sorted(row[0] for row in backend.query("SELECT id FROM inbox_events")) == sorted(
        ["o-1", EVENT["id"]]
    )
    if sqlite:
        assert backend.query("PRAGMA user_version") == [(7,)]


# ---------------------------------------------------------------- the seam

DEFINED_BY_THE_INTERFACE = ("Received", "BatchReceipt", "InboxRecord", "Inbox")

# Imports every sink module but the backends, in a fresh interpreter, and names the
# storage modules that came with them.
_LOADED_WITH_THE_SINK = """
import importlib, json, pkgutil, sys
import sink
for module in pkgutil.iter_modules(sink.__path__):
    if module.name not in ("backends", "__main__"):
        importlib.import_module("sink." + module.name)
storage = ("sink.backends", "sqlite_tx", "aiosqlite", "sqlite3", "pg_tx", "psycopg", "psycopg_pool")
loaded = [m for m in sys.modules if any(m == s or m.startswith(s + ".") for s in storage)]
print(json.dumps(sorted(loaded)))
"""


def test_the_rows_are_defined_by_the_interface() -> None:
    defined_elsewhere = {
        name: getattr(sink.store, name).__module__
        for name in DEFINED_BY_THE_INTERFACE
        if getattr(sink.store, name).__module__ != "sink.store"
    }
    assert defined_elsewhere == {}


def test_the_sink_loads_no_backend_until_it_opens_one() -> None:
    assert json_of_python(_LOADED_WITH_THE_SINK) == []


# ------------------------------------------------------------------ writability probe


async def test_check_writable_returns_while_the_database_takes_writes(
    inbox: Inbox, backend: Backend
) -> None:
    started = time.monotonic()
    for _ in range(20):
        assert await inbox.check_writable() is None
    assert time.monotonic() - started < 2.0  # cheap enough for a probe every second
    assert not backend.others_cannot_write()
    assert await inbox.receive(event("a", qty=3)) is Receipt.APPLIED
    assert stock(backend) == {"snack": 3}


@pytest.mark.parametrize("fault", FAULTS)
async def test_check_writable_raises_while_the_database_cannot_be_written(
    inbox: Inbox, backend: Backend, fault: Fault
) -> None:
    assert await inbox.receive(event("a", qty=3)) is Receipt.APPLIED
    with backend.unwritable(fault):
        assert backend.others_cannot_write()  # the fault is real
        with pytest.raises(StorageError) as failed:
            await inbox.check_writable()
        assert str(failed.value).strip()
    # Fixed: the probe says so at once, and the inbox takes writes again.
    assert await inbox.check_writable() is None
    assert await inbox.receive(event("b", qty=4)) is Receipt.APPLIED
    assert stock(backend) == {"snack": 7}


@pytest.mark.parametrize("writes", [("INSERT",), ("UPDATE",)])
async def test_a_trial_of_the_real_writes_fails_while_they_fail_and_keeps_nothing(
    inbox: Inbox, backend: Backend, writes: tuple[Write, ...]
) -> None:
    # What readiness asks once a real write failed: the probe's own row passes while a
    # trigger refuses every write to the inbox's table, this must not.
    assert await inbox.receive(event("a", qty=3)) is Receipt.APPLIED
    before = snapshot(backend)
    await inbox.check_real_writes()
    with backend.refusing("inbox_events", writes, "real writes refused"):
        await inbox.check_writable()  # the probe's row is still writable
        with pytest.raises(StorageError, match="real writes refused"):
            await inbox.check_real_writes()
    await inbox.check_real_writes()
    assert snapshot(backend) == before
