"""The PostgreSQL inbox: the inbox and inventory tables in one PostgreSQL database.

The interface and rows are in `sink.store`; the SQL is in `sink.backends.postgres_sql`;
the pool, migrations, durable commits and error translation are pg_tx's.

The common case is one statement and one round trip: the calls of a group commit
(or a write alone) whose IDs are distinct and new, whose predecessors are in the
inbox, a pipeline's chain of requests included (a predecessor that is an event of an
earlier call of the group passes the check by it), and whose events their handlers
all take, go in with INSERT_ALL. Handlers are pure functions of the event, so their
statements are computed first and sent with BEGIN, the durable-commit settings,
INSERT_ALL and the COMMIT; INSERT_ALL raises if one of the calls cannot go in as all
new, which rolls back the statements queued behind it. Then the same calls go in
by INSERT_CALLS, in two round trips: it takes the calls up to the first that cannot
go in, and only their statements follow. The call that stopped it and those after
it then run in a second transaction, event by event (a redelivery, a conflict: the
prefix kept). A statement of a handler's that the database refuses sends every call
of the group the long way, where each event with statements has a savepoint of its
own once a first try fails. Two transactions inserting the same ID apply it once:
the second one's insert waits for the first to commit and then does nothing (in
INSERT_ALL and INSERT_CALLS the statement then raises serialization_failure and its
transaction runs again).

A leased call (Outbox-Lease) is checked in the same transaction: its line's epoch is
raised by an upsert on the line's `lease_fences` row (RAISE_LEASE, or in INSERT_CALLS
the group's highest epoch of each line), which waits for that row's lock and judges
its newest version, so two sinks applying one line's requests serialise there; a
stale call stops INSERT_ALL and INSERT_CALLS like a missing predecessor, and is
refused the long way.

Handlers' statements are the user's SQL: they are not rewritten but for their
parameters (`:name` as psycopg's `%(name)s`). With a schema named for the inbox
(`schema=NAME`), they run with that schema first on the transaction's search_path,
so that the inbox's own tables (the warehouse's `inbox_inventory`) and the tables
the registry's schema statements created there are found without naming it.

How a write commits is decided here from the facts the HTTP layer reports
(`arriving`), as in the SQLite inbox: alone, in a transaction of its own; while
other writes are in progress, in a group commit, one transaction for all the calls
waiting, so they share one WAL flush.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import psycopg.errors

from pg_tx import (
    DURABLE,
    MIGRATION_LOCK,
    Conn,
    PgDatabase,
    array_literal,
    describe,
    qualified,
    sent_together,
    storage_error,
)
from pg_tx.group import call_deadline
from plumbing.group_commit import GroupCommit, within
from plumbing.storage import TRIAL_ID, TRIAL_TYPE, StorageError
from shared import Conflict, Lease, PredecessorMissing, Receipt, StaleLease
from sink.backends import postgres_sql
from sink.backends.sharing import (
    Arrivals,
    Call,
    Effect,
    effects_of,
    runs,
    schema_failed,
    schema_side,
    schema_to_run,
)
from sink.handlers import WAREHOUSE, HandlerFailed, Handlers, NotApplied
from sink.store import BatchReceipt, Inbox, InboxRecord, Incoming, Received

T = TypeVar("T")
# What readiness tries once a real write failed (check_real_writes), in a transaction
# rolled back: an event recorded as new (INSERT_ONE, its tally included), then counted
# as delivered again (COUNT_DUPLICATE), under TRIAL_ID.
ATTEMPTS: Final = 3  # a transaction that PostgreSQL chose to abort (deadlock) is run again
# Aborted whole, so running them again is safe (nothing of them committed).
_RETRYABLE: Final = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


class PostgresInbox(Inbox):
    """The sink's inbox and inventory in a PostgreSQL database (a libpq URI)."""

    def __init__(self, db: PgDatabase, handlers: Handlers = WAREHOUSE) -> None:
        self._db = db
        self._sql = qualified(postgres_sql, db.qualify)  # its statements, in its schema
        self.handlers = handlers
        self._arrivals = Arrivals()
        self._deadline = call_deadline(db)
        self._groups: GroupCommit[Call, BatchReceipt] = GroupCommit(
            self._commit_group, deadline=self._deadline
        )

    @property
    def writes_in_progress(self) -> int:
        """Write requests between arrival and reply, as reported through `arriving`."""
        return self._arrivals.count

    @classmethod
    async def connect(cls, url: str, handlers: Handlers = WAREHOUSE) -> PostgresInbox:
        """Connect, bring the sink's schema up to date (StorageError if the server
        cannot be reached or its schema is newer than this program), then run the
        handlers' schema statements the database has not run yet."""
        inbox = cls(await PgDatabase.open(url, postgres_sql.SCHEMA), handlers)
        try:
            await inbox._apply_handler_schema()
        except BaseException:
            await inbox.close()
            raise
        return inbox

    async def _apply_handler_schema(self) -> None:
        """The registry's schema statements not run yet, in order, counted in the
        versions table in the same transaction (under the migrations' lock: sinks
        starting together run each once); StorageError naming the one that fails."""
        handlers, sql, side = self.handlers, self._sql, schema_side(self.handlers)
        # Not bounded by the deadline: a registry's CREATE INDEX may rightly take long.
        async with self._db.transaction(bounded=False) as conn:
            await conn.execute(MIGRATION_LOCK)
            await self._handlers_path(conn)
            row = await (await conn.execute(sql.HANDLER_SCHEMA_VERSION, (side,))).fetchone()
            todo = schema_to_run(handlers, 0 if row is None else int(row[0]))
            if not todo:
                return
            for number, statement in todo:
                try:
                    async with conn.transaction():
                        await conn.execute(statement.encode())
                except psycopg.Error as exc:
                    raise schema_failed(handlers, number, describe(exc)) from exc
            count = len(handlers.schema_statements)
            await conn.execute(sql.SET_HANDLER_SCHEMA_VERSION, (side, count))

    @property
    def location(self) -> str:
        return self._db.location

    async def close(self) -> None:
        await self._db.close()

    async def check_writable(self) -> None:
        await self._db.check_writable()

    async def check_real_writes(self) -> None:
        """The inbox's own writes tried on its real tables, rolled back (TRIAL_ID): a
        full disk, a revoked privilege or a trigger that raises fails this as it
        fails them. Handlers' statements are not tried: their failure is theirs,
        answered per event."""
        now = time.time()
        sql, slots = self._sql, postgres_sql.TALLY_SLOTS
        params = {"id": TRIAL_ID, "type": TRIAL_TYPE, "payload": "{}", "now": now}

        async def write(conn: Conn) -> None:
            await conn.execute(sql.INSERT_ONE, {**params, "slots": slots})
            await conn.execute(sql.COUNT_DUPLICATE, (now, TRIAL_ID))

        await self._db.rehearse(write)

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
            # A transaction of its own, answered within the deadline.
            outcome = (await within(self._deadline, self._commit_group([call])))[0]
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        return await self._groups.submit(call)

    async def _commit_group(self, calls: list[Call]) -> list[BatchReceipt | Exception]:
        """The calls, committed before this returns; one outcome per call.

        First the common case: the leading calls whose IDs are distinct across them
        and whose events their handlers all take, in one statement with their
        handlers' statements (`_all_new`). It takes the calls up to the first that
        cannot go in that way (a known ID, a missing predecessor, a stale lease, an
        event its handler does not take); that one and those after it then go the
        long way, in a transaction after it (`_long_way`). When the database refuses
        a statement of a handler's, nothing of the first transaction stays and every
        call goes the long way, which finds the event and keeps what comes before it."""
        now = time.time()
        done: list[BatchReceipt | Exception] = []
        effects = self._effects(calls[: _distinct_prefix(calls)])
        if effects:
            try:
                done = [*await self._all_new(calls[: len(effects)], effects, now)]
            except StorageError as exc:
                if not isinstance(exc.__cause__, psycopg.Error) or _connection_lost(exc.__cause__):
                    raise
                # Nothing of it committed (a statement failed): all go the long way.
        rest = calls[len(done) :]
        return done + await self._long_way(rest, now) if rest else done

    def _effects(self, calls: list[Call]) -> list[list[Effect]]:
        """The handlers' statements of each call's events, one list per call, for
        the leading calls whose events their handlers all take (pure functions of
        the events: they run before anything is sent, and only for the events that
        then go in)."""
        out: list[list[Effect]] = []
        for call in calls:
            effects, stopped = effects_of(self.handlers, call.items)
            if stopped is not None:
                break
            out.append([statement for event in effects for statement in event])
        return out

    async def _all_new(
        self, calls: list[Call], effects: list[list[Effect]], now: float
    ) -> list[BatchReceipt]:
        """The calls (IDs distinct across them) up to the first that cannot go in
        as all new, with their handlers' statements (`effects`, one list per call).
        All of them, the common case, in one round trip (INSERT_ALL, the statements
        and the COMMIT sent together); else the prefix that can, in two
        (INSERT_CALLS, then the statements of the calls that went in), or none when
        the one call there is cannot."""
        try:
            return await _retrying(lambda: self._insert_all(calls, effects, now))
        except StorageError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != postgres_sql.STOPPED_STATE:
                raise
        if len(calls) == 1:
            return []  # INSERT_CALLS would take none of it: straight the long way
        return await _retrying(lambda: self._insert_calls(calls, effects, now))

    async def _insert_all(
        self, calls: list[Call], effects: list[list[Effect]], now: float
    ) -> list[BatchReceipt]:
        """Every call, in one transaction of one round trip: BEGIN, the settings,
        INSERT_ALL, the handlers' statements and COMMIT. StorageError with
        inbox_stopped()'s SQLSTATE if one of the calls cannot go in as all new
        (nothing commits)."""
        params = _calls_columns(calls, now)
        statements = runs(effects)
        async with self._db.connection() as conn, sent_together(conn):
            await conn.execute(self._sql.INSERT_ALL, params)
            if statements:
                await self._handlers_path(conn)
                await self._run(conn, statements)
        return [_all_applied(call.items) for call in calls]

    async def _insert_calls(
        self, calls: list[Call], effects: list[list[Effect]], now: float
    ) -> list[BatchReceipt]:
        """The calls up to the first that cannot go in as all new, in one
        transaction of two round trips: BEGIN, the settings and INSERT_CALLS; then
        the handlers' statements of the calls that went in, and COMMIT. Their
        receipts (fewer than the calls when one stopped them)."""
        params = _calls_columns(calls, now)
        async with self._db.connection() as conn, sent_together(conn):
            row = await (await conn.execute(self._sql.INSERT_CALLS, params)).fetchone()
            went = 0 if row is None else int(row[0])
            statements = runs(effects[:went])
            if statements:
                await self._handlers_path(conn)
                await self._run(conn, statements)
        return [_all_applied(call.items) for call in calls[:went]]

    async def _run(self, conn: Conn, statements: list[tuple[str, list[Mapping[str, Any]]]]) -> None:
        """Handlers' statements in order (queued in the pipeline): a run of one text
        as one executemany."""
        for text, params in statements:
            query = self._statement(text)
            if len(params) == 1:
                await conn.execute(query, params[0])
            else:
                async with conn.cursor() as cursor:
                    await cursor.executemany(query, params)

    def _statement(self, text: str) -> bytes:
        """A handler's statement as psycopg takes it."""
        return _pyformat(text).encode()

    async def _handlers_path(self, conn: Conn) -> None:
        """In the transaction that runs handlers' statements: the inbox's schema, if
        one is named, first on its search_path (queued; set for this transaction)."""
        schema = self._db.settings.schema
        if schema is not None:
            await conn.execute(postgres_sql.HANDLERS_SEARCH_PATH, (f'"{schema}"',))

    async def _long_way(self, calls: list[Call], now: float) -> list[BatchReceipt | Exception]:
        """The calls in one transaction, one after the other, event by event. If a
        statement fails, the group runs again with each call, and each event that has
        statements to run, in a savepoint of its own, so that only the call or the
        event that fails fails (savepoints are not taken otherwise: each is a
        subtransaction, and many in one transaction slow every snapshot on the
        server)."""
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
            await self._handlers_path(conn)
            if isolated:
                # A deferred constraint a statement breaks fails at that statement,
                # inside its event's savepoint, not at the COMMIT of the whole group.
                await conn.execute(postgres_sql.CONSTRAINTS_NOW)
                return [await self._isolated(conn, call, now) for call in calls]
            outcomes: list[BatchReceipt | Exception] = []
            for call in calls:
                try:
                    outcomes.append(await self._receive_in(conn, call, now, False))
                except (PredecessorMissing, StaleLease) as exc:  # before the call wrote events
                    outcomes.append(exc)
            return outcomes

    async def _isolated(self, conn: Conn, call: Call, now: float) -> BatchReceipt | Exception:
        """One call of a group in a savepoint of its own: its outcome, or the error
        it alone failed with."""
        try:
            async with conn.transaction():
                return await self._receive_in(conn, call, now, True)
        except (PredecessorMissing, StaleLease) as exc:
            return exc
        except psycopg.Error as exc:
            if isinstance(exc, _RETRYABLE) or _connection_lost(exc):
                raise  # the whole group fails, or runs again
            return _storage_error(self.location, exc)

    async def _receive_in(self, conn: Conn, call: Call, now: float, isolated: bool) -> BatchReceipt:
        """Inside a transaction: check the lease and the predecessor, then apply in
        order, stopping at the first conflict or event its handler does not take. No
        event is written before both checks hold."""
        sql = self._sql
        items, after, lease = call
        if lease is not None:
            await _check_lease(sql, conn, lease)
        if after is not None and await (await conn.execute(sql.FIND, (after,))).fetchone() is None:
            raise PredecessorMissing(after)
        return await self._one_by_one(conn, items, now, isolated)

    async def _one_by_one(
        self, conn: Conn, items: list[Incoming], now: float, isolated: bool
    ) -> BatchReceipt:
        """Inside the transaction: apply in order, counting duplicates, stopping at the
        first conflict or event its handler does not take (the prefix commits; nothing
        of that event ran). `isolated`: each event with statements to run in a
        savepoint of its own, so that one the database refuses is undone alone and
        answered as its handler's failure."""
        sql = self._sql
        done: list[Received] = []
        for item in items:
            event_id = item.event["id"]
            row = await (await conn.execute(sql.FIND, (event_id,))).fetchone()
            if row is None:
                try:
                    effect = self.handlers.effects(item.event, item.canonical)
                except NotApplied as exc:
                    return BatchReceipt(done, exc)
                if not isolated or not effect:
                    inserted = await self._record(conn, item, now)
                    if inserted:
                        await self._run(conn, runs([effect]))
                else:
                    try:
                        async with conn.transaction():
                            try:
                                inserted = await self._record(conn, item, now)
                            except psycopg.Error as exc:
                                raise _InboxRowRefused(exc) from exc
                            if inserted:
                                await self._run(conn, runs([effect]))
                    except _InboxRowRefused as exc:
                        raise exc.refused from None  # the inbox's own write: the call fails
                    except psycopg.Error as exc:
                        if not _is_handler_error(exc):
                            raise
                        return BatchReceipt(done, _statement_refused(item, exc))
                if inserted:
                    done.append(Received(Receipt.APPLIED, item.canonical))
                    continue
                # Another transaction committed it since FIND: judged as known.
                row = await (await conn.execute(sql.FIND, (event_id,))).fetchone()
            known: str = row[0] if row is not None else ""
            if known != item.canonical:
                return BatchReceipt(done, Conflict(event_id))
            await conn.execute(sql.COUNT_DUPLICATE, (now, event_id))  # sent with the next
            done.append(Received(Receipt.DUPLICATE, known))
        return BatchReceipt(done, None)

    async def _record(self, conn: Conn, item: Incoming, now: float) -> bool:
        """Record one event if it is new; whether it was (its result is fetched, so
        that its handler's statements are sent only then)."""
        inserted = await conn.execute(self._sql.INSERT_ONE, one_params(item, now))
        return await inserted.fetchone() is not None

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


