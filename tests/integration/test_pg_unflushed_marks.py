"""The publisher's marks on PostgreSQL do not wait for the WAL flush: a crash of the
server may undo them, and then each entry is sent again, answered by the sink with a
duplicate ACK, and applied once. A mark that closes a quarantine does wait for it.

A throwaway server of the test's own whose WAL writer sleeps 10 s between flushes
(its default synchronous_commit stays on): a commit that does not wait for the flush
is only in the server's memory until then. Orders are accepted (each intake commit
waits for its flush); one is sent and acknowledged, then quarantined, and its ACK
then marks it (the ACK wins, the quarantine record says "delivered"); the others are
delivered over HTTP to the real sink app and marked. Then the server is stopped with
`immediate` (no checkpoint, no flush: as a crash) and started again. The orders are
all there, the quarantined entry's mark is, the others' marks are not; a second
delivery sends each of them again, the sink (on its own SQLite file) answers each as
a duplicate, and the inventory holds each order once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from pg_faults import PgAccess
from support import as_event, scrape, value

from plumbing.pgserver import ThrowawayServer, throwaway_server
from publisher.cli.dispatch import deliver_pending
from publisher.http import HttpSender
from publisher.settings import RelaySettings
from publisher.store import Outbox
from shared import Receipt

if TYPE_CHECKING:
    from conftest import Query, ServeSink

LAZY_WAL = {"wal_writer_delay": "10000ms"}  # the WAL writer's longest sleep
LATE = {"id": "late", "sku": "snack", "qty": 100}  # quarantined while its ACK was on the way
ORDERS = [{"id": f"order-{n}", "sku": "snack", "qty": n} for n in range(1, 6)]
IDS = [order["id"] for order in ORDERS]
UNFLUSHED = "SELECT pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn()"


async def deliver(outbox: Outbox, sink: str) -> list[str]:
    """One batch request for every pending entry, and the marks of its ACKs."""
    async with HttpSender(f"{sink}/events") as sender:
        settings = RelaySettings(batch=True, pipeline=1, worker=None)
        return await deliver_pending(outbox, sender, settings)


async def duplicates_answered(sink: str) -> float:
    async with aiohttp.ClientSession() as client:
        samples = await scrape(client, f"{sink}/metrics")
    return value(samples, "sink_inbox_received_total", result="duplicate")


async def test_marks_undone_by_a_crash_of_the_server_are_sent_again_and_applied_once(
    serve_sink: ServeSink, tmp_path: Path, db_rows: Query, pg_server: ThrowawayServer
) -> None:
    # pg_server: skips (or fails under CI) where there is no PostgreSQL, as elsewhere.
    # A server of its own, not a schema on pg_server: it runs with settings of its
    # own and the test crashes it.
    sink_db = tmp_path / "sink.db"
    sink = await serve_sink(sink_db)
    with throwaway_server(LAZY_WAL) as server:
        url = server.create_database("source")
        source = PgAccess(url, "outbox_health")
        async with Outbox.open(url) as outbox:
            assert await outbox.accept_many([LATE, *ORDERS]) == ["accepted"] * (1 + len(ORDERS))
            async with HttpSender(f"{sink}/events") as sender:
                ack = await sender.deliver(as_event(LATE))
            assert ack["ack"] == "late" and ack["status"] == Receipt.APPLIED
            await outbox.quarantine("late", "looked stuck", "op")
            await outbox.mark_sent_many([("late", ack)])
            assert await deliver(outbox, sink) == IDS
        assert source.query("SELECT count(*) FROM outbox_entries WHERE sent = 1") == [
            (1 + len(IDS),)
        ]
        assert source.query(UNFLUSHED) == [(True,)], "the marks were flushed before the crash"

        await asyncio.to_thread(server.stop, "immediate")
        await asyncio.to_thread(server.start)

        # Intake and the mark that closed the quarantine waited for their flush; the
        # other marks did not, and are undone.
        assert source.query("SELECT id FROM outbox_orders ORDER BY id") == sorted(
            [("late",)] + [(i,) for i in IDS]
        )
        assert source.query("SELECT id, sent FROM outbox_entries ORDER BY seq") == [
            ("late", 1),
            *((i, 0) for i in IDS),
        ]
        assert source.query("SELECT id, released_as FROM outbox_quarantines") == [
            ("late", "delivered")
        ]
        assert await duplicates_answered(sink) == 0

        async with Outbox.open(url) as outbox:
            assert await deliver(outbox, sink) == IDS
            assert await outbox.pending() == []
        statuses = source.query("SELECT id, ack::json->>'status' FROM outbox_entries ORDER BY seq")
        assert statuses == [("late", "applied"), *((i, "duplicate") for i in IDS)]

    assert await duplicates_answered(sink) == len(IDS)
    assert db_rows(sink_db, "SELECT id FROM inbox_events ORDER BY applied_seq") == [
        ("late",),
        *((i,) for i in IDS),
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [
        ("snack", 100 + sum(range(1, 6)))
    ]
