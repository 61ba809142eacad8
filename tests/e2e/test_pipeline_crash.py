"""Pipelined delivery across real OS processes that share the same disk.

`publisher serve --pipeline 8` and `python -m sink` run as processes of their own. The
publisher ends itself right after a verified ACK (with up to eight requests in
flight), or is killed with SIGKILL in the middle of a drain; a publisher started again
on the same databases finishes the job. A checker reads both databases (SQLite files
or PostgreSQL databases: each test runs on both) through independent connections, and
the sink's inbox record over HTTP.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import (
    STOP_TIMEOUT_S,
    http_request,
    inbox_ids,
    sent_ids,
    serve_args,
    wait_until,
)

if TYPE_CHECKING:
    from conftest import AcceptOrders, Databases, PublisherProcess, Query, StartPublisher, StartSink

pytestmark = pytest.mark.e2e

CHAOS_EXIT = 73
CRASH_TIMEOUT_S = 15.0
SINK_STALL_S = 0.2  # each request held by the sink (see the pipelined-ACK test)
DRAIN_TIMEOUT_S = 30.0
SETTLE_S = 0.5  # longer than a request takes at the sink, stall included
SETTLE_ROUNDS = 20
SKUS = ("snack", "juice", "tea", "soap")
_CHAOS_LINE = re.compile(r"chaos: ACK verified for (\S+), exiting with status 73 before the mark")


def orders(count: int) -> list[dict[str, Any]]:
    """`count` orders in seq order, SKUs interleaved, each its own quantity."""
    return [
        {"id": f"order-{n:03d}", "sku": SKUS[n % len(SKUS)], "qty": n + 1} for n in range(count)
    ]


# What each publisher here runs with. One stable worker ID, as the README advises: a
# publisher started again after a crash takes its lines back at once instead of waiting
# out its lease (on PostgreSQL; on SQLite every relay of a host shares one ID anyway).
PIPELINED = (
    "--pipeline", "8", "--retry-base", "0.05", "--retry-cap", "0.5",
    "--send-timeout", "5", "--log-format", "json", "--worker-id", "relay-1",
)  # fmt: skip


def lines(events: list[dict[str, Any]], by_sku: bool) -> list[list[str]]:
    """Each line's IDs in seq order: one line, or one per SKU."""
    keyed: dict[str | None, list[str]] = {}
    for e in events:
        keyed.setdefault(e["sku"] if by_sku else None, []).append(e["id"])
    return list(keyed.values())


def assert_prefix_of_each_line(ids: list[str], events: list[dict[str, Any]], by_sku: bool) -> None:
    """`ids` (in the order given) hold, for each line, its first entries in seq order."""
    for line in lines(events, by_sku):
        members = set(line)
        done = [i for i in ids if i in members]
        assert done == line[: len(done)], (done, line[: len(done)])


