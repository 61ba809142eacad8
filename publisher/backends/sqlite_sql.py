"""Every SQL statement of the SQLite outbox, named."""

from __future__ import annotations

from typing import Final

from plumbing.schema import Schema


def _order_canonical(event_id: str, sku: str, qty: str) -> str:
    """SQL for the canonical order.placed event of an order, from SQL expressions of
    its fields (shared.event.order_canonical; an ID and a SKU need no JSON escaping)."""
    return (
        f"""'{{"data":{{"qty":' || {qty} || ',"sku":"' || {sku} || '"}},"id":"' || {event_id}"""
        f""" || '","key":"' || {sku} || '","type":"order.placed"}}'"""
    )


_PREVIOUS_SKU: Final = "json_extract(payload, '$.sku')"
_PREVIOUS_QTY: Final = "json_extract(payload, '$.qty')"

MIGRATIONS: Final = (
    """
    CREATE TABLE orders (
        id          TEXT PRIMARY KEY,
        sku         TEXT NOT NULL,
        qty         INTEGER NOT NULL,
        accepted_at REAL NOT NULL
    );
    CREATE TABLE outbox (
        seq              INTEGER PRIMARY KEY AUTOINCREMENT,
        id               TEXT NOT NULL UNIQUE REFERENCES orders (id),
        payload          TEXT NOT NULL,
        queued_at        REAL NOT NULL,
        sent             INTEGER NOT NULL DEFAULT 0 CHECK (sent IN (0, 1)),
        sent_at          REAL,
        ack              TEXT,
        attempts         INTEGER NOT NULL DEFAULT 0,
        last_error       TEXT,
        last_attempt_at  REAL,
        first_failure_at REAL,
        quarantined      INTEGER NOT NULL DEFAULT 0 CHECK (quarantined IN (0, 1)),
        CHECK (NOT (sent = 1 AND quarantined = 1))
    );
    -- Partial indexes keep the hot reads (pending batch, gauges, prune) proportional
    -- to what they return, however many sent rows pile up.
    CREATE INDEX outbox_pending ON outbox (seq) WHERE sent = 0 AND quarantined = 0;
    CREATE INDEX outbox_quarantined ON outbox (seq) WHERE quarantined = 1;
    CREATE INDEX outbox_sent_at ON outbox (sent_at) WHERE sent = 1;
    CREATE TABLE quarantines (
        n                    INTEGER PRIMARY KEY AUTOINCREMENT,
        id                   TEXT NOT NULL REFERENCES orders (id),
        seq                  INTEGER NOT NULL,
        reason               TEXT NOT NULL,
        quarantined_by       TEXT NOT NULL,
        quarantined_at       REAL NOT NULL,
        released_by          TEXT,
        released_at          REAL,
        released_as          TEXT CHECK (released_as IN ('redriven', 'delivered')),
        delivered_past_count INTEGER,
        delivered_past       TEXT
    );
    CREATE INDEX quarantines_id ON quarantines (id);
    """,
    # 2: ordering lanes. Each entry belongs to the lane of its SKU; in per-SKU mode
    # order is promised within a lane only.
    """
    ALTER TABLE outbox ADD COLUMN lane TEXT;
    UPDATE outbox SET lane = json_extract(payload, '$.sku');
    CREATE INDEX outbox_lane_pending ON outbox (lane, seq) WHERE sent = 0 AND quarantined = 0;
    """,
    # 3: the writability probe (check_writable) updates this one row in place.
    """
    CREATE TABLE health (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        at REAL NOT NULL
    );
    INSERT INTO health (id, at) VALUES (1, 0);
    """,
    # 4: several relay workers. Each line (the global line "*", or a lane's SKU) is
    # delivered only by the worker holding its lease; every take raises its epoch
    # (the fencing token). The source ID names this outbox in the Outbox-Lease header.
    """
    CREATE TABLE line_leases (
        line       TEXT PRIMARY KEY,
        owner      TEXT,
        epoch      INTEGER NOT NULL CHECK (epoch >= 1),
        expires_at REAL NOT NULL,
        taken_at   REAL,
        renewed_at REAL
    );
    CREATE TABLE relay_workers (
        worker     TEXT PRIMARY KEY,
        seen_at    REAL NOT NULL,
        started_at REAL NOT NULL
    );
    CREATE TABLE outbox_source (
        id     INTEGER PRIMARY KEY CHECK (id = 1),
        source TEXT NOT NULL
    );
    INSERT INTO outbox_source (id, source) VALUES (1, lower(hex(randomblob(8))));
    """,
    # 5: events of any type. An entry's payload becomes the canonical event (RFC 8785
    # of {id, type, key, data}) and its type a column; the previous release's entries,
    # orders, become order.placed events keyed by their SKU (written here as the
    # canonical text shared.event.order_canonical writes). Entries no longer need an
    # order (the tables are rebuilt without that reference, seqs kept), and what
    # judges a known ID once its entry is pruned is the digest kept in outbox_pruned.
    # Every table (and index) of the outbox is named outbox_* from here on, so that
    # they can live in a user's database beside the user's own `orders`: the rebuilt
    # tables are made under their new names, the others renamed (SQLite renames
    # their automatic indexes, and sqlite_sequence rows, with them).
    f"""
    CREATE TABLE outbox_entries (
        seq              INTEGER PRIMARY KEY AUTOINCREMENT,
        id               TEXT NOT NULL UNIQUE,
        type             TEXT NOT NULL,
        payload          TEXT NOT NULL,
        queued_at        REAL NOT NULL,
        sent             INTEGER NOT NULL DEFAULT 0 CHECK (sent IN (0, 1)),
        sent_at          REAL,
        ack              TEXT,
        attempts         INTEGER NOT NULL DEFAULT 0,
        last_error       TEXT,
        last_attempt_at  REAL,
        first_failure_at REAL,
        quarantined      INTEGER NOT NULL DEFAULT 0 CHECK (quarantined IN (0, 1)),
        lane             TEXT,
        CHECK (NOT (sent = 1 AND quarantined = 1))
    );
    INSERT INTO outbox_entries (seq, id, type, payload, queued_at, sent, sent_at, ack,
        attempts, last_error, last_attempt_at, first_failure_at, quarantined, lane)
    SELECT seq, id, 'order.placed', {_order_canonical("id", _PREVIOUS_SKU, _PREVIOUS_QTY)},
        queued_at, sent, sent_at, ack, attempts, last_error, last_attempt_at,
        first_failure_at, quarantined, {_PREVIOUS_SKU}
    FROM outbox ORDER BY seq;
    DELETE FROM sqlite_sequence WHERE name = 'outbox_entries';
    INSERT INTO sqlite_sequence (name, seq)
    SELECT 'outbox_entries', seq FROM sqlite_sequence WHERE name = 'outbox';
    DROP TABLE outbox;
    CREATE INDEX outbox_pending ON outbox_entries (seq) WHERE sent = 0 AND quarantined = 0;
    CREATE INDEX outbox_quarantined ON outbox_entries (seq) WHERE quarantined = 1;
    CREATE INDEX outbox_sent_at ON outbox_entries (sent_at) WHERE sent = 1;
    CREATE INDEX outbox_lane_pending ON outbox_entries (lane, seq)
        WHERE sent = 0 AND quarantined = 0;
    CREATE TABLE outbox_quarantines (
        n                    INTEGER PRIMARY KEY AUTOINCREMENT,
        id                   TEXT NOT NULL,
        seq                  INTEGER NOT NULL,
        reason               TEXT NOT NULL,
        quarantined_by       TEXT NOT NULL,
        quarantined_at       REAL NOT NULL,
        released_by          TEXT,
        released_at          REAL,
        released_as          TEXT CHECK (released_as IN ('redriven', 'delivered')),
        delivered_past_count INTEGER,
        delivered_past       TEXT
    );
    INSERT INTO outbox_quarantines SELECT * FROM quarantines ORDER BY n;
    DELETE FROM sqlite_sequence WHERE name = 'outbox_quarantines';
    INSERT INTO sqlite_sequence (name, seq)
    SELECT 'outbox_quarantines', seq FROM sqlite_sequence WHERE name = 'quarantines';
    DROP TABLE quarantines;
    CREATE INDEX outbox_quarantines_id ON outbox_quarantines (id);
    CREATE TABLE outbox_pruned (
        id     TEXT PRIMARY KEY,
        digest TEXT NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO outbox_pruned (id, digest)
    SELECT o.id, sha256_hex({_order_canonical("o.id", "o.sku", "o.qty")})
    FROM orders AS o WHERE NOT EXISTS (SELECT 1 FROM outbox_entries AS e WHERE e.id = o.id);
    ALTER TABLE orders RENAME TO outbox_orders;
    ALTER TABLE health RENAME TO outbox_health;
    ALTER TABLE line_leases RENAME TO outbox_line_leases;
    ALTER TABLE relay_workers RENAME TO outbox_relay_workers;
    """,
    # 6: large events kept apart. An entry whose canonical event is PAYLOAD_APART_CHARS
    # or longer keeps it in outbox_payloads (written once) and '' in its own payload
    # column: a mark rewrites the entry's row, and with the event in it each mark
    # wrote the event into the WAL once more. Entries written before stay as they are.
    # No ON DELETE CASCADE: prune deletes the payloads first (PRUNE_PAYLOADS), and a
    # later migration that rebuilds outbox_entries (as 5 did) fails on the reference
    # instead of deleting the events.
    """
    CREATE TABLE outbox_payloads (
        seq     INTEGER PRIMARY KEY REFERENCES outbox_entries (seq),
        payload TEXT NOT NULL
    );
    """,
)

