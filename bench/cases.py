"""The benchmark cases. Each returns its figures as a dict of plain JSON values.

Services under test run as their own processes (`python -m sink`, `python -m
publisher serve`); the relay of cases 3 to 5 and 7 runs in this process: the
product's `Relay` and `HttpSender` with the service's default settings, logging
each delivery as the service does (the runner sends the log lines to a file).

With `--backend postgres` the relay cases run a second time with both services on
PostgreSQL (the `pg_*` cases, two fresh databases each), next to PostgreSQL's own
durable commit ceiling through the same driver.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import math
import sqlite3
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
from prometheus_client import generate_latest

from bench import naive
from bench.backlog import count_rows, create_naive_source, create_source, insert_entries
from bench.events import SKUS, Kind, event, order
from bench.procs import BenchError, Child, Children, tree_cpu_s
from chaos.dbs import Backend, DbLocation, Place
from plumbing.collector import service_collector
from plumbing.schema import history
from publisher import HttpSender, Outbox
from publisher.driver import Result, Verified
from publisher.metrics import PublisherMetrics
from publisher.relay import Relay
from publisher.settings import DEFAULT_DEPTH, RelaySettings
from shared import Event, Lease
from sqlite_tx import PRAGMAS, Database, transaction

Figures = dict[str, Any]
Ack = dict[str, object]


WARMUP_REQUESTS: Final = 50
CEILING_MAX_S: Final = 20.0
COMMITS_MAX_S: Final = 20.0
POLL_S: Final = 0.02
SNAPSHOT_EVERY: Final = 50  # ticks between safety-net snapshots while deliveries run
STOP_TIMEOUT_S: Final = 15.0
STATUS_POLL_S: Final = 0.1
HTTP_TIMEOUT_S: Final = 10.0
LANES: Final = 8
LANES_ORDER: Final = (("global", "lanes"), ("lanes", "global"))  # the runs of relay_lanes
BATCH: Final = 16
SLOW_SINK_STALL_S: Final = 0.005
STALLED_SINK_S: Final = 2.0
STALL_SETTLE_S: Final = 0.5
PENDING_TAIL: Final = 100
MANY_SKUS: Final = 2_000
SINK_APPLIED: Final = "SELECT count(*) FROM inbox_events"
SOURCE_SENT: Final = "SELECT count(*) FROM outbox_entries WHERE sent = 1"
COMMIT_TABLE: Final = "CREATE TABLE t (n INTEGER PRIMARY KEY, v TEXT NOT NULL)"


@dataclass(frozen=True)
class Sizes:
    """How much work each case does; `--quick` uses smaller ones, `--tiny` the least."""

    ceiling_requests: int
    commits: int
    backlog: int  # naive peer, one event per request, batches
    lanes_backlog: int  # per run
    lanes_runs_per_mode: int  # in the order global, lanes, lanes, global (1: global, lanes)
    intake_requests: int
    scale_sent_rows: tuple[int, int]
    scale_repeats: int
    scale_backlogs: tuple[int, int, int]
    scale_drain_repeats: int  # drains of each backlog but the largest (their median counts)
    memory_backlogs: tuple[int, int]
    workers_backlog: int  # pg_workers, per run (six runs)
    e2e_orders: int  # orders POSTed per end-to-end case (per round of the generic ones)
    e2e_latency_s: float  # how long each paced latency run offers its load
    generic_backlog: int  # entries per drain of the relay's generic-event cases
    generic_rounds: int  # rounds of each kind in the generic-event cases (bench.generic)
    # The handler cases (bench.own_handler): entries per drain of the relay's, one event
    # per request and in batches; orders per round end to end; rounds of each registry.
    handler_single_backlog: int
    handler_batch_backlog: int
    handler_orders: int
    handler_rounds: int
    # The mark_costs case (bench.marks): entries marked per size of event, and rounds.
    mark_entries: int
    mark_rounds: int


QUICK: Final = Sizes(
    ceiling_requests=1_000,
    commits=1_000,
    backlog=1_000,
    lanes_backlog=200,
    lanes_runs_per_mode=2,
    intake_requests=50,
    scale_sent_rows=(1_000, 100_000),
    scale_repeats=100,
    scale_backlogs=(500, 2_000, 5_000),
    scale_drain_repeats=3,
    memory_backlogs=(1_000, 10_000),
    workers_backlog=600,
    e2e_orders=200,
    e2e_latency_s=1.2,
    generic_backlog=1_000,
    generic_rounds=2,
    handler_single_backlog=1_000,
    handler_batch_backlog=5_000,
    handler_orders=5_000,
    handler_rounds=2,
    mark_entries=512,
    mark_rounds=2,
)
FULL: Final = Sizes(
    ceiling_requests=5_000,
    commits=5_000,
    backlog=10_000,
    lanes_backlog=5_000,
    lanes_runs_per_mode=2,
    intake_requests=200,
    scale_sent_rows=(1_000, 1_000_000),
    scale_repeats=300,
    scale_backlogs=(1_000, 10_000, 100_000),
    scale_drain_repeats=3,
    memory_backlogs=(1_000, 100_000),
    workers_backlog=6_000,
    e2e_orders=5_000,
    e2e_latency_s=4.0,
    generic_backlog=4_000,
    generic_rounds=2,
    handler_single_backlog=5_000,
    handler_batch_backlog=20_000,
    handler_orders=20_000,
    handler_rounds=3,
    mark_entries=2_048,
    mark_rounds=3,
)
# The tests' size: every case still takes each of its steps, on as little work as
# shows that it works; the rounds that only steady a figure are run once (relay_lanes:
# global, lanes; scaling: one drain per backlog; the generic-event and handler cases:
# one round of each kind or registry), pg_workers's interleaved order is kept (its test
# checks it). The figures of such a run mean nothing.
TINY: Final = Sizes(
    ceiling_requests=100,
    commits=100,
    backlog=40,
    lanes_backlog=16,
    lanes_runs_per_mode=1,
    intake_requests=10,
    scale_sent_rows=(100, 1_000),
    scale_repeats=5,
    scale_backlogs=(20, 50, 100),
    scale_drain_repeats=1,
    memory_backlogs=(100, 1_000),
    workers_backlog=64,
    e2e_orders=80,
    e2e_latency_s=0.4,
    generic_backlog=40,
    generic_rounds=1,
    handler_single_backlog=40,
    handler_batch_backlog=40,
    handler_orders=80,
    handler_rounds=1,
    mark_entries=32,
    mark_rounds=1,
)
SIZES: Final = {"full": FULL, "quick": QUICK, "tiny": TINY}


class NotAvailable(Exception):
    """The product does not offer what this case measures (yet)."""


@dataclass
class Context:
    children: Children
    workdir: Path
    sizes: Sizes
    postgres: Place | None = None  # where the pg_* cases make their databases
    profile_dir: Path | None = None  # --profile: py-spy on the end-to-end cases' processes
    # The end-to-end rate each backend reached in this run (the latency cases offer half).
    e2e_max: dict[Backend, float] = field(default_factory=dict)

    async def databases(self, name: str, backend: Backend) -> tuple[DbLocation, DbLocation]:
        """A fresh source and sink database for one drain."""
        if backend == "sqlite":
            return self.workdir / f"{name}-source.db", self.workdir / f"{name}-sink.db"
        if self.postgres is None:
            raise NotAvailable("no PostgreSQL server for this run (--backend postgres)")
        pair = await asyncio.to_thread(self.postgres.pair, name, self.workdir)
        return pair.source, pair.sink


def drain_timeout_s(backlog: int) -> float:
    """A generous bound: 50 events/s plus start-up."""
    return 30.0 + backlog * 0.02


# ---------------------------------------------------------------- 1 and 2: references


async def ceiling(ctx: Context) -> Figures:
    """Sequential round trips of HttpSender against a handler that only acknowledges.

    The figure the targets use is one event per request; the same client sending
    batches of 16 to the same server is reported alongside, for reference.
    """
    server = ctx.children.start("ackserver", "bench.ackserver")
    try:
        async with HttpSender(server.url) as sender:
            for n in range(WARMUP_REQUESTS):
                await sender.deliver(event(Kind.ORDER, n, "warm"))
            done, started = 0, time.perf_counter()
            for n in range(ctx.sizes.ceiling_requests):
                await sender.deliver(event(Kind.ORDER, n, "ceiling"))
                done += 1
                if time.perf_counter() - started > CEILING_MAX_S:
                    break
            elapsed = time.perf_counter() - started
            batches, batch_started = 0, time.perf_counter()
            for n in range(ctx.sizes.ceiling_requests // 4):
                results = await sender.deliver_batch(
                    [event(Kind.ORDER, n * BATCH + k, "ceiling-batch") for k in range(BATCH)]
                )
                if len(results) != BATCH or not all(isinstance(r, dict) for r in results):
                    raise BenchError(f"the ACK server did not acknowledge a batch: {results}")
                batches += 1
                if time.perf_counter() - batch_started > CEILING_MAX_S:
                    break
            batch_elapsed = time.perf_counter() - batch_started
    finally:
        ctx.children.stop(server)
    return {
        "round_trips_per_s": done / elapsed,
        "requests": done,
        "elapsed_s": elapsed,
        "batch_round_trips_per_s": batches / batch_elapsed,
        "batch_events_per_s": batches * BATCH / batch_elapsed,
        "batch_requests": batches,
        "client": "publisher.http.HttpSender.deliver / deliver_batch (its aiohttp session "
        "and ACK checks)",
        "server": "trivial aiohttp handler in a subprocess (bench.ackserver), no database",
    }


async def commit_ceiling(ctx: Context) -> Figures:
    """Durable commits per second: sqlite_tx.Database, one INSERT per transaction."""
    db = await Database.open(ctx.workdir / "commits.db", history("bench", (COMMIT_TABLE,)))

    def insert(conn: sqlite3.Connection) -> None:
        with transaction(conn):
            conn.execute("INSERT INTO t (v) VALUES (?)", ("x" * 64,))

    try:
        for _ in range(10):
            await db.run(insert)
        done, started = 0, time.perf_counter()
        for _ in range(ctx.sizes.commits):
            await db.run(insert)
            done += 1
            if time.perf_counter() - started > COMMITS_MAX_S:
                break
        elapsed = time.perf_counter() - started
    finally:
        await db.close()
    return {
        "commits_per_s": done / elapsed,
        "commits": done,
        "elapsed_s": elapsed,
        "settings": list(PRAGMAS),
    }


async def naive_peer(ctx: Context) -> Figures:
    """The naive peer (bench.naive) draining the same backlog size."""
    backlog = ctx.sizes.backlog
    source, sink_db = ctx.workdir / "naive-source.db", ctx.workdir / "naive-sink.db"
    await asyncio.to_thread(create_naive_source, source, backlog)
    sink = ctx.children.start("naive-sink", "bench.naive", "--db", str(sink_db))
    try:
        started = time.perf_counter()
        delivered = await asyncio.to_thread(
            naive.drain, str(source), sink.url, backlog + 1, drain_timeout_s(backlog)
        )
        elapsed = time.perf_counter() - started
        applied = count_rows(sink_db, "SELECT count(*) FROM inbox")  # the naive peer's table
    finally:
        ctx.children.stop(sink)
    if delivered != backlog or applied != backlog:
        raise BenchError(f"naive peer delivered {delivered}, applied {applied} of {backlog}")
    return {
        "events_per_s": backlog / elapsed,
        "backlog": backlog,
        "elapsed_s": elapsed,
        "applied_at_sink": applied,
        "peer": "sqlite3 (default settings, COMMIT per event) + urllib.request + "
        "http.server.ThreadingHTTPServer in a subprocess",
    }


# ---------------------------------------------------------------- 3 to 5: the relay


@dataclass
class DeliveryCounter:
    """A relay observer: counts outcomes, and says when every entry was delivered."""

    expected: int
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    all_delivered: asyncio.Event = field(default_factory=asyncio.Event)

    def delivery(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        if self.outcomes["delivered"] >= self.expected:
            self.all_delivered.set()


@dataclass
class RequestClock:
    """The relay's sender, adding up the time spent in requests (sink included)."""

    sender: HttpSender
    seconds: float = 0.0
    requests: int = 0
    # It hands the events to the HttpSender unchanged: the relay may give it events
    # as read, with their stored text (publisher.driver), as it would the HttpSender.
    reads_events_only: bool = True

    async def deliver(
        self, event: Event, /, *, after: str | None = None, lease: Lease | None = None
    ) -> Verified:
        started = time.perf_counter()
        try:
            return await self.sender.deliver(event, after=after, lease=lease)
        finally:
            self.seconds += time.perf_counter() - started
            self.requests += 1

    async def deliver_batch(
        self, events: Sequence[Event], /, *, after: str | None = None, lease: Lease | None = None
    ) -> Sequence[Result]:
        started = time.perf_counter()
        try:
            return await self.sender.deliver_batch(events, after=after, lease=lease)
        finally:
            self.seconds += time.perf_counter() - started
            self.requests += 1

    def predecessor_checked(self, event_id: str | None) -> bool:
        return self.sender.predecessor_checked(event_id)


