"""What only the PostgreSQL inbox has: concurrent writes sharing one transaction (group
commit), a failing call failing alone in it, and transactions of two connections
racing on the same IDs. The behaviour both backends share is in
tests/behaviour/test_inbox_store.py. The session's throwaway server; rows read
through connections of the test's own (`xmin` is the transaction that wrote a row).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pg_faults import PgAccess
from support import in_progress

from plumbing.pgserver import ThrowawayServer
from plumbing.storage import StorageError
from shared import Event, Receipt, order_event
from sink import Inbox
from sink.backends.postgres import PostgresInbox
from sink.store import BatchReceipt, Incoming, Received


def event(event_id: str, sku: str = "snack", qty: int = 1) -> Event:
    """An order, as the `order.placed` event it is recorded as."""
    return order_event({"id": event_id, "sku": sku, "qty": qty})


def taken(events: list[Event]) -> list[Incoming]:
    """Events as the inbox takes them."""
    return [Incoming.checked(one) for one in events]


@pytest.fixture
async def pg_inbox(pg_database: str) -> AsyncIterator[Inbox]:
    """The PostgreSQL inbox in the test's schema."""
    async with Inbox.open(pg_database) as opened:
        yield opened


async def test_writes_in_progress_together_share_one_transaction(
    pg_inbox: Inbox, inbox_database: PgAccess
) -> None:
    with in_progress(pg_inbox, 2):
        receipts = await asyncio.gather(*(pg_inbox.receive(event(f"e{n}")) for n in range(32)))

    assert receipts == [Receipt.APPLIED] * 32
    assert inbox_database.query("SELECT qty FROM inbox_inventory") == [(32,)]
    assert await pg_inbox.count() == 32
    assert inbox_database.transactions("inbox_events") <= 4  # not one commit (one WAL flush) each


async def test_a_write_alone_commits_in_a_transaction_of_its_own(
    pg_inbox: Inbox, inbox_database: PgAccess
) -> None:
    for n in range(3):
        assert await pg_inbox.receive(event(f"e{n}")) is Receipt.APPLIED

    assert inbox_database.transactions("inbox_events") == 3