def _all_applied(items: list[Incoming]) -> BatchReceipt:
    """The receipt of a batch whose events were all new."""
    return BatchReceipt([Received(Receipt.APPLIED, i.canonical) for i in items], None)


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
    from 1; each call's predecessor, and whether it is an event of an earlier call),
    each written as one literal (pg_tx.array_literal)."""
    items = [item for call in calls for item in call.items]
    inside: list[bool] = []
    seen: set[str] = set()
    for call in calls:
        inside.append(call.after is not None and call.after in seen)
        seen.update(item.event["id"] for item in call.items)
    leases = [call.lease for call in calls]
    return {
        "ids": array_literal([item.event["id"] for item in items]),
        "types": array_literal([item.event["type"] for item in items]),
        "payloads": array_literal([item.canonical for item in items]),
        "calls": array_literal(
            [number for number, call in enumerate(calls, 1) for _ in call.items]
        ),
        "afters": array_literal([call.after for call in calls]),
        "inside": array_literal(inside),
        "sources": array_literal([None if lease is None else lease.source for lease in leases]),
        "lines": array_literal([None if lease is None else lease.line for lease in leases]),
        "epochs": array_literal([None if lease is None else lease.epoch for lease in leases]),
        "now": now,
        "slots": postgres_sql.TALLY_SLOTS,
    }


def one_params(item: Incoming, now: float) -> dict[str, Any]:
    """The parameters of INSERT_ONE for one event."""
    return {
        "id": item.event["id"],
        "type": item.event["type"],
        "payload": item.canonical,
        "now": now,
        "slots": postgres_sql.TALLY_SLOTS,
    }


# A handler's statement, in SQLite's and SQLAlchemy's `:name` style, in psycopg's:
# each named parameter outside literals, quoted names, comments and dollar quotes
# becomes %(name)s, a cast (::) stays, and every % is doubled, inside literals too
# (psycopg reads placeholders without regard to SQL quoting).
_TOKENS: Final = re.compile(
    r"""(?<!\w)[Ee]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|/\*.*?\*/"""
    r"""|\$([A-Za-z_]\w*|)\$.*?\$\1\$|::|(?<![\w:]):([A-Za-z_]\w*)|%""",
    re.DOTALL,
)


@functools.lru_cache(maxsize=256)
def _pyformat(text: str) -> str:
    """`text` with its `:name` parameters as psycopg's `%(name)s` (see _TOKENS)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(2)
        return match.group(0).replace("%", "%%") if name is None else f"%({name})s"

    return _TOKENS.sub(one, text)


