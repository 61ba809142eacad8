"""The SQLite outbox: orders and their pending deliveries in one SQLite file.

The interface, rows and limits are in `publisher.store`; the SQL is in
`publisher.backends.sqlite_sql`. Transactions run in one call each, on the
connection's thread or inline on the event loop's (sqlite_tx). Intake and marks of
concurrent callers share one commit (group commit): SQLite has one writer at a
time, so their transactions would otherwise wait for one another's fsync in turn.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import sqlite3
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple, Self

from plumbing.group_commit import Arrivals, GroupCommit
from plumbing.storage import TRIAL_ID, TRIAL_TYPE, StorageError
from publisher.backends import relay_lock
from publisher.backends import sqlite_sql as sql
from publisher.backends.rows import (
    entry_of,
    fence_error,
    judged_again,
    line_lease_of,
    pending_of,
    quarantine_record_of,
    relay_worker_of,
)
from publisher.errors import InvalidTransition, LeaseLost, UnknownEntry
from publisher.store import (
    DELIVERED_PAST_KEPT,
    MAX_READ,
    PRUNE_BATCH,
    WORKERS_KEPT_S,
    Entry,
    Head,
    Intake,
    LineLease,
    Mark,
    Order,
    Outbox,
    Pending,
    Publication,
    QuarantineRecord,
    RelayWorker,
    Snapshot,
    State,
    check_lease_request,
    check_limit,
    check_seen_epoch,
    check_ttl,
    counts_by_interval,
    interval_params,
    lane_of,
    page_params,
)
from shared import MAX_BATCH, Conflict, Lease
from shared.ack import ack_json
from shared.event import Order as ValidOrder  # publisher.store.Order is an order's row
from sqlite_tx import Database, InlineWrites, SqliteFile, transaction, unsynced

LANE_SCAN_ROWS: Final = 1024  # pending entries read in seq order to find lanes to start
# Passes of the event loop before a group is taken (plumbing.group_commit): a request
# whose bytes are in its socket when the group starts needs three to reach the queue
# (the read and parse, the handler's task starting, its submit); one more for bytes
# that land during those. Measured in `e2e_single`: 2 passes gave no gain, 3 to 6 did.
GATHER_PASSES: Final = 4
# An event whose canonical form has this many characters or more is kept in
# outbox_payloads instead of its entry's row. A mark rewrites the whole row, so with the
# event in it each mark writes the event once more: measured with sqlite3, marking and
# committing in transactions of 128 took 53 us per 2 KB event and 337 us per 32 KB one
# in the row, 18 and 13 us apart, against one more insert per event at intake. Below
# this the row is cheaper (PostgreSQL does the same on its own: TOAST).
PAYLOAD_APART_CHARS: Final = 2048


class _Marks(NamedTuple):
    """One mark_sent_many call: its marks' parameters, and the lease fencing them."""

    params: list[dict[str, Any]]
    lease: Lease | None


class _Intake(NamedTuple):
    """One intake call (publish_many, accept_many): its validated events, and their time."""

    items: list[Publication]
    now: float


_Write = _Intake | _Marks
_Written = list[Intake | Conflict] | None  # an intake call's outcomes; None for marks


