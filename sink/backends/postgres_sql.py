"""Every SQL statement of the PostgreSQL inbox, named.

The tables have the SQLite backend's names and columns (the chaos verdict and the
behaviour suite read them), each with the inbox_ prefix, since both sides and the
user's own tables may share one database; with a schema named, every statement
names them in it (pg_tx.names).
"""

from __future__ import annotations

from typing import Final

from plumbing.schema import VERSIONS_TABLE, Schema

SIDE: Final = "sink"  # this side's row in outbox_relay_versions

STOPPED_STATE: Final = "IB001"  # inbox_stopped()'s SQLSTATE
STOPPED_FUNCTION: Final = f"""
    CREATE FUNCTION inbox_stopped() RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        RAISE EXCEPTION 'a call of this group cannot go in as all new'
            USING ERRCODE = '{STOPPED_STATE}';
    END $$;
"""

MIGRATIONS: Final = (
    """
    CREATE SEQUENCE inbox_applied_seq AS BIGINT;
    CREATE TABLE inbox (
        id               TEXT PRIMARY KEY,
        payload          TEXT NOT NULL,
        received_at      DOUBLE PRECISION NOT NULL,
        deliveries       INTEGER NOT NULL DEFAULT 1,
        last_delivery_at DOUBLE PRECISION NOT NULL,
        applied_seq      BIGINT NOT NULL UNIQUE DEFAULT nextval('inbox_applied_seq')
    );
    ALTER SEQUENCE inbox_applied_seq OWNED BY inbox.applied_seq;
    CREATE TABLE inventory (
        sku TEXT PRIMARY KEY,
        qty BIGINT NOT NULL
    );
    CREATE TABLE inbox_health (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        at DOUBLE PRECISION NOT NULL
    );
    INSERT INTO inbox_health (id, at) VALUES (1, 0);
    -- How many events the inbox holds, exact and cheap to read (count(*) reads the
    -- whole index): each transaction adds what it recorded to the row of its slot.
    -- Several slots, so that concurrent transactions seldom wait for one row's lock.
    CREATE TABLE inbox_tally (
        slot   INTEGER PRIMARY KEY,
        events BIGINT NOT NULL
    );
    """,
    # Raised by INSERT_CALLS when another transaction committed one of its IDs
    # meanwhile: the statement's transaction is then rolled back (its COMMIT is
    # already on the way) and run again, as for a deadlock.
    """
    CREATE FUNCTION inbox_raced() RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        RAISE EXCEPTION 'events of this transaction were committed meanwhile by another one'
            USING ERRCODE = 'serialization_failure';
    END $$;
    """,
    # The highest lease epoch seen for each source and line (Outbox-Lease).
    """
    CREATE TABLE lease_fences (
        source TEXT NOT NULL,
        line   TEXT NOT NULL,
        epoch  BIGINT NOT NULL,
        PRIMARY KEY (source, line)
    );
    """,
    # Events of any type, and every table named with the inbox_ prefix, so that the
    # inbox can live in a database beside the user's own tables. A row's payload is
    # its event's canonical form (RFC 8785 of {id, type, key, data}) and its type a
    # column. Every row before this one is an order of the previous release,
    # {"id","qty","sku"}: it becomes the order.placed event it records, keyed by its
    # SKU, in exactly the text of shared.event.order_canonical (written by
    # concatenation: PostgreSQL's own JSON output has spaces, and an ID or a SKU needs
    # no escaping).
    """
    ALTER TABLE inbox ADD COLUMN type TEXT;
    UPDATE inbox SET
        type = 'order.placed',
        payload = '{"data":{"qty":' || (payload::json ->> 'qty')
            || ',"sku":"' || (payload::json ->> 'sku')
            || '"},"id":"' || id
            || '","key":"' || (payload::json ->> 'sku')
            || '","type":"order.placed"}';
    ALTER TABLE inbox ALTER COLUMN type SET NOT NULL;
    ALTER TABLE inbox RENAME TO inbox_events;
    ALTER TABLE inbox_events RENAME CONSTRAINT inbox_pkey TO inbox_events_pkey;
    ALTER TABLE inbox_events RENAME CONSTRAINT inbox_applied_seq_key
        TO inbox_events_applied_seq_key;
    ALTER TABLE inventory RENAME TO inbox_inventory;
    ALTER TABLE inbox_inventory RENAME CONSTRAINT inventory_pkey TO inbox_inventory_pkey;
    ALTER TABLE lease_fences RENAME TO inbox_lease_fences;
    ALTER TABLE inbox_lease_fences RENAME CONSTRAINT lease_fences_pkey
        TO inbox_lease_fences_pkey;
    """,
    # Raised by INSERT_ALL when a call of its group cannot go in as all new: its
    # transaction, with the handlers' statements queued behind it, is rolled back,
    # and the group goes in by INSERT_CALLS's prefix instead. A code of its own
    # (class IB), so that no statement of a handler's is taken for it.
    STOPPED_FUNCTION,
)
# The newest schema at once, for a database that has none of the inbox's tables:
# what MIGRATIONS reach (a test compares the two).
FRESH: Final = (
    """
    CREATE SEQUENCE inbox_applied_seq AS BIGINT;
    CREATE TABLE inbox_events (
        id               TEXT PRIMARY KEY,
        payload          TEXT NOT NULL,
        received_at      DOUBLE PRECISION NOT NULL,
        deliveries       INTEGER NOT NULL DEFAULT 1,
        last_delivery_at DOUBLE PRECISION NOT NULL,
        applied_seq      BIGINT NOT NULL UNIQUE DEFAULT nextval('inbox_applied_seq'),
        type             TEXT NOT NULL
    );
    ALTER SEQUENCE inbox_applied_seq OWNED BY inbox_events.applied_seq;
    CREATE TABLE inbox_inventory (
        sku TEXT PRIMARY KEY,
        qty BIGINT NOT NULL
    );
    CREATE TABLE inbox_health (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        at DOUBLE PRECISION NOT NULL
    );
    INSERT INTO inbox_health (id, at) VALUES (1, 0);
    CREATE TABLE inbox_tally (
        slot   INTEGER PRIMARY KEY,
        events BIGINT NOT NULL
    );
    CREATE FUNCTION inbox_raced() RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        RAISE EXCEPTION 'events of this transaction were committed meanwhile by another one'
            USING ERRCODE = 'serialization_failure';
    END $$;
    CREATE TABLE inbox_lease_fences (
        source TEXT NOT NULL,
        line   TEXT NOT NULL,
        epoch  BIGINT NOT NULL,
        PRIMARY KEY (source, line)
    );
"""
    + STOPPED_FUNCTION
)
# Every name a statement of the inbox gives a table, a sequence or a function of its
# own, of this release and earlier ones: what a schema qualifies (pg_tx.names).
SCHEMA: Final = Schema(
    side=SIDE,
    fresh=FRESH,
    migrations=MIGRATIONS,
    tables=frozenset(
        {"inbox", "inventory", "lease_fences", "inbox_events", "inbox_inventory"}
        | {"inbox_health", "inbox_tally", "inbox_lease_fences", "inbox_raced", "inbox_stopped"}
        | {"inbox_applied_seq"}
    ),
    probe_table="inbox_health",
    legacy_table="inbox",
    legacy_columns=frozenset({"id", "payload", "received_at", "deliveries"}),
)