# SQLSTATE classes of a statement's own fault: cardinality, data, integrity,
# triggered data change, dependent objects, syntax or a missing object, check
# option, a program limit (an index row too large), a raise in PL/pgSQL, a feature
# not supported. Any other is the database's or the connection's (disk full,
# read-only, shutdown, lost connection, a deadlock).
_HANDLER_CLASSES: Final = frozenset({"0A", "21", "22", "23", "27", "2B", "42", "44", "54", "P0"})


def _is_handler_error(exc: psycopg.Error) -> bool:
    """Whether a statement of a handler's effect failed because of the statement:
    its SQLSTATE says so, or psycopg refused it before sending (a parameter missing
    or one it cannot adapt, a NUL in a string)."""
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.ProgrammingError | psycopg.DataError)
    return state[:2] in _HANDLER_CLASSES


def _statement_refused(item: Incoming, exc: psycopg.Error) -> HandlerFailed:
    """The failure of an event whose handler's statement the database refused."""
    failed = HandlerFailed(
        item.event["id"],
        item.event["type"],
        f"a statement was refused: {type(exc).__name__} ({exc.sqlstate}): {describe(exc)}",
    )
    failed.__cause__ = exc
    return failed


class _InboxRowRefused(Exception):
    """The inbox's own insert of an event failed (not a statement of its handler's)."""

    def __init__(self, refused: psycopg.Error) -> None:
        super().__init__(str(refused))
        self.refused = refused


def _connection_lost(exc: psycopg.Error) -> bool:
    """Whether the error is of the connection (or the server), not of a statement.
    A transaction the server rolled back (a deadlock, a lost race) is of the
    statement: the connection is fine, and the calls can still go the long way."""
    return isinstance(exc, psycopg.OperationalError) and not isinstance(
        exc, (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled, *_RETRYABLE)
    )


def _storage_error(where: str, exc: psycopg.Error) -> StorageError:
    failed = storage_error(where, exc)
    failed.__cause__ = exc
    return failed


async def _retrying(attempt: Callable[[], Awaitable[T]]) -> T:
    """`await attempt()`, again (up to ATTEMPTS in all) when its transaction was
    rolled back whole for a reason that running it again removes: PostgreSQL broke
    a deadlock between two transactions that share IDs, or a race was lost."""
    for left in range(ATTEMPTS - 1, -1, -1):
        try:
            return await attempt()
        except StorageError as exc:
            if left == 0 or not isinstance(exc.__cause__, _RETRYABLE):
                raise
    raise AssertionError("unreachable")