async def relay_drain(
    ctx: Context,
    name: str,
    backlog: int,
    *,
    batch: bool,
    lanes: bool = False,
    stall_s: float | None = None,
    pipeline: int = DEFAULT_DEPTH,
    skus: int = len(SKUS),
    backend: Backend = "sqlite",
    kind: Kind = Kind.ORDER,
    sink_args: Sequence[str] = (),
    check_sink: Callable[[DbLocation], None] | None = None,
) -> Figures:
    """Drain `backlog` pending entries (events of `kind`) with the in-process relay into
    a fresh sink process (`python -m sink --db ... *sink_args`).

    As `publisher serve` runs it: up to `pipeline` requests in flight per line once
    the sink's replies say it enforces Outbox-After (1: one at a time).

    Timed from relay.run() until a snapshot shows nothing pending; then both files
    are read with connections of our own: every entry applied at the sink, and sent;
    and `check_sink`, if given, is called with the sink's database (it raises
    BenchError if the sink's effects are not what they should be).
    """
    source, sink_db = await ctx.databases(name, backend)
    await create_source(source)
    fill = functools.partial(insert_entries, source, backlog, skus=skus, kind=kind)
    await asyncio.to_thread(fill)
    chaos = ("--chaos", f"stall={stall_s}") if stall_s else ()
    args = ("--db", str(sink_db), *chaos, *sink_args)
    sink = ctx.children.start(f"sink-{name}", "sink", *args)
    server = ctx.postgres.own_server() if backend == "postgres" and ctx.postgres else None
    server_pid = None if server is None else server.pid()
    try:
        async with Outbox.open(source) as outbox, HttpSender(sink.url) as sender:
            counter, clock = DeliveryCounter(backlog), RequestClock(sender)
            settings = RelaySettings(
                batch=batch,
                ordering="key" if lanes else "global",
                max_lanes=LANES,
                pipeline=pipeline,
            )
            relay = Relay(outbox, clock, settings, observer=counter)
            await sender.lookup("warm-up")  # opens the keep-alive connection before timing
            cpu = _cpu_now(sink, server_pid)
            with service_collector():  # the collector as `publisher serve` sets it
                elapsed = await _drain(outbox, relay, counter, drain_timeout_s(backlog))
            cpu_after = _cpu_now(sink, server_pid)
        applied, sent = count_rows(sink_db, SINK_APPLIED), count_rows(source, SOURCE_SENT)
    finally:
        ctx.children.stop(sink)
    if applied != backlog or sent != backlog:
        raise BenchError(f"{name}: {applied} applied and {sent} marked sent of {backlog}")
    if check_sink is not None:
        check_sink(sink_db)
    return {
        "events_per_s": backlog / elapsed,
        "backlog": backlog,
        "elapsed_s": elapsed,
        "applied_at_sink": applied,
        "marked_sent": sent,
        "outcomes": dict(counter.outcomes),
        "requests": clock.requests,
        # Where the time went (meaningful only when requests do not overlap: global
        # order, one in flight):
        # in requests (transport and everything the sink does), and the rest (the
        # publisher's reads, marks and loop).
        "ms_per_event": elapsed * 1000 / backlog,
        "ms_per_event_in_requests": clock.seconds * 1000 / backlog,
        "ms_per_event_elsewhere": (elapsed - clock.seconds) * 1000 / backlog,
        "backend": backend,
        "kind": kind.value,
        # Each process's CPU seconds over the drain: the relay's is this process's (its
        # HTTP client and the bench's polling with it), a PostgreSQL server's is all its
        # backends' (both services').
        "cpu_s": {process: cpu_after[process] - cpu[process] for process in cpu},
    }