# The newest schema at once, for a file that holds none of the outbox's tables: what
# MIGRATIONS reach, written out (a test compares the two). Every table and index is
# named outbox_*: a user's own tables (`orders`, say) may share the file.
FRESH: Final = """
    CREATE TABLE outbox_orders (
        id          TEXT PRIMARY KEY,
        sku         TEXT NOT NULL,
        qty         INTEGER NOT NULL,
        accepted_at REAL NOT NULL
    );
    CREATE TABLE outbox_entries (
        seq              INTEGER PRIMARY KEY AUTOINCREMENT,
        id               TEXT NOT NULL UNIQUE,
        type             TEXT NOT NULL,
        payload          TEXT NOT NULL,
        queued_at        REAL NOT NULL,
        sent             INTEGER NOT NULL DEFAULT 0 CHECK (sent IN (0, 1)),
        sent_at          REAL,
        ack              TEXT,
        attempts         INTEGER NOT NULL DEFAULT 0,
        last_error       TEXT,
        last_attempt_at  REAL,
        first_failure_at REAL,
        quarantined      INTEGER NOT NULL DEFAULT 0 CHECK (quarantined IN (0, 1)),
        lane             TEXT,
        CHECK (NOT (sent = 1 AND quarantined = 1))
    );
    CREATE INDEX outbox_pending ON outbox_entries (seq) WHERE sent = 0 AND quarantined = 0;
    CREATE INDEX outbox_quarantined ON outbox_entries (seq) WHERE quarantined = 1;
    CREATE INDEX outbox_sent_at ON outbox_entries (sent_at) WHERE sent = 1;
    CREATE INDEX outbox_lane_pending ON outbox_entries (lane, seq)
        WHERE sent = 0 AND quarantined = 0;
    CREATE TABLE outbox_quarantines (
        n                    INTEGER PRIMARY KEY AUTOINCREMENT,
        id                   TEXT NOT NULL,
        seq                  INTEGER NOT NULL,
        reason               TEXT NOT NULL,
        quarantined_by       TEXT NOT NULL,
        quarantined_at       REAL NOT NULL,
        released_by          TEXT,
        released_at          REAL,
        released_as          TEXT CHECK (released_as IN ('redriven', 'delivered')),
        delivered_past_count INTEGER,
        delivered_past       TEXT
    );
    CREATE INDEX outbox_quarantines_id ON outbox_quarantines (id);
    CREATE TABLE outbox_payloads (
        seq     INTEGER PRIMARY KEY REFERENCES outbox_entries (seq),
        payload TEXT NOT NULL
    );
    CREATE TABLE outbox_health (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        at REAL NOT NULL
    );
    INSERT INTO outbox_health (id, at) VALUES (1, 0);
    CREATE TABLE outbox_line_leases (
        line       TEXT PRIMARY KEY,
        owner      TEXT,
        epoch      INTEGER NOT NULL CHECK (epoch >= 1),
        expires_at REAL NOT NULL,
        taken_at   REAL,
        renewed_at REAL
    );
    CREATE TABLE outbox_relay_workers (
        worker     TEXT PRIMARY KEY,
        seen_at    REAL NOT NULL,
        started_at REAL NOT NULL
    );
    CREATE TABLE outbox_source (
        id     INTEGER PRIMARY KEY CHECK (id = 1),
        source TEXT NOT NULL
    );
    INSERT INTO outbox_source (id, source) VALUES (1, lower(hex(randomblob(8))));
    CREATE TABLE outbox_pruned (
        id     TEXT PRIMARY KEY,
        digest TEXT NOT NULL
    ) WITHOUT ROWID;
"""

