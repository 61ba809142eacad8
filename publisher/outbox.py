"""The outbox: orders and their pending deliveries, in the source database.

`Outbox` is the SQLite backend; its SQL is in `publisher.sql`. `dispatch` needs only
`pending` and `mark_sent`, so another backend is one new class.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Literal

from publisher import sql
from publisher.errors import InvalidTransition, UnknownEntry
from shared import Conflict, Event, canonical_json, validate_event
from shared.ack import ack_json
from sqlite_tx import Database, GroupCommit, StorageError, Store, transaction

MAX_BATCH: Final = 16
PRUNE_BATCH: Final = 500
LANE_SCAN_ROWS: Final = 1024  # pending entries read in seq order to find lanes to start
DELIVERED_PAST_KEPT: Final = 100

Intake = Literal["accepted", "duplicate"]


class State(StrEnum):
    PENDING = "pending"
    QUARANTINED = "quarantined"
    SENT = "sent"


@dataclass(frozen=True)
class Entry:
    """One outbox row as an operator sees it."""

    seq: int
    event: Event
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
    """The oldest pending entry: everything else waits behind it."""

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
    """The backlog figures behind status and metrics, read in one trip."""

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


MAX_READ: Final = 256


def check_limit(limit: object, most: int = MAX_BATCH) -> int:
    """Return `limit` if it is an int from 1 to `most`, else raise ValueError."""
    if type(limit) is not int or not 1 <= limit <= most:
        raise ValueError(f"limit must be an integer from 1 to {most}, got {limit!r}")
    return limit


class Outbox(Store):
    """Orders and outbox entries in one SQLite file."""

    MIGRATIONS = sql.MIGRATIONS

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._marks = GroupCommit(db, _mark_groups)

    async def accept(self, event: object) -> Intake:
        """Record the order and its outbox entry in one transaction: both or neither."""
        valid = validate_event(event)
        return await self._db.run(lambda conn: _accept(conn, valid, time.time()))

    async def pending(self, limit: int = MAX_BATCH) -> list[Event]:
        """Up to `limit` (1 to 16) pending events, oldest first by insertion order.
        Changes nothing."""
        return [event for _, event, _ in await self.pending_batch(check_limit(limit))]

    async def pending_batch(
        self, limit: int = MAX_BATCH, lane: str | None = None, skip: Iterable[str] = ()
    ) -> list[tuple[int, Event, int]]:
        """Like `pending`, with each entry's seq and attempts so far; only `lane`'s if
        given, and without the IDs in `skip`. Up to MAX_READ entries (a pipelined
        relay reads for several requests at once)."""
        skip = set(skip)
        check_limit(limit, MAX_READ)
        if skip:
            marking = {"lane": lane, "skip": json.dumps(sorted(skip)), "limit": limit}
            query = sql.PENDING_SKIPPING if lane is None else sql.PENDING_IN_LANE_SKIPPING
            rows = await self._db.run(lambda conn: conn.execute(query, marking).fetchall())
            return [(seq, json.loads(payload), attempts) for seq, payload, attempts in rows]
        query, params = (
            (sql.PENDING, (limit,)) if lane is None else (sql.PENDING_IN_LANE, (lane, limit))
        )
        rows = await self._db.run(lambda conn: conn.execute(query, params).fetchall())
        return [(seq, json.loads(payload), attempts) for seq, payload, attempts in rows]

    async def pending_lanes(self, limit: int, skip: Iterable[str] = ()) -> list[str]:
        """Lanes (SKUs) with pending entries, oldest head first, leaving out `skip`."""
        skip = set(skip)
        return await self._db.run(lambda conn: _pending_lanes(conn, limit, skip))

    async def mark_sent(self, event_id: str, ack: Mapping[str, object] | None = None) -> None:
        """Save the entry as sent, with the ACK that proved it. Idempotent once sent."""
        await self.mark_sent_many([(event_id, ack)])

    async def mark_sent_many(
        self, marks: Sequence[tuple[str, Mapping[str, object] | None]]
    ) -> None:
        """Save several entries as sent, each with its ACK: all of them or none.

        Marks asked for while another is being committed are committed together in
        the next transaction (group commit): with several lanes in flight, one fsync
        serves them all. Each call still succeeds or fails on its own.
        """
        now = time.time()
        params = [
            {"id": event_id, "now": now, "ack": None if ack is None else ack_json(ack)}
            for event_id, ack in marks
        ]
        if not params:
            return
        await self._marks.submit(params)

    async def record_failure(self, event_id: str, error: str) -> None:
        """Count a failed attempt on a pending entry and keep its error."""
        params = {"id": event_id, "error": error, "now": time.time()}
        await self._db.run(lambda conn: conn.execute(sql.RECORD_FAILURE, params))

    async def quarantine(self, event_id: str, reason: str, by: str) -> None:
        """Take a pending entry out of the line; it is neither pending nor sent."""
        params = {"id": event_id, "reason": reason, "by": by, "now": time.time()}
        await self._db.run(lambda conn: _quarantine(conn, params))

    async def redrive(self, event_id: str, by: str) -> QuarantineRecord:
        """Make a quarantined entry pending again at its own seq, so it goes next
        (after a batch the relay has already read or sent).

        Returns the closed quarantine record, with the entries delivered past it.
        """
        return await self._db.run(lambda conn: _redrive(conn, event_id, by, time.time()))

    async def entry(self, event_id: str) -> Entry | None:
        row = await self._db.run(lambda conn: conn.execute(sql.ENTRY_BY_ID, (event_id,)).fetchone())
        return None if row is None else _entry(row)

    async def entries(self, state: State, limit: int = 100) -> list[Entry]:
        """Entries in one state: pending and quarantined oldest first, sent newest first."""
        query = {
            State.PENDING: sql.ENTRIES_PENDING,
            State.QUARANTINED: sql.ENTRIES_QUARANTINED,
            State.SENT: sql.ENTRIES_SENT,
        }[state]
        rows = await self._db.run(lambda conn: conn.execute(query, (limit,)).fetchall())
        return [_entry(row) for row in rows]

    async def order(self, event_id: str) -> Order | None:
        row = await self._db.run(lambda conn: conn.execute(sql.FIND_ORDER, (event_id,)).fetchone())
        return None if row is None else Order(event_id, *row)

    async def quarantines(self, event_id: str) -> list[QuarantineRecord]:
        """Every stay of this entry in quarantine, oldest first."""
        return (await self.quarantine_history([event_id])).get(event_id, [])

    async def quarantine_history(self, ids: list[str]) -> dict[str, list[QuarantineRecord]]:
        """Quarantine records of several entries in one read, oldest first."""

        def read(conn: sqlite3.Connection) -> dict[str, list[QuarantineRecord]]:
            history: dict[str, list[QuarantineRecord]] = {}
            for event_id in ids:
                rows = conn.execute(sql.QUARANTINES_OF, (event_id,)).fetchall()
                if rows:
                    history[event_id] = [_quarantine_record(row) for row in rows]
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
            count = await self._db.run(
                lambda conn: conn.execute(sql.PRUNE_SENT, (cutoff, batch)).rowcount
            )
            deleted += count
            if count < batch:
                return deleted


def _accept(conn: sqlite3.Connection, event: Event, now: float) -> Intake:
    with transaction(conn):
        known = conn.execute(sql.FIND_ORDER, (event["id"],)).fetchone()
        if known is not None:
            if tuple(known[:2]) != (event["sku"], event["qty"]):
                raise Conflict(event["id"])
            return "duplicate"
        conn.execute(sql.INSERT_ORDER, (event["id"], event["sku"], event["qty"], now))
        conn.execute(sql.INSERT_ENTRY, (event["id"], canonical_json(event), now, event["sku"]))
    return "accepted"


def _pending_lanes(conn: sqlite3.Connection, limit: int, skip: set[str]) -> list[str]:
    """Read pending entries in seq order: the first entry of each lane is its head.
    With many lanes the first rows name enough of them; when the first
    LANE_SCAN_ROWS rows do not (a few lanes, or lanes left out, hold the head of
    the line), walk the lane index instead, at a cost per lane."""
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


def _mark_groups(
    conn: sqlite3.Connection, calls: list[list[dict[str, Any]]]
) -> list[Exception | None]:
    """Marks of several calls in one transaction; one error (or None) per call."""
    with transaction(conn):
        # Every entry pending and unquarantined (the common case): one statement.
        conn.execute("SAVEPOINT all_pending")
        every = [one for params in calls for one in params]
        try:
            all_pending = conn.executemany(sql.MARK_PENDING_SENT, every).rowcount == len(every)
        except sqlite3.Error:
            all_pending = False  # one call's entry, maybe: each call on its own finds out
        if all_pending:
            conn.execute("RELEASE all_pending")
            return [None] * len(calls)
        conn.execute("ROLLBACK TO all_pending")
        conn.execute("RELEASE all_pending")
        return [_mark_call(conn, params) for params in calls]


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
    return _entry(row)


def _release(conn: sqlite3.Connection, entry: Entry, by: str, now: float, how: str) -> None:
    n, since = conn.execute(sql.OPEN_QUARANTINE, (entry.id,)).fetchone()
    passed = [r[0] for r in conn.execute(sql.DELIVERED_PAST, {"seq": entry.seq, "since": since})]
    kept = json.dumps(passed[:DELIVERED_PAST_KEPT])
    conn.execute(
        sql.CLOSE_QUARANTINE,
        {"by": by, "now": now, "how": how, "count": len(passed), "ids": kept, "n": n},
    )


def _quarantine(conn: sqlite3.Connection, params: dict[str, Any]) -> None:
    with transaction(conn):
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
        return _quarantine_record(conn.execute(sql.QUARANTINES_OF, (event_id,)).fetchall()[-1])


def _snapshot(conn: sqlite3.Connection, now: float) -> Snapshot:
    with transaction(conn, immediate=False):  # one consistent view for all three reads
        return _snapshot_reads(conn, now)


def _snapshot_reads(conn: sqlite3.Connection, now: float) -> Snapshot:
    pending = conn.execute(sql.COUNT_PENDING).fetchone()[0]
    quarantined = conn.execute(sql.COUNT_QUARANTINED).fetchone()[0]
    row = conn.execute(sql.HEAD).fetchone()
    blocked = [Head(*r) for r in conn.execute(sql.BLOCKED_LANE_HEADS)]
    return Snapshot(now, pending, quarantined, None if row is None else Head(*row), blocked)


def _entry(row: tuple[Any, ...]) -> Entry:
    seq, _, payload, queued_at, sent, sent_at, ack, attempts, error, last_at, first_fail, q = row
    state = State.SENT if sent else State.QUARANTINED if q else State.PENDING
    return Entry(
        seq=seq,
        event=json.loads(payload),
        state=state,
        queued_at=queued_at,
        sent_at=sent_at,
        ack=None if ack is None else json.loads(ack),
        attempts=attempts,
        last_error=error,
        last_attempt_at=last_at,
        first_failure_at=first_fail,
    )


def _quarantine_record(row: tuple[Any, ...]) -> QuarantineRecord:
    reason, by, at, released_by, released_at, released_as, count, past = row
    return QuarantineRecord(
        reason=reason,
        quarantined_by=by,
        quarantined_at=at,
        released_by=released_by,
        released_at=released_at,
        released_as=released_as,
        delivered_past_count=count,
        delivered_past=[] if past is None else json.loads(past),
    )