def _cpu_now(sink: Child, server_pid: int | None) -> dict[str, float]:
    """CPU seconds used so far by this process, the sink and the run's own PostgreSQL
    server, if any."""
    used = {"relay": time.process_time(), "sink": sink.cpu_s()}
    if server_pid is not None:
        used["postgres"] = tree_cpu_s(server_pid)
    return used


async def _drain(outbox: Outbox, relay: Relay, counter: DeliveryCounter, timeout_s: float) -> float:
    task = asyncio.create_task(relay.run(), name="bench relay")
    started = time.perf_counter()
    deadline = started + timeout_s
    try:
        for tick in range(math.ceil(timeout_s / POLL_S)):
            if task.done():
                task.result()
                raise BenchError("the relay stopped before the backlog was drained")
            delivered = counter.all_delivered.is_set()
            if not delivered:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(counter.all_delivered.wait(), POLL_S)
                delivered = counter.all_delivered.is_set()
            # Once every ACK is in, only the last mark is outstanding: look at once.
            if delivered or tick % SNAPSHOT_EVERY == SNAPSHOT_EVERY - 1:
                if (await outbox.snapshot()).pending == 0:
                    return time.perf_counter() - started
                if delivered:
                    await asyncio.sleep(0.001)
            if time.perf_counter() > deadline:
                break
        raise BenchError(
            f"backlog not drained in {timeout_s:.0f}s: {dict(counter.outcomes)} so far"
        )
    finally:
        relay.stop()
        await asyncio.wait_for(task, STOP_TIMEOUT_S)