class SqliteOutbox(SqliteFile, Outbox):
    """Orders and outbox entries in one SQLite file.

    Leases work as on PostgreSQL, on the host's clock; the relay's flock still keeps
    one relay per file, so its worker always wins its leases. A fenced write checks
    its line's epoch inside its own BEGIN IMMEDIATE: no take can come in between."""

    SCHEMA = sql.SCHEMA

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._source = ""
        self._writes: GroupCommit[_Write, _Written] = GroupCommit(
            self._commit, gather_passes=GATHER_PASSES, deadline=db.deadline
        )
        self._arrivals = Arrivals()
        self._inline = InlineWrites()

    @classmethod
    async def connect(cls, path: str | Path) -> Self:
        """Open (or create) the file, bring its schema up to date, read its source ID."""
        outbox = await super().connect(path)
        try:
            outbox._source = await outbox._db.run(lambda c: c.execute(sql.SOURCE).fetchone()[0])
        except BaseException:
            await outbox.close()
            raise
        return outbox

    @property
    def source(self) -> str:
        return self._source

    @property
    def intake_in_progress(self) -> int:
        """Intake requests between arrival and reply, as reported through `arriving`."""
        return self._arrivals.count

    def arriving(self) -> Arrivals:
        return self._arrivals

    async def _commit(self, calls: list[_Write]) -> list[_Written | Exception]:
        """One group's transaction, inline on the event loop's thread while the
        writes have been quick (sqlite_tx.InlineWrites), else on the database thread.

        Inline saves the two hand-offs to the thread, which on a quick disk take
        longer than the commit itself (the thread waits for the GIL after each
        statement while the loop runs Python); the loop reads nothing during an
        inline commit, so the group is taken only after a few passes of the loop
        (GATHER_PASSES), and the requests that arrive during it make the next one.
        After a slow write (a slow disk, a checkpoint) or one that found the write
        lock held by another connection, groups go to the database thread for a while, where the
        loop reads and answers the next group's requests while this one's fsync
        runs; a call alone with no other intake request in progress (`arriving`)
        still commits inline then, as nobody waits behind it. Inline also falls back
        to the thread while a call runs there (Database.run_inline)."""
        commit = functools.partial(_write_groups, calls=calls, source=self._source)
        if self._inline.allowed or (len(calls) == 1 and self._arrivals.count <= 1):
            return await self._db.run_inline(self._inline.timed(commit))
        return await self._db.run(commit)

    async def check_real_writes(self) -> None:
        """Intake's and the relay's writes tried on the real tables under TRIAL_ID,
        rolled back (Database.rehearse): a trigger that raises or a constraint of the
        user's own fails this as it fails them."""
        now = time.time()

        def trial(conn: sqlite3.Connection) -> None:
            conn.execute(sql.INSERT_ENTRY, (TRIAL_ID, TRIAL_TYPE, "{}", now, None))
            conn.execute(sql.INSERT_ORDER, (TRIAL_ID, "readiness", 1, now))
            conn.execute(sql.MARK_PENDING_SENT, {"id": TRIAL_ID, "now": now, "ack": "{}"})

        await self._db.rehearse(trial)

    def relay_lock(self, owner: str) -> contextlib.AbstractAsyncContextManager[None]:
        """An exclusive flock on `<db>.relay-lock`, held until the block ends or the
        process dies (see publisher.backends.relay_lock)."""
        return relay_lock.relay_lock(self.path, owner)

    async def _queue(self, items: list[Publication]) -> list[Intake | Conflict]:
        """Intake asked for while another write is being committed is committed with
        the marks and intake waiting with it, in the next transaction (group commit),
        each call in a savepoint of its own; a group is taken after GATHER_PASSES
        passes of the loop and committed as _commit says."""
        outcomes = await self._writes.submit(_Intake(items, time.time()))
        assert outcomes is not None
        return outcomes

    async def pending_batch(
        self, limit: int = MAX_BATCH, lane: str | None = None, skip: Iterable[str] = ()
    ) -> list[Pending]:
        skip = set(skip)
        check_limit(limit, MAX_READ)
        if skip:
            marking = {"lane": lane, "skip": json.dumps(sorted(skip)), "limit": limit}
            query = sql.PENDING_SKIPPING if lane is None else sql.PENDING_IN_LANE_SKIPPING
            rows = await self._db.run(lambda conn: conn.execute(query, marking).fetchall())
            return [pending_of(row) for row in rows]
        query, params = (
            (sql.PENDING, (limit,)) if lane is None else (sql.PENDING_IN_LANE, (lane, limit))
        )
        rows = await self._db.run(lambda conn: conn.execute(query, params).fetchall())
        return [pending_of(row) for row in rows]

    async def pending_lanes(
        self, limit: int, skip: Iterable[str] = (), worker: str | None = None
    ) -> list[str]:
        check_limit(limit, most=sys.maxsize)
        skip = set(skip)
        return await self._db.run(lambda conn: _pending_lanes(conn, limit, skip, worker))

    async def head_ids(self, lanes: Sequence[str | None]) -> dict[str | None, str | None]:
        return await self._db.run(lambda conn: _head_ids(conn, lanes))

    async def mark_sent_many(self, marks: Sequence[Mark], lease: Lease | None = None) -> None:
        """Marks asked for while another write is being committed are committed
        together in the next transaction (group commit), with the intake waiting then:
        with several lanes in flight and orders coming in, one fsync serves them all.

        A transaction of marks alone, every entry pending (the common case), does
        not sync the WAL (sqlite_tx.unsynced): the marks survive the end of this
        process, but a power loss or an OS crash may undo the last of them, up to
        the next synced commit. An entry whose mark is undone is pending again and
        is sent again, with the same ID, and the sink answers it with a duplicate
        ACK: the cost of the loss is one more request per entry, never a lost or
        doubled event. A mark that closes a quarantine syncs (see _marks_alone)."""
        now = time.time()
        params = [
            {"id": event_id, "now": now, "ack": None if ack is None else ack_json(ack)}
            for event_id, ack in marks
        ]
        if not params:
            return
        await self._writes.submit(_Marks(params, lease))

    async def record_failure(self, event_id: str, error: str, lease: Lease | None = None) -> None:
        """Count a failed attempt on a pending entry and keep its error."""
        params = {"id": event_id, "error": error, "now": time.time()}
        if lease is None:
            await self._db.run(lambda conn: conn.execute(sql.RECORD_FAILURE, params))
            return
        await self._db.run(lambda conn: _record_failure(conn, params, lease, self._source))

    async def quarantine(
        self, event_id: str, reason: str, by: str, lease: Lease | None = None
    ) -> None:
        """Take a pending entry out of the line; it is neither pending nor sent."""
        params = {"id": event_id, "reason": reason, "by": by, "now": time.time()}
        await self._db.run(lambda conn: _quarantine(conn, params, lease, self._source))

    # ------------------------------------------------------------------ leases

    async def worker_seen(self, worker: str, ttl_s: float, *, first: bool = False) -> int:
        check_ttl(ttl_s)
        params = {"worker": worker, "now": time.time(), "ttl": ttl_s, "first": first}
        return await self._db.run(lambda conn: _worker_seen(conn, params))

    async def worker_gone(self, worker: str) -> None:
        await self._db.run(lambda conn: conn.execute(sql.WORKER_GONE, (worker,)))

    async def workers(self, ttl_s: float) -> list[RelayWorker]:
        check_ttl(ttl_s)
        params = {"now": time.time(), "ttl": ttl_s, "kept": WORKERS_KEPT_S}
        rows = await self._db.run(lambda conn: conn.execute(sql.WORKERS, params).fetchall())
        return [relay_worker_of(row) for row in rows]

    async def take_lease(self, line: str, worker: str, ttl_s: float) -> int | None:
        return await self.take_lease_past(line, worker, ttl_s, 0)

    async def take_lease_past(self, line: str, worker: str, ttl_s: float, seen: int) -> int | None:
        check_lease_request(line, ttl_s)
        params = {
            "line": line,
            "worker": worker,
            "now": time.time(),
            "ttl": ttl_s,
            "past": check_seen_epoch(seen),
        }
        return await self._db.run(lambda conn: _take_lease(conn, params))

    async def renew_leases(self, worker: str, held: Mapping[str, int], ttl_s: float) -> set[str]:
        check_ttl(ttl_s)
        params = [
            {"line": line, "epoch": epoch, "worker": worker, "now": time.time(), "ttl": ttl_s}
            for line, epoch in held.items()
        ]
        return await self._db.run(lambda conn: _each_lease(conn, sql.RENEW_LEASE, params))

    async def release_leases(self, worker: str, held: Mapping[str, int]) -> None:
        params = [{"line": line, "epoch": epoch, "worker": worker} for line, epoch in held.items()]
        await self._db.run(lambda conn: _each_lease(conn, sql.RELEASE_LEASE, params))

    async def leases(self) -> list[LineLease]:
        now = time.time()
        rows = await self._db.run(lambda conn: conn.execute(sql.LEASES, {"now": now}).fetchall())
        return [line_lease_of(row) for row in rows]

    async def lease_of(self, line: str) -> LineLease | None:
        params = {"now": time.time(), "line": line}
        row = await self._db.run(lambda conn: conn.execute(sql.LEASE_OF, params).fetchone())
        return None if row is None else line_lease_of(row)

    # ------------------------------------------------------------------ operators

    async def redrive(self, event_id: str, by: str) -> QuarantineRecord:
        """Make a quarantined entry pending again at its own seq, so it goes next
        (after a batch the relay has already read or sent).

        Returns the closed quarantine record, with the entries delivered past it.
        """
        return await self._db.run(lambda conn: _redrive(conn, event_id, by, time.time()))

    async def entry(self, event_id: str) -> Entry | None:
        row = await self._db.run(lambda conn: conn.execute(sql.ENTRY_BY_ID, (event_id,)).fetchone())
        return None if row is None else entry_of(row)

    async def pruned(self, event_id: str) -> bool:
        row = await self._db.run(lambda conn: conn.execute(sql.PRUNED_ID, (event_id,)).fetchone())
        return row is not None

    async def entries(
        self,
        state: State,
        limit: int = 100,
        *,
        after: int | None = None,
        key: str | None = None,
        type: str | None = None,
    ) -> list[Entry]:
        """Entries in one state: pending and quarantined oldest first, sent newest first."""
        query = {
            State.PENDING: sql.ENTRIES_PENDING,
            State.QUARANTINED: sql.ENTRIES_QUARANTINED,
            State.SENT: sql.ENTRIES_SENT,
        }[state]
        params = page_params(state, limit, after, key, type)
        rows = await self._db.run(lambda conn: conn.execute(query, params).fetchall())
        return [entry_of(row) for row in rows]

    async def sent_per_interval(self, interval_s: float, intervals: int) -> list[int]:
        params = interval_params(interval_s, intervals, time.time())
        rows = await self._db.run(
            lambda conn: conn.execute(sql.SENT_PER_INTERVAL, params).fetchall()
        )
        return counts_by_interval(rows, intervals)

    async def order(self, event_id: str) -> Order | None:
        row = await self._db.run(lambda conn: conn.execute(sql.FIND_ORDER, (event_id,)).fetchone())
        return None if row is None else Order(event_id, *row)

    async def quarantine_history(self, ids: list[str]) -> dict[str, list[QuarantineRecord]]:
        """Quarantine records of several entries in one read, oldest first."""

        def read(conn: sqlite3.Connection) -> dict[str, list[QuarantineRecord]]:
            history: dict[str, list[QuarantineRecord]] = {}
            for event_id in ids:
                rows = conn.execute(sql.QUARANTINES_OF, (event_id,)).fetchall()
                if rows:
                    history[event_id] = [quarantine_record_of(row) for row in rows]
            return history

        return await self._db.run(read)

    async def snapshot(self) -> Snapshot:
        """Pending and quarantined counts and the head entry, from indexed reads."""
        return await self._db.run(lambda conn: _snapshot(conn, time.time()))

    async def prune(self, older_than_s: float, batch: int = PRUNE_BATCH) -> int:
        """Delete sent entries older than `older_than_s`, `batch` rows per transaction."""
        cutoff = time.time() - older_than_s
        deleted = 0
        while True:
            # One short transaction per batch: intake waits at most one batch for the lock.
            count = await self._db.run(lambda conn: _prune_batch(conn, cutoff, batch))
            deleted += count
            if count < batch:
                return deleted


