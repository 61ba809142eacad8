"""One batch delivered in order: the library's `dispatch` and `dispatch_batch`, and
`publisher dispatch`. Each is one run of the delivery driver over a single read.

`dispatch` and `dispatch_batch` take any store with `pending(limit)` and
`mark_sent(event_id)` (or `mark_sent_many(event_ids)`), so a caller can wrap or
replace the Outbox; `deliver_pending` is what the CLI runs on an Outbox, keeping
each verified ACK with its mark. Beside relay workers it delivers under leases:
those of the global line and of every lane in its batch, taken first and released
at the end, or LineHeld when another worker holds one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from publisher.driver import AfterDelivery, Driver, OutboxLine, Result, Sender, Verified
from publisher.errors import LeaseLost, NotAcknowledged, OutboxError
from publisher.leases import LeaseKeeper
from publisher.settings import RelaySettings
from publisher.store import Mark, Outbox, Pending, check_limit
from shared import GLOBAL_LINE, MAX_BATCH, Event, Lease

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
        return [Pending(n, event, 0) for n, event in enumerate(await self.pending(limit))]

    async def mark(self, marks: list[Mark], lease: Lease | None) -> None:
        async with self._lock:
            await self.mark_ids([mark.event_id for mark in marks])


def _marking_each(store: PendingStore) -> Callable[[list[str]], Awaitable[None]]:
    async def mark_each(event_ids: list[str]) -> None:
        for event_id in event_ids:
            await store.mark_sent(event_id)

    return mark_each


def _collect(marked: list[str]) -> Callable[..., None]:
    """A Reporter that keeps the delivered IDs: all marked once `run` returns."""

    def report(delivered: list[Pending], *_: object) -> None:
        marked.extend(row.event["id"] for row in delivered)

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
    outbox: BatchStore,
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
    line = _PlainLine(outbox.pending, outbox.mark_sent_many)
    return await _run_once(line, _Callbacks(send_batch=send_batch), settings, after_delivery)


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
    report = _collect(marked)
    driver = Driver(line, sender, settings, once=True, after_delivery=after_delivery, report=report)
    await driver.run()
    return marked


class LineHeld(OutboxError):
    """Another worker holds the lease of a line this dispatch would deliver."""

    def __init__(self, line: str, owner: str | None, expires_in_s: float | None) -> None:
        left = "" if expires_in_s is None else f" for {max(expires_in_s, 0.0):.1f} s more"
        super().__init__(
            f"line {line!r} is being delivered by relay worker {owner or 'another worker'}"
            f"{left}: dispatch delivers nothing beside it"
        )
        self.line = line
        self.owner = owner


TAKE_ROUNDS: Final = 3  # reads of the batch while taking its lanes' leases


async def deliver_pending(
    outbox: Outbox,
    sender: Sender,
    settings: RelaySettings,
    after_delivery: AfterDelivery | None = None,
) -> list[str]:
    """One batch of the Outbox delivered through `sender` (`publisher dispatch`): one
    request per entry, or one for the batch (`settings.batch`), up to
    `settings.limit` entries; each verified ACK is kept with its mark.
    On a failure about an entry, the attempt is recorded on it before the failure is
    raised.

    With `settings.worker`, the batch is delivered under leases, as a relay worker would: the
    global line's (carried by every request and fencing every write) and that of
    each lane (SKU) in the batch, all taken before anything is sent and released at
    the end; LineHeld, nothing sent, if another worker holds any of them."""
    if settings.worker is None:
        return await _deliver(outbox, sender, settings, after_delivery, None)
    keeper = LeaseKeeper(outbox, settings.worker)
    await keeper.start()
    try:
        lease = await _take_lines(outbox, keeper, settings.limit)
        return await _deliver(outbox, sender, settings, after_delivery, lease, keeper)
    finally:
        await keeper.stop()


async def _take_lines(outbox: Outbox, keeper: LeaseKeeper, limit: int) -> Lease:
    """The global line's lease, and those of the lanes of the next batch (read again
    until every lane in it is held, a few times at most)."""
    lease = await _take(outbox, keeper, GLOBAL_LINE)
    for _ in range(TAKE_ROUNDS):
        lanes = {row.event["sku"] for row in await outbox.pending_batch(limit)}
        if all(keeper.held(lane) for lane in lanes):
            return lease
        for lane in sorted(lanes):
            await _take(outbox, keeper, lane)
    raise LineHeld(GLOBAL_LINE, None, None)  # lanes kept changing under it: try again


async def _take(outbox: Outbox, keeper: LeaseKeeper, line: str) -> Lease:
    lease = await keeper.take(line)
    if lease is None:
        held = await outbox.lease_of(line)
        if held is None:
            raise LineHeld(line, None, None)
        raise LineHeld(line, held.owner, held.expires_in_s)
    return lease


async def _deliver(
    outbox: Outbox,
    sender: Sender,
    settings: RelaySettings,
    after_delivery: AfterDelivery | None,
    lease: Lease | None,
    keeper: LeaseKeeper | None = None,
) -> list[str]:
    marked: list[str] = []
    driver = Driver(
        OutboxLine(outbox),
        sender,
        settings,
        once=True,
        after_delivery=after_delivery,
        may_send=lambda: keeper is None or keeper.holds(lease),
        report=_collect(marked),
    )
    try:
        await driver.run(lease)
    except Exception as exc:
        if driver.failed_entry is not None and not isinstance(exc, LeaseLost):
            await outbox.record_failure(driver.failed_entry.event["id"], str(exc), lease)
        raise
    return marked
