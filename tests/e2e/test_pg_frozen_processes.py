"""A frozen PostgreSQL server under real service processes: every process of a server
of the test's own stopped (SIGSTOP), as a stalled disk or a black-holed network looks
to a client, whose TCP connections stay open and get no answer.

A real sink and a real `publisher serve` run on two databases of that server with a
deadline of DEADLINE_S in their URIs. While it is frozen, intake answers 503 within
the deadline (and a margin) saying why, both /readyz answer 503 as fast, a sink read
too, and each service logs the failure once, not once per request; the relay's
requests to the sink fail the same way. Once the server goes on (SIGCONT), the
client sends every refused order again with its ID, as a client does; then every
order is applied exactly once (the verdict, read with connections of this process:
0 lost, 0 applied twice), a refused order whose commit went through answered as a
duplicate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from pg_faults import frozen
from support import http_request, post_order, serve_args, wait_until

from chaos.verdict import read_verdict
from plumbing.pgserver import ThrowawayServer, throwaway_server

if TYPE_CHECKING:
    from conftest import StartPublisher, StartSink

pytestmark = pytest.mark.e2e

DEADLINE_S = 2
MARGIN_S = 2.5  # past the deadline, for a loaded machine of 2 CPUs
HANG_S = 20.0  # an answer later than this is a hang
SKUS = ("snack", "juice")
BEFORE, DURING = 20, 3
UNANSWERED = f"did not answer within {DEADLINE_S} s"
FAST_RETRIES = ["--poll-interval", "0.2", "--retry-base", "0.02", "--retry-cap", "0.3"]
DRAIN_S = 60.0
RESEND_ROUNDS = 20


@pytest.fixture
def own_server(pg_server: ThrowawayServer) -> Iterator[ThrowawayServer]:
    """A PostgreSQL server for this test alone: the test freezes it. (Through
    pg_server, a machine without PostgreSQL skips, or fails under CI.)"""
    with throwaway_server() as server:
        yield server


def order(n: int) -> dict[str, Any]:
    return {"id": f"order-{n:03d}", "sku": SKUS[n % len(SKUS)], "qty": 1 + n % 3}


def timed(request: Callable[[], tuple[int, Any]]) -> tuple[float, int, Any]:
    started = time.monotonic()
    status, body = request()
    return time.monotonic() - started, status, body


@pytest.mark.timeout(180)
def test_a_frozen_server_is_answered_503_within_the_deadline_and_nothing_is_lost(
    own_server: ThrowawayServer, sink_process: StartSink, publisher_process: StartPublisher
) -> None:
    source = own_server.create_database("source")
    sink_db = own_server.create_database("sink")
    sink = sink_process(f"{sink_db}?deadline={DEADLINE_S}")
    publisher = publisher_process(
        *serve_args(f"{source}?deadline={DEADLINE_S}", sink.url, *FAST_RETRIES)
    )
    accepted: dict[str, tuple[str, int]] = {}
    for n in range(BEFORE):
        assert post_order(publisher.port, order(n))[0] == 201
        accepted[order(n)["id"]] = (order(n)["sku"], order(n)["qty"])
    refused: list[dict[str, Any]] = []
    answers = []
    with frozen(own_server):
        for n in range(BEFORE, BEFORE + DURING):
            took, status, body = timed(lambda n=n: post_order(publisher.port, order(n), HANG_S))
            answers.append((took, status, body))
            refused.append(order(n))
        for port, path in (
            (publisher.port, "/readyz"),
            (sink.port, "/readyz"),
            (sink.port, "/inventory/snack"),
        ):
            answers.append(
                timed(lambda p=port, q=path: http_request(p, "GET", q, timeout_s=HANG_S))
            )
    for took, status, body in answers:
        assert status == 503, (status, body)
        assert took <= DEADLINE_S + MARGIN_S, (took, body)
        assert UNANSWERED in str(body), body
    # Going on: the client sends each refused order again, with its ID.
    for _ in range(RESEND_ROUNDS):
        for one in list(refused):
            status, body = post_order(publisher.port, one, HANG_S)
            if status in (200, 201):  # 200: its commit went through as the server froze
                refused.remove(one)
                accepted[one["id"]] = (one["sku"], one["qty"])
        if not refused:
            break
        time.sleep(0.5)
    assert refused == []
    wait_until(
        lambda: http_request(publisher.port, "GET", "/status", timeout_s=HANG_S)[1]["pending"] == 0,
        DRAIN_S,
    )
    verdict = read_verdict(source, sink_db, accepted)
    assert (verdict.lost, verdict.applied_twice, verdict.order_inversions) == (0, 0, 0), verdict
    assert verdict.inventory_ok and verdict.accepted == verdict.delivered == len(accepted)
    # Both processes rode it out, and said so once per interval, not once per request.
    assert publisher.proc.poll() is None and sink.proc.poll() is None
    for log in (publisher.log, sink.log):
        lines = [line for line in log.read_text().splitlines() if UNANSWERED in line]
        assert lines, log.read_text()[-2000:]
    intake_lines = [
        line
        for line in publisher.log.read_text().splitlines()
        if "storage failed" in line and UNANSWERED in line
    ]
    assert 1 <= len(intake_lines) <= 2, intake_lines  # one per 10 s interval at most
