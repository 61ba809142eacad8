"""A frozen PostgreSQL server (every process of it stopped: what a stalled disk or a
black-holed network looks like, the TCP connections staying open) bounds every call
of both sides by the URI's deadline, on a server of the test's own.

Each call on the outbox and the inbox fails with StorageTimeout within the deadline
(and a margin for a loaded machine) instead of hanging; the services answer 503
saying so, /readyz included, with one log line for the lot; the connections that
were cut are not used again, and once the server goes on everything works at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterator
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from pg_faults import frozen
from support import get_json, placed, post_json

from plumbing.pgserver import ThrowawayServer, throwaway_server
from plumbing.storage import BadLocation, StorageError, StorageTimeout
from publisher import Outbox
from publisher.app import ServiceSettings
from publisher.app import create_app as create_publisher
from publisher.retry import RetryPolicy
from publisher.settings import RelaySettings
from sink import create_app as create_sink
from sink.store import Inbox

if TYPE_CHECKING:
    from conftest import Serve

DEADLINE_S = 1.5
MARGIN_S = 2.0  # past the deadline, for a loaded machine of 2 CPUs
HANG_S = 15.0  # what a call that is not bounded is given before the test says so
UNANSWERED = f"did not answer within {DEADLINE_S:g} s"


@pytest.fixture
def own_server(pg_server: ThrowawayServer) -> Iterator[ThrowawayServer]:
    """A PostgreSQL server for this test alone: the test freezes it. (Through
    pg_server, a machine without PostgreSQL skips, or fails under CI.)"""
    with throwaway_server() as server:
        yield server


def with_deadline(url: str) -> str:
    return f"{url}?deadline={DEADLINE_S}"


async def timed(call: Awaitable[Any]) -> tuple[float, BaseException | None]:
    """How long `call` took to fail, and with what (None: it did not fail). A call
    still running after HANG_S is given up: TimeoutError."""
    started = time.monotonic()
    try:
        await asyncio.wait_for(call, HANG_S)
    except Exception as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


async def test_every_call_of_both_sides_fails_within_the_deadline_then_works_at_once(
    own_server: ThrowawayServer,
) -> None:
    source = with_deadline(own_server.create_database("source"))
    sink = with_deadline(own_server.create_database("sink"))
    async with Outbox.open(source) as outbox, Inbox.open(sink) as inbox:
        assert await outbox.accept({"id": "a", "sku": "snack", "qty": 1}) == "accepted"
        await inbox.receive(placed("a"))
        with frozen(own_server):
            calls: list[Awaitable[Any]] = [
                outbox.check_writable(),
                outbox.accept({"id": "b", "sku": "snack", "qty": 1}),
                outbox.snapshot(),
                outbox.pending_batch(),
                inbox.check_writable(),
                inbox.receive(placed("b")),
                inbox.record("a"),
            ]
            outcomes = [await timed(call) for call in calls]
        for took, exc in outcomes:
            assert isinstance(exc, StorageTimeout), (took, exc)
            assert UNANSWERED in str(exc), exc
            assert took <= DEADLINE_S + MARGIN_S, (took, exc)
        # Going on: the cut connections are gone, new ones work at once. "b" may have
        # committed as the server went on (its COMMIT was on the wire): then a duplicate.
        assert await outbox.accept({"id": "b", "sku": "snack", "qty": 1}) in (
            "accepted",
            "duplicate",
        )
        await outbox.check_writable()
        await inbox.check_writable()
        await inbox.receive(placed("b"))
        record = await inbox.record("b")
        assert record is not None


async def test_a_call_that_must_wait_for_a_connection_ends_within_the_deadline_too(
    own_server: ThrowawayServer,
) -> None:
    url = own_server.create_database("source") + f"?deadline={DEADLINE_S}&pool_max=1"
    async with Outbox.open(url) as outbox:
        with frozen(own_server):
            # The one connection hangs in the first; the second waits for it, then
            # opens one of its own (the first was cut) on a server that answers nothing.
            outcomes = await asyncio.gather(
                timed(outbox.check_writable()), timed(outbox.check_writable())
            )
        for took, exc in outcomes:
            assert isinstance(exc, StorageError), exc
            assert took <= DEADLINE_S + MARGIN_S, (took, exc)
        await outbox.check_writable()


async def test_the_services_answer_503_within_the_deadline_with_one_log_line(
    own_server: ThrowawayServer,
    serve: Serve,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = await serve(create_sink(with_deadline(own_server.create_database("sink"))))
    settings = ServiceSettings(
        db=with_deadline(own_server.create_database("source")),
        sink=f"{sink}/events",
        relay=RelaySettings(poll_interval_s=0.1, retry=RetryPolicy(base_s=0.05, cap_s=0.3)),
    )
    publisher = await serve(create_publisher(settings))
    order = {"id": "o1", "sku": "snack", "qty": 1}
    assert (await post_json(client, f"{publisher}/orders", order))[0] == 201
    for base in (sink, publisher):
        assert await get_json(client, f"{base}/readyz") == (200, {"status": "ready"})
    caplog.set_level(logging.ERROR, logger="plumbing.web")
    with frozen(own_server):
        replies = []
        for n in range(3):
            for url, body in (
                (f"{publisher}/orders", {"id": f"f{n}", "sku": "snack", "qty": 1}),
                (f"{sink}/events", {"id": f"s{n}", "sku": "snack", "qty": 1}),
            ):
                replies.append(await timed_reply(client.post(url, json=body)))
        for base in (sink, publisher):
            replies.append(await timed_reply(client.get(f"{base}/readyz")))
    for took, status, body in replies:
        assert status == 503, (status, body)
        assert took <= DEADLINE_S + MARGIN_S, (took, body)
        assert UNANSWERED in body.get("reason", ""), body
    said = [r.getMessage() for r in caplog.records if UNANSWERED in r.getMessage()]
    # One line per service for its five intake 503s (the log is throttled per reason).
    assert len([line for line in said if "storage failed" in line]) == 2, said
    for base in (sink, publisher):
        assert await get_json(client, f"{base}/readyz") == (200, {"status": "ready"})
    status, reply = await post_json(client, f"{publisher}/orders", {**order, "id": "after"})
    assert status == 201, reply


async def timed_reply(request: Any) -> tuple[float, int, Any]:
    """(seconds taken, status, parsed JSON body) of one request, given up after HANG_S."""
    started = time.monotonic()
    async with asyncio.timeout(HANG_S):
        async with request as response:
            body = await response.json()
    return time.monotonic() - started, response.status, body


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1e3", "3601", "٣", ""])
def test_a_deadline_that_is_not_a_number_of_seconds_is_refused(value: str) -> None:
    from pg_tx import parse

    with pytest.raises(BadLocation, match="deadline"):
        parse(f"postgresql://u@127.0.0.1:5432/db?deadline={value}")
    assert parse("postgresql://u@127.0.0.1:5432/db?deadline=2.5").deadline_s == 2.5
    assert parse("postgresql://u@127.0.0.1:5432/db").deadline_s > 0
