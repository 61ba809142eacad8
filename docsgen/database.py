"""docs/reference/database.md: the tables of both sides on both backends.

SQLite: a fresh in-memory database migrated by the code's own migration (the same
call that opens a file), read back from sqlite_master. PostgreSQL: the FRESH script
of each side's backend, which its migration runs on a database without the side's
tables (a test of the backends checks that it equals what the migrations reach).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from docsgen.markdown import GENERATED_NOTE, code, page, table, text
from plumbing.schema import VERSIONS_TABLE, Schema
from publisher.backends.sqlite import PAYLOAD_APART_CHARS

# One line per table (a test fails for a table of the code that is not here).
DESCRIPTIONS: Final[dict[str, str]] = {
    VERSIONS_TABLE: "The schema version of each side (`publisher`, `sink`), one row per"
    " side, and of each handler registry's own schema statements (side"
    " `handlers:NAME`). Both sides may share one database.",
    "outbox_orders": "The example intake's orders (`POST /orders`, `accept --id`), written"
    " in the transaction of their outbox entry.",
    "outbox_entries": "The outbox: one row per event, in `seq` order (the order of commit),"
    " with its payload (the event's canonical form), whether it was sent and when, the"
    " verified ACK, failed attempts, quarantine, and its lane (the key) when it has one."
    " Times are Unix seconds. On SQLite the payload of a large event is '' here and kept"
    " in `outbox_payloads`.",
    "outbox_payloads": f"The canonical form of each event of {PAYLOAD_APART_CHARS:,}"
    " characters or more, by"
    " the `seq` of its entry, written once: a mark rewrites the entry's row, which then"
    " holds no copy of the event. PostgreSQL keeps such values out of the row on its own"
    " (TOAST).",
    "outbox_quarantines": "Each quarantine of an entry: why, by whom and when, and how it"
    " ended (redriven, or delivered meanwhile), with the entries delivered past it.",
    "outbox_health": "One row the readiness probe writes (`GET /readyz`).",
    "outbox_line_leases": "The lease of each line (`*` for the global line, else a lane's"
    " key): the worker that holds it, its epoch and when it expires.",
    "outbox_relay_workers": "The relay workers the outbox remembers by their heartbeat.",
    "outbox_source": "One row: this outbox's source name, random, made when the tables are"
    " created; sent in the `Outbox-Lease` header so that a sink tells outboxes apart.",
    "outbox_pruned": "The ID and digest of each entry `prune` deleted, so that the same ID"
    " is still a duplicate (or a conflict) at intake afterwards.",
    "inbox_events": "The inbox: one row per event ID received, its payload (the canonical"
    " form as stored), type, when it came first and last, how many deliveries, and"
    " `applied_seq`, its place in the order of first application. Times are Unix seconds.",
    "inbox_inventory": "The built-in warehouse's stock: the quantity of each SKU.",
    "inbox_health": "One row the readiness probe writes (`GET /readyz`).",
    "inbox_tally": "PostgreSQL only: the count of events in slots, so that a metrics"
    " scrape does not count rows.",
    "inbox_lease_fences": "The highest lease epoch seen for each source and line: a request"
    " with a lower one is refused (409, `fenced`).",
}

INTRO: Final = f"""
# Database schemas

Each side keeps its tables in the database given by `--db`: the publisher's all named
`outbox_*`, the sink's `inbox_*`, so that they sit beside a user's own tables (and
both sides may share one database). On PostgreSQL, `--schema NAME` (or `schema=NAME`
in the URI) puts them in that schema. The columns are the same on both backends,
with each backend's types; a query written for one runs on the other, with one
exception: a SQLite outbox keeps an event of {PAYLOAD_APART_CHARS:,} characters or more in
`outbox_payloads`, and '' in the `payload` of its entry. Times are seconds since the
Unix epoch, as numbers.

A side creates its tables, or brings them up to date, when it opens the database, in
one transaction (on PostgreSQL under an advisory lock, so that processes starting
together migrate once), and records its version in `{VERSIONS_TABLE}`. A database
with none of the side's tables gets the newest tables at once; one that an earlier
release wrote is brought up step by step; a version newer than the program knows is
refused in one line. How to upgrade is in [Upgrade a database](../how-to/upgrade.md).

