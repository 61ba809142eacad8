"""End to end, as a user runs it: orders POSTed to `publisher serve` until the sink has them.

A sink and `publisher serve` run as their own processes (on SQLite, or both on
PostgreSQL for the `pg_e2e_*` cases); 8 clients of this process, each with its own
aiohttp session, POST the orders, and the clock stops once `/status` shows nothing
pending; then the sink's and the publisher's databases are read with connections of
our own: every order applied at the sink and marked sent. Next to it, in the same
run, the references it is measured against: a trivial aiohttp handler (bench.ackserver)
with 1 client (the sequential ceiling) and with 8 (the concurrent ceiling), and the
intake alone (the same POSTs while the sink is stopped: nothing delivered, nothing marked).

Latency is the time from an order's 201, as the client saw it, to the sink's
`received_at` of it (both the host's clock), under an open-loop load paced at half
the end-to-end rate this run measured; once with a healthy sink, once with the
sink stopped (SIGSTOP) for a second a quarter into the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import aiohttp

from bench.backlog import count_rows, create_source
from bench.cases import (
    HTTP_TIMEOUT_S,
    SINK_APPLIED,
    SOURCE_SENT,
    Context,
    Figures,
    NotAvailable,
    percentile,
    wait_drained,
)
from bench.events import Kind, body, order
from bench.procs import BenchError, Child, tree_cpu_s
from bench.profile import sampled, statements
from chaos.dbs import Backend, DbLocation, rows

if TYPE_CHECKING:
    from plumbing.pgserver import ThrowawayServer

CLIENTS: Final = 8
BULK_BATCH: Final = 250  # orders per POST /orders/batch (the route takes up to 500)
DRAIN_POLL_S: Final = 0.01
STALL_S: Final = 1.0  # how long the stalled latency run stops the sink
LOAD_SHARE: Final = 0.5  # the latency runs offer this share of the measured maximum
PACE_TICK_S: Final = 0.001
JSON_HEADERS: Final = {"Content-Type": "application/json"}
NOT_BUILT: Final = frozenset({404, 405})
OK: Final = frozenset({200})
ACCEPTED: Final = frozenset({201})
BULK_ANSWERED: Final = frozenset({200, 201, 207})  # whichever the batch route answers
RECEIVED: Final = "SELECT id, received_at FROM inbox_events"
QUEUED: Final = "SELECT id, queued_at FROM outbox_entries"
ENTRIES: Final = "SELECT count(*) FROM outbox_entries"


def drain_timeout_s(orders: int) -> float:
    """A generous bound: 100 orders/s plus start-up."""
    return 30.0 + orders * 0.01


def orders_of(label: str, count: int) -> list[bytes]:
    return bodies_of(Kind.ORDER, label, count)


def bodies_of(kind: Kind, label: str, count: int) -> list[bytes]:
    """One request body per item: orders for POST /orders, events for POST /events."""
    return [json.dumps(body(kind, n, label)).encode() for n in range(count)]


def batches_of(kind: Kind, label: str, count: int, size: int = BULK_BATCH) -> list[bytes]:
    """The same items in batch bodies of `size`: `{"orders": [...]}` for POST
    /orders/batch, `{"events": [...]}` for POST /events/batch."""
    items = [body(kind, n, label) for n in range(count)]
    field = "orders" if kind is Kind.ORDER else "events"
    return [json.dumps({field: items[at : at + size]}).encode() for at in range(0, count, size)]


@contextlib.asynccontextmanager
async def sessions(count: int = CLIENTS) -> AsyncIterator[list[aiohttp.ClientSession]]:
    """`count` clients, each its own aiohttp session (its own connections)."""
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(aiohttp.ClientSession(timeout=timeout))
            for _ in range(count)
        ]


async def post_one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, bytes]:
    async with session.post(url, data=body, headers=JSON_HEADERS) as response:
        return response.status, await response.read()


def _expected(url: str, status: int, text: bytes, expect: frozenset[int]) -> None:
    if status not in expect:
        raise BenchError(f"POST {url} answered {status}: {text[:200]!r}")


async def post_all(
    clients: Sequence[aiohttp.ClientSession],
    url: str,
    bodies: Sequence[bytes],
    expect: frozenset[int],
) -> list[float]:
    """POST every body once, the clients each taking the next one as soon as its last
    one is answered (closed loop); the time.time() of each answer, by body."""
    answered = [0.0] * len(bodies)
    turns = iter(range(len(bodies)))

    async def client(session: aiohttp.ClientSession) -> None:
        for n in turns:
            status, text = await post_one(session, url, bodies[n])
            answered[n] = time.time()
            _expected(url, status, text, expect)

    await asyncio.gather(*(client(session) for session in clients))
    return answered


async def post_paced(
    clients: Sequence[aiohttp.ClientSession],
    url: str,
    bodies: Sequence[bytes],
    rate: float,
    expect: frozenset[int],
) -> tuple[list[float], float]:
    """POST body n at n / rate seconds from the start whatever the answers so far
    (open loop), taking the clients in turn; the time.time() of each answer, and the
    latest any request started behind its schedule (ms)."""
    answered = [0.0] * len(bodies)
    behind = 0.0

    async def one(n: int) -> None:
        status, text = await post_one(clients[n % len(clients)], url, bodies[n])
        answered[n] = time.time()
        _expected(url, status, text, expect)

    tasks: list[asyncio.Task[None]] = []
    started = time.perf_counter()
    try:
        for _ in range(2 * len(bodies) + 10):  # each turn starts at least one, or waits for it
            now = time.perf_counter()
            due = min(len(bodies), math.floor((now - started) * rate) + 1)
            for n in range(len(tasks), due):
                behind = max(behind, now - (started + n / rate))
                tasks.append(asyncio.create_task(one(n)))
            if len(tasks) == len(bodies):
                break
            await asyncio.sleep(max(PACE_TICK_S, started + len(tasks) / rate - now))
        else:
            raise BenchError(f"the paced load started {len(tasks)} of {len(bodies)} requests")
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    return answered, behind * 1000


# ---------------------------------------------------------------- the processes


@dataclass
class Pipeline:
    """A sink and `publisher serve` in front of it, and their databases."""

    sink: Child
    publisher: Child
    source: DbLocation
    sink_db: DbLocation
    server: ThrowawayServer | None = None  # the PostgreSQL server the run started, if any
    server_pid: int | None = None  # its postmaster

    @property
    def batch_url(self) -> str:
        return self.url_for(Kind.ORDER, bulk=True)

    def url_for(self, kind: Kind, *, bulk: bool = False) -> str:
        """Where items of `kind` are POSTed: /orders or /events, or their /batch."""
        route = "/orders" if kind is Kind.ORDER else "/events"
        return self.publisher.base_url + route + ("/batch" if bulk else "")

    def cpu_s(self) -> dict[str, float]:
        used = {"publisher": self.publisher.cpu_s(), "sink": self.sink.cpu_s()}
        if self.server_pid is not None:  # its backends serve both services
            used["postgres"] = tree_cpu_s(self.server_pid)
        return {**used, "client": time.process_time()}  # this process: the 8 clients


@contextlib.asynccontextmanager
async def pipeline(
    ctx: Context, name: str, backend: Backend, sink_args: Sequence[str] = ()
) -> AsyncIterator[Pipeline]:
    """A sink (`python -m sink --db ... *sink_args`) and `publisher serve` in front of
    it, on fresh databases; both stopped when the block ends."""
    source, sink_db = await ctx.databases(f"e2e-{name}", backend)
    await create_source(source)
    started: list[Child] = []
    try:
        sink = ctx.children.start(f"sink-e2e-{name}", "sink", "--db", str(sink_db), *sink_args)
        started.append(sink)
        publisher = ctx.children.start(
            f"publisher-e2e-{name}", "publisher", "serve", "--db", str(source), "--sink", sink.url
        )
        started.append(publisher)
        server = ctx.postgres.own_server() if backend == "postgres" and ctx.postgres else None
        pid = None if server is None else server.pid()
        if server is not None and pid is None:
            raise BenchError(f"the PostgreSQL server in {server.root} has no postmaster.pid")
        yield Pipeline(sink, publisher, source, sink_db, server, pid)
    finally:
        if started:  # never leave a stopped sink behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(started[0].pid, signal.SIGCONT)
        for child in reversed(started):
            ctx.children.stop(child)


async def warm_up(
    pipe: Pipeline,
    clients: Sequence[aiohttp.ClientSession],
    *,
    bulk: bool = False,
    kind: Kind = Kind.ORDER,
) -> int:
    """One order (or event of `kind`) per client (each session opens its connection,
    the relay its own to the sink) and drained; the items it added. Bulk: one batch
    of one item per client to POST /orders/batch (/events/batch), NotAvailable if the
    route is not there."""
    url = pipe.url_for(kind, bulk=bulk)
    label = f"warm-{kind}"
    bodies = (
        batches_of(kind, label, len(clients), 1) if bulk else bodies_of(kind, label, len(clients))
    )
    for session, request in zip(clients, bodies, strict=True):
        status, text = await post_one(session, url, request)
        if status in NOT_BUILT:
            raise NotAvailable(f"POST {url} answered {status}: no such intake here")
        _expected(url, status, text, BULK_ANSWERED if bulk else ACCEPTED)
    await wait_drained(pipe.publisher, drain_timeout_s(len(clients)), poll_s=DRAIN_POLL_S)
    return len(clients)


def check_delivered(pipe: Pipeline, expected: int) -> dict[str, int]:
    applied, sent = count_rows(pipe.sink_db, SINK_APPLIED), count_rows(pipe.source, SOURCE_SENT)
    if applied != expected or sent != expected:
        raise BenchError(f"{applied} applied at the sink and {sent} marked sent of {expected}")
    return {"applied_at_sink": applied, "marked_sent": sent}


def latencies(pipe: Pipeline, ids: Sequence[str], answered: Sequence[float]) -> Figures:
    """From each order's 201 to the sink's received_at of it; and from the
    publisher's queued_at (its time of intake, recorded before its commit, so before
    the 201)."""
    received = {str(i): float(at) for i, at in rows(pipe.sink_db, RECEIVED)}
    accepted = {str(i): float(at) for i, at in rows(pipe.source, QUEUED)}
    after_201 = [received[i] - at for i, at in zip(ids, answered, strict=True)]
    after_intake = [(received[i] - accepted[i]) * 1000 for i in ids]
    # The relay may deliver an order before its 201 has reached the client: then the
    # warehouse knew first, and the wait after the 201 was nothing.
    waits = [max(0.0, s) * 1000 for s in after_201]
    return {
        "p50_ms": percentile(waits, 50),
        "p99_ms": percentile(waits, 99),
        "max_ms": max(waits),
        "mean_ms": sum(waits) / len(waits),
        "applied_before_201": sum(1 for s in after_201 if s < 0),
        "from_accepted_at": {
            "p50_ms": percentile(after_intake, 50),
            "p99_ms": percentile(after_intake, 99),
            "max_ms": max(after_intake),
        },
    }


def _ids(label: str, count: int) -> list[str]:
    return [order(n, label)["id"] for n in range(count)]


# ---------------------------------------------------------------- the cases


async def ceiling(ctx: Context) -> Figures:
    """The trivial handler: the same orders, 1 client sequentially, then 8 at once."""
    count = ctx.sizes.e2e_orders
    server = ctx.children.start("ackserver-e2e", "bench.ackserver")
    figures: Figures = {
        "requests": count,
        "server": "trivial aiohttp handler in a subprocess (bench.ackserver), no database",
        "client": "aiohttp, one session per client, the same order bodies as e2e_single",
    }
    try:
        for clients_count in (1, CLIENTS):
            async with sessions(clients_count) as clients:
                await post_all(clients, server.url, orders_of("warm", clients_count), OK)
                cpu = {"server": server.cpu_s(), "client": time.process_time()}
                started = time.perf_counter()
                await post_all(clients, server.url, orders_of("ceiling", count), OK)
                elapsed = time.perf_counter() - started
                cpu_after = {"server": server.cpu_s(), "client": time.process_time()}
            figures[f"round_trips_per_s_{clients_count}"] = count / elapsed
            figures[f"elapsed_s_{clients_count}"] = elapsed
            used = _cpu(cpu, cpu_after, elapsed, count)
            figures[f"cpu_share_{clients_count}"] = used["cpu_share"]
            figures[f"cpu_ms_per_round_trip_{clients_count}"] = used["cpu_ms_per_order"]
    finally:
        ctx.children.stop(server)
    return figures


async def intake(ctx: Context, backend: Backend = "sqlite") -> Figures:
    """POST /orders by 8 clients while the sink is stopped: the intake alone."""
    count = ctx.sizes.e2e_orders
    async with pipeline(ctx, "intake", backend) as pipe, sessions() as clients:
        warm = await warm_up(pipe, clients)
        os.kill(pipe.sink.pid, signal.SIGSTOP)  # the relay's next send waits: no marks
        async with profiled(ctx, "e2e_intake", backend, pipe, sink=False) as profile:
            cpu = pipe.cpu_s()
            started = time.perf_counter()
            await post_all(clients, pipe.publisher.url, orders_of("intake", count), ACCEPTED)
            elapsed = time.perf_counter() - started
            cpu_after = pipe.cpu_s()
        accepted = count_rows(pipe.source, ENTRIES)
        sent = count_rows(pipe.source, SOURCE_SENT)
    if accepted != count + warm or sent != warm:
        raise BenchError(
            f"{accepted} orders in the outbox of {count + warm}, {sent} marked sent of {warm}"
        )
    return {
        "orders_per_s": count / elapsed,
        "orders": count,
        "clients": CLIENTS,
        "elapsed_s": elapsed,
        **_cpu(cpu, cpu_after, elapsed, count),
        "backend": backend,
        "sink": "stopped (SIGSTOP) after the warm-up: nothing delivered or marked meanwhile",
        "marked_sent": sent,
        **profile,
    }


@dataclass(frozen=True)
class Round:
    """One timed span of an end-to-end case: from the first POST until the outbox
    has nothing pending, the part of it until the last answer, each process's CPU
    seconds over it, and the time.time() of each answer (by body)."""

    elapsed_s: float
    intake_s: float
    cpu_s: dict[str, float]
    answered: list[float]


async def timed_round(
    pipe: Pipeline,
    clients: Sequence[aiohttp.ClientSession],
    url: str,
    bodies: Sequence[bytes],
    expect: frozenset[int],
    items: int,
) -> Round:
    """POST `bodies` (`items` orders or events in all) by the clients, closed loop,
    and wait until they are all delivered."""
    cpu = pipe.cpu_s()
    started = time.perf_counter()
    answered = await post_all(clients, url, bodies, expect)
    intake_s = time.perf_counter() - started
    timeout = drain_timeout_s(items)
    elapsed = await wait_drained(pipe.publisher, timeout, poll_s=DRAIN_POLL_S, started=started)
    after = pipe.cpu_s()
    return Round(elapsed, intake_s, {name: after[name] - cpu[name] for name in cpu}, answered)


async def single(ctx: Context, backend: Backend = "sqlite") -> Figures:
    """The orders by 8 clients, one POST /orders each, until applied and marked."""
    count = ctx.sizes.e2e_orders
    ids = _ids("e2e", count)
    async with pipeline(ctx, "single", backend) as pipe, sessions() as clients:
        warm = await warm_up(pipe, clients)
        async with profiled(ctx, "e2e_single", backend, pipe) as profile:
            url = pipe.publisher.url
            done = await timed_round(pipe, clients, url, orders_of("e2e", count), ACCEPTED, count)
        checked = check_delivered(pipe, count + warm)
        waits = latencies(pipe, ids, done.answered)
    ctx.e2e_max[backend] = count / done.elapsed_s
    return {
        "events_per_s": count / done.elapsed_s,
        "intake_orders_per_s": count / done.intake_s,
        "orders": count,
        "warmup_orders": warm,
        "clients": CLIENTS,
        "elapsed_s": done.elapsed_s,
        "intake_s": done.intake_s,
        **checked,
        **cpu_figures(done.cpu_s, done.elapsed_s, count),
        "latency_at_full_load": waits,
        "backend": backend,
        **profile,
    }


async def bulk(ctx: Context, backend: Backend = "sqlite") -> Figures:
    """The same orders in batches of 250 to POST /orders/batch, 8 clients."""
    count = ctx.sizes.e2e_orders
    bodies = batches_of(Kind.ORDER, "bulk", count)
    async with pipeline(ctx, "bulk", backend) as pipe, sessions() as clients:
        warm = await warm_up(pipe, clients, bulk=True)
        async with profiled(ctx, "e2e_bulk", backend, pipe) as profile:
            done = await timed_round(pipe, clients, pipe.batch_url, bodies, BULK_ANSWERED, count)
        checked = check_delivered(pipe, count + warm)
    return {
        "events_per_s": count / done.elapsed_s,
        "intake_orders_per_s": count / done.intake_s,
        "orders": count,
        "batch": BULK_BATCH,
        "requests": len(bodies),
        "warmup_orders": warm,
        "clients": CLIENTS,
        "elapsed_s": done.elapsed_s,
        "intake_s": done.intake_s,
        **checked,
        **cpu_figures(done.cpu_s, done.elapsed_s, count),
        "backend": backend,
        **profile,
    }


async def latency(ctx: Context, backend: Backend = "sqlite") -> Figures:
    """201 to applied at the sink, paced at half the end-to-end maximum: with a
    healthy sink, and with the sink stopped for a second a quarter into the run."""
    maximum = ctx.e2e_max.get(backend)
    measured_here = maximum is None
    if maximum is None:  # e2e_single did not run before this case: measure it now
        maximum = (await single(ctx, backend))["events_per_s"]
    rate = maximum * LOAD_SHARE
    count = max(1, math.ceil(rate * ctx.sizes.e2e_latency_s))
    figures: Figures = {
        "maximum_events_per_s": maximum,
        "maximum_measured_by_this_case": measured_here,
        "offered_per_s": rate,
        "orders": count,
        "seconds": count / rate,
        "stall_s": STALL_S,
        "backend": backend,
        "measured": "the client's time.time() at each 201 -> the sink's received_at of "
        "the order (set in its applying transaction); 0 when the sink had it first",
    }
    async with pipeline(ctx, "latency", backend) as pipe, sessions() as clients:
        expected = await warm_up(pipe, clients)
        for label in ("idle", "stalled"):  # the second run once the first is drained
            ids = _ids(label, count)
            stall = asyncio.create_task(
                _stop_for(pipe.sink, count / rate / 4, STALL_S if label == "stalled" else 0.0)
            )
            try:
                answered, behind_ms = await post_paced(
                    clients, pipe.publisher.url, orders_of(label, count), rate, ACCEPTED
                )
                await stall
            finally:
                stall.cancel()
            await wait_drained(pipe.publisher, drain_timeout_s(count), poll_s=DRAIN_POLL_S)
            expected += count
            check_delivered(pipe, expected)
            figures[label] = {**latencies(pipe, ids, answered), "behind_schedule_ms": behind_ms}
    return figures


async def _stop_for(sink: Child, after_s: float, stall_s: float) -> None:
    if stall_s <= 0:
        return
    await asyncio.sleep(after_s)
    os.kill(sink.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(stall_s)
    finally:
        os.kill(sink.pid, signal.SIGCONT)


@contextlib.asynccontextmanager
async def profiled(
    ctx: Context, case: str, backend: Backend, pipe: Pipeline, *, sink: bool = True
) -> AsyncIterator[Figures]:
    """With --profile, py-spy on the publisher, the sink (unless it is stopped) and the
    clients for the body's span; the dict yielded holds {"profile": their summaries}
    once it is over."""
    if ctx.profile_dir is None:
        yield {}
        return
    name = f"pg_{case}" if backend == "postgres" else case
    pids = {"publisher": pipe.publisher.pid, "client": os.getpid()}
    if sink:
        pids["sink"] = pipe.sink.pid
    server = pipe.server
    figures: Figures = {}
    async with contextlib.AsyncExitStack() as stack:
        if server is not None:
            queries = await stack.enter_async_context(statements(server.url()))
        summary = await stack.enter_async_context(sampled(ctx.profile_dir, name, pids))
        yield figures
    figures["profile"] = summary
    if server is not None:
        summary["postgres"] = queries


def _cpu(before: dict[str, float], after: dict[str, float], elapsed: float, count: int) -> Figures:
    return cpu_figures({name: after[name] - before[name] for name in before}, elapsed, count)


def cpu_figures(used: dict[str, float], elapsed: float, count: int) -> Figures:
    """Each process's CPU seconds over the timed span (`used`) / that span (1.0: one
    core busy); the CPU time all of them spent per order (or round trip), and the most
    orders/s that cost allows with every CPU of this machine busy and nothing else
    running: no arrangement of these processes gets further without costing less."""
    unread = [name for name, seconds in used.items() if math.isnan(seconds)]
    if unread:  # a process gone before its figures were taken: the case says nothing
        raise BenchError(f"the CPU time of the {unread[0]} could not be read (/proc)")
    per_order_s = sum(used.values()) / count
    cpus = len(os.sched_getaffinity(0))
    return {
        "cpu_share": {name: seconds / elapsed for name, seconds in used.items()},
        "cpu_ms_per_order": per_order_s * 1000,
        "cpus": cpus,
        "cpu_bound_per_s": cpus / per_order_s if per_order_s > 0 else math.inf,
    }


async def pg_intake(ctx: Context) -> Figures:
    return await intake(ctx, "postgres")


async def pg_single(ctx: Context) -> Figures:
    return await single(ctx, "postgres")


async def pg_bulk(ctx: Context) -> Figures:
    return await bulk(ctx, "postgres")


async def pg_latency(ctx: Context) -> Figures:
    return await latency(ctx, "postgres")
