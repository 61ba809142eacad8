"""A real network partition: PostgreSQL, two relay workers and the sinks on separate
test hosts (network namespaces this test creates, tests/netns.py), one worker cut off
past its lease while orders keep arriving, then brought back.

Only the namespaces' own addresses (10.251.7.0/24) and their loopback are used: the
child processes' name guard allows that network and loopback, nothing else.

The sink host runs two sink processes on the one inbox: the cut-off worker's first
sink holds each request 6 s before applying it, the other worker's answers at once.
Cut off right after it sent its first requests, worker w1 loses its lines to w2,
whose requests raise the lines' epochs at the shared inbox; w1's held requests are
then refused (409, nothing applied), and once the link is back w1 gets those
refusals (and any late mark is refused by the outbox): its counters say so.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import Host, Network, allow_network_here, guard_allowing, network
from test_workers_processes import (
    HOLD_S,
    LEASE_FENCED,
    Feeder,
    Proc,
    Processes,
    assert_clean,
    leases,
    moved,
    owned_by,
    sent_count,
    sink_args,
    wait_for,
    worker_args,
)

from chaos.verdict import read_verdict
from plumbing.pgserver import ServerUnavailable, ThrowawayServer

pytestmark = pytest.mark.e2e

SUBNET = "10.251.7.0/24"
DRAIN_S = 30.0
FEED_S = 120.0
# Both workers wait out the partition on a request instead of giving it up: the
# late reply (a 409) must reach w1 after the link is back.
SEND_TIMEOUT = ("--send-timeout", "30")


@pytest.fixture
def net(monkeypatch: pytest.MonkeyPatch) -> Iterator[Network]:
    with network(SUBNET) as made:
        allow_network_here(monkeypatch, SUBNET)
        yield made


@pytest.fixture
def env(child_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The children's environment with a name guard allowing the test network too."""
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(guard_allowing(SUBNET))
    path = os.pathsep.join(filter(None, [str(guard), child_env.get("PYTHONPATH")]))
    return {**child_env, "PYTHONPATH": path}


@pytest.fixture
def db_host(net: Network) -> Iterator[tuple[Host, ThrowawayServer]]:
    host = net.add_host("db")
    try:
        server = ThrowawayServer(listen=(host.address, SUBNET))
    except ServerUnavailable as exc:
        pytest.skip(f"no PostgreSQL server here: {exc}")
    try:
        host.call(server.start)  # its processes are born in the db host's namespace
        yield host, server
    finally:
        server.remove()


def start(procs: Processes, host: Host, name: str, args: list[str]) -> Proc:
    return procs.start(name, args, prefix=host.command(), call=host.call)


@pytest.mark.timeout(90)
def test_a_worker_cut_off_past_its_lease_is_fenced_and_nothing_is_lost_or_reordered(
    net: Network,
    db_host: tuple[Host, ThrowawayServer],
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    db, server = db_host
    source = db.call(lambda: server.create_database("src"))
    sink_db = db.call(lambda: server.create_database("inbox"))
    sink_host, h1, h2 = (net.add_host(name) for name in ("sink", "w1", "w2"))
    procs = Processes(tmp_path, env)
    try:
        on_sink = ("--host", sink_host.address, "--insecure")
        slow = start(
            procs,
            sink_host,
            "sink-slow",
            sink_args(sink_db, *on_sink, "--chaos", f"stall={HOLD_S}"),
        )
        prompt = start(procs, sink_host, "sink-prompt", sink_args(sink_db, *on_sink))
        allow = ("--allow-host", sink_host.address, *SEND_TIMEOUT)
        w1 = start(procs, h1, "w1", worker_args(source, "w1", [slow.url, prompt.url], *allow))
        w2 = start(procs, h2, "w2", worker_args(source, "w2", [prompt.url, slow.url], *allow))
        # The orders go to the intake of the worker that is never cut off.
        feeder = Feeder(lambda: [w2], call=lambda feed: h2.call(feed, timeout_s=FEED_S))
        feeder.start()
        try:
            in_db: Any = db.call
            wait_for(lambda: owned_by(in_db(lambda: leases(source)), "w1"), what="w1 holding lines")
            time.sleep(0.5)  # its first requests are now held by the slow sink
            held = owned_by(in_db(lambda: leases(source)), "w1")
            net.partition(h1)

            wait_for(lambda: in_db(lambda: moved(source, held, "w1")), what="w1's lines taken")
            late = wait_for(
                lambda: slow.metrics().get(LEASE_FENCED, 0), what="a late request refused"
            )
            orders_while_cut = len(feeder.accepted)
            wait_for(lambda: len(feeder.accepted) > orders_while_cut + 30, what="orders meanwhile")
            net.heal(h1)

            def fenced() -> float:
                found = w1.metrics()
                return found.get("publisher_fenced_requests_total", 0) + found.get(
                    "publisher_fenced_writes_total", 0
                )

            told = wait_for(fenced, timeout_s=20, what="w1 told it was fenced")
        finally:
            feeder.stop()
        accepted = feeder.accepted
        wait_for(lambda: in_db(lambda: sent_count(source)) >= len(accepted), DRAIN_S, "all sent")
        verdict = in_db(lambda: read_verdict(source, sink_db, accepted, "sku"))
        in_db(lambda: assert_clean(verdict, source, sink_db, len(accepted)))
    finally:
        with contextlib.suppress(Exception):
            net.heal(h1)
        procs.stop_all()

    assert late >= 1  # the sink refused w1's requests held across the takeover
    assert told >= 1  # and w1, back on the network, learnt it (409s or refused marks)