async def relay_single(ctx: Context) -> Figures:
    figures = await relay_drain(ctx, "single", ctx.sizes.backlog, batch=False)
    return {
        **figures,
        "delivery": "one event per request (RelaySettings batch=False)",
        "pipeline": DEFAULT_DEPTH,
    }


async def relay_batch(ctx: Context) -> Figures:
    figures = await relay_drain(ctx, "batch", ctx.sizes.backlog, batch=True)
    return {
        **figures,
        "delivery": "batches of up to 16 (RelaySettings batch=True)",
        "pipeline": DEFAULT_DEPTH,
    }


async def relay_single_serial(ctx: Context) -> Figures:
    return await _serial(ctx, batch=False, delivery="one event per request")


async def relay_batch_serial(ctx: Context) -> Figures:
    return await _serial(ctx, batch=True, delivery="batches of up to 16")


async def _serial(ctx: Context, *, batch: bool, delivery: str) -> Figures:
    name = "batch-serial" if batch else "single-serial"
    figures = await relay_drain(ctx, name, ctx.sizes.backlog, batch=batch, pipeline=1)
    return {
        **figures,
        "delivery": f"{delivery}, one in flight (RelaySettings pipeline=1)",
        "pipeline": 1,
    }


async def relay_lanes(ctx: Context) -> Figures:
    """Global order vs per-SKU lanes against a sink that stalls 5 ms per request.

    For each delivery style, and first with one request in flight per line, then
    with the default pipelining, the two modes run in the order global, lanes,
    lanes, global (each on `lanes_backlog` entries; `--tiny`: global, lanes), and
    each mode's rate is its total entries over its total time: a machine that speeds
    up or slows down during the case weighs on both modes alike.
    """
    backlog, runs = ctx.sizes.lanes_backlog, ctx.sizes.lanes_runs_per_mode
    order = [mode for n in range(runs) for mode in LANES_ORDER[n % 2]]
    figures: Figures = {
        "backlog_per_run": backlog,
        "runs_per_mode": runs,
        "order": ", ".join(order),
        "skus": len(SKUS),
        "max_lanes": LANES,
        "sink_stall_s": SLOW_SINK_STALL_S,
        "pipeline": DEFAULT_DEPTH,
    }
    for delivery, batch in (("single", False), ("batch", True)):
        for depth, suffix in ((1, ""), (DEFAULT_DEPTH, "_pipelined")):
            elapsed = {"global": 0.0, "lanes": 0.0}
            for run, mode in enumerate(order):
                figures_of_run = await relay_drain(
                    ctx,
                    f"lanes-{delivery}-{mode}{suffix}-{run}",
                    backlog,
                    batch=batch,
                    lanes=mode == "lanes",
                    stall_s=SLOW_SINK_STALL_S,
                    pipeline=depth,
                )
                elapsed[mode] += figures_of_run["elapsed_s"]
            for mode, seconds in elapsed.items():
                figures[f"{delivery}_{mode}{suffix}_events_per_s"] = runs * backlog / seconds
                figures[f"{delivery}_{mode}{suffix}_elapsed_s"] = seconds
    return figures


