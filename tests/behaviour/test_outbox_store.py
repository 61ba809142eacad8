"""The behaviour every outbox backend must show, whatever it stores in.

Each test runs once per backend in `outbox_backends.BACKENDS`: it gets an outbox opened
with `Outbox.open(location)` and checks what reached the tables through a connection
of its own (`backend.query`). What only one backend has (SQLite's WAL, locks, group
commit, query plans) is tested in tests/integration with that backend.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from outbox_backends import BACKENDS, FAULTS, Backend, Fault, SqliteBackend
from support import accept, event, json_of_python, pending_ids, placed

import publisher.store
from plumbing.storage import BadLocation, StorageError
from publisher import (
    MAX_BATCH,
    NotInTransaction,
    Schemas,
    UnknownEntry,
    accept_in,
    dispatch,
    event_check,
    publish_in,
    publish_in_async,
)
from publisher.errors import (
    DeliveryError,
    InvalidTransition,
    LeaseLost,
    OutboxError,
    RelayAlreadyRunning,
)
from publisher.store import Mark, Outbox, State
from shared import (
    GLOBAL_LINE,
    Conflict,
    Event,
    InvalidEvent,
    Lease,
    Receipt,
    canonical_json,
    checked_event,
    digest_of,
    make_ack,
)

ACK = {"ack": "x", "status": "applied"}
# sent_at and quarantined_at come from time.time(); a short pause keeps them apart.
TICK_S = 0.01


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    with BACKENDS[request.param](request) as opened:
        yield opened


@pytest.fixture
async def outbox(backend: Backend) -> AsyncIterator[Outbox]:
    async with Outbox.open(backend.location) as opened:
        yield opened


order = partial(event, qty=7)  # the orders of these tests: qty 7 unless said
placed_event = partial(placed, qty=7)  # the order.placed event `order(...)` is recorded as


def contents(backend: Backend) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the four tables intake and prune write, in a fixed order, and each
    entry's canonical event wherever the backend keeps it."""
    payloads = f"SELECT seq, {backend.entry_payload} FROM outbox_entries ORDER BY seq"
    return {
        "outbox_orders": backend.query("SELECT * FROM outbox_orders ORDER BY id"),
        "outbox_entries": backend.query("SELECT * FROM outbox_entries ORDER BY seq"),
        "payloads": backend.query(payloads),
        "outbox_pruned": backend.query("SELECT * FROM outbox_pruned ORDER BY id"),
        "outbox_quarantines": backend.query("SELECT * FROM outbox_quarantines ORDER BY n"),
    }


def count(backend: Backend, table: str) -> int:
    n: int = backend.query(f"SELECT count(*) FROM {table}")[0][0]
    return n


def unsent(backend: Backend) -> list[str]:
    return [
        i
        for i, sent in backend.query("SELECT id, sent FROM outbox_entries ORDER BY seq")
        if not sent
    ]


def states(backend: Backend) -> dict[str, tuple[int, int]]:
    """id -> (sent, quarantined)."""
    return {
        i: (s, q) for i, s, q in backend.query("SELECT id, sent, quarantined FROM outbox_entries")
    }


def seqs(backend: Backend) -> dict[str, int]:
    return dict(backend.query("SELECT id, seq FROM outbox_entries"))


# ---------------------------------------------------------------- opening


async def test_reopening_keeps_the_data(backend: Backend) -> None:
    async with Outbox.open(backend.location) as outbox:
        await outbox.accept(order("a"))
        await outbox.accept(order("b"))
        await outbox.mark_sent("a")
    async with Outbox.open(backend.location) as outbox:
        assert await outbox.pending() == [placed_event("b")]
        assert await outbox.accept(order("a")) == "duplicate"
    assert count(backend, "outbox_orders") == 2


async def test_opened_not_to_create_it_refuses_where_there_is_no_outbox(backend: Backend) -> None:
    # What the commands that read or change an outbox open it with: a mistyped path or
    # schema is an error, not an empty outbox made there and reported as such.
    with pytest.raises(BadLocation, match="serve and accept"):
        async with Outbox.open(backend.location, create=False):
            pass
    async with Outbox.open(backend.location) as outbox:
        await accept(outbox, "a")
    async with Outbox.open(backend.location, create=False) as outbox:
        assert [event["id"] for event in await outbox.pending()] == ["a"]


async def test_the_seq_of_a_deleted_entry_is_never_given_again(
    outbox: Outbox, backend: Backend
) -> None:
    await outbox.accept(order("a"))
    await outbox.accept(order("b"))
    backend.execute("DELETE FROM outbox_entries WHERE id = 'b'")
    await outbox.accept(order("c"))
    by_id = seqs(backend)
    assert by_id["c"] > by_id["a"] + 1  # the seq of the deleted entry is never reused


# Tables a user's database may hold already, under names the outbox's tables once had
# and with shapes of the user's own (`outbox` with three of the four columns an
# earlier release's had): the outbox's tables are named outbox_..., and leave them be.
USERS_OWN = (
    "CREATE TABLE orders (n INTEGER PRIMARY KEY, total INTEGER NOT NULL)",
    "CREATE TABLE outbox (seq INTEGER PRIMARY KEY, payload TEXT, sent INTEGER)",
    "CREATE TABLE quarantines (reason TEXT)",
    "CREATE TABLE health (probe TEXT)",
    "INSERT INTO orders (n, total) VALUES (1, 999)",
    "INSERT INTO outbox (seq, payload, sent) VALUES (1, 'mail the invoice', 0)",
)


async def test_the_outbox_opens_beside_the_users_own_tables_and_leaves_them_alone(
    backend: Backend,
) -> None:
    backend.execute(*USERS_OWN)
    sqlite = isinstance(backend, SqliteBackend)
    if sqlite:  # a setting of the user's file, which the outbox does not use
        backend.execute("PRAGMA user_version = 7")
    async with Outbox.open(backend.location) as outbox:
        await outbox.check_writable()
        assert await outbox.accept(order("a")) == "accepted"
        with backend.user_connection() as conn:  # the user's row and its event, together
            conn.execute("INSERT INTO orders (n, total) VALUES (2, 42)")
            assert publish_in(conn, PAYMENT) == "accepted"
            conn.commit()
        assert await outbox.pending() == [placed_event("a"), PAYMENT]
        await outbox.mark_sent("a", ACK)
    async with Outbox.open(backend.location) as outbox:  # opened again: nothing to migrate
        assert await outbox.pending() == [PAYMENT]
        assert [entry.id for entry in await outbox.entries(State.SENT)] == ["a"]
        assert await outbox.accept(order("a")) == "duplicate"
    assert backend.query("SELECT n, total FROM orders ORDER BY n") == [(1, 999), (2, 42)]
    assert backend.query("SELECT * FROM outbox") == [(1, "mail the invoice", 0)]
    assert backend.query("SELECT * FROM quarantines") == []
    assert backend.query("SELECT * FROM health") == []
    assert backend.query("SELECT id, sku, qty FROM outbox_orders") == [("a", "snack", 7)]
    assert backend.query("SELECT id FROM outbox_entries ORDER BY seq") == [("a",), ("pay-1",)]
    if sqlite:
        assert backend.query("PRAGMA user_version") == [(7,)]


# ---------------------------------------------------------------- accept (orders)


