"""PostgreSQL for asyncio, shared by both sides' PostgreSQL backends.

One `PgDatabase` per store: a psycopg 3 connection pool on a libpq URI, the side's
versioned migrations, durable commits, a writability probe, wake-ups by LISTEN/NOTIFY
and the one place where driver errors become `StorageError`. The SQL of each side
stays in its own backend module.

Options the project adds to the URI (removed before libpq sees it):
- `prepare=off`: no server-side prepared statements, for PgBouncer in transaction
  mode (a prepared statement lives on one server connection, which such a pooler
  does not keep for a client).
- `pool_max=N`: the most connections the pool opens (default 8).
- `schema=NAME`: the schema the side's tables are in, named in every statement
  (`names`), whatever the connection's search_path; created if missing.
- `deadline=SECONDS`: every call on the database (waiting for a connection of the
  pool or opening one, and its whole use) ends within this (default 6): past it,
  the connection is cut and never used again, and the call fails with
  StorageTimeout (a 503 saying so). Migrations are not bounded.

The modules, one concept each:
- `settings`: the URI checked and split into libpq's part and the options above;
- `pool`: the connection pool, its connections opened on demand, each use bounded
  by the deadline, read-only sessions dropped;
- `transactions`: durable transactions and their settings (DURABLE, UNFLUSHED,
  SNAPSHOT), and ones sent in a single round trip;
- `arrays`: array parameters written as one literal;
- `migrations`: each side's versioned schema;
- `names`: table names qualified by the schema;
- `errors`: driver errors translated into StorageError;
- `database`: PgDatabase, the handle a backend holds;
- `group`: group commit on a pooled connection;
- `driver_log`: the filter for psycopg's warnings that say nothing new.
"""

from . import driver_log  # noqa: F401  (its import installs the filter on psycopg's logger)
from .arrays import array_literal
from .database import PROBE_LOCK_WAIT_MS, PgDatabase
from .errors import describe, storage_error, translated_sync
from .group import GroupCommit
from .migrations import MIGRATION_LOCK
from .names import Qualify, check_schema, qualified, qualifier
from .pool import POOL_WAIT_S, Conn, DeadlinePassed, Pool, PoolTimeout, close_quietly
from .settings import CONNECT_TIMEOUT_S, DEFAULT_DEADLINE_S, DEFAULT_POOL_MAX, Settings, parse
from .transactions import (
    DURABLE,
    LOCK_WAIT_MS,
    SNAPSHOT,
    UNFLUSHED,
    durable,
    in_one_round_trip,
    sent_together,
)

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_DEADLINE_S",
    "DEFAULT_POOL_MAX",
    "DURABLE",
    "LOCK_WAIT_MS",
    "MIGRATION_LOCK",
    "POOL_WAIT_S",
    "PROBE_LOCK_WAIT_MS",
    "SNAPSHOT",
    "UNFLUSHED",
    "Conn",
    "DeadlinePassed",
    "GroupCommit",
    "PgDatabase",
    "Pool",
    "PoolTimeout",
    "Qualify",
    "Settings",
    "array_literal",
    "check_schema",
    "close_quietly",
    "describe",
    "durable",
    "in_one_round_trip",
    "parse",
    "qualified",
    "qualifier",
    "sent_together",
    "storage_error",
    "translated_sync",
]
