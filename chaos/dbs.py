"""Where a chaos run's two databases live, and reads of them through connections of our own.

A run needs a source database (the publisher's) and a sink database, always separate:
two SQLite files in the work directory, two databases on a throwaway PostgreSQL server
that the run starts and removes, or two fresh schemas (reached through `search_path`)
in a PostgreSQL database the operator names with a URL.

Every read here opens its own connection (SQLite read-only, PostgreSQL in a read-only
snapshot), so what a verdict reports is what the database holds, not what a service
believes. The SQL is the common subset of both dialects; anything a dialect would
spell differently (booleans, JSON) is worked out in Python.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol
from urllib.parse import parse_qsl, quote, urlsplit

from chaos.procs import ChaosError
from plumbing.storage import POSTGRES_SCHEMES, redacted

if TYPE_CHECKING:
    from plumbing.pgserver import ThrowawayServer

Backend = Literal["sqlite", "postgres"]
BACKENDS: Final[tuple[Backend, ...]] = ("sqlite", "postgres")
DbLocation = str | Path  # a --db value: a SQLite path or a postgresql:// URI
CONNECT_TIMEOUT_S: Final = 10
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def is_postgres(location: DbLocation) -> bool:
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


# ---------------------------------------------------------------- reads


class Reader(Protocol):
    def rows(self, sql: str) -> list[tuple[Any, ...]]: ...

    def columns(self, table: str) -> set[str]: ...


class _SqliteReader:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql).fetchall()

    def columns(self, table: str) -> set[str]:
        return {row[1] for row in self._conn.execute(f"PRAGMA table_info({table})")}


class _PgReader:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return list(self._conn.execute(sql.encode()).fetchall())

    def columns(self, table: str) -> set[str]:
        found = self._conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = %s AND table_schema = current_schema()",
            (table,),
        ).fetchall()
        return {name for (name,) in found}


@contextlib.contextmanager
def reading(location: DbLocation) -> Iterator[Reader]:
    """One independent connection for reads: one snapshot on PostgreSQL, read-only on both."""
    if is_postgres(location):
        import psycopg

        from pg_tx import parse

        try:
            conn = psycopg.connect(parse(str(location)).conninfo, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise ChaosError(f"cannot read {redacted(str(location))}: {exc}") from None
        try:
            conn.execute(b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield _PgReader(conn)
        finally:
            conn.rollback()
            conn.close()
        return
    lite = sqlite3.connect(f"file:{location}?mode=ro", uri=True)
    try:
        yield _SqliteReader(lite)
    finally:
        lite.close()


def rows(location: DbLocation, sql: str) -> list[tuple[Any, ...]]:
    """The rows of one query, through a connection opened and closed for it."""
    with reading(location) as reader:
        return reader.rows(sql)


def value(location: DbLocation, sql: str) -> Any:
    """The first column of the first row of one query, or None."""
    found = rows(location, sql)
    return found[0][0] if found else None


def as_int(flag: object) -> int:
    """A 0/1 flag column as an integer: SQLite stores integers, PostgreSQL may use booleans."""
    return int(bool(flag))


def as_text(text: object) -> str:
    """A text column as str (a driver may give bytes)."""
    return text.decode() if isinstance(text, bytes) else str(text)


def as_json(text: object) -> Any:
    """A JSON column: text in SQLite, text or already decoded (json/jsonb) in PostgreSQL."""
    return json.loads(text) if isinstance(text, str | bytes) else text


def entry_payload(reader: Reader) -> str:
    """The SQL, over `outbox_entries`, of an entry's canonical event. A SQLite outbox
    keeps a large event in `outbox_payloads` and '' in the entry's own column (see
    the database reference); elsewhere the column holds it."""
    if isinstance(reader, _SqliteReader) and reader.columns("outbox_payloads"):
        return (
            "coalesce(nullif(payload, ''), (SELECT p.payload FROM outbox_payloads AS p"
            " WHERE p.seq = outbox_entries.seq))"
        )
    return "payload"


def applied_ids(reader: Reader) -> list[str]:
    """The sink's inbox IDs in the order of first application: by `applied_seq` where the
    schema has it; an older SQLite file by rowid (rows are only ever inserted, on the
    first delivery)."""
    if "applied_seq" in reader.columns("inbox_events"):
        tie = ", rowid" if isinstance(reader, _SqliteReader) else ""
        return [i for (i,) in reader.rows(f"SELECT id FROM inbox_events ORDER BY applied_seq{tie}")]
    if isinstance(reader, _SqliteReader):
        return [i for (i,) in reader.rows("SELECT id FROM inbox_events ORDER BY rowid")]
    raise ChaosError("the sink's inbox has no applied_seq column: its order cannot be read")


# ---------------------------------------------------------------- where they live


@dataclass(frozen=True)
class Pair:
    """A source and a sink database, each as the services' --db takes it."""

    source: DbLocation
    sink: DbLocation

    @property
    def backend(self) -> Backend:
        return "postgres" if is_postgres(self.source) else "sqlite"

    def shown(self) -> dict[str, str]:
        """Both locations fit for a report (any password redacted)."""
        return {"source": redacted(str(self.source)), "sink": redacted(str(self.sink))}