async def test_accept_writes_the_order_and_its_order_placed_entry(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.accept(order("a", "snack", qty=7)) == "accepted"
    assert backend.query("SELECT id, sku, qty FROM outbox_orders") == [("a", "snack", 7)]
    assert backend.query("SELECT id, type, lane, payload, sent FROM outbox_entries") == [
        (
            "a",
            "order.placed",
            "snack",
            '{"data":{"qty":7,"sku":"snack"},"id":"a","key":"snack","type":"order.placed"}',
            0,
        )
    ]
    assert await outbox.pending() == [placed("a", "snack", 7)]


async def test_same_payload_again_is_a_harmless_duplicate(outbox: Outbox, backend: Backend) -> None:
    assert await outbox.accept(order("a")) == "accepted"
    before = contents(backend)
    assert await outbox.accept(order("a")) == "duplicate"
    assert await outbox.accept({"qty": 7, "sku": "snack", "id": "a"}) == "duplicate"
    assert contents(backend) == before
    assert (count(backend, "outbox_orders"), count(backend, "outbox_entries")) == (1, 1)


async def test_duplicate_of_a_sent_entry_does_not_queue_it_again(
    outbox: Outbox, backend: Backend
) -> None:
    await outbox.accept(order("a"))
    await outbox.mark_sent("a")
    assert await outbox.accept(order("a")) == "duplicate"
    assert await outbox.pending() == []
    assert unsent(backend) == []


@pytest.mark.parametrize("changed", [order("a", qty=8), order("a", sku="other")])
async def test_same_id_with_another_payload_is_a_conflict(
    outbox: Outbox, backend: Backend, changed: dict[str, Any]
) -> None:
    await outbox.accept(order("a"))
    before = contents(backend)
    with pytest.raises(Conflict) as excinfo:
        await outbox.accept(changed)
    assert excinfo.value.event_id == "a"
    assert contents(backend) == before


def store_payload(backend: Backend, event_id: str, payload: str) -> None:
    """Write an entry's payload by hand (its order row left as it is; no single quote in it)."""
    backend.execute(f"UPDATE outbox_entries SET payload = '{payload}' WHERE id = '{event_id}'")


async def test_a_known_id_is_judged_by_the_payload_the_outbox_stored_not_its_order_row(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "a", "b", qty=7)
    # Written by hand: the entries hold qty 8 while their order rows still say 7.
    for event_id in ("a", "b"):
        store_payload(backend, event_id, canonical_json(placed_event(event_id, qty=8)))
    known = "SELECT * FROM outbox_orders WHERE id IN ('a', 'b') ORDER BY id"
    entries = "SELECT * FROM outbox_entries WHERE id IN ('a', 'b') ORDER BY id"
    before = (backend.query(known), backend.query(entries))

    assert await outbox.accept(order("a", qty=8)) == "duplicate"
    with pytest.raises(Conflict):
        await outbox.accept(order("a", qty=7))
    outcomes = await outbox.accept_many([order("b", qty=8), order("b", qty=7), order("c")])
    assert outcomes[0] == "duplicate" and isinstance(outcomes[1], Conflict)
    assert outcomes[2] == "accepted"
    together = await asyncio.gather(
        *(outbox.accept(order("a", qty=qty)) for qty in (8, 7)),
        outbox.accept(order("d")),
        return_exceptions=True,
    )
    assert together[0] == "duplicate" and isinstance(together[1], Conflict)
    assert together[2] == "accepted"
    assert (backend.query(known), backend.query(entries)) == before


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
async def test_an_invalid_order_is_refused_and_changes_nothing(
    outbox: Outbox, backend: Backend, event: object, field: str
) -> None:
    await outbox.accept(order("existing"))
    before = contents(backend)
    with pytest.raises(InvalidEvent) as excinfo:
        await outbox.accept(event)
    assert excinfo.value.field == field
    assert contents(backend) == before


async def test_accept_stores_a_copy_not_the_callers_object(
    outbox: Outbox, backend: Backend
) -> None:
    event = order("a")
    await outbox.accept(event)
    event["qty"] = 99
    assert await outbox.pending() == [placed_event("a")]
    assert backend.query("SELECT qty FROM outbox_orders") == [(7,)]


async def test_accept_is_atomic_when_the_outbox_insert_fails(
    outbox: Outbox, backend: Backend
) -> None:
    with backend.refusing_inserts("outbox_entries", "boom"):
        with pytest.raises(StorageError, match="boom"):
            await outbox.accept(order("a"))
        assert backend.query("SELECT * FROM outbox_orders WHERE id = 'a'") == []
        assert count(backend, "outbox_entries") == 0

    assert await outbox.accept(order("a")) == "accepted"
    assert (count(backend, "outbox_orders"), count(backend, "outbox_entries")) == (1, 1)


async def test_accept_is_atomic_when_the_order_insert_fails(
    outbox: Outbox, backend: Backend
) -> None:
    with backend.refusing_inserts("outbox_orders", "no orders"), pytest.raises(StorageError):
        await outbox.accept(order("a"))
    assert (count(backend, "outbox_orders"), count(backend, "outbox_entries")) == (0, 0)


# ---------------------------------------------------------------- many orders at once


def accepted_rows(backend: Backend) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(id, sku, qty) of every order, and (id, payload) of every entry in seq order."""
    return (
        backend.query("SELECT id, sku, qty FROM outbox_orders ORDER BY id"),
        backend.query("SELECT id, payload FROM outbox_entries ORDER BY seq"),
    )


async def test_accept_many_answers_each_order_in_its_order_and_records_only_the_good_ones(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "known")
    outcomes = await outbox.accept_many(
        [
            order("a"),
            {"id": "known", "sku": "snack", "qty": 1},  # as accepted before
            {"id": "known", "sku": "snack", "qty": 2},  # another payload
            {"id": "b", "sku": "snack", "qty": True},  # not an integer here
            order("c", "tea", qty=3),
            order("a"),  # again in the same call: as a second call would find it
            order("c", "tea", qty=4),
            ["not", "an", "object"],
        ]
    )
    assert outcomes[:2] == ["accepted", "duplicate"]
    assert isinstance(outcomes[2], Conflict) and outcomes[2].event_id == "known"
    assert isinstance(outcomes[3], InvalidEvent) and outcomes[3].field == "qty"
    assert outcomes[4:6] == ["accepted", "duplicate"]
    assert isinstance(outcomes[6], Conflict) and outcomes[6].event_id == "c"
    assert isinstance(outcomes[7], InvalidEvent) and outcomes[7].field == "event"
    assert accepted_rows(backend) == (
        [("a", "snack", 7), ("c", "tea", 3), ("known", "snack", 1)],
        [
            ("known", canonical_json(placed("known", qty=1))),
            ("a", canonical_json(placed_event("a"))),
            ("c", canonical_json(placed("c", "tea", qty=3))),
        ],
    )


async def test_accept_many_of_the_most_orders_keeps_their_order(
    outbox: Outbox, backend: Backend
) -> None:
    ids = [f"o{n}" for n in range(publisher.store.MAX_ACCEPT)]
    random_order = random.Random(16).sample(ids, len(ids))  # not the ID text order
    outcomes = await outbox.accept_many([order(i, qty=1) for i in random_order])
    assert outcomes == ["accepted"] * len(ids)
    assert [row[0] for row in accepted_rows(backend)[1]] == random_order


async def test_accept_many_of_nothing_writes_nothing(outbox: Outbox, backend: Backend) -> None:
    assert await outbox.accept_many([]) == []
    only_invalid = await outbox.accept_many([{"id": "a"}, 7])
    assert [type(outcome) for outcome in only_invalid] == [InvalidEvent, InvalidEvent]
    assert accepted_rows(backend) == ([], [])


async def test_accept_many_refuses_more_than_the_most_and_writes_nothing(
    outbox: Outbox, backend: Backend
) -> None:
    too_many = [order(f"o{n}") for n in range(publisher.store.MAX_ACCEPT + 1)]
    with pytest.raises(ValueError, match="at most 500"):
        await outbox.accept_many(too_many)
    assert accepted_rows(backend) == ([], [])


async def test_accept_many_writes_nothing_when_the_database_refuses_one_order(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "known")
    before = contents(backend)
    with backend.refusing_inserts("outbox_entries", "boom"):
        with pytest.raises(StorageError, match="boom"):
            # Each order inserts its order row before its entry: none may be left.
            await outbox.accept_many([order("a"), order("known", qty=1), order("b")])
        assert contents(backend) == before
    assert await outbox.accept_many([order("a"), order("b")]) == ["accepted", "accepted"]


# ---------------------------------------------------------------- concurrent intake


async def test_concurrent_accepts_fail_alone_and_the_others_are_durable(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "known")
    calls: list[object] = [order(f"c{n}", qty=1) for n in range(24)]
    calls[5] = {"id": "known", "sku": "snack", "qty": 2}  # a conflict
    calls[11] = {"id": "bad", "sku": "snack", "qty": 0}  # invalid
    calls[17] = order("known", qty=1)  # a duplicate
    results = await asyncio.gather(*(outbox.accept(c) for c in calls), return_exceptions=True)
    assert isinstance(results[5], Conflict) and results[5].event_id == "known"
    assert isinstance(results[11], InvalidEvent) and results[11].field == "qty"
    assert results[17] == "duplicate"
    good = [n for n in range(len(calls)) if n not in (5, 11, 17)]
    assert [results[n] for n in good] == ["accepted"] * len(good)
    # Read by a connection of the test's own: each accepted order and its entry, in
    # the order the calls were made.
    entries = [row[0] for row in accepted_rows(backend)[1]]
    assert entries == ["known", *(f"c{n}" for n in good)]
    assert count(backend, "outbox_orders") == len(good) + 1


async def test_concurrent_accepts_and_batches_all_fail_when_storage_fails_and_write_nothing(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "known")
    before = contents(backend)
    with backend.refusing_inserts("outbox_entries", "boom"):
        results = await asyncio.gather(
            *(outbox.accept(order(f"c{n}")) for n in range(8)),
            outbox.accept_many([order("m0"), order("m1")]),
            return_exceptions=True,
        )
        assert all(isinstance(r, StorageError) and "boom" in str(r) for r in results), results
        assert contents(backend) == before
    results = await asyncio.gather(*(outbox.accept(order(f"c{n}")) for n in range(8)))
    assert results == ["accepted"] * 8


async def test_concurrent_calls_naming_one_new_id_accept_it_once(
    outbox: Outbox, backend: Backend
) -> None:
    """Concurrent calls naming the same new ID: exactly one is accepted, the same
    payload again is a duplicate, another payload a conflict."""
    results = await asyncio.gather(
        outbox.accept(order("a")),
        outbox.accept(order("a")),
        outbox.accept(order("a", qty=9)),
        outbox.accept_many([order("a"), order("b")]),
        return_exceptions=True,
    )
    assert results[:2] == ["accepted", "duplicate"]
    assert isinstance(results[2], Conflict)
    assert results[3] == ["duplicate", "accepted"]
    assert accepted_rows(backend)[0] == [("a", "snack", 7), ("b", "snack", 7)]


# ---------------------------------------------------------------- events of any type

# Events of several types and shapes, each of its own ID: what it shows -> the event.
EVENTS: dict[str, dict[str, Any]] = {
    "keyed": {
        "id": "pay-1",
        "type": "payment.captured",
        "key": "customer-9",
        "data": {"amount_cents": 1999, "currency": "EUR"},
    },
    "keyless": {"id": "news-1", "type": "newsletter.sent", "data": {}},
    "nested": {
        "id": "ship-1",
        "type": "shipment.packed",
        "key": "customer-9",
        "data": {
            "items": [{"sku": "tea", "qty": 2, "tags": ["fragile", None, True, False]}],
            "to": {"city": "Z\u00fcrich", "lines": [], "at": {"lat": 47.37, "lon": 8.54}},
        },
    },
    "unicode": {
        "id": "note-1",
        "type": "note.added",
        "key": "customer-7",
        "data": {
            "text": "caf\u00e9 \U0001f600 \u2028\x7f",  # written as they are
            "escaped": '\x00\x1f\n\t"\\/',  # controls, quote and backslash: escaped
            "\U0001f600": "astral key",  # keys sort by UTF-16 code units: before U+FB01
            "\ufb01": "BMP key",
        },
    },
    "floats": {
        "id": "read-1",
        "type": "reading.taken",
        "data": {"values": [0.1, 1e21, 1e-7, -0.0, 100.0, 5e-324, 1.7976931348623157e308]},
    },
    # Large enough that a SQLite outbox keeps it apart from its entry's row.
    "large": {
        "id": "doc-1",
        "type": "document.stored",
        "key": "customer-9",
        "data": {
            "pages": [
                {"n": n, "text": f"Seite {n}: gr\u00fc\u00dfe, \u00e9t\u00e9 " * 40}
                for n in range(6)
            ],
            "meta": {"lang": "de", "sizes": list(range(50))},
        },
    },
}
# RFC 8785 text of two of them, written out: the number forms and key order of the
# standard, not of json.dumps.
CANONICAL = {
    "unicode": '{"data":{"escaped":"\\u0000\\u001f\\n\\t\\"\\\\/",'
    '"text":"caf\u00e9 \U0001f600 \u2028\x7f","\U0001f600":"astral key","\ufb01":"BMP key"},'
    '"id":"note-1","key":"customer-7","type":"note.added"}',
    "floats": '{"data":{"values":[0.1,1e+21,1e-7,0,100,5e-324,1.7976931348623157e+308]},'
    '"id":"read-1","type":"reading.taken"}',
}


def entry_rows(backend: Backend) -> list[tuple[Any, ...]]:
    """(id, type, lane, payload) of every entry, in seq order."""
    payload = backend.entry_payload
    return backend.query(f"SELECT id, type, lane, {payload} FROM outbox_entries ORDER BY seq")


def stored(*events: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What entry_rows reads for `events` recorded in this order: each event's type,
    its key or "*" for none, and its canonical text."""
    return [(e["id"], e["type"], e.get("key", GLOBAL_LINE), canonical_json(e)) for e in events]


@pytest.mark.parametrize("shape", list(EVENTS))
async def test_publish_stores_the_canonical_text_and_reads_back_the_event(
    outbox: Outbox, backend: Backend, shape: str
) -> None:
    one = EVENTS[shape]
    given = copy.deepcopy(one)
    assert await outbox.publish(given) == "accepted"
    given["data"]["changed"] = True  # after the call: what was recorded stays as it was

    assert entry_rows(backend) == stored(one)
    if shape in CANONICAL:
        assert entry_rows(backend)[0][3] == CANONICAL[shape]
    assert await outbox.pending() == [one]
    [row] = await outbox.pending_batch(16)
    entry = await outbox.entry(one["id"])
    assert entry is not None
    assert (row.event, row.lane) == (entry.event, entry.lane) == (one, one.get("key", "*"))
    assert count(backend, "outbox_orders") == 0  # an event is not an order: no order row
    assert await outbox.publish(one) == "duplicate"


# How intake may be asked to record several events: what each way returns.
async def publish_one_by_one(outbox: Outbox, events: list[Any]) -> list[Any]:
    outcomes: list[Any] = []
    for one in events:
        try:
            outcomes.append(await outbox.publish(one))
        except (Conflict, InvalidEvent) as exc:
            outcomes.append(exc)
    return outcomes


async def publish_in_one_call(outbox: Outbox, events: list[Any]) -> list[Any]:
    return await outbox.publish_many(events)


async def publish_concurrently(outbox: Outbox, events: list[Any]) -> list[Any]:
    calls = (outbox.publish(one) for one in events)
    return list(await asyncio.gather(*calls, return_exceptions=True))


PUBLISH_WAYS = {
    "one by one": publish_one_by_one,
    "in one call": publish_in_one_call,
    "concurrently": publish_concurrently,
}


@pytest.mark.parametrize("way", list(PUBLISH_WAYS))
async def test_events_published_together_keep_their_order_types_lanes_and_text(
    outbox: Outbox, backend: Backend, way: str
) -> None:
    events = list(EVENTS.values())
    assert await PUBLISH_WAYS[way](outbox, events) == ["accepted"] * len(events)
    assert entry_rows(backend) == stored(*events)
    payloads = {row[0]: row[3] for row in entry_rows(backend)}
    assert payloads["note-1"] == CANONICAL["unicode"]
    assert payloads["read-1"] == CANONICAL["floats"]
    assert await outbox.pending(len(events)) == events
    assert count(backend, "outbox_orders") == 0


# The event that the duplicate and conflict cases start from.
PAYMENT: dict[str, Any] = {
    "id": "pay-1",
    "type": "payment.captured",
    "key": "customer-9",
    "data": {
        "amount_cents": 1999,
        "lines": [{"sku": "tea", "qty": 2}, {"sku": "cup", "qty": 1}],
        "note": None,
    },
}
KEYLESS: dict[str, Any] = {"id": "news-1", "type": "newsletter.sent", "data": {"issue": 12}}


def with_data(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """`base` with these fields of its data changed (or added)."""
    return {**base, "data": {**base["data"], **changes}}


def without(base: dict[str, Any], name: str) -> dict[str, Any]:
    """`base` without its field `name`."""
    return {field: value for field, value in base.items() if field != name}


# The same canonical event as PAYMENT, written otherwise: what each shows -> the event.
SAME_AS_PAYMENT = {
    "fields and data keys in another order": {
        "data": {
            "note": None,
            "lines": [{"qty": 2, "sku": "tea"}, {"qty": 1, "sku": "cup"}],
            "amount_cents": 1999,
        },
        "key": "customer-9",
        "type": "payment.captured",
        "id": "pay-1",
    },
    # I-JSON numbers are doubles: 1999.0 is the number 1999, and its RFC 8785 text.
    "an integral float": with_data(PAYMENT, amount_cents=1999.0),
}

# An event with a known ID and anything else different: (the event recorded first,
# the one that comes next). Each changes the type, the key or the data only.
CHANGES = {
    "type": (PAYMENT, {**PAYMENT, "type": "payment.refunded"}),
    "type in another case": (PAYMENT, {**PAYMENT, "type": "Payment.captured"}),
    "key": (PAYMENT, {**PAYMENT, "key": "customer-8"}),
    "key left out": (PAYMENT, without(PAYMENT, "key")),
    "key given": (KEYLESS, {**KEYLESS, "key": "customer-9"}),
    "data value": (PAYMENT, with_data(PAYMENT, amount_cents=2000)),
    "data value as a string": (PAYMENT, with_data(PAYMENT, amount_cents="1999")),
    "data value nested": (
        PAYMENT,
        with_data(PAYMENT, lines=[{"sku": "tea", "qty": 3}, {"sku": "cup", "qty": 1}]),
    ),
    "data array order": (PAYMENT, with_data(PAYMENT, lines=PAYMENT["data"]["lines"][::-1])),
    "data field added": (KEYLESS, with_data(KEYLESS, extra=None)),
    "data field left out": (PAYMENT, {**PAYMENT, "data": without(PAYMENT["data"], "note")}),
    "data emptied": (KEYLESS, {**KEYLESS, "data": {}}),
}


@pytest.mark.parametrize("how", list(SAME_AS_PAYMENT))
async def test_the_same_canonical_event_again_is_a_duplicate_however_it_is_written(
    outbox: Outbox, backend: Backend, how: str
) -> None:
    assert await outbox.publish(PAYMENT) == "accepted"
    before = contents(backend)
    again = SAME_AS_PAYMENT[how]
    for way in PUBLISH_WAYS.values():
        assert await way(outbox, [again, again]) == ["duplicate", "duplicate"]
    assert contents(backend) == before
    assert await outbox.pending() == [PAYMENT]


@pytest.mark.parametrize("change", list(CHANGES))
async def test_a_known_id_with_another_type_key_or_data_is_a_conflict_that_changes_nothing(
    outbox: Outbox, backend: Backend, change: str
) -> None:
    first, changed = CHANGES[change]
    assert await outbox.publish(first) == "accepted"
    before = contents(backend)
    with pytest.raises(Conflict) as refused:
        await outbox.publish(changed)
    assert refused.value.event_id == first["id"]
    for way in PUBLISH_WAYS.values():
        outcomes = await way(outbox, [changed, first])
        assert isinstance(outcomes[0], Conflict) and outcomes[1] == "duplicate", way
    assert contents(backend) == before
    assert await outbox.pending() == [first]


async def test_publish_many_answers_each_event_in_its_order_and_records_only_the_good_ones(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.publish(PAYMENT) == "accepted"
    nested, keyless = EVENTS["nested"], EVENTS["keyless"]
    bad: dict[str, Any] = {"id": "bad", "type": "t", "data": {}}
    outcomes = await outbox.publish_many(
        [
            keyless,
            PAYMENT,  # as recorded before
            {**PAYMENT, "key": "customer-8"},  # another key
            with_data(bad, lines=[{"qty": 1}, {"qty": 2**53}]),  # past I-JSON's integers
            with_data(bad, **{"a/b": {"c~d": float("nan")}}),  # not a JSON number
            with_data(bad, s="\ud800"),  # a lone surrogate is not text
            {**bad, "key": GLOBAL_LINE},  # "*" is the lane of events without a key
            {**bad, "type": "no spaces"},
            {**bad, "data": ["an", "array"]},
            {**bad, "extra": 1},
            without(bad, "type"),
            "not an object",
            nested,
            keyless,  # again in the same call: as a second call would find it
            {**nested, "type": "shipment.sent"},
        ]
    )
    assert outcomes[:2] == ["accepted", "duplicate"]
    assert isinstance(outcomes[2], Conflict) and outcomes[2].event_id == "pay-1"
    refused = outcomes[3:12]
    assert all(isinstance(outcome, InvalidEvent) for outcome in refused), refused
    assert [outcome.field for outcome in refused] == [  # type: ignore[union-attr]
        "/data/lines/1/qty",
        "/data/a~1b/c~0d",
        "/data/s",
        "/key",
        "/type",
        "/data",
        "/extra",
        "/type",
        "",
    ]
    assert outcomes[12:14] == ["accepted", "duplicate"]
    assert isinstance(outcomes[14], Conflict) and outcomes[14].event_id == "ship-1"
    assert entry_rows(backend) == stored(PAYMENT, keyless, nested)


async def test_an_id_names_one_event_whether_it_came_as_an_order_or_as_an_event(
    outbox: Outbox, backend: Backend
) -> None:
    await outbox.accept(order("a"))
    before = contents(backend)
    # Another event under the order's ID: a conflict, however the call is made.
    payment = {**PAYMENT, "id": "a"}
    with pytest.raises(Conflict):
        await outbox.publish(payment)
    [outcome] = await outbox.publish_many([payment])
    assert isinstance(outcome, Conflict)
    with backend.user_connection() as conn:
        with pytest.raises(Conflict):
            publish_in(conn, payment)
        conn.commit()
    # The order's own event, published as an event, is the event recorded.
    assert await outbox.publish(placed_event("a")) == "duplicate"
    assert contents(backend) == before

    # And the other way round: an order under an event's ID.
    assert await outbox.publish(PAYMENT) == "accepted"
    with pytest.raises(Conflict):
        await outbox.accept(order("pay-1"))
    assert await outbox.publish(placed_event("b")) == "accepted"
    assert await outbox.accept(order("b")) == "duplicate"
    assert backend.query("SELECT id FROM outbox_orders") == [("a",)]
    assert entry_rows(backend) == stored(placed_event("a"), PAYMENT, placed_event("b"))


def no_refunds(event: object) -> tuple[Event, str]:
    """A service's own rule on top of the contract's: refunds are not recorded here."""
    valid, canonical = checked_event(event)
    if valid["type"] == "payment.refunded":
        raise InvalidEvent("/type", "refunds are recorded by the ledger, not here")
    return valid, canonical


async def test_a_check_given_to_publish_refuses_what_it_refuses_and_changes_nothing(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.publish(PAYMENT, check=no_refunds) == "accepted"
    before = contents(backend)
    refund = {**PAYMENT, "id": "refund-1", "type": "payment.refunded"}
    with pytest.raises(InvalidEvent) as refused:
        await outbox.publish(refund, check=no_refunds)
    assert (refused.value.field, refused.value.problem) == (
        "/type",
        "refunds are recorded by the ledger, not here",
    )
    # Refused before its ID is looked up: a known ID is refused too, not a conflict.
    outcomes = await outbox.publish_many(
        [refund, {**PAYMENT, "type": "payment.refunded"}, PAYMENT], no_refunds
    )
    assert [type(outcome) for outcome in outcomes[:2]] == [InvalidEvent, InvalidEvent]
    assert outcomes[2] == "duplicate"
    small = partial(checked_event, max_data_bytes=16)  # the contract's rule, tighter
    with pytest.raises(InvalidEvent, match="over the 16 allowed") as too_big:
        await outbox.publish({**PAYMENT, "id": "pay-2"}, small)
    assert too_big.value.field == "/data"
    with backend.user_connection() as conn:
        with pytest.raises(InvalidEvent):
            publish_in(conn, refund, no_refunds)
        conn.commit()
    assert contents(backend) == before
    # Without it, the same events are recorded: what refused them was the check.
    assert await outbox.publish_many([refund, {**PAYMENT, "id": "pay-2"}]) == ["accepted"] * 2


TUTORIAL_SCHEMAS = Path(__file__).parents[2] / "examples" / "tutorial" / "schemas"


async def test_the_schemas_serve_holds_events_to_are_a_check_of_the_library(
    outbox: Outbox, backend: Backend
) -> None:
    """`event_check(schemas=Schemas.load(DIR))` refuses in publish, publish_many and
    publish_in what `outbox-publisher serve --schemas DIR` refuses at intake."""
    check = event_check(schemas=Schemas.load(TUTORIAL_SCHEMAS))
    paid = {"id": "p-1", "type": "payment.captured", "key": "c-9"}
    good = {**paid, "data": {"amount_cents": 1999, "currency": "EUR"}}
    bad = {**paid, "id": "p-2", "data": {"amount_cents": 1999, "currency": "euro"}}
    assert await outbox.publish(good, check) == "accepted"
    before = contents(backend)
    with pytest.raises(InvalidEvent) as refused:
        await outbox.publish(bad, check)
    assert refused.value.field == "/data/currency"
    assert "does not match the schema of 'payment.captured'" in refused.value.problem
    [outcome] = await outbox.publish_many([bad], check)
    assert isinstance(outcome, InvalidEvent) and outcome.field == "/data/currency"
    with backend.user_connection() as conn:
        with pytest.raises(InvalidEvent):
            publish_in(conn, bad, check)
        conn.commit()
    assert contents(backend) == before
    assert await outbox.publish(bad) == "accepted"  # the schema refused it, nothing else


# ---------------------------------------------------------------- in the caller's transaction

ACCOUNTS = "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)"


async def test_accept_in_the_callers_transaction_rolls_back_with_it(
    outbox: Outbox, backend: Backend
) -> None:
    backend.execute(ACCOUNTS)
    await accept(outbox, "before")
    before = contents(backend)
    with backend.user_connection() as conn:
        conn.execute("INSERT INTO accounts (id, balance) VALUES ('acct', 5)")
        assert accept_in(conn, order("a")) == "accepted"
        # Not committed: no other connection sees any of it, the relay neither.
        assert contents(backend) == before
        assert await pending_ids(outbox) == ["before"]
        conn.rollback()
    assert contents(backend) == before
    assert backend.query("SELECT * FROM accounts") == []
    assert await outbox.accept(order("a")) == "accepted"  # nothing of it was left


async def test_accept_in_the_callers_transaction_commits_with_it_and_is_delivered(
    outbox: Outbox, backend: Backend
) -> None:
    backend.execute(ACCOUNTS)
    await accept(outbox, "before")
    with backend.user_connection() as conn:
        conn.execute("INSERT INTO accounts (id, balance) VALUES ('acct', 5)")
        assert accept_in(conn, order("a", "tea", qty=2)) == "accepted"
        conn.commit()
    assert backend.query("SELECT * FROM accounts") == [("acct", 5)]
    assert backend.query("SELECT id, sku, qty FROM outbox_orders WHERE id = 'a'") == [
        ("a", "tea", 2)
    ]
    assert await outbox.pending() == [placed("before"), placed("a", "tea", qty=2)]
    sent: list[dict[str, Any]] = []

    async def send(event: dict[str, Any]) -> bool:
        sent.append(event)
        return True

    assert await dispatch(outbox, send) == ["before", "a"]
    assert sent[-1] == placed("a", "tea", qty=2)
    assert unsent(backend) == []


async def test_accept_in_the_callers_transaction_finds_duplicates_conflicts_and_bad_events(
    outbox: Outbox, backend: Backend
) -> None:
    await outbox.accept(order("a"))
    before = contents(backend)
    with backend.user_connection() as conn:
        assert accept_in(conn, order("a")) == "duplicate"
        with pytest.raises(Conflict):
            accept_in(conn, order("a", qty=8))
        with pytest.raises(InvalidEvent):
            accept_in(conn, {"id": "b", "sku": "snack", "qty": 0})
        conn.commit()
    assert contents(backend) == before
    with pytest.raises(TypeError):
        accept_in(object(), order("c"))


async def test_accept_in_judges_a_known_id_by_its_stored_payload_as_intake_does(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "moved", "pruned", qty=7)
    store_payload(backend, "moved", canonical_json(placed_event("moved", qty=8)))  # by hand
    await outbox.mark_sent("pruned", ACK)
    await asyncio.sleep(TICK_S)
    assert await outbox.prune(older_than_s=0) == 1
    before = contents(backend)
    with backend.user_connection() as conn:
        assert accept_in(conn, order("moved", qty=8)) == "duplicate"
        assert accept_in(conn, order("pruned", qty=7)) == "duplicate"
        for changed in (order("moved", qty=7), order("pruned", qty=8)):
            with pytest.raises(Conflict):
                accept_in(conn, changed)
        conn.commit()
    assert contents(backend) == before


async def test_publish_in_the_callers_transaction_rolls_back_with_it(
    outbox: Outbox, backend: Backend
) -> None:
    backend.execute(ACCOUNTS)
    assert await outbox.publish(KEYLESS) == "accepted"
    before = contents(backend)
    with backend.user_connection() as conn:
        conn.execute("INSERT INTO accounts (id, balance) VALUES ('acct', 5)")
        assert publish_in(conn, PAYMENT) == "accepted"
        assert publish_in(conn, EVENTS["unicode"]) == "accepted"
        assert publish_in(conn, PAYMENT) == "duplicate"  # its own transaction sees it
        # Not committed: no other connection sees any of it, the relay neither.
        assert contents(backend) == before
        assert await pending_ids(outbox) == ["news-1"]
        conn.rollback()
    assert contents(backend) == before
    assert backend.query("SELECT * FROM accounts") == []
    assert await outbox.publish(PAYMENT) == "accepted"  # nothing of it was left


async def test_publish_in_the_callers_transaction_commits_with_it_and_is_delivered(
    outbox: Outbox, backend: Backend
) -> None:
    backend.execute(ACCOUNTS)
    assert await outbox.publish(KEYLESS) == "accepted"
    events = [EVENTS[shape] for shape in ("keyed", "unicode", "floats")]
    with backend.user_connection() as conn:
        conn.execute("INSERT INTO accounts (id, balance) VALUES ('acct', 5)")
        assert [publish_in(conn, one) for one in events] == ["accepted"] * 3
        conn.commit()
    assert backend.query("SELECT * FROM accounts") == [("acct", 5)]
    assert entry_rows(backend) == stored(KEYLESS, *events)
    assert count(backend, "outbox_orders") == 0
    assert await outbox.pending() == [KEYLESS, *events]
    sent: list[dict[str, Any]] = []

    async def send(event: dict[str, Any]) -> bool:
        sent.append(event)
        return True

    assert await dispatch(outbox, send) == ["news-1", "pay-1", "note-1", "read-1"]
    assert sent == [KEYLESS, *events]
    assert unsent(backend) == []


async def test_publish_in_judges_a_known_id_as_publish_does_pruned_or_not(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.publish_many([PAYMENT, KEYLESS]) == ["accepted"] * 2
    await outbox.mark_sent("news-1", ACK)
    await asyncio.sleep(TICK_S)
    assert await outbox.prune(older_than_s=0) == 1
    before = contents(backend)
    with backend.user_connection() as conn:
        assert publish_in(conn, PAYMENT) == "duplicate"
        assert publish_in(conn, KEYLESS) == "duplicate"  # its entry pruned
        for changed in (
            {**PAYMENT, "type": "payment.refunded"},
            {**KEYLESS, "key": "customer-9"},
            with_data(KEYLESS, issue=13),
        ):
            with pytest.raises(Conflict):
                publish_in(conn, changed)
        with pytest.raises(InvalidEvent) as bad:
            publish_in(conn, {"id": "x", "type": "t", "data": {"n": [1, float("inf")]}})
        assert bad.value.field == "/data/n/1"
        conn.commit()
    assert contents(backend) == before
    with pytest.raises(TypeError):
        publish_in(object(), PAYMENT)


async def test_publish_in_async_commits_and_rolls_back_with_the_callers_transaction(
    outbox: Outbox, backend: Backend
) -> None:
    backend.execute(ACCOUNTS)
    before = contents(backend)
    async with backend.async_user_connection() as conn:
        await conn.execute("INSERT INTO accounts (id, balance) VALUES ('gone', 1)")
        assert await publish_in_async(conn, PAYMENT) == "accepted"
        assert contents(backend) == before  # not committed
        await conn.rollback()
        assert contents(backend) == before
        await conn.execute("INSERT INTO accounts (id, balance) VALUES ('kept', 2)")
        assert await publish_in_async(conn, PAYMENT) == "accepted"  # nothing was left
        assert await publish_in_async(conn, KEYLESS) == "accepted"
        assert await publish_in_async(conn, PAYMENT) == "duplicate"
        with pytest.raises(Conflict):
            await publish_in_async(conn, {**PAYMENT, "key": "customer-8"})
        with pytest.raises(InvalidEvent) as bad:
            await publish_in_async(conn, with_data(KEYLESS, n={"deep": 2**60}))
        assert bad.value.field == "/data/n/deep"
        with pytest.raises(InvalidEvent):
            await publish_in_async(conn, {**PAYMENT, "type": "payment.refunded"}, no_refunds)
        assert await pending_ids(outbox) == []
        await conn.commit()
    assert backend.query("SELECT * FROM accounts") == [("kept", 2)]
    assert entry_rows(backend) == stored(PAYMENT, KEYLESS)
    assert await outbox.pending() == [PAYMENT, KEYLESS]


async def test_publish_in_async_takes_an_asynchronous_connection_only(
    outbox: Outbox, backend: Backend
) -> None:
    with backend.user_connection() as conn, pytest.raises(TypeError, match="AsyncConnection"):
        await publish_in_async(conn, PAYMENT)
    assert count(backend, "outbox_entries") == 0


async def test_accept_in_and_publish_in_refuse_a_connection_outside_any_transaction(
    outbox: Outbox, backend: Backend
) -> None:
    with backend.user_connection(autocommit=True) as conn:
        with pytest.raises(NotInTransaction):
            accept_in(conn, order("a"))
        with pytest.raises(NotInTransaction):
            publish_in(conn, PAYMENT)
    assert (count(backend, "outbox_orders"), count(backend, "outbox_entries")) == (0, 0)


async def test_accept_in_and_publish_in_take_a_closed_connection_as_a_storage_error(
    outbox: Outbox, backend: Backend
) -> None:
    with backend.user_connection() as conn:
        conn.close()
        with pytest.raises(StorageError, match="closed"):
            accept_in(conn, order("a"))
        with pytest.raises(StorageError, match="closed"):
            publish_in(conn, PAYMENT)
    assert (count(backend, "outbox_orders"), count(backend, "outbox_entries")) == (0, 0)


# ---------------------------------------------------------------- no lock while sending


async def test_others_write_and_commit_while_an_entry_is_being_sent(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "a", "b")
    took: list[float] = []

    async with Outbox.open(backend.location) as other:

        async def send(event: dict[str, Any]) -> bool:
            started = time.monotonic()
            # Another connection writes and commits, as intake of another process
            # would, and an independent writer too: neither waits for a lock.
            assert await other.accept(order(f"during-{event['id']}")) == "accepted"
            backend.execute(
                "INSERT INTO outbox_orders (id, sku, qty, accepted_at)"
                f" VALUES ('side-{event['id']}', 'side', 1, 0)"
            )
            took.append(time.monotonic() - started)
            return True

        assert await dispatch(outbox, send) == ["a", "b"]

    assert max(took) < 1.0  # a lock wait would be the lock timeout (5 s) or an error
    assert unsent(backend) == ["during-a", "during-b"]
    assert {"side-a", "side-b"} <= {i for (i,) in backend.query("SELECT id FROM outbox_orders")}


# ---------------------------------------------------------------- pending


async def test_pending_is_in_insertion_order_not_id_order(outbox: Outbox) -> None:
    for event_id in ["z", "a", "m"]:
        await outbox.accept(order(event_id))
    assert [e["id"] for e in await outbox.pending()] == ["z", "a", "m"]


async def test_pending_ignores_accepted_at_timestamps(outbox: Outbox, backend: Backend) -> None:
    for event_id in ["z", "a", "m"]:
        await outbox.accept(order(event_id))
    backend.execute(
        "UPDATE outbox_orders SET accepted_at = 0", "UPDATE outbox_entries SET queued_at = 0"
    )
    assert [e["id"] for e in await outbox.pending()] == ["z", "a", "m"]


async def test_pending_returns_exactly_the_recorded_event(outbox: Outbox) -> None:
    await outbox.accept(order("a", "snack", qty=7))
    (event,) = await outbox.pending()
    assert event == {
        "id": "a",
        "type": "order.placed",
        "key": "snack",
        "data": {"sku": "snack", "qty": 7},
    }
    assert set(event) == {"id", "type", "key", "data"}
    assert type(event["data"]["qty"]) is int


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


async def test_pending_changes_nothing(outbox: Outbox, backend: Backend) -> None:
    for event_id in ["z", "a", "m"]:
        await outbox.accept(order(event_id))
    await outbox.mark_sent("a")
    before = contents(backend)
    first = await outbox.pending()
    second = await outbox.pending()
    assert first == second == [placed_event("z"), placed_event("m")]
    assert contents(backend) == before


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
    first["data"]["qty"] = 0
    assert await outbox.pending() == [placed_event("a")]


# ---------------------------------------------------------------- lanes


async def accept_lane(outbox: Outbox, lane: str, count: int, start: int) -> list[str]:
    """`count` orders of SKU `lane`, accepted in this order; their IDs in seq order."""
    ids = [f"{lane}-{n:06d}" for n in range(start, start + count)]
    for event_id in ids:
        assert await outbox.accept({"id": event_id, "sku": lane, "qty": 1}) == "accepted"
    return ids


async def test_a_global_read_that_skips_ids_returns_every_lane_in_seq_order(
    outbox: Outbox,
) -> None:
    first = await accept_lane(outbox, "a", 10, 0)
    second = await accept_lane(outbox, "b", 10, 0)
    third = await accept_lane(outbox, "a", 10, 10)
    rows = await outbox.pending_batch(16, None, [*first[2:], "no-such-id"])
    assert [row.event["id"] for row in rows] == first[:2] + second + third[:4]


async def test_pending_rows_and_entries_carry_the_lane_the_outbox_stored(
    outbox: Outbox, backend: Backend
) -> None:
    await outbox.accept(order("a", "snack"))
    assert await outbox.accept_many([order("b", "tea"), order("c", "tea")]) == ["accepted"] * 2
    await outbox.accept(order("d", "juice"))
    with backend.user_connection() as conn:
        assert accept_in(conn, order("e", "tea")) == "accepted"
        conn.commit()
    # Written by hand: d's lane is not its payload's SKU. The lane column says.
    backend.execute("UPDATE outbox_entries SET lane = 'moved' WHERE id = 'd'")
    lanes = {"a": "snack", "b": "tea", "c": "tea", "d": "moved", "e": "tea"}

    rows = await outbox.pending_batch(16)
    assert [(row.event["id"], row.lane) for row in rows] == list(lanes.items())
    assert rows[3].event == placed_event("d", "juice")
    skipping = await outbox.pending_batch(16, None, ["a"])
    assert [(row.event["id"], row.lane) for row in skipping] == list(lanes.items())[1:]
    assert [(r.event["id"], r.lane) for r in await outbox.pending_batch(16, "moved")] == [
        ("d", "moved")
    ]
    assert [(r.event["id"], r.lane) for r in await outbox.pending_batch(16, "tea", ["b"])] == [
        ("c", "tea"),
        ("e", "tea"),
    ]
    await outbox.mark_sent("b", ACK)
    await outbox.quarantine("c", "x", "alice")
    listed = {e.id: e.lane for state in State for e in await outbox.entries(state)}
    assert listed == lanes
    entry = await outbox.entry("d")
    assert entry is not None and (entry.lane, entry.event) == ("moved", placed_event("d", "juice"))


async def test_pending_lanes_orders_by_the_oldest_pending_head_and_honours_limit_and_skip(
    outbox: Outbox, backend: Backend
) -> None:
    first_b = await accept_lane(outbox, "b", 2, 0)
    await accept_lane(outbox, "a", 2, 0)
    await accept_lane(outbox, "c", 2, 0)
    await accept_lane(outbox, "b", 2, 2)
    assert await outbox.pending_lanes(10) == ["b", "a", "c"]
    assert await outbox.pending_lanes(2) == ["b", "a"]
    assert await outbox.pending_lanes(10, ["a", "zzz"]) == ["b", "c"]
    # Lane b's head delivered: its next entry is younger than a's and c's heads.
    await outbox.mark_sent_many([(event_id, None) for event_id in first_b])
    assert await outbox.pending_lanes(10) == ["a", "c", "b"]
    assert sum(sent for (sent,) in backend.query("SELECT sent FROM outbox_entries")) == 2
    await outbox.quarantine("a-000000", "test", "tester")
    await outbox.quarantine("a-000001", "test", "tester")
    assert await outbox.pending_lanes(10) == ["c", "b"]  # a holds nothing pending
    assert await outbox.pending_lanes(10, ["c", "b"]) == []


async def test_pending_batch_of_a_key_returns_that_keys_events_only_in_seq_order(
    outbox: Outbox, backend: Backend
) -> None:
    def one(event_id: str, key: str | None) -> dict[str, Any]:
        found = {"id": event_id, "type": "visit.logged", "data": {"n": event_id}}
        return found if key is None else {**found, "key": key}

    # IDs not in text order; events, orders and keyless events interleaved, recorded
    # one by one, several in one call, and as an order of the same key.
    assert await outbox.publish(one("z1", "c-1")) == "accepted"
    assert await outbox.publish(one("y1", None)) == "accepted"
    batch = [one("x2", "c-2"), one("w1", "c-1"), one("v1", None), one("u2", "c-2")]
    assert await outbox.publish_many(batch) == ["accepted"] * 4
    assert await outbox.accept(order("t1", "c-1")) == "accepted"
    assert await outbox.publish(one("s1", None)) == "accepted"
    lanes = {"c-1": ["z1", "w1", "t1"], "c-2": ["x2", "u2"], GLOBAL_LINE: ["y1", "v1", "s1"]}

    for lane, ids in lanes.items():
        rows = await outbox.pending_batch(16, lane)
        assert [(row.event["id"], row.lane) for row in rows] == [(i, lane) for i in ids], lane
        assert [row.seq for row in rows] == sorted(row.seq for row in rows)
        assert [row.event["id"] for row in await outbox.pending_batch(2, lane)] == ids[:2]
        skipping = await outbox.pending_batch(16, lane, [ids[0], "x2"])
        assert [row.event["id"] for row in skipping] == [i for i in ids[1:] if i != "x2"]
    assert [row.event for row in await outbox.pending_batch(16, GLOBAL_LINE)] == [
        one(i, None) for i in lanes[GLOBAL_LINE]
    ]
    assert await outbox.pending_batch(16, "c-3") == []
    # Events without a key are a lane of their own ("*") beside the keys' lanes.
    assert await outbox.pending_lanes(10) == ["c-1", GLOBAL_LINE, "c-2"]
    await outbox.mark_sent("z1", ACK)
    assert await outbox.pending_lanes(10) == [GLOBAL_LINE, "c-2", "c-1"]
    assert await outbox.head_ids([None, "c-1", GLOBAL_LINE]) == {
        None: "y1",
        "c-1": "w1",
        GLOBAL_LINE: "y1",
    }


# ---------------------------------------------------------------- heads


async def test_head_ids_of_an_empty_outbox_name_no_head(outbox: Outbox) -> None:
    assert await outbox.head_ids([None, "snack"]) == {None: None, "snack": None}
    assert await outbox.head_ids([]) == {}


async def test_head_ids_name_the_oldest_pending_entry_of_each_line(outbox: Outbox) -> None:
    for event_id, sku in [("z", "snack"), ("a", "juice"), ("m", "snack"), ("b", "tea")]:
        assert await outbox.accept(order(event_id, sku)) == "accepted"
    lines: list[str | None] = ["tea", None, "snack", "juice", "soap"]

    heads = await outbox.head_ids(lines)

    # Insertion order, not ID order; a lane with nothing pending has no head.
    assert heads == {None: "z", "snack": "z", "juice": "a", "tea": "b", "soap": None}
    assert list(heads) == lines
    await outbox.mark_sent("z")
    await outbox.mark_sent("b")
    assert await outbox.head_ids([None, "snack", "tea"]) == {None: "a", "snack": "m", "tea": None}


async def test_head_ids_follow_quarantine_and_redrive(outbox: Outbox) -> None:
    for event_id, sku in [("a", "snack"), ("b", "snack"), ("c", "juice")]:
        assert await outbox.accept(order(event_id, sku)) == "accepted"
    lines: list[str | None] = [None, "snack", "juice"]

    await outbox.quarantine("a", "poison", "alice")
    assert await outbox.head_ids(lines) == {None: "b", "snack": "b", "juice": "c"}
    await outbox.quarantine("b", "poison too", "alice")
    assert await outbox.head_ids(lines) == {None: "c", "snack": None, "juice": "c"}
    await outbox.redrive("b", "bob")
    assert await outbox.head_ids(lines) == {None: "b", "snack": "b", "juice": "c"}
    await outbox.redrive("a", "bob")  # back at its own seq: before b again
    assert await outbox.head_ids(lines) == {None: "a", "snack": "a", "juice": "c"}


async def test_head_ids_agree_with_the_pending_reads(outbox: Outbox) -> None:
    skus = ["snack", "juice", "tea", "snack", "tea", "soap", "juice", "snack"]
    for n, sku in enumerate(skus):
        assert await outbox.accept(order(f"e{n}", sku)) == "accepted"
    await outbox.mark_sent("e0")
    await outbox.quarantine("e1", "x", "alice")
    await outbox.record_failure("e2", "sink answered 503")
    await outbox.mark_sent("e5")
    lanes = sorted(set(skus))

    heads = await outbox.head_ids([None, *lanes])

    snapshot = await outbox.snapshot()
    assert snapshot.head is not None and heads[None] == snapshot.head.id == "e2"
    for lane in lanes:
        first = await outbox.pending_batch(1, lane)
        assert heads[lane] == (first[0].event["id"] if first else None), lane
    assert heads == {None: "e2", "juice": "e6", "snack": "e3", "soap": None, "tea": "e2"}


async def test_head_ids_change_nothing(outbox: Outbox, backend: Backend) -> None:
    await accept(outbox, "a", "b")
    await outbox.record_failure("a", "sink answered 503")
    await outbox.quarantine("b", "x", "alice")
    before = contents(backend)

    first = await outbox.head_ids([None, "snack"])
    second = await outbox.head_ids([None, "snack"])

    assert first == second == {None: "a", "snack": "a"}
    assert contents(backend) == before


# ---------------------------------------------------------------- marks and attempts


async def test_mark_sent_marks_the_entry(outbox: Outbox, backend: Backend) -> None:
    await outbox.accept(order("a"))
    await outbox.accept(order("b"))
    await outbox.mark_sent("a")
    assert backend.query("SELECT id, sent FROM outbox_entries ORDER BY seq") == [("a", 1), ("b", 0)]
    assert backend.query("SELECT sent_at IS NOT NULL FROM outbox_entries WHERE id = 'a'") == [(1,)]


async def test_mark_sent_keeps_the_ack(outbox: Outbox, backend: Backend) -> None:
    await outbox.accept(order("a"))
    await outbox.mark_sent("a", {"ack": "a", "status": "applied"})
    (ack,) = backend.query("SELECT ack FROM outbox_entries WHERE id = 'a'")[0]
    assert ack is not None
    assert '"ack": "a"' in ack


async def test_mark_sent_is_idempotent(outbox: Outbox, backend: Backend) -> None:
    await outbox.accept(order("a"))
    await outbox.mark_sent("a")
    before = contents(backend)
    await outbox.mark_sent("a")
    assert contents(backend) == before
    assert backend.query("SELECT sent FROM outbox_entries") == [(1,)]


async def test_mark_sent_again_keeps_the_first_ack_and_time(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "a")
    await outbox.mark_sent("a", ACK)
    before = backend.query("SELECT * FROM outbox_entries")
    await asyncio.sleep(TICK_S)
    await outbox.mark_sent("a", {"ack": "a", "status": "duplicate"})
    assert backend.query("SELECT * FROM outbox_entries") == before


async def test_mark_sent_of_an_unknown_id_is_unknown_entry(
    outbox: Outbox, backend: Backend
) -> None:
    await outbox.accept(order("a"))
    before = contents(backend)
    with pytest.raises(UnknownEntry) as excinfo:
        await outbox.mark_sent("nope")
    assert excinfo.value.event_id == "nope"
    assert isinstance(excinfo.value, LookupError)
    assert contents(backend) == before


_MARK_AND_EXIT = """
import asyncio, os, sys
from publisher.store import Outbox

async def main():
    async with Outbox.open(sys.argv[1]) as outbox:
        await outbox.mark_sent_many([("a", {"ack": "a", "status": "applied"}), ("b", None)])
        os._exit(0)  # no close, no checkpoint: as a crash right after the mark

asyncio.run(main())
"""


async def test_marks_survive_the_end_of_the_process_that_made_them(
    outbox: Outbox, backend: Backend
) -> None:
    """A mark need not survive a power loss (a lost mark only sends the entry again),
    but it must survive the end of its process: on SQLite the marks alone commit
    without a sync, and a process that dies after them must still leave them."""
    await accept(outbox, "a", "b", "c")
    child = subprocess.run(
        [sys.executable, "-c", _MARK_AND_EXIT, backend.location],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert backend.query("SELECT id, sent FROM outbox_entries ORDER BY seq") == [
        ("a", 1),
        ("b", 1),
        ("c", 0),
    ]
    assert [event["id"] for event in await outbox.pending()] == ["c"]


async def test_mark_sent_does_not_touch_the_order(outbox: Outbox, backend: Backend) -> None:
    await outbox.accept(order("a"))
    before = backend.query("SELECT * FROM outbox_orders")
    await outbox.mark_sent("a")
    assert backend.query("SELECT * FROM outbox_orders") == before


async def test_failures_are_recorded_on_the_entry(outbox: Outbox, backend: Backend) -> None:
    await accept(outbox, "a")
    await outbox.record_failure("a", "connection refused")
    [(first_fail, first_last)] = backend.query(
        "SELECT first_failure_at, last_attempt_at FROM outbox_entries WHERE id = 'a'"
    )
    await asyncio.sleep(TICK_S)
    await outbox.record_failure("a", "sink answered 503")

    [(attempts, error, last_at, first_at)] = backend.query(
        "SELECT attempts, last_error, last_attempt_at, first_failure_at FROM outbox_entries"
    )
    assert (attempts, error) == (2, "sink answered 503")
    assert first_at == first_fail == first_last
    assert last_at > first_at
    await outbox.mark_sent("a", ACK)
    entry = await outbox.entry("a")
    assert entry is not None and entry.attempts == 3 and entry.state is State.SENT


async def test_failure_on_a_sent_entry_changes_nothing(outbox: Outbox, backend: Backend) -> None:
    await accept(outbox, "a")
    await outbox.mark_sent("a", ACK)
    before = backend.query("SELECT * FROM outbox_entries")
    await outbox.record_failure("a", "late error")
    assert backend.query("SELECT * FROM outbox_entries") == before


async def test_mark_sent_many_marks_an_entry_quarantined_in_flight_and_closes_it_as_delivered(
    outbox: Outbox, backend: Backend
) -> None:
    # The relay read a, b and c and is sending them; an operator quarantines b; the ACKs
    # arrive. As with mark_sent, the ACK is the truth: b is sent, its stay "delivered".
    ids = ["a", "b", "c"]
    await accept(outbox, *ids)
    a, b, c = ids
    await outbox.quarantine(b, "looked stuck", "alice")
    await asyncio.sleep(TICK_S)
    ack = {i: make_ack(i, Receipt.APPLIED) for i in ids}

    await outbox.mark_sent_many([Mark(i, ack[i]) for i in ids])

    rows = backend.query(
        "SELECT id, sent, quarantined, attempts, ack FROM outbox_entries ORDER BY seq"
    )
    assert [(i, s, q, n, json.loads(x)) for i, s, q, n, x in rows] == [
        (i, 1, 0, 1, ack[i]) for i in ids
    ]
    [(sent_at,)] = backend.query("SELECT DISTINCT sent_at FROM outbox_entries")  # one transaction
    entry = await outbox.entry(b)
    assert entry is not None and (entry.state, entry.ack) == (State.SENT, ack[b])
    [record] = await outbox.quarantines(b)
    assert (record.released_as, record.released_by) == ("delivered", "relay")
    assert (record.quarantined_by, record.released_at) == ("alice", sent_at)
    assert (await outbox.snapshot()).quarantined == 0
    assert await outbox.entries(State.QUARANTINED) == []
    assert backend.query("SELECT id, released_as FROM outbox_quarantines") == [(b, "delivered")]
    assert {a, c}.isdisjoint(r[0] for r in backend.query("SELECT id FROM outbox_quarantines"))


async def test_mark_sent_many_leaves_an_already_sent_entry_as_it_was(
    outbox: Outbox, backend: Backend
) -> None:
    a, b, c = "a", "b", "c"
    await accept(outbox, a, b, c)
    await outbox.mark_sent(b, make_ack(b, Receipt.APPLIED))
    before = backend.query("SELECT * FROM outbox_entries WHERE id = ?", b)
    await asyncio.sleep(TICK_S)

    await outbox.mark_sent_many(
        [Mark(a, make_ack(a, Receipt.APPLIED)), Mark(b, make_ack(b, Receipt.DUPLICATE)), Mark(c)]
    )

    assert backend.query("SELECT * FROM outbox_entries WHERE id = ?", b) == before
    rows = backend.query("SELECT id, sent, attempts, sent_at FROM outbox_entries ORDER BY seq")
    assert [(i, s, n) for i, s, n, _ in rows] == [(a, 1, 1), (b, 1, 1), (c, 1, 1)]
    times = {i: t for i, _, _, t in rows}
    assert times[a] == times[c] > times[b]
    assert count(backend, "outbox_quarantines") == 0


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
async def test_pending_lanes_refuses_a_limit_that_is_not_a_positive_integer(
    outbox: Outbox, limit: Any
) -> None:
    await accept(outbox, "a")
    with pytest.raises(ValueError):
        await outbox.pending_lanes(limit)


# ---------------------------------------------------------------- quarantine


async def test_quarantined_entry_is_neither_pending_nor_sent(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "a", "b", "c")

    await outbox.quarantine("a", "sku retired", "alice")

    assert await pending_ids(outbox) == ["b", "c"]
    assert [e.id for e in await outbox.entries(State.PENDING)] == ["b", "c"]
    assert await outbox.entries(State.SENT) == []
    [held] = await outbox.entries(State.QUARANTINED)
    assert (held.id, held.state, held.sent_at) == ("a", State.QUARANTINED, None)
    assert states(backend) == {"a": (0, 1), "b": (0, 0), "c": (0, 0)}
    [(reason, by, at, released)] = backend.query(
        "SELECT reason, quarantined_by, quarantined_at, released_at FROM outbox_quarantines"
        " WHERE id = 'a'"
    )
    assert (reason, by, released) == ("sku retired", "alice", None)
    assert abs(at - time.time()) < 60
    snapshot = await outbox.snapshot()
    assert (snapshot.pending, snapshot.quarantined) == (2, 1)
    assert snapshot.head is not None and snapshot.head.id == "b"


async def test_quarantine_of_a_sent_entry_is_refused_and_changes_nothing(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "a")
    await outbox.mark_sent("a", ACK)
    before = backend.query("SELECT * FROM outbox_entries")

    with pytest.raises(InvalidTransition, match="sent"):
        await outbox.quarantine("a", "too late", "alice")

    assert backend.query("SELECT * FROM outbox_entries") == before
    assert count(backend, "outbox_quarantines") == 0


async def test_quarantine_of_an_unknown_entry_is_refused(outbox: Outbox, backend: Backend) -> None:
    await accept(outbox, "a")
    with pytest.raises(UnknownEntry, match="nope"):
        await outbox.quarantine("nope", "typo", "alice")
    assert count(backend, "outbox_quarantines") == 0


async def test_quarantine_twice_is_refused_and_keeps_one_record(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "a")
    await outbox.quarantine("a", "first", "alice")
    with pytest.raises(InvalidTransition, match="quarantined"):
        await outbox.quarantine("a", "second", "bob")
    assert backend.query("SELECT reason FROM outbox_quarantines") == [("first",)]


async def test_mark_sent_of_an_entry_quarantined_in_flight_closes_it_as_delivered(
    outbox: Outbox, backend: Backend
) -> None:
    # The relay read "a" and is sending it; an operator quarantines it; the ACK arrives.
    await accept(outbox, "a", "b")
    [read] = await outbox.pending_batch(1)
    seq = read.seq
    await outbox.quarantine("a", "looked stuck", "alice")
    await asyncio.sleep(TICK_S)
    await outbox.mark_sent("b", ACK)
    ack = {"ack": "a", "status": "applied"}

    await outbox.mark_sent("a", ack)

    entry = await outbox.entry("a")
    assert entry is not None
    assert (entry.state, entry.seq, entry.ack) == (State.SENT, seq, ack)
    assert states(backend)["a"] == (1, 0)
    [record] = await outbox.quarantines("a")
    assert (record.released_as, record.released_by) == ("delivered", "relay")
    assert record.delivered_past == ["b"]
    assert (await outbox.snapshot()).quarantined == 0
    assert await outbox.entries(State.QUARANTINED) == []


# ---------------------------------------------------------------- redrive


async def test_redrive_of_a_pending_entry_is_refused(outbox: Outbox, backend: Backend) -> None:
    await accept(outbox, "a")
    before = backend.query("SELECT * FROM outbox_entries")
    with pytest.raises(InvalidTransition, match="pending"):
        await outbox.redrive("a", "alice")
    assert backend.query("SELECT * FROM outbox_entries") == before


async def test_redrive_of_a_sent_or_unknown_entry_is_refused(outbox: Outbox) -> None:
    await accept(outbox, "a")
    await outbox.mark_sent("a", ACK)
    with pytest.raises(InvalidTransition, match="sent"):
        await outbox.redrive("a", "alice")
    with pytest.raises(UnknownEntry):
        await outbox.redrive("nope", "alice")


async def test_redrive_puts_the_entry_back_at_its_own_seq_so_it_goes_next(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "a", "b", "c")
    original = seqs(backend)
    await outbox.quarantine("b", "bad sku", "alice")
    await accept(outbox, "d")
    assert await pending_ids(outbox) == ["a", "c", "d"]

    await outbox.redrive("b", "bob")

    assert await pending_ids(outbox) == ["a", "b", "c", "d"]
    after = seqs(backend)
    assert {k: after[k] for k in original} == original
    assert after["d"] > original["c"]
    assert states(backend)["b"] == (0, 0)
    await outbox.mark_sent("a", ACK)
    head = (await outbox.snapshot()).head
    assert head is not None and (head.id, head.seq) == ("b", original["b"])


async def test_redrive_records_what_was_delivered_past_it(outbox: Outbox, backend: Backend) -> None:
    await accept(outbox, "a", "b", "c", "d", "e")
    await outbox.mark_sent("a", ACK)  # before b: not "past" it
    await outbox.mark_sent("d", ACK)  # after b in seq, but sent before the quarantine
    await asyncio.sleep(TICK_S)
    await outbox.quarantine("b", "sku retired", "alice")
    await asyncio.sleep(TICK_S)
    await outbox.mark_sent("c", ACK)
    await outbox.mark_sent("e", ACK)

    record = await outbox.redrive("b", "bob")

    assert record.delivered_past == ["c", "e"]
    assert record.delivered_past_count == 2
    assert (record.reason, record.quarantined_by) == ("sku retired", "alice")
    assert (record.released_by, record.released_as) == ("bob", "redriven")
    assert record.released_at is not None and record.released_at >= record.quarantined_at
    [row] = backend.query(
        "SELECT released_by, released_as, delivered_past_count, delivered_past"
        " FROM outbox_quarantines WHERE id = 'b'"
    )
    assert row == ("bob", "redriven", 2, '["c", "e"]')
    assert await outbox.quarantines("b") == [record]


async def test_each_stay_in_quarantine_is_its_own_record(outbox: Outbox) -> None:
    await accept(outbox, "a", "b", "c")
    await outbox.quarantine("a", "first", "alice")
    await asyncio.sleep(TICK_S)
    await outbox.mark_sent("b", ACK)
    await outbox.redrive("a", "bob")
    await asyncio.sleep(TICK_S)
    await outbox.quarantine("a", "second", "carol")
    await asyncio.sleep(TICK_S)
    await outbox.mark_sent("c", ACK)
    await outbox.redrive("a", "dave")

    first, second = await outbox.quarantines("a")

    assert (first.reason, first.quarantined_by, first.delivered_past) == ("first", "alice", ["b"])
    assert (second.reason, second.quarantined_by, second.delivered_past) == (
        "second",
        "carol",
        ["c"],
    )
    history = await outbox.quarantine_history(["a", "b", "zzz"])
    assert list(history) == ["a"]
    assert history["a"] == [first, second]


async def test_redrive_starts_a_fresh_failure_streak(outbox: Outbox) -> None:
    await accept(outbox, "a")
    await outbox.record_failure("a", "sink rejected it with 409")
    head = (await outbox.snapshot()).head
    assert head is not None and head.blocked
    await outbox.quarantine("a", "bad", "alice")
    await outbox.redrive("a", "alice")

    head = (await outbox.snapshot()).head

    assert head is not None and head.id == "a"
    assert head.blocked is False
    assert head.attempts == 1  # the count of attempts is history and is kept


# ---------------------------------------------------------------- list


async def test_list_orders_pending_and_quarantined_oldest_first_sent_newest_first(
    outbox: Outbox,
) -> None:
    await accept(outbox, "z", "m", "a", "q", "b")
    await outbox.quarantine("q", "x", "alice")
    await outbox.quarantine("m", "x", "alice")
    await outbox.mark_sent("z", ACK)
    await outbox.mark_sent("a", ACK)

    assert [e.id for e in await outbox.entries(State.PENDING)] == ["b"]
    assert [e.id for e in await outbox.entries(State.QUARANTINED)] == ["m", "q"]
    assert [e.id for e in await outbox.entries(State.SENT)] == ["a", "z"]
    assert [e.id for e in await outbox.entries(State.SENT, limit=1)] == ["a"]
    sent = await outbox.entries(State.SENT)
    assert all(e.state is State.SENT and e.ack == ACK and e.sent_at for e in sent)


async def test_list_pages_on_from_the_last_seq_in_each_states_order(outbox: Outbox) -> None:
    await accept(outbox, *[f"p{n}" for n in range(5)], *[f"s{n}" for n in range(5)])
    for n in range(5):
        await outbox.mark_sent(f"s{n}", ACK)
    first = await outbox.entries(State.PENDING, limit=2)
    second = await outbox.entries(State.PENDING, limit=2, after=first[-1].seq)
    last = await outbox.entries(State.PENDING, limit=2, after=second[-1].seq)
    assert [[e.id for e in page] for page in (first, second, last)] == [
        ["p0", "p1"],
        ["p2", "p3"],
        ["p4"],
    ]
    assert await outbox.entries(State.PENDING, after=last[-1].seq) == []
    newest = await outbox.entries(State.SENT, limit=3)
    older = await outbox.entries(State.SENT, limit=3, after=newest[-1].seq)
    assert [e.id for e in newest + older] == ["s4", "s3", "s2", "s1", "s0"]


async def test_list_keeps_one_key_when_asked(outbox: Outbox) -> None:
    for n in range(6):
        await outbox.accept(order(f"e{n}", sku="tea" if n % 2 else "snack"))
    await outbox.quarantine("e1", "x", "alice")
    await outbox.mark_sent("e3", ACK)

    assert [e.id for e in await outbox.entries(State.PENDING, key="tea")] == ["e5"]
    assert [e.id for e in await outbox.entries(State.PENDING, key="snack")] == ["e0", "e2", "e4"]
    assert [e.id for e in await outbox.entries(State.QUARANTINED, key="tea")] == ["e1"]
    assert [e.id for e in await outbox.entries(State.SENT, key="tea")] == ["e3"]
    assert await outbox.entries(State.SENT, key="snack") == []
    assert await outbox.entries(State.PENDING, key="none") == []
    page = await outbox.entries(State.PENDING, limit=1, after=0, key="snack")
    assert [e.id for e in page] == ["e0"]


async def test_list_keeps_one_type_or_the_events_without_a_key_when_asked(outbox: Outbox) -> None:
    events = [
        PAYMENT,
        KEYLESS,
        {**PAYMENT, "id": "pay-2", "key": "customer-8"},
        {**KEYLESS, "id": "news-2"},
        {**PAYMENT, "id": "refund-1", "type": "payment.refunded"},
    ]
    assert await outbox.publish_many(events) == ["accepted"] * len(events)
    await outbox.accept(order("o1", "customer-9"))
    await outbox.mark_sent("news-2", ACK)

    def ids(entries: list[Any]) -> list[str]:
        return [entry.id for entry in entries]

    assert ids(await outbox.entries(State.PENDING, key=GLOBAL_LINE)) == ["news-1"]
    assert ids(await outbox.entries(State.SENT, key=GLOBAL_LINE)) == ["news-2"]
    assert ids(await outbox.entries(State.PENDING, type="payment.captured")) == ["pay-1", "pay-2"]
    assert ids(await outbox.entries(State.PENDING, type="order.placed")) == ["o1"]
    assert ids(await outbox.entries(State.PENDING, key="customer-9")) == ["pay-1", "refund-1", "o1"]
    both = await outbox.entries(State.PENDING, key="customer-9", type="payment.captured")
    assert ids(both) == ["pay-1"]
    assert await outbox.entries(State.PENDING, type="payment") == []  # a type, not a prefix
    [keyless] = await outbox.entries(State.PENDING, key=GLOBAL_LINE)
    assert (keyless.event, keyless.lane) == (KEYLESS, GLOBAL_LINE)
    assert keyless.to_dict()["data"] == KEYLESS["data"] and "key" not in keyless.to_dict()


@pytest.mark.parametrize(
    ("limit", "after"), [(0, None), (publisher.store.MAX_PAGE + 1, None), (True, None), (5, -1)]
)
async def test_list_refuses_a_bad_page(
    outbox: Outbox, backend: Backend, limit: int, after: int | None
) -> None:
    await accept(outbox, "a")
    before = contents(backend)
    with pytest.raises(ValueError, match=r"limit|after"):
        await outbox.entries(State.PENDING, limit, after=after)
    assert contents(backend) == before


async def test_sent_per_interval_counts_the_marks_of_each_recent_interval(
    outbox: Outbox, backend: Backend
) -> None:
    ids = [f"r{n}" for n in range(7)]
    await accept(outbox, *ids)
    for event_id in ids:
        await outbox.mark_sent(event_id, ACK)
    now = time.time()
    # r0 marked 25 s ago, r1 and r2 15 s ago, r3 an hour ago; r4-r6 just now.
    for event_id, age_s in (("r0", 25), ("r1", 15), ("r2", 15), ("r3", 3600)):
        backend.execute(
            f"UPDATE outbox_entries SET sent_at = {now - age_s} WHERE id = '{event_id}'"
        )

    assert await outbox.sent_per_interval(10.0, 3) == [1, 2, 3]
    assert await outbox.sent_per_interval(30.0, 1) == [6]
    assert sum(await outbox.sent_per_interval(60.0, 100)) == 7


@pytest.mark.parametrize(
    ("interval_s", "intervals"), [(0.0, 5), (-1.0, 5), (True, 5), (10.0, 0), (10.0, 1001)]
)
async def test_sent_per_interval_refuses_bad_arguments(
    outbox: Outbox, interval_s: float, intervals: int
) -> None:
    with pytest.raises(ValueError, match=r"interval|limit"):
        await outbox.sent_per_interval(interval_s, intervals)


# ---------------------------------------------------------------- prune


async def test_prune_deletes_only_sent_entries_older_than_the_cutoff(
    outbox: Outbox, backend: Backend
) -> None:
    ids = [f"o{n}" for n in range(10)]
    await accept(outbox, *ids)
    for event_id in ids[:6]:
        await outbox.mark_sent(event_id, ACK)
    await outbox.quarantine("o6", "x", "alice")
    # o0-o3 were sent two hours ago; o4, o5 just now. Every row was queued long ago.
    backend.execute(
        "UPDATE outbox_entries SET sent_at = sent_at - 7200 WHERE id IN ('o0','o1','o2','o3')",
        "UPDATE outbox_entries SET queued_at = queued_at - 86400",
    )

    deleted = await outbox.prune(older_than_s=3600, batch=3)

    assert deleted == 4
    assert sorted(states(backend)) == ["o4", "o5", "o6", "o7", "o8", "o9"]
    assert states(backend)["o6"] == (0, 1)
    assert count(backend, "outbox_orders") == 10
    assert await pending_ids(outbox) == ["o7", "o8", "o9"]
    assert await outbox.prune(older_than_s=3600, batch=3) == 0
    # The outbox keeps the IDs it pruned (trace says so), none other.
    assert [await outbox.pruned(i) for i in ("o0", "o3", "o4", "o6", "o9", "nope")] == [
        *(True, True),
        *(False, False, False, False),
    ]


@pytest.mark.parametrize(("sent", "batch"), [(7, 3), (6, 3), (5, 1), (4, 500)])
async def test_prune_works_through_any_number_of_batches(
    outbox: Outbox, backend: Backend, sent: int, batch: int
) -> None:
    ids = [f"s{n}" for n in range(sent)]
    await accept(outbox, *ids, "pending-1")
    for event_id in ids:
        await outbox.mark_sent(event_id, ACK)
    await asyncio.sleep(TICK_S)

    assert await outbox.prune(older_than_s=0, batch=batch) == sent

    assert backend.query("SELECT id FROM outbox_entries") == [("pending-1",)]


async def test_prune_never_touches_pending_or_quarantined_however_old(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "p", "q")
    await outbox.quarantine("q", "x", "alice")
    backend.execute("UPDATE outbox_entries SET queued_at = queued_at - 10 * 86400")
    before = backend.query("SELECT * FROM outbox_entries ORDER BY seq")

    assert await outbox.prune(older_than_s=0) == 0

    assert backend.query("SELECT * FROM outbox_entries ORDER BY seq") == before


async def test_prune_keeps_the_seq_of_what_remains(outbox: Outbox, backend: Backend) -> None:
    await accept(outbox, "a", "b", "c")
    await outbox.mark_sent("a", ACK)
    await asyncio.sleep(TICK_S)
    await outbox.prune(older_than_s=0)
    await accept(outbox, "d")
    assert seqs(backend) == {"b": 2, "c": 3, "d": 4}


async def test_a_pruned_entry_leaves_its_duplicates_duplicates_and_its_conflicts_conflicts(
    outbox: Outbox, backend: Backend
) -> None:
    await accept(outbox, "a", "b", qty=7)
    await outbox.mark_sent("a", ACK)
    await asyncio.sleep(TICK_S)
    assert await outbox.prune(older_than_s=0) == 1
    before = contents(backend)  # a's order row is kept, its entry is gone

    assert await outbox.accept(order("a", qty=7)) == "duplicate"
    for changed in (order("a", qty=8), order("a", sku="tea")):
        with pytest.raises(Conflict):
            await outbox.accept(changed)
    outcomes = await outbox.accept_many(
        [order("a", qty=7), order("a", qty=8), {"qty": 7, "sku": "snack", "id": "a"}]
    )
    assert outcomes[0] == outcomes[2] == "duplicate" and isinstance(outcomes[1], Conflict)
    together = await asyncio.gather(
        *(outbox.accept(order("a", qty=qty)) for qty in (7, 8)), return_exceptions=True
    )
    assert together[0] == "duplicate" and isinstance(together[1], Conflict)
    assert contents(backend) == before
    assert await pending_ids(outbox) == ["b"]


@pytest.mark.parametrize("shape", list(EVENTS))
async def test_a_pruned_event_again_is_a_duplicate_and_another_under_its_id_a_conflict(
    outbox: Outbox, backend: Backend, shape: str
) -> None:
    one = EVENTS[shape]
    assert await outbox.publish_many([one, PAYMENT | {"id": "kept"}]) == ["accepted"] * 2
    await outbox.mark_sent(one["id"], ACK)
    await asyncio.sleep(TICK_S)
    assert await outbox.prune(older_than_s=0) == 1
    # What is kept of it: the digest of its canonical text, as the sink computes it.
    assert backend.query("SELECT id, digest FROM outbox_pruned") == [
        (one["id"], digest_of(canonical_json(one)))  # type: ignore[arg-type]
    ]
    before = contents(backend)
    changes = [
        {**one, "type": one["type"] + ".v2"},
        {**one, "key": "another-key"},
        without(one, "key") if "key" in one else {**one, "key": "customer-9"},
        with_data(one, added=None),
    ]

    for way in PUBLISH_WAYS.values():
        outcomes = await way(outbox, [one, *changes, copy.deepcopy(one)])
        assert outcomes[0] == outcomes[-1] == "duplicate", way
        assert all(isinstance(outcome, Conflict) for outcome in outcomes[1:-1]), outcomes
    with backend.user_connection() as conn:
        assert publish_in(conn, one) == "duplicate"
        for changed in changes:
            with pytest.raises(Conflict):
                publish_in(conn, changed)
        conn.commit()
    assert contents(backend) == before
    assert await pending_ids(outbox) == ["kept"]


# ---------------------------------------------------------------- snapshot


async def test_snapshot_of_an_empty_outbox(outbox: Outbox) -> None:
    snapshot = await outbox.snapshot()
    assert (snapshot.pending, snapshot.quarantined, snapshot.head) == (0, 0, None)
    assert snapshot.oldest_pending_age_s == 0.0
    assert snapshot.to_dict() == {
        "pending": 0,
        "oldest_pending_age_seconds": 0.0,
        "quarantined": 0,
        "head_blocked": False,
        "head": None,
        "blocked_lanes": [],
    }


async def test_snapshot_counts_and_oldest_age(outbox: Outbox, backend: Backend) -> None:
    await accept(outbox, "a", "b", "c", "d")
    await outbox.mark_sent("a", ACK)
    await outbox.quarantine("c", "x", "alice")
    backend.execute(
        "UPDATE outbox_entries SET queued_at = queued_at - 100 WHERE id = 'b'",
        "UPDATE outbox_entries SET queued_at = queued_at - 500 WHERE id IN ('a', 'c')",
    )

    snapshot = await outbox.snapshot()

    assert (snapshot.pending, snapshot.quarantined) == (2, 1)
    assert snapshot.head is not None
    assert (snapshot.head.id, snapshot.head.seq, snapshot.head.blocked) == ("b", 2, False)
    # The oldest pending entry is b: sent and quarantined entries do not count.
    assert 100 <= snapshot.oldest_pending_age_s < 130
    figures = snapshot.to_dict()
    assert figures["head_blocked"] is False
    assert figures["head"]["id"] == "b"


async def test_snapshot_reports_a_failing_head_as_blocked(outbox: Outbox) -> None:
    await accept(outbox, "a", "b")
    await outbox.record_failure("a", "sink rejected it with 409")
    await outbox.record_failure("a", "sink rejected it with 409 again")

    snapshot = await outbox.snapshot()

    head = snapshot.head
    assert head is not None
    assert (head.id, head.attempts, head.last_error) == ("a", 2, "sink rejected it with 409 again")
    assert head.blocked and head.blocked_since is not None
    figures = snapshot.to_dict()
    assert figures["head_blocked"] is True
    assert figures["head"]["blocked_since"] == head.blocked_since
    await outbox.quarantine("a", "poison", "alice")
    after = await outbox.snapshot()
    assert after.head is not None and after.head.id == "b" and not after.head.blocked
    assert after.to_dict()["head_blocked"] is False


async def test_failure_behind_the_head_does_not_block_it(outbox: Outbox) -> None:
    await accept(outbox, "a", "b")
    await outbox.record_failure("b", "earlier run")
    head = (await outbox.snapshot()).head
    assert head is not None and head.id == "a" and not head.blocked


async def test_other_connections_see_the_same_figures(outbox: Outbox, backend: Backend) -> None:
    await accept(outbox, "a", "b")
    async with Outbox.open(backend.location) as other:
        await other.quarantine("a", "x", "alice")
        await accept(other, "c")
    snapshot = await outbox.snapshot()
    assert (snapshot.pending, snapshot.quarantined) == (2, 1)


# ---------------------------------------------------------------- the seam

ROW_TYPES = ("Pending", "Mark", "Entry", "QuarantineRecord", "Order", "Head", "Snapshot")
LIMITS = ("MAX_READ", "PRUNE_BATCH", "DELIVERED_PAST_KEPT")

# Imports every publisher module but the backends, in a fresh interpreter, and names
# the storage modules that came with them.
_LOADED_WITH_THE_SERVICES = """
import importlib, json, pkgutil, sys
import publisher
for module in pkgutil.iter_modules(publisher.__path__):
    if module.name not in ("backends", "__main__"):
        importlib.import_module("publisher." + module.name)
storage = (
    "publisher.backends", "sqlite_tx", "aiosqlite", "sqlite3", "pg_tx", "psycopg", "psycopg_pool"
)
loaded = [m for m in sys.modules if any(m == s or m.startswith(s + ".") for s in storage)]
print(json.dumps(sorted(loaded)))
"""


def test_rows_states_and_limits_are_defined_by_the_interface() -> None:
    defined_elsewhere = {
        name: getattr(publisher.store, name).__module__
        for name in (*ROW_TYPES, "State", "Outbox", "check_limit")
        if getattr(publisher.store, name).__module__ != "publisher.store"
    }
    assert defined_elsewhere == {}
    assert [type(getattr(publisher.store, name)) for name in LIMITS] == [int] * len(LIMITS)


def test_the_services_load_no_backend() -> None:
    assert json_of_python(_LOADED_WITH_THE_SERVICES) == []


# ------------------------------------------------------------------ writability probe


async def test_check_writable_returns_while_the_database_takes_writes(
    outbox: Outbox, backend: Backend
) -> None:
    started = time.monotonic()
    for _ in range(20):
        assert await outbox.check_writable() is None
    assert time.monotonic() - started < 2.0  # cheap enough for a probe every second
    assert not backend.others_cannot_write()
    await accept(outbox, "a")
    assert unsent(backend) == ["a"]


@pytest.mark.parametrize("fault", FAULTS)
async def test_check_writable_raises_while_the_database_cannot_be_written(
    outbox: Outbox, backend: Backend, fault: Fault
) -> None:
    await accept(outbox, "a")
    with backend.unwritable(fault):
        assert backend.others_cannot_write()  # the fault is real
        with pytest.raises(StorageError) as failed:
            await outbox.check_writable()
        assert str(failed.value).strip()
    # Fixed: the probe says so at once, and the outbox takes writes again.
    assert await outbox.check_writable() is None
    await accept(outbox, "b")
    assert unsent(backend) == ["a", "b"]


@pytest.mark.parametrize("table", ["outbox_entries", "outbox_orders"])
async def test_a_trial_of_the_real_writes_fails_while_they_fail_and_keeps_nothing(
    outbox: Outbox, backend: Backend, table: str
) -> None:
    # What readiness asks once a real write failed: the probe's own row passes while a
    # trigger refuses every insert into the real tables, this must not.
    await accept(outbox, "a")
    before = contents(backend)
    await outbox.check_real_writes()
    with backend.refusing_inserts(table, "real writes refused"):
        await outbox.check_writable()  # the probe's row is still writable
        with pytest.raises(StorageError, match="real writes refused"):
            await outbox.check_real_writes()
    await outbox.check_real_writes()
    assert contents(backend) == before


# ------------------------------------------------------------------ one relay per outbox

# A relay in another process: takes the lock, says so, and holds it until killed.
_HOLDER = """
import asyncio, sys
from publisher.store import Outbox

async def main():
    async with Outbox.open(sys.argv[1]) as outbox, outbox.relay_lock("relay in a child"):
        print("held", flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_second_relay_lock_is_refused_naming_the_holder_until_it_is_released(
    outbox: Outbox, backend: Backend
) -> None:
    async with Outbox.open(backend.location) as other:
        async with outbox.relay_lock("publisher serve"):
            with pytest.raises(RelayAlreadyRunning) as refused:
                async with other.relay_lock("publisher dispatch"):
                    pytest.fail("two holders of the relay lock")
            message = str(refused.value)
            assert f"process {os.getpid()}" in message
            assert "publisher serve" in message
            assert isinstance(refused.value, OutboxError)
            # Intake and the operators' reads and writes do not need the lock.
            await accept(other, "a", "b")
            await other.quarantine("b", "held back", "op")
            await other.redrive("b", "op")
            assert (await other.snapshot()).pending == 2
            assert [e.id for e in await other.entries(State.PENDING)] == ["a", "b"]
        async with other.relay_lock("publisher serve"):  # released: free at once
            with pytest.raises(RelayAlreadyRunning):
                async with outbox.relay_lock("again"):
                    pass
    async with outbox.relay_lock("and again"):  # an error inside released it too
        pass


async def test_the_relay_lock_of_a_killed_process_is_free_at_once(
    outbox: Outbox, backend: Backend
) -> None:
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, backend.location],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "held\n"
        with pytest.raises(RelayAlreadyRunning, match=f"relay in a child, process {child.pid} "):
            async with outbox.relay_lock("publisher serve"):
                pass
        child.send_signal(signal.SIGKILL)  # no shutdown code runs
        child.wait(timeout=10)
        started = time.monotonic()
        async with outbox.relay_lock("publisher serve"):
            assert time.monotonic() - started < 1.0
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


# ---------------------------------------------------------------- leases

TTL_S = 30.0  # long enough never to run out by itself during a test


def lease_rows(backend: Backend) -> list[tuple[Any, ...]]:
    return backend.query("SELECT line, owner, epoch FROM outbox_line_leases ORDER BY line")


def expire(backend: Backend, line: str) -> None:
    """Time passing: the line's lease ran out (its owner and epoch stay)."""
    backend.execute(f"UPDATE outbox_line_leases SET expires_at = 1 WHERE line = '{line}'")


def lease(outbox: Outbox, line: str, epoch: int) -> Lease:
    return Lease(outbox.source, line, epoch)


async def test_the_source_is_one_stable_id_per_outbox(backend: Backend, tmp_path: Path) -> None:
    async with Outbox.open(backend.location) as outbox:
        source = outbox.source
    async with Outbox.open(backend.location) as outbox, Outbox.open(backend.location) as other:
        assert outbox.source == other.source == source
    assert re.fullmatch(r"[0-9a-f]{16}", source)
    assert Lease(source, GLOBAL_LINE, 1).header() == f"{source} * 1"
    async with Outbox.open(tmp_path / "another.db") as another:
        assert another.source != source


async def test_a_line_never_leased_is_taken_at_epoch_1(outbox: Outbox, backend: Backend) -> None:
    assert await outbox.lease_of("snack") is None
    assert await outbox.take_lease("snack", "w1", TTL_S) == 1
    assert lease_rows(backend) == [("snack", "w1", 1)]
    held = await outbox.lease_of("snack")
    assert held is not None and held.held
    assert (held.line, held.owner, held.epoch) == ("snack", "w1", 1)
    assert TTL_S - 5 < held.expires_in_s <= TTL_S
    assert held.expires_at == pytest.approx(held.taken_at + TTL_S)  # type: ignore[operator]
    assert held.renewed_at == held.taken_at


async def test_another_owner_is_refused_while_the_lease_holds(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.take_lease(GLOBAL_LINE, "w1", TTL_S) == 1
    before = backend.query("SELECT * FROM outbox_line_leases")
    async with Outbox.open(backend.location) as other:
        assert await other.take_lease(GLOBAL_LINE, "w2", TTL_S) is None
    assert backend.query("SELECT * FROM outbox_line_leases") == before


async def test_an_expired_lease_is_taken_over_under_the_next_epoch(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.take_lease("snack", "w1", 0.2) == 1
    assert await outbox.take_lease("snack", "w2", TTL_S) is None
    await asyncio.sleep(0.3)  # the lease runs out by itself
    stale = await outbox.lease_of("snack")
    assert stale is not None and not stale.held and stale.expires_in_s < 0
    assert await outbox.take_lease("snack", "w2", TTL_S) == 2
    assert lease_rows(backend) == [("snack", "w2", 2)]


async def test_the_owner_taking_its_own_line_again_raises_the_epoch(
    outbox: Outbox, backend: Backend
) -> None:
    # A restart under the same --worker-id: its lines at once, its old writes fenced.
    assert await outbox.take_lease("snack", "w1", TTL_S) == 1
    assert await outbox.take_lease("snack", "w1", TTL_S) == 2
    assert lease_rows(backend) == [("snack", "w1", 2)]


async def test_renewal_extends_the_leases_still_held_and_names_them(
    outbox: Outbox, backend: Backend
) -> None:
    for line in ("juice", "snack", "tea"):
        assert await outbox.take_lease(line, "w1", 1.0) == 1
    expire(backend, "tea")  # expired, but nobody took it: still w1's
    assert await outbox.renew_leases("w1", {"juice": 1, "snack": 1, "tea": 1}, TTL_S) == {
        "juice",
        "snack",
        "tea",
    }
    for held in await outbox.leases():
        assert held.held and TTL_S - 5 < held.expires_in_s <= TTL_S
        assert held.renewed_at is not None and held.taken_at is not None
        assert held.renewed_at >= held.taken_at
    assert await outbox.renew_leases("w1", {}, TTL_S) == set()


async def test_renewal_loses_a_line_taken_over_and_leaves_it_to_its_new_owner(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.take_lease("juice", "w1", TTL_S) == 1
    assert await outbox.take_lease("snack", "w1", TTL_S) == 1
    expire(backend, "snack")
    assert await outbox.take_lease("snack", "w2", TTL_S) == 2
    before = backend.query("SELECT * FROM outbox_line_leases WHERE line = 'snack'")
    assert await outbox.renew_leases("w1", {"juice": 1, "snack": 1}, TTL_S) == {"juice"}
    assert backend.query("SELECT * FROM outbox_line_leases WHERE line = 'snack'") == before
    # The owner's name alone is not enough: the epoch must match too.
    assert await outbox.renew_leases("w2", {"snack": 1}, TTL_S) == set()


async def test_a_released_line_is_taken_at_once_under_the_next_epoch(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.take_lease("snack", "w1", TTL_S) == 1
    await outbox.release_leases("w1", {"snack": 1})
    released = await outbox.lease_of("snack")
    assert released is not None and released.owner is None and not released.held
    assert released.epoch == 1
    assert await outbox.renew_leases("w1", {"snack": 1}, TTL_S) == set()
    assert await outbox.take_lease("snack", "w2", TTL_S) == 2
    assert lease_rows(backend) == [("snack", "w2", 2)]


async def test_a_release_under_a_lost_epoch_changes_nothing(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.take_lease("snack", "w1", TTL_S) == 1
    expire(backend, "snack")
    assert await outbox.take_lease("snack", "w2", TTL_S) == 2
    before = backend.query("SELECT * FROM outbox_line_leases")
    await outbox.release_leases("w1", {"snack": 1})
    await outbox.release_leases("w1", {"snack": 2})  # not w1's epoch ever
    await outbox.release_leases("w2", {"snack": 1})
    await outbox.release_leases("w2", {})
    assert backend.query("SELECT * FROM outbox_line_leases") == before


async def test_leases_lists_every_line_in_line_order(outbox: Outbox, backend: Backend) -> None:
    assert await outbox.leases() == []
    for line, worker in (("tea", "w1"), (GLOBAL_LINE, "w2"), ("Juice", "w1"), ("juice", "w2")):
        assert await outbox.take_lease(line, worker, TTL_S) == 1
    await outbox.release_leases("w1", {"tea": 1})
    listed = await outbox.leases()
    assert [(x.line, x.owner, x.epoch) for x in listed] == [
        (GLOBAL_LINE, "w2", 1),
        ("Juice", "w1", 1),
        ("juice", "w2", 1),
        ("tea", None, 1),
    ]
    assert listed[0].to_dict()["line"] == GLOBAL_LINE
    assert set(listed[0].to_dict()) == {
        "line",
        "owner",
        "epoch",
        "expires_at",
        "expires_in_seconds",
        "taken_at",
        "renewed_at",
    }


# A worker's writes for a line, each under a lease: (the write, what it changes).
FENCED_WRITES = {
    "mark": lambda outbox, lease: outbox.mark_sent("a", ACK, lease),
    "mark many": lambda outbox, lease: outbox.mark_sent_many([Mark("a"), Mark("b")], lease),
    "record failure": lambda outbox, lease: outbox.record_failure("a", "HTTP 503", lease),
    "quarantine": lambda outbox, lease: outbox.quarantine("a", "poison", "relay", lease),
}


# What each write leaves of entry "a": (attempts, sent, quarantined).
WRITTEN = {
    "mark": (1, 1, 0),
    "mark many": (1, 1, 0),
    "record failure": (1, 0, 0),
    "quarantine": (0, 0, 1),
}


@pytest.mark.parametrize("write", list(FENCED_WRITES))
async def test_a_write_under_a_lost_epoch_is_refused_and_changes_nothing(
    outbox: Outbox, backend: Backend, write: str
) -> None:
    await accept(outbox, "a", "b")
    assert await outbox.take_lease("snack", "w1", TTL_S) == 1
    expire(backend, "snack")
    assert await outbox.take_lease("snack", "w2", TTL_S) == 2
    before = contents(backend)
    with pytest.raises(LeaseLost) as lost:
        await FENCED_WRITES[write](outbox, lease(outbox, "snack", 1))
    assert (lost.value.line, lost.value.epoch) == ("snack", 1)
    assert "epoch 2" in str(lost.value)
    assert not isinstance(lost.value, DeliveryError)  # not a failed delivery
    assert contents(backend) == before
    # The new owner's write goes through.
    await FENCED_WRITES[write](outbox, lease(outbox, "snack", 2))
    assert contents(backend) != before


@pytest.mark.parametrize("write", list(FENCED_WRITES))
async def test_a_write_under_the_current_epoch_is_made_even_once_expired(
    outbox: Outbox, backend: Backend, write: str
) -> None:
    # The epoch is what fences; expiry only lets another worker take the line.
    await accept(outbox, "a", "b")
    assert await outbox.take_lease("snack", "w1", TTL_S) == 1
    expire(backend, "snack")
    await FENCED_WRITES[write](outbox, lease(outbox, "snack", 1))
    written = backend.query("SELECT attempts, sent, quarantined FROM outbox_entries WHERE id = 'a'")
    assert written == [WRITTEN[write]]


@pytest.mark.parametrize("write", list(FENCED_WRITES))
async def test_a_write_under_a_lease_never_taken_or_of_another_outbox_is_refused(
    outbox: Outbox, backend: Backend, write: str
) -> None:
    await accept(outbox, "a", "b")
    assert await outbox.take_lease("snack", "w1", TTL_S) == 1
    before = contents(backend)
    for refused in (lease(outbox, "juice", 1), Lease("0123456789abcdef", "snack", 1)):
        with pytest.raises(LeaseLost):
            await FENCED_WRITES[write](outbox, refused)
    assert contents(backend) == before


async def test_an_operator_is_never_fenced(outbox: Outbox, backend: Backend) -> None:
    await accept(outbox, "a", "b")
    assert await outbox.take_lease("snack", "w1", TTL_S) == 1
    await outbox.quarantine("a", "held back", "op")
    await outbox.redrive("a", "op")
    await outbox.record_failure("b", "by hand")
    await outbox.mark_sent("b")
    assert states(backend) == {"a": (0, 0), "b": (1, 0)}


async def test_a_lost_lease_fails_its_own_marks_only_when_marks_share_a_commit(
    outbox: Outbox, backend: Backend
) -> None:
    for n, sku in enumerate(("juice", "snack", "tea", "juice", "snack", "tea")):
        assert await outbox.accept(order(f"e{n}", sku)) == "accepted"
    for line in ("juice", "snack", "tea"):
        assert await outbox.take_lease(line, "w1", TTL_S) == 1
    expire(backend, "snack")
    assert await outbox.take_lease("snack", "w2", TTL_S) == 2
    results = await asyncio.gather(
        outbox.mark_sent_many([Mark("e0"), Mark("e3")], lease(outbox, "juice", 1)),
        outbox.mark_sent_many([Mark("e1"), Mark("e4")], lease(outbox, "snack", 1)),
        outbox.mark_sent_many([Mark("e2"), Mark("e5")], lease(outbox, "tea", 1)),
        outbox.mark_sent_many([Mark("e1")]),  # no lease: not checked
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None and results[3] is None
    assert isinstance(results[1], LeaseLost)
    assert unsent(backend) == ["e4"]


async def test_pending_lanes_leaves_out_only_the_lanes_another_worker_holds(
    outbox: Outbox, backend: Backend
) -> None:
    for n, sku in enumerate(("juice", "snack", "tea", "water", "wine")):
        assert await outbox.accept(order(f"e{n}", sku)) == "accepted"
    assert await outbox.take_lease("juice", "w1", TTL_S) == 1  # its own
    assert await outbox.take_lease("snack", "w2", TTL_S) == 1  # another's
    assert await outbox.take_lease("tea", "w2", TTL_S) == 1  # another's, expired
    expire(backend, "tea")
    assert await outbox.take_lease("water", "w2", TTL_S) == 1  # another's, released
    await outbox.release_leases("w2", {"water": 1})
    every = ["juice", "snack", "tea", "water", "wine"]
    assert await outbox.pending_lanes(10) == every
    assert await outbox.pending_lanes(10, worker="w1") == ["juice", "tea", "water", "wine"]
    assert await outbox.pending_lanes(2, ["juice"], worker="w1") == ["tea", "water"]
    assert await outbox.pending_lanes(10, worker="w2") == every[1:]
    assert await outbox.pending_lanes(10, worker="w3") == ["tea", "water", "wine"]


async def test_worker_seen_counts_the_workers_seen_within_one_ttl(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.worker_seen("w1", TTL_S) == 1
    assert await outbox.worker_seen("w1", TTL_S) == 1
    async with Outbox.open(backend.location) as other:
        assert await other.worker_seen("w2", TTL_S) == 2
    assert await outbox.worker_seen("w3", TTL_S) == 3
    backend.execute(
        f"UPDATE outbox_relay_workers SET seen_at = seen_at - {2 * TTL_S} WHERE worker = 'w2'"
    )
    assert await outbox.worker_seen("w1", TTL_S) == 2  # w2 stopped beating
    await outbox.worker_gone("w3")
    assert await outbox.worker_seen("w1", TTL_S) == 1
    assert backend.query("SELECT worker FROM outbox_relay_workers ORDER BY worker") == [
        ("w1",),
        ("w2",),
    ]


async def test_workers_lists_every_worker_remembered_live_or_gone(
    outbox: Outbox, backend: Backend
) -> None:
    assert await outbox.workers(TTL_S) == []
    before = time.time()
    for worker in ("w2", "w1", "w3"):
        await outbox.worker_seen(worker, TTL_S)
    listed = await outbox.workers(TTL_S)
    assert [(w.worker, w.live) for w in listed] == [("w1", True), ("w2", True), ("w3", True)]
    for w in listed:
        assert before - 1 <= w.started_at <= w.seen_at <= time.time() + 1  # the store's clock
        assert -1 < w.seen_ago_s < 5
    # w2 stopped beating (killed, paused): still listed, not live; w3 stopped cleanly:
    # forgotten; one not seen for longer than WORKERS_KEPT_S is not listed either.
    backend.execute(
        f"UPDATE outbox_relay_workers SET seen_at = seen_at - {3 * TTL_S} WHERE worker = 'w2'"
    )
    await outbox.worker_gone("w3")
    kept = publisher.store.WORKERS_KEPT_S + 60
    backend.execute(
        "INSERT INTO outbox_relay_workers (worker, seen_at, started_at)"
        f" SELECT 'w0', seen_at - {kept}, started_at - {kept}"
        " FROM outbox_relay_workers WHERE worker = 'w1'"
    )
    w1, w2 = await outbox.workers(TTL_S)
    assert (w1.worker, w1.live, w2.worker, w2.live) == ("w1", True, "w2", False)
    assert 3 * TTL_S - 1 < w2.seen_ago_s < 3 * TTL_S + 5
    assert w2.started_at == listed[1].started_at  # a beat moves seen_at only
    # Live is judged against the ttl asked for, as worker_seen counts the live.
    assert [w.live for w in await outbox.workers(4 * TTL_S)] == [True, True]
    with pytest.raises(ValueError, match="positive number of seconds"):
        await outbox.workers(0)


async def test_a_workers_first_note_since_it_started_starts_its_uptime_again(
    outbox: Outbox, backend: Backend
) -> None:
    await outbox.worker_seen("w1", TTL_S, first=True)
    backend.execute("UPDATE outbox_relay_workers SET started_at = started_at - 100")
    await outbox.worker_seen("w1", TTL_S)  # a beat
    [beaten] = await outbox.workers(TTL_S)
    assert beaten.seen_at - beaten.started_at > 99
    await outbox.worker_seen("w1", TTL_S, first=True)  # restarted under its ID
    [restarted] = await outbox.workers(TTL_S)
    assert restarted.started_at == restarted.seen_at  # one clock reading, the store's


async def test_workers_not_seen_for_long_are_forgotten(outbox: Outbox, backend: Backend) -> None:
    for worker in ("w1", "w2", "w3"):
        await outbox.worker_seen(worker, TTL_S)
    backend.execute(
        f"UPDATE outbox_relay_workers SET seen_at = seen_at - {publisher.store.WORKERS_KEPT_S + 60}"
        " WHERE worker <> 'w2'"
    )
    started = dict(backend.query("SELECT worker, started_at FROM outbox_relay_workers"))
    assert await outbox.worker_seen("w1", TTL_S) == 2
    assert backend.query("SELECT worker FROM outbox_relay_workers ORDER BY worker") == [
        ("w1",),
        ("w2",),
    ]
    assert (
        dict(backend.query("SELECT worker, started_at FROM outbox_relay_workers"))["w1"]
        == started["w1"]
    )


@pytest.mark.parametrize(
    ("line", "ttl_s"),
    [("snack", 0), ("snack", -1.0), ("snack", float("nan")), ("snack", True), ("no spaces", 1.0)],
)
async def test_a_lease_of_a_bad_line_or_ttl_is_refused_and_changes_nothing(
    outbox: Outbox, backend: Backend, line: str, ttl_s: float
) -> None:
    with pytest.raises(ValueError):
        await outbox.take_lease(line, "w1", ttl_s)
    assert lease_rows(backend) == []
    if line == "snack":
        with pytest.raises(ValueError, match="positive number of seconds"):
            await outbox.renew_leases("w1", {"snack": 1}, ttl_s)
        with pytest.raises(ValueError, match="positive number of seconds"):
            await outbox.worker_seen("w1", ttl_s)
        assert count(backend, "outbox_relay_workers") == 0
