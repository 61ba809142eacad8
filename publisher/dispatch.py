"""The library's one-batch delivery: `dispatch` and `dispatch_batch`, each one run
of the delivery driver over a single read.

They take any store with `pending(limit)` and `mark_sent(event_id)` (or
`mark_sent_many(event_ids)`), so a caller can wrap or replace the Outbox, and plain
callbacks that return True for a verified delivery. (`publisher dispatch`, which
delivers an Outbox over HTTP under leases, is publisher.cli.dispatch.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from publisher.driver import AfterDelivery, Driver, Result, Verified
from publisher.errors import NotAcknowledged
from publisher.settings import RelaySettings
from publisher.store import Mark, Outbox, Pending, check_limit
from shared import MAX_BATCH, Event, Lease

Send = Callable[[Event], Awaitable[object]]
SendBatch = Callable[[list[Event]], Awaitable[Sequence[object]]]


class PendingStore(Protocol):
    """What dispatch needs from an outbox."""

    async def pending(self, limit: int = MAX_BATCH) -> list[Event]: ...

    async def mark_sent(self, event_id: str) -> None: ...


class BatchStore(Protocol):
    """What dispatch_batch needs: the verified prefix marked in one transaction."""

    async def pending(self, limit: int = MAX_BATCH) -> list[Event]: ...

    async def mark_sent_many(self, event_ids: Sequence[str]) -> None: ...


@dataclass
class _PlainLine:
    """A LineStore over a store that knows only `pending` and a way to mark.

    Such a store says nothing of seq or attempts; an entry's place in the batch
    stands in for its seq (dispatch reports neither). Marks run one after another,
    each awaited before the next starts, in the order the entries were delivered.
    """

    pending: Callable[[int], Awaitable[list[Event]]]
    mark_ids: Callable[[list[str]], Awaitable[None]]
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def read(self, limit: int, skip: Collection[str]) -> list[Pending]:
        return [Pending(n, event, 0, None) for n, event in enumerate(await self.pending(limit))]

    async def mark(self, marks: list[Mark], lease: Lease | None) -> None:
        async with self._lock:
            await self.mark_ids([mark.event_id for mark in marks])


def _marking_each(store: PendingStore) -> Callable[[list[str]], Awaitable[None]]:
    async def mark_each(event_ids: list[str]) -> None:
        for event_id in event_ids:
            await store.mark_sent(event_id)

    return mark_each


def collect_delivered(marked: list[str]) -> Callable[..., None]:
    """A Reporter that keeps the delivered IDs in `marked`: all marked once the
    driver's `run` returns."""

    def report(delivered: list[Pending], *_: object) -> None:
        marked.extend(row.id for row in delivered)

    return report


@dataclass(frozen=True)
class _Callbacks:
    """A Sender over the library's plain callbacks: `send(event)` for one event per
    request, `send_batch(events)` for one request. They know nothing of predecessors
    or leases, and a dispatch names neither."""

    send: Send | None = None
    send_batch: SendBatch | None = None

    async def deliver(
        self, event: Event, /, *, after: str | None = None, lease: Lease | None = None
    ) -> Verified:
        assert self.send is not None
        event_id = event["id"]  # before the callback can change its copy
        result = await self.send(event)
        if result is not True:
            raise NotAcknowledged(f"send returned {result!r} for {event_id!r}, not True")
        return None

    async def deliver_batch(
        self, events: Sequence[Event], /, *, after: str | None = None, lease: Lease | None = None
    ) -> Sequence[Result]:
        assert self.send_batch is not None
        ids = [event["id"] for event in events]
        return _batch_results(ids, await self.send_batch(list(events)))

    def predecessor_checked(self, event_id: str | None) -> bool:
        return False


async def dispatch(
    outbox: PendingStore,
    send: Send,
    limit: int = MAX_BATCH,
    after_delivery: AfterDelivery | None = None,
) -> list[str]:
    """Send up to `limit` pending entries in order, one call of `send` each; return
    the IDs marked sent.

    Only a result that `is True` counts: then `after_delivery` runs (sync or async),
    then the entry is marked. Stops at the first failure: an exception from `send`
    propagates as the same object, any other result raises NotAcknowledged. Entries
    marked before the failure stay marked; the failed one and all after it stay
    pending. The mark of an entry overlaps the send of the next one, and is committed
    before dispatch returns or raises.
    """
    settings = _once(limit, batch=False)
    line = _PlainLine(outbox.pending, _marking_each(outbox))
    return await _run_once(line, _Callbacks(send=send), settings, after_delivery)


async def dispatch_batch(
    outbox: BatchStore | Outbox,
    send_batch: SendBatch,
    limit: int = MAX_BATCH,
    after_delivery: AfterDelivery | None = None,
) -> list[str]:
    """Send up to `limit` pending entries in one call of `send_batch`; mark the
    verified prefix.

    `send_batch` gets copies of the entries and returns one result per entry; the
    prefix of results that are `True` is verified. The first other result ends it:
    an exception object is raised as it is, anything else raises NotAcknowledged. An
    exception from `send_batch` itself propagates as the same object. The prefix is
    hooked, then marked in one transaction, before any failure is raised.
    """
    settings = _once(limit, batch=True)
    line = _PlainLine(outbox.pending, _marking_many(outbox))
    return await _run_once(line, _Callbacks(send_batch=send_batch), settings, after_delivery)


def _marking_many(store: BatchStore | Outbox) -> Callable[[list[str]], Awaitable[None]]:
    """`mark_sent_many` of IDs: an Outbox's takes Marks (an ID with its ACK, none
    here), a store of one's own the IDs as BatchStore has them."""
    if isinstance(store, Outbox):
        outbox = store

        async def mark_many(event_ids: list[str]) -> None:
            await outbox.mark_sent_many([Mark(event_id) for event_id in event_ids])

        return mark_many
    return store.mark_sent_many


def _once(limit: int, *, batch: bool) -> RelaySettings:
    """The settings of one read delivered once: no pipeline, no leases (ValueError
    for a `limit` outside 1 to 16)."""
    return RelaySettings(limit=check_limit(limit), batch=batch, pipeline=1, worker=None)


def _batch_results(ids: list[str], results: Sequence[object]) -> list[Result]:
    """True per verified entry becomes a verification without an ACK body; the first
    other result ends the list as a failure."""
    out: list[Result] = []
    for event_id, result in zip(ids, results, strict=False):
        if result is not True:
            if isinstance(result, BaseException):
                out.append(result)
            else:
                out.append(
                    NotAcknowledged(f"send_batch returned {result!r} for {event_id!r}, not True")
                )
            return out
        out.append(None)
    if len(out) < len(ids):
        out.append(NotAcknowledged(f"no result for {ids[len(out)]!r}"))
    return out


async def _run_once(
    line: _PlainLine,
    sender: _Callbacks,
    settings: RelaySettings,
    after_delivery: AfterDelivery | None,
) -> list[str]:
    marked: list[str] = []
    report = collect_delivered(marked)
    driver = Driver(line, sender, settings, once=True, after_delivery=after_delivery, report=report)
    await driver.run()
    return marked