def queue_event(conn: sqlite3.Connection, item: Publication, now: float) -> Intake:
    """The event's outbox entry (and its order row, for an order), in the transaction
    `conn` is in (intake's own, or the caller's through publisher.in_transaction).
    SQLite lets one writer at a time take a seq and commit, so entries become visible
    in seq order without a lock of ours."""
    event, order = item.event, item.order
    stored, digest = conn.execute(sql.KNOWN, {"id": event["id"]}).fetchone()
    if stored is not None or digest is not None:
        return judged_again(item, stored, digest)  # "duplicate", or Conflict
    if order is not None:
        conn.execute(sql.INSERT_ORDER, _order_row(order, now))
    conn.execute(sql.INSERT_ENTRY, _entry_row(item, now))
    if _kept_apart(item):
        conn.execute(sql.INSERT_PAYLOAD_APART, (item.canonical, event["id"]))
    return "accepted"


def _order_row(order: ValidOrder, now: float) -> tuple[object, ...]:
    """An order's parameters of INSERT_ORDER."""
    return (order["id"], order["sku"], order["qty"], now)


def _entry_row(item: Publication, now: float) -> tuple[object, ...]:
    """An event's parameters of INSERT_ENTRY: a large event's payload is '' (its
    canonical form goes to outbox_payloads, INSERT_PAYLOAD_APART)."""
    event = item.event
    payload = "" if _kept_apart(item) else item.canonical
    return (event["id"], event["type"], payload, now, lane_of(event))


