"""Batch delivery: the sink's POST /events/batch, dispatch_batch, HttpSender.deliver_batch
and the relay in batch mode.

Real SQLite files, real aiohttp servers on loopback; every outcome on disk is read
through independent sqlite3 connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import aiohttp
import pytest
from aiohttp import web
from relay_lines import relay_of
from support import (
    Callables,
    ack,
    event,
    eventually,
    inbox_ids,
    inventory,
    placed,
    sent_events,
    sent_flags,
)

from publisher.cli.dispatch import deliver_pending
from publisher.dispatch import dispatch_batch
from publisher.errors import DeliveryError, NotAcknowledged, Rejected
from publisher.http import HttpSender
from publisher.relay import Relay
from publisher.retry import RetryPolicy
from publisher.settings import RelaySettings
from publisher.store import Outbox
from shared import MAX_BATCH_BODY_BYTES, Event, Lease, Receipt, canonical_json, make_ack
from sink import create_app
from sqlite_tx import StorageError

if TYPE_CHECKING:
    from conftest import Query, Serve, ServeSink

STOP_TIMEOUT_S = 5.0
FAST = RetryPolicy(base_s=0.05, cap_s=0.2)


async def post_batch(
    client: aiohttp.ClientSession,
    base: str,
    body: object,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    # From a stream: aiohttp warns of a large body given as bytes.
    data = io.BytesIO(body if isinstance(body, bytes) else json.dumps(body).encode())
    headers = {"Content-Type": "application/json", **(headers or {})}
    async with client.post(f"{base}/events/batch", data=data, headers=headers) as response:
        text = await response.text()
        return response.status, json.loads(text) if text else None


# ================================================================ the sink's batch endpoint


async def test_batch_applies_every_event_in_the_order_sent(
    sink_base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    # Not in text order, two keys, the full 16.
    events = [
        placed(f"z{n:02d}" if n % 2 else f"a{n:02d}", "snack" if n % 3 else "juice", n + 1)
        for n in range(16)
    ]

    status, reply = await post_batch(client, sink_base, {"events": events})

    assert status == 200, reply
    assert reply == {"acks": [ack(e) for e in events], "rejected": None}
    assert inbox_ids(sink_db) == [e["id"] for e in events]
    assert inventory(sink_db) == {
        "snack": sum(e["data"]["qty"] for e in events if e["key"] == "snack"),
        "juice": sum(e["data"]["qty"] for e in events if e["key"] == "juice"),
    }
    payloads = dict(db_rows(sink_db, "SELECT id, payload FROM inbox_events"))
    assert all(payloads[e["id"]] == canonical_json(e) for e in events)


@pytest.mark.parametrize("k", [0, 2, 4])
async def test_a_conflict_at_k_applies_the_prefix_and_nothing_from_k_on(
    sink_base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query, k: int
) -> None:
    events = [placed(f"e{n}", qty=10**n) for n in range(5)]
    # The same ID already holds another payload at the sink.
    async with client.post(f"{sink_base}/events", json=placed(f"e{k}", qty=7)) as response:
        assert response.status == 200

    status, reply = await post_batch(client, sink_base, {"events": events})

    assert status == 200, reply
    assert reply["acks"] == [ack(e) for e in events[:k]]
    rejected = reply["rejected"]
    assert (rejected["index"], rejected["status"], rejected["error"]) == (k, 409, "conflict")
    assert rejected["id"] == events[k]["id"]
    assert inbox_ids(sink_db) == [events[k]["id"]] + [e["id"] for e in events[:k]]
    assert db_rows(
        sink_db, "SELECT payload, deliveries FROM inbox_events WHERE id = ?", (f"e{k}",)
    ) == [(canonical_json(placed(f"e{k}", qty=7)), 1)]
    assert inventory(sink_db) == {"snack": 7 + sum(e["data"]["qty"] for e in events[:k])}


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"id": "e2", "type": "order.placed", "key": "snack"}, "/data"),
        ({"id": "e2", "type": "order.placed", "key": "snack", "data": [1]}, "/data"),
        ({"id": "e2", "key": "snack", "data": {}}, "/type"),
        ({**placed("e2"), "note": "x"}, "/note"),
        ({**placed("e2"), "id": "-e2"}, "/id"),
        ({**placed("e2"), "key": "a b"}, "/key"),
        ({**placed("e2"), "data": {"n": 2**53}}, "/data/n"),
        ({"id": "e2", "sku": "snack", "qty": True}, "qty"),  # an order of the previous release
        ("e2", None),
    ],
    ids=[
        "missing-data",
        "data-not-an-object",
        "missing-type",
        "extra-field",
        "bad-id",
        "bad-key",
        "not-i-json",
        "previous-release-bool-qty",
        "not-an-object",
    ],
)
async def test_an_invalid_item_at_k_applies_the_prefix_and_nothing_from_k_on(
    sink_base: str,
    client: aiohttp.ClientSession,
    sink_db: Path,
    db_rows: Query,
    item: object,
    field: str | None,
) -> None:
    before = [placed("e0", qty=1), placed("e1", qty=2)]
    after = [placed("e3", qty=4), placed("e4", qty=8)]

    status, reply = await post_batch(client, sink_base, {"events": [*before, item, *after]})

    assert status == 200, reply
    assert reply["acks"] == [ack(e) for e in before]
    rejected = reply["rejected"]
    assert (rejected["index"], rejected["status"]) == (2, 400)
    assert rejected["error"]
    if field is not None:
        assert rejected["field"] == field
    assert inbox_ids(sink_db) == ["e0", "e1"]
    assert inventory(sink_db) == {"snack": 3}


async def test_an_already_applied_id_in_a_batch_is_a_duplicate_with_no_second_effect(
    sink_base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    a, b = placed("a", qty=3), placed("b", "juice", 5)
    async with client.post(f"{sink_base}/events", json=a) as response:
        assert response.status == 200

    status, reply = await post_batch(client, sink_base, {"events": [a, b, b, a]})

    assert status == 200, reply
    assert reply == {
        "acks": [
            ack(a, Receipt.DUPLICATE),
            ack(b),
            ack(b, Receipt.DUPLICATE),
            ack(a, Receipt.DUPLICATE),
        ],
        "rejected": None,
    }
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events ORDER BY rowid") == [
        ("a", 3),
        ("b", 2),
    ]
    assert inventory(sink_db) == {"snack": 3, "juice": 5}


@pytest.mark.parametrize(
    "body",
    [
        [placed("e0")],
        {"events": [placed("e0")], "extra": 1},
        {"event": [placed("e0")]},
        {},
        {"events": []},
        {"events": [placed(f"e{n}") for n in range(17)]},
        {"events": placed("e0")},
        {"events": "e0"},
        {"events": None},
        b'{"events": [',
        b"\xff\xfe",
    ],
    ids=[
        "a-list",
        "extra-key",
        "misspelt-key",
        "empty-object",
        "empty-list",
        "17-events",
        "events-an-object",
        "events-a-string",
        "events-null",
        "not-json",
        "not-utf8",
    ],
)
async def test_a_bad_envelope_is_400_and_changes_nothing(
    sink_base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query, body: object
) -> None:
    status, reply = await post_batch(client, sink_base, body)

    assert status == 400, reply
    assert reply["error"]
    assert inbox_ids(sink_db) == []
    assert inventory(sink_db) == {}


async def test_sixteen_events_is_the_most_accepted(
    sink_base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    status, reply = await post_batch(
        client, sink_base, {"events": [placed(f"e{n:02d}") for n in range(16)]}
    )
    assert status == 200, reply
    assert len(inbox_ids(sink_db)) == 16


async def test_a_body_over_the_batch_cap_is_413_and_changes_nothing(
    sink_base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    events = [placed(f"e{n:02d}") for n in range(16)]
    body = json.dumps({"events": events}).encode()
    body += b" " * (MAX_BATCH_BODY_BYTES + 1 - len(body))

    status, reply = await post_batch(client, sink_base, body)

    assert status == 413, reply
    assert inbox_ids(sink_db) == []


async def test_a_batch_body_over_an_old_16_kib_cap_is_read(
    sink_base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    # README: 413 only over twice the single event cap (MAX_BATCH_BODY_BYTES). A valid
    # batch laid out with generous whitespace (20 KB) is well under that.
    events = [placed(f"e{n:02d}") for n in range(16)]
    body = json.dumps({"events": events}, indent=64).encode()
    body += b" " * (20_000 - len(body))
    assert 16 * 1024 < len(body) < 64 * 1024

    status, reply = await post_batch(client, sink_base, body)

    assert status == 200, reply
    assert inbox_ids(sink_db) == [e["id"] for e in events]


async def test_the_batch_route_needs_the_token_when_one_is_configured(
    serve: Serve, tmp_path: Path, client: aiohttp.ClientSession, db_rows: Query
) -> None:
    sink_db = tmp_path / "guarded.db"
    guarded = await serve(create_app(sink_db, token="s3cret-token"))
    events = [placed("e0", qty=2), placed("e1", qty=3)]

    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
        status, _ = await post_batch(client, guarded, {"events": events}, headers)
        assert status == 401, headers
    assert inbox_ids(sink_db) == []

    status, reply = await post_batch(
        client, guarded, {"events": events}, {"Authorization": "Bearer s3cret-token"}
    )
    assert status == 200, reply
    assert [a["ack"] for a in reply["acks"]] == ["e0", "e1"]
    assert inventory(sink_db) == {"snack": 5}


# ---------------------------------------------------------------- one transaction


def add_trigger(db: Path, table: str, when: str) -> None:
    """An independent connection adds triggers that make writes of `table` for
    which `when` holds fail with 'boom' (the sink has created its schema)."""
    conn = sqlite3.connect(db, timeout=5)
    try:
        for verb in ("INSERT", "UPDATE"):
            conn.execute(
                f"CREATE TRIGGER boom_{verb.lower()} BEFORE {verb} ON {table} "
                f"WHEN {when} BEGIN SELECT RAISE(ABORT, 'boom'); END"
            )
        conn.commit()
    finally:
        conn.close()


BOOM_BATCH: Final = [
    placed("e0", qty=1),
    placed("e1", qty=2),
    placed("e2", "boom", 4),
    placed("e3", qty=8),
]


async def test_a_handler_statement_refused_on_the_third_item_keeps_the_two_before_it(
    sink_base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    # The warehouse's statement for SKU 'boom' is refused: its handler failed.
    add_trigger(sink_db, "inbox_inventory", "NEW.sku = 'boom'")

    status, reply = await post_batch(client, sink_base, {"events": BOOM_BATCH})

    assert status == 200, reply
    assert [ack["ack"] for ack in reply["acks"]] == ["e0", "e1"]
    rejected = reply["rejected"]
    assert (rejected["index"], rejected["status"]) == (2, 503), rejected
    assert (rejected["error"], rejected["id"], rejected["type"]) == (
        "handler failed",
        "e2",
        "order.placed",
    )
    assert "Traceback" not in json.dumps(reply)
    assert inbox_ids(sink_db) == ["e0", "e1"]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 3)]


async def test_a_storage_failure_on_the_third_item_commits_nothing_of_the_batch(
    sink_base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    # The inbox's own row of e2 is refused: the database failed, not a handler.
    add_trigger(sink_db, "inbox_events", "NEW.id = 'e2'")
    events = BOOM_BATCH

    try:
        status, reply = await post_batch(client, sink_base, {"events": events})
    except aiohttp.ClientError:
        pass  # a connection error is an acceptable failure too
    else:
        assert status >= 500, reply
        assert "acks" not in (reply or {})

    assert inbox_ids(sink_db) == []
    assert inventory(sink_db) == {}

    # The same batch without the failing item goes through: the sink is still usable.
    status, reply = await post_batch(client, sink_base, {"events": events[:2]})
    assert status == 200, reply
    assert inbox_ids(sink_db) == ["e0", "e1"]


# ================================================================ dispatch_batch


class PlainStore:
    """The real Outbox behind dispatch_batch's BatchStore interface, with a call log."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.pending_returned: list[Event] = []
        self.mark_calls: list[list[str]] = []

    async def pending(self, limit: int = 16) -> list[Event]:
        self.pending_returned = await self.outbox.pending(limit)
        return self.pending_returned

    async def mark_sent(self, event_id: str) -> None:
        raise AssertionError("dispatch_batch marks through mark_sent_many only")

    async def mark_sent_many(self, event_ids: Sequence[str]) -> None:
        self.mark_calls.append(list(event_ids))
        await self.outbox.mark_sent_many([(event_id, None) for event_id in event_ids])


