"""Group commit's gather passes, and when a SQLite write may commit inline.

The passes run on a real event loop: asyncio runs the callbacks that are ready in
the order they were scheduled, one pass at a time, so a call that submits after k
passes of its own lands in a known group. InlineWrites is judged with a clock the
test moves by hand (the writes "take" what the test says), and a real SQLite
connection for it to write to.
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from support import ManualClock

from plumbing.group_commit import GroupCommit
from sqlite_tx import InlineWrites

# Binary fractions, so that the clock's sums are exact and "at the limit" is the limit.
SLOW_S = 0.0078125
BACKOFF_S = 1.0
MS = 0.0009765625  # a step below any limit here


async def groups_with_a_late_call(passes: int, late_by: int) -> list[list[str]]:
    """The groups committed when "a" is submitted and, in the same pass, a task
    starts that submits "b" after `late_by` passes of the loop."""
    groups: list[list[str]] = []

    async def commit(calls: list[str]) -> list[str | Exception]:
        groups.append(list(calls))
        return list(calls)

    group = GroupCommit(commit, gather_passes=passes)

    async def late() -> str:
        for _ in range(late_by):
            await asyncio.sleep(0)
        return await group.submit("b")

    first = asyncio.create_task(group.submit("a"))
    second = asyncio.create_task(late())
    async with asyncio.timeout(5):
        assert await asyncio.gather(first, second) == ["a", "b"]
    return groups


@pytest.mark.parametrize("passes", [1, 4])
async def test_a_call_that_comes_within_the_gather_passes_joins_the_group(passes: int) -> None:
    assert await groups_with_a_late_call(passes, late_by=passes) == [["a", "b"]]


@pytest.mark.parametrize("passes", [0, 1, 4])
async def test_a_call_that_comes_after_the_gather_passes_waits_for_the_next_group(
    passes: int,
) -> None:
    assert await groups_with_a_late_call(passes, late_by=passes + 1) == [["a"], ["b"]]


def test_gather_passes_cannot_be_negative() -> None:
    async def commit(calls: list[str]) -> list[str | Exception]:
        return list(calls)

    with pytest.raises(ValueError, match="gather_passes must be 0 or more"):
        GroupCommit(commit, gather_passes=-1)


@pytest.fixture
def conn() -> sqlite3.Connection:
    connection = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    connection.execute("CREATE TABLE t (n INTEGER)")
    return connection


def write_taking(
    clock: ManualClock, seconds: float, n: int = 1, fail: bool = False
) -> Callable[[sqlite3.Connection], int]:
    """A write that inserts `n` and takes `seconds` by the clock, failing if asked
    (with an error that is not SQLITE_BUSY: a real failed statement)."""

    def write(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t VALUES (?)", (n,))
        clock.now += seconds
        if fail:
            conn.execute("INSERT INTO no_such_table VALUES (1)")
        return n

    return write


def test_quick_writes_keep_inline_allowed_and_return_what_the_write_returns(
    conn: sqlite3.Connection,
) -> None:
    clock = ManualClock(64.0)
    inline = InlineWrites(SLOW_S, BACKOFF_S, clock)
    assert inline.allowed
    for n in range(3):
        assert inline.timed(write_taking(clock, SLOW_S, n))(conn) == n  # at the limit: quick
        assert inline.allowed
    assert conn.execute("SELECT n FROM t").fetchall() == [(0,), (1,), (2,)]


def test_a_slow_write_sends_writes_to_the_thread_for_the_backoff_then_inline_again(
    conn: sqlite3.Connection,
) -> None:
    clock = ManualClock(64.0)
    inline = InlineWrites(SLOW_S, BACKOFF_S, clock)
    inline.timed(write_taking(clock, SLOW_S + MS))(conn)  # just over the limit
    ended = clock.now
    assert not inline.allowed
    clock.now = ended + BACKOFF_S - MS
    assert not inline.allowed
    clock.now = ended + BACKOFF_S
    assert inline.allowed


def test_a_slow_write_that_fails_backs_off_too_and_its_error_passes_through(
    conn: sqlite3.Connection,
) -> None:
    clock = ManualClock(64.0)
    inline = InlineWrites(SLOW_S, BACKOFF_S, clock)
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        inline.timed(write_taking(clock, 0.02, fail=True))(conn)
    assert not inline.allowed


def test_a_slow_write_during_the_backoff_extends_it_from_its_own_end(
    conn: sqlite3.Connection,
) -> None:
    clock = ManualClock(64.0)
    inline = InlineWrites(SLOW_S, BACKOFF_S, clock)
    inline.timed(write_taking(clock, 0.02))(conn)
    clock.now += BACKOFF_S / 2
    inline.timed(write_taking(clock, 0.02))(conn)  # a call alone still commits inline
    ended = clock.now
    clock.now = ended + BACKOFF_S - MS
    assert not inline.allowed
    clock.now = ended + BACKOFF_S
    assert inline.allowed


def test_a_write_that_finds_the_lock_held_elsewhere_backs_off_however_quick(
    tmp_path: Path,
) -> None:
    clock = ManualClock(64.0)
    inline = InlineWrites(SLOW_S, BACKOFF_S, clock)
    db = tmp_path / "locked.db"
    holder = sqlite3.connect(db, isolation_level=None)
    writer = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        holder.execute("CREATE TABLE t (n INTEGER)")
        holder.execute("BEGIN IMMEDIATE")

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")

        with pytest.raises(sqlite3.OperationalError, match="locked"):
            inline.timed(write)(writer)
        assert not inline.allowed
        clock.now += BACKOFF_S
        assert inline.allowed
    finally:
        holder.close()
        writer.close()


def test_a_write_handed_to_another_thread_is_not_timed(conn: sqlite3.Connection) -> None:
    """run_inline gives the database thread what it cannot run inline: that run's
    time includes waits for the GIL that held up nobody, and does not count."""
    clock = ManualClock(64.0)
    inline = InlineWrites(SLOW_S, BACKOFF_S, clock)
    write = inline.timed(write_taking(clock, 0.25))  # wrapped here, on the loop's thread
    results: list[int] = []
    worker = threading.Thread(target=lambda: results.append(write(conn)))
    worker.start()
    worker.join(5)
    assert results == [1] and inline.allowed
    write(conn)  # the same, run where it was wrapped
    assert not inline.allowed


async def test_a_call_whose_deadline_passed_before_its_group_was_taken_is_not_committed() -> None:
    """A call queued behind a group that hangs past its deadline fails with the
    deadline's error, and is then left out of the next group: its caller was told it
    failed, so it must not be committed after all."""
    committed: list[list[str]] = []
    release = asyncio.Event()

    async def commit(calls: list[str]) -> list[str | Exception]:
        if calls == ["hung"]:
            await release.wait()
        committed.append(list(calls))
        return list(calls)

    group = GroupCommit(commit, deadline=(0.05, lambda: TimeoutError("late")))
    hung = asyncio.ensure_future(group.submit("hung"))
    for _ in range(3):
        await asyncio.sleep(0)  # "hung" is taken as a group of its own and waits
    with pytest.raises(TimeoutError, match="late"):
        await group.submit("queued")
    release.set()
    with pytest.raises(TimeoutError, match="late"):
        await hung  # its own deadline passed too; its group commits regardless
    later = await group.submit("later")
    assert later == "later"
    assert committed == [["hung"], ["later"]]


async def test_a_caller_that_stops_waiting_leaves_no_unretrieved_failure_behind() -> None:
    # Its call's group (or its lone work) then fails: that failure is nobody's to
    # raise, and must not be logged as "exception was never retrieved".
    from plumbing.group_commit import within

    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:

        async def commit(calls: list[int]) -> list[int | Exception]:
            await asyncio.sleep(0.1)
            return [RuntimeError("refused")] * len(calls)

        async def work() -> int:
            await asyncio.sleep(0.1)
            raise RuntimeError("lone refused")

        deadline = (5.0, lambda: TimeoutError("late"))
        group: GroupCommit[int, int] = GroupCommit(commit, deadline=deadline)
        callers = [
            asyncio.ensure_future(group.submit(1)),
            asyncio.ensure_future(within(deadline, work())),
        ]
        await asyncio.sleep(0.02)  # each waiting: its group taken, its work started
        for caller in callers:
            caller.cancel()
        await asyncio.sleep(0.3)  # the group and the work have failed since
        for caller in callers:
            with pytest.raises(asyncio.CancelledError):
                await caller
        del callers
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert reported == []
