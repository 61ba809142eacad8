"""The `pg_workers` case: K relay workers (`publisher serve` processes) on one
PostgreSQL outbox, in SKU order over 64 SKUs, against one sink on PostgreSQL that
stalls 5 ms per request (`python -m sink --chaos stall=0.005`).

Throughput: for K = 1, 2, 4 (in the order 1, 2, 4, 4, 2, 1, so a machine that speeds
up or slows down weighs on every K alike), the workers start on an empty outbox, a
backlog is then committed in one transaction, and the drain is timed from that
commit until every entry is marked sent. Each K's rate is its entries over its time.
One event per request (`--delivery single`): the sink's 5 ms is paid per entry, and
what more workers can add is requests in flight (each worker runs up to 8 lanes).
Duplicates: deliveries the sink's inbox counts beyond the first, over all runs (no
fault is injected: the target is 0). CPU: seconds per 1,000 entries of the workers
(together) and of the sink, over each drain, so that a K's rate can be read against
what each entry cost it (on a machine the drain saturates, the rate is the CPU it
gets over that cost).

Failover: two workers (each with lanes for every SKU) drain a backlog too big to
finish; once the victim owns lanes
and has delivered, it is SIGKILLed; the figure is the time from the signal to the
first delivery (an ACK logged by the survivor) of an entry of a lane the victim held.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.backlog import count_rows, create_source, insert_entries
from bench.cases import SOURCE_SENT, Context, Figures
from bench.procs import BenchError, Child
from chaos.dbs import DbLocation, rows

SKUS: Final = 64
WORKER_COUNTS: Final = (1, 2, 4)
RUN_ORDER: Final = (1, 2, 4, 4, 2, 1)
LEASE_TTL_S: Final = 2.0
FAILOVER_BOUND_S: Final = LEASE_TTL_S + 2.0
SINK_STALL_S: Final = 0.005
POLL_INTERVAL_S: Final = 0.1
WATCH_S: Final = 0.02
FAILOVER_BACKLOG: Final = 20_000
FAILOVER_WAIT_S: Final = 30.0
RESENDS: Final = "SELECT coalesce(sum(deliveries - 1), 0) FROM inbox_events"
_ID_NUMBER: Final = re.compile(r"-(\d+)$")


def worker_args(source: DbLocation, sink_url: str, worker: str, *extra: str) -> list[str]:
    return [
        *("serve", "--db", str(source), "--sink", sink_url),
        *("--ordering", "key", "--delivery", "single"),
        *("--worker-id", worker, "--lease-ttl", f"{LEASE_TTL_S:g}"),
        *("--poll-interval", f"{POLL_INTERVAL_S:g}", "--log-format", "json", *extra),
    ]


def lane_of(event_id: str) -> str:
    """The key of an entry the backlog made (the nth: sku-(n % SKUS), bench.events)."""
    match = _ID_NUMBER.search(event_id)
    if match is None:
        raise BenchError(f"not an ID of the backlog: {event_id!r}")
    return f"sku-{int(match[1]) % SKUS}"


def deliveries(log: Path) -> list[tuple[float, list[str]]]:
    """(wall-clock time, entry IDs) of each delivery a worker's JSON log records."""
    return LogTail(log).new()


@dataclass
class LogTail:
    """A worker's JSON log read as it grows: each `new()` parses only the lines
    written since the last one (a drain logs thousands)."""

    path: Path
    offset: int = 0

    def new(self) -> list[tuple[float, list[str]]]:
        with self.path.open("rb") as log:
            log.seek(self.offset)
            chunk = log.read()
        complete = chunk.rfind(b"\n") + 1  # a line still being written waits
        self.offset += complete
        found = []
        for line in chunk[:complete].decode(errors="replace").splitlines():
            if '"delivery"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # cut short by a kill
            if record.get("message") == "delivery" and record.get("outcome") == "delivered":
                ids = record.get("event_ids") or [record["event_id"]]
                found.append((float(record["time"]), [str(i) for i in ids]))
        return found


async def pg_workers(ctx: Context) -> Figures:
    """The case (its backlog per run: the sizes' `workers_backlog`)."""
    backlog = ctx.sizes.workers_backlog
    elapsed: dict[int, float] = defaultdict(float)
    runs: dict[int, list[Figures]] = defaultdict(list)
    for number, workers in enumerate(RUN_ORDER):
        figures = await _drain(ctx, f"workers-{workers}-{number}", workers, backlog)
        elapsed[workers] += figures["elapsed_s"]
        runs[workers].append(figures)
    failover = await _failover(ctx)
    result: Figures = {
        "skus": SKUS,
        "backlog_per_run": backlog,
        "order": ", ".join(map(str, RUN_ORDER)),
        "lease_ttl_s": LEASE_TTL_S,
        "sink_stall_s": SINK_STALL_S,
        "delivery": "one event per request, --ordering key, up to 8 lanes per worker",
        "duplicates": sum(f["duplicates"] for fs in runs.values() for f in fs),
        "failover_s": failover["failover_s"],
        "failover_bound_s": FAILOVER_BOUND_S,
        "failover": failover,
    }
    for workers in WORKER_COUNTS:
        done = len(runs[workers])
        result[f"events_per_s_{workers}"] = done * backlog / elapsed[workers]
        for side in ("workers", "sink"):
            spent = [f["cpu_s_per_1k"][side] for f in runs[workers]]
            result[f"cpu_s_per_1k_{side}_{workers}"] = sum(spent) / done
        result[f"runs_{workers}"] = runs[workers]
    return result


