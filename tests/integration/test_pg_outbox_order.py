"""PostgreSQL: entries become visible in seq order (seq order is commit order).

A sequence value is taken before commit, so without care a reader could see seq 11
committed while seq 10 is still in flight, deliver 11, and break order silently.
Intake takes a transaction-level lock right before its entry takes a seq; these
tests hold intake transactions open or slow them down, and check what readers and a
running relay see.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time

import psycopg
import pytest
from relay_lines import relay_of, running
from support import event, eventually, pending_ids

from publisher import accept_in_async
from publisher.backends import postgres_sql
from publisher.backends.postgres import accept_params
from publisher.settings import Ordering
from publisher.store import Outbox, Publication, checked_order
from shared import Conflict, Event, Lease, Receipt, make_ack

HELD_S = 0.3  # how long an intake transaction is held open
SKUS = ("snack", "juice", "tea")
CLIENTS = 12
ORDERS_PER_CLIENT = 8


def seqs(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return dict(conn.execute(b"SELECT id, seq FROM outbox_entries").fetchall())


async def test_an_intake_in_flight_holds_back_the_next_seq_until_it_commits(
    pg_outbox: Outbox, pg_database: str
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_database) as conn:
        async with conn.transaction():
            assert await accept_in_async(conn, event("first")) == "accepted"
            second = asyncio.create_task(pg_outbox.accept(event("second")))
            await asyncio.sleep(HELD_S)
            # The second waits for the first to commit before it takes a seq.
            assert not second.done()
            assert await pending_ids(pg_outbox) == []
        assert await second == "accepted"
    assert await pending_ids(pg_outbox) == ["first", "second"]
    by_id = seqs(pg_database)
    assert by_id["first"] < by_id["second"]


@pytest.mark.parametrize("qty", [1, 2])
async def test_an_id_another_transaction_commits_while_intake_waits_is_judged_by_it(
    pg_outbox: Outbox, pg_database: str, qty: int
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_database) as conn:
        async with conn.transaction():
            assert await accept_in_async(conn, {**event("same"), "qty": 1}) == "accepted"
            waiting = asyncio.create_task(
                pg_outbox.accept_many([event("before"), {**event("same"), "qty": qty}])
            )
            await asyncio.sleep(HELD_S)
            assert not waiting.done()  # its insert of "same" waits for this transaction
        outcomes = await asyncio.wait_for(waiting, 5)
    assert outcomes[0] == "accepted"
    if qty == 1:
        assert outcomes[1] == "duplicate"
    else:
        assert isinstance(outcomes[1], Conflict) and outcomes[1].event_id == "same"
    assert sorted(seqs(pg_database)) == ["before", "same"]


async def test_without_the_lock_a_reader_sees_a_later_seq_before_an_earlier_one(
    pg_outbox: Outbox, pg_database: str
) -> None:
    # The pitfall the lock prevents, shown with intake's statement minus the lock.
    first = checked_order(event("first"))
    assert isinstance(first, Publication)
    lockless = postgres_sql.ACCEPT_WITHOUT_COMMIT_ORDER.encode()
    async with await psycopg.AsyncConnection.connect(pg_database) as conn:
        async with conn.transaction():
            await conn.execute(lockless, accept_params(first, time.time()))
            assert await asyncio.wait_for(pg_outbox.accept(event("second")), 2) == "accepted"
            seen_first = await pending_ids(pg_outbox)
        seen_after = await pending_ids(pg_outbox)
    by_id = seqs(pg_database)
    assert by_id["first"] < by_id["second"]
    assert seen_first == ["second"]  # a relay would have delivered it first
    assert seen_after == ["first", "second"]


@pytest.mark.parametrize("ordering", ["global", "sku"])
async def test_concurrent_slow_intake_is_delivered_in_seq_order(
    pg_outbox: Outbox, pg_database: str, ordering: Ordering
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        # Every intake transaction sleeps a random while after its entry took a seq.
        conn.execute(
            b"CREATE FUNCTION slow_intake() RETURNS trigger LANGUAGE plpgsql AS $$"
            b" BEGIN PERFORM pg_sleep(random() * 0.01); RETURN NEW; END $$"
        )
        conn.execute(
            b"CREATE TRIGGER slow_intake AFTER INSERT ON outbox_entries"
            b" FOR EACH ROW EXECUTE FUNCTION slow_intake()"
        )
    delivered: list[str] = []

    async def deliver(
        event: Event, after: str | None = None, lease: Lease | None = None
    ) -> dict[str, object]:
        delivered.append(event["id"])
        return make_ack(event["id"], Receipt.APPLIED)

    async def client(n: int) -> None:
        # An outbox of its own, as another process would have: its transactions run
        # beside the others' (one outbox would commit its intake in groups, one
        # transaction at a time).
        rand = random.Random(n)
        async with Outbox.open(pg_database) as own:
            for k in range(ORDERS_PER_CLIENT):
                await own.accept(event(f"c{n:02d}-{k:03d}", rand.choice(SKUS)))

    total = CLIENTS * ORDERS_PER_CLIENT
    async with Outbox.open(pg_database) as relays_outbox:
        relay = relay_of(relays_outbox, deliver, ordering=ordering, poll_interval_s=0.005)
        async with running(relay):
            await asyncio.gather(*(client(n) for n in range(CLIENTS)))
            await eventually(lambda: len(delivered) >= total, timeout_s=20)

    by_id = seqs(pg_database)
    assert sorted(delivered) == sorted(by_id)  # each once
    lanes: dict[str, list[str]] = collections.defaultdict(list)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        skus = dict(conn.execute(b"SELECT id, sku FROM outbox_orders").fetchall())
    for event_id in delivered:
        lanes[skus[event_id]].append(event_id)
    for sku, ids in lanes.items():
        assert ids == sorted(ids, key=by_id.__getitem__), f"lane {sku} out of seq order"
    if ordering == "global":
        assert delivered == sorted(delivered, key=by_id.__getitem__)
