"""The delivery driver: one line of entries sent in order, verified, hooked, marked.

This is the one place where the delivery contract is carried out. The library's
`dispatch` and `dispatch_batch`, `publisher dispatch` and the relay in every mode
(one event or a batch per request, one or several requests in flight, global order
or one lane per key) all run a `Driver`:

- Entries are read in seq order, and sent as copies: a callback that mutates its
  argument cannot redirect the mark. A read has finished, and holds no lock, before
  anything it returned is sent.
- Requests go out in order. Up to `pipeline` may be in flight; each but the first
  names the last event of the one before (`after`, the Outbox-After header), and the
  sink's predecessor check applies nothing of it unless that event is in its inbox.
  So the sink never applies entries out of order, whatever order the requests arrive
  in.
- Results are taken in the order the requests were sent. The verified prefix of each
  is handed to the after-delivery hook, then marked sent with its ACKs. Marks of
  requests taken one after another share a commit; every mark is committed before
  `run` returns or raises.
- At the first failure nothing more is sent, the requests behind it are cancelled
  (their entries stay pending and are sent again later), and the failure is raised
  as the same object. Nothing after a failure is marked, and the sink holds nothing
  after a gap.

Under a lease (a relay worker's line, see publisher.leases), every request carries
it and every mark is fenced by it: `run(lease)`. A refusal under it (LeaseLost from
a mark, FencedBySink from a request) ends the run like any failure, and the caller
stops the line (or, for a fence the outbox does not confirm, crosses the gap: see
publisher.line). `may_send` is asked before every send: once the worker no longer
holds the lease nothing more is sent, and the requests in flight are settled.

The sink is trusted to enforce the predecessor check only once it has said so
(`Sender.predecessor_checked`): a run sends one request at a time, naming no
predecessor (the one before is verified by then), until the reply of the request
just taken said the sink enforces the check, and goes back to one whenever such a
reply has not.

Requests go through a `Sender`: `HttpSender` itself, with no adapter between, or
anything with its three methods (the library's `dispatch` wraps its plain callbacks
in one).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, Protocol

from plumbing.logs import Throttled
from publisher.errors import NotAcknowledged
from publisher.settings import RelaySettings
from publisher.store import MAX_READ, Mark, Outbox, Pending
from shared import Event, Lease

log = logging.getLogger(__name__)

PREDECESSOR_MISSING: Final = 412  # the sink's answer to a request whose predecessor it lacks

# What a request says of one event: the verified ACK (None when the sender verified
# it without an ACK body to keep), or the failure that ends the verified prefix.
Verified = Mapping[str, object] | None
Result = Verified | BaseException
AfterDelivery = Callable[[str], object]


class Sender(Protocol):
    """What a line's requests go through: HttpSender, or anything with these methods.

    `after` names the event sent just before (None: no predecessor check), `lease`
    the line's lease (None: not leased). A request that fails as a whole raises.
    """

    def deliver(
        self, event: Event, /, *, after: str | None = None, lease: Lease | None = None
    ) -> Awaitable[Verified]:
        """One event in one request: its verified ACK (None when there is no ACK
        body to keep), else raise."""
        ...

    def deliver_batch(
        self, events: Sequence[Event], /, *, after: str | None = None, lease: Lease | None = None
    ) -> Awaitable[Sequence[Result]]:
        """Events in one request: one result per event for a verified prefix, then at
        most one failure."""
        ...

    def predecessor_checked(self, event_id: str | None) -> bool:
        """Whether the sink is known to enforce the predecessor check: as its reply to
        the request that began with `event_id` said, or (None) before any request."""
        ...


class LineStore(Protocol):
    """Where a line's entries come from and where their marks go."""

    async def read(self, limit: int, skip: Collection[str]) -> list[Pending]:
        """Up to `limit` pending entries in seq order, leaving out `skip`."""
        ...

    async def mark(self, marks: list[Mark], lease: Lease | None) -> None:
        """Save these verified entries as sent, all or none; with `lease`, only while
        the line's lease still has its epoch (else LeaseLost)."""
        ...


