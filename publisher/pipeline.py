"""Pipelined delivery: several requests of one line in flight, results taken in order.

Each request names the last event of the request sent before it (`after`, sent as
the Outbox-After header). The sink applies a request only if that event is in its
inbox, checked in the same transaction, so the sink never applies entries out of
order, whatever order the requests arrive in. The publisher takes the results in
the order it sent the requests: it verifies each ACK, runs the after-delivery hook,
and marks the verified entries; at the first failure it stops, cancels the requests
behind it (their entries stay pending and are sent again later), and raises. The
stop-on-first-failure contract holds as without pipelining: nothing after a failure
is marked, and the sink holds nothing after a gap.

Only for a sink that enforces Outbox-After: one that ignores it could apply a
request whose predecessor failed. Given `fenced` (HttpSender.fenced_reply), a run
starts with one request in flight and opens up to `depth` only once the reply of the
request just taken has said the sink enforces the header, and goes back to one
whenever such a reply has not.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from publisher.errors import DeliveryError, NotAcknowledged
from publisher.store import MAX_READ, Outbox, Pending
from shared import Event

log = logging.getLogger(__name__)

FENCE_NOT_MET: Final = 412  # the sink's answer to a request whose predecessor it lacks
MAX_DEPTH: Final = 16
DEFAULT_DEPTH: Final = 8  # `publisher serve`: pipelined once the sink says it enforces fences

Result = Mapping[str, object] | DeliveryError
Row = Pending


class SendUnit(Protocol):
    """Sends one request: the events in order, fenced on `after`; one result per event
    for a verified prefix (ACKs, then at most one error), or raises DeliveryError."""

    def __call__(self, events: list[Event], after: str | None) -> Awaitable[Sequence[Result]]: ...


class Reporter(Protocol):
    """Told about each request taken, in order: the IDs it delivered (verified), the
    failure if any (and which entry it is for), and when the request started."""

    def __call__(
        self,
        delivered: list[str],
        failed: str | None,
        error: BaseException | None,
        started: float,
    ) -> None: ...


class Pipeline:
    """One line (global order, or one SKU) delivered with up to `depth` requests in
    flight, each of `per_request` entries (1: one event per request).

    `batch` maps each entry read and not yet done with to its (seq, attempts), and
    `current` names the entry a failure is about, as EvidenceStore does, so the relay
    logs and records failures the same way in both modes.

    With `fenced`, the sink is not trusted to enforce Outbox-After until it says so:
    each run sends one request at a time, without a fence (the one before it is
    verified by then), until `fenced(first ID)` holds for the request whose result
    was just taken; it is asked again after every result. Without it, the sink is
    trusted from the first request.
    """

    def __init__(
        self,
        outbox: Outbox,
        send: SendUnit,
        *,
        lane: str | None,
        read_limit: int,
        per_request: int,
        depth: int,
        may_send: Callable[[], bool],
        report: Reporter,
        after_delivery: Callable[[str], object] | None = None,
        fenced: Callable[[str], bool] | None = None,
    ) -> None:
        if not 2 <= depth <= MAX_DEPTH or not 1 <= per_request <= read_limit:
            raise ValueError(f"bad depth {depth} or request size {per_request}")
        self._outbox = outbox
        self._send = send
        self._lane = lane
        self._read_limit = read_limit
        self._per_request = per_request
        self._depth = depth
        self._may_send = may_send
        self._report = report
        self._after_delivery = after_delivery
        self._fenced = fenced
        self._read_size = min(max(read_limit, depth * per_request), MAX_READ)
        self._marks: dict[asyncio.Task[None], list[str]] = {}
        self._mark_failed: BaseException | None = None
        self.batch: dict[str, tuple[int, int]] = {}
        self.current: str | None = None

    async def run(self) -> int:
        """Deliver until the line has nothing pending, `may_send` says no, or a request
        fails. Returns how many entries were marked sent (every mark is on disk by
        then); raises the first failure."""
        queue: collections.deque[Event] = collections.deque()
        in_flight: collections.deque[tuple[list[Event], asyncio.Task[Sequence[Result]], float]]
        in_flight = collections.deque()
        reading: asyncio.Task[list[Row]] | None = None
        after: str | None = None
        drained = False
        marked = 0
        trusted = self._fenced is None  # several requests in flight, each fenced
        self.batch, self.current = {}, None
        try:
            while True:
                if self._mark_failed is not None:
                    self.current = None  # not a delivery failure: the database
                    raise self._mark_failed
                if reading is not None and reading.done():
                    rows, reading = reading.result(), None
                    drained = len(rows) < self._read_size
                    for seq, event, attempts in rows:
                        self.batch[event["id"]] = (seq, attempts)
                        queue.append(event)
                if reading is None and not drained and len(queue) < self._read_size:
                    # Read on while requests are in flight: never on the path to a result.
                    reading = asyncio.ensure_future(self._read())
                # A short request only once the line has no more to give.
                while (
                    len(in_flight) < (self._depth if trusted else 1)
                    and (len(queue) >= self._per_request or (queue and drained))
                    and self._may_send()
                ):
                    unit = [queue.popleft() for _ in range(min(self._per_request, len(queue)))]
                    request = asyncio.ensure_future(
                        self._send([event.copy() for event in unit], after if trusted else None)
                    )
                    in_flight.append((unit, request, time.perf_counter()))
                    after = unit[-1]["id"]
                if not in_flight:
                    if reading is None or not self._may_send():
                        break  # drained, or stopping
                    await asyncio.wait([reading])
                    continue
                head = in_flight[0][1]
                if reading is not None and len(in_flight) < self._depth:
                    await asyncio.wait([head, reading], return_when=asyncio.FIRST_COMPLETED)
                    if not head.done():
                        continue  # the read came back first: send more
                unit, request, started = in_flight.popleft()
                marked += await self._take(unit, request, started)
                if self._fenced is not None:
                    trusted = self._fenced(unit[0]["id"])  # what that request's reply said
        except BaseException:
            for _, request, _ in in_flight:
                request.cancel()
            if reading is not None:
                reading.cancel()
            dropped = [request for _, request, _ in in_flight] + ([reading] if reading else [])
            await _settle(dropped)  # the failure that propagates is the first one
            await self._settle_marks(raise_failure=False)
            raise
        await _settle([reading] if reading else [])  # stopping with a read under way
        self.current = None  # a failed mark is not a delivery failure
        await self._settle_marks(raise_failure=True)
        return marked

    async def _read(self) -> list[Row]:
        """The next entries of the line, enough for every request in flight at once
        (one read, not one per request), leaving out those held here."""
        skip = [*self.batch, *(i for ids in self._marks.values() for i in ids)]
        return await self._outbox.pending_batch(self._read_size, self._lane, skip)

    async def _take(
        self, unit: list[Event], request: asyncio.Task[Sequence[Result]], started: float
    ) -> int:
        """The next request's result, in order: hook and mark its verified prefix."""
        self.current = unit[0]["id"]
        try:
            results = await request
        except NotAcknowledged as exc:
            if exc.status != FENCE_NOT_MET:
                raise self._failed([], unit[0]["id"], exc, started) from None
            # Refused for its fence although the request before it was verified (the
            # sink gave up waiting, say): send it again without one.
            results = await self._resend(unit, started)
        except DeliveryError as exc:
            raise self._failed([], unit[0]["id"], exc, started) from None
        verified: list[str] = []
        acks: list[Mapping[str, object]] = []
        failure: DeliveryError | None = None
        for event, result in zip(unit, results, strict=False):
            if isinstance(result, DeliveryError):
                failure = result
                break
            verified.append(event["id"])
            acks.append(result)
        if failure is None and len(verified) < len(unit):
            failure = NotAcknowledged(f"{unit[len(verified)]['id']}: no ACK in the reply")
        failed = unit[len(verified)]["id"] if failure is not None else None
        self._report(verified, failed, failure, started)
        await self._hook_and_mark(verified, acks)
        if failure is not None:
            self.current = failed
            raise failure
        return len(verified)

    async def _resend(self, unit: list[Event], started: float) -> Sequence[Result]:
        try:
            return await self._send([event.copy() for event in unit], None)
        except DeliveryError as exc:
            raise self._failed([], unit[0]["id"], exc, started) from None

    def _failed(
        self, delivered: list[str], failed: str, error: DeliveryError, started: float
    ) -> DeliveryError:
        self.current = failed
        self._report(delivered, failed, error, started)
        return error

    async def _hook_and_mark(self, verified: list[str], acks: list[Mapping[str, object]]) -> None:
        if not verified:
            return
        if self._after_delivery is not None:
            for event_id in verified:
                hooked = self._after_delivery(event_id)
                if inspect.isawaitable(hooked):
                    await hooked
        marks = list(zip(verified, acks, strict=True))
        # Not awaited here: marks of requests taken one after another are committed
        # together; `run` waits for all of them before it returns or raises.
        mark = asyncio.ensure_future(self._outbox.mark_sent_many(marks))
        self._marks[mark] = verified
        mark.add_done_callback(self._marked)
        for event_id in verified:
            self.batch.pop(event_id, None)

    def _marked(self, mark: asyncio.Task[None]) -> None:
        """A mark on disk is forgotten; a failed one is kept, and stops the run."""
        if mark.cancelled() or mark.exception() is None:
            self._marks.pop(mark, None)
        elif self._mark_failed is None:
            self._mark_failed = mark.exception()

    async def _settle_marks(self, *, raise_failure: bool) -> None:
        """Wait for every mark. A failed one is raised, or, when a failure is already
        propagating, logged: its entries stay pending and are sent again (duplicates)."""
        marks, self._marks = self._marks, {}
        first, self._mark_failed = self._mark_failed, None
        if marks:
            await asyncio.wait(marks)
        for mark in marks:
            failure = None if mark.cancelled() else mark.exception()
            if failure is None:
                continue
            if raise_failure:
                raise failure
            if failure is not first:  # the first is what propagates
                log.error("marking delivered entries failed too: %s", failure)


async def _settle(dropped: Sequence[asyncio.Future[Any]]) -> None:
    """Wait for requests (or a read) that will not be used; their outcome is not needed."""
    if dropped:
        await asyncio.wait(dropped)
    for future in dropped:
        if not future.cancelled():
            future.exception()  # retrieved, so asyncio does not log it as forgotten
