"""PostgreSQL: line leases under races between processes (each outbox here has a pool
of its own, as another worker would). Takes of one line racing: one wins. A takeover
that commits while a fenced write waits for the lease row's lock: the write is
refused. Lease times are the server's clock, not the host's. The group's marks stay
one statement with leases. What both backends share is in the behaviour suite."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from pg_faults import PgAccess
from support import accept, eventually

import publisher.backends.postgres
from pg_tx import PgDatabase
from plumbing.pgserver import ThrowawayServer
from plumbing.schema import VERSIONS_TABLE
from plumbing.storage import StorageError
from publisher.backends import postgres_sql
from publisher.errors import LeaseLost
from publisher.store import Mark, Outbox
from shared import Lease

TTL_S = 30.0
WAITING = """
    SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND wait_event_type = 'Lock'
"""
SERVER_NOW = "SELECT extract(epoch FROM clock_timestamp())::float8"
# A statement that marks entries sent: one entry's, or a group's (its table aliased).
MARKING = re.compile(r"UPDATE outbox_entries (AS e )?SET sent = 1")


@pytest.fixture
async def outbox_of_four(pg_outbox: Outbox) -> Outbox:
    """The PostgreSQL outbox holding e0 to e3, pending."""
    await accept(pg_outbox, *(f"e{n}" for n in range(4)))
    return pg_outbox


@pytest.fixture
def outbox_database(pg_database: str) -> PgAccess:
    """The test's schema as the outbox sees it, reached through connections of our own."""
    return PgAccess(pg_database, "outbox_health")