class BatchSender:
    """A send_batch callback that answers with the results it was given."""

    def __init__(self, results: Callable[[list[Event]], Sequence[object]]) -> None:
        self.results = results
        self.calls: list[list[Event]] = []

    async def __call__(self, events: list[Event]) -> Sequence[object]:
        self.calls.append(events)
        return self.results(events)


IDS = ["z1", "a2", "m3", "b4", "y5"]


@pytest.fixture
async def store(outbox: Outbox) -> PlainStore:
    for n, event_id in enumerate(IDS, start=1):
        assert await outbox.accept(event(event_id, qty=n)) == "accepted"
    return PlainStore(outbox)


async def test_every_result_true_marks_the_whole_batch_in_one_call(
    store: PlainStore, db: Path, db_rows: Query
) -> None:
    send = BatchSender(lambda events: [True] * len(events))

    marked = await dispatch_batch(store, send, limit=16)

    assert marked == IDS
    assert [[e["id"] for e in call] for call in send.calls] == [IDS]
    assert store.mark_calls == [IDS]
    assert sent_flags(db) == dict.fromkeys(IDS, 1)


async def test_the_outbox_itself_is_a_store_dispatch_batch_takes(
    store: PlainStore, db: Path, db_rows: Query
) -> None:
    # Its mark_sent_many takes marks (an ID with its ACK), not plain IDs.
    send = BatchSender(lambda events: [True] * len(events))
    assert await dispatch_batch(store.outbox, send, limit=3) == IDS[:3]
    assert sent_flags(db) == {"z1": 1, "a2": 1, "m3": 1, "b4": 0, "y5": 0}


