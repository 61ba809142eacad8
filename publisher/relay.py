"""Delivery in order: `dispatch` for one batch, `Relay` to keep doing it as a service."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from publisher.errors import DeliveryError, InvalidTransition, NotAcknowledged
from publisher.pipeline import MAX_DEPTH, Pipeline, Result
from publisher.retry import Random, RetryPolicy, is_permanent, retry_delay_s, should_quarantine
from publisher.store import Outbox, Pending, check_limit
from shared import MAX_BATCH, Event

log = logging.getLogger(__name__)

Send = Callable[[Event], Awaitable[object]]
AfterDelivery = Callable[[str], object]
Positions = Mapping[str, tuple[int, int]]  # event ID -> (seq, attempts so far)
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

    The mark of an entry (a durable commit) overlaps the send of the next one; it is
    always awaited before the next mark starts and before dispatch returns or raises.
    """
    check_limit(limit)
    # pending() has fetched and closed its statement: no lock is held while sending.
    batch = await outbox.pending(limit)
    marked: list[str] = []
    marking: asyncio.Task[None] | None = None
    try:
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
            if marking is not None:
                await marking
            marking = asyncio.ensure_future(outbox.mark_sent(event_id))
            marked.append(event_id)
    except BaseException:
        if marking is not None:
            await _settle(marking)  # keep the earlier mark; the failure is what propagates
        raise
    if marking is not None:
        await marking
    return marked


async def _settle(marking: asyncio.Task[None]) -> None:
    try:
        await asyncio.shield(marking)
    except Exception as exc:
        log.error("marking a delivered entry failed too: %s", exc)
    except asyncio.CancelledError:
        await asyncio.wait([marking])


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
    """Sends one event and returns the verified ACK (HttpSender.deliver). `after` is
    passed only when pipelining."""

    def __call__(
        self, event: Event, /, after: str | None = ...
    ) -> Awaitable[Mapping[str, object]]: ...


class DeliverBatch(Protocol):
    """Sends events in one request (HttpSender.deliver_batch): verified ACKs, then at
    most one error. `after` is passed only when pipelining."""

    def __call__(
        self, events: Sequence[Event], /, after: str | None = ...
    ) -> Awaitable[Sequence[Mapping[str, object] | DeliveryError]]: ...


