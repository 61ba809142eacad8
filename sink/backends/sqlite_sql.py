"""Every SQL statement of the SQLite inbox, named. Its tables: inbox_events (one row
per event received), inbox_inventory (the built-in example's effect), inbox_health
(the writability probe's row) and inbox_lease_fences (the highest lease epochs)."""

from __future__ import annotations

from typing import Final

from plumbing.schema import VERSIONS_TABLE, Schema

MIGRATIONS: Final = (
    """
    CREATE TABLE inbox (
        id               TEXT PRIMARY KEY,
        payload          TEXT NOT NULL,
        received_at      REAL NOT NULL,
        deliveries       INTEGER NOT NULL DEFAULT 1,
        last_delivery_at REAL NOT NULL
    );
    CREATE TABLE inventory (
        sku TEXT PRIMARY KEY,
        qty INTEGER NOT NULL
    );
    """,
    # 2: the writability probe (check_writable) updates this one row in place.
    """
    CREATE TABLE health (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        at REAL NOT NULL
    );
    INSERT INTO health (id, at) VALUES (1, 0);
    """,
    # 3: the order of first application. Rows are only ever inserted, on an ID's
    # first delivery, so the rowid order of the rows already there is that order.
    """
    ALTER TABLE inbox ADD COLUMN applied_seq INTEGER;
    UPDATE inbox SET applied_seq = rowid;
    CREATE UNIQUE INDEX inbox_by_applied_seq ON inbox (applied_seq);
    """,
    # 4: the highest lease epoch seen for each source and line (Outbox-Lease).
    """
    CREATE TABLE lease_fences (
        source TEXT NOT NULL,
        line   TEXT NOT NULL,
        epoch  INTEGER NOT NULL,
        PRIMARY KEY (source, line)
    ) WITHOUT ROWID;
    """,
    # 5: events of any type, and every table named with the inbox_ prefix, so that
    # the inbox can live in a database beside the user's own tables. A row's payload
    # is its event's canonical form (RFC 8785 of {id, type, key, data}) and its type
    # a column. Every row before this one is an order of the previous release,
    # {"id","qty","sku"}: it becomes the order.placed event it records, keyed by its
    # SKU, in exactly the text of shared.event.order_canonical (json_object writes
    # compact JSON with its members in argument order, and an ID or a SKU needs no
    # escaping). Every insert names its type: the default only says what the rows
    # already there are.
    """
    ALTER TABLE inbox ADD COLUMN type TEXT NOT NULL DEFAULT 'order.placed';
    UPDATE inbox SET payload = json_object(
        'data', json_object(
            'qty', json_extract(payload, '$.qty'), 'sku', json_extract(payload, '$.sku')
        ),
        'id', id,
        'key', json_extract(payload, '$.sku'),
        'type', 'order.placed'
    );
    ALTER TABLE inbox RENAME TO inbox_events;
    ALTER TABLE inventory RENAME TO inbox_inventory;
    ALTER TABLE health RENAME TO inbox_health;
    ALTER TABLE lease_fences RENAME TO inbox_lease_fences;
    """,
)


# The newest schema at once, for a file that has none of the inbox's tables: what
# MIGRATIONS reach (a test compares the two).
FRESH: Final = """
    CREATE TABLE inbox_events (
        id               TEXT PRIMARY KEY,
        payload          TEXT NOT NULL,
        received_at      REAL NOT NULL,
        deliveries       INTEGER NOT NULL DEFAULT 1,
        last_delivery_at REAL NOT NULL,
        applied_seq      INTEGER,
        type             TEXT NOT NULL DEFAULT 'order.placed'
    );
    CREATE UNIQUE INDEX inbox_by_applied_seq ON inbox_events (applied_seq);
    CREATE TABLE inbox_inventory (
        sku TEXT PRIMARY KEY,
        qty INTEGER NOT NULL
    );
    CREATE TABLE inbox_health (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        at REAL NOT NULL
    );
    INSERT INTO inbox_health (id, at) VALUES (1, 0);
    CREATE TABLE inbox_lease_fences (
        source TEXT NOT NULL,
        line   TEXT NOT NULL,
        epoch  INTEGER NOT NULL,
        PRIMARY KEY (source, line)
    ) WITHOUT ROWID;
"""
SCHEMA: Final = Schema(
    side="sink",
    fresh=FRESH,
    migrations=MIGRATIONS,
    tables=frozenset(
        {"inbox", "inventory", "health", "lease_fences", "inbox_events", "inbox_inventory"}
        | {"inbox_health", "inbox_lease_fences"}
    ),
    probe_table="inbox_health",
    legacy_table="inbox",
    legacy_columns=frozenset({"id", "payload", "received_at", "deliveries"}),
)

FIND: Final = "SELECT payload FROM inbox_events WHERE id = ?"
# Records a new ID, next in the order of application (one writer at a time: the
# largest applied_seq, read from the end of its index, is the last one given);
# does nothing (rowcount 0) when the ID is known already.
INSERT: Final = (
    "INSERT INTO inbox_events (id, type, payload, received_at, last_delivery_at, applied_seq)"
    " VALUES (?, ?, ?, ?, ?, (SELECT coalesce(max(applied_seq), 0) + 1 FROM inbox_events))"
    " ON CONFLICT (id) DO NOTHING"
)
# Which of a JSON array of IDs the inbox knows, with their stored payloads.
FIND_MANY: Final = (
    "SELECT id, payload FROM inbox_events WHERE id IN (SELECT value FROM json_each(?))"
)
COUNT_DUPLICATE: Final = (
    "UPDATE inbox_events SET deliveries = deliveries + 1, last_delivery_at = ? WHERE id = ?"
)
# Read and raised inside the write transaction (BEGIN IMMEDIATE: no other writer
# meanwhile), so the epoch read is the highest any sink on this file has seen.
LEASE_SEEN: Final = "SELECT epoch FROM inbox_lease_fences WHERE source = ? AND line = ?"
RAISE_LEASE: Final = (
    "INSERT INTO inbox_lease_fences (source, line, epoch) VALUES (?, ?, ?)"
    " ON CONFLICT (source, line) DO UPDATE SET epoch = excluded.epoch"
    " WHERE inbox_lease_fences.epoch < excluded.epoch"
)
INVENTORY: Final = "SELECT qty FROM inbox_inventory WHERE sku = ?"
RECORD: Final = (
    "SELECT payload, received_at, deliveries, last_delivery_at, applied_seq"
    " FROM inbox_events WHERE id = ?"
)
# The inbox only grows (rows are never deleted), so the largest rowid is its row
# count, read from the end of the b-tree instead of counting every row.
COUNT_EVENTS: Final = "SELECT coalesce(max(rowid), 0) FROM inbox_events"

# A registry's schema statements (sink.handlers) run so far: a row of the versions
# table under the side `handlers:NAME`, apart from the inbox's own.
HANDLER_SCHEMA_VERSION: Final = f"SELECT version FROM {VERSIONS_TABLE} WHERE side = ?"
SET_HANDLER_SCHEMA_VERSION: Final = (
    f"INSERT INTO {VERSIONS_TABLE} (side, version) VALUES (?, ?)"
    " ON CONFLICT (side) DO UPDATE SET version = excluded.version"
)

# INSERT for one event in a transaction of the caller's own (sink.in_transaction):
# returns the ID only when it was new, as the PostgreSQL inbox's INSERT_ONE does.
INSERT_ONE: Final = INSERT + " RETURNING id"