async def test_limit_bounds_the_batch(store: PlainStore, db: Path, db_rows: Query) -> None:
    send = BatchSender(lambda events: [True] * len(events))
    assert await dispatch_batch(store, send, limit=2) == IDS[:2]
    assert sent_flags(db) == {"z1": 1, "a2": 1, "m3": 0, "b4": 0, "y5": 0}


@pytest.mark.parametrize("limit", [0, 17, -1, 2.0, True, "3"])
async def test_a_bad_limit_is_refused_before_anything_is_sent(
    store: PlainStore, db: Path, db_rows: Query, limit: Any
) -> None:
    send = BatchSender(lambda events: [True] * len(events))
    with pytest.raises(ValueError):
        await dispatch_batch(store, send, limit=limit)
    assert send.calls == []
    assert set(sent_flags(db).values()) == {0}


async def test_an_empty_outbox_sends_nothing(outbox: Outbox) -> None:
    send = BatchSender(lambda events: [True] * len(events))
    assert await dispatch_batch(PlainStore(outbox), send) == []
    assert send.calls == []


@pytest.mark.parametrize("k", [0, 1, 4])
async def test_a_failure_at_k_is_raised_as_the_same_object_after_the_prefix_is_marked(
    store: PlainStore, db: Path, db_rows: Query, k: int
) -> None:
    failure = Rejected("refused", status=409)
    send = BatchSender(lambda events: [True] * k + [failure, True, True])

    with pytest.raises(Rejected) as excinfo:
        await dispatch_batch(store, send)

    assert excinfo.value is failure
    assert store.mark_calls == [IDS[:k]]
    assert sent_flags(db) == {i: int(n < k) for n, i in enumerate(IDS)}


