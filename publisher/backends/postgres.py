"""The PostgreSQL outbox: orders and their pending deliveries in a PostgreSQL database.

The interface, rows and limits are in `publisher.store`; the SQL is in
`publisher.backends.postgres_sql`; the pool, migrations, durable commits and error
translation are pg_tx's. What PostgreSQL adds to the SQLite backend's behaviour:

- Seq order is commit order: intake takes a transaction-level advisory lock right
  before its entry takes a seq, so entries become visible in seq order (see
  postgres_sql.ACCEPT).
- Intake sends NOTIFY in its transaction; `changes()` listens, so a relay in any
  process wakes when an entry is committed (polling stays the fallback).
- The relay lock is a session-level advisory lock on a connection of its own: it
  goes when the process (hence its connection) does.
- Transactions with several statements are sent in pipeline mode: one round trip.
  A group of marks in the common case is one statement, and so is a group of
  intake (every order of every call), each transaction one simple query
  (pg_tx.in_one_round_trip).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import json
import logging
import os
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeVar

import psycopg.errors

from pg_tx import (
    Conn,
    GroupCommit,
    PgDatabase,
    close_quietly,
    durable,
    in_one_round_trip,
    qualified,
    storage_error,
    translated_sync,
)
from plumbing.cli import utc_text
from plumbing.storage import TRIAL_ID, TRIAL_TYPE, StorageError
from publisher.backends import postgres_sql
from publisher.backends.rows import (
    entry_of,
    fence_error,
    judged_again,
    line_lease_of,
    pending_of,
    quarantine_record_of,
    relay_worker_of,
)
from publisher.errors import InvalidTransition, LeaseLost, RelayAlreadyRunning, UnknownEntry
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

T = TypeVar("T")
# postgres_sql's statements as they run: each table written in the outbox's schema, if
# one is named (pg_tx.qualified). Passed to the functions below that run statements.
Sql = Any

LANE_SCAN_ROWS: Final = 1024  # pending entries read in seq order to find lanes to start
RELAY_LOCK_WAIT_MS: Final = 300  # a holder that just died may still be ending its session
RELAY_LOCK_CHECK_S: Final = 0.5  # how often the relay lock's session is checked

# What readiness tries once a real write failed (check_real_writes), in a transaction
# rolled back: an entry and its order written as intake writes them, then the entry
# marked sent as the relay marks it, under TRIAL_ID. Here rather than in postgres_sql,
# whose statements are the outbox's own; a schema is written in them as in those
# (qualify).
TRIAL_INTAKE: Final = """
    WITH entry AS (
        INSERT INTO outbox_entries (id, type, payload, queued_at, lane)
        VALUES (%(id)s, %(type)s, '{}', %(now)s, NULL)
        RETURNING id
    )
    INSERT INTO outbox_orders (id, sku, qty, accepted_at)
    SELECT id, 'readiness', 1, %(now)s FROM entry
"""
TRIAL_MARK: Final = "UPDATE outbox_entries SET sent = 1, sent_at = %(now)s WHERE id = %(id)s"

log = logging.getLogger(__name__)
_HOLDER_NAME = re.compile(r"outbox relay (\d+)@([^:]*): (.*)", re.DOTALL)


class _Marks(NamedTuple):
    """One mark_sent_many call: its marks' parameters, and the lease fencing them."""

    params: list[dict[str, Any]]
    lease: Lease | None