class Reporter(Protocol):
    """Told about each request taken, in order: the entries it delivered (verified),
    the failed entry and its error if any, and when the request started."""

    def __call__(
        self,
        delivered: list[Pending],
        failed: Pending | None,
        error: BaseException | None,
        started: float,
    ) -> None: ...


@dataclass(frozen=True)
class OutboxLine:
    """A LineStore over an Outbox: every pending entry, or one lane's."""

    outbox: Outbox
    lane: str | None = None

    async def read(self, limit: int, skip: Collection[str]) -> list[Pending]:
        return await self.outbox.pending_batch(limit, self.lane, skip)

    async def mark(self, marks: list[Mark], lease: Lease | None) -> None:
        if marks:
            await self.outbox.mark_sent_many(marks, lease)


def read_size(settings: RelaySettings, once: bool) -> int:
    """Entries per read: `limit` for a single read (dispatch); otherwise enough for
    every request in flight at once (not one read per request). Pure."""
    if once:
        return settings.limit
    return min(max(settings.limit, settings.pipeline * settings.per_request), MAX_READ)


class Prefix(NamedTuple):
    """What one request proved: the rows verified in order, their ACKs, and the
    failure that ended the prefix, if any."""

    verified: list[Pending]
    acks: list[Verified]
    failure: BaseException | None


class Request(NamedTuple):
    """A request in flight."""

    rows: list[Pending]
    task: asyncio.Task[Sequence[Result]]
    started: float
    checked: bool  # sent naming its predecessor (`after`)


@dataclass
class _Run:
    """The state of one `run`."""

    trusted: bool  # several requests in flight, each naming its predecessor
    queue: collections.deque[Pending]
    in_flight: collections.deque[Request]
    reading: asyncio.Task[list[Pending]] | None = None
    after: str | None = None  # the last event sent
    drained: bool = False  # the last read returned all the line had


def _always() -> bool:
    return True


