"""The publisher's storage seam: what the services ask of an outbox, backend-neutral.

`Outbox` names every operation the intake API, the relay, trace, metrics and the
CLI use; rows, states and limits are defined here, not in a backend. A backend is
one module under `publisher.backends` that subclasses `Outbox`; `Outbox.open(db)`
is the one factory that picks it from the location (a file path, a `sqlite:` URL
or a `postgresql://` URI). How a backend commits (group commit, threads) is its own business.

Every backend passes the same behaviour suite (tests/behaviour/test_outbox_store.py).
"""

from __future__ import annotations

import contextlib
import copy
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple, TypeVar

import orjson

from plumbing.collector import collector_paused
from plumbing.storage import Opening, StoreBase
from shared import (
    GLOBAL_LINE,
    MAX_BATCH,
    Conflict,
    Event,
    InvalidEvent,
    Lease,
    checked_event,
    order_canonical,
    order_event,
    validate_order,
)
from shared import Order as OrderFields
from shared.event import StoredEvent, envelope_of
from shared.protocol import MAX_EPOCH

T = TypeVar("T")

MAX_READ: Final = 256  # entries one pending read may return (a pipelined relay reads ahead)
PRUNE_BATCH: Final = 500  # sent rows deleted per transaction by prune
DELIVERED_PAST_KEPT: Final = 100  # IDs kept in a quarantine record's delivered_past
WORKERS_KEPT_S: Final = 3600.0  # a relay worker not seen for this long is forgotten
MAX_PAGE: Final = 1000  # entries one entries() page may return
MAX_INTERVALS: Final = 1000  # spans one sent_per_interval() read may count
MAX_ACCEPT: Final = 500  # events one publish_many (or accept_many) call may hold

Intake = Literal["accepted", "duplicate"]
# One event's outcome in publish_many: what publish would have returned, or the
# exception it would have raised for that event alone.
IntakeOutcome = Intake | Conflict | InvalidEvent
# How intake validates an event: the validated event and its canonical form, or
# InvalidEvent. The default is shared.checked_event; a service adds its limits and
# schemas (publisher.event_rules).
EventCheck = Callable[[object], "tuple[Event, str]"]


def lane_of(event: Event) -> str:
    """The lane an event is on in order by key: its key's, or the global line's for
    an event without a key (no key is "*": the global line's name is not a key)."""
    return event.get("key", GLOBAL_LINE)


class Publication(NamedTuple):
    """One validated event to record: the event, its canonical form (what the outbox
    stores, compares and digests), and the order it records when it came through
    the order intake (the example's `orders` row is written with its entry)."""

    event: Event
    canonical: str
    order: OrderFields | None = None


class State(StrEnum):
    PENDING = "pending"
    QUARANTINED = "quarantined"
    SENT = "sent"