SCHEMA: Final = Schema(
    side="publisher",
    fresh=FRESH,
    migrations=MIGRATIONS,
    # Of this release, and of the earlier ones MIGRATIONS name.
    tables=frozenset(
        {"outbox_orders", "outbox_entries", "outbox_quarantines", "outbox_health"}
        | {"outbox_line_leases", "outbox_relay_workers", "outbox_source", "outbox_pruned"}
        | {"outbox_payloads"}
        | {"orders", "outbox", "quarantines", "health", "line_leases", "relay_workers"}
    ),
    probe_table="outbox_health",
    legacy_table="outbox",
    legacy_columns=frozenset({"seq", "payload", "sent", "quarantined"}),
)

IS_PENDING: Final = "sent = 0 AND quarantined = 0"
# An entry's canonical event, wherever it is kept: in its row, or (for a large event,
# whose row holds '') in outbox_payloads. SQLite's coalesce reads the second only
# when the first is NULL.
PAYLOAD: Final = (
    "coalesce(nullif(payload, ''),"
    " (SELECT p.payload FROM outbox_payloads AS p WHERE p.seq = outbox_entries.seq))"
)

FIND_ORDER: Final = "SELECT sku, qty, accepted_at FROM outbox_orders WHERE id = ?"
# What an event whose ID is known is judged against (rows.judged_again): the
# canonical event its entry stores, or the digest kept once the entry was pruned.
# One row, both NULL for a new ID (two lookups by key).
KNOWN: Final = f"""
    SELECT (SELECT {PAYLOAD} FROM outbox_entries WHERE id = :id),
        (SELECT digest FROM outbox_pruned WHERE id = :id)
"""
INSERT_ORDER: Final = "INSERT INTO outbox_orders (id, sku, qty, accepted_at) VALUES (?, ?, ?, ?)"
INSERT_ENTRY: Final = (
    "INSERT INTO outbox_entries (id, type, payload, queued_at, lane) VALUES (?, ?, ?, ?, ?)"
)
# A large event's canonical form, after its entry (inserted with payload '').
INSERT_PAYLOAD_APART: Final = (
    "INSERT INTO outbox_payloads (seq, payload) SELECT seq, ? FROM outbox_entries WHERE id = ?"
)
# Whether any of a group's IDs (a JSON array) is known, as an entry or as a pruned
# one's digest: one statement for the group, so the common case of all new costs one
# read before its rows go in (executemany of INSERT_ORDER and INSERT_ENTRY).
ANY_KNOWN: Final = """
    SELECT EXISTS (SELECT 1 FROM outbox_entries WHERE id IN (SELECT value FROM json_each(:ids)))
        OR EXISTS (SELECT 1 FROM outbox_pruned WHERE id IN (SELECT value FROM json_each(:ids)))
"""

