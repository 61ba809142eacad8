"""The SQLite inbox: the inbox and inventory tables in one SQLite file.

The interface and rows are in `sink.store`; the SQL is in `sink.backends.sqlite_sql`.
Each transaction runs as one call (sqlite_tx). How a write commits is decided here,
from the facts the HTTP layer reports (`arriving`): inline on the event loop's
thread when it has the database to itself, else in a group commit.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from plumbing.storage import TRIAL_ID, TRIAL_TYPE, StorageError
from shared import Conflict, Lease, PredecessorMissing, Receipt, StaleLease
from sink.backends import sqlite_sql as sql
from sink.backends.sharing import (
    Arrivals,
    Call,
    effects_of,
    runs,
    schema_failed,
    schema_side,
    schema_to_run,
)
from sink.handlers import WAREHOUSE, HandlerFailed, Handlers, NotApplied
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

    def __init__(self, db: Database, handlers: Handlers = WAREHOUSE) -> None:
        super().__init__(db)
        self.handlers = handlers
        self._groups = GroupCommit(db, functools.partial(_receive_groups, handlers))
        self._arrivals = Arrivals()

    @classmethod
    async def connect(cls, path: str | Path, handlers: Handlers = WAREHOUSE) -> SqliteInbox:
        """Open (or create) the file, bring the inbox's schema up to date, then run
        the handlers' schema statements it has not run yet."""
        db = await Database.open(path, cls.SCHEMA)
        try:
            await db.run(lambda conn: _apply_handler_schema(conn, handlers), bounded=False)
        except BaseException:
            await db.close()
            raise
        return cls(db, handlers)

    @property
    def writes_in_progress(self) -> int:
        """Write requests between arrival and reply, as reported through `arriving`."""
        return self._arrivals.count

    def arriving(self) -> Arrivals:
        return self._arrivals

    async def check_real_writes(self) -> None:
        """The inbox's own writes tried on its real tables under TRIAL_ID, rolled back
        (Database.rehearse): an event recorded as new, then counted as delivered
        again. A trigger that raises or a constraint of the user's own fails this as
        it fails them; handlers' statements are not tried (their failure is theirs,
        answered per event)."""
        now = time.time()

        def trial(conn: sqlite3.Connection) -> None:
            conn.execute(sql.INSERT, (TRIAL_ID, TRIAL_TYPE, "{}", now, now))
            conn.execute(sql.COUNT_DUPLICATE, (now, TRIAL_ID))

        await self._db.rehearse(trial)

    async def receive_batch(
        self, items: Sequence[Incoming], *, after: str | None = None, lease: Lease | None = None
    ) -> BatchReceipt:
        if not items:
            return BatchReceipt([], None)
        call = Call(list(items), after, lease)
        if self._commits_inline(after):
            return await self._db.run_inline(
                lambda conn: _receive_batch(conn, self.handlers, call, time.time())
            )
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


def _receive_batch(
    conn: sqlite3.Connection, handlers: Handlers, call: Call, now: float
) -> BatchReceipt:
    with transaction(conn):
        return _receive_in(conn, handlers, call, now)


def _receive_groups(
    handlers: Handlers, conn: sqlite3.Connection, calls: list[Call]
) -> list[BatchReceipt | Exception]:
    """Several calls' batches in one transaction, each in a savepoint of its own: a
    call that fails leaves nothing of itself and does not fail the others."""
    outcomes: list[BatchReceipt | Exception] = []
    now = time.time()
    with transaction(conn):
        for call in calls:
            conn.execute("SAVEPOINT one_call")
            try:
                outcomes.append(_receive_in(conn, handlers, call, now))
            except (PredecessorMissing, StaleLease) as exc:  # raised before the call wrote events
                outcomes.append(exc)
            except sqlite3.Error as exc:
                if not conn.in_transaction:  # SQLite rolled it all back (a full disk)
                    raise
                conn.execute("ROLLBACK TO one_call")
                failed = StorageError(f"applying a batch failed: {exc}")
                failed.__cause__ = exc
                outcomes.append(failed)
            conn.execute("RELEASE one_call")
    return outcomes


def _receive_in(
    conn: sqlite3.Connection, handlers: Handlers, call: Call, now: float
) -> BatchReceipt:
    """Inside a transaction: check the lease and the predecessor, then apply in order,
    stopping at the first conflict or the first event its handler does not take."""
    items, after, lease = call
    if lease is not None:
        _check_lease(conn, lease)
    if after is not None and conn.execute(sql.FIND, (after,)).fetchone() is None:
        raise PredecessorMissing(after)
    ids = [item.event["id"] for item in items]
    if len(set(ids)) == len(ids) and not _known(conn, ids):
        applied = _all_new(conn, handlers, items, now)
        if applied is not None:
            return applied
    return _one_by_one(conn, handlers, items, now)


def _all_new(
    conn: sqlite3.Connection, handlers: Handlers, items: Sequence[Incoming], now: float
) -> BatchReceipt | None:
    """The common case, every ID new (the write lock is held: none can become known
    meanwhile): the handlers' statements first, then one statement for the inbox
    rows and one per run of a statement, instead of several per event. None when a
    statement of an effect was refused: nothing of it is left, and the events go one
    by one to find which one it was."""
    effects, stopped = effects_of(handlers, items)
    taken = items[: len(effects)]
    applied = [Received(Receipt.APPLIED, item.canonical) for item in taken]
    if not taken:
        return BatchReceipt(applied, stopped)
    statements = runs(effects)
    if statements:
        conn.execute("SAVEPOINT all_new")
    conn.executemany(sql.INSERT, [inbox_row(item, now) for item in taken])  # the inbox's own
    if statements:
        if _refused(conn, statements, "all_new", taken[0]) is not None:
            return None
        conn.execute("RELEASE all_new")
    return BatchReceipt(applied, stopped)


