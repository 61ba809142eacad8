"""The predecessor wait: a request whose predecessor is not there yet waits, bounded, for it.

Pure asyncio: `known` (the inbox read in the service) is a small async function here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from sink.predecessor import POLL_FIRST_S, POLL_MAX_S, PredecessorWaits

LONG_S = 5.0  # a wait that must be ended by something else than its timeout
TINY_S = 0.05  # a wait that is meant to time out
BOUND_S = 1.0  # how long a test waits for what should happen at once


async def never(event_id: str) -> bool:
    """The inbox does not hold it."""
    return False


async def always(event_id: str) -> bool:
    """The inbox holds it."""
    return True


async def must_not_ask(event_id: str) -> bool:
    raise AssertionError(f"known({event_id!r}) was asked")


@contextlib.asynccontextmanager
async def waiting(
    waits: PredecessorWaits, *afters: str, timeout_s: float = LONG_S
) -> AsyncIterator[list[asyncio.Task[None]]]:
    """One task waiting for each ID, registered before the block runs; cancelled and
    awaited on the way out, so no task outlives its test."""
    before = len(waits)
    tasks = [asyncio.create_task(waits.wait(after, never, timeout_s)) for after in afters]
    try:
        await asyncio.sleep(0)  # each task runs up to its wait: registered
        assert len(waits) == before + len(afters)
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def finished(task: asyncio.Task[None]) -> bool:
    """Whether the task ends within BOUND_S (well before LONG_S)."""
    done, _ = await asyncio.wait({task}, timeout=BOUND_S)
    return task in done


async def still_waiting(task: asyncio.Task[None]) -> bool:
    await asyncio.sleep(TINY_S)
    return not task.done()


async def returns(wait: Coroutine[Any, Any, None]) -> None:
    """Await a wait that must end well before LONG_S, by something else than its timeout."""
    await asyncio.wait_for(wait, BOUND_S)


async def test_a_recently_handed_id_returns_at_once_without_asking_the_inbox() -> None:
    waits = PredecessorWaits()
    waits.handed(["e1", "e2"])

    await returns(waits.wait("e1", must_not_ask))
    await returns(waits.wait("e2", must_not_ask))
    assert len(waits) == 0


async def test_a_wait_ends_when_that_id_is_handed_and_not_before() -> None:
    waits = PredecessorWaits()
    async with waiting(waits, "e1") as (task,):
        assert await still_waiting(task)
        waits.handed(["other"])
        assert await still_waiting(task)

        waits.handed(["e0", "e1"])

        assert await finished(task)
        assert task.result() is None
    assert len(waits) == 0


async def test_a_wait_ends_when_that_ids_request_wakes_it() -> None:
    waits = PredecessorWaits()
    async with waiting(waits, "e1") as (task,):
        waits.wake(["other"])
        assert await still_waiting(task)

        waits.wake(["e1"])

        assert await finished(task)
    assert len(waits) == 0


async def test_a_request_naming_a_settled_id_later_does_not_wait() -> None:
    # Its request is over (refused, say): a request naming it that arrives afterwards
    # goes straight to the transaction, which decides, instead of waiting 5 s.
    waits = PredecessorWaits()
    async with waiting(waits, "e1") as (task,):
        waits.wake(["e1"])
        assert await finished(task)

    asked: list[str] = []

    async def asking(event_id: str) -> bool:
        asked.append(event_id)
        return False

    began = time.perf_counter()
    await asyncio.wait_for(waits.wait("e1", asking, timeout_s=BOUND_S / 2), BOUND_S)
    assert time.perf_counter() - began < BOUND_S / 4
    assert asked == []


async def test_a_wait_returns_at_once_when_the_inbox_knows_the_id() -> None:
    waits = PredecessorWaits()
    asked: list[str] = []

    async def known(event_id: str) -> bool:
        asked.append(event_id)
        return await always(event_id)

    await returns(waits.wait("e1", known))
    assert asked == ["e1"]
    assert len(waits) == 0


async def test_an_id_handed_while_the_inbox_is_read_ends_the_wait() -> None:
    waits = PredecessorWaits()

    async def read_meanwhile_handed(event_id: str) -> bool:
        waits.handed([event_id])  # another request hands it over during the read
        return False

    await returns(waits.wait("e1", read_meanwhile_handed))

    assert len(waits) == 0


async def test_a_wait_times_out_quietly_and_removes_its_waiter() -> None:
    waits = PredecessorWaits()
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with waiting(waits, "e1", timeout_s=TINY_S) as (task,):
        assert len(waits) == 1
        assert await finished(task)
        assert loop.time() - started >= TINY_S * 0.9
        assert task.result() is None  # no exception: the transaction checks the predecessor
        assert len(waits) == 0
    waits.handed(["e1"])  # nothing left to wake: no error either


async def test_a_timed_out_waiter_leaves_the_others_of_that_id_waiting() -> None:
    waits = PredecessorWaits()
    async with waiting(waits, "e1") as (patient,):
        async with waiting(waits, "e1", timeout_s=TINY_S) as (hasty,):
            assert await finished(hasty)
            assert len(waits) == 1
            assert await still_waiting(patient)

            waits.handed(["e1"])

            assert await finished(patient)
    assert len(waits) == 0


async def test_the_recent_memory_forgets_the_oldest_ids_first() -> None:
    waits = PredecessorWaits(recent=2)
    waits.handed(["e1", "e2"])
    waits.handed(["e3"])
    asked: list[str] = []

    async def asking(event_id: str) -> bool:
        asked.append(event_id)
        return False

    for event_id in ("e1", "e2", "e3"):
        await asyncio.wait_for(waits.wait(event_id, asking, timeout_s=TINY_S), BOUND_S)

    assert set(asked) == {"e1"}  # only the oldest was forgotten, so only it needs a read
    assert len(waits) == 0


async def test_a_wait_polls_the_inbox_with_a_growing_pause_until_it_knows_the_event() -> None:
    # Another sink process may apply the predecessor: nothing here wakes the wait.
    waits = PredecessorWaits()
    loop = asyncio.get_running_loop()
    asked: list[float] = []
    known_at = loop.time() + 0.3

    async def known(event_id: str) -> bool:
        asked.append(loop.time())
        return asked[-1] >= known_at

    started = loop.time()
    await asyncio.wait_for(waits.wait("e1", known, timeout_s=LONG_S), BOUND_S)

    assert loop.time() - known_at < POLL_MAX_S + 0.1  # seen within a pause of its commit
    pauses = [b - a for a, b in itertools.pairwise(asked)]
    assert pauses[0] < 0.05 and all(p < POLL_MAX_S + 0.05 for p in pauses)
    assert 6 <= len(asked) <= 0.3 / POLL_FIRST_S / 2, "neither busy polling nor a fixed sleep"
    assert asked[0] - started < 0.01  # asked on arrival
    assert len(waits) == 0


async def test_a_poll_ends_at_the_wait_limit() -> None:
    waits = PredecessorWaits()
    asked: list[str] = []

    async def unknown(event_id: str) -> bool:
        asked.append(event_id)
        return False

    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(waits.wait("e1", unknown, timeout_s=0.2), BOUND_S)
    assert 0.2 <= loop.time() - started < 0.2 + POLL_MAX_S
    assert 4 <= len(asked) <= 12


async def test_waking_wakes_the_waiters_when_the_block_raises() -> None:
    waits = PredecessorWaits()
    async with waiting(waits, "e1", "e2", "e3") as (one, two, three):
        with pytest.raises(RuntimeError, match="request failed"):
            with waits.waking(["e1", "e2"]):
                assert await still_waiting(one)
                raise RuntimeError("request failed")

        assert await finished(one) and await finished(two)
        assert await still_waiting(three)
        assert len(waits) == 1


async def test_waking_wakes_the_waiters_when_the_block_ends() -> None:
    waits = PredecessorWaits()
    async with waiting(waits, "e1") as (task,):
        with waits.waking(["e1"]):
            assert await still_waiting(task)

        assert await finished(task)
    assert len(waits) == 0


async def test_a_handed_id_wakes_every_waiter_of_it_and_only_those() -> None:
    waits = PredecessorWaits()
    async with waiting(waits, "e1", "e1", "e1", "e2") as tasks:
        waits.handed(["e1"])

        for task in tasks[:3]:
            assert await finished(task)
        assert await still_waiting(tasks[3])
        assert len(waits) == 1


async def test_ids_handed_as_a_generator_wake_their_waiters() -> None:
    # post_batch hands over `event["id"] for event in events`: one pass only.
    waits = PredecessorWaits()
    async with waiting(waits, "e2") as (task,):
        waits.handed(event_id for event_id in ["e1", "e2"])

        assert await finished(task), "handed() used up the generator before waking"