class EvidenceStore:
    """An OutboxStore for dispatch that keeps the evidence: each verified ACK is
    stored with its mark, and each entry's seq and attempts are at hand for logs.

    Use `send` as dispatch's send callback.

    With `overlap_marks`, `mark_sent_many` starts the commit of a verified batch and
    returns: the next batch is read (without those IDs) and sent while it commits.
    Each mark is awaited before the next one starts, and `flush` awaits the last.

    While the last entry of a batch is being sent, the next batch is read ahead
    (without the IDs of this one), so that reading it is not on the path from one
    ACK to the next send. The read-ahead is used only by the `pending` call that
    directly follows a batch marked in full; a failure, a partial batch or `flush`
    drops it, and the next batch is then read afresh.
    """

    def __init__(
        self,
        outbox: Outbox,
        deliver: Deliver,
        deliver_batch: DeliverBatch | None = None,
        lane: str | None = None,
        overlap_marks: bool = False,
    ) -> None:
        self._outbox = outbox
        self._deliver = deliver
        self._deliver_batch = deliver_batch
        self._lane = lane
        self._overlap_marks = overlap_marks
        self._marking: asyncio.Task[None] | None = None
        self._marking_ids: frozenset[str] = frozenset()
        self._acks: dict[str, Mapping[str, object]] = {}
        self._limit = MAX_BATCH
        self._ahead: asyncio.Future[list[Pending]] | None = None
        self._ahead_valid = False
        self.batch: dict[str, tuple[int, int]] = {}  # id -> (seq, attempts so far)
        self.current: str | None = None  # the entry being sent, or last sent

    async def pending(self, limit: int = MAX_BATCH) -> list[Event]:
        ahead, valid = self._ahead, self._ahead_valid and limit == self._limit
        self._ahead, self._ahead_valid = None, False
        self.batch, self.current = {}, None  # a failed read is not a failed delivery
        if ahead is not None and valid:
            rows = await ahead
        else:
            await _drop(ahead)
            rows = await self._outbox.pending_batch(limit, self._lane, self._marking_ids)
        self._limit = limit
        self.batch = {event["id"]: (seq, attempts) for seq, event, attempts in rows}
        self._acks.clear()
        return [event for _, event, _ in rows]

    def _read_ahead(self, event_id: str) -> None:
        """Sending the batch's last entry (or the whole batch): start reading the next."""
        if self._ahead is None and len(self.batch) == self._limit and event_id in self.batch:
            last = next(reversed(self.batch))
            if event_id == last or self._deliver_batch is not None:
                skip = self._marking_ids.union(self.batch)
                self._ahead = asyncio.ensure_future(
                    self._outbox.pending_batch(self._limit, self._lane, skip)
                )

    def _marked(self, event_ids: Sequence[str]) -> None:
        """The read-ahead stays good only if the whole batch it skipped was marked."""
        if self._ahead is not None and event_ids and event_ids[-1] == next(reversed(self.batch)):
            self._ahead_valid = len(event_ids) == len(self.batch) or self._deliver_batch is None

    async def send(self, event: Event) -> bool:
        self.current = event["id"]
        self._read_ahead(event["id"])
        self._acks[event["id"]] = await self._deliver(event)
        return True

    async def mark_sent(self, event_id: str) -> None:
        self._marked([event_id])
        await self._outbox.mark_sent(event_id, self._acks.pop(event_id, None))

    async def send_batch(self, events: list[Event]) -> list[object]:
        """For dispatch_batch: True per verified ACK, then the first failure if any."""
        if self._deliver_batch is None:
            raise RuntimeError("this store was made without a batch sender")
        self.current = events[0]["id"] if events else None
        if events:
            self._read_ahead(events[0]["id"])
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
        self._marked(event_ids)
        marks = [(event_id, self._acks.pop(event_id, None)) for event_id in event_ids]
        await self.flush(keep_ahead=True)
        if not self._overlap_marks:
            await self._outbox.mark_sent_many(marks)
        elif marks:
            self._marking_ids = frozenset(event_ids)
            self._marking = asyncio.ensure_future(self._outbox.mark_sent_many(marks))

    async def flush(self, keep_ahead: bool = False) -> None:
        """Wait for a mark still being committed; raise if it failed. Unless
        `keep_ahead`, drop the read-ahead too."""
        if not keep_ahead:
            ahead, self._ahead, self._ahead_valid = self._ahead, None, False
            await _drop(ahead)
        marking, self._marking = self._marking, None
        if marking is not None:
            try:
                await marking
            finally:
                self._marking_ids = frozenset()


async def _drop(ahead: asyncio.Future[list[Pending]] | None) -> None:
    """Let a read-ahead that will not be used finish; its result or error is not needed."""
    if ahead is not None:
        await asyncio.wait([ahead])
        if not ahead.cancelled():
            ahead.exception()  # retrieved, so asyncio does not log it as forgotten


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


@dataclass
class Lane:
    """One ordering lane: its own pending line, failure streak and backoff.

    Global order has a single lane (key None) holding every entry; per-SKU order has
    one lane per SKU.
    """

    key: str | None
    store: EvidenceStore
    pipeline: Pipeline | None = None  # delivers the lane instead of `store` when set
    streak: tuple[str, int, int] = ("", 0, 0)  # head id, failures, permanent failures
    blocked: Blocked | None = None
    not_before: float = 0.0  # monotonic time before which a backing-off lane waits


Ordering = Literal["global", "sku"]
MAX_LANES: Final = 8
LANE_CANDIDATES: Final = 64  # lanes listed per query of pending lanes


