"""A database that was read-only for a while: once it is writable again, both sides
write again at once, on their own.

A session opened while the database's default was read-only stays read-only for its
life, whatever the default becomes (as one opened on a standby before a fail-over).
The pool must drop such a session rather than lend it again: here the default is
reset and the sessions opened meanwhile are left open (no one ends them), and the
very next writes must succeed.
"""

from __future__ import annotations

import asyncio

import pytest
from pg_faults import PgAccess
from support import placed

from plumbing.storage import StorageError
from publisher import Outbox
from shared import Receipt
from sink.store import Inbox

SESSIONS = 6  # read-only sessions the pool is made to open (pool_max is 8)
WRITES_AFTER = 10


@pytest.mark.parametrize("side", ["outbox", "inbox"])
async def test_sessions_that_were_read_only_are_not_used_again(side: str, pg_database: str) -> None:
    access = PgAccess(pg_database, f"{side}_health")
    store = await (Outbox.open(pg_database) if side == "outbox" else Inbox.open(pg_database))
    try:
        with access.read_only(end_after=False):
            # Calls at once: the pool opens a session for each, read-only for life.
            failed = await asyncio.gather(
                *(store.check_writable() for _ in range(SESSIONS)), return_exceptions=True
            )
            assert all(
                isinstance(exc, StorageError) and "read-only" in str(exc) for exc in failed
            ), failed
            with pytest.raises(StorageError, match="read-only") as during:
                await write(store, "during")
            assert during.value.reason == "the database is read-only"  # what a 503 says
        # The default is reset; the sessions opened meanwhile were not ended by anyone.
        for n in range(WRITES_AFTER):
            await write(store, f"after-{n}")
        await asyncio.gather(*(store.check_writable() for _ in range(SESSIONS)))
    finally:
        await store.close()
    table = "outbox_entries" if side == "outbox" else "inbox_events"
    rows = access.query(f"SELECT id FROM {table} ORDER BY id")
    assert rows == sorted((f"after-{n}",) for n in range(WRITES_AFTER))


async def write(store: Outbox | Inbox, event_id: str) -> None:
    """One real write of the side: an order accepted, or an event applied."""
    if isinstance(store, Outbox):
        assert await store.accept({"id": event_id, "sku": "snack", "qty": 1}) == "accepted"
    else:
        assert await store.receive(placed(event_id)) is Receipt.APPLIED
