"""Record an event in the inbox inside the caller's own transaction, and answer it.

The inbox as a library, for a consumer whose own rows live in the same database as
the inbox: the event's inbox row and the caller's effect commit together or roll
back together, so however often the relay delivers an event, its effect is applied
once. The caller reads the request, records each event in its transaction, applies
the effect of a new one, commits, and only then answers:

    events = read_cloudevents(content_type, headers, body)
    with psycopg.connect(url) as conn:          # a transaction until the block ends
        arrival = receive_in(conn, events[0])
        if arrival == "new":                    # a duplicate's effect is there already
            conn.execute("UPDATE accounts SET ...")
    # committed: only now may the relay hear of it
    return 200, ack_body(events[0], arrival)    # as JSON

The rule that makes this safe: answer with the ACK only after the caller's commit.
An ACK is the relay's evidence that the event is applied: it never sends that event
again. Sent before a commit that then fails, it loses the event; withheld after a
commit (a crash, an error reply), it costs one more delivery, which receive_in then
calls "duplicate".

- `receive_in(conn, event)`: a sqlite3 `Connection` (a SQLite inbox file) or a
  psycopg `Connection` (PostgreSQL); or a SQLAlchemy `Connection` or `Session` on
  either (`sqlite`, `postgresql+psycopg`).
- `await receive_in_async(conn, event)`: a psycopg `AsyncConnection`; or a SQLAlchemy
  `AsyncConnection` or `AsyncSession` (`sqlite+aiosqlite`, `postgresql+psycopg`).
- `ack_body(event, arrival)`: the JSON object the sink itself answers with for the
  event (`{"ack": ID, "status": "applied" | "duplicate", "sha256": DIGEST}`), given
  what receive_in returned. A batch (batched mode, which the relay posts to the events
  URL's `/batch`) is answered `{"acks": [one per event, in order], "rejected": null}`.
- `read_cloudevents(content_type, headers, body)` (sink.wire): the events of a
  request in structured, binary or batched mode, validated as the sink does.

receive_in and receive_in_async validate the event as the sink does (InvalidEvent)
and return "new" or "duplicate": the same ID with the same canonical event again is a
duplicate, whose delivery is counted (deliveries, last_delivery_at); with a different
one, Conflict, and nothing is written (the transaction goes on). The sink answers an
invalid event 400 and a conflict 409, which the relay takes as permanent. Nothing else
of the sink's runs here: no handler (the caller's own statements are the effect), no
predecessor check (Outbox-After) and no lease fence (Outbox-Lease). The relay
pipelines a line only while the replies say the check is enforced, which an endpoint
of one's own does not say: it gets a line's requests one at a time.

The rows are the inbox's own: a new ID takes the next place in the order of
application (applied_seq), Inbox.count() counts it (on PostgreSQL through the
inbox's tally, kept in the same transaction), and Inbox.record(id), a sink serving
the same database, and its GET /events/{id} see it once committed. Opening the inbox
once creates the tables receive_in writes to (`Inbox.open(db)`, or starting the
sink); on a database without them it raises StorageError saying so.

Nothing here begins, commits or rolls back a transaction. With SQLAlchemy (imported
only once the caller has) the row is written by `exec_driver_sql` on the Session's
connection, in the caller's SQLAlchemy transaction, begun if it was not yet as its
next statement would begin it (autobegin). A connection in autocommit (SQLAlchemy's
AUTOCOMMIT isolation level included) outside a transaction is refused:
NotInTransaction. Driver errors become StorageError; the caller's transaction is then
failed and theirs to roll back.

On PostgreSQL a new ID's row, and a slot of the inbox's tally, are locked until the
caller's transaction ends (another delivery of the ID waits, then is a duplicate), so
keep the transaction short after this call. An inbox whose tables are in a schema of
their own (opened with `schema=NAME` in its URI) is named by `schema="NAME"`, whatever
the connection's search_path. A SQLite file has no schemas: `schema=` is refused
there (ValueError).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Final, Literal, NamedTuple

from plumbing.in_transaction import (
    SQLALCHEMY_ASYNC,
    SQLALCHEMY_SYNC,
    DriverSql,
    NotInTransaction,
    autobegin,
    check_psycopg_transaction,
    check_sqlite_transaction,
    driver_errors,
    is_one_of,
    pg_failed,
    sqlalchemy_backend,
    sqlalchemy_connection,
    tables_hinted,
)
from plumbing.storage import StorageError
from shared import Conflict, Receipt, digest_of, make_ack
from sink.store import Incoming
from sink.wire import InvalidRequest, read_cloudevents

# What receive_in did: recorded the event ("new": the caller applies its effect), or
# found it recorded already with the same canonical form ("duplicate").
Arrival = Literal["new", "duplicate"]
_RECEIPTS: Final[dict[str, Receipt]] = {"new": Receipt.APPLIED, "duplicate": Receipt.DUPLICATE}
_NO_TABLES: Final = (
    " (the inbox's tables are not there: open the inbox once beforehand, with"
    " Inbox.open or by starting the sink, to create them; tables in a schema of their"
    ' own are named by schema="NAME")'
)


class _Statements(NamedTuple):
    """One backend's statements as receive_in runs them (driver-style SQL text)."""

    insert_one: str  # the event's row if its ID is new, returning a row only then
    find: str  # the canonical form stored for an ID
    count_duplicate: str  # (now, id)
    params: Callable[[Incoming, float], Any]  # insert_one's