class Relay:
    """Dispatches batches until stopped, backing off while a head fails.

    Global order (the default): one line, stop-on-first-failure across all entries.
    Per-SKU order (`ordering="sku"`): entries of one SKU go in seq order with
    stop-on-first-failure inside that lane, and up to `max_lanes` lanes are in flight
    at once, so a blocked head stalls only its own SKU.
    """

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
        ordering: Ordering = "global",
        max_lanes: int = MAX_LANES,
        rand: Random = random.random,
        pipeline: int = 1,
        fencing: Callable[[str], bool] | None = None,
    ) -> None:
        """With `deliver_batch`, each step sends its batch in one request (dispatch_batch);
        without it, one request per entry (dispatch).

        With `pipeline` above 1, each line keeps up to that many requests in flight,
        each fenced on the one before (publisher.pipeline): only for a sink that
        enforces Outbox-After. `deliver` and `deliver_batch` must then take `after=`.
        With `fencing` (HttpSender.fenced_reply), the sink must say so first: until
        the reply of a line's request just taken has, and whenever one has not, the
        line keeps one request in flight.
        """
        if ordering not in ("global", "sku") or max_lanes < 1:
            raise ValueError(f"bad ordering {ordering!r} or max_lanes {max_lanes}")
        if not 1 <= pipeline <= MAX_DEPTH:
            raise ValueError(f"pipeline depth {pipeline} is not between 1 and {MAX_DEPTH}")
        self._outbox = outbox
        self._deliver = deliver
        self._deliver_batch = deliver_batch
        self._limit = check_limit(limit)
        self._poll_interval_s = poll_interval_s
        self._policy = policy or RetryPolicy()
        self._observer = observer
        self._after_delivery = after_delivery
        self._ordering = ordering
        self._max_lanes = max_lanes
        self._rand = rand
        self._depth = pipeline
        self._fencing = fencing
        self._lanes: dict[str, Lane] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._candidates: list[str] = []  # lanes to start next, oldest head first
        self._listed_at = -math.inf  # monotonic time of the query that listed them
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._global = self._make_lane(None)

    @property
    def blocked(self) -> Blocked | None:
        """The blocked head (global order), or the oldest blocked lane head (per SKU)."""
        if self._ordering == "global":
            return self._global.blocked
        heads = [lane.blocked for lane in self._lanes.values() if lane.blocked is not None]
        return min(heads, key=lambda b: b.since, default=None)

    @property
    def blocked_lanes(self) -> dict[str, Blocked]:
        """Per-SKU order: each lane whose head is failing."""
        return {k: lane.blocked for k, lane in self._lanes.items() if lane.blocked is not None}

    def wake(self) -> None:
        """New work arrived: start the next batch now instead of at the next poll."""
        self._wake.set()

    def stop(self) -> None:
        """Finish the sends in flight (or let them time out), start no other, then return."""
        self._stop.set()

    async def run(self) -> None:
        """Dispatch until stopped."""
        log.info("relay started", extra={"limit": self._limit, "ordering": self._ordering})
        if self._ordering == "global":
            while not self._stop.is_set():
                delay_s, wakeable = await self.step()
                await self._sleep(delay_s, wakeable)
            await _flush_quietly(self._global.store)
        else:
            await self._supervise_lanes()
        log.info("relay stopped")

    async def step(self) -> tuple[float, bool]:
        """One batch of the global line. Returns how long to wait, and whether new intake
        may cut the wait short."""
        self._wake.clear()
        return await self._step(self._global)

    async def _step(self, lane: Lane) -> tuple[float, bool]:
        try:
            if lane.pipeline is not None:
                marked = await lane.pipeline.run()  # returns once the line is drained
                full = False
            else:
                marked = len(await self._dispatch_once(lane))
                full = marked == self._limit
                if not full:
                    await lane.store.flush()  # about to idle: every mark on disk first
        except RelayStopping:
            await _flush_quietly(lane.store)
            return 0.0, False
        except Exception as exc:  # the loop outlives any one failure; each is recorded
            await _flush_quietly(lane.store)
            try:
                return await self._failed(lane, exc), False
            except Exception as unrecorded:  # recording it failed too (the database, say)
                log.error("could not record a failed attempt: %s", unrecorded)
                return self._policy.cap_s, False
        if marked:
            lane.blocked = None
        if full:
            return 0.0, True
        return self._poll_interval_s, True

    async def _supervise_lanes(self) -> None:
        """Per-SKU order: keep up to max_lanes lanes in flight, each in a task of its own."""
        try:
            while not self._stop.is_set():
                self._wake.clear()
                await self._start_ready_lanes()
                await self._sleep(self._next_check_s(), wakeable=True)
        finally:
            if self._tasks:
                await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _start_ready_lanes(self) -> None:
        """Fill free slots with the lanes whose pending heads are oldest.

        One query reads up to LANE_CANDIDATES lanes, and slots that free up later take
        the next of them, so with thousands of SKUs a query is not paid per lane. The
        list is read again when it runs short, when a lane's backoff has ended since
        (it may now go first), and at least every poll interval (other writers, a
        redrive). New intake needs none of these: its entries are the youngest, so
        every lane listed goes before a lane they start.
        """
        free = self._max_lanes - len(self._tasks)
        if free <= 0:
            return
        now = time.monotonic()
        # Lanes already in flight or backing off are left out of the query, so any
        # number of blocked lanes cannot crowd a healthy one out of the list.
        busy = {*self._tasks, *(k for k, lane in self._lanes.items() if lane.not_before > now)}
        keys = [key for key in self._candidates if key not in busy]
        resumed = any(self._listed_at < lane.not_before <= now for lane in self._lanes.values())
        for key in [k for k, lane in self._lanes.items() if k not in busy and not lane.blocked]:
            del self._lanes[key]  # its wait is over: nothing left to remember
        if len(keys) < free or resumed or now - self._listed_at >= self._poll_interval_s:
            try:
                keys = await self._outbox.pending_lanes(max(free, LANE_CANDIDATES), sorted(busy))
            except Exception as exc:
                log.error("could not read the pending lanes: %s", exc)
                return
            self._listed_at = now
        self._candidates = keys[free:]
        for key in keys[:free]:
            lane = self._lanes.get(key) or self._new_lane(key)
            self._tasks[key] = asyncio.create_task(self._run_lane(lane), name=f"lane {key}")

    def _new_lane(self, key: str) -> Lane:
        self._lanes[key] = lane = self._make_lane(key)
        return lane

    def _make_lane(self, key: str | None) -> Lane:
        overlap = self._deliver_batch is not None
        store = EvidenceStore(self._outbox, self._deliver, self._deliver_batch, key, overlap)
        lane = Lane(key, store)
        if self._depth > 1:
            lane.pipeline = Pipeline(
                self._outbox,
                self._send_unit,
                lane=key,
                read_limit=self._limit,
                per_request=self._limit if self._deliver_batch is not None else 1,
                depth=self._depth,
                may_send=lambda: not self._stop.is_set(),
                report=functools.partial(self._report, lane),
                after_delivery=self._after_delivery,
                fenced=self._fencing,
            )
        return lane

    async def _send_unit(self, events: list[Event], after: str | None) -> Sequence[Result]:
        """One pipelined request: the batch, or its one event."""
        if self._deliver_batch is not None:
            return await self._deliver_batch(events, after=after)
        return [await self._deliver(events[0], after=after)]

    def _report(
        self,
        lane: Lane,
        delivered: list[str],
        failed: str | None,
        error: BaseException | None,
        started: float,
    ) -> None:
        """The log lines of one pipelined request, as for one unpipelined."""
        assert lane.pipeline is not None
        batch = lane.pipeline.batch
        if delivered:
            self._log_delivered(batch, delivered, started)
        if failed is not None:
            self._log_outcome(batch, failed, _outcome(error), started, error)

    async def _run_lane(self, lane: Lane) -> None:
        """Deliver one lane until it is drained or must back off; then free the slot."""
        assert lane.key is not None
        try:
            while not self._stop.is_set():
                delay_s, idle = await self._step(lane)
                if delay_s > 0:
                    if not idle:  # a failure: back off without holding a slot
                        lane.not_before = time.monotonic() + delay_s
                    return  # drained, or backing off
        finally:
            await _flush_quietly(lane.store)
            del self._tasks[lane.key]
            if not lane.blocked and lane.not_before <= time.monotonic():
                # Forget drained lanes, memory stays bounded; a lane backing off (after
                # a failure that is not its head's, the database say) is kept until
                # its wait is over, so it is left out of the lanes to start till then.
                self._lanes.pop(lane.key, None)
            self._wake.set()  # a slot is free

    def _next_check_s(self) -> float:
        now = time.monotonic()
        waits = [lane.not_before - now for lane in self._lanes.values() if lane.not_before > now]
        return min([self._poll_interval_s, *waits])

    async def _dispatch_once(self, lane: Lane) -> list[str]:
        if self._deliver_batch is not None:
            send_batch = functools.partial(self._send_batch, lane.store)
            return await dispatch_batch(lane.store, send_batch, self._limit, self._after_delivery)
        send = functools.partial(self._send, lane.store)
        return await dispatch(lane.store, send, self._limit, self._after_delivery)

    async def _send_batch(self, store: EvidenceStore, events: list[Event]) -> list[object]:
        if self._stop.is_set():
            raise RelayStopping
        started = time.perf_counter()
        try:
            results = await store.send_batch(events)
        except Exception as exc:
            self._log_outcome(store.batch, events[0]["id"], _outcome(exc), started, exc)
            raise
        verified = next((n for n, result in enumerate(results) if result is not True), len(results))
        delivered = [event["id"] for event in events[:verified]]
        if delivered:
            self._log_delivered(store.batch, delivered, started)
        if len(delivered) < len(results):
            error = results[len(delivered)]
            failed = events[len(delivered)]["id"]
            assert isinstance(error, BaseException)
            self._log_outcome(store.batch, failed, _outcome(error), started, error)
        return results

    def _log_delivered(self, batch: Positions, event_ids: list[str], started: float) -> None:
        """One line per request for the verified prefix of a batch (a line per entry would
        cost the relay more than the request): its IDs, and the first entry's seq and
        attempt."""
        seq, attempts = batch.get(event_ids[0], (None, 0))
        fields = {
            "event_id": event_ids[0],
            "seq": seq,
            "attempt": attempts + 1,
            "outcome": "delivered",
            "latency_ms": round((time.perf_counter() - started) * 1000, 2),
            "count": len(event_ids),
            "last_seq": batch.get(event_ids[-1], (None, 0))[0],
            "event_ids": event_ids,
        }
        log.info("delivery", extra=fields)
        if self._observer is not None:
            for _ in event_ids:
                self._observer.delivery("delivered")

    async def _send(self, store: EvidenceStore, event: Event) -> bool:
        if self._stop.is_set():
            raise RelayStopping
        started = time.perf_counter()
        try:
            await store.send(event)
        except Exception as exc:
            self._log_outcome(store.batch, event["id"], _outcome(exc), started, exc)
            raise
        self._log_outcome(store.batch, event["id"], "delivered", started)
        return True

    def _log_outcome(
        self,
        batch: Positions,
        event_id: str,
        outcome: str,
        started: float,
        error: BaseException | None = None,
    ) -> None:
        seq, attempts = batch.get(event_id, (None, 0))
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

    async def _failed(self, lane: Lane, exc: Exception) -> float:
        line = lane.pipeline or lane.store
        event_id = line.current
        if event_id is None or event_id not in line.batch:
            # Not a delivery failure (the database, say): back off and try the batch again.
            log.error("relay step failed: %s", exc, exc_info=not isinstance(exc, DeliveryError))
            return retry_delay_s(exc, 1, self._policy, self._rand)
        await self._outbox.record_failure(event_id, str(exc))
        failures, permanent = _count_failure(lane, event_id, exc)
        same_head = lane.blocked is not None and lane.blocked.event_id == event_id
        since = lane.blocked.since if lane.blocked and same_head else time.time()
        lane.blocked = Blocked(event_id, str(exc), since, is_permanent(exc))
        fields = {"event_id": event_id, "lane": lane.key, "failures": failures, "since": since}
        log.warning("head blocked", extra={**fields, "reason": str(exc)})
        if should_quarantine(exc, permanent, self._policy):
            reason = f"rejected {permanent} times in a row: {exc}"
            try:
                await self._outbox.quarantine(event_id, reason, AUTO_QUARANTINE_BY)
            except InvalidTransition as done:  # an operator got there first
                log.info("head left the line already: %s", done, extra={"event_id": event_id})
            else:
                log.warning("quarantined the head", extra={"event_id": event_id, "reason": reason})
            lane.blocked = None
            lane.streak = ("", 0, 0)  # a redriven entry starts counting afresh
            return 0.0
        return retry_delay_s(exc, failures, self._policy, self._rand)

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


async def _flush_quietly(store: EvidenceStore) -> None:
    """After a failure: the earlier batch's mark still completes; its own error is
    logged (its entries stay pending and are resent, absorbed by the inbox)."""
    try:
        await store.flush()
    except Exception as exc:
        log.error("marking a delivered batch failed: %s", exc)


def _count_failure(lane: Lane, event_id: str, exc: Exception) -> tuple[int, int]:
    head, failures, permanent = lane.streak
    if head != event_id:
        failures, permanent = 0, 0
    failures += 1
    permanent = permanent + 1 if is_permanent(exc) else 0
    lane.streak = (event_id, failures, permanent)
    return failures, permanent


def _outcome(error: BaseException | None) -> str:
    if error is None:
        return "delivered"
    return "permanent" if is_permanent(error) else "transient"