class Pending:
    """One pending entry as the relay reads it. `lane` is its line in order by key:
    the event's key as the outbox stored it (None for an event without a key, and
    from a store that knows no lanes: the library's dispatch over a plain store).

    An entry read from storage (`Pending.stored`) keeps the canonical text it is
    stored as (`payload`) and when it was recorded (`queued_at`); its data is parsed
    only when `event` is asked for. The relay never asks: it sends the stored text
    and needs only the entry's ID and type (`id`, `type`)."""

    __slots__ = ("_data", "_event", "_head", "attempts", "lane", "payload", "queued_at", "seq")

    def __init__(
        self,
        seq: int,
        event: Event,
        attempts: int,  # failed or successful attempts so far
        lane: str | None,
        payload: str | None = None,  # the canonical text stored (None: not read from storage)
        queued_at: float | None = None,  # when it was recorded (None: not read from storage)
    ) -> None:
        self.seq = seq
        self.attempts = attempts
        self.lane = lane
        self.payload = payload
        self.queued_at = queued_at
        self._event: Event | None = event
        self._head: Mapping[str, Any] = event  # what `id` and `type` are read from
        self._data: str | None = None  # the data's canonical text, cut out of `payload`

    @classmethod
    def stored(
        cls, seq: int, payload: str, attempts: int, lane: str | None, queued_at: float
    ) -> Pending:
        """An entry as its row holds it: the event's id, type and key read from the
        end of its canonical text, the data left unparsed (shared.event.envelope_of);
        a text not laid out so is parsed whole."""
        cut = envelope_of(payload)
        if cut is None:
            return cls(seq, orjson.loads(payload), attempts, lane, payload, queued_at)
        head, data = cut
        row = cls(seq, head, attempts, lane, payload, queued_at)  # type: ignore[arg-type]
        row._event, row._data = None, data  # the head is not the event: parsed when asked
        return row

    @property
    def event(self) -> Event:
        """The entry's event, parsed from its stored text the first time it is asked for."""
        if self._event is None:
            assert self.payload is not None  # only a stored entry is parsed lazily
            self._event = orjson.loads(self.payload)
        return self._event

    @property
    def id(self) -> str:
        return self._head["id"]  # type: ignore[no-any-return]

    @property
    def type(self) -> str:
        return self._head["type"]  # type: ignore[no-any-return]

    def sent(self, copied: bool) -> Event:
        """The event to hand a sender: a copy of its own (`copied`, for a sender that
        may change it), else the event as read, carrying its stored canonical text
        (and, when the data was left unparsed, only the id, type and key, with the
        data's text: what HttpSender writes)."""
        if copied:
            if self.payload is not None:
                return orjson.loads(self.payload)  # type: ignore[no-any-return]
            return copy.deepcopy(self.event)
        if self.payload is None:
            return self.event
        if self._data is not None:
            return StoredEvent(self._head, self.payload, self.queued_at, self._data)  # type: ignore[arg-type, return-value]
        return StoredEvent(self.event, self.payload, self.queued_at)  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"Pending(seq={self.seq}, id={self.id!r}, lane={self.lane!r})"


class Mark(NamedTuple):
    """One entry to save as sent, with the verified ACK that proved it (None: the
    caller's send callback gave no ACK body, only True)."""

    event_id: str
    ack: Mapping[str, object] | None = None


@dataclass(frozen=True)
class Entry:
    """One outbox row as an operator sees it; `lane` is its line in order by key,
    as the outbox stored it (None: the event has no key)."""

    seq: int
    event: Event
    lane: str | None
    state: State
    queued_at: float
    sent_at: float | None
    ack: dict[str, Any] | None
    attempts: int
    last_error: str | None
    last_attempt_at: float | None
    first_failure_at: float | None

    @property
    def id(self) -> str:
        return self.event["id"]

    def to_dict(self) -> dict[str, Any]:
        """As plain JSON values (list --json, the console's entries)."""
        return {
            "seq": self.seq,
            **self.event,
            "state": self.state.value,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "queued_at": self.queued_at,
            "sent_at": self.sent_at,
        }


@dataclass(frozen=True)
class QuarantineRecord:
    """One stay in quarantine: who put it there and why, and what passed it meanwhile."""

    reason: str
    quarantined_by: str
    quarantined_at: float
    released_by: str | None
    released_at: float | None
    released_as: str | None
    delivered_past_count: int | None
    delivered_past: list[str]


@dataclass(frozen=True)
class Order:
    id: str
    sku: str
    qty: int
    accepted_at: float


@dataclass(frozen=True)
class Head:
    """The oldest pending entry of a line: everything else in it waits behind it."""

    seq: int
    id: str
    queued_at: float
    attempts: int
    last_error: str | None
    blocked_since: float | None
    lane: str | None = None

    @property
    def blocked(self) -> bool:
        return self.blocked_since is not None