def _one_by_one(
    conn: sqlite3.Connection, handlers: Handlers, items: Sequence[Incoming], now: float
) -> BatchReceipt:
    """Inside a transaction: each event in order, recorded with its effect (each in a
    savepoint of its own) or counted as a duplicate; stops at the first conflict or
    event its handler does not take, whose own rows are then not there."""
    done: list[Received] = []
    for item in items:
        event_id = item.event["id"]
        known = conn.execute(sql.FIND, (event_id,)).fetchone()
        if known is not None:
            if known[0] != item.canonical:
                return BatchReceipt(done, Conflict(event_id))
            conn.execute(sql.COUNT_DUPLICATE, (now, event_id))
            done.append(Received(Receipt.DUPLICATE, known[0]))
            continue
        try:
            effect = handlers.effects(item.event, item.canonical)
        except NotApplied as exc:
            return BatchReceipt(done, exc)
        statements = runs([effect])
        if statements:
            conn.execute("SAVEPOINT one_event")
        conn.execute(sql.INSERT, inbox_row(item, now))  # the inbox's own: a failure is raised
        if statements:
            refused = _refused(conn, statements, "one_event", item)
            if refused is not None:
                return BatchReceipt(done, refused)
            conn.execute("RELEASE one_event")
        done.append(Received(Receipt.APPLIED, item.canonical))
    return BatchReceipt(done, None)


# What binding a handler's parameter may raise besides sqlite3's own errors (an
# integer beyond 64 bits, a value the module cannot store).
_BIND_ERRORS: Final = (sqlite3.Error, OverflowError, ValueError, TypeError)


def _refused(
    conn: sqlite3.Connection,
    statements: list[tuple[str, list[Mapping[str, Any]]]],
    savepoint: str,
    item: Incoming,
) -> HandlerFailed | None:
    """Run handlers' statements in order, a run of one text as one executemany: None
    when they all ran. One the database refuses for the statement's sake (a
    constraint, a missing table, its parameters) undoes everything since `savepoint`
    (which it releases) and is returned as the failure of `item`'s handler (in a
    batch, the events go one by one to find the one it was). An error of the
    database itself (a full disk) is raised as it is, and so is one after which no
    transaction is left (a statement or trigger that rolled it back), for the whole
    transaction to fail: nothing of it stays."""
    try:
        for text, params in statements:
            if len(params) == 1:
                conn.execute(text, params[0])
            else:
                conn.executemany(text, params)
    except _BIND_ERRORS as exc:
        if not conn.in_transaction:
            raise StorageError(
                f"a statement of the handler of {item.event['type']} ended the inbox's"
                f" transaction (a ROLLBACK conflict clause or trigger): {exc}"
            ) from exc
        if isinstance(exc, sqlite3.Error) and not is_handler_error(exc):
            raise
        conn.execute(f"ROLLBACK TO {savepoint}")
        conn.execute(f"RELEASE {savepoint}")
        return statement_refused(item, exc)
    return None


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


def inbox_row(item: Incoming, now: float) -> tuple[str, str, str, float, float]:
    """The parameters of sql.INSERT for one event."""
    return (item.event["id"], item.event["type"], item.canonical, now, now)


# What SQLite says when the database itself cannot take the write: storage, not the
# handler's statement (a missing table, a constraint, a wrong parameter are the
# handler's: any other error).
_STORAGE_CODES: Final = frozenset(
    {
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_INTERRUPT,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_NOLFS,
    }
)


def is_handler_error(exc: sqlite3.Error) -> bool:
    """Whether a statement of a handler's effect failed because of the statement (a
    constraint, a missing table or column, its parameters), not the database."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is None or code & 0xFF not in _STORAGE_CODES


def statement_refused(item: Incoming, exc: Exception) -> HandlerFailed:
    """The failure of an event whose handler's statement the database refused."""
    name = getattr(exc, "sqlite_errorname", None)
    kind = type(exc).__name__ if name is None else f"{type(exc).__name__} ({name})"
    failed = HandlerFailed(
        item.event["id"], item.event["type"], f"a statement was refused: {kind}: {exc}"
    )
    failed.__cause__ = exc
    return failed


def _apply_handler_schema(conn: sqlite3.Connection, handlers: Handlers) -> None:
    """Run the registry's schema statements not run yet in this file, in order, and
    count them, in one transaction; StorageError naming the one that fails."""
    side = schema_side(handlers)
    with transaction(conn):
        row = conn.execute(sql.HANDLER_SCHEMA_VERSION, (side,)).fetchone()
        todo = schema_to_run(handlers, 0 if row is None else int(row[0]))
        if not todo:
            return
        for number, statement in todo:
            try:
                conn.execute(statement)
            except sqlite3.Error as exc:
                raise schema_failed(handlers, number, str(exc)) from exc
        conn.execute(sql.SET_HANDLER_SCHEMA_VERSION, (side, len(handlers.schema_statements)))
