"""Several relay workers on one outbox: in-process relays with leases, on both backends.

Each relay is a worker of its own (its own LeaseKeeper, its own HttpSender) against a
real sink app on loopback; what was delivered is read from the sink's inbox
(applied_seq) and the outbox by connections of the test's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from recorded_sink import WrappedSender
from relay_lines import FAST, STOP_TIMEOUT_S, sender_for
from support import accept_events, entry_payload, eventually, placed

from publisher.cli.dispatch import LineHeld, deliver_pending
from publisher.leases import LeaseKeeper, Share
from publisher.relay import Relay
from publisher.settings import RelaySettings, WorkerSettings
from publisher.store import LineLease, Outbox
from shared import GLOBAL_LINE, Event, Lease, Order

if TYPE_CHECKING:
    from conftest import Databases, Query, ServeSink

T = TypeVar("T")
POLL_S = 0.05
TTL_S = 0.6  # renewals every 0.2 s: rebalances and takeovers within a test's second
# For a test that asserts no lease ever lapses: a loaded machine can hold a worker's
# renewal (its commit, its loop) for more than TTL_S, and that is a takeover.
STEADY_TTL_S = 2.0


@dataclass
class Metrics:
    """A worker's observer and lease observer, counting what they are told."""

    outcomes: Counter[str] = field(default_factory=Counter)
    owned: int = 0
    most_owned: int = 0
    live: int = 0
    fewer_live: int = 0  # reads that saw fewer live workers than the one before
    takeovers: int = 0
    fenced_writes: int = 0
    fenced_requests: int = 0

    def delivery(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    def lines_owned(self, count: int) -> None:
        self.owned = count
        self.most_owned = max(self.most_owned, count)

    def workers_live(self, count: int) -> None:
        self.fewer_live += count < self.live
        self.live = count

    def takeover(self) -> None:
        self.takeovers += 1

    def fenced_write(self) -> None:
        self.fenced_writes += 1

    def fenced_request(self) -> None:
        self.fenced_requests += 1


@dataclass
class Sent:
    """One request a worker sent: its events' IDs and keys, and its lease."""

    ids: list[str]
    keys: set[str]
    lease: Lease | None


@dataclass
class Worker:
    """A relay worker: its relay, its metrics, and the requests it sent."""

    name: str
    relay: Relay
    metrics: Metrics
    sent: list[Sent]
    task: asyncio.Task[None]

    async def stop(self) -> None:
        """SIGTERM's part: stop sending, settle, release the leases; bounded."""
        self.relay.stop()
        await asyncio.wait_for(asyncio.shield(self.task), STOP_TIMEOUT_S)

    @property
    def keeper(self) -> LeaseKeeper:
        assert self.relay.keeper is not None
        return self.relay.keeper

    @property
    def delivered(self) -> int:
        return self.metrics.outcomes["delivered"]


@dataclass
class Recording(WrappedSender):
    """Wraps a sender: records each request, and holds those of `hold` until `go`."""

    sent: list[Sent] = field(default_factory=list)
    hold: set[str] = field(default_factory=set)
    held: asyncio.Event = field(default_factory=asyncio.Event)
    go: asyncio.Event = field(default_factory=asyncio.Event)

    async def _request(
        self,
        events: Sequence[Event],
        after: str | None,
        send: Callable[[], Awaitable[T]],
        lease: Lease | None,
    ) -> T:
        self.sent.append(Sent([e["id"] for e in events], {e["key"] for e in events}, lease))
        if self.hold.intersection(e["id"] for e in events):
            self.held.set()
            await self.go.wait()
        return await send()


@contextlib.asynccontextmanager
async def worker(
    outbox: Outbox, url: str, name: str, *, batch: bool = False, **settings: Any
) -> AsyncIterator[tuple[Worker, Recording]]:
    """A relay worker named `name`, running until the block ends (then stopped)."""
    settings.setdefault("retry", FAST)
    settings.setdefault("poll_interval_s", POLL_S)
    settings.setdefault("worker", WorkerSettings(name, TTL_S))
    settings.setdefault("pipeline", 1)
    metrics, sent = Metrics(), []
    async with sender_for(url) as sender:
        recording = Recording(sender, sent)
        relay = Relay(
            outbox,
            recording,
            RelaySettings(batch=batch, **settings),
            observer=metrics,
            lease_observer=metrics,
            rand=random.Random(7).random,
        )
        task = asyncio.create_task(relay.run())
        try:
            yield Worker(name, relay, metrics, sent, task), recording
        finally:
            relay.stop()
            try:
                await asyncio.wait_for(task, STOP_TIMEOUT_S)
            finally:
                if not task.done():
                    task.cancel()


def orders(count: int, skus: Sequence[str], start: int = 0) -> list[Order]:
    return [
        {"id": f"o{n:04d}", "sku": skus[n % len(skus)], "qty": 1}
        for n in range(start, start + count)
    ]


def pending(db_rows: Query, db: Path | str) -> int:
    return int(db_rows(db, "SELECT count(*) FROM outbox_entries WHERE sent = 0")[0][0])


def applied(db_rows: Query, sink: Path | str) -> list[tuple[str, str]]:
    """(id, key) of each event applied at the sink, in the order it was applied."""
    rows = db_rows(sink, "SELECT id, payload FROM inbox_events ORDER BY applied_seq")
    return [(i, json.loads(payload)["key"]) for i, payload in rows]


def seq_order(db_rows: Query, db: Path | str) -> list[tuple[str, str]]:
    rows = db_rows(db, f"SELECT id, {entry_payload(db)} FROM outbox_entries ORDER BY seq")
    return [(i, json.loads(payload)["key"]) for i, payload in rows]


def per_sku(rows: list[tuple[str, str]]) -> dict[str, list[str]]:
    lanes: dict[str, list[str]] = {}
    for event_id, sku in rows:
        lanes.setdefault(sku, []).append(event_id)
    return lanes


async def owner_of(outbox: Outbox, line: str) -> tuple[str | None, int]:
    lease = await outbox.lease_of(line)
    return (None, 0) if lease is None else (lease.owner if lease.held else None, lease.epoch)


async def row_of(outbox: Outbox, line: str) -> tuple[str | None, int]:
    """The lease row's owner and epoch, expired or not (a renewal late under load
    leaves the row as it is: only a release or a take changes it)."""
    lease = await outbox.lease_of(line)
    return (None, 0) if lease is None else (lease.owner, lease.epoch)


if TYPE_CHECKING:
    from pathlib import Path


# ---------------------------------------------------------------- global order


async def test_in_global_order_one_worker_delivers_the_other_stands_by_then_takes_over(
    databases: Databases, serve_sink: ServeSink, db_rows: Query
) -> None:
    url = f"{await serve_sink(databases.sink)}/events"
    first, second = orders(30, ("snack", "juice")), orders(20, ("snack", "tea"), start=30)
    async with Outbox.open(databases.source) as outbox:
        await accept_events(outbox, first)
        steady = {name: WorkerSettings(name, STEADY_TTL_S) for name in ("w1", "w2")}
        async with worker(outbox, url, "w1", worker=steady["w1"]) as (one, _):
            await eventually(lambda: pending(db_rows, databases.source) == 0)
            async with worker(outbox, url, "w2", worker=steady["w2"]) as (two, _):
                await asyncio.sleep(STEADY_TTL_S)  # three renewals: w2 keeps standing by
                await accept_events(outbox, second[:10])
                await eventually(lambda: pending(db_rows, databases.source) == 0)
                assert await owner_of(outbox, GLOBAL_LINE) == ("w1", 1)
                assert two.sent == [] and two.keeper.lines == []
                await one.stop()
                # w1 releases at its stop: w2 takes the line at its next try (no
                # waiting out the ttl), under the next epoch, and delivers the rest.
                await eventually(lambda: two.keeper.lines == [GLOBAL_LINE], timeout_s=5.0)
                await accept_events(outbox, second[10:])
                await eventually(lambda: pending(db_rows, databases.source) == 0)
                assert await owner_of(outbox, GLOBAL_LINE) == ("w2", 2)
                assert two.metrics.takeovers == 0  # released, not taken over
    assert {s.lease for s in one.sent} == {Lease(outbox.source, GLOBAL_LINE, 1)}
    assert {s.lease for s in two.sent} == {Lease(outbox.source, GLOBAL_LINE, 2)}
    assert sorted(i for s in two.sent for i in s.ids) == [e["id"] for e in second[10:]]
    # Nothing lost, nothing applied twice, global order kept across the handover.
    assert applied(db_rows, databases.sink) == seq_order(db_rows, databases.source)
    assert db_rows(databases.source, "SELECT count(*) FROM outbox_relay_workers") == [(0,)]


async def test_a_late_mark_of_a_worker_whose_line_was_taken_over_is_refused_and_stops_it(
    databases: Databases, serve_sink: ServeSink, db_rows: Query
) -> None:
    url = f"{await serve_sink(databases.sink)}/events"
    async with Outbox.open(databases.source) as outbox:
        await accept_events(outbox, orders(3, ("snack",)))
        async with worker(outbox, url, "w1") as (one, recording):
            recording.hold = {"o0003"}
            await eventually(lambda: pending(db_rows, databases.source) == 0)
            await accept_events(outbox, orders(1, ("snack",), start=3))
            await asyncio.wait_for(recording.held.wait(), 5.0)  # o0003's request in flight
            # Its lease runs out (as if w1 had been paused past it) and another
            # worker takes the line over, through the store: epoch 2.
            expire_leases(databases.source)
            assert await outbox.take_lease(GLOBAL_LINE, "intruder", 60.0) == 2
            recording.go.set()  # the sink ACKs (it saw no epoch 2); the mark is refused
            await eventually(lambda: one.metrics.fenced_writes == 1)
            await eventually(lambda: one.keeper.lines == [])
            await asyncio.sleep(2 * TTL_S)  # w1 stands by: intruder holds the line
            assert one.keeper.lines == [] and len(one.sent) == 4
    # Not marked, and not counted against the entry: the new owner delivers it.
    rows = db_rows(
        databases.source, "SELECT sent, attempts, last_error FROM outbox_entries WHERE id = 'o0003'"
    )
    assert rows == [(0, 0, None)]
    assert one.metrics.outcomes["transient"] == 0 and one.metrics.outcomes["permanent"] == 0
    assert lease_row(db_rows, databases.source) == ("intruder", 2)


def expire_leases(db: Path | str) -> None:
    """Every lease runs out now (as if its worker had been paused past it): written
    by a connection of the test's own."""
    statement = "UPDATE outbox_line_leases SET expires_at = 0"
    if isinstance(db, str) and db.startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(db, autocommit=True, connect_timeout=5) as pg:
            pg.execute(statement)
        return
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn, conn:
        conn.execute(statement)


def lease_row(db_rows: Query, db: Path | str) -> tuple[str, int]:
    ((owner, epoch),) = db_rows(db, "SELECT owner, epoch FROM outbox_line_leases WHERE line = '*'")
    return owner, epoch


async def test_a_request_the_sink_fences_is_counted_and_stops_the_line(
    databases: Databases, serve_sink: ServeSink, db_rows: Query
) -> None:
    url = f"{await serve_sink(databases.sink)}/events"
    async with Outbox.open(databases.source) as outbox:
        await accept_events(outbox, orders(2, ("snack",)))
        async with worker(outbox, url, "w1") as (one, recording):
            recording.hold = {"o0001"}
            await asyncio.wait_for(recording.held.wait(), 5.0)
            # o0000's mark, asked for on its ACK, may still be forming its group.
            sent = "SELECT sent FROM outbox_entries WHERE id = 'o0000'"
            await eventually(lambda: db_rows(databases.source, sent) == [(1,)])
            expire_leases(databases.source)
            epoch = await outbox.take_lease(GLOBAL_LINE, "intruder", 60.0)
            assert epoch == 2
            # The new owner's first request reaches the sink before w1's late one.
            async with sender_for(url) as sender:
                lease = Lease(outbox.source, GLOBAL_LINE, epoch)
                await sender.deliver(placed("o0000"), lease=lease)
            recording.go.set()
            await eventually(lambda: one.metrics.fenced_requests == 1)
            assert one.keeper.lines == []
    assert one.metrics.outcomes["fenced"] == 1
    assert db_rows(
        databases.source, "SELECT id, sent, attempts FROM outbox_entries ORDER BY seq"
    ) == [
        ("o0000", 1, 1),
        ("o0001", 0, 0),
    ]
    # w1's o0001 was not applied (409, nothing applied): only the new owner's o0000.
    assert [i for i, _ in applied(db_rows, databases.sink)] == ["o0000"]


# ---------------------------------------------------------------- per-SKU order


async def test_per_sku_lanes_spread_over_three_workers_and_keep_seq_order_per_sku(
    databases: Databases, serve_sink: ServeSink, db_rows: Query
) -> None:
    # Slow enough a sink that the lanes are still busy when sampled below (at 0.02 s a
    # quiet machine drained the second batch before the samples).
    url = f"{await serve_sink(databases.sink, stall_s=0.05)}/events"
    skus = [f"sku{n:02d}" for n in range(12)]
    sku = {"ordering": "sku", "max_lanes": 12}
    async with Outbox.open(databases.source) as outbox:
        await accept_events(outbox, orders(480, skus))
        # w1 starts alone and takes every lane; w2 and w3 join mid-run and get a share
        # within a few renewals (w1 gives the excess up), while the rest keeps going.
        async with worker(outbox, url, "w1", **sku) as (one, _):
            await eventually(lambda: len(one.keeper.lines) >= 8)
            async with worker(outbox, url, "w2", **sku) as (two, _):
                async with worker(outbox, url, "w3", **sku) as (three, _):
                    await eventually(lambda: two.keeper.lines and three.keeper.lines, 15.0)
                    await accept_events(outbox, orders(240, skus, start=480))
                    await asyncio.sleep(3 * TTL_S / 3)  # three renewals: shares settle
                    held = []
                    for _ in range(5):
                        held.append([len(w.keeper.lines) for w in (one, two, three)])
                        await asyncio.sleep(TTL_S / 6)
                    await eventually(
                        lambda: pending(db_rows, databases.source) == 0, timeout_s=20.0
                    )
                    workers = (one, two, three)
                    # Before any worker stops (a stop lowers the others' live count).
                    most = max(w.metrics.most_owned for w in (two, three))
                    lapsed = any(w.metrics.takeovers or w.metrics.fewer_live for w in workers)
    assert all(w.delivered > 0 for w in workers), [w.delivered for w in workers]
    # While two or three were live, none held far more than its share of the lanes;
    # unless a heartbeat or a lease lapsed (the three share this test's event loop: a
    # stall of it past TTL_S on a loaded machine lapses them all, and the first to run
    # counts itself alone and takes the free or expired lanes, as it should). The
    # samples below are judged either way.
    if not lapsed:
        assert most <= math.ceil(len(skus) / 2) + 1
    # Judged while most lanes were still held: as the last lanes drain, each worker
    # releases its own, and the few left may sit with one until its next renewal.
    busy = [counts for counts in held if sum(counts) > len(skus) // 2]
    assert busy, held
    for counts in busy:
        assert max(counts) <= math.ceil(sum(counts) / 3) + 2, held
    # Every request went out under the lease of its own lane.
    for w in workers:
        assert all(s.lease is not None and s.keys == {s.lease.line} for s in w.sent)
    # Per SKU, the sink applied the entries in seq order, each once.
    assert per_sku(applied(db_rows, databases.sink)) == per_sku(
        seq_order(db_rows, databases.source)
    )


async def test_a_drained_lane_releases_its_lease_and_stop_releases_the_rest(
    databases: Databases, serve_sink: ServeSink, db_rows: Query
) -> None:
    url = f"{await serve_sink(databases.sink, reject_skus=frozenset({'bad'}))}/events"
    async with Outbox.open(databases.source) as outbox:
        await accept_events(outbox, orders(4, ("snack", "bad")))
        async with worker(outbox, url, "w1", ordering="sku") as (one, _):
            await eventually(lambda: pending(db_rows, databases.source) == 2)
            await asyncio.sleep(2 * TTL_S)
            # snack drained: released; bad keeps failing, backing off: kept, renewed.
            assert one.keeper.lines == ["bad"]
            assert await row_of(outbox, "snack") == (None, 1)
            assert await row_of(outbox, "bad") == ("w1", 1)
    # At the stop every lease is released and the worker forgotten.
    assert db_rows(
        databases.source, "SELECT count(*) FROM outbox_line_leases WHERE owner IS NOT NULL"
    ) == [(0,)]
    assert db_rows(databases.source, "SELECT count(*) FROM outbox_relay_workers") == [(0,)]
    assert one.metrics.owned == 0


# ---------------------------------------------------------------- dispatch


async def test_dispatch_refuses_a_line_a_worker_holds_and_delivers_one_it_can_take(
    databases: Databases, serve_sink: ServeSink, db_rows: Query
) -> None:
    url = f"{await serve_sink(databases.sink)}/events"
    sent: list[Sent] = []
    async with Outbox.open(databases.source) as outbox, sender_for(url) as sender:
        await accept_events(outbox, orders(4, ("snack", "juice")))
        recording = Recording(sender, sent)
        me = RelaySettings(batch=False, pipeline=1, worker=WorkerSettings("dispatch-test", TTL_S))
        assert await outbox.take_lease("juice", "w1", 60.0) == 1
        with pytest.raises(LineHeld, match="'juice' is being delivered by relay worker w1"):
            await deliver_pending(outbox, recording, me)
        assert sent == [] and pending(db_rows, databases.source) == 4
        # The global line was taken and given back: free again, under a later epoch.
        assert await owner_of(outbox, GLOBAL_LINE) == (None, 1)
        await outbox.release_leases("w1", {"juice": 1})
        assert await deliver_pending(outbox, recording, me) == [
            "o0000",
            "o0001",
            "o0002",
            "o0003",
        ]
        assert {s.lease for s in sent} == {Lease(outbox.source, GLOBAL_LINE, 2)}
        lines = {lease.line: (lease.owner, lease.epoch) for lease in await outbox.leases()}
        assert lines == {GLOBAL_LINE: (None, 2), "juice": (None, 2), "snack": (None, 1)}


# ---------------------------------------------------------------- the worker's own view


async def test_a_lease_not_renewed_in_time_is_not_sent_under_even_without_the_database(
    tmp_path: Path,
) -> None:
    now = [100.0]
    async with Outbox.open(tmp_path / "source.db") as outbox:
        keeper = LeaseKeeper(outbox, WorkerSettings("w1", 10.0), clock=lambda: now[0])
        lease = await keeper.take(GLOBAL_LINE)
        assert lease == Lease(outbox.source, GLOBAL_LINE, 1)
        now[0] += 7.9  # within ttl - margin (8 s): still good
        assert keeper.holds(lease)
        now[0] += 0.2  # past it, though the outbox's lease has 2 s left: sends nothing
        assert not keeper.holds(lease) and keeper.held(GLOBAL_LINE)
        await keeper.renew()  # a renewal that succeeds makes it good again
        assert keeper.holds(lease)
        # Taking a line held already does not raise its epoch (that would fence its
        # own requests in flight): the lease held is returned.
        assert await keeper.take(GLOBAL_LINE) == lease


async def test_a_worker_restarted_under_its_id_is_up_since_its_restart(tmp_path: Path) -> None:
    """Killed and started again under the same ID (as the docs advise, so it takes its
    lines back at once), a worker's uptime starts again; a beat leaves it."""
    async with Outbox.open(tmp_path / "source.db") as outbox:
        await LeaseKeeper(outbox, WorkerSettings("w1", 10.0)).renew()  # then killed
        with sqlite3.connect(tmp_path / "source.db") as conn:  # as if 100 s ago
            conn.execute("UPDATE outbox_relay_workers SET started_at = started_at - 100")
        [before] = await outbox.workers(10.0)
        assert before.seen_at - before.started_at > 99

        again = LeaseKeeper(outbox, WorkerSettings("w1", 10.0))
        await again.renew()
        [restarted] = await outbox.workers(10.0)
        assert restarted.seen_at - restarted.started_at < 1
        await again.renew()
        [beaten] = await outbox.workers(10.0)
        assert beaten.started_at == restarted.started_at
        assert beaten.seen_at >= restarted.seen_at


async def test_a_worker_that_starts_takes_only_its_share_before_its_first_renewal(
    tmp_path: Path,
) -> None:
    async with Outbox.open(tmp_path / "source.db") as outbox:
        one_metrics, two_metrics = Metrics(), Metrics()
        one = LeaseKeeper(outbox, WorkerSettings("w1", 10.0), one_metrics)
        two = LeaseKeeper(outbox, WorkerSettings("w2", 10.0), two_metrics)
        await one.start()
        try:
            assert (one.room(12), one_metrics.live) == (12, 1)  # alone: any number
            for line in ("a", "b", "c", "d"):
                assert await one.take(line) is not None
            await two.start()
            # Read at its start, before any renewal: two live, w1 holding four. w2 may
            # hold n lines while n <= ceil((4 + n) / 2) + 1: seven of twelve wanted.
            assert (two.share, two_metrics.live) == (Share(others=4, live=2), 2)
            assert two.room(12) == 7
        finally:
            await two.stop()
            await one.stop()


async def test_a_take_reads_the_previous_owner_only_once_its_lease_may_have_run_out(
    tmp_path: Path,
) -> None:
    # A line another worker released (as drained lanes are, all the time) is taken in
    # one statement and is no takeover; one whose lease has run out since it was
    # read is read first, and taking it is a takeover.
    now = [100.0]
    async with Outbox.open(tmp_path / "source.db") as outbox:
        reads: list[str] = []
        lease_of = outbox.lease_of

        async def counted(line: str) -> LineLease | None:
            reads.append(line)
            return await lease_of(line)

        outbox.lease_of = counted  # type: ignore[method-assign]
        one = LeaseKeeper(outbox, WorkerSettings("w1", 10.0))
        two_metrics = Metrics()
        two = LeaseKeeper(outbox, WorkerSettings("w2", 10.0), two_metrics, clock=lambda: now[0])
        for line in ("snack", "tea"):
            assert await one.take(line) is not None
        await two.renew()  # reads the lines: both w1's, unexpired
        await one.release("snack")
        assert await two.take("snack") is not None
        assert (reads, two_metrics.takeovers) == ([], 0)

        # w1 dies holding "tea": its lease runs out, on the outbox and for w2's clock.
        expire_leases(tmp_path / "source.db")
        now[0] += 10.0
        assert await two.take("tea") is not None
        assert (reads, two_metrics.takeovers) == (["tea"], 1)