class Driver:
    """Delivers one line: see the module docstring for the contract.

    After `run` raises, `failed_entry` is the entry the failure is about, or None
    when it is not about an entry (the database, say). `held` maps the ID of each
    entry read and not yet done with to its row.
    """

    def __init__(
        self,
        line: LineStore,
        sender: Sender,
        settings: RelaySettings,
        *,
        once: bool = False,
        after_delivery: AfterDelivery | None = None,
        may_send: Callable[[], bool] = _always,
        report: Reporter | None = None,
        log: Throttled | None = None,
    ) -> None:
        """`once`: read once and deliver that (dispatch), else until drained (relay)."""
        self._line = line
        # Repeated failures are logged once per interval with a count (plumbing.logs).
        self._log = Throttled(logging.getLogger(__name__)) if log is None else log
        self._sender = sender
        # A sender gets copies of the events it may change (data nests); one that says
        # it only reads them (HttpSender) gets them as read, with their stored text.
        self._copies = not getattr(sender, "reads_events_only", False)
        self._settings = settings
        self._once = once
        self._read_size = read_size(settings, once)
        self._after_delivery = after_delivery
        self._may_send = may_send
        self._report = report
        self._marks: dict[asyncio.Future[None], list[str]] = {}
        self._mark_failed: BaseException | None = None
        self.held: dict[str, Pending] = {}
        self.failed_entry: Pending | None = None
        self._lease: Lease | None = None

    async def run(self, lease: Lease | None = None) -> int:
        """Deliver until the line has nothing pending (or, with `once`, the entries of
        one read are done), `may_send` says no, or a request fails. Returns how many
        entries were marked sent, all committed by then; raises the first failure.
        With `lease`, every request carries it and every mark is fenced by it."""
        pipelined = self._settings.pipeline > 1
        trusted = pipelined and self._sender.predecessor_checked(None)
        run = _Run(trusted, collections.deque(), collections.deque())
        self.held, self.failed_entry, self._lease = {}, None, lease
        try:
            marked = await self._drive(run)
        except BaseException:
            await self._abandon(run)
            raise
        await _settle([run.reading] if run.reading else [])  # stopping with a read under way
        await self._settle_marks(raise_failure=True)
        return marked

    async def _drive(self, run: _Run) -> int:
        marked = 0
        if self._once:
            self._queue(run, await self._line.read(self._read_size, ()))
            run.drained = True
        while True:
            self._raise_mark_failure()
            self._collect_read(run)
            self._send_ready(run)
            self._read_ahead(run)
            if not run.in_flight:
                if run.reading is None or not self._may_send():
                    return marked  # drained, or stopping
                await asyncio.wait([run.reading])
                continue
            if await self._read_came_first(run):
                continue  # send more before taking a result
            request = run.in_flight.popleft()
            marked += await self._take(request)
            if self._settings.pipeline > 1:
                run.trusted = self._sender.predecessor_checked(request.rows[0].id)

    def _raise_mark_failure(self) -> None:
        if self._mark_failed is not None:
            self.failed_entry = None  # not a delivery failure: the database
            raise self._mark_failed

    def _collect_read(self, run: _Run) -> None:
        if run.reading is not None and run.reading.done():
            rows, run.reading = run.reading.result(), None
            run.drained = len(rows) < self._read_size
            self._queue(run, rows)

    def _read_ahead(self, run: _Run) -> None:
        """Start the next read once fewer entries are queued than would fill every
        slot, so it runs while requests are in flight (with one request of one event
        in flight: while the last entry read is sent). Reading is then never on the
        path from one result to the next send."""
        settings = self._settings
        low_water = min(settings.per_request * settings.pipeline, self._read_size)
        if run.reading is None and not run.drained and len(run.queue) < low_water:
            run.reading = asyncio.ensure_future(self._read())

    def _queue(self, run: _Run, rows: list[Pending]) -> None:
        for row in rows:
            self.held[row.id] = row
            run.queue.append(row)

    async def _read(self) -> list[Pending]:
        """The next entries of the line, leaving out those held here or being marked."""
        skip = {*self.held, *(i for ids in self._marks.values() for i in ids)}
        return await self._line.read(self._read_size, skip)

    def _send_ready(self, run: _Run) -> None:
        """Send while a slot is free: a short request only once the line has no more."""
        size = self._settings.per_request
        while (
            len(run.in_flight) < (self._settings.pipeline if run.trusted else 1)
            and (len(run.queue) >= size or (run.queue and run.drained))
            and self._may_send()
        ):
            rows = [run.queue.popleft() for _ in range(min(size, len(run.queue)))]
            after = run.after if run.trusted else None
            events = [row.sent(self._copies) for row in rows]
            task = asyncio.ensure_future(self._send(events, after))
            run.in_flight.append(Request(rows, task, time.perf_counter(), after is not None))
            run.after = rows[-1].id

    async def _read_came_first(self, run: _Run) -> bool:
        """With a read under way and a slot free, wait for whichever comes first."""
        head = run.in_flight[0].task
        if run.reading is None or len(run.in_flight) >= self._settings.pipeline:
            return False
        await asyncio.wait([head, run.reading], return_when=asyncio.FIRST_COMPLETED)
        return not head.done()

    async def _take(self, request: Request) -> int:
        """The next request's result, in order: hook and mark its verified prefix."""
        first = request.rows[0]
        self.failed_entry = first
        try:
            results = await request.task
        except Exception as exc:
            if not (request.checked and _predecessor_missing(exc)):
                self._told([], first, exc, request.started)
                raise
            # Refused by the predecessor check although the request before it was
            # verified (the sink gave up waiting, say): send it again naming none.
            results = await self._resend(request)
        verified, acks, failure = _verified_prefix(request.rows, results)
        failed = request.rows[len(verified)] if failure is not None else None
        self._told(verified, failed, failure, request.started)
        await self._hook_and_mark(verified, acks)
        if failure is not None:
            self.failed_entry = failed
            raise failure
        self.failed_entry = None
        return len(verified)

    async def _send(self, events: list[Event], after: str | None) -> Sequence[Result]:
        """One request of the line: the batch, or its one event."""
        if self._settings.batch:
            return await self._sender.deliver_batch(events, after=after, lease=self._lease)
        return [await self._sender.deliver(events[0], after=after, lease=self._lease)]

    async def _resend(self, request: Request) -> Sequence[Result]:
        try:
            return await self._send([row.sent(self._copies) for row in request.rows], None)
        except Exception as exc:
            self._told([], request.rows[0], exc, request.started)
            raise

    def _told(
        self,
        delivered: list[Pending],
        failed: Pending | None,
        error: BaseException | None,
        started: float,
    ) -> None:
        if self._report is not None:
            self._report(delivered, failed, error, started)

    async def _hook_and_mark(self, verified: list[Pending], acks: list[Verified]) -> None:
        """Hook, then mark, the verified prefix of a request that was answered. An
        empty prefix is handed to the mark as well, where it changes nothing: each
        answered request is settled by one mark call."""
        ids = [row.id for row in verified]  # the IDs selected, not the copies'
        if self._after_delivery is not None:
            for event_id in ids:
                hooked = self._after_delivery(event_id)
                if inspect.isawaitable(hooked):
                    await hooked
        marks = [Mark(event_id, ack) for event_id, ack in zip(ids, acks, strict=True)]
        # Not awaited here: marks of requests taken one after another are committed
        # together; `run` waits for all of them before it returns or raises.
        mark = asyncio.ensure_future(self._line.mark(marks, self._lease))
        self._marks[mark] = ids
        mark.add_done_callback(self._marked)
        for event_id in ids:
            self.held.pop(event_id, None)

    def _marked(self, mark: asyncio.Future[None]) -> None:
        """A committed mark is forgotten; a failed one is kept, and stops the run."""
        if mark.cancelled() or mark.exception() is None:
            self._marks.pop(mark, None)
        elif self._mark_failed is None:
            self._mark_failed = mark.exception()

    async def _abandon(self, run: _Run) -> None:
        """A failure propagates: cancel the requests in flight, let a read under way
        and every mark finish (a read is short, and its connection is not ours to
        interrupt)."""
        for request in run.in_flight:
            request.task.cancel()
        dropped: list[asyncio.Future[Any]] = [request.task for request in run.in_flight]
        await _settle([*dropped, *([run.reading] if run.reading else [])])
        await self._settle_marks(raise_failure=False)

    async def _settle_marks(self, *, raise_failure: bool) -> None:
        """Wait for every mark. A failed one is raised, or, when a failure is already
        propagating, logged: its entries stay pending and are sent again (duplicates)."""
        marks, self._marks = self._marks, {}
        if marks:
            await asyncio.wait(marks)
        # Only now: a mark that failed while being waited for has been noted by then.
        first, self._mark_failed = self._mark_failed, None
        for mark in marks:
            failure = None if mark.cancelled() else mark.exception()
            if failure is None:
                continue
            if raise_failure:
                self.failed_entry = None  # not a delivery failure
                raise failure
            if failure is not first:  # the first is what propagates
                key = ("marking delivered entries failed too", str(failure))
                self._log.error(key, "marking delivered entries failed too: %s", failure)


def _predecessor_missing(exc: Exception) -> bool:
    return isinstance(exc, NotAcknowledged) and exc.status == PREDECESSOR_MISSING


def _verified_prefix(rows: list[Pending], results: Sequence[Result]) -> Prefix:
    verified: list[Pending] = []
    acks: list[Verified] = []
    for row, result in zip(rows, results, strict=False):
        if isinstance(result, BaseException):
            return Prefix(verified, acks, result)
        verified.append(row)
        acks.append(result)
    if len(verified) < len(rows):
        missing = rows[len(verified)].id
        return Prefix(verified, acks, NotAcknowledged(f"{missing}: no ACK in the reply"))
    return Prefix(verified, acks, None)


async def _settle(dropped: Sequence[asyncio.Future[Any]]) -> None:
    """Wait for requests (or a read) that will not be used; their outcome is not needed."""
    if dropped:
        await asyncio.wait(dropped)
    for future in dropped:
        if not future.cancelled():
            future.exception()  # retrieved, so asyncio does not log it as forgotten


__all__ = [
    "PREDECESSOR_MISSING",
    "Driver",
    "LineStore",
    "OutboxLine",
    "Reporter",
    "Result",
    "Sender",
    "read_size",
]
