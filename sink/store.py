"""The sink's storage seam: what the HTTP layer asks of an inbox, backend-neutral.

`Inbox` names every operation the sink uses; its rows are defined here, not in a
backend. A backend is one module under `sink.backends` that subclasses `Inbox`;
`Inbox.open(db)` is the one factory that picks it from the location (a file path, a
`sqlite:` URL or a `postgresql://` URI). How a backend commits (inline, group
commit, threads, pipelines) is its own business: the HTTP layer only reports facts,
such as a write request arriving.

Every backend passes the same behaviour suite (tests/behaviour/test_inbox_store.py).
"""

from __future__ import annotations

import contextlib
import json
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from plumbing.storage import Opening, StoreBase
from shared import (
    Conflict,
    Event,
    Lease,
    Order,
    Receipt,
    checked_event,
    digest_of,
    order_canonical,
    order_event,
)
from shared.event import MAX_DATA_BYTES_LIMIT, placed_order
from sink.handlers import WAREHOUSE, Handlers, NotApplied


class Incoming(NamedTuple):
    """One validated event as the inbox takes it: the event, its canonical form (RFC
    8785 of {id, type, key, data}: what the inbox stores, compares and digests,
    computed once where the event was validated), and the order it places when it is
    an `order.placed` event whose data is an order (what an admission check such as
    `--chaos reject-sku` reads; its effect is its handler's), else None."""

    event: Event
    canonical: str
    order: Order | None

    @classmethod
    def of(cls, event: Event, canonical: str) -> Incoming:
        """An event validated with its canonical form (shared.checked_event)."""
        return cls(event, canonical, placed_order(event))

    @classmethod
    def of_order(cls, order: Order) -> Incoming:
        """The `order.placed` event a validated order records."""
        return cls(order_event(order), order_canonical(order), order)

    @classmethod
    def checked(cls, obj: object) -> Incoming:
        """Validate `obj` as an event (InvalidEvent naming the place otherwise), with
        data up to the most any publisher may allow."""
        return cls.of(*checked_event(obj, max_data_bytes=MAX_DATA_BYTES_LIMIT))


@dataclass(frozen=True)
class Received:
    """What receive did, and the canonical form the inbox holds for the event (for a
    duplicate, the one stored first)."""

    receipt: Receipt
    stored: str

    @property
    def digest(self) -> str:
        """SHA-256 of the stored canonical form: what an ACK of this release carries
        (computed when asked: an ACK in the previous release's terms needs another)."""
        return digest_of(self.stored)


@dataclass(frozen=True)
class BatchReceipt:
    """What a batch did: one Received per applied prefix item, then why it stopped
    there if it did: a Conflict, or the event's handler (NotApplied: no handler, a
    Reject, a failure)."""

    received: list[Received]
    stopped: Conflict | NotApplied | None


@dataclass(frozen=True)
class InboxRecord:
    """The inbox row of one event: the evidence of stage 3, and the event as stored."""

    id: str
    digest: str  # of the stored canonical form
    received_at: float
    deliveries: int
    last_delivery_at: float
    applied_seq: int  # the order of first application: larger for each newly applied ID
    event: Event

    @classmethod
    def stored(
        cls,
        event_id: str,
        payload: str,
        received_at: float,
        deliveries: int,
        last_delivery_at: float,
        applied_seq: int,
    ) -> InboxRecord:
        """The record of a row as a backend reads it: `payload` is the canonical form."""
        digest = digest_of(payload)
        event: Event = json.loads(payload)
        return cls(event_id, digest, received_at, deliveries, last_delivery_at, applied_seq, event)


