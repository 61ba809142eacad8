"""A sink that answers "fenced" to a line the outbox still holds, on both backends.

An outbox behind its sink (restored from an older backup: the sink has seen a later
epoch of a line than the outbox ever made) crosses the gap in one step: the line's
lease is taken again past the epoch the sink names, and the next request is
delivered. A sink that fences every request (a forged reply, or one that names no
epoch) gets one request per backoff, each an attempt recorded on the head entry, and
the metrics say so. The real sink on loopback for the first; a stand-in that always
answers 409 "fenced" for the second. Every loop here is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import pytest
from aiohttp import web
from relay_lines import running, sender_for
from support import accept_events, eventually, placed

from plumbing.http_errors import Handler, Middleware
from publisher.errors import FencedBySink
from publisher.http import check_reply
from publisher.metrics import PublisherMetrics
from publisher.relay import Relay
from publisher.retry import RetryPolicy
from publisher.settings import Ordering, RelaySettings, WorkerSettings
from publisher.store import Outbox
from shared import GLOBAL_LINE, LEASE_HEADER, Lease, Order, parse_lease
from shared.protocol import MAX_EPOCH
from sink.app import create_app

if TYPE_CHECKING:
    from conftest import Databases, Query, Serve

TTL_S = 30.0  # no lease runs out within a test: every take here is the relay's own
POLL_S = 0.05
SEEN = 50  # the epoch the sink has seen of the line, the outbox being at none yet
# A fence that is backed off waits at least this long here: a slow policy, so that a
# relay that does not back off (or crosses again and again) shows at once.
SLOW = RetryPolicy(base_s=0.2, cap_s=0.4)
HALF: float = 0.5  # the jitter's draw: every wait is half its ceiling
RUN_S = 2.0  # how long a sink that always fences is left to the relay
UNSENT = "SELECT count(*) FROM outbox_entries WHERE sent = 0"


def orders(count: int) -> list[Order]:
    return [{"id": f"o{n:04d}", "sku": "snack", "qty": 1} for n in range(count)]


def line_of(ordering: Ordering) -> str:
    """The one line the orders here make: the global line, or the lane of "snack"."""
    return GLOBAL_LINE if ordering == "global" else "snack"


def metric(metrics: PublisherMetrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


@contextlib.asynccontextmanager
async def relay_running(
    outbox: Outbox, url: str, ordering: Ordering, metrics: PublisherMetrics
) -> AsyncIterator[Relay]:
    """A relay worker on `outbox` sending to `url`, stopped (bounded) on exit."""
    settings = RelaySettings(
        retry=SLOW,
        poll_interval_s=POLL_S,
        ordering=ordering,
        pipeline=1,
        worker=WorkerSettings("w1", TTL_S),
    )
    async with sender_for(url) as sender:
        relay = Relay(
            outbox,
            sender,
            settings,
            observer=metrics,
            lease_observer=metrics,
            rand=lambda: HALF,
        )
        async with running(relay):
            yield relay


async def lease_epoch(outbox: Outbox, line: str) -> int:
    lease = await outbox.lease_of(line)
    assert lease is not None
    return lease.epoch


# ---------------------------------------------------------------- the store's take


@pytest.fixture
async def outbox(databases: Databases) -> AsyncIterator[Outbox]:
    async with Outbox.open(databases.source) as opened:
        yield opened


async def test_a_take_past_an_epoch_lands_one_above_it_in_one_step(outbox: Outbox) -> None:
    assert await outbox.take_lease_past("snack", "w1", TTL_S, SEEN) == SEEN + 1
    assert await outbox.take_lease("snack", "w1", TTL_S) == SEEN + 2
    # An epoch below the line's own changes nothing of the rule: one more than the last.
    assert await outbox.take_lease_past("snack", "w1", TTL_S, 3) == SEEN + 3
    # The last epoch a lease can have is reached; none can be taken above it.
    assert await outbox.take_lease_past("juice", "w1", TTL_S, MAX_EPOCH - 1) == MAX_EPOCH
    for seen in (MAX_EPOCH, -1, True):
        with pytest.raises(ValueError, match="no lease epoch can be above"):
            await outbox.take_lease_past("tea", "w1", TTL_S, seen)
    assert await outbox.lease_of("tea") is None


async def test_a_take_past_an_epoch_is_refused_while_another_worker_holds_the_line(
    outbox: Outbox,
) -> None:
    assert await outbox.take_lease(GLOBAL_LINE, "w2", TTL_S) == 1
    assert await outbox.take_lease_past(GLOBAL_LINE, "w1", TTL_S, SEEN) is None
    row = await outbox.lease_of(GLOBAL_LINE)
    assert row is not None and (row.owner, row.epoch) == ("w2", 1)


# ---------------------------------------------------------------- an outbox behind its sink


@dataclass
class Counted:
    """The requests a relay sent, with the epoch of each and the fenced among them."""

    epochs: list[int] = field(default_factory=list)
    fenced: int = 0


def counting(counted: Counted) -> Middleware:
    """In front of the real sink: each POST's lease epoch, and its 409s of fencing."""

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        lease = request.headers.get(LEASE_HEADER)
        if request.method == "POST" and lease is not None:
            counted.epochs.append(parse_lease(lease).epoch)
        response = await handler(request)
        counted.fenced += response.status == 409
        return response

    return count