async def test_send_batch_raising_propagates_the_same_object_and_marks_nothing(
    store: PlainStore, db: Path, db_rows: Query
) -> None:
    failure = DeliveryError("connection reset")
    hooked: list[str] = []

    async def send(events: list[Event]) -> list[object]:
        raise failure

    with pytest.raises(DeliveryError) as excinfo:
        await dispatch_batch(store, send, after_delivery=hooked.append)

    assert excinfo.value is failure
    assert hooked == []
    assert all(call == [] for call in store.mark_calls)
    assert set(sent_flags(db).values()) == {0}


@pytest.mark.parametrize(
    "result", [1, "ok", None, False, {"ack": "m3"}, [True]], ids=lambda r: repr(r)
)
async def test_a_result_that_is_not_true_nor_an_exception_is_not_acknowledged(
    store: PlainStore, db: Path, db_rows: Query, result: object
) -> None:
    send = BatchSender(lambda events: [True, True, result, True, True])

    with pytest.raises(NotAcknowledged) as excinfo:
        await dispatch_batch(store, send)

    assert "m3" in str(excinfo.value)
    assert sent_flags(db) == {"z1": 1, "a2": 1, "m3": 0, "b4": 0, "y5": 0}


@pytest.mark.parametrize("given", [0, 1, 3])
async def test_fewer_results_than_entries_fails_at_the_first_missing_one(
    store: PlainStore, db: Path, db_rows: Query, given: int
) -> None:
    send = BatchSender(lambda events: [True] * given)

    with pytest.raises(NotAcknowledged) as excinfo:
        await dispatch_batch(store, send)

    assert repr(IDS[given]) in str(excinfo.value)
    assert sent_flags(db) == {i: int(n < given) for n, i in enumerate(IDS)}