def _kept_apart(item: Publication) -> bool:
    """Whether the event is large enough to be kept in outbox_payloads, written once,
    rather than in its entry's row, which every mark rewrites (PAYLOAD_APART_CHARS)."""
    return len(item.canonical) >= PAYLOAD_APART_CHARS


def _prune_batch(conn: sqlite3.Connection, cutoff: float, batch: int) -> int:
    """Delete up to `batch` sent entries older than `cutoff`, keeping their digests."""
    params = {"cutoff": cutoff, "batch": batch}
    with transaction(conn):
        conn.execute(sql.KEEP_PRUNED_DIGESTS, params)
        conn.execute(sql.PRUNE_PAYLOADS, params)
        return conn.execute(sql.PRUNE_SENT, params).rowcount


def _pending_lanes(
    conn: sqlite3.Connection, limit: int, skip: set[str], worker: str | None
) -> list[str]:
    """Read pending entries in seq order: the first entry of each lane is its head.
    With many lanes the first rows name enough of them; when the first
    LANE_SCAN_ROWS rows do not (a few lanes, or lanes left out, hold the head of
    the line), walk the lane index instead, at a cost per lane. With `worker`, the
    lanes other owners hold are left out as those in `skip` are."""
    if worker is not None:
        held = conn.execute(sql.HELD_BY_OTHERS, {"worker": worker, "now": time.time()})
        skip = skip | {line for (line,) in held}
    lanes: list[str] = []
    seen = set(skip)
    rows = conn.execute(sql.PENDING_LANE_OF_EACH)
    try:
        for (lane,) in itertools.islice(rows, LANE_SCAN_ROWS):
            if lane is not None and lane not in seen:
                seen.add(lane)
                lanes.append(lane)
                if len(lanes) == limit:
                    return lanes
        if rows.fetchone() is None:
            return lanes  # every pending entry was read
    finally:
        rows.close()
    params = {"limit": limit, "skip": json.dumps(sorted(skip))}
    return [lane for (lane,) in conn.execute(sql.PENDING_LANES, params)]