@dataclass(frozen=True)
class Snapshot:
    """The backlog figures behind status and metrics, read in one consistent view."""

    taken_at: float
    pending: int
    quarantined: int
    head: Head | None
    blocked_lanes: list[Head] = field(default_factory=list)

    @property
    def oldest_pending_age_s(self) -> float:
        return 0.0 if self.head is None else max(0.0, self.taken_at - self.head.queued_at)

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain JSON values (status --json, GET /status)."""
        head = self.head
        return {
            "pending": self.pending,
            "oldest_pending_age_seconds": round(self.oldest_pending_age_s, 3),
            "quarantined": self.quarantined,
            "head_blocked": head is not None and head.blocked,
            "head": None if head is None else _head_dict(head),
            "blocked_lanes": [{"lane": h.lane, **_head_dict(h)} for h in self.blocked_lanes],
        }


def _head_dict(head: Head) -> dict[str, Any]:
    return {
        "id": head.id,
        "seq": head.seq,
        "attempts": head.attempts,
        "last_error": head.last_error,
        "blocked_since": head.blocked_since,
    }


@dataclass(frozen=True)
class LineLease:
    """The lease of one line (shared.GLOBAL_LINE, or a lane's SKU) as the outbox holds
    it. Times are the store's clock (PostgreSQL: the server's), seconds since the
    epoch; `expires_in_s` is what was left when it was read (negative: expired)."""

    line: str
    owner: str | None  # None: released, free for any worker
    epoch: int  # raised by every take: the fencing token
    expires_at: float
    expires_in_s: float
    taken_at: float | None
    renewed_at: float | None

    @property
    def held(self) -> bool:
        """Whether an owner holds it unexpired (no other worker can take it now)."""
        return self.owner is not None and self.expires_in_s >= 0

    def to_dict(self) -> dict[str, Any]:
        """As plain JSON values (status --json)."""
        return {
            "line": self.line,
            "owner": self.owner,
            "epoch": self.epoch,
            "expires_at": self.expires_at,
            "expires_in_seconds": round(self.expires_in_s, 3),
            "taken_at": self.taken_at,
            "renewed_at": self.renewed_at,
        }


@dataclass(frozen=True)
class RelayWorker:
    """One relay worker's heartbeat row (relay_workers) as the outbox holds it. Times
    are the store's clock, seconds since the epoch; `seen_ago_s` is how long before
    the read it last beat, and `live` whether that was within the ttl asked for."""

    worker: str
    started_at: float
    seen_at: float
    seen_ago_s: float
    live: bool

    def to_dict(self) -> dict[str, Any]:
        """As plain JSON values (status --json)."""
        return {
            "worker": self.worker,
            "live": self.live,
            "started_at": self.started_at,
            "seen_at": self.seen_at,
            "seen_seconds_ago": round(max(self.seen_ago_s, 0.0), 3),
        }


def check_lease_request(line: str, ttl_s: float) -> None:
    """ValueError unless `line` is one an Outbox-Lease header can name (the global
    line or a SKU) and `ttl_s` a positive, finite number of seconds."""
    Lease("check", line, 1)  # the header's own rules for a line
    check_ttl(ttl_s)


def check_seen_epoch(seen: int) -> int:
    """`seen` if a lease taken past it can have an epoch (0 to MAX_EPOCH - 1), else
    ValueError."""
    if type(seen) is not int or not 0 <= seen < MAX_EPOCH:
        raise ValueError(f"no lease epoch can be above {seen!r}")
    return seen


def check_ttl(ttl_s: float) -> None:
    """ValueError unless `ttl_s` is a positive, finite number of seconds."""
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s < 1e9:
        raise ValueError(f"a lease lasts a positive number of seconds, not {ttl_s!r}")


def checked(event: object, check: EventCheck = checked_event) -> Publication | InvalidEvent:
    """The validated event to record, or the InvalidEvent that says what is wrong."""
    try:
        return Publication(*check(event))
    except InvalidEvent as exc:
        return exc


def checked_order(order: object) -> Publication | InvalidEvent:
    """The order.placed event of a validated order, or the InvalidEvent that says
    what is wrong with the order."""
    try:
        valid = validate_order(order)
    except InvalidEvent as exc:
        return exc
    return Publication(order_event(valid), order_canonical(valid), valid)


def _capped(events: Sequence[T]) -> Sequence[T]:
    if len(events) > MAX_ACCEPT:
        raise ValueError(f"at most {MAX_ACCEPT} events in one call, got {len(events)}")
    return events


def check_limit(limit: object, most: int = MAX_BATCH) -> int:
    """Return `limit` if it is an int from 1 to `most`, else raise ValueError."""
    if type(limit) is not int or not 1 <= limit <= most:
        raise ValueError(f"limit must be an integer from 1 to {most}, got {limit!r}")
    return limit


NO_SEQ_ABOVE: Final = 2**62  # above every seq: where a page of sent entries starts


def page_params(
    state: State, limit: int, after: int | None, key: str | None, event_type: str | None = None
) -> dict[str, object]:
    """The parameters of one page of entries() (limit, after, key, type), checked: ValueError
    for a `limit` outside 1 to MAX_PAGE or an `after` that is no seq (0 or more).
    Sent entries are listed newest first, so their page starts below `after`."""
    check_limit(limit, MAX_PAGE)
    if after is not None and (type(after) is not int or after < 0):
        raise ValueError(f"after must be a seq (an integer from 0), got {after!r}")
    if after is None:
        after = NO_SEQ_ABOVE if state is State.SENT else 0
    return {"limit": limit, "after": after, "key": key, "type": event_type}


def interval_params(interval_s: float, intervals: int, now: float) -> dict[str, object]:
    """The parameters of sent_per_interval's read (start, interval, end), checked:
    ValueError for a count outside 1 to MAX_INTERVALS or an interval that is not a
    positive, finite number of seconds."""
    check_limit(intervals, MAX_INTERVALS)
    if isinstance(interval_s, bool) or not isinstance(interval_s, int | float):
        raise ValueError(f"an interval is a number of seconds, not {interval_s!r}")
    if not 0 < interval_s < 1e9:
        raise ValueError(f"an interval is a positive number of seconds, not {interval_s!r}")
    return {"start": now - interval_s * intervals, "interval": float(interval_s), "end": now}


def counts_by_interval(rows: Iterable[tuple[int, int]], intervals: int) -> list[int]:
    """(interval number from 0, count) rows, as a backend's GROUP BY returns them,
    as one count per interval, oldest first (an interval without marks: 0)."""
    counts = [0] * intervals
    for number, count in rows:
        if 0 <= number < intervals:
            counts[number] += count
    return counts


class Outbox(StoreBase):
    """Orders and their outbox entries, in the source database.

    Errors: StorageError (plumbing.storage) when the database cannot be used,
    Conflict and InvalidEvent (shared) at intake, UnknownEntry and InvalidTransition
    (publisher.errors) for operations on one entry. Driver errors never leave a
    backend untranslated.
    """

    @classmethod
    def open(cls, location: str | Path, *, create: bool = True) -> Opening[Outbox]:
        """Open the outbox at `location` (the --db value) with the backend it names,
        creating and migrating its schema: `await Outbox.open(db)` or
        `async with Outbox.open(db) as outbox`. BadLocation for a location no
        backend here can open; with `create=False`, also for one that holds no
        outbox yet (a mistyped path or schema), where nothing is created."""
        from publisher.backends import open_outbox  # the backends import this module

        return open_outbox(str(location), create=create)

    @abstractmethod
    def relay_lock(self, owner: str) -> contextlib.AbstractAsyncContextManager[None]:
        """`async with outbox.relay_lock("publisher serve"):` while delivering, so that
        only one process delivers from this outbox at a time (two would send every
        entry twice). Raises RelayAlreadyRunning, naming the holder (its process,
        host, `owner` and since when), if another holds it. The lock lasts as long as
        the process: a process that dies, even by SIGKILL, holds it no longer. Intake
        and the operators' commands do not take it and work beside a relay."""

    def changes(self) -> AsyncIterator[None] | None:
        """Wake-ups when entries are queued, from any process: an async iterator that
        yields (a signal only, several changes may be one) soon after each intake
        commits, for as long as it is iterated; or None when the backend has no such
        signal (SQLite), and a relay polls alone. A relay that listens still polls:
        a lost signal delays delivery by at most one poll interval."""
        return None

    # ------------------------------------------------------------------ intake

    def arriving(self) -> contextlib.AbstractContextManager[None]:
        """`with outbox.arriving():` held by the HTTP layer from an intake request's
        arrival to its reply. A fact, not an instruction: a backend may use how many
        intake requests are in progress to decide how it commits (the SQLite one,
        while backing off after a slow write, commits a lone call on the event loop's
        thread only while no other is in progress); this default ignores it."""
        return contextlib.nullcontext()

    async def publish(self, event: object, check: EventCheck = checked_event) -> Intake:
        """Validate the event (`check`) and record its outbox entry in one
        transaction. The same ID with the same canonical event again is "duplicate"
        and changes nothing; with anything different (type, key or data), Conflict.
        Returns once the entry is durable. Concurrent calls may share a transaction
        (group commit); each still succeeds or fails on its own."""
        [outcome] = await self.publish_many([event], check)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def publish_many(
        self, events: Sequence[object], check: EventCheck = checked_event
    ) -> list[IntakeOutcome]:
        """Validate and record up to MAX_ACCEPT events (ValueError for more) in one
        transaction, and return one outcome per event, in their order: "accepted",
        "duplicate", or the Conflict or InvalidEvent that event alone failed with
        (it changed nothing; the others are recorded). The same ID twice in the
        list is judged as two calls one after the other would be. StorageError if
        the database cannot take them: then nothing of them is written."""
        with collector_paused():  # many containers at once: checked, then collected once
            items = [checked(event, check) for event in _capped(events)]
        return await self.record_many(items)

    async def accept(self, order: object) -> Intake:
        """`publish` for an order of the example's intake (`{id, sku, qty}`): its
        `orders` row and its entry, the event `order.placed`, in one transaction."""
        [outcome] = await self.accept_many([order])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def accept_many(self, orders: Sequence[object]) -> list[IntakeOutcome]:
        """`publish_many` for orders (see `accept`)."""
        with collector_paused():
            items = [checked_order(order) for order in _capped(orders)]
        return await self.record_many(items)

    async def record_many(
        self, checked: Sequence[Publication | InvalidEvent]
    ) -> list[IntakeOutcome]:
        """Record events validated already (`checked`, `checked_order`), orders and
        other events mixed, in one transaction, as publish_many does; an InvalidEvent
        among them is its own outcome."""
        valid = [item for item in _capped(checked) if not isinstance(item, InvalidEvent)]
        recorded = iter(await self._queue(valid) if valid else [])
        return [
            outcome if isinstance(outcome, InvalidEvent) else next(recorded) for outcome in checked
        ]

    @abstractmethod
    async def _queue(self, items: list[Publication]) -> list[Intake | Conflict]:
        """Record validated events (and the orders among them) and their outbox
        entries in one transaction (each event all or nothing), durable before this
        returns; one outcome per event. StorageError, nothing written, if the
        database cannot take them."""

    # ------------------------------------------------------------------ the relay

    async def pending(self, limit: int = MAX_BATCH) -> list[Event]:
        """Up to `limit` (1 to 16) pending events, oldest first by seq. Changes nothing."""
        return [row.event for row in await self.pending_batch(check_limit(limit))]

    @abstractmethod
    async def pending_batch(
        self, limit: int = MAX_BATCH, lane: str | None = None, skip: Iterable[str] = ()
    ) -> list[Pending]:
        """Up to `limit` (1 to MAX_READ) pending entries in seq order, with their seq
        and attempts: of one lane (SKU) if `lane` is given, leaving out the IDs in
        `skip` (entries the caller holds: in flight, or being marked). No lock is held
        once it returns."""

    @abstractmethod
    async def pending_lanes(
        self, limit: int, skip: Iterable[str] = (), worker: str | None = None
    ) -> list[str]:
        """Up to `limit` (1 or more, else ValueError) lanes (SKUs) with pending
        entries, the one whose head is oldest first, leaving out the lanes in `skip`;
        with `worker`, also the lanes whose lease another owner holds unexpired (its
        own, free, released and expired ones are kept)."""

    @abstractmethod
    async def head_ids(self, lanes: Sequence[str | None]) -> dict[str | None, str | None]:
        """The ID of the pending head of each line: None names the global line (every
        pending entry), a string one lane. A line with nothing pending maps to None."""

    async def mark_sent(
        self, event_id: str, ack: Mapping[str, object] | None = None, lease: Lease | None = None
    ) -> None:
        """Save the entry as sent, with the ACK that proved it. Idempotent once sent."""
        await self.mark_sent_many([Mark(event_id, ack)], lease)

    @abstractmethod
    async def mark_sent_many(self, marks: Sequence[Mark], lease: Lease | None = None) -> None:
        """Save several entries as sent, each with its ACK: all of them or none.

        An entry quarantined while its send was in flight is saved as sent, and its
        quarantine record closed as "delivered". UnknownEntry for an ID the outbox
        does not hold. Concurrent calls may share a transaction; each still succeeds
        or fails on its own.

        With `lease` (the worker's lease of the entries' line), the marks are made
        only if the line's lease still has that epoch, checked in the transaction
        that makes them (the lease row locked against a takeover until it commits);
        else LeaseLost, and nothing is written. Without one, nothing is checked."""

    @abstractmethod
    async def record_failure(self, event_id: str, error: str, lease: Lease | None = None) -> None:
        """Count a failed attempt on a pending entry and keep its error. With `lease`,
        fenced as mark_sent_many is (LeaseLost, nothing written)."""

    # ------------------------------------------------------------------ leases

    @property
    @abstractmethod
    def source(self) -> str:
        """This outbox's stable ID (created with its schema, the same for every worker
        and process): the SOURCE of the Outbox-Lease header."""

    @abstractmethod
    async def worker_seen(self, worker: str, ttl_s: float, *, first: bool = False) -> int:
        """Note that `worker` is alive now, and return how many workers are (seen
        within the last `ttl_s` seconds, this one included). Workers not seen for
        WORKERS_KEPT_S are forgotten. `first`: the worker's first note since it
        started, so it is up since now (one restarted under the same ID too)."""

    @abstractmethod
    async def worker_gone(self, worker: str) -> None:
        """Forget `worker` (its clean shutdown): it no longer counts as live."""

    @abstractmethod
    async def workers(self, ttl_s: float) -> list[RelayWorker]:
        """The relay workers the outbox remembers, in worker order: those seen
        within WORKERS_KEPT_S (a worker that stopped cleanly is forgotten at once),
        each `live` if seen within the last `ttl_s` seconds, as worker_seen counts
        them (ValueError for a ttl that is not a positive number of seconds)."""

    @abstractmethod
    async def take_lease(self, line: str, worker: str, ttl_s: float) -> int | None:
        """Take the lease of `line` for `worker` for `ttl_s` seconds, atomically: the
        new epoch (1 for a line never leased, else one more than the last), or None
        when another owner holds it unexpired (ValueError for a line no Outbox-Lease
        header can name, or a ttl that is not a positive number of seconds). A line
        that is free, released or expired is taken; so is one `worker` holds itself
        (a restart under the same --worker-id), under a new epoch that fences its
        earlier writes."""

    @abstractmethod
    async def take_lease_past(self, line: str, worker: str, ttl_s: float, seen: int) -> int | None:
        """Take the lease of `line` as take_lease does, in one statement, under an
        epoch above `seen` as well: the new epoch is one more than the larger of the
        last and `seen` (ValueError for a `seen` that is no epoch, 0 to MAX_EPOCH - 1,
        besides take_lease's). A sink that has seen `seen` for the line (it fenced a
        request of an outbox restored from an older backup, say) accepts it."""

    @abstractmethod
    async def renew_leases(self, worker: str, held: Mapping[str, int], ttl_s: float) -> set[str]:
        """Extend, to `ttl_s` seconds from now, each lease in `held` (line -> epoch)
        that `worker` still holds under that epoch (expired or not); return those
        lines. A line left out of the result was lost (taken over, or released)."""

    @abstractmethod
    async def release_leases(self, worker: str, held: Mapping[str, int]) -> None:
        """Give up each lease in `held` (line -> epoch) that `worker` still holds
        under that epoch, so that another worker may take it at once; the others are
        left as they are."""

    @abstractmethod
    async def leases(self) -> list[LineLease]:
        """Every line's lease (held, released or expired), in line order."""

    @abstractmethod
    async def lease_of(self, line: str) -> LineLease | None:
        """The lease of `line`, or None if it was never leased."""

    # ------------------------------------------------------------------ operators

    @abstractmethod
    async def quarantine(
        self, event_id: str, reason: str, by: str, lease: Lease | None = None
    ) -> None:
        """Take a pending entry out of the line; it is neither pending nor sent.
        InvalidTransition unless it is pending, UnknownEntry if there is none. The
        relay's own quarantine passes its `lease` (fenced as mark_sent_many is); an
        operator's passes none and is never fenced."""

    @abstractmethod
    async def redrive(self, event_id: str, by: str) -> QuarantineRecord:
        """Make a quarantined entry pending again at its own seq, and return the closed
        quarantine record with the entries delivered past it meanwhile."""

    @abstractmethod
    async def entry(self, event_id: str) -> Entry | None: ...

    @abstractmethod
    async def pruned(self, event_id: str) -> bool:
        """Whether the entry of `event_id` was pruned: `prune` removed it once sent,
        keeping its ID and digest (so that it is still known, and judged by them)."""

    @abstractmethod
    async def entries(
        self,
        state: State,
        limit: int = 100,
        *,
        after: int | None = None,
        key: str | None = None,
        type: str | None = None,
    ) -> list[Entry]:
        """Entries in one state: pending and quarantined oldest first, sent newest first.

        A page: `after` is the seq of the last entry of the previous page (the next
        page starts past it in the listing's order: above it for pending and
        quarantined, below it for sent); `key` keeps the entries of that key only (its
        lane; "*" for events without a key), `type` those of that event type.
        ValueError for a `limit` outside 1 to MAX_PAGE or a negative `after`."""

    @abstractmethod
    async def sent_per_interval(self, interval_s: float, intervals: int) -> list[int]:
        """How many entries were marked sent in each of the last `intervals` spans
        of `interval_s` seconds up to now, oldest first (by any worker: read from
        the marks' sent_at). ValueError for a count outside 1 to MAX_INTERVALS or an
        interval that is not a positive number of seconds."""

    @abstractmethod
    async def order(self, event_id: str) -> Order | None: ...

    async def quarantines(self, event_id: str) -> list[QuarantineRecord]:
        """Every stay of this entry in quarantine, oldest first."""
        return (await self.quarantine_history([event_id])).get(event_id, [])

    @abstractmethod
    async def quarantine_history(self, ids: list[str]) -> dict[str, list[QuarantineRecord]]:
        """Quarantine records of several entries in one read, oldest first; entries
        never quarantined are left out."""

    @abstractmethod
    async def snapshot(self) -> Snapshot:
        """Pending and quarantined counts, the head entry and the blocked lane heads,
        in one consistent view, at a cost that does not grow with sent rows."""

    @abstractmethod
    async def prune(self, older_than_s: float, batch: int = PRUNE_BATCH) -> int:
        """Delete sent entries older than `older_than_s`, `batch` rows per transaction
        (intake waits at most one batch); return how many were deleted. Their orders
        stay: the same ID again is still a duplicate or a Conflict, never accepted."""