FIND: Final = b"SELECT payload FROM inbox_events WHERE id = %s"
# A lease's epoch becomes the highest seen for its line unless a higher one was: no
# row returned is a stale lease. An upsert, not a read: under READ COMMITTED a read
# sees the snapshot of its statement's start, while ON CONFLICT waits for the row's
# lock and then judges its newest version, so two sinks applying one line's requests
# serialise on the row, and the lock (taken even when nothing is updated) is held to
# the commit.
RAISE_LEASE: Final = b"""
INSERT INTO inbox_lease_fences (source, line, epoch) VALUES (%s, %s, %s)
ON CONFLICT (source, line) DO UPDATE SET epoch = excluded.epoch
WHERE inbox_lease_fences.epoch <= excluded.epoch
RETURNING epoch
"""
# After RAISE_LEASE refused, in the same transaction: the row is locked by it, and
# this statement's snapshot is newer than the version that refused.
LEASE_SEEN: Final = b"SELECT epoch FROM inbox_lease_fences WHERE source = %s AND line = %s"
# The common case of a whole group (the calls of concurrent requests, IDs distinct
# across the group) in one statement: INSERT_ALL when every call must go in (one
# round trip, see below), else INSERT_CALLS, in two round trips: BEGIN, the settings
# and this; then the statements of the handlers of the events that went in, and
# COMMIT. A call goes in if none of its IDs is known and it
# passes the predecessor check: no `after`, that event in the inbox, or (`inside`) an event of an
# earlier call of the group; and its lease, if it has one, is not stale. Each line's
# highest epoch in the group is raised first (RAISE_LEASE's upsert, so the group
# waits for the line's row as RAISE_LEASE does); a call of a lower epoch than that
# stops the group there and is judged the long way, against the epoch raised: as if
# the request of the higher epoch, in progress at the same time, had come first (an
# epoch exists only once every lower one has lost the line). Only a prefix of the
# calls goes in: those before the first call that cannot (a predecessor inside the
# group is then always an event that went in before it). Returns how many calls went
# in; raises serialization_failure (the transaction runs again) when fewer rows went
# in than the prefix holds, because another transaction committed one of its IDs
# meanwhile.
_CALLS: Final = b"""
WITH batch AS (
    SELECT * FROM unnest(%(ids)s::text[], %(types)s::text[], %(payloads)s::text[],
                         %(calls)s::bigint[])
                  WITH ORDINALITY AS b(id, type, payload, c, n)
), predecessors AS (
    SELECT * FROM unnest(%(afters)s::text[], %(inside)s::boolean[])
                  WITH ORDINALITY AS f(after, inside, c)
), known AS (
    SELECT DISTINCT batch.c FROM batch JOIN inbox_events USING (id)
), leases AS (
    SELECT * FROM unnest(%(sources)s::text[], %(lines)s::text[], %(epochs)s::bigint[])
                  WITH ORDINALITY AS l(source, line, epoch, c)
    WHERE source IS NOT NULL
), raised AS (
    INSERT INTO inbox_lease_fences (source, line, epoch)
    SELECT source, line, max(epoch) FROM leases GROUP BY source, line ORDER BY source, line
    ON CONFLICT (source, line) DO UPDATE SET epoch = excluded.epoch
    WHERE inbox_lease_fences.epoch <= excluded.epoch
    RETURNING source, line, epoch
), stale AS (
    SELECT l.c FROM leases l WHERE NOT EXISTS (
        SELECT FROM raised r WHERE (r.source, r.line, r.epoch) = (l.source, l.line, l.epoch))
), stop AS (
    SELECT coalesce(min(f.c), cardinality(%(afters)s::text[]) + 1) AS c FROM predecessors f
    WHERE f.c IN (SELECT c FROM known)
       OR f.c IN (SELECT c FROM stale)
       OR NOT (f.inside OR f.after IS NULL OR EXISTS (SELECT FROM inbox_events WHERE id = f.after))
), taken AS (
    SELECT * FROM batch WHERE c < (SELECT c FROM stop)
), new AS (
    INSERT INTO inbox_events (id, type, payload, received_at, last_delivery_at)
    SELECT id, type, payload, %(now)s, %(now)s FROM taken
    ORDER BY n
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), tallied AS (
    INSERT INTO inbox_tally (slot, events)
    SELECT mod(pg_backend_pid(), %(slots)s), count(*) FROM new HAVING count(*) > 0
    ON CONFLICT (slot) DO UPDATE SET events = inbox_tally.events + excluded.events
)
"""
_RACED: Final = b"""
       CASE WHEN (SELECT count(*) FROM new) <> (SELECT count(*) FROM taken)
            THEN inbox_raced() END
"""
INSERT_CALLS: Final = _CALLS + b"SELECT (SELECT c FROM stop) - 1," + _RACED
# INSERT_CALLS for a group whose calls must all go in, so that its handlers'
# statements, computed before, are sent with it and the COMMIT in one round trip:
# raises inbox_stopped() (STOPPED_STATE) unless every call went in, which rolls the
# transaction back with the statements behind it.
INSERT_ALL: Final = (
    _CALLS
    + b"""SELECT CASE WHEN (SELECT c FROM stop) <= cardinality(%(afters)s::text[])
            THEN inbox_stopped() END,"""
    + _RACED
)
# One event: recorded if new, else nothing; returns a row only when it was new (its
# handler's statements are then sent). A known ID takes no number from
# inbox_applied_seq (a column default is evaluated for a row that ON CONFLICT then
# drops): a redelivery is common, in the inbox's own long way and in a caller's own
# transaction (sink.in_transaction) alike.
INSERT_ONE: Final = b"""
WITH new AS (
    INSERT INTO inbox_events (id, type, payload, received_at, last_delivery_at)
    SELECT %(id)s, %(type)s, %(payload)s, %(now)s, %(now)s
    WHERE NOT EXISTS (SELECT FROM inbox_events WHERE id = %(id)s)
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), tallied AS (
    INSERT INTO inbox_tally (slot, events) SELECT mod(pg_backend_pid(), %(slots)s), 1 FROM new
    ON CONFLICT (slot) DO UPDATE SET events = inbox_tally.events + excluded.events
)
SELECT id FROM new
"""
COUNT_DUPLICATE: Final = (
    b"UPDATE inbox_events SET deliveries = deliveries + 1, last_delivery_at = %s WHERE id = %s"
)
INVENTORY: Final = b"SELECT qty FROM inbox_inventory WHERE sku = %s"
RECORD: Final = (
    b"SELECT payload, received_at, deliveries, last_delivery_at, applied_seq"
    b" FROM inbox_events WHERE id = %s"
)
TALLY_SLOTS: Final = 64
COUNT_EVENTS: Final = b"SELECT coalesce(sum(events), 0) FROM inbox_tally"
# A registry's schema statements (sink.handlers) run so far: a row of the versions
# table under the side `handlers:NAME`, apart from the inbox's own; read under the
# migrations' advisory lock (pg_tx.MIGRATION_LOCK), so that sinks starting together
# run each statement once.
HANDLER_SCHEMA_VERSION: Final = f"SELECT version FROM {VERSIONS_TABLE} WHERE side = %s".encode()
SET_HANDLER_SCHEMA_VERSION: Final = (
    f"INSERT INTO {VERSIONS_TABLE} (side, version) VALUES (%s, %s)"
    " ON CONFLICT (side) DO UPDATE SET version = excluded.version"
).encode()

# A handler's statements run with the inbox's schema (when one is named) first on
# the search_path, for their transaction only.
HANDLERS_SEARCH_PATH: Final = (
    b"SELECT set_config('search_path', %s || ', ' || current_setting('search_path'), true)"
)
# The isolated pass of a group: deferred constraints checked at each statement.
CONSTRAINTS_NOW: Final = b"SET CONSTRAINTS ALL IMMEDIATE"