def receive_in(conn: Any, event: object, *, schema: str | None = None) -> Arrival:
    """Record the event in the inbox in `conn`'s current transaction (a psycopg or
    sqlite3 Connection, a SQLAlchemy Connection or Session), without committing it;
    on PostgreSQL, in the inbox whose tables are in `schema` if one is named.

    Returns "new" (apply your effect) or "duplicate" (it is applied already). Raises
    InvalidEvent for an event the sink would refuse, Conflict for its ID recorded
    with another canonical form (nothing written; the transaction goes on),
    NotInTransaction for a connection outside a transaction, StorageError for the
    driver's errors (roll back), ValueError for `schema` on SQLite, TypeError for
    another kind of connection. Answer with `ack_body` only once committed."""
    item = Incoming.checked(event)
    with tables_hinted(_NO_TABLES):
        return _receive_in_any(conn, item, schema)


def _receive_in_any(conn: Any, item: Incoming, schema: str | None) -> Arrival:
    if is_one_of(conn, (("psycopg", "Connection"),)):
        return _receive_postgres(conn, conn, item, schema)
    if is_one_of(conn, (("sqlite3", "Connection"),)):
        return _receive_sqlite(conn, conn, item, schema)
    if is_one_of(conn, SQLALCHEMY_SYNC):
        return _receive_sqlalchemy(conn, item, schema)
    raise TypeError(
        "receive_in takes a psycopg.Connection, a sqlite3.Connection or a SQLAlchemy"
        f" Connection or Session, not {type(conn)!r} (receive_in_async takes the"
        " async ones)"
    )


async def receive_in_async(conn: Any, event: object, *, schema: str | None = None) -> Arrival:
    """Record the event in the inbox in `conn`'s current transaction (a psycopg
    AsyncConnection, a SQLAlchemy AsyncConnection or AsyncSession), without
    committing it; in the inbox whose tables are in `schema` if one is named.
    Returns and raises as `receive_in` does."""
    item = Incoming.checked(event)
    with tables_hinted(_NO_TABLES):
        return await _receive_in_async_any(conn, item, schema)


async def _receive_in_async_any(conn: Any, item: Incoming, schema: str | None) -> Arrival:
    if is_one_of(conn, SQLALCHEMY_ASYNC):
        # The same path as the sync objects, on the sync Connection or Session the
        # async one wraps: under run_sync its statements await the driver.
        arrival: Arrival = await conn.run_sync(_receive_sqlalchemy, item, schema)
        return arrival
    if not is_one_of(conn, (("psycopg", "AsyncConnection"),)):
        raise TypeError(
            "receive_in_async takes a psycopg.AsyncConnection or a SQLAlchemy"
            f" AsyncConnection or AsyncSession, not {type(conn)!r}"
        )
    import psycopg

    sql = _pg_statements(schema)
    check_psycopg_transaction(conn)
    now, event_id = time.time(), item.event["id"]
    try:
        if await (await conn.execute(sql.insert_one, sql.params(item, now))).fetchall():
            return "new"
        _check_same(item, await (await conn.execute(sql.find, (event_id,))).fetchone())
        await conn.execute(sql.count_duplicate, (now, event_id))
    except psycopg.Error as exc:
        raise pg_failed(conn, exc) from exc
    return "duplicate"


def ack_body(event: object, arrival: Arrival) -> dict[str, str]:
    """The ACK the sink answers for `event` once it is committed, given what
    receive_in returned for it: `{"ack": ID, "status": "applied" or "duplicate",
    "sha256": DIGEST}`, the digest of the event's canonical form (a duplicate's is the
    same: another would have been a Conflict). A dict, to be sent as the JSON body of
    a 200 reply, and only after the commit; InvalidEvent for an invalid event."""
    receipt = _RECEIPTS.get(arrival)
    if receipt is None:
        raise ValueError(f"arrival must be 'new' or 'duplicate' (receive_in's), not {arrival!r}")
    item = Incoming.checked(event)
    return make_ack(item.event["id"], receipt, digest_of(item.canonical))


