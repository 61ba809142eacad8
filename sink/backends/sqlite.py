"""The SQLite inbox: the inbox and inventory tables in one SQLite file.

The interface and rows are in `sink.store`; the SQL is in `sink.backends.sqlite_sql`.
Each transaction runs as one call (sqlite_tx). How a write commits is decided here,
from the facts the HTTP layer reports (`arriving`): inline on the event loop's
thread when it has the database to itself, else in a group commit.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence

from plumbing.storage import StorageError
from shared import Conflict, Lease, PredecessorMissing, Receipt, StaleLease
from sink.backends import sqlite_sql as sql
from sink.backends.sharing import Arrivals, Call
from sink.store import BatchReceipt, Inbox, InboxRecord, Incoming, Received
from sqlite_tx import Database, GroupCommit, SqliteFile, transaction


class SqliteInbox(SqliteFile, Inbox):
    """The sink's inbox and inventory in one SQLite file.

    A write that has the database to itself commits on the calling thread (no hand-
    off to the worker thread): the request cannot answer before its commit anyway.
    While other write requests are in progress (or a group is being committed), or
    when the write names a predecessor, it joins a group commit instead: each call in
    its own savepoint, all in one transaction on the worker thread, so concurrent
    requests share one fsync and the event loop keeps serving while it runs. A write
    that names a predecessor always goes there, so a pipeline's requests share fsyncs
    too.
    """

    SCHEMA = sql.SCHEMA

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._groups = GroupCommit(db, _receive_groups)
        self._arrivals = Arrivals()

    @property
    def writes_in_progress(self) -> int:
        """Write requests between arrival and reply, as reported through `arriving`."""
        return self._arrivals.count

    def arriving(self) -> Arrivals:
        return self._arrivals

    async def receive_batch(
        self, items: Sequence[Incoming], *, after: str | None = None, lease: Lease | None = None
    ) -> BatchReceipt:
        if not items:
            return BatchReceipt([], None)
        call = Call(list(items), after, lease)
        if self._commits_inline(after):
            return await self._db.run_inline(lambda conn: _receive_batch(conn, call, time.time()))
        return await self._groups.submit(call)

    def _commits_inline(self, after: str | None) -> bool:
        """The tactic: inline when this write is the only one in progress, no group is
        being committed (writes commit in the order they are handed over) and it
        names no predecessor; otherwise in the next group commit."""
        return after is None and self._arrivals.count <= 1 and not self._groups.busy

    async def knows(self, event_id: str) -> bool:
        """A read of one row, inline: the predecessor wait asks it while a request waits."""
        row = await self._db.run_inline(lambda conn: conn.execute(sql.FIND, (event_id,)).fetchone())
        return row is not None

    async def inventory(self, sku: str) -> int:
        row = await self._db.run(lambda conn: conn.execute(sql.INVENTORY, (sku,)).fetchone())
        return 0 if row is None else int(row[0])

    async def record(self, event_id: str) -> InboxRecord | None:
        row = await self._db.run(lambda conn: conn.execute(sql.RECORD, (event_id,)).fetchone())
        return None if row is None else InboxRecord.stored(event_id, *row)

    async def count(self) -> int:
        row = await self._db.run(lambda conn: conn.execute(sql.COUNT_EVENTS).fetchone())
        return int(row[0])


def _receive_batch(conn: sqlite3.Connection, call: Call, now: float) -> BatchReceipt:
    with transaction(conn):
        return _receive_in(conn, call, now)


def _receive_groups(conn: sqlite3.Connection, calls: list[Call]) -> list[BatchReceipt | Exception]:
    """Several calls' batches in one transaction, each in a savepoint of its own: a
    call that fails leaves nothing of itself and does not fail the others."""
    outcomes: list[BatchReceipt | Exception] = []
    now = time.time()
    with transaction(conn):
        for call in calls:
            conn.execute("SAVEPOINT one_call")
            try:
                outcomes.append(_receive_in(conn, call, now))
            except (PredecessorMissing, StaleLease) as exc:  # raised before the call wrote events
                outcomes.append(exc)
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK TO one_call")
                failed = StorageError(f"applying a batch failed: {exc}")
                failed.__cause__ = exc
                outcomes.append(failed)
            conn.execute("RELEASE one_call")
    return outcomes


def _receive_in(conn: sqlite3.Connection, call: Call, now: float) -> BatchReceipt:
    """Inside a transaction: check the lease and the predecessor, then apply in order,
    stopping at the first conflict."""
    items, after, lease = call
    if lease is not None:
        _check_lease(conn, lease)
    if after is not None and conn.execute(sql.FIND, (after,)).fetchone() is None:
        raise PredecessorMissing(after)
    ids = [item.event["id"] for item in items]
    if len(set(ids)) == len(ids) and not _known(conn, ids):
        # The common case, every ID new: one statement for the inbox rows and one
        # per SKU for the inventory, instead of two or three per event.
        conn.executemany(sql.INSERT, [_row(item, now) for item in items])
        conn.executemany(sql.APPLY, _totals(items).items())
        return BatchReceipt([Received(Receipt.APPLIED, i.canonical) for i in items], None)
    done: list[Received] = []
    for item in items:
        try:
            done.append(_apply(conn, item, now))
        except Conflict as exc:
            return BatchReceipt(done, exc)  # the prefix commits; nothing of this one ran
    return BatchReceipt(done, None)


def _check_lease(conn: sqlite3.Connection, lease: Lease) -> None:
    """StaleLease if a higher epoch of its line was seen; else record its epoch as the
    highest seen (a write only when it is higher)."""
    row = conn.execute(sql.LEASE_SEEN, (lease.source, lease.line)).fetchone()
    seen = None if row is None else int(row[0])
    if seen is not None and lease.epoch < seen:
        raise StaleLease(lease.source, lease.line, lease.epoch, seen)
    if seen != lease.epoch:
        conn.execute(sql.RAISE_LEASE, (lease.source, lease.line, lease.epoch))


def _known(conn: sqlite3.Connection, ids: list[str]) -> bool:
    """Whether the inbox holds any of these IDs."""
    return conn.execute(sql.FIND_MANY, (json.dumps(ids),)).fetchone() is not None


def _row(item: Incoming, now: float) -> tuple[str, str, str, float, float]:
    """The parameters of sql.INSERT for one event."""
    return (item.event["id"], item.event["type"], item.canonical, now, now)


def _totals(items: Sequence[Incoming]) -> dict[str, int]:
    """The quantity each SKU gains from the orders among these events (additions
    commute; any other event adds nothing)."""
    totals: dict[str, int] = {}
    for item in items:
        if item.order is not None:
            sku = item.order["sku"]
            totals[sku] = totals.get(sku, 0) + item.order["qty"]
    return totals


def _apply(conn: sqlite3.Connection, item: Incoming, now: float) -> Received:
    """Inside a transaction: record the event and apply its effect, or count a
    duplicate. A conflict raises before anything of this event is written."""
    event_id = item.event["id"]
    if conn.execute(sql.INSERT, _row(item, now)).rowcount == 1:
        if item.order is not None:
            conn.execute(sql.APPLY, (item.order["sku"], item.order["qty"]))
        return Received(Receipt.APPLIED, item.canonical)
    (known,) = conn.execute(sql.FIND, (event_id,)).fetchone()
    if known != item.canonical:
        raise Conflict(event_id)
    conn.execute(sql.COUNT_DUPLICATE, (now, event_id))
    return Received(Receipt.DUPLICATE, known)
