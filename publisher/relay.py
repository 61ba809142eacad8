"""Delivery in order: `dispatch` for one batch, `Relay` to keep doing it as a service."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from publisher.errors import DeliveryError, InvalidTransition, NotAcknowledged
from publisher.outbox import MAX_BATCH, Outbox, check_limit
from publisher.retry import Random, RetryPolicy, is_permanent, retry_delay_s, should_quarantine
from shared import Event

log = logging.getLogger(__name__)

Send = Callable[[Event], Awaitable[object]]
AfterDelivery = Callable[[str], object]
POLL_INTERVAL_S: Final = 1.0
AUTO_QUARANTINE_BY: Final = "relay (quarantine-after policy)"


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


class BatchStore(OutboxStore, Protocol):
    """What dispatch_batch needs: marking a verified prefix in one transaction."""

    async def mark_sent_many(self, event_ids: Sequence[str]) -> None: ...


SendBatch = Callable[[list[Event]], Awaitable[Sequence[object]]]


async def dispatch_batch(
    outbox: BatchStore,
    send_batch: SendBatch,
    limit: int = MAX_BATCH,
    after_delivery: AfterDelivery | None = None,
) -> list[str]:
    """Send up to `limit` pending entries in one request; mark the verified prefix.

    `send_batch` gets copies of the entries and returns one result per entry; the
    prefix of results that are `True` is verified. The first other result ends it:
    an exception object is raised as it is, anything else raises NotAcknowledged. An
    exception from `send_batch` itself propagates as the same object. The prefix is
    marked in one transaction before any failure is raised, so the contract of
    `dispatch` holds per batch: nothing after a failure is marked.
    """
    check_limit(limit)
    batch = await outbox.pending(limit)
    if not batch:
        return []
    ids = [event["id"] for event in batch]
    results = await send_batch([event.copy() for event in batch])
    verified: list[str] = []
    failure: BaseException | None = None
    for event_id, result in zip(ids, results, strict=False):
        if result is not True:
            failure = (
                result
                if isinstance(result, BaseException)
                else NotAcknowledged(f"send_batch returned {result!r} for {event_id!r}, not True")
            )
            break
        verified.append(event_id)
    if failure is None and len(verified) < len(ids):
        failure = NotAcknowledged(f"no result for {ids[len(verified)]!r}")
    if after_delivery is not None:
        for event_id in verified:
            hooked = after_delivery(event_id)
            if inspect.isawaitable(hooked):
                await hooked
    await outbox.mark_sent_many(verified)
    if failure is not None:
        raise failure
    return verified


class Deliver(Protocol):
    """Sends one event and returns the verified ACK (HttpSender.deliver)."""

    def __call__(self, event: Event, /) -> Awaitable[Mapping[str, object]]: ...


class DeliverBatch(Protocol):
    """Sends events in one request (HttpSender.deliver_batch): verified ACKs, then at
    most one error."""

    def __call__(
        self, events: Sequence[Event], /
    ) -> Awaitable[Sequence[Mapping[str, object] | DeliveryError]]: ...


class EvidenceStore:
    """An OutboxStore for dispatch that keeps the evidence: each verified ACK is
    stored with its mark, and each entry's seq and attempts are at hand for logs.

    Use `send` as dispatch's send callback.
    """

    def __init__(
        self, outbox: Outbox, deliver: Deliver, deliver_batch: DeliverBatch | None = None
    ) -> None:
        self._outbox = outbox
        self._deliver = deliver
        self._deliver_batch = deliver_batch
        self._acks: dict[str, Mapping[str, object]] = {}
        self.batch: dict[str, tuple[int, int]] = {}  # id -> (seq, attempts so far)
        self.current: str | None = None  # the entry being sent, or last sent

    async def pending(self, limit: int = MAX_BATCH) -> list[Event]:
        rows = await self._outbox.pending_batch(limit)
        self.batch = {event["id"]: (seq, attempts) for seq, event, attempts in rows}
        self.current = None
        self._acks.clear()
        return [event for _, event, _ in rows]

    async def send(self, event: Event) -> bool:
        self.current = event["id"]
        self._acks[event["id"]] = await self._deliver(event)
        return True

    async def mark_sent(self, event_id: str) -> None:
        await self._outbox.mark_sent(event_id, self._acks.pop(event_id, None))

    async def send_batch(self, events: list[Event]) -> list[object]:
        """For dispatch_batch: True per verified ACK, then the first failure if any."""
        if self._deliver_batch is None:
            raise RuntimeError("this store was made without a batch sender")
        self.current = events[0]["id"] if events else None
        results: list[object] = []
        for event, result in zip(events, await self._deliver_batch(events), strict=False):
            self.current = event["id"]
            if isinstance(result, DeliveryError):
                results.append(result)
                break
            self._acks[event["id"]] = result
            results.append(True)
        return results

    async def mark_sent_many(self, event_ids: Sequence[str]) -> None:
        marks = [(event_id, self._acks.pop(event_id, None)) for event_id in event_ids]
        await self._outbox.mark_sent_many(marks)


class Observer(Protocol):
    """Receives one call per delivery outcome (metrics)."""

    def delivery(self, outcome: str) -> None: ...


@dataclass(frozen=True)
class Blocked:
    """The head entry is failing: nothing behind it moves (global order)."""

    event_id: str
    reason: str
    since: float
    permanent: bool


class RelayStopping(Exception):
    """The relay was asked to stop; no new send is started."""


class Relay:
    """Dispatches batches until stopped, backing off while the head fails."""

    def __init__(
        self,
        outbox: Outbox,
        deliver: Deliver,
        *,
        limit: int = MAX_BATCH,
        poll_interval_s: float = POLL_INTERVAL_S,
        policy: RetryPolicy | None = None,
        observer: Observer | None = None,
        after_delivery: AfterDelivery | None = None,
        deliver_batch: DeliverBatch | None = None,
        rand: Random = random.random,
    ) -> None:
        """With `deliver_batch`, each step sends its batch in one request (dispatch_batch);
        without it, one request per entry (dispatch)."""
        self._outbox = outbox
        self._limit = check_limit(limit)
        self._poll_interval_s = poll_interval_s
        self._policy = policy or RetryPolicy()
        self._observer = observer
        self._after_delivery = after_delivery
        self._rand = rand
        self._batch_mode = deliver_batch is not None
        self._store = EvidenceStore(outbox, deliver, deliver_batch)
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._streak: tuple[str, int, int] = ("", 0, 0)  # head id, failures, permanent failures
        self.blocked: Blocked | None = None

    def wake(self) -> None:
        """New work arrived: start the next batch now instead of at the next poll."""
        self._wake.set()

    def stop(self) -> None:
        """Finish the send in flight (or let it time out), start no other, then return."""
        self._stop.set()

    async def run(self) -> None:
        """Dispatch until stopped."""
        log.info("relay started", extra={"limit": self._limit})
        while not self._stop.is_set():
            delay_s, wakeable = await self.step()
            await self._sleep(delay_s, wakeable)
        log.info("relay stopped")

    async def step(self) -> tuple[float, bool]:
        """One batch. Returns how long to wait, and whether new intake may cut it short."""
        self._wake.clear()
        try:
            marked = await self._dispatch_once()
        except RelayStopping:
            return 0.0, False
        except Exception as exc:  # the loop outlives any one failure; each is recorded
            try:
                return await self._failed(exc), False
            except Exception as unrecorded:  # recording it failed too (the database, say)
                log.error("could not record a failed attempt: %s", unrecorded)
                return self._policy.cap_s, False
        if marked:
            self.blocked = None
        if len(marked) == self._limit:
            return 0.0, True
        return self._poll_interval_s, True

    async def _dispatch_once(self) -> list[str]:
        if self._batch_mode:
            return await dispatch_batch(
                self._store, self._send_batch, self._limit, self._after_delivery
            )
        return await dispatch(self._store, self._send, self._limit, self._after_delivery)

    async def _send_batch(self, events: list[Event]) -> list[object]:
        if self._stop.is_set():
            raise RelayStopping
        started = time.perf_counter()
        try:
            results = await self._store.send_batch(events)
        except Exception as exc:
            self._log_outcome(events[0]["id"], _outcome(exc), started, exc)
            raise
        for event, result in zip(events, results, strict=False):
            error = result if isinstance(result, BaseException) else None
            self._log_outcome(event["id"], _outcome(error), started, error)
        return results

    async def _send(self, event: Event) -> bool:
        if self._stop.is_set():
            raise RelayStopping
        event_id = event["id"]
        started = time.perf_counter()
        try:
            await self._store.send(event)
        except Exception as exc:
            self._log_outcome(event_id, _outcome(exc), started, exc)
            raise
        self._log_outcome(event_id, "delivered", started)
        return True

    def _log_outcome(
        self, event_id: str, outcome: str, started: float, error: BaseException | None = None
    ) -> None:
        seq, attempts = self._store.batch.get(event_id, (None, 0))
        fields = {
            "event_id": event_id,
            "seq": seq,
            "attempt": attempts + 1,
            "outcome": outcome,
            "latency_ms": round((time.perf_counter() - started) * 1000, 2),
        }
        if error is not None:
            fields["error"] = str(error)
        log.log(logging.INFO if error is None else logging.WARNING, "delivery", extra=fields)
        if self._observer is not None:
            self._observer.delivery(outcome)

    async def _failed(self, exc: Exception) -> float:
        event_id = self._store.current
        if event_id is None or event_id not in self._store.batch:
            # Not a delivery failure (the database, say): back off and try the batch again.
            log.error("relay step failed: %s", exc, exc_info=not isinstance(exc, DeliveryError))
            return retry_delay_s(exc, 1, self._policy, self._rand)
        await self._outbox.record_failure(event_id, str(exc))
        failures, permanent = self._count_failure(event_id, exc)
        since = (
            self.blocked.since
            if self.blocked and self.blocked.event_id == event_id
            else time.time()
        )
        self.blocked = Blocked(event_id, str(exc), since, is_permanent(exc))
        log.warning(
            "head blocked",
            extra={"event_id": event_id, "failures": failures, "reason": str(exc), "since": since},
        )
        if should_quarantine(exc, permanent, self._policy):
            reason = f"rejected {permanent} times in a row: {exc}"
            try:
                await self._outbox.quarantine(event_id, reason, AUTO_QUARANTINE_BY)
            except InvalidTransition as done:  # an operator got there first
                log.info("head left the line already: %s", done, extra={"event_id": event_id})
            else:
                log.warning("quarantined the head", extra={"event_id": event_id, "reason": reason})
            self.blocked = None
            self._streak = ("", 0, 0)  # a redriven entry starts counting afresh
            return 0.0
        return retry_delay_s(exc, failures, self._policy, self._rand)

    def _count_failure(self, event_id: str, exc: Exception) -> tuple[int, int]:
        head, failures, permanent = self._streak
        if head != event_id:
            failures, permanent = 0, 0
        failures += 1
        permanent = permanent + 1 if is_permanent(exc) else 0
        self._streak = (event_id, failures, permanent)
        return failures, permanent

    async def _sleep(self, delay_s: float, wakeable: bool) -> None:
        if delay_s <= 0 or self._stop.is_set():
            return
        waits = [asyncio.ensure_future(self._stop.wait())]
        if wakeable:
            waits.append(asyncio.ensure_future(self._wake.wait()))
        try:
            await asyncio.wait(waits, timeout=delay_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()


def _outcome(error: BaseException | None) -> str:
    if error is None:
        return "delivered"
    return "permanent" if is_permanent(error) else "transient"
