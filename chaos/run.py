"""`python -m chaos run`: feed events while killing the services, then read the verdict.

The feed is orders (POST /orders), generic events (POST /events and /events/batch)
or a mix of both, drawn from the seed (chaos.feed); the verdict reads both databases
for either kind (chaos.verdict).

With `--workers K --sinks M` (PostgreSQL) the run starts K relay workers
(`publisher serve --worker-id wN`, every sink URL given, JSON logs) and M sinks on one
inbox; each kill and each pause picks its victim among the processes of its kind,
and events are posted to a worker that is neither paused nor dead. A pause is a
SIGSTOP now and a SIGCONT later (the feed goes on meanwhile): a worker paused past
its lease comes back to lines another worker holds.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from chaos.dbs import DbLocation, Pair, reading
from chaos.feed import Feed, Item, Mix
from chaos.handlers import SPEC as EFFECTS_SPEC
from chaos.intake import Intake
from chaos.procs import ChaosError, Service, counters, free_port, http_json, resume
from chaos.verdict import LineOrder, Ordering, Verdict, line_orders, read_verdict
from plumbing.cli import CHAOS_EXIT_STATUS

Target = Literal["publisher", "sink", "both"]
Delivery = Literal["batch", "single"]
SKUS: Final = ("snack", "juice", "bread", "soap")
# Several workers share out SKU lanes: more SKUs than workers, so each has some.
MANY_SKUS: Final = tuple(f"sku-{n:02d}" for n in range(16))
DEFAULT_LEASE_TTL_S: Final = 2.0
# A pause lasts from a short stall to twice the lease: about half outlast it.
PAUSE_S: Final = (0.1, 2.0)  # times the lease TTL
# The counters read from the processes alive at the end (a killed process's are gone).
FENCE_COUNTERS: Final = (
    "publisher_fenced_writes_total",
    "publisher_fenced_requests_total",
    "publisher_lease_takeovers_total",
    "sink_fenced_requests_total",  # 409s of fencing (412s of the predecessor check are apart)
)
_COUNT: Final = re.compile(r"\bcount=(\d+)")
OUTAGE_S: Final = (0.3, 1.5)
PG_STOP_MODES: Final = ("fast", "immediate")
# Fast retries so a run drains in seconds; the relay's own defaults are for production.
PUBLISHER_FLAGS: Final = (
    "--poll-interval",
    "0.2",
    "--retry-base",
    "0.02",
    "--retry-cap",
    "0.3",
    "--send-timeout",
    "3",
)
KILLS_BY_TARGET: Final = {
    "publisher": ("publisher:sigkill", "publisher:exit-after-ack"),
    "sink": ("sink:sigkill", "sink:exit-after-commit"),
}


@dataclass
class Cluster:
    """Sinks and publishers serving fresh databases (by default, files in the work
    directory); their logs go to the work directory. One of each by default; with
    several (`workers`, `sinks`), every worker is given every sink URL."""

    workdir: Path
    ordering: Ordering = "global"
    delivery: Delivery = "batch"
    databases: Pair | None = None
    workers: int = 1
    sinks: int = 1
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    handlers: str | None = None  # the sinks' --handlers MODULE:ATTR (None: the warehouse)
    sink_services: list[Service] = field(init=False)
    publishers: list[Service] = field(init=False)
    # Paused processes by service name: when each is due to go on, and the process.
    paused: dict[str, tuple[float, subprocess.Popen[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.databases is None:
            self.databases = Pair(self.workdir / "source.db", self.workdir / "sink.db")
        self.source_db: DbLocation = self.databases.source
        self.sink_db: DbLocation = self.databases.sink
        self.sink_services = [self._sink(n) for n in range(1, self.sinks + 1)]
        self.publishers = [self._worker(n) for n in range(1, self.workers + 1)]

    @property
    def several(self) -> bool:
        return self.workers > 1 or self.sinks > 1

    @property
    def sink(self) -> Service:
        return self.sink_services[0]

    @property
    def publisher(self) -> Service:
        return self.publishers[0]

    def _sink(self, n: int) -> Service:
        name = f"sink-{n}" if self.several else "sink"
        args = ["--db", str(self.sink_db)]
        if self.handlers is not None:
            args += ["--handlers", self.handlers]
        return Service("sink", args, free_port(), self.workdir / f"{name}.log", name=name)

    def _worker(self, n: int) -> Service:
        args = ["serve", "--db", str(self.source_db), *PUBLISHER_FLAGS]
        args += ["--ordering", self.ordering, "--delivery", self.delivery]
        # The run's lease TTL for every worker, the one of a single run too: on
        # PostgreSQL a publisher restarted after a SIGKILL is a new worker, waiting
        # for the killed one's leases to expire.
        args += ["--lease-ttl", f"{self.lease_ttl_s:g}"]
        if not self.several:
            args += ["--sink", f"{self.sink.base_url}/events"]
            return Service("publisher", args, free_port(), self.workdir / "publisher.log")
        for sink in self.sink_services:
            args += ["--sink", f"{sink.base_url}/events"]
        name = f"w{n}"
        args += ["--worker-id", name]
        args += ["--log-format", "json"]
        log = self.workdir / f"publisher-{name}.log"
        return Service("publisher", args, free_port(), log, name=name)

    def services(self) -> list[Service]:
        return [*self.sink_services, *self.publishers]

    def start(self) -> None:
        for service in self.services():
            service.start()

    def revive(self) -> list[tuple[str, int]]:
        """Restart whatever has died (a chaos exit, say) with no chaos option."""
        revived = []
        for service in self.services():
            status = service.reap()
            if status is not None:
                self.paused.pop(service.name, None)
                service.start()
                revived.append((service.module, status))
        return revived

    def pause(self, service: Service, seconds: float) -> bool:
        """SIGSTOP `service` for `seconds` (one already paused goes on first)."""
        self.resume(service.name)
        proc = service.pause()
        if proc is not None:
            self.paused[service.name] = (time.monotonic() + seconds, proc)
        return proc is not None

    def resume(self, name: str) -> None:
        if name in self.paused:
            resume(self.paused.pop(name)[1])

    def resume_due(self) -> None:
        now = time.monotonic()
        for name, (due, _) in list(self.paused.items()):
            if due <= now:
                self.resume(name)

    def resume_all(self) -> None:
        for name in list(self.paused):
            self.resume(name)

    def intake(self, rng: random.Random) -> Service:
        """A worker to post to: alive and not paused (the one due first goes on if
        every worker is paused)."""
        self.resume_due()
        ready = [p for p in self.publishers if p.alive() and p.name not in self.paused]
        if not ready:
            due = min(
                (p for p in self.publishers if p.name in self.paused),
                key=lambda p: self.paused[p.name][0],
                default=None,
            )
            if due is not None:
                self.resume(due.name)
                return due
            return self.publisher
        return rng.choice(ready)

    def stop(self) -> None:
        self.resume_all()  # a stopped process would not see its SIGTERM
        for service in reversed(self.services()):
            service.stop()

    def status(self) -> dict[str, object] | None:
        for publisher in self.publishers:
            if not publisher.alive() or publisher.name in self.paused:
                continue
            try:
                code, body = http_json("GET", f"{publisher.base_url}/status")
            except OSError:
                continue
            if code == 200 and isinstance(body, dict):
                return body
        return None

    def fence_counters(self) -> dict[str, float]:
        """FENCE_COUNTERS summed over the processes alive now."""
        totals = dict.fromkeys(FENCE_COUNTERS, 0.0)
        for service in self.services():
            if not service.alive():
                continue
            try:
                found = counters(f"{service.base_url}/metrics")
            except OSError:
                continue
            for name in FENCE_COUNTERS:
                totals[name] += found.get(name, 0.0)
        return totals


def delivered_in_log(path: Path) -> int:
    """Entries a publisher's log says it delivered (a verified ACK), JSON or text
    lines; a line cut short by a kill is skipped."""
    delivered = 0
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return 0
    for line in lines:
        if "delivered" not in line:
            continue
        if line.startswith("{"):
            try:
                record: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            if record.get("message") == "delivery" and record.get("outcome") == "delivered":
                delivered += int(record.get("count", 1))
        elif " delivery " in line and "outcome=delivered" in line:
            match = _COUNT.search(line)
            delivered += int(match[1]) if match else 1
    return delivered


def fencing_in_logs(cluster: Cluster) -> dict[str, int]:
    """What the logs of every process of the run (a killed one's too) say of fencing:
    lines a worker stopped on losing its lease (taken over, or a write refused),
    deliveries ended by the sink's 409, and the sink's refusals of a stale lease (its
    repeated-failure lines are throttled: at least that many)."""
    found = {"worker_lines_lost": 0, "worker_fenced_deliveries": 0, "sink_stale_refusals": 0}
    for publisher in cluster.publishers:
        for record in _json_lines(publisher.log_path):
            if "lease lost" in str(record.get("message")):
                found["worker_lines_lost"] += 1
            if record.get("outcome") == "fenced":
                found["worker_fenced_deliveries"] += int(record.get("count", 1))
    for sink in cluster.sink_services:
        with contextlib.suppress(OSError):
            text = sink.log_path.read_text(errors="replace")
            found["sink_stale_refusals"] += text.count("stale lease")
    return found


def _json_lines(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
    return records


def event_types(source_db: DbLocation) -> dict[str, int]:
    """Outbox entries by event type."""
    with reading(source_db) as source:
        found = source.rows("SELECT type, count(*) FROM outbox_entries GROUP BY type ORDER BY type")
        return {str(kind): int(n) for kind, n in found}


def lease_epochs(source_db: DbLocation) -> dict[str, int]:
    """Each leased line's epoch in the outbox (none before the lease schema)."""
    with reading(source_db) as source:
        if not source.columns("outbox_line_leases"):
            return {}
        return {str(line): int(epoch) for line, epoch in source.rows(
            "SELECT line, epoch FROM outbox_line_leases ORDER BY line")}  # fmt: skip


@dataclass
class RunReport:
    """The verdict, and what the run did to get there.

    - kills: planned kills (kill_kinds: their kinds; kills_by_kind: how many of each).
      Every kill SIGKILLs the service's running process; an exit-after-* kill then
      restarts it armed to end itself with status 73 at its next ACK or commit, which
      happens unless the next kill comes first.
    - sigkills: processes a SIGKILL ended, per service (one that was ending itself
      with a chaos exit as the signal came counts as that exit)
    - chaos_exits: armed processes that did end themselves (status 73); per service
      in chaos_exits_by_service
    - faults: sigkills plus chaos exits, both services
    - restarts: process starts beyond the first of each service
    - exit_statuses: how each service's processes ended, by exit status (-9: SIGKILL,
      73: chaos exit, 0: the orderly stop at the end; anything else is unexpected);
      with several workers or sinks, per process name (w1, sink-2, ...)
    - pauses: SIGSTOP/SIGCONT pauses, per process name in pauses_by_service
    - all_faults: faults plus pauses plus PostgreSQL restarts
    - delivered_by_worker: entries each publisher's log says it delivered (ACKs
      verified; a redelivery after a kill or a takeover counts again)
    - lines: per line of the order check (each key in key order, "*" for events
      without one), entries the sink applied and the inverted pairs among them
    - events_mix: what the feed was (orders, generic events, or both: chaos.feed)
    - event_types: outbox entries by event type at the end
    - intake_posts: requests the intake recorded, by path (/orders, /events,
      /events/batch; a retry after a lost reply counts again)
    - handlers: the sinks' handler registry (`--handlers`), None for the built-in
      warehouse
    - fence_counters: the fencing counters of the processes alive at the end
    - fencing_in_logs: what every process's log says of fencing (`fencing_in_logs`)
    - lease_epochs: each leased line's epoch in the outbox at the end
    """

    verdict: Verdict
    kills: list[str]
    sigkills: dict[str, int]
    chaos_exits: dict[str, int]
    restarts: int
    exit_statuses: dict[str, dict[str, int]]
    drained: bool
    elapsed_s: float
    delivery: Delivery = "batch"
    backend: str = "sqlite"
    # PostgreSQL server restarts (stop fast or immediate, start again) during the feed,
    # and how many intake requests were refused with 503 meanwhile.
    pg_restarts: list[str] = field(default_factory=list)
    intake_unavailable: int = 0
    databases: dict[str, str] = field(default_factory=dict)  # where the verdict read
    workers: int = 1
    sinks: int = 1
    lease_ttl_s: float | None = None
    pauses: list[str] = field(default_factory=list)
    delivered_by_worker: dict[str, int] = field(default_factory=dict)
    lines: dict[str, LineOrder] = field(default_factory=dict)
    fence_counters: dict[str, float] = field(default_factory=dict)
    fencing_in_logs: dict[str, int] = field(default_factory=dict)
    lease_epochs: dict[str, int] = field(default_factory=dict)
    events_mix: Mix = "orders"
    event_types: dict[str, int] = field(default_factory=dict)
    intake_posts: dict[str, int] = field(default_factory=dict)
    handlers: str | None = None

    def to_dict(self) -> dict[str, object]:
        by_kind = Counter(self.kills)
        return {
            **self.verdict.to_dict(),
            "ok": self.verdict.ok and self.drained,
            "drained": self.drained,
            "delivery": self.delivery,
            "kills": len(self.kills),
            "kill_kinds": sorted(by_kind),
            "kills_by_kind": {kind: by_kind[kind] for kind in sorted(by_kind)},
            "sigkills": self.sigkills,
            "chaos_exits": sum(self.chaos_exits.values()),
            "chaos_exits_by_service": self.chaos_exits,
            "faults": sum(self.sigkills.values()) + sum(self.chaos_exits.values()),
            "restarts": self.restarts,
            "exit_statuses": self.exit_statuses,
            "backend": self.backend,
            "databases": self.databases,
            "pg_restarts": len(self.pg_restarts),
            "pg_stop_modes": sorted(set(self.pg_restarts)),
            "intake_unavailable": self.intake_unavailable,
            "workers": self.workers,
            "sinks": self.sinks,
            "lease_ttl_s": self.lease_ttl_s,
            "pauses": len(self.pauses),
            "pauses_by_service": dict(sorted(Counter(self.pauses).items())),
            "all_faults": sum(self.sigkills.values())
            + sum(self.chaos_exits.values())
            + len(self.pauses)
            + len(self.pg_restarts),
            "delivered_by_worker": self.delivered_by_worker,
            "lines": {line: order.to_dict() for line, order in sorted(self.lines.items())},
            "fence_counters": self.fence_counters,
            "fencing_in_logs": self.fencing_in_logs,
            "lease_epochs": self.lease_epochs,
            "events_mix": self.events_mix,
            "event_types": self.event_types,
            "intake_posts": self.intake_posts,
            "handlers": self.handlers,
            "elapsed_s": round(self.elapsed_s, 2),
        }


def plan_kills(rng: random.Random, events: int, kills: int, target: Target) -> dict[int, str]:
    """Which index of the feed each kill comes before, and what kind of kill it is."""
    kinds = [k for t, ks in KILLS_BY_TARGET.items() if target in (t, "both") for k in ks]
    points = rng.sample(range(1, events), min(kills, events - 1)) if events > 1 else []
    return {point: rng.choice(kinds) for point in sorted(points)}


def plan_outages(seed: int, events: int, restarts: int) -> dict[int, str]:
    """Which index of the feed each PostgreSQL restart comes before, and its stop mode. A
    generator of its own: the kill plan and the orders stay those of the seed."""
    rng = random.Random(f"pg-restarts-{seed}")
    points = rng.sample(range(1, events), min(restarts, events - 1)) if events > 1 else []
    return {point: PG_STOP_MODES[n % 2] for n, point in enumerate(sorted(points))}


def plan_pauses(
    seed: int, events: int, pauses: int, target: Target, lease_ttl_s: float
) -> dict[int, tuple[str, float]]:
    """Which index of the feed each pause comes before, the kind of process it stops
    (publisher or sink) and for how long. A generator of its own, like the outages."""
    rng = random.Random(f"pauses-{seed}")
    kinds = [kind for kind in ("publisher", "sink") if target in (kind, "both")]
    points = rng.sample(range(1, events), min(pauses, events - 1)) if events > 1 else []
    low, high = PAUSE_S
    return {
        point: (rng.choice(kinds), rng.uniform(low * lease_ttl_s, high * lease_ttl_s))
        for point in sorted(points)
    }


class Server(Protocol):
    """What a run needs of a PostgreSQL server it may stop: plumbing.pgserver's."""

    def stop(self, mode: str = "fast") -> None: ...

    def start(self) -> None: ...


@dataclass
class Deadline:
    """The whole run's time bound: every loop of the run checks it."""

    limit_s: float
    started: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.limit_s - self.elapsed()

    def check(self, doing: str) -> None:
        if self.left() <= 0:
            raise ChaosError(f"the run went past its time limit of {self.limit_s:g} s {doing}")


@dataclass(frozen=True)
class Faults:
    """What happens before which index of the feed: kills, PostgreSQL outages, pauses."""

    kills: dict[int, str]
    outages: dict[int, str]
    pauses: dict[int, tuple[str, float]]

    def at(self, index: int) -> bool:
        return index in self.kills or index in self.outages or index in self.pauses

    def done(self, index: int) -> tuple[int, int]:
        """Kills and pauses up to and including `index`."""
        return sum(1 for p in self.kills if p <= index), sum(1 for p in self.pauses if p <= index)


@dataclass
class Feeder:
    """Feeds the run's items one index at a time, with the faults planned before each,
    and keeps what the verdict compares the databases with: the orders the intake
    accepted, and the canonical form of every event it accepted."""

    cluster: Cluster
    feed: Feed
    faults: Faults
    intake: Intake
    victims: random.Random
    pg_server: Server | None = None
    sigkills: Counter[str] = field(default_factory=Counter)
    paused: list[str] = field(default_factory=list)
    expected: dict[str, tuple[str, int]] = field(default_factory=dict)
    published: dict[str, str] = field(default_factory=dict)

    def step(self, index: int, seed: int) -> None:
        self.cluster.revive()  # a chaos exit since the last item: bring it back
        self.cluster.resume_due()
        if self.faults.at(index):
            self.intake.flush()  # what came before a fault reaches the intake before it
        if index in self.faults.kills:
            # A random moment, not a fixed point; drawn from the run's generator, the orders'
            # (a seed's orders-only feed is the one it gave before generic events).
            time.sleep(self.feed.orders.uniform(0, 0.03))
            self.sigkills.update(kill(self.cluster, self.faults.kills[index], self.victims))
        if index in self.faults.pauses:
            self.paused += pause(self.cluster, *self.faults.pauses[index], self.victims)
        item = self.feed.item(index)
        if index in self.faults.outages and self.pg_server is not None:
            outage(self.pg_server, self.faults.outages[index], self.intake, item, seed + index)
        self.intake.add(item)
        self.published[item.id] = item.canonical
        if item.order is not None:
            self.expected[item.id] = (item.order["sku"], item.order["qty"])


def run(
    workdir: Path,
    events: int,
    kills: int,
    seed: int,
    target: Target,
    drain_timeout_s: float,
    progress: bool = True,
    *,
    ordering: Ordering = "global",
    delivery: Delivery = "batch",
    time_limit_s: float = float("inf"),
    databases: Pair | None = None,
    pg_restarts: int = 0,
    pg_server: Server | None = None,
    workers: int = 1,
    sinks: int = 1,
    pauses: int = 0,
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    events_mix: Mix = "orders",
    handlers: str | None = None,
) -> RunReport:
    rng = random.Random(seed)
    cluster = Cluster(workdir, ordering, delivery, databases, workers, sinks, lease_ttl_s, handlers)
    faults = Faults(
        kills=plan_kills(rng, events, kills, target),
        outages=plan_outages(seed, events, pg_restarts) if pg_server is not None else {},
        pauses=plan_pauses(seed, events, pauses, target, lease_ttl_s),
    )
    feed = Feed(events_mix, seed, rng, MANY_SKUS if cluster.several else SKUS)
    deadline = Deadline(time_limit_s)
    intake = Intake(cluster, deadline.check)
    feeder = Feeder(cluster, feed, faults, intake, random.Random(f"victims-{seed}"), pg_server)
    fenced: dict[str, float] = {}
    noun = "orders" if events_mix == "orders" else "events"
    try:
        cluster.start()
        for index in range(events):
            deadline.check(f"while feeding {noun[:-1]} {index + 1} of {events}")
            feeder.step(index, seed)
            if progress and (index + 1) % max(1, events // 10) == 0:
                done, held = faults.done(index)
                say(
                    f"fed {index + 1}/{events} {noun}, {done} kills, {held} pauses, "
                    f"{deadline.elapsed():.0f} s"
                )
        intake.flush()
        cluster.resume_all()
        drained = drain(cluster, min(drain_timeout_s, max(0.0, deadline.left())), progress)
        if not drained:
            deadline.check("while draining the backlog")
        if cluster.several:
            fenced = cluster.fence_counters()
    finally:
        cluster.stop()
    verdict = read_verdict(
        cluster.source_db,
        cluster.sink_db,
        feeder.expected,
        ordering,
        published=feeder.published,
        inventory=handlers in (None, EFFECTS_SPEC),
    )
    return RunReport(
        verdict=verdict,
        kills=list(faults.kills.values()),
        sigkills={name: feeder.sigkills[name] for name in ("publisher", "sink")},
        chaos_exits={kind: chaos_exits(cluster, kind) for kind in ("publisher", "sink")},
        restarts=sum(max(0, s.starts - 1) for s in cluster.services()),
        exit_statuses={
            s.name: {str(k): n for k, n in sorted(Counter(s.exits).items())}
            for s in cluster.services()
        },
        drained=drained,
        elapsed_s=deadline.elapsed(),
        delivery=delivery,
        backend=cluster.databases.backend if cluster.databases else "sqlite",
        databases=cluster.databases.shown() if cluster.databases else {},
        pg_restarts=list(faults.outages.values()),
        intake_unavailable=intake.unavailable,
        workers=workers,
        sinks=sinks,
        lease_ttl_s=lease_ttl_s,
        pauses=feeder.paused,
        delivered_by_worker={p.name: delivered_in_log(p.log_path) for p in cluster.publishers},
        lines=line_orders(cluster.source_db, cluster.sink_db, ordering),
        fence_counters=fenced,
        fencing_in_logs=fencing_in_logs(cluster) if cluster.several else {},
        lease_epochs=lease_epochs(cluster.source_db),
        events_mix=events_mix,
        event_types=event_types(cluster.source_db),
        intake_posts=dict(sorted(intake.posts.items())),
        handlers=handlers,
    )


def chaos_exits(cluster: Cluster, kind: str) -> int:
    """How many processes of that kind ended themselves with the chaos exit status."""
    ended = [status for s in cluster.services() if s.module == kind for status in s.exits]
    return ended.count(CHAOS_EXIT_STATUS)


def pause(cluster: Cluster, kind: str, seconds: float, victims: random.Random) -> list[str]:
    """SIGSTOP a process of that kind for `seconds`; the name of the one paused."""
    cluster.revive()
    pool = cluster.publishers if kind == "publisher" else cluster.sink_services
    service = victims.choice(pool)
    return [service.name] if cluster.pause(service, seconds) else []


def outage(server: Server, mode: str, intake: Intake, item: Item, seed: int) -> None:
    """Stop the PostgreSQL server under load, keep posting `item` while it is down (each
    answer a 503, or the item is accepted by nothing), then start it again."""
    server.stop(mode)
    until = time.monotonic() + random.Random(seed).uniform(*OUTAGE_S)
    while time.monotonic() < until:
        if intake.post(item, attempts=1):
            raise ChaosError(f"intake accepted {item.id} while PostgreSQL was stopped")
    server.start()


def kill(cluster: Cluster, kind: str, victims: random.Random | None = None) -> list[str]:
    """Kill a service now (SIGKILL), or restart it armed to die at the next ACK/commit;
    with several processes of that kind, one picked by `victims`.

    Returns the kinds of the services whose process the SIGKILL ended.
    """
    cluster.revive()
    name, _, how = kind.partition(":")
    pool = cluster.publishers if name == "publisher" else cluster.sink_services
    service = pool[0] if victims is None or len(pool) == 1 else victims.choice(pool)
    cluster.paused.pop(service.name, None)  # SIGKILL ends a stopped process too
    killed = [name] if service.kill() else []
    if how == "exit-after-ack":
        service.start("--chaos", "exit-after-ack")
    elif how == "exit-after-commit":
        service.start("--chaos", "exit-after-commit=1")
    else:
        service.start()
    return killed


def drain(cluster: Cluster, timeout_s: float, progress: bool) -> bool:
    """Wait until nothing is pending, restarting chaos exits as they happen."""
    deadline = time.monotonic() + timeout_s
    last_report = 0.0
    while time.monotonic() < deadline:
        cluster.revive()
        status = cluster.status()
        if status is not None and status.get("pending") == 0:
            return True
        if progress and time.monotonic() - last_report > 2 and status is not None:
            say(f"draining: {status.get('pending')} pending")
            last_report = time.monotonic()
        time.sleep(0.1)
    return False


def say(message: str) -> None:
    print(f"[chaos] {message}", file=sys.stderr, flush=True)