A handler registry's own schema statements (`Handlers.schema(...)`) create the tables
its handlers write to, beside these; each runs once, counted in `{VERSIONS_TABLE}`
under the side `handlers:NAME`.

Beside a SQLite file the publisher keeps `<file>.relay-lock`, the lock that lets one
relay at a time deliver from it; SQLite itself keeps `<file>-wal` and `<file>-shm`
(the database runs in WAL mode).
"""

_KEYWORDS: Final = (
    "NOT",
    "NULL",
    "DEFAULT",
    "PRIMARY",
    "UNIQUE",
    "CHECK",
    "REFERENCES",
    "GENERATED",
    "COLLATE",
)
_TABLE_CONSTRAINTS: Final = ("CHECK", "PRIMARY", "UNIQUE", "FOREIGN", "CONSTRAINT")


@dataclass
class Table:
    name: str
    columns: list[tuple[str, str, str]] = field(default_factory=list)  # name, type, rest
    constraints: list[str] = field(default_factory=list)
    indexes: list[str] = field(default_factory=list)
    options: str = ""  # WITHOUT ROWID
    seeded: bool = False  # starts with a row


@dataclass
class Objects:
    tables: dict[str, Table] = field(default_factory=dict)
    others: list[str] = field(default_factory=list)  # sequences, functions


def split_script(script: str) -> Iterator[str]:
    """The statements of a script: comments dropped, split on `;` outside `$$` bodies."""
    lines = [line for line in script.splitlines() if not line.strip().startswith("--")]
    body = "\n".join(lines)
    for n, part in enumerate(body.split("$$")):
        if n % 2:  # inside a dollar-quoted body: kept whole
            yield f"$${part}$$"
        else:
            yield from (f"\x00{s}" for s in part.split(";"))


def statements(script: str) -> list[str]:
    """Whole statements, whitespace collapsed."""
    joined: list[str] = []
    current = ""
    for piece in split_script(script):
        if piece.startswith("\x00"):  # a cut at `;` ends the statement before it
            if current.strip():
                joined.append(" ".join(current.split()))
            current = piece[1:]
        else:
            current += piece
    if current.strip():
        joined.append(" ".join(current.split()))
    return joined


def parse(sql_statements: list[str]) -> Objects:
    objects = Objects()
    for statement in sql_statements:
        upper = statement.upper()
        if upper.startswith("CREATE TABLE"):
            table_ = _table(statement)
            objects.tables[table_.name] = table_
        elif re.match(r"CREATE (UNIQUE )?INDEX", upper):
            target = re.search(r"\bON (\w+)", statement)
            if target and target[1] in objects.tables:
                objects.tables[target[1]].indexes.append(statement)
        elif upper.startswith("INSERT INTO"):
            name = statement.split()[2]
            if name in objects.tables:
                objects.tables[name].seeded = True
        elif upper.startswith(("CREATE SEQUENCE", "CREATE FUNCTION")):
            kind, name = statement.split()[1:3]
            objects.others.append(f"{kind.lower()} {name.split('(')[0]}")
    return objects


def _table(statement: str) -> Table:
    match = re.match(r"CREATE TABLE (?:IF NOT EXISTS )?\"?(\w+)\"? \((.*)\)(.*)$", statement)
    if match is None:
        raise ValueError(f"cannot read {statement[:60]!r}")
    table_ = Table(match[1], options=match[3].strip())
    for item in _top_level(match[2]):
        first = item.split()[0].upper()
        if first in _TABLE_CONSTRAINTS:
            table_.constraints.append(item)
            continue
        name, _, rest = item.partition(" ")
        words = rest.split(" ")
        cut = next((i for i, w in enumerate(words) if w.upper() in _KEYWORDS), len(words))
        table_.columns.append((name, " ".join(words[:cut]), " ".join(words[cut:])))
    return table_


def _top_level(body: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in body:
        if char == "," and depth == 0:
            items.append(current.strip())
            current = ""
            continue
        depth += char == "("
        depth -= char == ")"
        current += char
    if current.strip():
        items.append(current.strip())
    return items


def sqlite_objects(schema: Schema) -> Objects:
    """What the SQLite migration creates in an empty database."""
    from sqlite_tx.migrations import migrate

    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn, schema)
        rows = conn.execute(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"
            " ORDER BY rowid"
        ).fetchall()
        objects = parse([" ".join(sql.split()) for (sql,) in rows])
        for name, table_ in objects.tables.items():
            table_.seeded = conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] > 0
        return objects
    finally:
        conn.close()


def postgres_objects(schema: Schema) -> Objects:
    """What the PostgreSQL migration creates in a database without the side's tables:
    the versions table (pg_tx.migrations) and the side's FRESH script."""
    versions = f"CREATE TABLE {VERSIONS_TABLE} ( side TEXT PRIMARY KEY, version INTEGER NOT NULL)"
    return parse([versions, *statements(schema.fresh)])


