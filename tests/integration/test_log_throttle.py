"""A relay whose database or sink keeps failing logs the failure once, then a summary
per interval, not a line (and a traceback) per retry; and delivers once it is fixed.

Real relay, real outbox file, real loopback sink; the disk is really full (a small
tmpfs, skipped where none can be mounted). Outcomes are read from the files.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from aiohttp import web
from relay_lines import FAST, POLL_INTERVAL_S, relay_of, running, sender_for
from small_disk import fill, small_disk
from support import eventually, sent_events

from publisher.store import Outbox
from shared import Receipt, make_ack, payload_digest

if TYPE_CHECKING:
    from conftest import Query, Serve, ServeSink

REPEAT_S = 0.5
FAULT_S = 2.0
ORDERS = [{"id": f"o{n}", "sku": "snack", "qty": n + 1} for n in range(5)]
# One line at the start, one per interval after, one for a partial interval (timing).
MOST_LINES = 1 + int(FAULT_S / REPEAT_S) + 1


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(text)]


def repeated(record: logging.LogRecord) -> int:
    n: int = record.__dict__.get("repeated", 0)
    return n


async def test_a_full_disk_is_logged_once_per_interval_and_delivery_resumes_when_freed(
    tmp_path: Path, serve_sink: ServeSink, db_rows: Query, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    sink_db = tmp_path / "sink.db"
    url = f"{await serve_sink(sink_db)}/events"
    with small_disk(tmp_path / "disk") as disk:
        db = disk / "source.db"
        async with Outbox.open(db) as outbox:
            for order in ORDERS:
                assert await outbox.accept(order) == "accepted"
            filler = fill(disk)  # reads work, every mark fails: database or disk is full
            async with sender_for(url) as sender:
                # Without leases: a worker that cannot write its lease sends nothing,
                # and this is about the log of the marks that fail on a full disk.
                relay = relay_of(
                    outbox,
                    sender.deliver,
                    retry=FAST,
                    poll_interval_s=POLL_INTERVAL_S,
                    log_repeat_interval_s=REPEAT_S,
                    worker=None,
                )
                async with running(relay):
                    await asyncio.sleep(FAULT_S)
                    attempts = db_rows(sink_db, "SELECT sum(deliveries) FROM inbox_events")[0][0]
                    failed = lines(caplog, "relay step failed")
                    filler.unlink()
                    freed = time.time()
                    await eventually(
                        lambda: (
                            db_rows(db, "SELECT count(*) FROM outbox_entries WHERE sent = 0")
                            == [(0,)]
                        )
                    )
    assert attempts >= 20, "the relay retried often while the disk was full"
    assert 2 <= len(failed) <= MOST_LINES
    first, *later = failed
    assert "full" in first.getMessage()
    assert not first.exc_info  # a storage error's message says it all: no driver traceback
    # Each later line sums up the interval before it; only after an interval without
    # a failure (a relay held up on a loaded machine) is one a first line again.
    for before, line in zip(failed, later, strict=False):
        assert not line.exc_info
        if repeated(line) == 0:
            assert line.created - before.created >= REPEAT_S, line.getMessage()
            continue
        assert "(repeated " in line.getMessage()
        assert "times in the last" in line.getMessage()
    summaries = [line for line in later if repeated(line) > 0]
    assert sum(repeated(r) for r in summaries) >= 10
    # Once the relay succeeds again, what was left out since the last line is told
    # at once, not with a next failure that never comes.
    *_, last = lines(caplog, "relay step failed")
    assert last.created >= freed and repeated(last) > 0 and not last.exc_info
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(noisy) <= 2 * MOST_LINES, [r.getMessage() for r in noisy]
    # Delivered once in effect, every one of them: the resends were duplicates.
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [
        (sum(o["qty"] for o in ORDERS),)
    ]


async def test_a_sink_that_keeps_failing_blocks_the_head_with_one_line_per_interval(
    tmp_path: Path, serve: Serve, db_rows: Query, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    broken = True
    requests = 0

    async def events(request: web.Request) -> web.Response:
        nonlocal requests
        requests += 1
        [event] = sent_events(await request.json())
        if broken:
            return web.json_response({"error": "overloaded"}, status=503)
        return web.json_response(make_ack(event["id"], Receipt.APPLIED, payload_digest(event)))

    app = web.Application()
    app.router.add_post("/events", events)
    url = f"{await serve(app)}/events"
    db = tmp_path / "source.db"
    async with Outbox.open(db) as outbox:
        for order in ORDERS:
            assert await outbox.accept(order) == "accepted"
        async with sender_for(url) as sender:
            relay = relay_of(
                outbox,
                sender.deliver,
                retry=FAST,
                poll_interval_s=POLL_INTERVAL_S,
                log_repeat_interval_s=REPEAT_S,
            )
            async with running(relay):
                await asyncio.sleep(FAULT_S)
                tries, blocked = requests, lines(caplog, "head blocked")
                broken = False
                await eventually(
                    lambda: (
                        db_rows(db, "SELECT count(*) FROM outbox_entries WHERE sent = 0") == [(0,)]
                    )
                )
    assert tries >= 20
    assert 2 <= len(blocked) <= MOST_LINES
    assert all(r.__dict__["event_id"] == "o0" for r in blocked)
    assert [repeated(r) > 0 for r in blocked[1:]] == [True] * (len(blocked) - 1)
    *_, last = lines(caplog, "head blocked")  # the summary written once it went through
    assert last is not blocked[-1] and repeated(last) > 0
    # Every failed attempt is still counted on the entry.
    assert db_rows(db, "SELECT attempts >= ? FROM outbox_entries WHERE id = 'o0'", (tries,)) == [
        (1,)
    ]
