"""Intake group commit across a real crash: `publisher serve` SIGKILLed while eight
clients post orders (one per request, and batches) concurrently.

A reply goes out only after its order is durable, and a group commits all or nothing
per order: so every order that was answered accepted (or duplicate) is on disk, and
no order is there without its outbox entry or the other way round, whether its reply
arrived or not. An order is recorded as its order.placed event: the entry stores
that event's canonical text, its type, and its lane (the SKU). Read through
connections of the test's own (SQLite or PostgreSQL: the test runs on both).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import psycopg
import pytest
from support import LOOPBACK, entry_payload, placed, post_json, serve_args

from shared import ORDER_PLACED, canonical_json

if TYPE_CHECKING:
    from conftest import Databases, Query, StartPublisher, StartSink

pytestmark = pytest.mark.e2e

CLIENTS = 8
PER_CLIENT = 150  # requests at most: the kill comes long before
BATCH_EVERY = 5  # every fifth request of a client is a batch
BATCH_SIZE = 20
KILL_AFTER = 150  # orders answered before the kill
RUN_S = 20.0  # the whole intake, bounded
BOTH_TABLES = """
    SELECT 'order', id, sku, qty, NULL, NULL, NULL FROM outbox_orders
    UNION ALL SELECT 'entry', id, NULL, NULL, type, lane, {payload} FROM outbox_entries
"""


@dataclass
class Intake:
    """What the clients were told, and what they could not find out."""

    acknowledged: dict[str, dict[str, Any]] = field(default_factory=dict)  # answered accepted
    unknown: set[str] = field(default_factory=set)  # no reply: committed or not
    answered: asyncio.Event = field(default_factory=asyncio.Event)


def order(client: int, n: int, k: int = 0) -> dict[str, Any]:
    return {"id": f"c{client}-{n:03d}-{k:02d}", "sku": f"sku-{(n + k) % 3}", "qty": n % 9 + 1}


async def one_client(session: aiohttp.ClientSession, base: str, client: int, seen: Intake) -> None:
    for n in range(PER_CLIENT):
        batch = n % BATCH_EVERY == BATCH_EVERY - 1
        orders = [order(client, n, k) for k in range(BATCH_SIZE if batch else 1)]
        try:
            if batch:
                status, reply = await post_json(session, f"{base}/orders/batch", {"orders": orders})
                assert status == 200, reply
                assert [r["result"] for r in reply["results"]] == ["accepted"] * len(orders)
            else:
                status, reply = await post_json(session, f"{base}/orders", orders[0])
                assert status == 201, reply
        except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError):
            seen.unknown.update(o["id"] for o in orders)
            return  # the service is gone
        seen.acknowledged.update((o["id"], o) for o in orders)
        if len(seen.acknowledged) >= KILL_AFTER:
            seen.answered.set()


async def intake_until_killed(base: str, kill: Callable[[], None]) -> Intake:
    seen = Intake()
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        clients = [asyncio.create_task(one_client(session, base, c, seen)) for c in range(CLIENTS)]
        async with asyncio.timeout(RUN_S):
            await seen.answered.wait()
            kill()  # while the other clients' requests are in flight
            await asyncio.gather(*clients)
    return seen


def slow_intake(databases: Databases) -> None:
    """Make each entry insert take a few milliseconds, so that the kill lands while
    a group's transaction is open (without it a commit is over too soon to hit)."""
    if databases.backend == "postgres":
        with psycopg.connect(str(databases.source), autocommit=True) as pg:
            pg.execute(
                b"CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS"
                b" $$ BEGIN PERFORM pg_sleep(0.003); RETURN NEW; END $$"
            )
            pg.execute(
                b"CREATE TRIGGER slow BEFORE INSERT ON outbox_entries"
                b" FOR EACH ROW EXECUTE FUNCTION slow()"
            )
        return
    conn = sqlite3.connect(databases.source, isolation_level=None)
    try:  # SQLite has no sleep: a trigger that counts a cross join of 300 rows
        conn.execute("CREATE TABLE filler (n INTEGER)")
        conn.executemany("INSERT INTO filler VALUES (?)", [(n,) for n in range(300)])
        conn.execute(
            "CREATE TRIGGER slow BEFORE INSERT ON outbox_entries"
            " BEGIN SELECT count(*) FROM filler AS a, filler AS b; END"
        )
    finally:
        conn.close()


def test_sigkill_during_concurrent_intake_keeps_every_answered_order_and_halves_none(
    databases: Databases, sink_process: StartSink, publisher_process: StartPublisher, db_rows: Query
) -> None:
    sink = sink_process(databases.sink)
    source = databases.source
    publisher = publisher_process(*serve_args(source, sink.url))
    base = f"http://{LOOPBACK}:{publisher.port}"
    slow_intake(databases)  # the schema is there now
    started = time.monotonic()

    seen = asyncio.run(intake_until_killed(base, lambda: publisher.signal(signal.SIGKILL)))

    assert publisher.wait() == -signal.SIGKILL
    assert time.monotonic() - started < RUN_S
    assert seen.unknown, "no request was in flight at the kill: nothing was tested"
    # Both tables in one statement, so one snapshot: on PostgreSQL a COMMIT the dead
    # publisher had sent may still finish on the server after its exit, between two
    # separate reads.
    both = db_rows(source, BOTH_TABLES.format(payload=entry_payload(source)))
    orders = {r[1]: (r[2], r[3]) for r in both if r[0] == "order"}
    entries = {r[1]: (r[4], r[5], r[6]) for r in both if r[0] == "entry"}

    def entry_of(event_id: str, sku: str, qty: int) -> tuple[str, str, str]:
        """The entry of that order: its order.placed event, whole, in its SKU's lane."""
        return ORDER_PLACED, sku, canonical_json(placed(event_id, sku, qty))

    # Every order answered is durable, as it was sent.
    for event_id, sent in seen.acknowledged.items():
        assert orders.get(event_id) == (sent["sku"], sent["qty"]), event_id
        assert entries.get(event_id) == entry_of(event_id, sent["sku"], sent["qty"]), event_id
    # None half-written: an order and its entry, or neither; nothing nobody sent.
    assert set(orders) == set(entries)
    assert set(orders) <= set(seen.acknowledged) | seen.unknown
    for event_id, (sku, qty) in orders.items():
        assert entries[event_id] == entry_of(event_id, sku, qty), event_id