# ---------------------------------------------------------------- 6: intake latency


async def intake_latency(ctx: Context) -> Figures:
    """POST /orders to `publisher serve` (a subprocess), sequentially: with a healthy sink
    (the relay has nothing queued and delivers each order as it arrives), and with a
    sink that stalls every request for 2 s (the relay is stuck in a send)."""
    figures: Figures = {
        "requests": ctx.sizes.intake_requests,
        "publisher": "python -m publisher serve (subprocess), client aiohttp in this process",
        "idle_means": "healthy sink: the relay keeps up and delivers each order as it arrives",
        "stalled_sink_s": STALLED_SINK_S,
    }
    for label, chaos in (("idle", ()), ("stalled", ("--chaos", f"stall={STALLED_SINK_S}"))):
        source = ctx.workdir / f"intake-{label}.db"
        sink_db = ctx.workdir / f"intake-{label}-sink.db"
        started: list[Child] = []
        try:
            sink = ctx.children.start(f"sink-intake-{label}", "sink", "--db", str(sink_db), *chaos)
            started.append(sink)
            publisher = ctx.children.start(
                f"publisher-intake-{label}",
                "publisher",
                "serve",
                "--db",
                str(source),
                "--sink",
                sink.url,
            )
            started.append(publisher)
            latencies, pending = await _post_orders(publisher, label, ctx.sizes.intake_requests)
        finally:
            for child in reversed(started):
                ctx.children.stop(child)
        figures[label] = {
            "p50_ms": percentile(latencies, 50),
            "p99_ms": percentile(latencies, 99),
            "max_ms": max(latencies),
            "pending_at_end": pending,
        }
    return figures