@pytest.fixture
def held_open(pg_database: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection of the test's own, its transaction left open until committed."""
    with psycopg.connect(pg_database, connect_timeout=5) as conn:
        yield conn


def lock_waiters(outbox_database: PgAccess) -> int:
    n: int = outbox_database.query(WAITING)[0][0]
    return n


async def test_of_workers_racing_for_new_lines_exactly_one_takes_each(
    outbox_of_four: Outbox,
    pg_database: str,
    outbox_database: PgAccess,
    held_open: psycopg.Connection[Any],
) -> None:
    lines = [f"sku{n}" for n in range(8)]
    async with Outbox.open(pg_database) as other:
        # Both workers' takes queue behind a lock of ours, then run together.
        held_open.execute(b"LOCK TABLE outbox_line_leases IN SHARE MODE")
        takes = asyncio.gather(
            *(
                store.take_lease(line, worker, TTL_S)
                for line in lines
                for store, worker in ((outbox_of_four, "w1"), (other, "w2"))
            )
        )
        await eventually(lambda: lock_waiters(outbox_database) >= 4, timeout_s=5)
        held_open.commit()
        epochs = await takes
    for n, line in enumerate(lines):
        won = [epochs[2 * n], epochs[2 * n + 1]]
        assert sorted(won, key=str) == [1, None], (line, won)
    owners = dict(outbox_database.query("SELECT line, owner FROM outbox_line_leases"))
    assert len(owners) == len(lines)


async def test_of_workers_racing_for_an_expired_line_exactly_one_takes_it(
    outbox_of_four: Outbox,
    pg_database: str,
    outbox_database: PgAccess,
    held_open: psycopg.Connection[Any],
) -> None:
    assert await outbox_of_four.take_lease("snack", "w0", TTL_S) == 1
    outbox_database.execute("UPDATE outbox_line_leases SET expires_at = 1")
    async with Outbox.open(pg_database) as other, Outbox.open(pg_database) as third:
        held_open.execute(b"SELECT * FROM outbox_line_leases FOR SHARE")
        takes = asyncio.gather(
            outbox_of_four.take_lease("snack", "w1", TTL_S),
            other.take_lease("snack", "w2", TTL_S),
            third.take_lease("snack", "w3", TTL_S),
        )
        await eventually(lambda: lock_waiters(outbox_database) == 3, timeout_s=5)
        held_open.commit()
        epochs = await takes
    assert sorted(epochs, key=str) == [2, None, None]
    winner = f"w{epochs.index(2) + 1}"
    assert outbox_database.query("SELECT owner, epoch FROM outbox_line_leases") == [(winner, 2)]


# A worker's fenced writes of entry e0, under a lease.
WRITES: dict[str, Callable[[Outbox, Lease], Awaitable[None]]] = {
    "mark": lambda outbox, lease: outbox.mark_sent("e0", None, lease),
    "marks of several calls": lambda outbox, lease: _marks_of_several_calls(outbox, lease),
    "record failure": lambda outbox, lease: outbox.record_failure("e0", "HTTP 503", lease),
    "quarantine": lambda outbox, lease: outbox.quarantine("e0", "poison", "relay", lease),
}


async def _marks_of_several_calls(outbox: Outbox, lease: Lease) -> None:
    """e0 under `lease`, in a group with a call of no lease (which must succeed)."""
    fenced, free = await asyncio.gather(
        outbox.mark_sent("e0", None, lease), outbox.mark_sent("e1"), return_exceptions=True
    )
    assert free is None
    if isinstance(fenced, BaseException):
        raise fenced


@pytest.mark.parametrize("write", list(WRITES))
async def test_a_takeover_committed_while_a_fenced_write_waits_for_the_lease_refuses_it(
    outbox_of_four: Outbox,
    outbox_database: PgAccess,
    held_open: psycopg.Connection[Any],
    write: str,
) -> None:
    assert await outbox_of_four.take_lease("snack", "w1", TTL_S) == 1
    before = outbox_database.query("SELECT * FROM outbox_entries WHERE id = 'e0'")
    # Another worker's takeover, not yet committed, holds the lease row.
    held_open.execute(b"UPDATE outbox_line_leases SET owner = 'w2', epoch = epoch + 1")
    writing = asyncio.ensure_future(
        WRITES[write](outbox_of_four, Lease(outbox_of_four.source, "snack", 1))
    )
    await eventually(lambda: lock_waiters(outbox_database) == 1, timeout_s=5)
    assert not writing.done()
    held_open.commit()
    with pytest.raises(LeaseLost, match="epoch 2"):
        await writing
    assert outbox_database.query("SELECT * FROM outbox_entries WHERE id = 'e0'") == before
    assert outbox_database.query("SELECT count(*) FROM outbox_quarantines") == [(0,)]


@pytest.mark.parametrize("write", list(WRITES))
async def test_a_takeover_rolled_back_while_a_fenced_write_waits_lets_it_through(
    outbox_of_four: Outbox,
    outbox_database: PgAccess,
    held_open: psycopg.Connection[Any],
    write: str,
) -> None:
    assert await outbox_of_four.take_lease("snack", "w1", TTL_S) == 1
    held_open.execute(b"UPDATE outbox_line_leases SET owner = 'w2', epoch = epoch + 1")
    writing = asyncio.ensure_future(
        WRITES[write](outbox_of_four, Lease(outbox_of_four.source, "snack", 1))
    )
    await eventually(lambda: lock_waiters(outbox_database) == 1, timeout_s=5)
    held_open.rollback()
    await writing
    [(attempts,)] = outbox_database.query("SELECT attempts FROM outbox_entries WHERE id = 'e0'")
    assert attempts == (0 if write == "quarantine" else 1)


async def test_a_takeover_waits_for_a_fenced_write_in_progress(
    outbox_of_four: Outbox, outbox_database: PgAccess, held_open: psycopg.Connection[Any]
) -> None:
    # A fenced write holds the lease row FOR SHARE until it commits (here a
    # transaction of ours stands for it): a take of the expired line waits for it,
    # so no write under the old epoch commits after the takeover.
    assert await outbox_of_four.take_lease("snack", "w1", TTL_S) == 1
    outbox_database.execute("UPDATE outbox_line_leases SET expires_at = 1")
    held_open.execute(postgres_sql.FENCES.encode(), {"lines": ["snack"]})
    taking = asyncio.ensure_future(outbox_of_four.take_lease("snack", "w2", TTL_S))
    await eventually(lambda: lock_waiters(outbox_database) == 1, timeout_s=5)
    assert not taking.done()
    held_open.commit()
    assert await taking == 2


def skewed_clock(monkeypatch: pytest.MonkeyPatch, skew_s: float) -> None:
    """This process's clock, as the PostgreSQL backend reads it, `skew_s` off."""
    fake = SimpleNamespace(time=lambda: time.time() + skew_s)
    monkeypatch.setattr(publisher.backends.postgres, "time", fake)


async def test_lease_times_are_the_servers_clock_not_the_hosts(
    outbox_of_four: Outbox,
    pg_database: str,
    outbox_database: PgAccess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert await outbox_of_four.take_lease("juice", "w1", TTL_S) == 1
    skewed_clock(monkeypatch, 3600.0)  # a worker whose host's clock is an hour ahead
    async with Outbox.open(pg_database) as ahead:
        assert await ahead.take_lease("juice", "w2", TTL_S) is None  # not expired for it
        assert await ahead.take_lease("snack", "w2", TTL_S) == 1
        assert await ahead.worker_seen("w2", TTL_S) == 1
        assert await outbox_of_four.worker_seen("w1", TTL_S) == 2  # both live
        [(server_now,)] = outbox_database.query(SERVER_NOW)
        for lease in await ahead.leases():
            assert lease.expires_at == pytest.approx(server_now + TTL_S, abs=5)
            assert TTL_S - 5 < lease.expires_in_s <= TTL_S
        [(seen_at,)] = outbox_database.query(
            "SELECT seen_at FROM outbox_relay_workers WHERE worker = 'w2'"
        )
        assert seen_at == pytest.approx(server_now, abs=5)
    skewed_clock(monkeypatch, -3600.0)  # and one an hour behind
    outbox_database.execute("UPDATE outbox_line_leases SET expires_at = expires_at - 40")
    async with Outbox.open(pg_database) as behind:
        assert await behind.take_lease("juice", "w3", TTL_S) == 2  # expired for it too
        assert await behind.renew_leases("w3", {"juice": 2}, TTL_S) == {"juice"}
        assert (await behind.lease_of("juice")).expires_in_s > TTL_S - 5  # type: ignore[union-attr]


async def test_fenced_marks_of_several_lines_are_one_statement_and_one_round_trip(
    pg_server: ThrowawayServer, pg_database: str, outbox_database: PgAccess
) -> None:
    outbox_database.execute(f"ALTER DATABASE {outbox_database.dbname} SET log_statement = 'all'")
    async with Outbox.open(pg_database) as outbox:
        skus = ["juice", "snack", "tea", "water"]
        for n in range(8):
            event = {"id": f"m{n}", "sku": skus[n % 4], "qty": 1}
            assert await outbox.accept(event) == "accepted"
        epochs = {}  # each line at an epoch of its own, to tell them apart
        for k, sku in enumerate(skus):
            for _ in range(k + 1):
                epochs[sku] = await outbox.take_lease(sku, "w1", TTL_S)
        assert list(epochs.values()) == [1, 2, 3, 4]
        start = pg_server.log.stat().st_size
        await asyncio.gather(
            *(
                outbox.mark_sent_many(
                    [Mark(f"m{k}"), Mark(f"m{k + 4}")], Lease(outbox.source, sku, epochs[sku])
                )
                for k, sku in enumerate(skus)
            )
        )
        with pg_server.log.open(errors="replace") as log:
            log.seek(start)
            written = log.read()
    assert outbox_database.query("SELECT count(*) FROM outbox_entries WHERE sent = 0") == [(0,)]
    logged = re.split(r"LOG:\s+", written)
    marks = [entry for entry in logged if MARKING.search(entry)]
    assert 1 <= len(marks) <= 2, written
    for entry in marks:
        assert entry.startswith("statement: BEGIN;") and entry.rstrip().endswith("COMMIT")
    assert not [entry for entry in logged if "FOR SHARE" in entry and "BEGIN;" not in entry]


async def test_renewals_and_fenced_marks_of_many_lines_never_deadlock(
    pg_database: str, outbox_database: PgAccess
) -> None:
    # Renewals lock the lease rows in line order, as a group of fenced marks does;
    # in another order (reversed: about one round in three) two transactions each
    # hold a row the other waits for, and one fails as a deadlock.
    skus = [f"sku{n:02}" for n in range(12)]
    rounds = 20
    async with (
        Outbox.open(pg_database) as outbox,
        Outbox.open(pg_database) as beat,
        Outbox.open(pg_database) as beat_too,
    ):
        for n in range(len(skus) * rounds):
            event = {"id": f"m{n}", "sku": skus[n % len(skus)], "qty": 1}
            assert await outbox.accept(event) == "accepted"
        held = {sku: await outbox.take_lease(sku, "w1", TTL_S) or 0 for sku in skus}
        backwards = dict(reversed(held.items()))
        for round_ in range(rounds):
            marks = [
                outbox.mark_sent(f"m{round_ * len(skus) + k}", None, Lease(outbox.source, sku, 1))
                for k, sku in enumerate(skus)
            ]
            renewals = [b.renew_leases("w1", backwards, TTL_S) for b in (beat, beat_too) * 2]
            results = await asyncio.gather(*marks, *renewals)
            assert results[len(skus) :] == [set(skus)] * 4
    assert outbox_database.query("SELECT count(*) FROM outbox_entries WHERE sent = 0") == [(0,)]


def write_schema_1(url: str) -> None:
    """The publisher's tables as the release of migration 1 left them: that release's
    names (orders, outbox, quarantines), its version a row of schema_versions."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(postgres_sql.MIGRATIONS[0].encode())
        conn.execute(b"CREATE TABLE schema_versions (side TEXT PRIMARY KEY, version INT NOT NULL)")
        conn.execute(b"INSERT INTO schema_versions (side, version) VALUES ('publisher', 1)")


async def test_a_publisher_schema_1_database_gains_leases_and_a_newer_one_is_refused(
    pg_database: str, outbox_database: PgAccess
) -> None:
    write_schema_1(pg_database)  # the program before
    legacy = "SELECT version FROM schema_versions WHERE side = 'publisher'"
    versions = f"SELECT side, version FROM {VERSIONS_TABLE}"
    newest = len(postgres_sql.MIGRATIONS)
    async with Outbox.open(pg_database) as outbox:
        assert await outbox.take_lease("snack", "w1", TTL_S) == 1
        source = outbox.source
    # Every migration since (leases are the second), the events' included; the
    # version is now a row of VERSIONS_TABLE, and the one the release before read
    # is raised too, so that that release refuses the database.
    assert outbox_database.query(versions) == [("publisher", newest)]
    assert outbox_database.query(legacy) == [(newest,)]
    assert outbox_database.query("SELECT source FROM outbox_source") == [(source,)]
    assert outbox_database.query("SELECT line, epoch FROM outbox_line_leases") == [("snack", 1)]
    assert outbox_database.query(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        " AND tablename IN ('orders', 'outbox', 'quarantines', 'outbox_orders', 'outbox_entries')"
        " ORDER BY tablename"
    ) == [("outbox_entries",), ("outbox_orders",)]  # renamed, not made beside
    # A program that knows migration 1 only refuses it.
    with pytest.raises(StorageError, match="newer") as refused:
        await PgDatabase.open(
            pg_database,
            dataclasses.replace(postgres_sql.SCHEMA, migrations=postgres_sql.MIGRATIONS[:1]),
        )
    assert "\n" not in str(refused.value)


async def test_workers_opening_a_new_database_together_share_one_source(
    pg_database: str,
) -> None:
    opened = await asyncio.gather(*(Outbox.open(pg_database) for _ in range(4)))
    try:
        assert len({outbox.source for outbox in opened}) == 1
    finally:
        for outbox in opened:
            await outbox.close()