async def test_a_write_of_new_events_is_one_round_trip_and_a_redelivery_two(
    pg_inbox: Inbox, inbox_database: PgAccess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # libpq's trace of each connection the inbox takes: every Sync the client sends
    # ends a round trip (it then waits for the server's replies).
    assert isinstance(pg_inbox, PostgresInbox)
    database = pg_inbox._db
    lend = database.connection
    trace = tmp_path / "trace"

    @contextlib.asynccontextmanager
    async def traced() -> AsyncIterator[Any]:
        async with lend() as conn:
            with trace.open("a") as out:
                conn.pgconn.trace(out.fileno())
                try:
                    yield conn
                finally:
                    conn.pgconn.untrace()

    def round_trips() -> list[int]:
        """How many statements each round trip of the trace so far carried, in order
        (the trace then cleared). A round trip ends where the client waits for the
        server: at a Sync, at a Flush after statements (psycopg's fetch of a result
        in a pipeline), and after a simple Query."""
        text = trace.read_text(errors="replace")
        trace.write_text("")
        trips: list[int] = []
        statements = 0
        ended = True
        for sent in re.finditer(r"\tF\t\d+\t(Execute|Sync|Flush|Query)\b", text):
            kind = sent.group(1)
            if kind == "Execute":
                statements, ended = statements + 1, False
            elif kind == "Query":
                trips.append(1)
            elif kind == "Sync" or not ended:
                trips.append(statements)
                statements, ended = 0, True
        return trips

    await pg_inbox.receive(event("warm"))  # the pool's first connection
    monkeypatch.setattr(database, "connection", traced)
    trace.write_text("")

    assert await pg_inbox.receive_batch(taken([event("a"), event("b", "tea")])) == BatchReceipt(
        [
            Received(Receipt.APPLIED, Incoming.checked(e).canonical)
            for e in (event("a"), event("b", "tea"))
        ],
        None,
    )
    # BEGIN, the settings, the group's insert, the warehouse's upserts (two SKUs)
    # and COMMIT.
    assert round_trips() == [6]

    # A redelivery: that round trip fails on purpose (nothing commits), the failed
    # transaction is rolled back (psycopg then deallocates its prepared statements),
    # and the one call goes the long way: BEGIN; the settings and the lookup; the
    # delivery counted and COMMIT. The first message holds the statements queued
    # before the server's error came back: all five, or four when it came back
    # before COMMIT was queued (psycopg then queues nothing more).
    got = await pg_inbox.receive_batch(taken([event("a")]))
    assert [r.receipt for r in got.received] == [Receipt.DUPLICATE]
    trips = round_trips()
    assert trips[0] in (4, 5) and len(trips) <= 8, trips
    assert inbox_database.query("SELECT id, deliveries FROM inbox_events ORDER BY id") == [
        ("a", 2),
        ("b", 1),
        ("warm", 1),
    ]
    assert inbox_database.query("SELECT sku, qty FROM inbox_inventory ORDER BY sku") == [
        ("snack", 2),
        ("tea", 1),
    ]


async def test_a_predecessor_chain_in_progress_together_commits_in_order_in_one_transaction(
    pg_inbox: Inbox, inbox_database: PgAccess
) -> None:
    # A pipelining sender's requests: each names the one before.
    calls = [([event("a")], None), ([event("b")], "a"), ([event("c")], "b")]

    with in_progress(pg_inbox, 3):
        got = await asyncio.gather(
            *(pg_inbox.receive_batch(taken(e), after=after) for e, after in calls)
        )

    assert [[r.receipt for r in g.received] for g in got] == [[Receipt.APPLIED]] * 3
    assert inbox_database.query("SELECT id FROM inbox_events ORDER BY applied_seq") == [
        ("a",),
        ("b",),
        ("c",),
    ]
    assert inbox_database.transactions("inbox_events") == 1


async def test_a_predecessor_chain_in_progress_together_is_one_statement_per_group(
    pg_server: ThrowawayServer, pg_database: str, inbox_database: PgAccess
) -> None:
    # The server logs every statement of this database's new sessions.
    inbox_database.execute(f"ALTER DATABASE {inbox_database.dbname} SET log_statement = 'all'")
    calls = [([event(f"c{n}")], f"c{n - 1}" if n else None) for n in range(8)]
    async with Inbox.open(pg_database) as inbox:
        start = pg_server.log.stat().st_size
        with in_progress(inbox, 8):
            got = await asyncio.gather(*(inbox.receive_batch(taken(e), after=a) for e, a in calls))
        with pg_server.log.open(errors="replace") as log:
            log.seek(start)
            written = log.read()

    assert [[r.receipt for r in g.received] for g in got] == [[Receipt.APPLIED]] * 8
    assert inbox_database.query("SELECT id FROM inbox_events ORDER BY applied_seq") == [
        (f"c{n}",) for n in range(8)
    ]
    logged = re.split(r"LOG:\s+", written)  # an entry may span several lines
    inserts = [entry for entry in logged if "INSERT INTO inbox_events " in entry]
    # The first call alone (nothing was in progress), then the seven that came in
    # meanwhile: each group one statement (not a statement per call or per event),
    # then the warehouse's upsert of its events, one per SKU with their quantities
    # summed (all eight are of one SKU), in one transaction.
    assert 1 <= len(inserts) <= 2, written
    for entry in inserts:
        assert "WITH batch AS" in entry, entry
    upserts = sum("INSERT INTO inbox_inventory" in entry for entry in logged)
    assert upserts == len(inserts), written
    assert inbox_database.query("SELECT sku, qty FROM inbox_inventory") == [("snack", 8)]
    assert inbox_database.transactions("inbox_events") == len(inserts)


async def test_a_redelivery_in_a_chain_stops_the_one_statement_there_and_the_rest_follow(
    pg_inbox: Inbox, inbox_database: PgAccess
) -> None:
    assert await pg_inbox.receive(event("b")) is Receipt.APPLIED  # delivered before, say
    calls = [([event("a")], None), ([event("b")], "a"), ([event("c")], "b")]

    with in_progress(pg_inbox, 3):
        got = await asyncio.gather(
            *(pg_inbox.receive_batch(taken(e), after=after) for e, after in calls)
        )

    receipts = [[r.receipt for r in g.received] for g in got]
    assert receipts == [[Receipt.APPLIED], [Receipt.DUPLICATE], [Receipt.APPLIED]]
    assert inbox_database.query("SELECT id FROM inbox_events ORDER BY applied_seq") == [
        ("b",),
        ("a",),
        ("c",),
    ]
    assert inbox_database.query("SELECT deliveries FROM inbox_events WHERE id = 'b'") == [(2,)]
    assert await pg_inbox.count() == 3
    assert inbox_database.query("SELECT qty FROM inbox_inventory") == [(3,)]


async def test_a_call_that_fails_in_a_shared_transaction_fails_alone(
    pg_inbox: Inbox, inbox_database: PgAccess
) -> None:
    inbox_database.execute(
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF NEW.id = 'p' THEN RAISE EXCEPTION 'poisoned stock'; END IF;"
        " RETURN NEW; END $$",
        # The inbox's own row, not a handler's statement: a failure of the database.
        "CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON inbox_events"
        " FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
    )
    batches = [[event("a")], [event("p", "poison"), event("q")], [event("b", "tea")]]

    with in_progress(pg_inbox, 2):
        got = await asyncio.gather(
            *(pg_inbox.receive_batch(taken(batch)) for batch in batches), return_exceptions=True
        )

    assert isinstance(got[1], StorageError) and "poisoned stock" in str(got[1])
    for fine in (got[0], got[2]):
        assert isinstance(fine, BatchReceipt)
        assert [r.receipt for r in fine.received] == [Receipt.APPLIED]
    assert inbox_database.query("SELECT id FROM inbox_events ORDER BY id") == [("a",), ("b",)]
    assert await pg_inbox.count() == 2
    assert dict(inbox_database.query("SELECT sku, qty FROM inbox_inventory")) == {
        "snack": 1,
        "tea": 1,
    }


# How many times in a row the server rolls back the first INSERT statements into the
# inbox, as it does for a lost race (serialization_failure) or a deadlock: a sequence,
# as its values are not rolled back with the transaction.
ROLLED_BACK = """
CREATE SEQUENCE rolled_back;
CREATE FUNCTION roll_back_first() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('rolled_back') <= {times} THEN
        RAISE EXCEPTION 'rolled back on purpose' USING ERRCODE = '{code}';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER roll_back_first BEFORE INSERT ON inbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION roll_back_first();
"""


@pytest.mark.parametrize("code", ["serialization_failure", "deadlock_detected"])
async def test_a_batch_whose_one_statement_keeps_being_rolled_back_goes_in_the_long_way(
    pg_inbox: Inbox, inbox_database: PgAccess, code: str
) -> None:
    # Another sink racing on the same IDs can make the one-statement insert lose
    # every attempt (each retry starts before the other's transaction commits): the
    # batch then goes in the long way, which waits for the other and counts its
    # duplicates, instead of failing the request.
    inbox_database.execute(ROLLED_BACK.format(times=3, code=code))

    got = await pg_inbox.receive_batch(taken([event("a"), event("b", "tea", 2)]))

    assert [r.receipt for r in got.received] == [Receipt.APPLIED, Receipt.APPLIED]
    assert inbox_database.query("SELECT id FROM inbox_events ORDER BY id") == [("a",), ("b",)]
    assert dict(inbox_database.query("SELECT sku, qty FROM inbox_inventory")) == {
        "snack": 1,
        "tea": 2,
    }
    assert await pg_inbox.count() == 2
    # The three attempts of the one statement, then the long way's statements.
    assert inbox_database.query("SELECT last_value > 3 FROM rolled_back") == [(True,)]


async def test_a_batch_rolled_back_on_every_attempt_fails_and_writes_nothing(
    pg_inbox: Inbox, inbox_database: PgAccess
) -> None:
    inbox_database.execute(ROLLED_BACK.format(times=1000, code="serialization_failure"))

    with pytest.raises(
        StorageError, match="the server rolled the transaction back: rolled back on"
    ):
        await pg_inbox.receive_batch(taken([event("a"), event("b", "tea", 2)]))

    assert inbox_database.query("SELECT count(*) FROM inbox_events") == [(0,)]
    assert inbox_database.query("SELECT count(*) FROM inbox_inventory") == [(0,)]
    assert await pg_inbox.count() == 0


@pytest.mark.parametrize("requests", [1, 2], ids=["alone", "shared"])
@pytest.mark.parametrize("order", ["same", "reversed"])
async def test_two_connections_racing_on_one_batch_apply_each_event_once(
    pg_database: str, inbox_database: PgAccess, order: str, requests: int
) -> None:
    # Both insert the same new IDs at once: the second's inserts wait for the first
    # and then find them known (run again as duplicates); in reversed order they
    # may deadlock, and the transaction PostgreSQL aborts runs again. Shared: each
    # inbox takes its batch as two calls in one shared transaction.
    rounds = 10
    # Found in 50 ms instead of the default 1 s (a deadlock is waited for that long).
    inbox_database.execute(f"ALTER DATABASE {inbox_database.dbname} SET deadlock_timeout = '50ms'")
    async with Inbox.open(pg_database) as one, Inbox.open(pg_database) as two:
        with in_progress(one, requests), in_progress(two, requests):
            for n in range(rounds):
                batch = [event(f"r{n}-{k}", f"sku{k}", k + 1) for k in range(4)]
                other = batch if order == "same" else batch[::-1]
                calls = [(one, b) for b in _split(batch, requests)]
                calls += [(two, b) for b in _split(other, requests)]
                got = await asyncio.gather(*(inbox.receive_batch(taken(b)) for inbox, b in calls))
                receipts: dict[str, list[Receipt]] = {}
                for receipt, (_, sent) in zip(got, calls, strict=True):
                    assert receipt.stopped is None
                    for done, item in zip(receipt.received, sent, strict=True):
                        receipts.setdefault(item["id"], []).append(done.receipt)
                assert all(
                    sorted(r) == [Receipt.APPLIED, Receipt.DUPLICATE] for r in receipts.values()
                )
        # The count of either inbox is kept by the transactions that inserted.
        assert await one.count() == await two.count() == 4 * rounds

    assert inbox_database.query(
        "SELECT count(*), min(deliveries), max(deliveries) FROM inbox_events"
    ) == [(4 * rounds, 2, 2)]
    stock: dict[str, Any] = dict(inbox_database.query("SELECT sku, qty FROM inbox_inventory"))
    assert stock == {f"sku{k}": (k + 1) * rounds for k in range(4)}


def _split(batch: list[Event], parts: int) -> list[list[Event]]:
    size = len(batch) // parts
    return [batch[i : i + size] for i in range(0, len(batch), size)]
