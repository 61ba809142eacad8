"""dispatch: deliver one batch in order, marking each entry only after a verified ACK."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Protocol

from publisher.errors import NotAcknowledged
from publisher.outbox import MAX_BATCH, check_limit
from shared import Event

Send = Callable[[Event], Awaitable[object]]
AfterDelivery = Callable[[str], object]


class OutboxStore(Protocol):
    """What dispatch needs from an outbox backend."""

    async def pending(self, limit: int = MAX_BATCH) -> list[Event]: ...

    async def mark_sent(self, event_id: str) -> None: ...


async def dispatch(
    outbox: OutboxStore,
    send: Send,
    limit: int = MAX_BATCH,
    after_delivery: AfterDelivery | None = None,
) -> list[str]:
    """Send up to `limit` pending entries in order; return the IDs marked sent.

    Stops at the first failure: an exception from `send` propagates as the same
    object, a result other than `True` raises NotAcknowledged. Entries marked before
    the failure stay marked; the failed one and all after it stay pending.
    """
    check_limit(limit)
    # pending() has fetched and closed its statement: no lock is held while sending.
    batch = await outbox.pending(limit)
    marked: list[str] = []
    for event in batch:
        # The ID is taken here and the callback gets a copy: a callback that mutates
        # its argument cannot redirect the mark. Events hold only str and int values.
        event_id = event["id"]
        result = await send(event.copy())
        if result is not True:
            raise NotAcknowledged(f"send returned {result!r} for {event_id!r}, not True")
        if after_delivery is not None:
            hooked = after_delivery(event_id)
            if inspect.isawaitable(hooked):
                await hooked
        await outbox.mark_sent(event_id)
        marked.append(event_id)
    return marked
