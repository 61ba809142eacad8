"""`python -m chaos run`: feed orders while killing the services, then read the verdict."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, Protocol

from chaos.dbs import DbLocation, Pair
from chaos.procs import ChaosError, Service, free_port, http_json
from chaos.verdict import Ordering, Verdict, read_verdict
from shared import Event

Target = Literal["publisher", "sink", "both"]
Delivery = Literal["batch", "single"]
SKUS: Final = ("snack", "juice", "bread", "soap")
POST_ATTEMPTS: Final = 200
RETRY_PAUSE_S: Final = 0.05
# An outage of the PostgreSQL server: intake answers 503 meanwhile; the order is
# posted again (as a client would) until the server is back and accepts it.
UNAVAILABLE: Final = 503
OUTAGE_S: Final = (0.3, 1.5)
OUTAGE_POSTS: Final = 20_000
PG_STOP_MODES: Final = ("fast", "immediate")
CHAOS_EXIT_STATUS: Final = 73
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
    """A sink and a publisher serving fresh databases (by default, files in the work
    directory); their logs go to the work directory."""

    workdir: Path
    ordering: Ordering = "global"
    delivery: Delivery = "batch"
    databases: Pair | None = None
    sink: Service = field(init=False)
    publisher: Service = field(init=False)

    def __post_init__(self) -> None:
        if self.databases is None:
            self.databases = Pair(self.workdir / "source.db", self.workdir / "sink.db")
        self.source_db: DbLocation = self.databases.source
        self.sink_db: DbLocation = self.databases.sink
        self.sink = Service(
            "sink", ["--db", str(self.sink_db)], free_port(), self.workdir / "sink.log"
        )
        sink_url = f"{self.sink.base_url}/events"
        args = [
            *("serve", "--db", str(self.source_db), "--sink", sink_url, *PUBLISHER_FLAGS),
            *("--ordering", self.ordering, "--delivery", self.delivery),
        ]
        self.publisher = Service("publisher", args, free_port(), self.workdir / "publisher.log")

    def start(self) -> None:
        self.sink.start()
        self.publisher.start()

    def revive(self) -> list[tuple[str, int]]:
        """Restart whatever has died (a chaos exit, say) with no chaos option."""
        revived = []
        for service in (self.sink, self.publisher):
            status = service.reap()
            if status is not None:
                service.start()
                revived.append((service.module, status))
        return revived

    def stop(self) -> None:
        self.publisher.stop()
        self.sink.stop()

    def status(self) -> dict[str, object] | None:
        try:
            code, body = http_json("GET", f"{self.publisher.base_url}/status")
        except OSError:
            return None
        return body if code == 200 and isinstance(body, dict) else None


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
      73: chaos exit, 0: the orderly stop at the end; anything else is unexpected)
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
    # and how many POST /orders the intake refused with 503 meanwhile.
    pg_restarts: list[str] = field(default_factory=list)
    intake_unavailable: int = 0
    databases: dict[str, str] = field(default_factory=dict)  # where the verdict read

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
            "elapsed_s": round(self.elapsed_s, 2),
        }


def plan_kills(rng: random.Random, events: int, kills: int, target: Target) -> dict[int, str]:
    """Which order index each kill comes before, and what kind of kill it is."""
    kinds = [k for t, ks in KILLS_BY_TARGET.items() if target in (t, "both") for k in ks]
    points = rng.sample(range(1, events), min(kills, events - 1)) if events > 1 else []
    return {point: rng.choice(kinds) for point in sorted(points)}


def plan_outages(seed: int, events: int, restarts: int) -> dict[int, str]:
    """Which order index each PostgreSQL restart comes before, and its stop mode. A
    generator of its own: the kill plan and the orders stay those of the seed."""
    rng = random.Random(f"pg-restarts-{seed}")
    points = rng.sample(range(1, events), min(restarts, events - 1)) if events > 1 else []
    return {point: PG_STOP_MODES[n % 2] for n, point in enumerate(sorted(points))}


class Server(Protocol):
    """What a run needs of a PostgreSQL server it may stop: plumbing.pgserver's."""

    def stop(self, mode: str = "fast") -> None: ...

    def start(self) -> None: ...


