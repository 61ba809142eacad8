"""What the tests of a relay's lines share: the orders they accept, the lines those
make (one in global order, one per SKU) and a relay running in a task. Bounded
waits, accepting the orders and what the outbox says was sent are in `support`."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from support import Callables

from publisher.delivery_log import Observer
from publisher.driver import AfterDelivery
from publisher.http import HttpSender
from publisher.relay import Relay
from publisher.retry import RetryPolicy
from publisher.settings import Ordering, RelaySettings
from publisher.store import Outbox
from shared import Event

if TYPE_CHECKING:
    pass

Mode = Literal["single", "batch"]
MODES: list[Mode] = ["single", "batch"]
ORDERINGS: list[Ordering] = ["global", "sku"]
BATCH_LIMIT = 4  # batch mode: requests of 4, so a short backlog still makes many requests
FAST = RetryPolicy(base_s=0.01, cap_s=0.05)
POLL_INTERVAL_S = 0.05
SEND_TIMEOUT_S = 3.0
STOP_TIMEOUT_S = 5.0
SKUS = ("snack", "juice", "tea")
Line = str | None


def relay_of(
    outbox: Outbox,
    deliver: Callable[..., Any],
    *,
    deliver_batch: Callable[..., Any] | None = None,
    predecessor_checked: Callable[[str], bool] | None = None,
    observer: Observer | None = None,
    after_delivery: AfterDelivery | None = None,
    rand: Callable[[], float] = random.random,
    **settings: Any,
) -> Relay:
    """A Relay over these callables (support.Callables), with RelaySettings from
    `settings`: batch delivery when `deliver_batch` is given, one request in flight
    per line unless `pipeline` says otherwise."""
    settings.setdefault("pipeline", 1)
    return Relay(
        outbox,
        Callables(deliver, deliver_batch, predecessor_checked),
        RelaySettings(batch=deliver_batch is not None, **settings),
        observer=observer,
        after_delivery=after_delivery,
        rand=rand,
    )


class Sender(Protocol):
    """HttpSender, or a test's wrapper of it."""

    @property
    def deliver(self) -> Callable[..., Any]: ...

    @property
    def deliver_batch(self) -> Callable[..., Any]: ...


def relay_for(outbox: Outbox, sender: Sender, mode: Mode, **options: Any) -> Relay:
    """A relay sending through `sender`, one event per request or (`mode` batch) in
    requests of BATCH_LIMIT, with the fast retry and poll settings unless `options`
    (RelaySettings and relay_of's) say otherwise."""
    options.setdefault("retry", FAST)
    options.setdefault("poll_interval_s", POLL_INTERVAL_S)
    options.setdefault("rand", random.Random(7).random)
    if mode == "batch":
        options.setdefault("limit", BATCH_LIMIT)
    batch = sender.deliver_batch if mode == "batch" else None
    return relay_of(outbox, sender.deliver, deliver_batch=batch, **options)


@contextlib.asynccontextmanager
async def running(relay: Relay) -> AsyncIterator[asyncio.Task[None]]:
    """The relay's loop in a task; stopped (bounded) on exit, a crash of it raised."""
    task = asyncio.create_task(relay.run())
    try:
        yield task
        assert not task.done(), f"the relay loop ended: {task!r}"
    finally:
        relay.stop()
        try:
            await asyncio.wait_for(task, STOP_TIMEOUT_S)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def sender_for(url: str) -> HttpSender:
    return HttpSender(url, timeout_s=SEND_TIMEOUT_S, connect_timeout_s=1.0)


def orders(count: int, start: int = 0, skus: tuple[str, ...] = SKUS) -> list[Event]:
    """`count` orders in seq order, SKUs interleaved, each its own quantity."""
    return [
        {"id": f"e{n:03d}", "sku": skus[n % len(skus)], "qty": n + 1}
        for n in range(start, start + count)
    ]


def lines(events: list[Event], ordering: Ordering) -> dict[Line, list[str]]:
    """Each line's IDs in seq order: one line in global order, one per SKU in lanes."""
    keyed: dict[Line, list[str]] = {}
    for e in events:
        keyed.setdefault(None if ordering == "global" else e["sku"], []).append(e["id"])
    return keyed