def _head_ids(
    conn: sqlite3.Connection, lanes: Sequence[str | None]
) -> dict[str | None, str | None]:
    with transaction(conn, immediate=False):  # one view of every line
        heads: dict[str | None, str | None] = {}
        for lane in lanes:
            query, params = (sql.HEAD_ID, ()) if lane is None else (sql.HEAD_ID_IN_LANE, (lane,))
            row = conn.execute(query, params).fetchone()
            heads[lane] = None if row is None else row[0]
        return heads


def _write_groups(
    conn: sqlite3.Connection, calls: list[_Write], source: str
) -> list[_Written | Exception]:
    """Intake and marks of several calls in one transaction; one outcome per call.
    Each call fails alone (its savepoint rolled back); should the transaction
    itself fail (its COMMIT, say), every call fails with it (plumbing.group_commit)."""
    marks = [n for n, call in enumerate(calls) if isinstance(call, _Marks)]
    mark_calls = [call for call in calls if isinstance(call, _Marks)]
    if len(mark_calls) == len(calls):
        quick = _marks_alone(conn, mark_calls, source)
        if quick is not None:
            return list(quick)
    with transaction(conn):
        outcomes = _intake_all_new(conn, calls)
        if outcomes is None:
            outcomes = [
                _intake_call(conn, call) if isinstance(call, _Intake) else None for call in calls
            ]
        marked = _mark_groups(conn, mark_calls, source)
        for n, outcome in zip(marks, marked, strict=True):
            outcomes[n] = outcome
        return outcomes


