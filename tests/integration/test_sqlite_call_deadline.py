"""A SQLite write is answered within its deadline, counted from when it was asked.

Calls run one at a time on the database thread, each waiting for the write lock up to
the busy timeout (5 s). With the lock held by another connection, a call queued behind
one that waits used to wait for both: intake and /readyz answered after 10 to 15 s.
Each now fails by CALL_DEADLINE_S (6 s) with StorageTimeout, a 503 whose reason says
so, while the abandoned call still runs; once the lock is let go, sending the same
events again finds each recorded once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sqlite_faults import unwritable

from plumbing.storage import StorageError, StorageTimeout
from publisher import Outbox
from shared import Event, order_event, validate_order
from sink import Inbox
from sqlite_tx.database import CALL_DEADLINE_S

SLACK_S = 1.5
WRITES = 4


def order(n: int) -> dict[str, object]:
    return {"id": f"o-{n}", "sku": "snack", "qty": 1}


def placed(n: int) -> Event:
    return order_event(validate_order(order(n)))


async def writes_behind_a_held_lock(
    path: Path, write: Callable[[int], Awaitable[object]], probe: Callable[[], Awaitable[None]]
) -> list[object]:
    """WRITES writes and the probe while another connection holds the write lock: the
    first one waits for the lock, the probe and the others queue behind it on the
    database thread. Their outcomes, once each was answered within the deadline."""
    with unwritable(path, "locked"):
        started = time.monotonic()
        first = asyncio.ensure_future(write(0))
        await asyncio.sleep(0.2)
        rest = [write(n) for n in range(1, WRITES)]
        outcomes = await asyncio.gather(first, *rest, probe(), return_exceptions=True)
        elapsed = time.monotonic() - started
    assert all(isinstance(outcome, StorageError) for outcome in outcomes), outcomes
    assert any(isinstance(outcome, StorageTimeout) for outcome in outcomes), outcomes
    assert elapsed < CALL_DEADLINE_S + SLACK_S, elapsed
    return outcomes


async def test_outbox_writes_and_its_probe_queued_behind_a_held_lock_fail_within_the_deadline(
    tmp_path: Path,
) -> None:
    path = tmp_path / "source.db"
    async with Outbox.open(path) as outbox:
        await writes_behind_a_held_lock(
            path, lambda n: outbox.accept(order(n)), outbox.check_writable
        )
        # The lock let go: sent again, each is recorded once (some may have been by
        # their abandoned calls already).
        again = [await outbox.accept(order(n)) for n in range(WRITES)]
        assert set(again) <= {"accepted", "duplicate"}, again
        # Each once; in the order they were committed, which the abandoned calls set.
        assert sorted(event["id"] for event in await outbox.pending()) == [
            f"o-{n}" for n in range(WRITES)
        ]


async def test_inbox_writes_queued_behind_a_held_lock_fail_within_the_deadline(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sink.db"
    async with Inbox.open(path) as inbox:
        await writes_behind_a_held_lock(
            path, lambda n: inbox.receive(placed(n)), inbox.check_writable
        )
        for n in range(WRITES):
            await inbox.receive(placed(n))
        assert await inbox.count() == WRITES
        assert await inbox.inventory("snack") == WRITES