async def _start_workers(
    ctx: Context, name: str, count: int, source: DbLocation, sink: Child, *extra: str
) -> list[Child]:
    """Workers w1 to w`count`, started at once (the outbox is empty until they all
    listen, so none gets ahead); the first failure once every start is over."""
    starts = [
        asyncio.to_thread(
            ctx.children.start,
            f"{name}-w{n}",
            "publisher",
            *worker_args(source, sink.url, f"w{n}", *extra),
        )
        for n in range(1, count + 1)
    ]
    started = await asyncio.gather(*starts, return_exceptions=True)
    failed = [s for s in started if isinstance(s, BaseException)]
    if failed:
        raise failed[0]
    return [s for s in started if isinstance(s, Child)]


async def _drain(ctx: Context, name: str, workers: int, backlog: int) -> Figures:
    source, sink_db = await ctx.databases(name, "postgres")
    await create_source(source)
    chaos = ("--chaos", f"stall={SINK_STALL_S}")
    sink = ctx.children.start(f"sink-{name}", "sink", "--db", str(sink_db), *chaos)
    started = await _start_workers(ctx, name, workers, source, sink)
    try:
        cpu = _cpu_s(started, sink)
        began = time.perf_counter()
        await asyncio.to_thread(functools.partial(insert_entries, source, backlog, skus=SKUS))
        elapsed = await _until_sent(source, backlog, began, 30.0 + backlog * 0.02)
        spent = {
            side: (s - cpu[side]) * 1000 / backlog for side, s in _cpu_s(started, sink).items()
        }
    finally:
        ctx.children.stop(*started)
        ctx.children.stop(sink)
    delivered = {
        w.name.rsplit("-", 1)[-1]: sum(len(i) for _, i in deliveries(w.log)) for w in started
    }
    return {
        "workers": workers,
        "elapsed_s": elapsed,
        "events_per_s": backlog / elapsed,
        "duplicates": count_rows(sink_db, RESENDS),
        "applied_at_sink": count_rows(sink_db, "SELECT count(*) FROM inbox_events"),
        "delivered_by_worker": delivered,
        "cpu_s_per_1k": spent,
    }


def _cpu_s(workers: list[Child], sink: Child) -> dict[str, float]:
    """CPU seconds used so far by the workers together and by the sink."""
    return {"workers": sum(w.cpu_s() for w in workers), "sink": sink.cpu_s()}


async def _until_sent(source: DbLocation, expected: int, began: float, timeout_s: float) -> float:
    for _ in range(math.ceil(timeout_s / WATCH_S)):
        if await asyncio.to_thread(count_rows, source, SOURCE_SENT) >= expected:
            return time.perf_counter() - began
        if time.perf_counter() - began > timeout_s:
            break
        await asyncio.sleep(WATCH_S)
    raise BenchError(f"the workers did not drain {expected} entries in {timeout_s:.0f}s")


async def _failover(ctx: Context) -> Figures:
    source, sink_db = await ctx.databases("workers-failover", "postgres")
    await create_source(source)
    chaos = ("--chaos", f"stall={SINK_STALL_S}")
    sink = ctx.children.start("sink-failover", "sink", "--db", str(sink_db), *chaos)
    # Lanes enough for every SKU: the survivor has room for the victim's lanes the
    # moment their leases expire (with 8 it would finish its own lanes first).
    lanes = ("--lanes", str(SKUS))
    victim, survivor = await _start_workers(ctx, "failover", 2, source, sink, *lanes)
    try:
        await asyncio.to_thread(
            functools.partial(insert_entries, source, FAILOVER_BACKLOG, skus=SKUS)
        )
        held = await _owned_once_delivering(source, victim)
        killed_at = time.time()
        victim.proc.kill()
        moved_at = await _first_delivery_of(survivor.log, held, killed_at)
    finally:
        ctx.children.stop(victim, survivor)
        ctx.children.stop(sink)
    return {
        "failover_s": moved_at - killed_at,
        "victim_lanes": len(held),
        "backlog": FAILOVER_BACKLOG,
        "measured": "SIGKILL of one of two workers -> the survivor's first ACK of one "
        "of the lanes the victim held",
    }


async def _owned_once_delivering(source: DbLocation, victim: Child) -> set[str]:
    """The lanes the victim holds, once it holds some and has delivered."""
    deadline = time.monotonic() + FAILOVER_WAIT_S
    while time.monotonic() < deadline:
        if deliveries(victim.log):
            found = await asyncio.to_thread(
                rows, source, "SELECT line FROM outbox_line_leases WHERE owner = 'w1'"
            )
            if found:
                return {str(line) for (line,) in found}
        await asyncio.sleep(WATCH_S)
    raise BenchError("the victim worker never held a lane and delivered")


async def _first_delivery_of(log: Path, lanes: set[str], after: float) -> float:
    deadline = time.monotonic() + FAILOVER_WAIT_S
    tail = LogTail(log)
    while time.monotonic() < deadline:
        for at, ids in tail.new():
            if at > after and any(lane_of(i) in lanes for i in ids):
                return at
        await asyncio.sleep(WATCH_S)
    raise BenchError(f"no delivery of the victim's lanes in {FAILOVER_WAIT_S:.0f}s")