def _intake_all_new(
    conn: sqlite3.Connection, calls: list[_Write]
) -> list[_Written | Exception] | None:
    """The common case of a group of several events, in one read and two
    executemany: every event new and each ID once, all accepted (one outcome per
    call, None for marks). None, with nothing written, in any other case (a known or
    repeated ID, or an insert that fails), for each call to be made on its own.

    The rows are bound as parameters: an INSERT ... SELECT from a JSON array of them
    (json_each) made SQLite parse every payload once per json_extract, which cost a
    1 KiB event 15 us a row against 6 (and an order 3 against 2)."""
    items = [(item, call.now) for call in calls if isinstance(call, _Intake) for item in call.items]
    ids = [item.event["id"] for item, _ in items]
    if len(items) < 2 or len(set(ids)) != len(ids):
        return None
    if conn.execute(sql.ANY_KNOWN, {"ids": json.dumps(ids)}).fetchone()[0]:
        return None
    orders = [_order_row(item.order, now) for item, now in items if item.order is not None]
    entries = [_entry_row(item, now) for item, now in items]
    conn.execute("SAVEPOINT all_new")
    try:
        conn.executemany(sql.INSERT_ORDER, orders)
        conn.executemany(sql.INSERT_ENTRY, entries)
        apart = [(item.canonical, item.event["id"]) for item, _ in items if _kept_apart(item)]
        if apart:
            conn.executemany(sql.INSERT_PAYLOAD_APART, apart)
    except sqlite3.Error:
        conn.execute("ROLLBACK TO all_new")
        conn.execute("RELEASE all_new")
        return None
    conn.execute("RELEASE all_new")
    return [["accepted"] * len(call.items) if isinstance(call, _Intake) else None for call in calls]


def _intake_call(conn: sqlite3.Connection, call: _Intake) -> list[Intake | Conflict] | Exception:
    """One intake call's events, in the caller's transaction: each event's outcome,
    or the StorageError that undid all of them."""
    conn.execute("SAVEPOINT one_call")
    try:
        outcomes = [_queue_or_conflict(conn, item, call.now) for item in call.items]
    except sqlite3.Error as exc:
        conn.execute("ROLLBACK TO one_call")
        conn.execute("RELEASE one_call")
        failed = StorageError(f"intake failed: {exc}")
        failed.__cause__ = exc
        return failed
    conn.execute("RELEASE one_call")
    return outcomes


def _queue_or_conflict(
    conn: sqlite3.Connection, item: Publication, now: float
) -> Intake | Conflict:
    try:
        return queue_event(conn, item, now)
    except Conflict as exc:  # raised before the event wrote anything
        return exc