PENDING: Final = (
    f"SELECT seq, {PAYLOAD}, attempts, lane, queued_at FROM outbox_entries WHERE {IS_PENDING}"
    " ORDER BY seq LIMIT ?"
)
# Leaving out entries whose mark is still being committed (the relay overlaps the
# mark of one batch with the send of the next).
PENDING_SKIPPING: Final = f"""
    SELECT seq, {PAYLOAD}, attempts, lane, queued_at FROM outbox_entries
    WHERE {IS_PENDING} AND id NOT IN (SELECT value FROM json_each(:skip))
    ORDER BY seq LIMIT :limit
"""
# The same for one lane, on the lane's own index: it reads that lane's entries only,
# however many entries of other lanes are pending before them.
PENDING_IN_LANE_SKIPPING: Final = f"""
    SELECT seq, {PAYLOAD}, attempts, lane, queued_at FROM outbox_entries
    WHERE {IS_PENDING} AND lane = :lane AND id NOT IN (SELECT value FROM json_each(:skip))
    ORDER BY seq LIMIT :limit
"""
PENDING_IN_LANE: Final = f"""
    SELECT seq, {PAYLOAD}, attempts, lane, queued_at FROM outbox_entries
    WHERE {IS_PENDING} AND lane = ?
    ORDER BY seq LIMIT ?
"""
HEAD_ID: Final = f"SELECT id FROM outbox_entries WHERE {IS_PENDING} ORDER BY seq LIMIT 1"
HEAD_ID_IN_LANE: Final = (
    f"SELECT id FROM outbox_entries WHERE {IS_PENDING} AND lane = ? ORDER BY seq LIMIT 1"
)
# The lane of each pending entry, in seq order (read until enough lanes are named).
PENDING_LANE_OF_EACH: Final = f"SELECT lane FROM outbox_entries WHERE {IS_PENDING} ORDER BY seq"
# Lanes with pending entries, the one whose head is oldest first. The lanes are
# found by hopping along the lane index (the next lane name after this one), and each
# head by one lookup in it: the cost follows the number of lanes, not of entries (a
# GROUP BY would read every pending entry).
PENDING_LANES: Final = f"""
    WITH RECURSIVE lanes (lane) AS (
        SELECT min(lane) FROM outbox_entries WHERE {IS_PENDING}
        UNION ALL
        SELECT (SELECT min(lane) FROM outbox_entries WHERE {IS_PENDING} AND lane > lanes.lane)
        FROM lanes WHERE lanes.lane IS NOT NULL
    )
    SELECT lane FROM lanes
    WHERE lane IS NOT NULL AND lane NOT IN (SELECT value FROM json_each(:skip))
    ORDER BY (SELECT min(seq) FROM outbox_entries WHERE {IS_PENDING} AND lane = lanes.lane)
    LIMIT :limit
"""