def _receive(execute: Callable[[str, Any], Any], sql: _Statements, item: Incoming) -> Arrival:
    """In the caller's transaction: the event's row if its ID is new; else, if the
    row holds the same canonical form, its delivery counted (Conflict otherwise,
    nothing written). The insert comes first: on PostgreSQL, an ID that another
    transaction is recording makes it wait for that one to end, and the row is then
    read as that one committed it."""
    now, event_id = time.time(), item.event["id"]
    if execute(sql.insert_one, sql.params(item, now)).fetchall():
        return "new"
    _check_same(item, execute(sql.find, (event_id,)).fetchone())
    execute(sql.count_duplicate, (now, event_id))
    return "duplicate"


def _check_same(item: Incoming, stored: Any) -> None:
    """Conflict unless the row found for a known ID holds the item's canonical form."""
    if stored is None or stored[0] != item.canonical:
        raise Conflict(item.event["id"])


def _receive_postgres(statements: Any, driver: Any, item: Incoming, schema: str | None) -> Arrival:
    """_receive run by `statements` (the psycopg Connection `driver`, or DriverSql) in
    the transaction of `driver`, each table written in `schema` if one is named."""
    import psycopg

    sql = _pg_statements(schema)
    check_psycopg_transaction(driver)
    try:
        return _receive(statements.execute, sql, item)
    except psycopg.Error as exc:
        raise pg_failed(driver, exc) from exc


@functools.cache
def _pg_statements(schema: str | None) -> _Statements:
    """postgres_sql's statements with each table written in `schema` (as the inbox
    opened with `schema=NAME` runs them); as written without one. BadLocation for a
    name that is not a plain identifier."""
    import pg_tx
    from sink.backends import postgres, postgres_sql

    sql = pg_tx.qualified(postgres_sql, pg_tx.qualifier(schema, postgres_sql.SCHEMA.tables))
    return _Statements(
        sql.INSERT_ONE.decode(),
        sql.FIND.decode(),
        sql.COUNT_DUPLICATE.decode(),
        postgres.one_params,
    )


def _receive_sqlite(statements: Any, driver: Any, item: Incoming, schema: str | None) -> Arrival:
    """_receive run by `statements` (the sqlite3.Connection `driver`, or DriverSql)
    in the transaction of `driver` (a sqlite3.Connection, or aiosqlite's)."""
    import sqlite3

    _refuse_schema_on_sqlite(schema)
    check_sqlite_transaction(driver)
    try:
        return _receive(statements.execute, _sqlite_statements(), item)
    except sqlite3.Error as exc:
        raise _sqlite_failed(exc) from exc


@functools.cache
def _sqlite_statements() -> _Statements:
    from sink.backends import sqlite, sqlite_sql

    return _Statements(
        sqlite_sql.INSERT_ONE, sqlite_sql.FIND, sqlite_sql.COUNT_DUPLICATE, sqlite.inbox_row
    )


def _refuse_schema_on_sqlite(schema: str | None) -> None:
    if schema is not None:
        raise ValueError(
            f"schema={schema!r} names a PostgreSQL schema: a SQLite file has none"
            " (its inbox tables are the file's own)"
        )


def _sqlite_failed(exc: BaseException) -> StorageError:
    return StorageError(f"SQLite inbox: {exc}")


def _receive_sqlalchemy(conn: Any, item: Incoming, schema: str | None) -> Arrival:
    """Through a SQLAlchemy Connection or Session (or the sync side of an async one,
    under run_sync): the backend's own path above, its driver-style SQL passed
    through `exec_driver_sql` so that SQLAlchemy's transaction is the one it joins."""
    connection, driver = sqlalchemy_connection(conn)
    receive, failed = sqlalchemy_backend(
        connection.dialect, driver, _receive_sqlite, _receive_postgres, _sqlite_failed
    )
    if receive is _receive_sqlite:
        _refuse_schema_on_sqlite(schema)  # before a Connection's transaction is begun
    autobegin(connection)
    with driver_errors(failed):
        return receive(DriverSql(connection.exec_driver_sql), driver, item, schema)


__all__ = [
    "Arrival",
    "InvalidRequest",
    "NotInTransaction",
    "ack_body",
    "read_cloudevents",
    "receive_in",
    "receive_in_async",
]