def _marks_alone(
    conn: sqlite3.Connection, calls: list[_Marks], source: str
) -> list[Exception | None] | None:
    """A group of marks alone in the common case (every entry pending and unquarantined;
    each call fenced as in _mark_groups), committed without a sync (see
    SqliteOutbox.mark_sent_many): one error (or None) per call. None, with nothing
    written, in any other case, for the caller to commit with a sync: there a mark
    may close a quarantine (the ACK came after the entry was quarantined), and one
    undone by a power loss would leave the entry quarantined, not pending again."""
    with unsynced(conn), transaction(conn):
        outcomes, free = _fence_calls(conn, calls, source)
        if _mark_all_pending(conn, [one for n in free for one in calls[n].params]):
            return outcomes
    return None


def _mark_groups(
    conn: sqlite3.Connection, calls: list[_Marks], source: str
) -> list[Exception | None]:
    """Marks of several calls, in the caller's transaction; one error (or None) per
    call. A call whose lease no longer holds fails alone (LeaseLost), before
    anything is written."""
    outcomes, free = _fence_calls(conn, calls, source)
    for n, outcome in zip(free, _mark_unfenced(conn, [calls[n].params for n in free]), strict=True):
        outcomes[n] = outcome
    return outcomes


def _fence_calls(
    conn: sqlite3.Connection, calls: list[_Marks], source: str
) -> tuple[list[Exception | None], list[int]]:
    """Each call's refusal (LeaseLost, or None: it may be made), and the positions of
    the calls that may be made."""
    outcomes: list[Exception | None] = [_fenced(conn, c.lease, source) for c in calls]
    return outcomes, [n for n, outcome in enumerate(outcomes) if outcome is None]


def _mark_unfenced(
    conn: sqlite3.Connection, calls: list[list[dict[str, Any]]]
) -> list[Exception | None]:
    """Marks of several calls, in the caller's transaction; one error (or None) per call."""
    if not calls:
        return []
    if _mark_all_pending(conn, [one for params in calls for one in params]):
        return [None] * len(calls)
    return [_mark_call(conn, params) for params in calls]


def _mark_all_pending(conn: sqlite3.Connection, every: list[dict[str, Any]]) -> bool:
    """The common case, in one statement: every entry pending and unquarantined, and
    marked (True); else none of them is (False), and each call finds out on its own."""
    if not every:
        return True
    conn.execute("SAVEPOINT all_pending")
    try:
        all_pending = conn.executemany(sql.MARK_PENDING_SENT, every).rowcount == len(every)
    except sqlite3.Error:
        all_pending = False  # one call's entry, maybe
    if all_pending:
        conn.execute("RELEASE all_pending")
        return True
    conn.execute("ROLLBACK TO all_pending")
    conn.execute("RELEASE all_pending")
    return False


def _fenced(conn: sqlite3.Connection, lease: Lease | None, source: str) -> LeaseLost | None:
    """Why a write under `lease` must be refused now, in the caller's transaction."""
    if lease is None:
        return None
    row = conn.execute(sql.LEASE_EPOCH, (lease.line,)).fetchone()
    return fence_error(lease, source, None if row is None else row[0])


def _record_failure(
    conn: sqlite3.Connection, params: dict[str, Any], lease: Lease, source: str
) -> None:
    with transaction(conn):
        refused = _fenced(conn, lease, source)
        if refused is not None:
            raise refused
        conn.execute(sql.RECORD_FAILURE, params)


def _mark_call(conn: sqlite3.Connection, params: list[dict[str, Any]]) -> Exception | None:
    """One call's marks, each entry its own way, all or none of them."""
    conn.execute("SAVEPOINT one_call")
    try:
        for one in params:
            _mark_one(conn, one)
    except (InvalidTransition, UnknownEntry, sqlite3.Error) as exc:
        conn.execute("ROLLBACK TO one_call")
        conn.execute("RELEASE one_call")
        return StorageError(f"marking failed: {exc}") if isinstance(exc, sqlite3.Error) else exc
    conn.execute("RELEASE one_call")
    return None