def assert_all_applied_once_in_order(
    db_rows: Query, source: Path, sink_db: Path, events: list[dict[str, Any]], by_sku: bool
) -> None:
    ids = [e["id"] for e in events]
    marks = db_rows(source, "SELECT id, sent, ack FROM outbox_entries ORDER BY seq")
    assert [(i, s) for i, s, _ in marks] == [(i, 1) for i in ids]
    assert [json.loads(ack)["ack"] for _, _, ack in marks] == ids
    applied = inbox_ids(sink_db)
    assert sorted(applied) == ids  # each once: the inbox key is the ID
    assert_prefix_of_each_line(applied, events, by_sku)  # and all of it, so in order
    totals: dict[str, int] = {}
    for e in events:
        totals[e["sku"]] = totals.get(e["sku"], 0) + e["qty"]
    assert dict(db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory")) == totals


def settled_inbox(db_rows: Query, sink_db: Path) -> list[str]:
    """The inbox once the requests a dead publisher left at the sink are done: the
    same on two reads SETTLE_S apart."""
    before = inbox_ids(sink_db)
    for _ in range(SETTLE_ROUNDS):
        time.sleep(SETTLE_S)
        now = inbox_ids(sink_db)
        if now == before:
            return now
        before = now
    raise AssertionError(f"the inbox kept changing for {SETTLE_S * SETTLE_ROUNDS}s")


def inbox_record(base_port: int, event_id: str) -> dict[str, Any]:
    """GET /events/{id} on the sink: its inbox record."""
    status, record = http_request(base_port, "GET", f"/events/{event_id}")
    assert status == 200
    assert isinstance(record, dict)
    return record


def drain_and_stop(publisher: PublisherProcess, db_rows: Query, source: Path, count: int) -> None:
    """Wait until every entry is sent, then SIGTERM: an orderly exit."""
    wait_until(lambda: len(sent_ids(source)) == count, DRAIN_TIMEOUT_S)
    publisher.signal(signal.SIGTERM)
    assert publisher.wait(STOP_TIMEOUT_S) == 0, publisher.log.read_text()


# ---------------------------------------------------------------- exit after a verified ACK


@pytest.mark.parametrize("delivery", ["single", "batch"])
def test_exit_after_a_pipelined_ack_leaves_it_unmarked_and_the_restart_absorbs_the_resends(
    databases: Databases,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    accept_orders: AcceptOrders,
    db_rows: Query,
    delivery: str,
) -> None:
    source, sink_db = databases.source, databases.sink
    # The sink holds each request a moment before handling it, so that the requests
    # behind the second one are surely sent before its ACK comes back (they open
    # connections of their own; the second reuses the first's, and on a loaded
    # machine its ACK could otherwise arrive before any of them was written).
    sink = sink_process(sink_db, "--chaos", f"stall={SINK_STALL_S}")
    events = orders(24)
    ids = [e["id"] for e in events]
    size = 1 if delivery == "single" else 4
    mode = ["--delivery", delivery, "--limit", str(size)]
    # A run sends its first request alone; once its reply says the sink enforces
    # Outbox-After, the rest go up to eight at a time. The crash comes right after the
    # ACK of the first entry of the second request, with the others in flight behind
    # it. The orders are all there before the publisher starts, so its first read
    # finds them all: one run. (Accepted while it runs, the first order would wake a
    # relay on PostgreSQL at once, through NOTIFY, and make a run of its own.)
    crash_at = size + 1
    accept_orders(source, *events)
    crashing = publisher_process(
        *serve_args(
            source,
            sink.url,
            *PIPELINED,
            *mode,
            "--poll-interval",
            "2",
            "--chaos",
            f"exit-after-ack={crash_at}",
        )
    )

    assert crashing.wait(CRASH_TIMEOUT_S) == CHAOS_EXIT, crashing.log.read_text()
    [crashed] = _CHAOS_LINE.findall(crashing.log.read_text())
    assert crashed == ids[size]
    # The hook ran before the second request's mark: at most the first request is
    # marked (its mark is not awaited before the next requests go). The sink has the
    # crashed entry and those of requests that were in flight behind it, in seq order.
    applied = settled_inbox(db_rows, sink_db)
    # Read after the inbox settled: on PostgreSQL a COMMIT of a mark that the dead
    # publisher had sent may still finish on the server just after its exit.
    marked_before = sent_ids(source)
    assert marked_before in ([], ids[:size])
    assert len(applied) > 2 * size, (
        f"no request was in flight behind the crashed one: applied {applied}; "
        f"{crashing.log.read_text()}"
    )
    assert applied[: size + 1] == ids[: size + 1]
    assert_prefix_of_each_line(applied, events, by_sku=False)
    assert inbox_record(sink.port, crashed)["deliveries"] == 1

    restarted = publisher_process(
        *serve_args(source, sink.url, *PIPELINED, *mode, "--poll-interval", "0.1")
    )
    drain_and_stop(restarted, db_rows, source, len(ids))

    assert_all_applied_once_in_order(db_rows, source, sink_db, events, by_sku=False)
    assert inbox_record(sink.port, crashed)["deliveries"] == 2
    # Everything applied but not marked before the crash was sent again once and
    # absorbed; the rest was sent once.
    delivered: dict[str, int] = dict(db_rows(sink_db, "SELECT id, deliveries FROM inbox_events"))
    resent = set(applied) - set(marked_before)
    assert delivered == {i: 2 if i in resent else 1 for i in ids}
    [(crashed_ack,)] = db_rows(source, "SELECT ack FROM outbox_entries WHERE id = ?", (crashed,))
    assert json.loads(crashed_ack)["status"] == "duplicate"
    assert sink.proc.poll() is None, "the sink process should still be serving"


@pytest.mark.parametrize("delivery", ["single", "batch"])
def test_by_default_a_run_sends_its_first_request_alone(
    databases: Databases,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    accept_orders: AcceptOrders,
    db_rows: Query,
    delivery: str,
) -> None:
    """`publisher serve` pipelines by default, but only once a reply of this run has
    said the sink enforces Outbox-After: at the first ACK nothing else is in flight."""
    source, sink_db = databases.source, databases.sink
    sink = sink_process(sink_db)
    events = orders(24)
    ids = [e["id"] for e in events]
    size = 1 if delivery == "single" else 4
    args = [
        *serve_args(source, sink.url),
        "--delivery", delivery, "--limit", str(size), "--poll-interval", "2",
        "--worker-id", "relay-1", "--chaos", "exit-after-ack",
    ]  # fmt: skip
    accept_orders(source, *events)  # all there at the first read: one run
    crashing = publisher_process(*args)

    assert crashing.wait(CRASH_TIMEOUT_S) == CHAOS_EXIT, crashing.log.read_text()
    assert _CHAOS_LINE.findall(crashing.log.read_text()) == [ids[0]]
    assert sent_ids(source) == []
    assert settled_inbox(db_rows, sink_db) == ids[:size]  # the first request, and no other

    restarted = publisher_process(*args[:-2], "--poll-interval", "0.1")
    drain_and_stop(restarted, db_rows, source, len(ids))
    assert_all_applied_once_in_order(db_rows, source, sink_db, events, by_sku=False)


# ---------------------------------------------------------------- SIGKILL mid-drain


@pytest.mark.parametrize("ordering", ["global", "sku"])
def test_sigkill_mid_drain_loses_nothing_and_applies_nothing_twice(
    databases: Databases,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    accept_orders: AcceptOrders,
    db_rows: Query,
    ordering: str,
) -> None:
    source, sink_db = databases.source, databases.sink
    by_sku = ordering == "sku"
    # Each request waits at the sink, so the drain lasts long enough to be cut.
    sink = sink_process(sink_db, "--chaos", "stall=0.2")
    events = orders(300)
    ids = [e["id"] for e in events]
    accept_orders(source, *events)
    options = [
        "--delivery", "batch", "--limit", "4", "--ordering", ordering, "--lanes", "2",
        "--poll-interval", "0.2",
    ]  # fmt: skip

    publisher = publisher_process(*serve_args(source, sink.url, *PIPELINED, *options))
    wait_until(lambda: len(sent_ids(source)) >= 40, DRAIN_TIMEOUT_S)
    assert publisher.kill() == -signal.SIGKILL

    marked = sent_ids(source)
    assert len(marked) < len(ids), "the drain ended before the kill"
    assert set(marked) <= set(inbox_ids(sink_db))  # a mark follows an ACK
    assert_prefix_of_each_line(marked, events, by_sku)
    # Whatever the sink does with the requests the dead publisher left in flight,
    # each line stays in order.
    applied = settled_inbox(db_rows, sink_db)
    assert_prefix_of_each_line(applied, events, by_sku)
    unmarked = set(applied) - set(marked)

    restarted = publisher_process(*serve_args(source, sink.url, *PIPELINED, *options))
    drain_and_stop(restarted, db_rows, source, len(ids))

    assert_all_applied_once_in_order(db_rows, source, sink_db, events, by_sku)
    # Marked before the kill: never sent again. Applied but not marked: sent again
    # once and absorbed. Not applied: sent once, by the restarted publisher.
    delivered: dict[str, int] = dict(db_rows(sink_db, "SELECT id, deliveries FROM inbox_events"))
    assert delivered == {i: 2 if i in unmarked else 1 for i in ids}
    assert sink.proc.poll() is None, "the sink process should still be serving"