async def _post_orders(publisher: Child, label: str, count: int) -> tuple[list[float], int]:
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def post(n: int, prefix: str) -> float:
            started = time.perf_counter()
            async with session.post(publisher.url, json=order(n, prefix)) as response:
                await response.read()
                if response.status != 201:
                    raise BenchError(f"POST /orders answered {response.status}")
            return (time.perf_counter() - started) * 1000

        for n in range(5):
            await post(n, f"warm-{label}")
        if label == "stalled":
            await asyncio.sleep(STALL_SETTLE_S)  # the relay's send is now held by the sink
        latencies = [await post(n, label) for n in range(count)]
        async with session.get(publisher.base_url + "/status") as response:
            status = await response.json()
    return latencies, int(status["pending"])


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


# ---------------------------------------------------------------- 7: scaling


async def scaling(ctx: Context) -> Figures:
    """pending(16) and a scrape on a small and a big outbox, interleaved; relay throughput
    from three backlog sizes."""
    small, big = ctx.sizes.scale_sent_rows
    paths = {rows: ctx.workdir / f"scale-{rows}.db" for rows in (small, big)}
    for rows, path in paths.items():
        await create_source(path)
        await asyncio.to_thread(insert_entries, path, rows, sent=True)
        await asyncio.to_thread(insert_entries, path, PENDING_TAIL, start=rows)
    timings: dict[int, dict[str, list[float]]] = {r: {"pending": [], "scrape": []} for r in paths}
    async with Outbox.open(paths[small]) as small_box, Outbox.open(paths[big]) as big_box:
        boxes = {small: (small_box, PublisherMetrics()), big: (big_box, PublisherMetrics())}
        for repeat in range(ctx.sizes.scale_repeats + 10):
            order = (small, big) if repeat % 2 == 0 else (big, small)
            for rows in order:
                outbox, metrics = boxes[rows]
                started = time.perf_counter()
                batch = await outbox.pending(16)
                read = time.perf_counter()
                metrics.observe(await outbox.snapshot())
                generate_latest(metrics.registry)
                scraped = time.perf_counter()
                if len(batch) != 16:
                    raise BenchError(f"pending(16) returned {len(batch)} entries")
                if repeat >= 10:  # the first rounds warm the caches
                    timings[rows]["pending"].append((read - started) * 1000)
                    timings[rows]["scrape"].append((scraped - read) * 1000)
    figures: Figures = {
        "sent_rows": [small, big],
        "pending_rows": PENDING_TAIL,
        "repeats": ctx.sizes.scale_repeats,
        "scrape": "Outbox.snapshot + PublisherMetrics.observe + generate_latest, in process",
    }
    for rows in (small, big):
        figures[f"pending16_ms_at_{rows}"] = statistics.median(timings[rows]["pending"])
        figures[f"scrape_ms_at_{rows}"] = statistics.median(timings[rows]["scrape"])
    figures["pending16_ms"] = [figures[f"pending16_ms_at_{r}"] for r in (small, big)]
    figures["scrape_ms"] = [figures[f"scrape_ms_at_{r}"] for r in (small, big)]
    throughput, runs = [], []
    for backlog in ctx.sizes.scale_backlogs:
        # Short drains are the noisiest: all but the largest backlog run three times
        # (--tiny: once) and count with their median.
        repeats = 1 if backlog == max(ctx.sizes.scale_backlogs) else ctx.sizes.scale_drain_repeats
        rates = []
        for repeat in range(repeats):
            name = f"scale-backlog-{backlog}-{repeat}"
            rates.append((await relay_drain(ctx, name, backlog, batch=True))["events_per_s"])
        throughput.append(statistics.median(rates))
        runs.append(rates)
    figures["backlogs"] = list(ctx.sizes.scale_backlogs)
    figures["events_per_s"] = throughput
    figures["events_per_s_runs"] = runs
    figures["delivery"] = "batches of up to 16 (the service default)"
    # Lanes with many SKUs (no target): the same backlog over few and many SKUs, so
    # a cost per lane (finding lanes to start, starting them) shows as a ratio.
    backlog = ctx.sizes.lanes_backlog * 4
    for skus in (len(SKUS), MANY_SKUS):
        name = f"scale-lanes-{skus}-skus"
        drained = await relay_drain(ctx, name, backlog, batch=True, lanes=True, skus=skus)
        figures[f"lanes_events_per_s_{skus}_skus"] = drained["events_per_s"]
    figures["lanes_backlog"] = backlog
    figures["lanes_skus"] = [len(SKUS), MANY_SKUS]
    return figures