MARK_SENT: Final = """
    UPDATE outbox_entries SET sent = 1, quarantined = 0, sent_at = :now, ack = :ack,
        attempts = attempts + 1, last_attempt_at = :now
    WHERE id = :id AND sent = 0
"""
# The common case, without reading the row first: a pending, unquarantined entry.
MARK_PENDING_SENT: Final = """
    UPDATE outbox_entries SET sent = 1, sent_at = :now, ack = :ack,
        attempts = attempts + 1, last_attempt_at = :now
    WHERE id = :id AND sent = 0 AND quarantined = 0
"""
RECORD_FAILURE: Final = """
    UPDATE outbox_entries SET attempts = attempts + 1, last_error = :error, last_attempt_at = :now,
        first_failure_at = coalesce(first_failure_at, :now)
    WHERE id = :id AND sent = 0
"""

# The entry's lane from its own column: an entry's line is what the outbox stored,
# never read again from its payload.
ENTRY_COLUMNS: Final = (
    f"seq, lane, {PAYLOAD}, queued_at, sent, sent_at, ack, attempts, last_error,"
    " last_attempt_at, first_failure_at, quarantined"
)
ENTRY_BY_ID: Final = f"SELECT {ENTRY_COLUMNS} FROM outbox_entries WHERE id = ?"
PRUNED_ID: Final = "SELECT 1 FROM outbox_pruned WHERE id = ?"
# One page of a listing: past the seq of the previous page's last entry, of one key
# (its lane) and of one type if asked for (NULL: every key, every type).
_PAGE: Final = "(:key IS NULL OR lane = :key) AND (:type IS NULL OR type = :type)"
ENTRIES_PENDING: Final = (
    f"SELECT {ENTRY_COLUMNS} FROM outbox_entries WHERE {IS_PENDING} AND seq > :after AND {_PAGE}"
    " ORDER BY seq LIMIT :limit"
)
ENTRIES_QUARANTINED: Final = (
    f"SELECT {ENTRY_COLUMNS} FROM outbox_entries WHERE quarantined = 1 AND seq > :after AND {_PAGE}"
    " ORDER BY seq LIMIT :limit"
)
ENTRIES_SENT: Final = (
    f"SELECT {ENTRY_COLUMNS} FROM outbox_entries WHERE sent = 1 AND seq < :after AND {_PAGE}"
    " ORDER BY seq DESC LIMIT :limit"
)
# Marks per interval from :start, on the sent_at index: the cost follows the marks
# in the window, not the sent rows kept.
SENT_PER_INTERVAL: Final = """
    SELECT CAST((sent_at - :start) / :interval AS INTEGER), count(*) FROM outbox_entries
    WHERE sent = 1 AND sent_at >= :start AND sent_at < :end GROUP BY 1
"""

