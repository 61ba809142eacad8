"""Several relay workers and several sinks as real processes on one PostgreSQL server.

Three `publisher serve --worker-id wN --lease-ttl 2 --ordering sku` processes share
one outbox, two `python -m sink` processes one inbox; orders keep arriving (a feeder
thread posts them to the workers' intake) while a worker is SIGKILLed, SIGSTOPped
past its lease and resumed, or started mid-run. What the leases did is read from
`line_leases`, what was delivered from both databases with connections of the test's
own (chaos.verdict: nothing lost, nothing applied twice, per-SKU order at the sink
equal to outbox seq order), and what was fenced from the processes' /metrics.

The harness (Worker processes, the Feeder, the lease reads) is shared with
test_partition.py, whose processes run on network-namespace hosts.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from support import listening, stop_process

from chaos.procs import counters
from chaos.verdict import Verdict, line_orders, read_verdict

if TYPE_CHECKING:
    from conftest import PgSchemas

pytestmark = pytest.mark.e2e

T = TypeVar("T")
TTL_S = 2.0
SKUS = tuple(f"sku-{n:02d}" for n in range(16))
FEED_PAUSE_S = 0.015  # about 60 orders a second
POST_TIMEOUT_S = 3.0
WAIT_S = 20.0
# Longer than a takeover takes on a loaded machine (the lease TTL, a renewal period of
# the taker, its first request): a request held this long is applied after it.
HOLD_S = 6
POLL_S = 0.05
DRAIN_S = 25.0
BUSY_SINK_S = 0.3
_LISTENING = re.compile(r"(publisher|sink) listening on (http://([0-9.]+):(\d+)/\w+)")
WORKER_FLAGS = (
    *("--ordering", "sku", "--lease-ttl", f"{TTL_S:g}", "--poll-interval", "0.2"),
    *("--lanes", str(len(SKUS))),  # room for another's lines whenever they are free
    *("--retry-base", "0.02", "--retry-cap", "0.3", "--log-format", "json"),
)
LEASE_FENCED = "sink_fenced_requests_total"


def direct(fn: Callable[[], T]) -> T:
    """Run `fn` here (the processes of this module are on this host's loopback)."""
    return fn()


# ---------------------------------------------------------------- processes


@dataclass
class Proc:
    """A service process: its name, where it listens, how to reach it from the test
    (`call` runs a function where the process's loopback is: here, or inside its
    network namespace)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    url: str
    host: str
    port: int
    call: Callable[[Callable[[], Any]], Any] = direct

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def metrics(self) -> dict[str, float]:
        return dict(self.call(lambda: counters(f"{self.base}/metrics")))

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        self.resume()  # a stopped process would not see its SIGTERM
        return stop_process(self.proc)

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Processes:
    """Starts service processes (optionally through a command prefix, e.g. `ip netns
    exec NAME`); stops every one at the end."""

    workdir: Path
    env: dict[str, str]
    started: list[Proc] = field(default_factory=list)

    def start(
        self,
        name: str,
        args: Sequence[str],
        prefix: Sequence[str] = (),
        call: Callable[[Callable[[], Any]], Any] = direct,
    ) -> Proc:
        log = self.workdir / f"{name}.log"
        with log.open("ab") as stderr:
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=self.env,
                cwd=self.workdir,
            )
        match = listening(proc, log, _LISTENING, name)
        started = Proc(name, proc, log, match[2], match[3], int(match[4]), call)
        self.started.append(started)
        return started

    def stop_all(self) -> None:
        for proc in self.started:
            proc.resume()
        for proc in reversed(self.started):
            if proc.alive():
                proc.stop()
            elif proc.proc.stdout is not None:
                proc.proc.stdout.close()


def sink_args(db: str, *extra: str) -> list[str]:
    return ["sink", "--db", db, "--port", "0", *extra]


def worker_args(db: str, worker: str, sinks: Sequence[str], *extra: str) -> list[str]:
    urls = [arg for url in sinks for arg in ("--sink", url)]
    return ["publisher", "serve", "--db", db, *urls, "--worker-id", worker, "--port", "0",
            *WORKER_FLAGS, *extra]  # fmt: skip


# ---------------------------------------------------------------- orders


@dataclass
class Feeder:
    """A thread posting orders (random SKUs) to the intake of the workers `targets`
    returns, about 60 a second, each until one answers 201 or 200 (a retry after a
    lost reply is a duplicate). `accepted` is what the verdict expects."""

    targets: Callable[[], list[Proc]]
    seed: int = 14
    accepted: dict[str, tuple[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    call: Callable[[Callable[[], Any]], Any] = direct
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: self.call(self._feed), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=POST_TIMEOUT_S * 3)
            assert not self._thread.is_alive(), "the feeder did not stop"

    def _feed(self) -> None:
        rng = random.Random(self.seed)
        for n in itertools.count():
            if self._stop.is_set():
                return
            sku, qty = rng.choice(SKUS), rng.randint(1, 9)
            order: dict[str, Any] = {"id": f"o-{n:05d}", "sku": sku, "qty": qty}
            if self._post(order):
                self.accepted[order["id"]] = (sku, qty)
            time.sleep(FEED_PAUSE_S)

    def _post(self, order: dict[str, Any]) -> bool:
        for _ in range(100):
            workers = [w for w in self.targets() if w.alive()]
            if not workers or self._stop.is_set():
                return False
            worker = random.choice(workers)
            try:
                status = post(worker.host, worker.port, order)
            except OSError:
                continue
            if status in (200, 201):
                return True
            self.failures.append(f"{worker.name}: {status}")
            time.sleep(POLL_S)
        return False


def post(host: str, port: int, order: dict[str, Any]) -> int:
    conn = http.client.HTTPConnection(host, port, timeout=POST_TIMEOUT_S)
    try:
        conn.request("POST", "/orders", json.dumps(order), {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


# ---------------------------------------------------------------- reads


@dataclass(frozen=True)
class LeaseRow:
    line: str
    owner: str | None
    epoch: int


def leases(source: str) -> dict[str, LeaseRow]:
    """The outbox's line_leases, read through a connection of the test's own."""
    import psycopg

    with psycopg.connect(source, autocommit=True, connect_timeout=5) as conn:
        found = conn.execute("SELECT line, owner, epoch FROM outbox_line_leases").fetchall()
    return {line: LeaseRow(line, owner, int(epoch)) for line, owner, epoch in found}


def owned_by(rows: dict[str, LeaseRow], worker: str) -> dict[str, int]:
    return {r.line: r.epoch for r in rows.values() if r.owner == worker}


def sent_count(source: str) -> int:
    import psycopg

    with psycopg.connect(source, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_entries WHERE sent = 1").fetchone()
    return int(row[0]) if row else 0


def wait_for(check: Callable[[], T | None], timeout_s: float = WAIT_S, what: str = "") -> T:
    """Poll `check` until it returns something truthy; that value. Fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / POLL_S) + 10):
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    raise AssertionError(f"not within {timeout_s:g} s: {what}")


