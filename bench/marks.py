"""The `mark_costs` case: what marking an entry sent costs on SQLite, by the size of
its event.

Entries whose canonical events are about 100 B, 1 KiB, 8 KiB and 32 KiB, each size in
an outbox file of its own, are marked sent through `Outbox.mark_sent_many` in calls of
MARK_BATCH, as the relay marks what a sink acknowledged (one transaction per call,
committed as the relay's marks are). The WAL is emptied before the marks, so what
they add to it is theirs. Per size:

- `mark_us`: microseconds per entry marked, the median of the rounds;
- `wal_bytes`: bytes the marks added to the WAL, per entry, the median of the rounds.

A mark rewrites its entry's row. A SQLite outbox keeps an event of
PAYLOAD_APART_CHARS characters or more in a table written once
(publisher.backends.sqlite), so neither figure should grow with the event: the
target compares the largest size with the smallest. Rounds alternate the order of
the sizes (small first, then large first).
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any, Final

from bench.cases import Context, Figures
from bench.procs import BenchError
from publisher.backends.sqlite import PAYLOAD_APART_CHARS
from publisher.store import Mark, Outbox
from shared.event import canonical_json

EVENT_BYTES: Final = (100, 1024, 8192, 32768)  # the canonical event's size, about
MARK_BATCH: Final = 128  # entries per mark_sent_many call: a pipeline of 8 batches of 16
PUBLISH_BATCH: Final = 500  # events per publish_many call when the entries are made


def event_of(n: int, size: int) -> dict[str, Any]:
    """The nth event whose canonical form is `size` bytes (or its shape's least)."""
    event: dict[str, Any] = {
        "id": f"mark-{n:08d}",
        "type": "document.stored",
        "key": f"k-{n % 8}",
        "data": {"text": ""},
    }
    event["data"]["text"] = "x" * max(0, size - len(canonical_json(event)))  # type: ignore[arg-type]
    return event


def _empty_wal(path: Path) -> None:
    """Copy the WAL into the file and truncate it, through a connection of our own."""
    conn = sqlite3.connect(path, timeout=5)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()
    if busy:
        raise BenchError(f"{path}: the WAL could not be emptied before the marks")


def _wal_bytes(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


async def _marked(path: Path, size: int, count: int) -> tuple[float, float]:
    """Microseconds and WAL bytes per entry for marking `count` entries of `size`."""
    events = [event_of(n, size) for n in range(count)]
    async with Outbox.open(path) as outbox:
        for start in range(0, count, PUBLISH_BATCH):
            part = events[start : start + PUBLISH_BATCH]
            if await outbox.publish_many(part) != ["accepted"] * len(part):
                raise BenchError(f"{path}: the entries to mark were not all accepted")
        _empty_wal(path)
        marks = [Mark(e["id"], {"ack": e["id"], "status": "applied"}) for e in events]
        started = time.perf_counter()
        for start in range(0, count, MARK_BATCH):
            await outbox.mark_sent_many(marks[start : start + MARK_BATCH])
        elapsed = time.perf_counter() - started
        written = _wal_bytes(path)
        if await outbox.pending_batch(1):
            raise BenchError(f"{path}: entries left unmarked")
    return elapsed / count * 1e6, written / count


async def mark_costs(ctx: Context) -> Figures:
    count, rounds = ctx.sizes.mark_entries, ctx.sizes.mark_rounds
    times: dict[int, list[float]] = {size: [] for size in EVENT_BYTES}
    wal: dict[int, list[float]] = {size: [] for size in EVENT_BYTES}
    for number in range(rounds):
        for size in EVENT_BYTES if number % 2 == 0 else EVENT_BYTES[::-1]:
            path = ctx.workdir / f"marks-{size}-{number}.db"
            us, wal_per_entry = await _marked(path, size, count)
            times[size].append(us)
            wal[size].append(wal_per_entry)
            for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                leftover.unlink(missing_ok=True)
    return {
        "entries": count,
        "batch": MARK_BATCH,
        "rounds": rounds,
        "apart_chars": PAYLOAD_APART_CHARS,
        "event_bytes": list(EVENT_BYTES),
        "mark_us": {str(size): statistics.median(times[size]) for size in EVENT_BYTES},
        "wal_bytes": {str(size): statistics.median(wal[size]) for size in EVENT_BYTES},
    }