class Inbox(StoreBase):
    """Which events the sink has applied, and the effects their handlers made.

    Recording an event (its ID, type and canonical form) and applying its effect
    happen in one transaction, so the inbox never claims an event whose effect is
    missing, and a receive that returns has committed both: an ACK sent afterwards is
    evidence. The effect is what the inbox's `handlers` return for the event (see
    sink.handlers); the built-in warehouse adds an `order.placed` event's quantity to
    its SKU's inventory and records any other event with no effect.

    Errors: StorageError (plumbing.storage) when the database cannot be used,
    Conflict, InvalidEvent, PredecessorMissing and StaleLease (shared) as the methods say.
    Driver errors never leave a backend untranslated.
    """

    handlers: Handlers = WAREHOUSE

    @classmethod
    def open(cls, location: str | Path, handlers: Handlers | None = None) -> Opening[Inbox]:
        """Open the inbox at `location` (the --db value) with the backend it names,
        creating and migrating its schema, then the `handlers`' schema (the built-in
        warehouse by default): `await Inbox.open(db)` or `async with Inbox.open(db) as
        inbox`. BadLocation, raised by this call before anything is opened, for a
        location no backend here can open."""
        from sink.backends import open_inbox  # the backends import this module

        return open_inbox(str(location), WAREHOUSE if handlers is None else handlers)

    # ------------------------------------------------------------------ facts

    def arriving(self) -> contextlib.AbstractContextManager[None]:
        """`with inbox.arriving():` held by the HTTP layer from a write request's
        arrival to its reply. A fact, not an instruction: a backend may use how many
        writes are in progress to decide how it commits (the SQLite one shares one
        commit among them); this default ignores it."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ writes

    async def receive(self, event: object) -> Receipt:
        """Validate the event `{id, type, key?, data}` and apply it once: record it
        and its effect in one transaction.

        The same ID with the same canonical form again is a duplicate (no second
        effect, its delivery counted); with a different one it raises Conflict and
        changes nothing. An invalid event raises InvalidEvent and changes nothing.
        """
        return (await self.receive_with_digest(Incoming.checked(event))).receipt

    async def receive_with_digest(
        self, item: Incoming, *, after: str | None = None, lease: Lease | None = None
    ) -> Received:
        """Like `receive`, for an event validated already (the HTTP layer validates
        each request's once), also returning the SHA-256 of the stored canonical form
        (for a duplicate, of the one stored first); with `after` (the predecessor
        check) and `lease` (fencing), as in `receive_batch`."""
        receipt = await self.receive_batch([item], after=after, lease=lease)
        if receipt.stopped is not None:
            raise receipt.stopped
        return receipt.received[0]

    @abstractmethod
    async def receive_batch(
        self, items: Sequence[Incoming], *, after: str | None = None, lease: Lease | None = None
    ) -> BatchReceipt:
        """Apply validated events in order in one transaction, stopping at the first
        conflict or the first event its handler does not take.

        Each new event is recorded and its handler's statements run right after, in
        the same transaction; a duplicate's or a conflict's never run. The
        prefix before the stop is applied (or counted as duplicates, an ID repeated
        within the batch included) and committed; the event that stops the batch and
        those after it change nothing, and `stopped` says which it was and why: a
        Conflict, NoHandler, HandlerRejected (the handler raised Reject) or
        HandlerFailed (it raised anything else, returned no statements, or the database
        refused one of them; the cause is chained). With `after`
        (the event the sender delivered just before these), nothing at all is applied
        unless that event is in the inbox: PredecessorMissing, checked in the same
        transaction. With `lease` (the sender's source, line and epoch), nothing at
        all is applied if a higher epoch of that source and line has been seen:
        StaleLease, even for events already applied (a stale sender gets no ACK, not
        even a duplicate's); otherwise the epoch becomes the highest seen, in the same
        transaction. A stale lease is refused before a missing predecessor is. An
        empty batch changes nothing and checks no predecessor.
        """

    # ------------------------------------------------------------------ reads

    @abstractmethod
    async def knows(self, event_id: str) -> bool:
        """Whether the inbox holds `event_id` (cheap: the predecessor wait polls it)."""

    @abstractmethod
    async def inventory(self, sku: str) -> int:
        """The quantity held for `sku`, 0 if it was never seen."""

    @abstractmethod
    async def record(self, event_id: str) -> InboxRecord | None:
        """The inbox row for `event_id` with the event stored, None if this sink never
        applied it."""

    @abstractmethod
    async def count(self) -> int:
        """How many events the inbox holds (cheap: read for every metrics scrape)."""