def _mark_one(conn: sqlite3.Connection, params: dict[str, Any]) -> None:
    if conn.execute(sql.MARK_PENDING_SENT, params).rowcount == 1:
        return
    entry = _find(conn, params["id"])  # unknown, already sent, or quarantined
    if entry.state is State.QUARANTINED:
        # Quarantined while its send was in flight, and the ACK proves it arrived:
        # the truth is "delivered", and the quarantine record says so.
        _release(conn, entry, "relay", params["now"], "delivered")
    conn.execute(sql.MARK_SENT, params)


def _find(conn: sqlite3.Connection, event_id: str) -> Entry:
    row = conn.execute(sql.ENTRY_BY_ID, (event_id,)).fetchone()
    if row is None:
        raise UnknownEntry(event_id)
    return entry_of(row)


def _release(conn: sqlite3.Connection, entry: Entry, by: str, now: float, how: str) -> None:
    n, since = conn.execute(sql.OPEN_QUARANTINE, (entry.id,)).fetchone()
    passed = [r[0] for r in conn.execute(sql.DELIVERED_PAST, {"seq": entry.seq, "since": since})]
    kept = json.dumps(passed[:DELIVERED_PAST_KEPT])
    conn.execute(
        sql.CLOSE_QUARANTINE,
        {"by": by, "now": now, "how": how, "count": len(passed), "ids": kept, "n": n},
    )


def _quarantine(
    conn: sqlite3.Connection, params: dict[str, Any], lease: Lease | None, source: str
) -> None:
    with transaction(conn):
        refused = _fenced(conn, lease, source)
        if refused is not None:
            raise refused
        entry = _find(conn, params["id"])
        if entry.state is not State.PENDING:
            raise InvalidTransition(f"entry {entry.id!r} is {entry.state}, not pending")
        conn.execute(sql.QUARANTINE, (entry.id,))
        conn.execute(sql.INSERT_QUARANTINE, {**params, "seq": entry.seq})


def _redrive(conn: sqlite3.Connection, event_id: str, by: str, now: float) -> QuarantineRecord:
    with transaction(conn):
        entry = _find(conn, event_id)
        if entry.state is not State.QUARANTINED:
            raise InvalidTransition(f"entry {event_id!r} is {entry.state}, not quarantined")
        _release(conn, entry, by, now, "redriven")
        conn.execute(sql.REDRIVE, (event_id,))
        return quarantine_record_of(conn.execute(sql.QUARANTINES_OF, (event_id,)).fetchall()[-1])


def _snapshot(conn: sqlite3.Connection, now: float) -> Snapshot:
    with transaction(conn, immediate=False):  # one consistent view for all three reads
        return _snapshot_reads(conn, now)


def _snapshot_reads(conn: sqlite3.Connection, now: float) -> Snapshot:
    pending = conn.execute(sql.COUNT_PENDING).fetchone()[0]
    quarantined = conn.execute(sql.COUNT_QUARANTINED).fetchone()[0]
    row = conn.execute(sql.HEAD).fetchone()
    blocked = [Head(*r) for r in conn.execute(sql.BLOCKED_LANE_HEADS)]
    return Snapshot(now, pending, quarantined, None if row is None else Head(*row), blocked)


def _worker_seen(conn: sqlite3.Connection, params: dict[str, Any]) -> int:
    with transaction(conn):
        forgotten = params["now"] - WORKERS_KEPT_S
        conn.execute(sql.FORGET_WORKERS, {"forgotten": forgotten, "worker": params["worker"]})
        conn.execute(sql.WORKER_SEEN, params)
        live: int = conn.execute(sql.LIVE_WORKERS, params).fetchone()[0]
        return live


def _take_lease(conn: sqlite3.Connection, params: dict[str, Any]) -> int | None:
    with transaction(conn):
        rows = conn.execute(sql.TAKE_LEASE, params).fetchall()
    return None if not rows else int(rows[0][0])


def _each_lease(conn: sqlite3.Connection, statement: str, params: list[dict[str, Any]]) -> set[str]:
    """`statement` (a renewal or release) for each lease, in one transaction: the
    lines it changed."""
    with transaction(conn):
        return {one["line"] for one in params if conn.execute(statement, one).rowcount == 1}
