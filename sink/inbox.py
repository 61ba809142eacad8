"""The inbox: which event IDs the sink has applied, and the inventory they changed.

Recording the ID and applying the effect happen in one transaction, so the inbox can
never claim an event whose effect is missing. The SQL is in `sink.sql`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

from shared import (
    Conflict,
    Event,
    FenceNotMet,
    Receipt,
    canonical_json,
    digest_of,
    validate_event,
)
from sink import sql
from sqlite_tx import Database, GroupCommit, StorageError, Store, transaction


@dataclass(frozen=True)
class Received:
    """What receive did, and the digest of the payload the inbox holds."""

    receipt: Receipt
    digest: str


@dataclass(frozen=True)
class BatchReceipt:
    """What a batch did: one Received per applied prefix item, then the conflict if any."""

    received: list[Received]
    conflict: Conflict | None


@dataclass(frozen=True)
class InboxRecord:
    """The inbox row of one event: the evidence of stage 3."""

    id: str
    digest: str
    received_at: float
    deliveries: int
    last_delivery_at: float


class Inbox(Store):
    """The sink's inbox and inventory in one SQLite file.

    A write that has the database to itself commits on the calling thread (no hand-
    off to the worker thread). Writes made with `share_commit` while others are in
    progress are committed together (group commit): each in its own savepoint, all
    in one transaction on the worker thread, so concurrent requests share one fsync
    and the event loop keeps serving while it runs.
    """

    MIGRATIONS = sql.MIGRATIONS

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._groups = GroupCommit(db, _receive_groups)

    async def receive(self, event: object) -> Receipt:
        """Apply the event once: record its ID and its effect in one transaction.

        The same ID with the same payload again is a duplicate (no second effect);
        with a different payload it raises Conflict and changes nothing.
        """
        return (await self.receive_with_digest(event)).receipt

    async def receive_with_digest(
        self, event: object, *, after: str | None = None, share_commit: bool = False
    ) -> Received:
        """Like `receive`, also returning the SHA-256 of the stored payload."""
        receipt = await self.receive_batch(
            [validate_event(event)], after=after, share_commit=share_commit
        )
        if receipt.conflict is not None:
            raise receipt.conflict
        return receipt.received[0]

    async def receive_batch(
        self, events: Sequence[Event], *, after: str | None = None, share_commit: bool = False
    ) -> BatchReceipt:
        """Apply validated events in order in one transaction, stopping at the first conflict.

        Those before the conflict are applied (or counted as duplicates) and committed;
        the conflicting one and those after it change nothing. With `after` (the event
        the sender delivered just before these), nothing is applied unless that event
        is in the inbox: FenceNotMet, checked in the same transaction. With
        `share_commit` (other writes are in progress) the transaction may hold other
        calls' writes.
        """
        items = list(events)
        if not items:
            return BatchReceipt([], None)
        if not share_commit and not self._groups.busy:
            return await self._db.run_inline(
                lambda conn: _receive_batch(conn, items, after, time.time())
            )
        return await self._groups.submit((items, after))

    async def knows(self, event_id: str) -> bool:
        """Whether the inbox holds `event_id` (a read of one row)."""
        row = await self._db.run_inline(lambda conn: conn.execute(sql.FIND, (event_id,)).fetchone())
        return row is not None

    async def inventory(self, sku: str) -> int:
        """The quantity held for `sku`, 0 if it was never seen."""
        row = await self._db.run(lambda conn: conn.execute(sql.INVENTORY, (sku,)).fetchone())
        return 0 if row is None else int(row[0])

    async def record(self, event_id: str) -> InboxRecord | None:
        """The inbox row for `event_id`, None if this sink never applied it."""
        row = await self._db.run(lambda conn: conn.execute(sql.RECORD, (event_id,)).fetchone())
        if row is None:
            return None
        payload, received_at, deliveries, last_delivery_at = row
        return InboxRecord(event_id, digest_of(payload), received_at, deliveries, last_delivery_at)

    async def count(self) -> int:
        """How many events the inbox holds."""
        row = await self._db.run(lambda conn: conn.execute(sql.COUNT_EVENTS).fetchone())
        return int(row[0])


Call = tuple[list[Event], str | None]  # events in order, and the fence (event before)


def _receive_batch(
    conn: sqlite3.Connection, events: list[Event], after: str | None, now: float
) -> BatchReceipt:
    with transaction(conn):
        return _receive_in(conn, events, after, now)


def _receive_groups(conn: sqlite3.Connection, calls: list[Call]) -> list[BatchReceipt | Exception]:
    """Several calls' batches in one transaction, each in a savepoint of its own: a
    call that fails leaves nothing of itself and does not fail the others."""
    outcomes: list[BatchReceipt | Exception] = []
    now = time.time()
    with transaction(conn):
        for events, after in calls:
            conn.execute("SAVEPOINT one_call")
            try:
                outcomes.append(_receive_in(conn, events, after, now))
            except FenceNotMet as exc:  # raised before anything of the call was written
                outcomes.append(exc)
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK TO one_call")
                failed = StorageError(f"applying a batch failed: {exc}")
                failed.__cause__ = exc
                outcomes.append(failed)
            conn.execute("RELEASE one_call")
    return outcomes


def _receive_in(
    conn: sqlite3.Connection, events: list[Event], after: str | None, now: float
) -> BatchReceipt:
    """Inside a transaction: check the fence, then apply in order, stopping at the
    first conflict."""
    if after is not None and conn.execute(sql.FIND, (after,)).fetchone() is None:
        raise FenceNotMet(after)
    payloads = [canonical_json(event) for event in events]
    ids = [event["id"] for event in events]
    if len(set(ids)) == len(ids) and not _known(conn, ids):
        # The common case, every ID new: one statement for the inbox rows and one
        # per SKU for the inventory, instead of two or three per event.
        rows = [(i, p, now, now) for i, p in zip(ids, payloads, strict=True)]
        conn.executemany(sql.INSERT, rows)
        conn.executemany(sql.APPLY, _totals(events).items())
        return BatchReceipt([Received(Receipt.APPLIED, digest_of(p)) for p in payloads], None)
    done: list[Received] = []
    for event, payload in zip(events, payloads, strict=True):
        try:
            done.append(_apply(conn, event, payload, now))
        except Conflict as exc:
            return BatchReceipt(done, exc)  # the prefix commits; nothing of this one ran
    return BatchReceipt(done, None)


def _known(conn: sqlite3.Connection, ids: list[str]) -> bool:
    """Whether the inbox holds any of these IDs."""
    return conn.execute(sql.FIND_MANY, (json.dumps(ids),)).fetchone() is not None


def _totals(events: Sequence[Event]) -> dict[str, int]:
    """The quantity each SKU gains from these events (additions commute)."""
    totals: dict[str, int] = {}
    for event in events:
        totals[event["sku"]] = totals.get(event["sku"], 0) + event["qty"]
    return totals


def _apply(conn: sqlite3.Connection, event: Event, payload: str, now: float) -> Received:
    """Inside a transaction: record the ID and apply the effect, or count a duplicate.

    A conflict raises before anything of this event is written.
    """
    if conn.execute(sql.INSERT, (event["id"], payload, now, now)).rowcount == 1:
        conn.execute(sql.APPLY, (event["sku"], event["qty"]))
        return Received(Receipt.APPLIED, digest_of(payload))
    (known,) = conn.execute(sql.FIND, (event["id"],)).fetchone()
    if known != payload:
        raise Conflict(event["id"])
    conn.execute(sql.COUNT_DUPLICATE, (now, event["id"]))
    return Received(Receipt.DUPLICATE, digest_of(known))