@pytest.mark.parametrize("ordering", ["global", "sku"])
async def test_an_outbox_behind_its_sink_crosses_the_gap_in_one_step(
    databases: Databases, serve: Serve, db_rows: Query, ordering: Ordering
) -> None:
    counted = Counted()
    app = create_app(databases.sink)
    app.middlewares.insert(0, counting(counted))
    url = f"{await serve(app)}/events"
    line = line_of(ordering)
    metrics = PublisherMetrics()
    async with Outbox.open(databases.source) as outbox:
        await accept_events(outbox, orders(3))
        # The sink has seen epoch SEEN of the line from this outbox (an older backup of
        # it sent o0000 under it): every epoch the outbox takes from 1 up is below it.
        async with sender_for(url) as sender:
            await sender.deliver(placed("o0000"), lease=Lease(outbox.source, line, SEEN))
        counted.epochs.clear()
        started = time.monotonic()
        async with relay_running(outbox, url, ordering, metrics):
            await eventually(
                lambda: db_rows(databases.source, UNSENT) == [(0,)],
                timeout_s=10.0,
                what="every entry delivered",
            )
        took_s = time.monotonic() - started
        assert await lease_epoch(outbox, line) == SEEN + 1
    # One fenced request (epoch 1), then the lease past SEEN and nothing fenced again:
    # no climb of one epoch per request, and no backoff (SLOW) on the way.
    assert counted.fenced == 1
    assert counted.epochs[0] == 1 and len(counted.epochs) >= 2
    assert set(counted.epochs[1:]) == {SEEN + 1}
    assert took_s < 5.0
    assert metric(metrics, "publisher_fenced_requests_total") == 1
    assert metric(metrics, "publisher_fenced_gaps_crossed_total") == 1
    assert metric(metrics, "publisher_delivery_attempts_total", outcome="fenced") == 1
    # The fenced request is an attempt on its entry, as any failed one (the delivery
    # that followed is one more).
    assert db_rows(
        databases.source, "SELECT id, sent, attempts FROM outbox_entries ORDER BY seq"
    ) == [("o0000", 1, 2), ("o0001", 1, 1), ("o0002", 1, 1)]
    applied = db_rows(databases.sink, "SELECT id FROM inbox_events ORDER BY applied_seq")
    assert applied == [("o0000",), ("o0001",), ("o0002",)]


# ---------------------------------------------------------------- a sink that always fences

Reply = Literal["seen ahead", "no seen"]


@dataclass
class AlwaysFenced:
    """A sink stand-in that answers 409 "fenced" to every request: naming an epoch one
    above the request's ("seen ahead": crossable, once), or none ("no seen")."""

    reply: Reply
    epochs: list[int] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self._fence)
        app.router.add_post("/events/batch", self._fence)
        return app

    async def _fence(self, request: web.Request) -> web.Response:
        await request.read()
        lease = parse_lease(request.headers[LEASE_HEADER])
        self.epochs.append(lease.epoch)
        fenced: dict[str, object] = {
            "source": lease.source,
            "line": lease.line,
            "epoch": lease.epoch,
        }
        if self.reply == "seen ahead":
            fenced["seen"] = lease.epoch + 1
        return web.json_response({"error": "stale lease", "fenced": fenced}, status=409)


@pytest.mark.parametrize("reply", ["seen ahead", "no seen"])
async def test_a_sink_that_always_fences_gets_one_request_per_backoff(
    databases: Databases, serve: Serve, db_rows: Query, reply: Reply
) -> None:
    stub = AlwaysFenced(reply)
    url = f"{await serve(stub.app())}/events"
    metrics = PublisherMetrics()
    async with Outbox.open(databases.source) as outbox:
        await accept_events(outbox, orders(2))
        async with relay_running(outbox, url, "global", metrics):
            await asyncio.sleep(RUN_S)
        head = (await outbox.snapshot()).head
        epoch = await lease_epoch(outbox, GLOBAL_LINE)
    requests = len(stub.epochs)
    # Waits of 0.1 (or none, for a crossing), 0.2, then 0.2 s each (SLOW, jitter
    # drawn at HALF): about 11 in RUN_S. A relay that does not back off sends
    # hundreds; one that crosses at each fence, twice as many as this.
    most = 3 + RUN_S / (SLOW.cap_s * HALF)
    assert 3 <= requests <= most, stub.epochs
    # One crossing at most, past the epoch named, and never again on that lease.
    crossed = [1] + [3] * (requests - 1) if reply == "seen ahead" else [1] * requests
    assert stub.epochs == crossed
    assert epoch == crossed[-1]
    # Each fenced request is an attempt on the head, as `status` and the console show.
    assert head is not None and head.id == "o0000"
    assert head.attempts == requests
    assert head.last_error is not None and "fenced by the sink" in head.last_error
    assert db_rows(databases.source, "SELECT id, attempts FROM outbox_entries ORDER BY seq") == [
        ("o0000", requests),
        ("o0001", 0),
    ]
    assert metric(metrics, "publisher_fenced_requests_total") == requests
    assert metric(metrics, "publisher_delivery_attempts_total", outcome="fenced") == requests
    assert metric(metrics, "publisher_fenced_gaps_crossed_total") == (reply == "seen ahead")


@pytest.mark.parametrize(
    ("seen", "named"), [("9", 9), ("true", None), ('"9"', None), ("null", None)]
)
def test_a_fenced_reply_names_the_epoch_seen_only_as_an_integer(
    seen: str, named: int | None
) -> None:
    body = f'{{"fenced": {{"source": "s", "line": "*", "epoch": 2, "seen": {seen}}}}}'
    with pytest.raises(FencedBySink) as caught:
        check_reply(409, body.encode(), "o0000", lease=Lease("s", GLOBAL_LINE, 2))
    assert (caught.value.epoch, caught.value.seen) == (2, named)
    assert "fenced by the sink" in str(caught.value)