class Place(Protocol):
    """Makes fresh pairs for a run; `close()` removes what it made (unless kept)."""

    backend: Backend

    def pair(self, label: str, directory: Path) -> Pair: ...

    def close(self) -> None: ...

    def describe(self) -> str: ...

    def own_server(self) -> ThrowawayServer | None:
        """The PostgreSQL server this place started for the run, if it did."""
        ...


@dataclass
class SqlitePlace:
    """Two files in the run's directory."""

    backend: Backend = "sqlite"

    def pair(self, label: str, directory: Path) -> Pair:
        return Pair(directory / "source.db", directory / "sink.db")

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return "SQLite files"

    def own_server(self) -> ThrowawayServer | None:
        return None


@dataclass
class ThrowawayPlace:
    """Two databases per pair on a PostgreSQL server of the run's own, removed at the end."""

    backend: Backend = "postgres"
    server: Any = None
    made: int = 0
    settings: Mapping[str, str] | None = None  # postgresql.conf lines of its own

    def __post_init__(self) -> None:
        from plumbing.pgserver import ServerUnavailable, ThrowawayServer

        try:
            self.server = ThrowawayServer(self.settings)
            self.server.start()
        except ServerUnavailable as exc:
            if self.server is not None:
                self.server.remove()
            raise ChaosError(str(exc)) from None

    def pair(self, label: str, directory: Path) -> Pair:
        self.made += 1
        base = f"{_identifier(label)}_{self.made}"
        source = self.server.create_database(f"{base}_source")
        sink = self.server.create_database(f"{base}_sink")
        return Pair(source, sink)

    def close(self) -> None:
        self.server.remove()

    def describe(self) -> str:
        return (
            f"a throwaway PostgreSQL server on 127.0.0.1:{self.server.port} in {self.server.root}"
        )

    def own_server(self) -> ThrowawayServer | None:
        server: ThrowawayServer = self.server
        return server


@dataclass
class SchemaPlace:
    """Two fresh schemas per pair in the operator's PostgreSQL database; each service
    reaches its own through `options=-csearch_path=...` in its URI. Dropped at the end
    unless `keep`."""

    url: str
    keep: bool = False
    backend: Backend = "postgres"
    schemas: list[str] = field(default_factory=list)
    tag: str = field(default_factory=lambda: f"chaos_{os.getpid()}_{secrets.token_hex(3)}")

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.password is not None or any(
            k == "password" for k, _ in parse_qsl(parts.query, keep_blank_values=True)
        ):
            raise ChaosError(
                "the --db-url names a password: give it in PGPASSWORD or a .pgpass file instead"
            )
        if any(k == "options" for k, _ in parse_qsl(parts.query, keep_blank_values=True)):
            raise ChaosError("the --db-url sets options: chaos sets search_path there itself")

    def pair(self, label: str, directory: Path) -> Pair:
        base = f"{self.tag}_{_identifier(label)}"
        return Pair(self._schema(f"{base}_source"), self._schema(f"{base}_sink"))

    def _schema(self, name: str) -> str:
        self._execute(f'CREATE SCHEMA "{name}"')
        self.schemas.append(name)
        joiner = "&" if urlsplit(self.url).query else "?"
        return f"{self.url}{joiner}options={quote(f'-csearch_path={name}', safe='')}"

    def close(self) -> None:
        if not self.keep:
            for name in reversed(self.schemas):
                with contextlib.suppress(ChaosError):
                    self._execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    def describe(self) -> str:
        kept = "kept" if self.keep else "dropped at the end"
        return f"schemas {self.tag}_* in {redacted(self.url)} ({kept})"

    def own_server(self) -> ThrowawayServer | None:
        return None  # the operator's: its other work is not the run's

    def _execute(self, statement: str) -> None:
        import psycopg

        from pg_tx import parse

        try:
            conninfo = parse(self.url).conninfo
            with psycopg.connect(
                conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
            ) as conn:
                conn.execute(statement.encode())
        except Exception as exc:  # psycopg's errors, or a URI libpq refuses
            raise ChaosError(f"{redacted(self.url)}: {_first_line(exc)}") from None


def _identifier(label: str) -> str:
    name = re.sub(r"[^a-z0-9_]", "_", label.lower())[:40] or "run"
    if not _SCHEMA_NAME.fullmatch(name):
        name = f"x_{name}"
    return name


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def open_place(
    backend: Backend,
    db_url: str | None,
    *,
    keep: bool = False,
    server_settings: Mapping[str, str] | None = None,
) -> Place:
    """Where the run's databases go: SQLite files, the operator's PostgreSQL database
    (`db_url`), or a throwaway PostgreSQL server started for the run (with
    `server_settings` in its configuration)."""
    if backend == "sqlite":
        if db_url is not None:
            raise ChaosError("--db-url is for --backend postgres")
        return SqlitePlace()
    if db_url is None:
        return ThrowawayPlace(settings=server_settings)
    if not db_url.startswith(POSTGRES_SCHEMES):
        raise ChaosError("--db-url must be a postgresql:// URI")
    return SchemaPlace(db_url, keep=keep)