def moved(source: str, held: dict[str, int], victim: str) -> bool:
    """Every line `victim` held (line -> its epoch then) taken since by another worker."""
    rows = leases(source)
    return all(
        line in rows and rows[line].owner != victim and rows[line].epoch > epoch
        for line, epoch in held.items()
    )


def drained_verdict(source: str, sink: str, accepted: dict[str, tuple[str, int]]) -> Verdict:
    """Once every accepted order is marked sent: the verdict of both databases."""
    wait_for(lambda: sent_count(source) >= len(accepted), DRAIN_S, "every order sent")
    return read_verdict(source, sink, accepted, "sku")


def assert_clean(verdict: Verdict, source: str, sink: str, accepted: int) -> None:
    assert verdict.accepted == accepted and verdict.delivered == accepted, verdict
    assert (verdict.lost, verdict.applied_twice, verdict.inventory_ok) == (0, 0, True), verdict
    assert verdict.order_inversions == 0, verdict
    lines = line_orders(source, sink, "sku")
    assert sum(order.applied for order in lines.values()) == accepted
    assert {line: order.inversions for line, order in lines.items() if order.inversions} == {}


# ---------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    """Sinks and workers of one test on one source and one sink database."""

    procs: Processes
    source: str
    sink: str
    sinks: list[Proc] = field(default_factory=list)
    workers: dict[str, Proc] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)

    def add_sink(self, *extra: str) -> Proc:
        sink = self.procs.start(f"sink-{len(self.sinks) + 1}", sink_args(self.sink, *extra))
        self.sinks.append(sink)
        return sink

    def add_worker(self, name: str, sink_order: Sequence[Proc] | None = None) -> Proc:
        urls = [s.url for s in (sink_order or self.sinks)]
        worker = self.procs.start(name, worker_args(self.source, name, urls))
        self.workers[name] = worker
        return worker

    def ready(self) -> list[Proc]:
        return [w for name, w in self.workers.items() if name not in self.paused and w.alive()]


@pytest.fixture
def cluster(tmp_path: Path, child_env: dict[str, str], pg_schemas: PgSchemas) -> Iterator[Cluster]:
    """The source and the sink: two schemas (pg_schemas drops them after the processes
    are stopped)."""
    procs = Processes(tmp_path, child_env)
    try:
        yield Cluster(procs, pg_schemas.first, pg_schemas.new())
    finally:
        procs.stop_all()


def running(cluster: Cluster, workers: int = 3) -> Feeder:
    """Two sinks, `workers` workers, the feeder started. The sinks hold each request
    0.3 s, so a lane fed a few orders a second stays busy and its lease held."""
    for _ in range(2):
        cluster.add_sink("--chaos", f"stall={BUSY_SINK_S}")
    for n in range(1, workers + 1):
        cluster.add_worker(f"w{n}")
    feeder = Feeder(cluster.ready)
    feeder.start()
    return feeder