async def test_the_verified_prefix_is_marked_in_one_transaction(
    store: PlainStore, db: Path, db_rows: Query
) -> None:
    # The mark of the third entry fails on disk: the first two must not stay marked.
    conn = sqlite3.connect(db, timeout=5)
    try:
        conn.execute(
            "CREATE TRIGGER no_mark BEFORE UPDATE OF sent ON outbox_entries "
            "WHEN NEW.id = 'm3' AND NEW.sent = 1 BEGIN SELECT RAISE(ABORT, 'no mark'); END"
        )
        conn.commit()
    finally:
        conn.close()
    send = BatchSender(lambda events: [True] * len(events))

    with pytest.raises(StorageError):
        await dispatch_batch(store, send)

    assert store.mark_calls == [IDS]
    assert set(sent_flags(db).values()) == {0}


async def test_after_delivery_runs_for_each_verified_id_before_any_is_marked(
    store: PlainStore, db: Path, db_rows: Query
) -> None:
    seen: list[tuple[str, dict[str, int]]] = []

    async def hook(event_id: str) -> None:
        await asyncio.sleep(0)
        seen.append((event_id, sent_flags(db)))

    failure = NotAcknowledged("wrong ID")
    send = BatchSender(lambda events: [True, True, True, failure])

    with pytest.raises(NotAcknowledged) as excinfo:
        await dispatch_batch(store, send, after_delivery=hook)

    assert excinfo.value is failure
    assert [event_id for event_id, _ in seen] == ["z1", "a2", "m3"]
    for _, states in seen:
        assert set(states.values()) == {0}, states
    assert sent_flags(db) == {"z1": 1, "a2": 1, "m3": 1, "b4": 0, "y5": 0}


async def test_a_failing_hook_marks_nothing(store: PlainStore, db: Path, db_rows: Query) -> None:
    class Crash(Exception):
        pass

    def hook(event_id: str) -> None:
        if event_id == "a2":
            raise Crash

    send = BatchSender(lambda events: [True] * len(events))
    with pytest.raises(Crash):
        await dispatch_batch(store, send, after_delivery=hook)
    assert set(sent_flags(db).values()) == {0}