class PostgresOutbox(Outbox):
    """Orders and outbox entries in one PostgreSQL database: in the schema the URI
    names (`schema=NAME`, written in every statement), else where its search_path
    finds them (made in the first schema it names)."""

    def __init__(self, db: PgDatabase, table_oid: int, source: str) -> None:
        self._db = db
        self._sql: Sql = qualified(postgres_sql, db.qualify)  # its statements, in its schema
        self._source = source
        self.relay_lock_key = postgres_sql.RELAY_LOCK_NS << 32 | table_oid
        self._marks: GroupCommit[_Marks, None] = GroupCommit(
            db, lambda conn, calls: _mark_groups(self._sql, conn, calls, source)
        )
        self._intake: GroupCommit[list[Publication], list[Intake | Conflict]] = GroupCommit(
            db, self._accept_group
        )

    @classmethod
    async def connect(cls, url: str, *, create: bool = True) -> PostgresOutbox:
        """Connect and bring the schema up to date (StorageError if it cannot); without
        `create`, BadLocation where there is no outbox (PgDatabase.open)."""
        db = await PgDatabase.open(url, postgres_sql.SCHEMA, create=create)
        try:
            [(oid,)] = await db.query(db.qualify(postgres_sql.ENTRIES_OID))
            [(source,)] = await db.query(db.qualify(postgres_sql.SOURCE))
        except BaseException:
            await db.close()
            raise
        return cls(db, int(oid), source)

    @property
    def source(self) -> str:
        return self._source

    @property
    def location(self) -> str:
        return self._db.location

    @property
    def database(self) -> PgDatabase:
        return self._db

    async def close(self) -> None:
        await self._db.close()

    async def check_writable(self) -> None:
        await self._db.check_writable()

    async def check_real_writes(self) -> None:
        """Intake's and the relay's writes tried on the real tables (TRIAL_INTAKE,
        TRIAL_MARK), rolled back: a full disk, a revoked privilege or a trigger that
        raises fails this as it fails them."""
        params = {"id": TRIAL_ID, "type": TRIAL_TYPE, "now": time.time()}
        intake, mark = self._db.qualify(TRIAL_INTAKE), self._db.qualify(TRIAL_MARK)

        async def trial(conn: Conn) -> None:
            await conn.execute(intake.encode(), params)
            await conn.execute(mark.encode(), params)

        await self._db.rehearse(trial)

    def changes(self) -> AsyncIterator[None] | None:
        """Wake-ups from NOTIFY, sent by every intake transaction at its commit.
        None with `prepare=off` (behind PgBouncer in transaction mode, where LISTEN
        does not hold): the relay polls alone."""
        if not self._db.settings.prepare:
            return None
        return self._db.notifications(self._sql.CHANNEL)

    @contextlib.asynccontextmanager
    async def relay_lock(self, owner: str) -> AsyncIterator[None]:
        """A session-level advisory lock, held by a connection of its own until the
        block ends; the server drops it when that connection closes, so a relay that
        died (even by SIGKILL) holds it no longer. The connection's application_name
        names the holder. If the session is lost while the block runs (the server
        restarted), the lock is taken again as soon as the server is back."""
        name = _fit_name(f"outbox relay {os.getpid()}@{socket.gethostname()}: {owner}")
        held = [await self._take_relay_lock(name, RELAY_LOCK_WAIT_MS)]
        keeper = asyncio.create_task(self._keep_relay_lock(held, name), name="relay lock")
        try:
            yield
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            await close_quietly(held[0])  # the session's end releases the lock

    async def _take_relay_lock(self, name: str, wait_ms: int) -> Conn:
        conn = await self._db.dedicated(name)
        try:
            with translated_sync(self.location):
                await conn.execute(self._sql.RELAY_LOCK_WAIT.encode(), (f"{wait_ms}ms",))
                try:
                    await conn.execute(self._sql.RELAY_LOCK.encode(), (self.relay_lock_key,))
                except psycopg.errors.LockNotAvailable:
                    holder = await _holder(conn, self.relay_lock_key)
                    raise RelayAlreadyRunning(self.location, holder) from None
        except BaseException:
            await close_quietly(conn)
            raise
        return conn

    async def _keep_relay_lock(self, held: list[Conn], name: str) -> None:
        """Check the lock's session every RELAY_LOCK_CHECK_S; once it is lost, take
        the lock again as soon as the server lets us."""
        while True:
            await asyncio.sleep(RELAY_LOCK_CHECK_S)
            try:
                await asyncio.wait_for(held[0].execute(b"SELECT 1"), RELAY_LOCK_CHECK_S * 5)
                continue
            except (psycopg.Error, TimeoutError) as exc:
                log.warning("the relay lock's database session was lost (%s): taking it again", exc)
            await close_quietly(held[0])
            said = False
            while True:
                try:
                    held[0] = await self._take_relay_lock(name, RELAY_LOCK_WAIT_MS)
                except RelayAlreadyRunning as exc:
                    if not said:  # two relays now: the sink still applies each event once
                        log.error("could not take the relay lock again: %s", exc)
                        said = True
                except StorageError:
                    pass  # the server is not back yet
                else:
                    log.info("relay lock taken again")
                    break
                await asyncio.sleep(RELAY_LOCK_CHECK_S)

    # ------------------------------------------------------------------ intake

    async def _queue(self, items: list[Publication]) -> list[Intake | Conflict]:
        """Record the orders and their outbox entries in one transaction, in one
        round trip. Intake asked for while another is being committed is committed
        together in the next transaction (group commit): the commit-order lock, held
        until commit, is then taken once for the group instead of once per order,
        and the relay hears one NOTIFY for the group (the server delivers a
        transaction's identical notifications once)."""
        return await self._intake.submit(items)

    # ------------------------------------------------------------------ the relay

    async def pending_batch(
        self, limit: int = MAX_BATCH, lane: str | None = None, skip: Iterable[str] = ()
    ) -> list[Pending]:
        skip = sorted(set(skip))
        check_limit(limit, MAX_READ)
        query: str
        params: Any
        if skip:
            query = (
                self._sql.PENDING_SKIPPING if lane is None else self._sql.PENDING_IN_LANE_SKIPPING
            )
            params = {"lane": lane, "skip": skip, "limit": limit}
        else:
            query, params = (
                (self._sql.PENDING, (limit,))
                if lane is None
                else (self._sql.PENDING_IN_LANE, (lane, limit))
            )
        rows = await self._db.query(query, params)
        return [pending_of(row) for row in rows]

    async def pending_lanes(
        self, limit: int, skip: Iterable[str] = (), worker: str | None = None
    ) -> list[str]:
        """The lanes of the first pending entries in seq order (the first entry of
        each lane is its head), found by the server. When those do not name enough
        lanes, hop along the lane index. With `worker`, the same statements also say
        which lanes other owners hold (one round trip still)."""
        check_limit(limit, most=sys.maxsize)
        skip = set(skip)
        if worker is None:
            query = self._sql.PENDING_LANES_OF_FIRST
            rows = await self._db.query(query, {"rows": LANE_SCAN_ROWS + 1})
        else:
            query = self._sql.PENDING_LANES_OF_FIRST_FOR
            rows = await self._db.query(query, {"rows": LANE_SCAN_ROWS + 1, "worker": worker})
        skip |= {row[0] for row in rows if row[2:] == (True,)}  # another owner's
        lanes = [row[0] for row in rows if row[0] is not None and row[0] not in skip][:limit]
        read = rows[0][1] if rows else 0
        if len(lanes) == limit or read <= LANE_SCAN_ROWS:
            return lanes  # enough, or every pending entry was read
        params = {"limit": limit, "skip": sorted(skip), "worker": worker}
        return [lane for (lane,) in await self._db.query(self._sql.PENDING_LANES, params)]

    async def head_ids(self, lanes: Sequence[str | None]) -> dict[str | None, str | None]:
        async def read(conn: Conn) -> dict[str | None, str | None]:
            cursors = [
                await (
                    conn.execute(self._sql.HEAD_ID.encode())
                    if lane is None
                    else conn.execute(self._sql.HEAD_ID_IN_LANE.encode(), (lane,))
                )
                for lane in lanes
            ]
            heads: dict[str | None, str | None] = {}
            for lane, cursor in zip(lanes, cursors, strict=True):
                row = await cursor.fetchone()
                heads[lane] = None if row is None else row[0]
            return heads

        if not lanes:
            return {}
        return await self._snapshot_read(read)

    async def mark_sent_many(self, marks: Sequence[Mark], lease: Lease | None = None) -> None:
        """Marks asked for while another group is being committed are committed
        together in the next transaction (group commit): with several lanes in
        flight, one transaction serves them all. The common case (every entry
        pending) is one statement for the whole group, sent with its BEGIN, settings
        and COMMIT as one message: one round trip.

        That common case's COMMIT does not wait for the WAL flush (pg_tx.UNFLUSHED):
        a crash of the server may undo the last marks, and an entry whose mark is
        undone is pending again, sent again with the same ID, and answered by the
        sink with a duplicate ACK: one more request per entry, never a lost or
        doubled event. The other case waits for it (`_mark_each`)."""
        now = time.time()
        params = [
            {"id": event_id, "now": now, "ack": None if ack is None else ack_json(ack)}
            for event_id, ack in marks
        ]
        if params:
            await self._marks.submit(_Marks(params, lease))

    async def record_failure(self, event_id: str, error: str, lease: Lease | None = None) -> None:
        params: dict[str, Any] = {"id": event_id, "error": error, "now": time.time()}
        if lease is None:
            async with self._db.transaction(pipeline=True) as conn:
                await conn.execute(self._sql.RECORD_FAILURE.encode(), params)
            return
        foreign = fence_error(lease, self._source, lease.epoch)  # another outbox's lease
        if foreign is not None:
            raise foreign
        params |= {"line": lease.line, "epoch": lease.epoch}
        async with self._db.transaction() as conn:
            cursor = await conn.execute(self._sql.FENCED_RECORD_FAILURE.encode(), params)
            [(epoch_now,)] = await cursor.fetchall()
        refused = fence_error(lease, self._source, epoch_now)
        if refused is not None:
            raise refused  # the statement wrote nothing

    # ------------------------------------------------------------------ leases

    async def worker_seen(self, worker: str, ttl_s: float, *, first: bool = False) -> int:
        check_ttl(ttl_s)
        params = {"worker": worker, "ttl": ttl_s, "kept": WORKERS_KEPT_S, "first": first}
        row = await self._lease_write(self._sql.WORKER_SEEN, params)
        assert row is not None  # the statement counts this worker at least
        return int(row[0])

    async def worker_gone(self, worker: str) -> None:
        async with self._db.transaction() as conn:
            await conn.execute(self._sql.WORKER_GONE.encode(), (worker,))

    async def workers(self, ttl_s: float) -> list[RelayWorker]:
        check_ttl(ttl_s)
        params = {"ttl": ttl_s, "kept": WORKERS_KEPT_S}
        return [relay_worker_of(row) for row in await self._db.query(self._sql.WORKERS, params)]

    async def take_lease(self, line: str, worker: str, ttl_s: float) -> int | None:
        return await self.take_lease_past(line, worker, ttl_s, 0)

    async def take_lease_past(self, line: str, worker: str, ttl_s: float, seen: int) -> int | None:
        check_lease_request(line, ttl_s)
        params = {"line": line, "worker": worker, "ttl": ttl_s, "past": check_seen_epoch(seen)}
        row = await self._lease_write(self._sql.TAKE_LEASE, params)
        return None if row is None else int(row[0])

    async def renew_leases(self, worker: str, held: Mapping[str, int], ttl_s: float) -> set[str]:
        check_ttl(ttl_s)
        if not held:
            return set()
        params = {**_held_params(worker, held), "ttl": ttl_s}
        row = await self._lease_write(self._sql.RENEW_LEASES, params)
        return set() if row is None else set(row[0])

    async def release_leases(self, worker: str, held: Mapping[str, int]) -> None:
        if held:
            await self._lease_write(self._sql.RELEASE_LEASES, _held_params(worker, held))

    async def _lease_write(self, statement: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        """A lease statement in a durable transaction of its own, sent as one message
        (pg_tx.in_one_round_trip): its first row. A worker makes one at every take,
        release and renewal; BEGIN, the settings, the statement and COMMIT one round
        trip each cost it (and the server) about as much as a request's mark."""
        async with self._db.connection() as conn:
            return await in_one_round_trip(conn, statement.encode(), params)

    async def leases(self) -> list[LineLease]:
        return [line_lease_of(row) for row in await self._db.query(self._sql.LEASES)]

    async def lease_of(self, line: str) -> LineLease | None:
        rows = await self._db.query(self._sql.LEASE_OF, (line,))
        return line_lease_of(rows[0]) if rows else None

    # ------------------------------------------------------------------ operators

    async def quarantine(
        self, event_id: str, reason: str, by: str, lease: Lease | None = None
    ) -> None:
        params = {"id": event_id, "reason": reason, "by": by, "now": time.time()}
        async with self._db.transaction() as conn:
            if lease is not None:  # the lease's row first, as every fenced write
                refused = await _fenced(self._sql, conn, [lease], self._source)
                if refused[0] is not None:
                    raise refused[0]
            entry = await _find(self._sql, conn, event_id)
            if entry.state is not State.PENDING:
                raise InvalidTransition(f"entry {entry.id!r} is {entry.state}, not pending")
            async with conn.pipeline():
                await conn.execute(self._sql.QUARANTINE.encode(), (event_id,))
                await conn.execute(
                    self._sql.INSERT_QUARANTINE.encode(), {**params, "seq": entry.seq}
                )

    async def redrive(self, event_id: str, by: str) -> QuarantineRecord:
        now = time.time()
        async with self._db.transaction() as conn:
            entry = await _find(self._sql, conn, event_id)
            if entry.state is not State.QUARANTINED:
                raise InvalidTransition(f"entry {event_id!r} is {entry.state}, not quarantined")
            await _release(self._sql, conn, entry, by, now, "redriven")
            await conn.execute(self._sql.REDRIVE.encode(), (event_id,))
            rows = await (
                await conn.execute(self._sql.QUARANTINES_OF.encode(), (event_id,))
            ).fetchall()
            return quarantine_record_of(rows[-1])

    async def entry(self, event_id: str) -> Entry | None:
        rows = await self._db.query(self._sql.ENTRY_BY_ID, (event_id,))
        return entry_of(rows[0]) if rows else None

    async def pruned(self, event_id: str) -> bool:
        return bool(await self._db.query(self._sql.PRUNED_ID, (event_id,)))

    async def entries(
        self,
        state: State,
        limit: int = 100,
        *,
        after: int | None = None,
        key: str | None = None,
        type: str | None = None,
    ) -> list[Entry]:
        query = {
            State.PENDING: self._sql.ENTRIES_PENDING,
            State.QUARANTINED: self._sql.ENTRIES_QUARANTINED,
            State.SENT: self._sql.ENTRIES_SENT,
        }[state]
        params = page_params(state, limit, after, key, type)
        return [entry_of(row) for row in await self._db.query(query, params)]

    async def sent_per_interval(self, interval_s: float, intervals: int) -> list[int]:
        # The marks' sent_at comes from the workers' clocks, so "now" is this one's.
        params = interval_params(interval_s, intervals, time.time())
        rows = await self._db.query(self._sql.SENT_PER_INTERVAL, params)
        return counts_by_interval(rows, intervals)

    async def order(self, event_id: str) -> Order | None:
        rows = await self._db.query(self._sql.FIND_ORDER, (event_id,))
        return Order(event_id, *rows[0]) if rows else None

    async def quarantine_history(self, ids: list[str]) -> dict[str, list[QuarantineRecord]]:
        history: dict[str, list[QuarantineRecord]] = {}
        if not ids:
            return history
        for event_id, *record in await self._db.query(self._sql.QUARANTINES_OF_ANY, (list(ids),)):
            history.setdefault(event_id, []).append(quarantine_record_of(tuple(record)))
        return {event_id: history[event_id] for event_id in ids if event_id in history}

    async def snapshot(self) -> Snapshot:
        """Counts, head and blocked lane heads in one snapshot, in one round trip."""
        now = time.time()

        async def read(conn: Conn) -> Snapshot:
            pending = await conn.execute(self._sql.COUNT_PENDING.encode())
            quarantined = await conn.execute(self._sql.COUNT_QUARANTINED.encode())
            head = await conn.execute(self._sql.HEAD.encode())
            blocked = await conn.execute(self._sql.BLOCKED_LANE_HEADS.encode())
            [(n_pending,)] = await pending.fetchall()
            [(n_quarantined,)] = await quarantined.fetchall()
            row = await head.fetchone()
            first = None if row is None else Head(*row)
            heads = [Head(*r) for r in await blocked.fetchall()]
            return Snapshot(now, n_pending, n_quarantined, first, heads)

        return await self._snapshot_read(read)

    async def prune(self, older_than_s: float, batch: int = PRUNE_BATCH) -> int:
        cutoff = time.time() - older_than_s
        deleted = 0
        while True:
            # One short transaction per batch: intake waits at most one batch.
            async with self._db.transaction(pipeline=True) as conn:
                cursor = await conn.execute(self._sql.PRUNE_SENT.encode(), (cutoff, batch))
            count = cursor.rowcount
            deleted += count
            if count < batch:
                return deleted

    # ------------------------------------------------------------------ helpers

    async def _accept_group(
        self, conn: Conn, calls: list[list[Publication]]
    ) -> list[list[Intake | Conflict] | Exception]:
        """Intake of several callers in one transaction, one statement sent with its
        BEGIN and COMMIT as one message; one outcome per call. Should the transaction
        fail, each call is tried again in a transaction of its own, so that it fails
        alone (a savepoint per call cannot keep the others of one statement)."""
        now = time.time()
        try:
            every = list(itertools.chain.from_iterable(calls))
            return _per_call(calls, await _accept_together(self._sql, conn, every, now))
        except psycopg.Error:
            if len(calls) == 1 or conn.closed:
                raise  # the connection is gone (the deadline cut it, say): so is the group
        outcomes: list[list[Intake | Conflict] | Exception] = []
        for items in calls:
            try:
                outcomes.append(await _accept_together(self._sql, conn, items, now))
            except psycopg.Error as exc:
                outcomes.append(storage_error(self.location, exc))
        return outcomes

    async def _snapshot_read(self, read: Callable[[Conn], Awaitable[T]]) -> T:
        """`read(conn)` in one REPEATABLE READ, read-only transaction, its statements
        pipelined."""
        async with self._db.connection() as conn:
            async with conn.pipeline(), conn.transaction():
                await conn.execute(b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                return await read(conn)


def accept_params(item: Publication, now: float) -> dict[str, Any]:
    """The parameters of postgres_sql.ACCEPT for one validated event."""
    event, order = item.event, item.order
    return {
        "id": event["id"],
        "type": event["type"],
        "key": lane_of(event),
        "sku": None if order is None else order["sku"],
        "qty": None if order is None else order["qty"],
        "now": now,
        "payload": item.canonical,
        "lock_ns": postgres_sql.INTAKE_LOCK_NS,
        "channel": postgres_sql.CHANNEL,
    }


def intake_result(item: Publication, queued: object, known: tuple[Any, ...] | None) -> Intake:
    """ "accepted" if ACCEPT queued the entry; else the ID was known already, and
    `known` is what the outbox holds for it (KNOWN's row: the stored payload and the
    pruned digest): "duplicate" if it is the same event, Conflict if not
    (rows.judged_again)."""
    if queued is not None:
        return "accepted"
    stored, digest = (None, None) if known is None else known
    return judged_again(item, stored, digest)


async def _find(sql: Sql, conn: Conn, event_id: str) -> Entry:
    """The entry, its row locked until the transaction ends (UnknownEntry if none)."""
    cursor = await conn.execute(sql.ENTRY_BY_ID_FOR_UPDATE.encode(), (event_id,))
    row = await cursor.fetchone()
    if row is None:
        raise UnknownEntry(event_id)
    return entry_of(row)


def _per_call(
    calls: list[list[Publication]], outcomes: list[Intake | Conflict]
) -> list[list[Intake | Conflict] | Exception]:
    """The outcomes of the calls' events, all in one list, cut back into one per call."""
    ends = list(itertools.accumulate(len(items) for items in calls))
    return [outcomes[end - len(items) : end] for items, end in zip(calls, ends, strict=True)]


async def _accept_together(
    sql: Sql, conn: Conn, items: list[Publication], now: float
) -> list[Intake | Conflict]:
    """Intake of `items` in one durable transaction, one message to the server
    (ACCEPT_MANY): the first event of each ID goes in, and every event is judged
    against what is then known of its ID, as calls one after another would be."""
    firsts: dict[str, Publication] = {}
    for item in items:
        firsts.setdefault(item.event["id"], item)
    orders = [item.order for item in firsts.values()]
    params = {
        "ids": list(firsts),
        "types": [item.event["type"] for item in firsts.values()],
        "keys": [lane_of(item.event) for item in firsts.values()],
        "payloads": [item.canonical for item in firsts.values()],
        "skus": [None if order is None else order["sku"] for order in orders],
        "qtys": [None if order is None else order["qty"] for order in orders],
        "now": now,
        "lock_ns": postgres_sql.INTAKE_LOCK_NS,
        "channel": postgres_sql.CHANNEL,
    }
    row = await in_one_round_trip(conn, sql.ACCEPT_MANY.encode(), params)
    assert row is not None, "an aggregate returns one row"
    queued = {event_id for event_id, new in zip(firsts, row[0], strict=True) if new}
    known: dict[str, tuple[str | None, str | None]] = {
        event_id: (payload, digest)
        for event_id, payload, digest in zip(firsts, row[1], row[2], strict=True)
        if payload is not None or digest is not None
    }
    # Queued by its first event: a later one in `items` is judged against that.
    known.update((i, (item.canonical, None)) for i, item in firsts.items() if i in queued)
    raced = [i for i in firsts if i not in known]
    if raced:  # committed by a concurrent intake while ours waited for it: read it now
        cursor = await conn.execute(sql.KNOWN_MANY.encode(), (raced,))
        known.update((i, (payload, digest)) for i, payload, digest in await cursor.fetchall())
        await conn.rollback()
    outcomes: list[Intake | Conflict] = []
    for item in items:
        event_id = item.event["id"]
        if item is firsts[event_id] and event_id in queued:
            outcomes.append("accepted")
            continue
        try:
            outcomes.append(judged_again(item, *known.get(event_id, (None, None))))
        except Conflict as exc:
            outcomes.append(exc)
    return outcomes


async def _mark_groups(
    sql: Sql, conn: Conn, calls: list[_Marks], source: str
) -> list[Exception | None]:
    """Marks of several calls, committed before this returns; one error (or None)
    per call. The common case (every lease at its epoch, every entry pending and
    unquarantined) is one statement for the whole group, its transaction one
    message (`_mark_all`). Otherwise nothing of that is written, and each call is
    marked on its own in one transaction (`_mark_each`)."""
    if all(c.lease is None or c.lease.source == source for c in calls):
        try:
            if await _mark_all(sql, conn, calls):
                return [None] * len(calls)
        except psycopg.Error:
            pass  # some call's entry, maybe: each call on its own finds out
    return await _mark_each(sql, conn, calls, source)


async def _mark_all(sql: Sql, conn: Conn, calls: list[_Marks]) -> bool:
    """All the marks in one statement (MARK_ALL_PENDING_SENT, or its FENCED form
    when calls name leases), BEGIN to COMMIT sent as one message: whether they were
    all made (else none was)."""
    every = [one for call in calls for one in call.params]
    params: dict[str, Any] = {
        "ids": [one["id"] for one in every],
        "acks": [one["ack"] for one in every],
        "nows": [one["now"] for one in every],
        "n": len(every),
    }
    statement = sql.MARK_ALL_PENDING_SENT
    pairs = {(c.lease.line, c.lease.epoch) for c in calls if c.lease is not None}
    if pairs:
        fences = dict(sorted(pairs))  # byte order, as the statement aggregates them
        if len(fences) < len(pairs):
            return False  # one line under two epochs: one of them is lost
        statement = sql.MARK_ALL_PENDING_SENT_FENCED
        params |= {"lines": list(fences), "epochs": list(fences.values())}
    row = await in_one_round_trip(conn, statement.encode(), params, flush=False)
    marked = 0 if row is None else int(row[0])
    # The rows are locked before any is marked: all of them or none.
    assert marked in (0, len(every)), f"{marked} of {len(every)} marks made"
    return marked == len(every)


async def _mark_each(
    sql: Sql, conn: Conn, calls: list[_Marks], source: str
) -> list[Exception | None]:
    """Each call's marks in a savepoint of its own, in one transaction, so that a
    call fails alone and all of it; a call whose lease is lost fails with LeaseLost
    and writes nothing. The lease rows are locked first, all together."""
    # Waits for its flush: a mark here may close a quarantine (_mark_one), and one a
    # crash undid would leave the entry quarantined, not pending again.
    async with conn.pipeline(), durable(conn):
        refused = await _fenced(sql, conn, [c.lease for c in calls], source)
        return [
            why if why is not None else await _mark_call(sql, conn, call.params)
            for call, why in zip(calls, refused, strict=True)
        ]


async def _fenced(
    sql: Sql, conn: Conn, leases: Sequence[Lease | None], source: str
) -> list[LeaseLost | None]:
    """Why each write under `leases` must be refused (None: it may be made, or names
    no lease), their rows locked in line order until the transaction ends (FENCES)."""
    lines = sorted({lease.line for lease in leases if lease is not None})
    if not lines:
        return [None] * len(leases)
    cursor = await conn.execute(sql.FENCES.encode(), {"lines": lines})
    epochs = dict(await cursor.fetchall())
    return [
        None if lease is None else fence_error(lease, source, epochs.get(lease.line))
        for lease in leases
    ]


def _held_params(worker: str, held: Mapping[str, int]) -> dict[str, Any]:
    return {"worker": worker, "lines": list(held), "epochs": list(held.values())}


async def _mark_call(sql: Sql, conn: Conn, params: list[dict[str, Any]]) -> Exception | None:
    """One call's marks, each entry its own way, all or none of them."""
    try:
        async with conn.transaction():  # a savepoint
            for one in params:
                await _mark_one(sql, conn, one)
    except (InvalidTransition, UnknownEntry) as exc:
        return exc
    except psycopg.Error as exc:
        return storage_error("marking failed", exc)
    return None


async def _mark_one(sql: Sql, conn: Conn, params: dict[str, Any]) -> None:
    entry = await _find(sql, conn, params["id"])
    if entry.state is State.SENT:
        return  # sent before (its first ACK and time are kept), or just now
    if entry.state is State.QUARANTINED:
        # Quarantined while its send was in flight, and the ACK proves it arrived:
        # the truth is "delivered", and the quarantine record says so.
        await _release(sql, conn, entry, "relay", params["now"], "delivered")
    await conn.execute(sql.MARK_SENT.encode(), params)


async def _release(sql: Sql, conn: Conn, entry: Entry, by: str, now: float, how: str) -> None:
    found = await (await conn.execute(sql.OPEN_QUARANTINE.encode(), (entry.id,))).fetchone()
    assert found is not None, f"entry {entry.id!r} is quarantined without an open record"
    n, since = found
    past = await conn.execute(sql.DELIVERED_PAST.encode(), {"seq": entry.seq, "since": since})
    passed = [r[0] for r in await past.fetchall()]
    kept = json.dumps(passed[:DELIVERED_PAST_KEPT])
    await conn.execute(
        sql.CLOSE_QUARANTINE.encode(),
        {"by": by, "now": now, "how": how, "count": len(passed), "ids": kept, "n": n},
    )


async def _holder(conn: Conn, key: int) -> str:
    """Who holds the relay lock, as its session's application_name says."""
    params = {"classid": key >> 32, "objid": key & 0xFFFFFFFF}
    rows = await (await conn.execute(postgres_sql.RELAY_HOLDER.encode(), params)).fetchall()
    if not rows:
        return "a process that has just let it go"
    name, started, backend = rows[0]
    found = _HOLDER_NAME.fullmatch(name or "")
    if found is None:
        return f"database session {backend} (application {name!r})"
    pid, host, owner = found.groups()
    since = utc_text(datetime.datetime.fromisoformat(started).timestamp(), "seconds")
    return f"{owner}, process {pid} on host {host} since {since}"


def _fit_name(name: str) -> str:
    """An application_name the server keeps whole: at most 63 bytes."""
    encoded = name.encode()[:63]
    return encoded.decode(errors="ignore")