QUARANTINE: Final = (
    "UPDATE outbox_entries SET quarantined = 1 WHERE id = ? AND sent = 0 AND quarantined = 0"
)
INSERT_QUARANTINE: Final = """
    INSERT INTO outbox_quarantines (id, seq, reason, quarantined_by, quarantined_at)
    VALUES (:id, :seq, :reason, :by, :now)
"""
OPEN_QUARANTINE: Final = """
    SELECT n, quarantined_at FROM outbox_quarantines
    WHERE id = ? AND released_at IS NULL ORDER BY n DESC LIMIT 1
"""
DELIVERED_PAST: Final = """
    SELECT id FROM outbox_entries WHERE seq > :seq AND sent = 1 AND sent_at >= :since ORDER BY seq
"""
# A redriven entry starts a fresh failure streak: its blocked-since time restarts.
REDRIVE: Final = """
    UPDATE outbox_entries SET quarantined = 0, first_failure_at = NULL
    WHERE id = ? AND quarantined = 1
"""
CLOSE_QUARANTINE: Final = """
    UPDATE outbox_quarantines SET released_by = :by, released_at = :now, released_as = :how,
        delivered_past_count = :count, delivered_past = :ids
    WHERE n = :n
"""
QUARANTINES_OF: Final = """
    SELECT reason, quarantined_by, quarantined_at, released_by, released_at, released_as,
        delivered_past_count, delivered_past
    FROM outbox_quarantines WHERE id = ? ORDER BY n
"""

COUNT_PENDING: Final = f"SELECT count(*) FROM outbox_entries WHERE {IS_PENDING}"
COUNT_QUARANTINED: Final = "SELECT count(*) FROM outbox_entries WHERE quarantined = 1"
HEAD: Final = f"""
    SELECT seq, id, queued_at, attempts, last_error, first_failure_at
    FROM outbox_entries WHERE {IS_PENDING} ORDER BY seq LIMIT 1
"""
# The head of every lane that has failed and is not yet delivered.
BLOCKED_LANE_HEADS: Final = f"""
    SELECT o.seq, o.id, o.queued_at, o.attempts, o.last_error, o.first_failure_at, o.lane
    FROM (SELECT min(seq) AS head FROM outbox_entries WHERE {IS_PENDING} GROUP BY lane) AS h
    JOIN outbox_entries AS o ON o.seq = h.head
    WHERE o.first_failure_at IS NOT NULL
    ORDER BY o.seq
"""

# ---------------------------------------------------------------- leases
# Times are the host's clock (:now, time.time()): one SQLite file has one host.

SOURCE: Final = "SELECT source FROM outbox_source WHERE id = 1"

