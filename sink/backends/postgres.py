"""The PostgreSQL inbox: the inbox and inventory tables in one PostgreSQL database.

The interface and rows are in `sink.store`; the SQL is in `sink.backends.postgres_sql`;
the pool, migrations, durable commits and error translation are pg_tx's.

The common case is one statement and one round trip: the calls of a group commit
(or a write alone) whose IDs are distinct and new and whose predecessors are in the
inbox, a pipeline's chain of requests included (a predecessor that is an event of an
earlier call of the group passes the check by it), go in with INSERT_CALLS, sent with BEGIN, the
durable-commit settings and COMMIT as one simple query. It takes the calls up to the
first that cannot go in that way; that call and those after it then run in a second
transaction, each tried as all new and else event by event (a redelivery, a
conflict: the prefix kept). Two transactions inserting the same ID apply it once:
the second one's insert waits for the first to commit and then does nothing (in
INSERT_CALLS the statement then raises serialization_failure and its transaction
runs again).

A leased call (Outbox-Lease) is checked in the same transaction: its line's epoch is
raised by an upsert on the line's `lease_fences` row (RAISE_LEASE, or in INSERT_CALLS
the group's highest epoch of each line), which waits for that row's lock and judges
its newest version, so two sinks applying one line's requests serialise there; a
stale call stops INSERT_CALLS like a missing predecessor, and is refused the long way.

How a write commits is decided here from the facts the HTTP layer reports
(`arriving`), as in the SQLite inbox: alone, in a transaction of its own; while
other writes are in progress, in a group commit, one transaction for all the calls
waiting, so they share one WAL flush (the same SKU's inventory row would otherwise
serialise their commits one flush at a time).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import psycopg.errors

from pg_tx import DURABLE, Conn, PgDatabase, describe, in_one_round_trip, qualified
from plumbing.group_commit import GroupCommit
from plumbing.storage import StorageError
from shared import Conflict, Lease, PredecessorMissing, Receipt, StaleLease
from sink.backends import postgres_sql
from sink.backends.sharing import Arrivals, Call
from sink.store import BatchReceipt, Inbox, InboxRecord, Incoming, Received

T = TypeVar("T")
ATTEMPTS: Final = 3  # a transaction that PostgreSQL chose to abort (deadlock) is run again
# Aborted whole, so running them again is safe (nothing of them committed).
_RETRYABLE: Final = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


class PostgresInbox(Inbox):
    """The sink's inbox and inventory in a PostgreSQL database (a libpq URI)."""

    def __init__(self, db: PgDatabase) -> None:
        self._db = db
        self._sql = qualified(postgres_sql, db.qualify)  # its statements, in its schema
        self._arrivals = Arrivals()
        self._groups: GroupCommit[Call, BatchReceipt] = GroupCommit(self._commit_group)

    @property
    def writes_in_progress(self) -> int:
        """Write requests between arrival and reply, as reported through `arriving`."""
        return self._arrivals.count

    @classmethod
    async def connect(cls, url: str) -> PostgresInbox:
        """Connect and bring the sink's schema up to date (StorageError if the server
        cannot be reached or its schema is newer than this program)."""
        return cls(await PgDatabase.open(url, postgres_sql.SCHEMA))

    @property
    def location(self) -> str:
        return self._db.location

    async def close(self) -> None:
        await self._db.close()

    async def check_writable(self) -> None:
        await self._db.check_writable()

    # ------------------------------------------------------------------ writes

    def arriving(self) -> Arrivals:
        return self._arrivals

    async def receive_batch(
        self, items: Sequence[Incoming], *, after: str | None = None, lease: Lease | None = None
    ) -> BatchReceipt:
        if not items:
            return BatchReceipt([], None)
        call = Call(list(items), after, lease)
        if after is None and self._arrivals.count <= 1 and not self._groups.busy:
            outcome = (await self._commit_group([call]))[0]  # a transaction of its own
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        return await self._groups.submit(call)

    async def _commit_group(self, calls: list[Call]) -> list[BatchReceipt | Exception]:
        """The calls, committed before this returns; one outcome per call.

        First the common case: the leading calls whose IDs are distinct across them,
        in one statement (INSERT_CALLS), its transaction sent in one round trip. It
        takes the calls up to the first that cannot go in that way (a known ID, a
        missing predecessor, a stale lease); that one and those after it then go the
        long way, in a transaction after it (`_long_way`)."""
        now = time.time()
        done: list[BatchReceipt | Exception] = []
        fast = _distinct_prefix(calls)
        if fast:
            try:
                done = [*await _retrying(lambda: self._insert_calls(calls[:fast], now))]
            except StorageError as exc:
                if not isinstance(exc.__cause__, psycopg.Error) or _connection_lost(exc.__cause__):
                    raise
                # Nothing of it committed (a statement failed): all go the long way.
        rest = calls[len(done) :]
        return done + await self._long_way(rest, now) if rest else done

    async def _insert_calls(self, calls: list[Call], now: float) -> list[BatchReceipt]:
        """The calls (IDs distinct across them) up to the first that cannot go in as
        all new, in one transaction: BEGIN, the settings, INSERT_CALLS and COMMIT sent
        at once. Their receipts (fewer than the calls when one stopped them)."""
        params = _calls_columns(calls, now)
        async with self._db.connection() as conn:
            row = await in_one_round_trip(conn, self._sql.INSERT_CALLS, params)
        went = 0 if row is None else int(row[0])
        return [_all_applied(call.items) for call in calls[:went]]

    async def _long_way(self, calls: list[Call], now: float) -> list[BatchReceipt | Exception]:
        """The calls in one transaction, each tried as all new, then event by event.
        If a statement fails, the group runs again with each call in a savepoint of
        its own, so that only the call that fails fails (savepoints are not taken
        otherwise: each is a subtransaction, and many in one transaction slow every
        snapshot on the server)."""
        try:
            return await _retrying(lambda: self._receive_group(calls, now, False))
        except StorageError as exc:
            if not isinstance(exc.__cause__, psycopg.Error) or _connection_lost(exc.__cause__):
                raise
        return await _retrying(lambda: self._receive_group(calls, time.time(), True))

    async def _receive_group(
        self, calls: list[Call], now: float, isolated: bool
    ) -> list[BatchReceipt | Exception]:
        async with self._db.connection() as conn, conn.pipeline(), conn.transaction():
            await conn.execute(DURABLE)
            if isolated:
                return [await self._isolated(conn, call, now) for call in calls]
            return await _receive_calls(self._sql, conn, calls, now)

    async def _isolated(self, conn: Conn, call: Call, now: float) -> BatchReceipt | Exception:
        """One call of a group in a savepoint of its own: its outcome, or the error
        it alone failed with."""
        try:
            async with conn.transaction():
                return await _receive_in(self._sql, conn, call, now)
        except (PredecessorMissing, StaleLease) as exc:
            return exc
        except psycopg.Error as exc:
            if isinstance(exc, _RETRYABLE) or _connection_lost(exc):
                raise  # the whole group fails, or runs again
            return _storage_error(self.location, exc)

    # ------------------------------------------------------------------ reads

    async def knows(self, event_id: str) -> bool:
        return await self._one(self._sql.FIND, (event_id,)) is not None

    async def inventory(self, sku: str) -> int:
        row = await self._one(self._sql.INVENTORY, (sku,))
        return 0 if row is None else int(row[0])

    async def record(self, event_id: str) -> InboxRecord | None:
        row = await self._one(self._sql.RECORD, (event_id,))
        return None if row is None else InboxRecord.stored(event_id, *row)

    async def count(self) -> int:
        row = await self._one(self._sql.COUNT_EVENTS, ())
        return 0 if row is None else int(row[0])

    async def _one(self, statement: bytes, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The first row of one read, in one round trip (BEGIN, the read and COMMIT
        pipelined)."""
        async with self._db.connection() as conn, conn.pipeline():
            async with conn.transaction():
                cursor = await conn.execute(statement, params)
            row: tuple[Any, ...] | None = await cursor.fetchone()
            return row


async def _receive_calls(
    sql: Any, conn: Conn, calls: list[Call], now: float
) -> list[BatchReceipt | Exception]:
    """Inside a transaction: several calls' batches. First every call that can be
    is tried as all new, the statements of all of them sent at once (one round
    trip); those that were not (a known ID, a predecessor missing yet, an ID twice) then
    run one after the other, in their order. A call that writes nothing in the
    first pass is as if it came after those that did: a valid order for requests
    that were in progress together, and a predecessor that is an event of another
    call of the group is checked again after it."""
    outcomes: list[BatchReceipt | Exception | None] = [None] * len(calls)
    tried = [
        None if lease is not None else await _try_all_new(sql, conn, items, after, now)
        for items, after, lease in calls
    ]  # a leased call is checked before it tries anything: in the second pass
    for index, attempt in enumerate(tried):
        if attempt is not None:
            outcomes[index] = await _all_new_outcome(attempt, calls[index])
    for index, call in enumerate(calls):
        if outcomes[index] is None:
            try:
                outcomes[index] = await _receive_in(sql, conn, call, now)
            except (PredecessorMissing, StaleLease) as exc:  # raised before the call wrote events
                outcomes[index] = exc
    return [outcome for outcome in outcomes if outcome is not None]


async def _try_all_new(
    sql: Any, conn: Conn, items: list[Incoming], after: str | None, now: float
) -> psycopg.AsyncCursor[Any] | None:
    """Send INSERT_IF_ALL_NEW for a batch whose IDs are distinct (None for one
    whose are not); its row is fetched later."""
    ids = [item.event["id"] for item in items]
    if len(set(ids)) != len(ids):
        return None
    params = {**_columns(items), "now": now, "slots": postgres_sql.TALLY_SLOTS, "after": after}
    return await conn.execute(sql.INSERT_IF_ALL_NEW, params)


async def _all_new_outcome(cursor: psycopg.AsyncCursor[Any], call: Call) -> BatchReceipt | None:
    """What INSERT_IF_ALL_NEW did: the receipt when every event was applied, None
    when it wrote nothing (a known ID, or the predecessor missing). Raced when another
    transaction committed one of the IDs meanwhile (some rows went in: the whole
    transaction runs again)."""
    row = await cursor.fetchone()
    met, known, inserted = row if row is not None else (False, True, 0)
    if not met or known:
        return None
    if inserted != len(call.items):
        raise Raced()
    return _all_applied(call.items)


def _all_applied(items: list[Incoming]) -> BatchReceipt:
    """The receipt of a batch whose events were all new."""
    return BatchReceipt([Received(Receipt.APPLIED, i.canonical) for i in items], None)


async def _receive_in(sql: Any, conn: Conn, call: Call, now: float) -> BatchReceipt:
    """Inside a transaction: check the lease and the predecessor, then apply in order,
    stopping at the first conflict. No event is written before both are known to
    hold."""
    items, after, lease = call
    if lease is not None:
        await _check_lease(sql, conn, lease)
    attempt = await _try_all_new(sql, conn, items, after, now)
    if attempt is not None:
        applied = await _all_new_outcome(attempt, call)
        if applied is not None:
            return applied
    if after is not None and await (await conn.execute(sql.FIND, (after,))).fetchone() is None:
        raise PredecessorMissing(after)
    return await _one_by_one(sql, conn, items, now)


async def _check_lease(sql: Any, conn: Conn, lease: Lease) -> None:
    """Inside a transaction: StaleLease if a higher epoch of its line was seen, else
    its epoch is the highest seen (RAISE_LEASE), the line's row locked to the commit."""
    key = (lease.source, lease.line)
    if await (await conn.execute(sql.RAISE_LEASE, (*key, lease.epoch))).fetchone() is None:
        row = await (await conn.execute(sql.LEASE_SEEN, key)).fetchone()
        raise StaleLease(*key, lease.epoch, lease.epoch if row is None else int(row[0]))


def _distinct_prefix(calls: list[Call]) -> int:
    """How many leading calls have IDs distinct across them (INSERT_CALLS's case)."""
    seen: set[str] = set()
    for index, (items, _, _) in enumerate(calls):
        ids = [item.event["id"] for item in items]
        if len(set(ids)) != len(ids) or not seen.isdisjoint(ids):
            return index
        seen.update(ids)
    return len(calls)


def _calls_columns(calls: list[Call], now: float) -> dict[str, Any]:
    """Calls as the arrays INSERT_CALLS unnests (each event with its call's number,
    from 1; each call's predecessor, and whether it is an event of an earlier call)."""
    items = [item for call in calls for item in call.items]
    inside: list[bool] = []
    seen: set[str] = set()
    for call in calls:
        inside.append(call.after is not None and call.after in seen)
        seen.update(item.event["id"] for item in call.items)
    leases = [call.lease for call in calls]
    return {
        **_columns(items),
        "calls": [number for number, call in enumerate(calls, 1) for _ in call.items],
        "afters": [call.after for call in calls],
        "inside": inside,
        "sources": [None if lease is None else lease.source for lease in leases],
        "lines": [None if lease is None else lease.line for lease in leases],
        "epochs": [None if lease is None else lease.epoch for lease in leases],
        "now": now,
        "slots": postgres_sql.TALLY_SLOTS,
    }


def _columns(items: list[Incoming]) -> dict[str, list[Any]]:
    """Events as the arrays INSERT_IF_ALL_NEW and INSERT_CALLS unnest: an event
    that places no order has a NULL SKU and quantity."""
    orders = [item.order for item in items]
    return {
        "ids": [item.event["id"] for item in items],
        "types": [item.event["type"] for item in items],
        "payloads": [item.canonical for item in items],
        "skus": [None if order is None else order["sku"] for order in orders],
        "qtys": [None if order is None else order["qty"] for order in orders],
    }


def _one_params(item: Incoming, now: float) -> dict[str, Any]:
    """The parameters of INSERT_ONE for one event."""
    order = item.order
    return {
        "id": item.event["id"],
        "type": item.event["type"],
        "payload": item.canonical,
        "sku": None if order is None else order["sku"],
        "qty": None if order is None else order["qty"],
        "now": now,
        "slots": postgres_sql.TALLY_SLOTS,
    }


async def _one_by_one(sql: Any, conn: Conn, items: list[Incoming], now: float) -> BatchReceipt:
    """Inside the transaction: apply in order, counting duplicates, stopping at the
    first conflict (the prefix commits; nothing of the conflicting event ran)."""
    done: list[Received] = []
    for item in items:
        event_id = item.event["id"]
        inserted = await conn.execute(sql.INSERT_ONE, _one_params(item, now))
        stored = await conn.execute(sql.FIND, (event_id,))  # same round trip
        if await inserted.fetchone() is not None:
            done.append(Received(Receipt.APPLIED, item.canonical))
            continue
        row = await stored.fetchone()
        known: str = row[0] if row is not None else ""
        if known != item.canonical:
            return BatchReceipt(done, Conflict(event_id))
        await conn.execute(sql.COUNT_DUPLICATE, (now, event_id))  # sent with the next
        done.append(Received(Receipt.DUPLICATE, known))
    return BatchReceipt(done, None)


class Raced(Exception):
    """Another transaction committed an ID of the batch between the statement's
    check and its insert: this transaction is rolled back and run again."""


def _connection_lost(exc: psycopg.Error) -> bool:
    """Whether the error is of the connection (or the server), not of a statement.
    A transaction the server rolled back (a deadlock, a lost race) is of the
    statement: the connection is fine, and the calls can still go the long way."""
    return isinstance(exc, psycopg.OperationalError) and not isinstance(
        exc, (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled, *_RETRYABLE)
    )


def _storage_error(where: str, exc: psycopg.Error) -> StorageError:
    failed = StorageError(f"{where}: {describe(exc)}")
    failed.__cause__ = exc
    return failed


async def _retrying(attempt: Callable[[], Awaitable[T]]) -> T:
    """`await attempt()`, again (up to ATTEMPTS in all) when its transaction was
    rolled back whole for a reason that running it again removes: PostgreSQL broke
    a deadlock between two transactions that share IDs, or a race was lost."""
    for left in range(ATTEMPTS - 1, -1, -1):
        try:
            return await attempt()
        except Raced:
            if left == 0:
                message = "the same events kept arriving through another connection"
                raise StorageError(message) from None
        except StorageError as exc:
            if left == 0 or not isinstance(exc.__cause__, _RETRYABLE):
                raise
    raise AssertionError("unreachable")
