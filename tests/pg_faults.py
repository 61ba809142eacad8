"""A PostgreSQL database as a test reaches it, and ways it stops taking writes.

The PostgreSQL analogue of `sqlite_faults`, shared by the postgres backends of both
behaviour suites and by the readiness tests. `PgAccess(url, probe_table)` reads and
writes through a fresh psycopg connection for every call (autocommit, closed
afterwards), as another process would, and makes real faults on the server:

- read-only: the database's `default_transaction_read_only` is set on and its other
  sessions are ended, so that every connection opened again (the pool's too) is
  read-only, as on a hot standby;
- locked: a connection of ours holds an EXCLUSIVE lock on the side's probe table
  (reads go on, writes wait);
- gone: the database takes no connections (`ALLOW_CONNECTIONS false`) and its
  sessions are ended, as when its server is away.

Each is undone on the way out (the sessions opened meanwhile are ended again, so
that none stays read-only), but for `read_only(end_after=False)`: the setting is
reset and the sessions opened meanwhile are left as they are, read-only for life,
as after a fail-over or an operator's RESET, for the service to recover from alone.

`frozen(server)` stops every process of a server of the test's own (SIGSTOP), as a
stalled disk or a black-holed network looks to a client: its TCP connections stay
open, and nothing answers. The suites write `?` placeholders; they are sent as
psycopg's `%s` (a `?` inside a string literal would be translated too: the suites
have none).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from sqlite_faults import Fault

from plumbing.pgserver import ThrowawayServer

Row = tuple[Any, ...]
Write = Literal["INSERT", "UPDATE"]
CONNECT_TIMEOUT_S = 5
TERMINATE_WAIT_MS = 5_000  # for each ended session to be gone
NO_WAIT_LOCK_MS = 10  # "fails now": a lock is not waited for beyond this


def placeholders(statement: str) -> str:
    """The suites' `?` placeholders as psycopg's `%s` (a literal `%` doubled)."""
    return statement.replace("%", "%%").replace("?", "%s")


class PgAccess:
    """One database on a PostgreSQL server, reached with psycopg: a fresh connection
    for every read or write, closed afterwards. `probe_table` is the side's probe
    table (`outbox_health`, `inbox_health`), the one the "locked" fault locks and
    `others_cannot_write` writes to."""

    def __init__(self, url: str, probe_table: str) -> None:
        self.url = url
        self.probe_table = probe_table
        parts = urlsplit(url)
        self.dbname = parts.path.lstrip("/")
        self._maintenance_url = urlunsplit(parts._replace(path="/postgres"))

    @property
    def location(self) -> str:
        return self.url

    def _connect(self, url: str | None = None) -> psycopg.Connection[Any]:
        return psycopg.connect(url or self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)

    def query(self, statement: str, *params: object) -> list[Row]:
        with self._connect() as conn:
            if params:
                cursor = conn.execute(placeholders(statement).encode(), params)
            else:
                cursor = conn.execute(statement.encode())
            return cursor.fetchall()

    def transactions(self, table: str) -> int:
        """How many transactions wrote the table's rows (their distinct `xmin`)."""
        n: int = self.query(f"SELECT count(DISTINCT xmin::text) FROM {table}")[0][0]
        return n

    def execute(self, *statements: str) -> None:
        with self._connect() as conn:
            for statement in statements:
                conn.execute(statement.encode())

    @contextlib.contextmanager
    def refusing(self, table: str, writes: tuple[Write, ...], message: str) -> Iterator[None]:
        """A trigger makes every write of these kinds to `table` fail with `message`."""
        function = sql.Identifier(f"refuse_{table}")
        trigger = sql.Identifier(f"refuse_{table}_writes")
        with self._connect() as conn:
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $body$"
                    " BEGIN RAISE EXCEPTION '%', {}; END $body$"
                ).format(function, sql.Literal(message))
            )
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER {} BEFORE {} ON {} FOR EACH ROW EXECUTE FUNCTION {}()"
                ).format(
                    trigger,
                    sql.SQL(" OR ").join(sql.SQL(write) for write in writes),
                    sql.Identifier(table),
                    function,
                )
            )
        try:
            yield
        finally:
            with self._connect() as conn:
                drop = sql.SQL("DROP TRIGGER {} ON {}")
                conn.execute(drop.format(trigger, sql.Identifier(table)))
                conn.execute(sql.SQL("DROP FUNCTION {}()").format(function))

    def unwritable(self, fault: Fault) -> contextlib.AbstractContextManager[None]:
        if fault == "read-only":
            return self._read_only()
        if fault == "locked":
            return self._locked()
        return self._gone()

    @contextlib.contextmanager
    def read_only(self, *, end_after: bool = True) -> Iterator[None]:
        """Every session opened from now on read-only (its database's default), the
        ones open now ended; on the way out the default is reset, and with
        `end_after` the sessions opened meanwhile are ended too."""
        self._alter("SET default_transaction_read_only = on")
        self._end_sessions()
        try:
            yield
        finally:
            self._alter("RESET default_transaction_read_only")
            if end_after:
                self._end_sessions()  # those opened meanwhile are read-only for life

    def _read_only(self) -> contextlib.AbstractContextManager[None]:
        return self.read_only()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._connect() as conn:
            conn.execute(b"BEGIN")
            conn.execute(
                sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(sql.Identifier(self.probe_table))
            )
            try:
                yield
            finally:
                conn.execute(b"ROLLBACK")

    @contextlib.contextmanager
    def _gone(self) -> Iterator[None]:
        self._alter("ALLOW_CONNECTIONS false")
        self._end_sessions()
        try:
            yield
        finally:
            self._alter("ALLOW_CONNECTIONS true")

    def _alter(self, change: str) -> None:
        with self._connect(self._maintenance_url) as conn:
            conn.execute(
                sql.SQL("ALTER DATABASE {} ").format(sql.Identifier(self.dbname)) + sql.SQL(change)
            )

    def _end_sessions(self) -> None:
        """End every session on the database but ours, waiting until each is gone."""
        with self._connect(self._maintenance_url) as conn:
            conn.execute(
                b"SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity"
                b" WHERE datname = %s AND pid <> pg_backend_pid()",
                (TERMINATE_WAIT_MS, self.dbname),
            )

    def others_cannot_write(self) -> bool:
        """Whether a write through a connection of our own fails now (a lock is not
        waited for)."""
        try:
            with self._connect() as conn:
                conn.execute(f"SET lock_timeout = {NO_WAIT_LOCK_MS}".encode())
                conn.execute(
                    sql.SQL("UPDATE {} SET at = at WHERE id = 1").format(
                        sql.Identifier(self.probe_table)
                    )
                )
        except psycopg.Error:
            return True
        return False


@contextlib.contextmanager
def frozen(server: ThrowawayServer) -> Iterator[list[int]]:
    """Every process of `server` stopped (SIGSTOP), the postmaster first so that it
    forks no new one meanwhile; each continued (SIGCONT) on the way out, whatever
    happened. Yields the stopped process IDs."""
    postmaster = server.pid()
    assert postmaster is not None, "the server is not running"
    stopped: list[int] = []
    try:
        os.kill(postmaster, signal.SIGSTOP)
        stopped.append(postmaster)
        for pid in children(postmaster):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        yield stopped
    finally:
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def children(parent: int) -> list[int]:
    """The IDs of the processes whose parent is `parent`, read from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # ended meanwhile
        if len(fields) > 1 and fields[1] == str(parent):
            found.append(int(stat.parent.name))
    return found