# Started now on the :first note since it started (a restart under the same ID).
WORKER_SEEN: Final = """
    INSERT INTO outbox_relay_workers (worker, seen_at, started_at) VALUES (:worker, :now, :now)
    ON CONFLICT (worker) DO UPDATE SET seen_at = excluded.seen_at,
        started_at = CASE WHEN :first THEN excluded.started_at
            ELSE outbox_relay_workers.started_at END
"""
FORGET_WORKERS: Final = (
    "DELETE FROM outbox_relay_workers WHERE seen_at < :forgotten AND worker <> :worker"
)
LIVE_WORKERS: Final = "SELECT count(*) FROM outbox_relay_workers WHERE seen_at >= :now - :ttl"
WORKER_GONE: Final = "DELETE FROM outbox_relay_workers WHERE worker = ?"
WORKERS: Final = """
    SELECT worker, started_at, seen_at, :now - seen_at, seen_at >= :now - :ttl
    FROM outbox_relay_workers WHERE seen_at >= :now - :kept ORDER BY worker
"""

# A take succeeds on a line never leased, released (no owner), expired, or held by
# the same worker; it always raises the epoch, to one more than the larger of the
# last and :past (0 for a plain take: epoch 1 for a line never leased; a sink's seen
# epoch for a take past it). No row returned: refused.
TAKE_LEASE: Final = """
    INSERT INTO outbox_line_leases (line, owner, epoch, expires_at, taken_at, renewed_at)
    VALUES (:line, :worker, :past + 1, :now + :ttl, :now, :now)
    ON CONFLICT (line) DO UPDATE SET owner = excluded.owner,
        epoch = max(outbox_line_leases.epoch, :past) + 1,
        expires_at = excluded.expires_at, taken_at = excluded.taken_at,
        renewed_at = excluded.renewed_at
    WHERE outbox_line_leases.owner IS NULL OR outbox_line_leases.owner = excluded.owner
        OR outbox_line_leases.expires_at < excluded.taken_at
    RETURNING epoch
"""
RENEW_LEASE: Final = """
    UPDATE outbox_line_leases SET expires_at = :now + :ttl, renewed_at = :now
    WHERE line = :line AND owner = :worker AND epoch = :epoch
"""
RELEASE_LEASE: Final = """
    UPDATE outbox_line_leases SET owner = NULL, expires_at = 0
    WHERE line = :line AND owner = :worker AND epoch = :epoch
"""
LEASE_COLUMNS: Final = "line, owner, epoch, expires_at, expires_at - :now, taken_at, renewed_at"
LEASES: Final = f"SELECT {LEASE_COLUMNS} FROM outbox_line_leases ORDER BY line"
LEASE_OF: Final = f"SELECT {LEASE_COLUMNS} FROM outbox_line_leases WHERE line = :line"
# The lines another owner holds unexpired: their lanes are not this worker's to start.
HELD_BY_OTHERS: Final = """
    SELECT line FROM outbox_line_leases
    WHERE owner IS NOT NULL AND owner <> :worker AND expires_at >= :now
"""
# A fenced write reads its line's epoch in its own transaction (BEGIN IMMEDIATE
# holds the write lock, so no take can come in between the check and the write).
LEASE_EPOCH: Final = "SELECT epoch FROM outbox_line_leases WHERE line = ?"

# Pruning keeps each entry's digest (outbox_pruned): a known ID is judged by it.
_PRUNED_BATCH: Final = """
    SELECT seq FROM outbox_entries WHERE sent = 1 AND sent_at < :cutoff ORDER BY sent_at, seq
    LIMIT :batch
"""
KEEP_PRUNED_DIGESTS: Final = f"""
    INSERT OR REPLACE INTO outbox_pruned (id, digest)
    SELECT id, sha256_hex({PAYLOAD}) FROM outbox_entries WHERE seq IN ({_PRUNED_BATCH})
"""
# The payloads kept apart of the entries PRUNE_SENT deletes next, in the same
# transaction (the same batch: nothing else writes in between).
PRUNE_PAYLOADS: Final = f"DELETE FROM outbox_payloads WHERE seq IN ({_PRUNED_BATCH})"
PRUNE_SENT: Final = f"DELETE FROM outbox_entries WHERE seq IN ({_PRUNED_BATCH})"
