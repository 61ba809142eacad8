"""PostgreSQL: the order and its outbox entry written in the caller's own async
transaction (publisher.accept_in_async), committed or rolled back with the caller's
rows, and a commit wakes a listening relay. The sync API on both backends is in the
behaviour suite."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from relay_lines import relay_of, running
from support import as_event, event, eventually, placed, query

from plumbing.storage import StorageError
from publisher import NotInTransaction, accept_in_async
from publisher.store import Outbox
from shared import Conflict, Event, InvalidEvent, Lease, Order, Receipt, canonical_json, make_ack

LONG_POLL_S = 30.0  # the relay would not look again for this long: only NOTIFY wakes it


@pytest.fixture
def accounts(pg_database: str) -> None:
    """A table of the caller's own beside the outbox, written in the same transactions."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(b"CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER)")


@pytest.mark.usefixtures("accounts")
async def test_a_rolled_back_transaction_leaves_nothing(
    pg_outbox: Outbox, pg_database: str
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_database) as conn:
        await conn.execute(b"INSERT INTO accounts VALUES ('acct', 5)")
        assert await accept_in_async(conn, event("a")) == "accepted"
        assert query(pg_database, "SELECT id FROM outbox_entries") == []  # not committed yet
        await conn.rollback()
    assert query(pg_database, "SELECT count(*) FROM outbox_orders") == [(0,)]
    assert query(pg_database, "SELECT count(*) FROM outbox_entries") == [(0,)]
    assert query(pg_database, "SELECT count(*) FROM accounts") == [(0,)]
    assert await pg_outbox.accept(event("a")) == "accepted"


@pytest.mark.usefixtures("accounts")
async def test_a_commit_makes_the_entry_pending_and_wakes_the_relay(
    pg_outbox: Outbox, pg_database: str
) -> None:
    delivered: list[str] = []

    async def deliver(
        event: Event, after: str | None = None, lease: Lease | None = None
    ) -> dict[str, object]:
        delivered.append(event["id"])
        return make_ack(event["id"], Receipt.APPLIED)

    relay = relay_of(pg_outbox, deliver, poll_interval_s=LONG_POLL_S)
    async with running(relay):
        await asyncio.sleep(0.2)  # the relay has looked once and is waiting
        async with await psycopg.AsyncConnection.connect(pg_database) as conn:
            async with conn.transaction():
                await conn.execute(b"INSERT INTO accounts VALUES ('acct', 5)")
                assert await accept_in_async(conn, event("a")) == "accepted"
                assert await accept_in_async(conn, event("a")) == "duplicate"
            took = await eventually(lambda: delivered == ["a"], timeout_s=5)
    assert took < 2.0
    assert query(pg_database, "SELECT id, sent FROM outbox_entries") == [("a", 1)]
    assert query(pg_database, "SELECT * FROM accounts") == [("acct", 5)]


async def test_conflicts_bad_events_and_a_failed_transaction_are_the_projects_errors(
    pg_outbox: Outbox, pg_database: str
) -> None:
    await pg_outbox.accept(event("a"))
    async with await psycopg.AsyncConnection.connect(pg_database) as conn:
        with pytest.raises(Conflict):
            await accept_in_async(conn, event("a", qty=2))
        with pytest.raises(InvalidEvent):
            await accept_in_async(conn, {"id": "b"})
        with pytest.raises(psycopg.errors.UndefinedTable):
            await conn.execute(b"SELECT * FROM no_such_table")
        with pytest.raises(StorageError):  # the transaction failed: the caller's to end
            await accept_in_async(conn, event("c"))
        await conn.rollback()
    async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as conn:
        with pytest.raises(NotInTransaction):
            await accept_in_async(conn, event("d"))
        with pytest.raises(TypeError):
            await accept_in_async(object(), event("d"))
    assert query(pg_database, "SELECT id FROM outbox_orders") == [("a",)]


def store_payload(url: str, event_id: str, order: Order) -> None:
    """Write an entry's payload by hand, the event of `order` (its order row left as it is)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            b"UPDATE outbox_entries SET payload = %s WHERE id = %s",
            (canonical_json(as_event(order)), event_id),
        )


async def test_a_known_id_is_judged_by_its_stored_payload_even_once_pruned(
    pg_outbox: Outbox, pg_database: str
) -> None:
    await pg_outbox.accept(event("moved"))
    await pg_outbox.accept(event("pruned"))
    store_payload(pg_database, "moved", event("moved", qty=2))  # its order row says 1
    await pg_outbox.mark_sent("pruned")
    await asyncio.sleep(0.01)
    assert await pg_outbox.prune(older_than_s=0) == 1
    async with await psycopg.AsyncConnection.connect(pg_database) as conn:
        assert await accept_in_async(conn, event("moved", qty=2)) == "duplicate"
        assert await accept_in_async(conn, event("pruned")) == "duplicate"
        for changed in (event("moved"), event("pruned", qty=2)):
            with pytest.raises(Conflict):
                await accept_in_async(conn, changed)
        await conn.commit()
    assert query(pg_database, "SELECT id FROM outbox_orders ORDER BY id") == [
        ("moved",),
        ("pruned",),
    ]
    assert query(pg_database, "SELECT id FROM outbox_entries") == [("moved",)]


async def test_intake_waiting_for_a_callers_transaction_judges_what_it_committed(
    pg_outbox: Outbox, pg_database: str
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_database) as conn:
        assert await accept_in_async(conn, event("a")) == "accepted"
        # The entry holds qty 2 while its order row says 1: the payload is what counts.
        await conn.execute(
            b"UPDATE outbox_entries SET payload = %s WHERE id = 'a'",
            (canonical_json(placed("a", qty=2)),),
        )
        same = asyncio.ensure_future(pg_outbox.accept(event("a", qty=2)))
        other = asyncio.ensure_future(pg_outbox.accept(event("a", qty=1)))
        await asyncio.sleep(0.3)
        assert not same.done() and not other.done()  # their inserts wait for this transaction
        await conn.commit()
    assert await same == "duplicate"
    with pytest.raises(Conflict):
        await other
    assert query(pg_database, "SELECT id, payload FROM outbox_entries") == [
        ("a", canonical_json(placed("a", qty=2)))
    ]
