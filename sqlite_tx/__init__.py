"""SQLite for asyncio, one trip to the database thread per transaction.

aiosqlite hops to its worker thread for every awaited call, so a transaction written
as one await per statement pays for BEGIN, each statement and COMMIT separately.
Here a whole transaction is a plain function that runs on that thread in one go.
Both sides use this package; their SQL stays in their own storage modules.

The modules, one concept each:
- `database`: Database, one connection and its worker thread, and the writability
  probe;
- `transactions`: `transaction` and `unsynced`, for the functions run on it;
- `inline`: InlineWrites, when a write may commit on the event loop's thread;
- `group`: group commit on the database thread;
- `connect`: how a file is opened (flags, PRAGMAS, the busy timeout);
- `migrations`: the side's schema, created or brought up to date;
- `file`: SqliteFile, what every SQLite backend shares;
- `aiosqlite_internals`: every use of aiosqlite's private names.
"""

from plumbing.storage import StorageError

from .aiosqlite_internals import AiosqliteChanged
from .connect import BUSY_TIMEOUT_MS, PRAGMAS, THREAD_JOIN_TIMEOUT_S
from .database import PROBE_WRITE, Database
from .file import SqliteFile
from .group import GroupCommit, GroupFn
from .inline import INLINE_BACKOFF_S, INLINE_SLOW_S, InlineWrites
from .transactions import transaction, unsynced

__all__ = [
    "BUSY_TIMEOUT_MS",
    "INLINE_BACKOFF_S",
    "INLINE_SLOW_S",
    "PRAGMAS",
    "PROBE_WRITE",
    "THREAD_JOIN_TIMEOUT_S",
    "AiosqliteChanged",
    "Database",
    "GroupCommit",
    "GroupFn",
    "InlineWrites",
    "SqliteFile",
    "StorageError",
    "transaction",
    "unsynced",
]