def sides() -> dict[str, dict[str, Objects]]:
    """Each side's objects, by backend."""
    from publisher.backends import postgres_sql as publisher_pg
    from publisher.backends import sqlite_sql as publisher_sqlite
    from sink.backends import postgres_sql as sink_pg
    from sink.backends import sqlite_sql as sink_sqlite

    return {
        "publisher": {
            "SQLite": sqlite_objects(publisher_sqlite.SCHEMA),
            "PostgreSQL": postgres_objects(publisher_pg.SCHEMA),
        },
        "sink": {
            "SQLite": sqlite_objects(sink_sqlite.SCHEMA),
            "PostgreSQL": postgres_objects(sink_pg.SCHEMA),
        },
    }


def table_names() -> set[str]:
    """Every table either side creates on either backend."""
    return {name for side in sides().values() for o in side.values() for name in o.tables}


def render() -> str:
    found = sides()
    any_side = found["publisher"]
    sections = ["## Schema versions\n\n" + _table_section(VERSIONS_TABLE, any_side, versions=True)]
    titles = {"publisher": "The publisher's outbox", "sink": "The sink's inbox"}
    for side, backends in found.items():
        names = [
            n
            for n in dict.fromkeys(n for o in backends.values() for n in o.tables)
            if n != VERSIONS_TABLE
        ]
        parts = [f"## {titles[side]}"]
        parts += [_table_section(name, backends) for name in names]
        others = [
            f"{backend}: " + ", ".join(code(o) for o in objects.others)
            for backend, objects in backends.items()
            if objects.others
        ]
        if others:
            parts.append(
                "### Other objects\n\nBesides the tables and their indexes, "
                + "; ".join(others)
                + ". The sequence numbers `applied_seq`; the functions raise the errors"
                " with which the sink's group commit stops a statement (a race with"
                " another sink, a call that cannot go in as all new)."
            )
        sections.append("\n\n".join(parts))
    return page(GENERATED_NOTE, INTRO, *sections)


def _table_section(name: str, backends: dict[str, Objects], *, versions: bool = False) -> str:
    present = {b: o.tables[name] for b, o in backends.items() if name in o.tables}
    parts = [] if versions else [f"### {code(name)}"]
    parts.append(text(DESCRIPTIONS.get(name, "")))
    if len(present) < len(backends):
        parts.append(f"Only on {', '.join(present)}.")
    columns = list(dict.fromkeys(c[0] for t in present.values() for c in t.columns))
    rows = []
    for column in columns:
        row = [code(column)]
        for backend in backends:
            table_ = present.get(backend)
            found = [c for c in table_.columns if c[0] == column] if table_ else []
            row.append(_column_cell(found[0]) if found else "")
        rows.append(row)
    parts.append(table(["Column", *backends], rows))
    extras = {backend: _extras(t, seeded=not versions) for backend, t in present.items()}
    if len(extras) > 1 and len({tuple(sorted(e)) for e in extras.values()}) == 1:
        extras = {"Both backends": next(iter(extras.values()))}
    for backend, items in extras.items():
        if items:
            parts.append(f"{backend}:\n\n" + "\n".join(f"- {item}" for item in items))
    return "\n\n".join(parts)


def _extras(table_: Table, *, seeded: bool) -> list[str]:
    items = [code(c) for c in table_.constraints] + [code(i) for i in table_.indexes]
    if table_.options:
        items.append(code(table_.options))
    if seeded and table_.seeded:
        items.append("starts with its one row")
    return items


def _column_cell(column: tuple[str, str, str]) -> str:
    _, kind, rest = column
    return code(f"{kind} {rest}".strip())