@dataclass
class Intake:
    """POST /orders as a client does it: again after a lost reply or a 503."""

    cluster: Cluster
    deadline: Deadline | None = None
    unavailable: int = 0

    def post(self, order: Event, attempts: int = POST_ATTEMPTS) -> bool:
        """True once the intake answered 201 or 200 (a retry after a lost reply is a
        duplicate); False if it still answers 503 after `attempts`."""
        url = f"{self.cluster.publisher.base_url}/orders"
        for _ in range(attempts):
            if self.deadline is not None:
                self.deadline.check(f"while posting {order['id']}")
            try:
                code, body = http_json("POST", url, order)
            except OSError:
                self.cluster.revive()
                time.sleep(RETRY_PAUSE_S)
                continue
            if code in (200, 201):
                return True
            if code == UNAVAILABLE and isinstance(body, dict) and "error" in body:
                self.unavailable += 1
                time.sleep(RETRY_PAUSE_S)
                continue
            raise ChaosError(f"intake refused {order['id']}: {code} {body}")
        return False


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
) -> RunReport:
    rng = random.Random(seed)
    cluster = Cluster(workdir, ordering, delivery, databases)
    plan = plan_kills(rng, events, kills, target)
    outages = plan_outages(seed, events, pg_restarts) if pg_server is not None else {}
    expected: dict[str, tuple[str, int]] = {}
    sigkills: Counter[str] = Counter()
    deadline = Deadline(time_limit_s)
    intake = Intake(cluster, deadline)
    try:
        cluster.start()
        for index in range(events):
            deadline.check(f"while feeding order {index + 1} of {events}")
            cluster.revive()  # a chaos exit since the last order: bring it back
            if index in plan:
                time.sleep(rng.uniform(0, 0.03))  # a random moment, not a fixed point
                sigkills.update(kill(cluster, plan[index]))
            order = Event(
                id=f"chaos-{seed}-{index:06d}", sku=rng.choice(SKUS), qty=rng.randint(1, 9)
            )
            if index in outages and pg_server is not None:
                outage(pg_server, outages[index], intake, order, seed + index)
            if not intake.post(order):
                raise ChaosError(f"intake never accepted {order['id']}")
            expected[order["id"]] = (order["sku"], order["qty"])
            if progress and (index + 1) % max(1, events // 10) == 0:
                done = sum(1 for p in plan if p <= index)
                say(f"fed {index + 1}/{events} orders, {done} kills, {deadline.elapsed():.0f} s")
        drained = drain(cluster, min(drain_timeout_s, max(0.0, deadline.left())), progress)
        if not drained:
            deadline.check("while draining the backlog")
    finally:
        cluster.stop()
    services = {"publisher": cluster.publisher, "sink": cluster.sink}
    return RunReport(
        verdict=read_verdict(cluster.source_db, cluster.sink_db, expected, ordering),
        kills=list(plan.values()),
        sigkills={name: sigkills[name] for name in services},
        chaos_exits={
            name: sum(1 for status in s.exits if status == CHAOS_EXIT_STATUS)
            for name, s in services.items()
        },
        restarts=sum(max(0, s.starts - 1) for s in services.values()),
        exit_statuses={
            name: {str(k): n for k, n in sorted(Counter(s.exits).items())}
            for name, s in services.items()
        },
        drained=drained,
        elapsed_s=deadline.elapsed(),
        delivery=delivery,
        backend=cluster.databases.backend if cluster.databases else "sqlite",
        databases=cluster.databases.shown() if cluster.databases else {},
        pg_restarts=list(outages.values()),
        intake_unavailable=intake.unavailable,
    )


def outage(server: Server, mode: str, intake: Intake, order: Event, seed: int) -> None:
    """Stop the PostgreSQL server under load, keep posting `order` while it is down (each
    answer a 503, or the order is accepted by nothing), then start it again."""
    server.stop(mode)
    until = time.monotonic() + random.Random(seed).uniform(*OUTAGE_S)
    while time.monotonic() < until:
        if intake.post(order, attempts=1):
            raise ChaosError(f"intake accepted {order['id']} while PostgreSQL was stopped")
    server.start()


def kill(cluster: Cluster, kind: str) -> list[str]:
    """Kill a service now (SIGKILL), or restart it armed to die at the next ACK/commit.

    Returns the names of the services whose process the SIGKILL ended.
    """
    cluster.revive()
    name, _, how = kind.partition(":")
    service = cluster.publisher if name == "publisher" else cluster.sink
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