def both_hold(source: str, *workers: str) -> bool:
    rows = leases(source)
    return all(owned_by(rows, worker) for worker in workers)


def busiest(source: str, workers: Sequence[str]) -> tuple[str, dict[str, int]]:
    """The worker holding the most lines (at least one), and those lines' epochs."""

    def found() -> tuple[str, dict[str, int]] | None:
        rows = leases(source)
        held = {w: owned_by(rows, w) for w in workers}
        name = max(held, key=lambda w: len(held[w]))
        return (name, held[name]) if held[name] else None

    return wait_for(found, what="a worker holding a line")


# ---------------------------------------------------------------- the tests


@pytest.mark.timeout(60)
def test_a_killed_workers_lanes_move_to_the_others_and_nothing_is_lost_or_applied_twice(
    cluster: Cluster,
) -> None:
    feeder = running(cluster)
    try:
        wait_for(lambda: len(feeder.accepted) > 60, what="orders accepted")
        victim, held = busiest(cluster.source, list(cluster.workers))
        cluster.workers[victim].kill()

        wait_for(lambda: moved(cluster.source, held, victim), what=f"{victim}'s lines taken over")
        wait_for(lambda: len(feeder.accepted) > 240, what="orders after the kill")
    finally:
        feeder.stop()
    survivors = [w for name, w in cluster.workers.items() if name != victim]
    verdict = drained_verdict(cluster.source, cluster.sink, feeder.accepted)

    assert_clean(verdict, cluster.source, cluster.sink, len(feeder.accepted))
    takeovers = sum(w.metrics().get("publisher_lease_takeovers_total", 0) for w in survivors)
    assert takeovers >= 1
    assert feeder.failures == []


@pytest.mark.timeout(60)
def test_a_worker_paused_past_its_lease_is_fenced_by_the_sink_and_the_outbox(
    cluster: Cluster,
) -> None:
    # The victim sends to a sink that holds every request 6 s before applying it;
    # the others to a prompt one. Paused while its requests wait there, the victim
    # loses its lines to the others, whose requests raise the lines' epochs at the
    # shared inbox: when the held requests come to be applied they are refused (409).
    slow = cluster.add_sink("--chaos", f"stall={HOLD_S}")
    prompt = cluster.add_sink()
    victim = cluster.add_worker("w1", [slow, prompt])
    for name in ("w2", "w3"):
        cluster.add_worker(name, [prompt, slow])
    feeder = Feeder(cluster.ready)
    feeder.start()
    try:
        wait_for(lambda: owned_by(leases(cluster.source), "w1"), what="w1 holding a line")
        time.sleep(0.5)  # its first requests are now held by the slow sink
        held = owned_by(leases(cluster.source), "w1")
        victim.pause()
        cluster.paused.add("w1")

        wait_for(lambda: moved(cluster.source, held, "w1"), what="w1's lines taken over")
        wait_for(lambda: slow.metrics().get(LEASE_FENCED, 0) >= 1, what="a late request refused")
        victim.resume()
        cluster.paused.discard("w1")

        def fenced() -> float:
            found = victim.metrics()
            return found.get("publisher_fenced_requests_total", 0) + found.get(
                "publisher_fenced_writes_total", 0
            )

        late = wait_for(fenced, what="w1 told it was fenced")
        time.sleep(0.5)  # orders after the resume: w1 takes part again
    finally:
        feeder.stop()
    verdict = drained_verdict(cluster.source, cluster.sink, feeder.accepted)

    assert_clean(verdict, cluster.source, cluster.sink, len(feeder.accepted))
    assert late >= 1
    assert sum(s.metrics().get(LEASE_FENCED, 0) for s in cluster.sinks) >= 1
    assert victim.alive()


@pytest.mark.timeout(60)
def test_a_worker_started_mid_run_takes_a_share(cluster: Cluster) -> None:
    feeder = running(cluster, workers=2)
    try:
        wait_for(lambda: len(feeder.accepted) > 60, what="orders accepted")
        wait_for(lambda: both_hold(cluster.source, "w1", "w2"), what="w1 and w2 holding lines")
        started = time.monotonic()
        late = cluster.add_worker("w3")

        wait_for(lambda: owned_by(leases(cluster.source), "w3"), what="w3 holding a line")
        took = time.monotonic() - started
        wait_for(lambda: late.metrics().get("publisher_lines_owned", 0) >= 1, what="w3's gauge")
        wait_for(
            lambda: late.metrics().get("publisher_relay_workers_live") == 3, what="w3 sees three"
        )
        wait_for(lambda: len(feeder.accepted) > 200, what="more orders")
    finally:
        feeder.stop()
    verdict = drained_verdict(cluster.source, cluster.sink, feeder.accepted)

    assert_clean(verdict, cluster.source, cluster.sink, len(feeder.accepted))
    assert took < 3 * TTL_S + 2  # its start, then a few renewals