# ---------------------------------------------------------------- 8: memory


async def memory(ctx: Context) -> Figures:
    """Peak RSS (VmHWM) of `publisher serve` draining a small and a big backlog."""
    figures: Figures = {
        "backlogs": list(ctx.sizes.memory_backlogs),
        "publisher": "python -m publisher serve (subprocess, default settings); "
        "VmHWM read once /status shows nothing pending",
    }
    peaks = []
    for backlog in ctx.sizes.memory_backlogs:
        source, sink_db = ctx.workdir / f"mem-{backlog}.db", ctx.workdir / f"mem-{backlog}-sink.db"
        await create_source(source)
        await asyncio.to_thread(insert_entries, source, backlog)
        started: list[Child] = []
        try:
            sink = ctx.children.start(f"sink-mem-{backlog}", "sink", "--db", str(sink_db))
            started.append(sink)
            publisher = ctx.children.start(
                f"publisher-mem-{backlog}",
                "publisher",
                "serve",
                "--db",
                str(source),
                "--sink",
                sink.url,
            )
            started.append(publisher)
            elapsed = await wait_drained(publisher, drain_timeout_s(backlog))
            peak = publisher.peak_rss_kib()
        finally:
            for child in reversed(started):
                ctx.children.stop(child)
        if peak is None:
            raise BenchError("cannot read VmHWM of the publisher (no /proc?)")
        peaks.append(peak / 1024)
        figures[f"drain_s_at_{backlog}"] = elapsed
    figures["peak_rss_mib"] = peaks
    return figures


