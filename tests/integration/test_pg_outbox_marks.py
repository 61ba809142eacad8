"""PostgreSQL: marks, and intake, of concurrent callers share one transaction (group
commit), and each call still succeeds or fails on its own. Rows written by one transaction carry
its ID (`xmin`), read through a connection of the test's own."""

from __future__ import annotations

import asyncio
import re

import psycopg
import pytest
from pg_faults import PgAccess
from support import accept, query

from plumbing.pgserver import ThrowawayServer
from plumbing.storage import StorageError
from publisher.errors import UnknownEntry
from publisher.store import Mark, Outbox
from shared import Conflict

# A statement that marks entries sent: one entry's, or a group's (its table aliased).
MARKING = re.compile(r"UPDATE outbox_entries (AS e )?SET sent = 1")


@pytest.fixture
async def outbox_of_eight(pg_outbox: Outbox) -> Outbox:
    """The PostgreSQL outbox holding m0 to m7, pending."""
    await accept(pg_outbox, *(f"m{n}" for n in range(8)))
    return pg_outbox


async def test_concurrent_marks_share_one_transaction(
    outbox_of_eight: Outbox, pg_database: str
) -> None:
    await asyncio.gather(
        *(
            outbox_of_eight.mark_sent_many([Mark(f"m{2 * k}"), Mark(f"m{2 * k + 1}")])
            for k in range(4)
        )
    )
    assert query(pg_database, "SELECT count(*) FROM outbox_entries WHERE sent = 0") == [(0,)]
    # One transaction, or the first call alone and the three that came meanwhile.
    xmins = dict(query(pg_database, "SELECT id, xmin::text FROM outbox_entries"))
    assert len(set(xmins.values())) <= 2
    assert len({xmins[f"m{n}"] for n in range(2, 8)}) == 1


async def test_concurrent_marks_are_one_statement_and_one_round_trip(
    pg_server: ThrowawayServer, pg_database: str
) -> None:
    # The server logs every statement of this database's new sessions; a simple
    # query (several statements in one message) is logged as one entry.
    database = PgAccess(pg_database, "outbox_health")
    database.execute(f"ALTER DATABASE {database.dbname} SET log_statement = 'all'")
    async with Outbox.open(pg_database) as outbox:
        for n in range(8):
            assert await outbox.accept({"id": f"m{n}", "sku": "snack", "qty": 1}) == "accepted"
        start = pg_server.log.stat().st_size
        await asyncio.gather(
            *(outbox.mark_sent_many([Mark(f"m{2 * k}"), Mark(f"m{2 * k + 1}")]) for k in range(4))
        )
        with pg_server.log.open(errors="replace") as log:
            log.seek(start)
            written = log.read()

    assert query(pg_database, "SELECT count(*) FROM outbox_entries WHERE sent = 0") == [(0,)]
    logged = re.split(r"LOG:\s+", written)  # an entry may span several lines
    marks = [entry for entry in logged if MARKING.search(entry)]
    # The first call alone, then the three that came meanwhile: each group one
    # message, BEGIN to COMMIT (not a statement per entry, a savepoint and syncs).
    assert 1 <= len(marks) <= 2, written
    for entry in marks:
        assert entry.startswith("statement: BEGIN;") and entry.rstrip().endswith("COMMIT")
    xmins = query(pg_database, "SELECT count(DISTINCT xmin::text) FROM outbox_entries")
    assert xmins == [(len(marks),)]


async def test_a_failing_call_fails_alone_and_all_of_it(
    outbox_of_eight: Outbox, pg_database: str
) -> None:
    results = await asyncio.gather(
        outbox_of_eight.mark_sent_many([Mark("m0"), Mark("m1")]),
        outbox_of_eight.mark_sent_many([Mark("m2"), Mark("no-such-entry")]),
        outbox_of_eight.mark_sent_many([Mark("m3"), Mark("m4")]),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], UnknownEntry)
    assert dict(query(pg_database, "SELECT id, sent FROM outbox_entries")) == {
        "m0": 1,
        "m1": 1,
        "m2": 0,
        "m3": 1,
        "m4": 1,
        "m5": 0,
        "m6": 0,
        "m7": 0,
    }


async def test_concurrent_intake_shares_one_transaction(
    outbox_of_eight: Outbox, pg_database: str
) -> None:
    ids = [f"i{n}" for n in range(6)]
    results = await asyncio.gather(
        *(outbox_of_eight.accept({"id": i, "sku": "snack", "qty": 1}) for i in ids)
    )
    assert results == ["accepted"] * len(ids)
    xmins = dict(query(pg_database, "SELECT id, xmin::text FROM outbox_entries WHERE id LIKE 'i%'"))
    # All six were asked for before the first transaction began: one transaction.
    assert len(set(xmins.values())) == 1
    seq = dict(query(pg_database, "SELECT id, seq FROM outbox_entries WHERE id LIKE 'i%'"))
    assert sorted(ids, key=seq.__getitem__) == ids  # in the order they were asked for


async def test_a_batch_and_single_intake_share_one_transaction_and_one_notify(
    outbox_of_eight: Outbox, pg_database: str
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as listener:
        listener.execute(b"LISTEN outbox_intake")
        results = await asyncio.gather(
            *(outbox_of_eight.accept({"id": f"i{n}", "sku": "snack", "qty": 1}) for n in range(4)),
            outbox_of_eight.accept_many(
                [{"id": f"b{n}", "sku": "tea", "qty": 1} for n in range(3)]
            ),
        )
        heard = list(listener.notifies(timeout=0.5, stop_after=3))
    assert results == [*["accepted"] * 4, ["accepted"] * 3]
    xmins = query(pg_database, "SELECT DISTINCT xmin::text FROM outbox_entries WHERE id !~ '^m'")
    assert len(xmins) == 1
    assert [n.channel for n in heard] == ["outbox_intake"]  # one wake-up for the group


async def test_a_failing_intake_fails_alone(
    outbox_of_eight: Outbox, pg_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            b"CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            b" IF NEW.id = 'bad' THEN RAISE EXCEPTION 'no bad orders'; END IF; RETURN NEW;"
            b" END $$"
        )
        conn.execute(
            b"CREATE TRIGGER refuse_bad BEFORE INSERT ON outbox_entries"
            b" FOR EACH ROW EXECUTE FUNCTION refuse_bad()"
        )
    calls = [("first", 1), ("a", 1), ("bad", 1), ("m0", 2), ("c", 1), ("m1", 1), ("a", 1)]
    results = await asyncio.gather(
        *(outbox_of_eight.accept({"id": i, "sku": "snack", "qty": q}) for i, q in calls),
        outbox_of_eight.accept_many([{"id": i, "sku": "tea", "qty": 1} for i in ("d", "bad", "e")]),
        return_exceptions=True,
    )
    batch = results.pop()  # a call fails whole: none of its orders is written
    assert isinstance(batch, StorageError) and "no bad orders" in str(batch)
    assert query(pg_database, "SELECT count(*) FROM outbox_orders WHERE id IN ('d', 'e')") == [(0,)]
    assert results[:2] == ["accepted", "accepted"]
    assert isinstance(results[2], StorageError) and "no bad orders" in str(results[2])
    assert isinstance(results[3], Conflict)
    assert results[4:] == ["accepted", "duplicate", "duplicate"]
    assert query(pg_database, "SELECT count(*) FROM outbox_orders WHERE id = 'bad'") == [(0,)]
    seq = dict(query(pg_database, "SELECT id, seq FROM outbox_entries"))
    assert seq["first"] < seq["a"] < seq["c"]
    assert not caplog.records  # nothing logged: the failure is the caller's to report