async def test_the_callback_gets_copies_and_cannot_redirect_the_marks(
    store: PlainStore, db: Path, db_rows: Query
) -> None:
    def mutate(events: list[Event]) -> list[object]:
        for e in events:
            e["id"] = "hijacked"
            e["key"] = "hijacked"
            e["data"]["qty"] = 999
        events.reverse()
        events.append(placed("extra"))
        return [True, True, True, True, True]

    send = BatchSender(mutate)

    marked = await dispatch_batch(store, send)

    assert marked == IDS
    assert sent_flags(db) == dict.fromkeys(IDS, 1)
    assert [e["id"] for e in store.pending_returned] == IDS
    assert [e["key"] for e in store.pending_returned] == ["snack"] * 5
    assert [e["data"]["qty"] for e in store.pending_returned] == [1, 2, 3, 4, 5]
    assert db_rows(db, "SELECT count(*) FROM outbox_entries WHERE id = 'hijacked'") == [(0,)]


async def test_publisher_dispatch_keeps_each_verified_ack_with_its_mark(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    events = [event(i, qty=n) for n, i in enumerate(IDS, start=1)]
    for e in events:
        await outbox.accept(e)
    failure = Rejected("conflict", status=409)

    async def deliver(e: Event) -> dict[str, object]:
        raise AssertionError("batch mode sends no single request")

    async def deliver_batch(batch: Sequence[Event]) -> list[Any]:
        return [ack(batch[0]), ack(batch[1]), failure]

    with pytest.raises(Rejected) as excinfo:
        settings = RelaySettings(batch=True, pipeline=1, worker=None)
        await deliver_pending(outbox, Callables(deliver, deliver_batch), settings)

    assert excinfo.value is failure
    # The attempt is recorded on the entry the failure is about, and only there.
    failed = "SELECT id, attempts, last_error FROM outbox_entries WHERE sent = 0 AND attempts > 0"
    assert db_rows(db, failed) == [("m3", 1, str(failure))]
    acks = dict(db_rows(db, "SELECT id, ack FROM outbox_entries WHERE sent = 1"))
    assert {k: json.loads(v) for k, v in acks.items()} == {
        "z1": ack(events[0]),
        "a2": ack(events[1]),
    }


# ================================================================ deliver_batch over HTTP


def batch_app(handler: Callable[[list[Event]], web.StreamResponse | Any]) -> web.Application:
    """A loopback sink whose /events/batch answers what `handler` returns for the events."""

    async def handle(request: web.Request) -> web.StreamResponse:
        events = sent_events(json.loads(await request.read()))
        result = handler(events)
        if asyncio.iscoroutine(result):
            result = await result
        assert isinstance(result, web.StreamResponse)
        return result

    app = web.Application()
    app.router.add_post("/events/batch", handle)
    return app


async def sender_for(url: str, **options: Any) -> HttpSender:
    return HttpSender(url, timeout_s=3.0, connect_timeout_s=1.0, **options)


FIVE = [placed(f"e{n}", qty=n + 1) for n in range(5)]


@pytest.mark.parametrize("k", [0, 2, 4])
async def test_a_wrong_id_at_k_gives_the_prefix_acks_then_not_acknowledged(
    serve: Serve, k: int
) -> None:
    def answer(events: list[Event]) -> web.Response:
        acks = [ack(e) for e in events]
        acks[k] = make_ack("intruder", Receipt.APPLIED)
        return web.json_response({"acks": acks, "rejected": None})

    url = f"{await serve(batch_app(answer))}/events"
    async with await sender_for(url) as sender:
        results = await sender.deliver_batch(FIVE)

    assert results[:k] == [ack(e) for e in FIVE[:k]]
    assert len(results) == k + 1
    assert type(results[k]) is NotAcknowledged


async def test_a_rejected_item_over_http_is_rejected(serve: Serve) -> None:
    def answer(events: list[Event]) -> web.Response:
        rejected = {"index": 1, "status": 409, "error": "conflict", "id": events[1]["id"]}
        return web.json_response({"acks": [ack(events[0])], "rejected": rejected})

    url = f"{await serve(batch_app(answer))}/events"
    async with await sender_for(url) as sender:
        results = await sender.deliver_batch(FIVE)

    assert results[0] == ack(FIVE[0])
    assert isinstance(results[1], Rejected) and results[1].status == 409
    assert len(results) == 2


def padded_reply(events: list[Event], size: int) -> bytes:
    """A reply whose acks are all correct, padded to `size` bytes."""
    reply = {"acks": [ack(e) for e in events], "rejected": None, "pad": ""}
    short = len(json.dumps(reply).encode())
    reply["pad"] = "x" * (size - short)
    body = json.dumps(reply).encode()
    assert len(body) == size
    return body


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_oversized_batch_reply_is_not_acknowledged_and_nothing_verified(
    serve: Serve, chunked: bool
) -> None:
    cap = 400 * 2  # max_reply_bytes per event, times two events
    size = {"bytes": cap}

    async def handle(request: web.Request) -> web.StreamResponse:
        body = padded_reply(sent_events(json.loads(await request.read())), size["bytes"])
        if not chunked:
            return web.Response(body=body, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(body), 100):
            await response.write(body[start : start + 100])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/events/batch", handle)
    url = f"{await serve(app)}/events"
    two = FIVE[:2]

    async with await sender_for(url, max_reply_bytes=400) as sender:
        # At the cap the same reply is verified: only its size decides below.
        assert await sender.deliver_batch(two) == [ack(e) for e in two]
        size["bytes"] = cap + 1
        with pytest.raises(NotAcknowledged) as excinfo:
            await sender.deliver_batch(two)

    assert not isinstance(excinfo.value, Rejected)
    assert "cap" in str(excinfo.value)


async def test_an_endless_chunked_batch_reply_fails_fast(serve: Serve) -> None:
    async def handle(request: web.Request) -> web.StreamResponse:
        events = sent_events(json.loads(await request.read()))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(json.dumps({"acks": [ack(e) for e in events]})[:-1].encode())
        for _ in range(10_000):
            await response.write(b", " + b'"x"' * 100)
            await asyncio.sleep(0.001)
        return response

    app = web.Application()
    app.router.add_post("/events/batch", handle)
    url = f"{await serve(app, handler_cancellation=True)}/events"

    started = time.monotonic()
    async with await sender_for(url) as sender:
        with pytest.raises(NotAcknowledged):
            await sender.deliver_batch(FIVE[:1])
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_not_acknowledged_and_not_followed(serve: Serve, status: int) -> None:
    followed: list[str] = []

    async def moved(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, headers={"Location": "/elsewhere/batch"})

    async def elsewhere(request: web.Request) -> web.Response:
        events = sent_events(json.loads(await request.read()))
        followed.append(request.path)
        return web.json_response({"acks": [ack(e) for e in events], "rejected": None})

    app = web.Application()
    app.router.add_post("/events/batch", moved)
    app.router.add_post("/elsewhere/batch", elsewhere)
    url = f"{await serve(app)}/events"

    async with await sender_for(url) as sender:
        with pytest.raises(NotAcknowledged) as excinfo:
            await sender.deliver_batch(FIVE)

    assert type(excinfo.value) is NotAcknowledged
    assert excinfo.value.status == status
    assert followed == []


async def test_a_connection_closed_after_the_commit_is_a_delivery_error(
    serve_sink: ServeSink, sink_db: Path, db_rows: Query
) -> None:
    url = f"{await serve_sink(sink_db, drop_after_commit=1)}/events"
    three = FIVE[:3]

    async with await sender_for(url) as sender:
        with pytest.raises(DeliveryError) as excinfo:
            await sender.deliver_batch(three)
        # The sink did commit: evidence of stage 3 without stage 4.
        assert inbox_ids(sink_db) == ["e0", "e1", "e2"]
        again = await sender.deliver_batch(three)

    assert excinfo.value.retryable is True
    assert again == [ack(e, Receipt.DUPLICATE) for e in three]
    assert inventory(sink_db) == {"snack": 1 + 2 + 3}


async def test_the_real_sink_reply_verifies_position_by_position(
    sink_base: str, sink_db: Path, db_rows: Query, client: aiohttp.ClientSession
) -> None:
    async with client.post(f"{sink_base}/events", json=placed("e3", qty=99)) as response:
        assert response.status == 200

    async with await sender_for(f"{sink_base}/events") as sender:
        results = await sender.deliver_batch(FIVE)

    assert results[:3] == [ack(e) for e in FIVE[:3]]
    assert isinstance(results[3], Rejected) and results[3].status == 409
    assert len(results) == 4
    assert inbox_ids(sink_db) == ["e3", "e0", "e1", "e2"]


# ================================================================ the relay in batch mode


@contextlib.asynccontextmanager
async def batch_relay(
    outbox: Outbox, url: str, **options: Any
) -> AsyncIterator[tuple[Relay, list[int]]]:
    """A running relay in batch mode; yields it and the sizes of the batches it sent."""
    options.setdefault("retry", FAST)
    options.setdefault("poll_interval_s", 0.05)
    sizes: list[int] = []
    async with await sender_for(url) as sender:

        async def deliver_batch(events: Sequence[Event], lease: Lease | None = None) -> Any:
            sizes.append(len(events))
            return await sender.deliver_batch(events, lease=lease)

        async def deliver(e: Event, lease: Lease | None = None) -> Any:
            raise AssertionError("batch mode sends no single request")

        relay = relay_of(outbox, deliver, deliver_batch=deliver_batch, **options)
        task = asyncio.create_task(relay.run())
        try:
            yield relay, sizes
        finally:
            relay.stop()
            try:
                await asyncio.wait_for(task, STOP_TIMEOUT_S)
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            assert task.exception() is None


async def test_relay_in_batch_mode_drains_forty_entries_in_order_with_every_ack(
    sink_base: str, sink_db: Path, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    events = [
        event(f"z{n:02d}" if n % 2 else f"a{n:02d}", ("snack", "juice", "tea")[n % 3], n + 1)
        for n in range(40)
    ]
    for e in events:
        assert await outbox.accept(e) == "accepted"

    async with batch_relay(outbox, f"{sink_base}/events") as (relay, sizes):
        await eventually(lambda: set(sent_flags(db).values()) == {1})
        await eventually(lambda: relay.blocked is None)

    assert sizes[:3] == [16, 16, 8]
    assert inbox_ids(sink_db) == [e["id"] for e in events]
    seq_order = [r[0] for r in db_rows(db, "SELECT id FROM outbox_entries ORDER BY seq")]
    assert inbox_ids(sink_db) == seq_order
    acks = dict(db_rows(db, "SELECT id, ack FROM outbox_entries"))
    for e in events:
        assert acks[e["id"]] is not None, e["id"]
        assert json.loads(acks[e["id"]]) == ack(e)
    assert db_rows(sink_db, "SELECT max(deliveries) FROM inbox_events") == [(1,)]


@pytest.mark.parametrize("k", [0, 5, 15])
async def test_relay_in_batch_mode_marks_the_prefix_and_blocks_at_a_rejected_item(
    serve_sink: ServeSink, sink_db: Path, outbox: Outbox, db: Path, db_rows: Query, k: int
) -> None:
    url = f"{await serve_sink(sink_db, reject_skus=frozenset({'mystery'}))}/events"
    ids = [f"e{n:02d}" for n in range(20)]
    for n, event_id in enumerate(ids):
        assert await outbox.accept(event(event_id, "mystery" if n == k else "snack")) == "accepted"

    async with batch_relay(outbox, url, retry=RetryPolicy(0.05, 0.3)) as (relay, sizes):
        await eventually(lambda: relay.blocked is not None and len(sizes) >= 3)
        blocked = relay.blocked

    assert blocked is not None
    assert (blocked.event_id, blocked.permanent) == (ids[k], True)
    assert "400" in blocked.reason
    assert sent_flags(db) == {i: int(n < k) for n, i in enumerate(ids)}
    assert inbox_ids(sink_db) == ids[:k]
    acks = dict(db_rows(db, "SELECT id, ack FROM outbox_entries WHERE sent = 1"))
    assert {i: json.loads(a)["ack"] for i, a in acks.items()} == {i: i for i in ids[:k]}
    [(attempts, last_error)] = db_rows(
        db, "SELECT attempts, last_error FROM outbox_entries WHERE id = ?", (ids[k],)
    )
    assert attempts >= 1 and "400" in last_error
    assert db_rows(db, "SELECT max(attempts) FROM outbox_entries WHERE seq > ?", (k + 1,)) == [(0,)]