async def wait_drained(
    publisher: Child,
    timeout_s: float,
    *,
    poll_s: float = STATUS_POLL_S,
    started: float | None = None,
) -> float:
    """Seconds from `started` (perf_counter; default now) until the publisher's
    /status shows nothing pending, polled every `poll_s`."""
    started = time.perf_counter() if started is None else started
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(math.ceil(timeout_s / poll_s)):
            async with session.get(publisher.base_url + "/status") as response:
                status = await response.json()
            if status["pending"] == 0:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout_s:
                break
            await asyncio.sleep(poll_s)
    raise BenchError(f"publisher did not drain its backlog in {timeout_s:.0f}s")


# ---------------------------------------------------------------- 9: PostgreSQL

PG_COMMIT_TABLE: Final = (
    "CREATE TABLE t (n BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v TEXT NOT NULL)"
)
PG_SETTINGS: Final = ("server_version", "fsync", "synchronous_commit", "wal_sync_method")


async def pg_commit_ceiling(ctx: Context) -> Figures:
    """Durable commits per second on PostgreSQL through psycopg's async connection, as
    the services use it: one single-row INSERT per transaction, then COMMIT, one after
    another, with synchronous_commit on (the commit returns once its WAL is flushed)."""
    import psycopg

    from pg_tx import parse

    url, _ = await ctx.databases("commits", "postgres")
    conn = await psycopg.AsyncConnection.connect(parse(str(url)).conninfo)
    try:
        await conn.execute(PG_COMMIT_TABLE)
        await conn.execute("SET synchronous_commit = on")
        await conn.commit()
        settings = {}
        for name in PG_SETTINGS:
            row = await (await conn.execute(f"SHOW {name}".encode())).fetchone()
            settings[name] = row[0] if row else None
        await conn.commit()

        async def insert() -> None:
            await conn.execute("INSERT INTO t (v) VALUES (%s)", ("x" * 64,))
            await conn.commit()

        for _ in range(10):
            await insert()
        done, started = 0, time.perf_counter()
        for _ in range(ctx.sizes.commits):
            await insert()
            done += 1
            if time.perf_counter() - started > COMMITS_MAX_S:
                break
        elapsed = time.perf_counter() - started
    finally:
        await conn.close()
    return {
        "commits_per_s": done / elapsed,
        "commits": done,
        "elapsed_s": elapsed,
        "settings": settings,
        "client": "psycopg.AsyncConnection, INSERT then COMMIT, sequential",
    }


async def _pg_drain(ctx: Context, name: str, *, batch: bool, pipeline: int) -> Figures:
    figures = await relay_drain(
        ctx, name, ctx.sizes.backlog, batch=batch, pipeline=pipeline, backend="postgres"
    )
    style = "batches of up to 16" if batch else "one event per request"
    flight = f"up to {pipeline} in flight" if pipeline > 1 else "one in flight"
    return {**figures, "delivery": f"{style}, {flight}, both services on PostgreSQL",
            "pipeline": pipeline}  # fmt: skip


async def pg_relay_single(ctx: Context) -> Figures:
    return await _pg_drain(ctx, "pg-single", batch=False, pipeline=DEFAULT_DEPTH)


async def pg_relay_batch(ctx: Context) -> Figures:
    return await _pg_drain(ctx, "pg-batch", batch=True, pipeline=DEFAULT_DEPTH)


async def pg_relay_single_serial(ctx: Context) -> Figures:
    return await _pg_drain(ctx, "pg-single-serial", batch=False, pipeline=1)


async def pg_relay_batch_serial(ctx: Context) -> Figures:
    return await _pg_drain(ctx, "pg-batch-serial", batch=True, pipeline=1)
