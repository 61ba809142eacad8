"""Group commit on the event loop, for every backend of either side.

Calls submitted while a group is being committed wait, and are then committed
together in the next transaction, so they share its round trips and its flush to
disk. Each backend supplies `commit(calls)`: one transaction of all the calls,
returning one outcome per call (its result, or the exception it alone failed with,
each call in a savepoint of its own, say). If `commit` raises, every call of that
group fails with the error. A caller that stops waiting does not take its call
back: what commits stays committed.

A backend whose commit blocks the event loop while it runs (SQLite's inline commit)
asks for `gather_passes`: before a group is taken, the loop runs that many passes,
each of which reads the sockets that are ready, so that requests already arriving
join the group instead of waiting behind it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

C = TypeVar("C")
R = TypeVar("R")
# A call's deadline in seconds, and the error its caller gets once it has passed.
Deadline = tuple[float, Callable[[], Exception]]

Commit = Callable[[list[C]], Awaitable[list[R | Exception]]]


class GroupCommit(Generic[C, R]):
    """`await group.submit(call)`: the call's outcome once its group has committed."""

    def __init__(
        self,
        commit: Commit[C, R],
        *,
        gather_passes: int = 0,
        deadline: Deadline | None = None,
    ) -> None:
        """`deadline=(seconds, error)`: a call waits at most that long from its
        submission, the groups before its own included, and then fails with
        `error()`; what its group commits later stays committed."""
        if gather_passes < 0:
            raise ValueError(f"gather_passes must be 0 or more, not {gather_passes}")
        self._commit = commit
        self._gather_passes = gather_passes
        self._deadline = deadline
        self._queue: list[tuple[C, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        """Whether a group is being committed (or waits to be)."""
        return self._task is not None

    async def submit(self, call: C) -> R:
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((call, done))
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        if self._deadline is None:
            return await done
        # A timer, not wait_for and shield (a task and two futures per call, tens of
        # microseconds on the hot path): at the deadline the call's own future takes
        # the error; its group, which may still commit the call, then sets nothing.
        seconds, error = self._deadline
        timer = asyncio.get_running_loop().call_later(seconds, _expire, done, error)
        try:
            return await done
        finally:
            timer.cancel()

    async def _run(self) -> None:
        group: list[tuple[C, asyncio.Future[R]]] = []
        try:
            while self._queue:
                for _ in range(self._gather_passes):
                    await asyncio.sleep(0)  # one pass of the loop: ready sockets are read
                # A call whose deadline passed before its group was taken is not
                # committed: its 503 holds. One whose caller was cancelled still is (a
                # relay stopping with its marks queued, a request cut off), as before.
                group = [
                    (call, done)
                    for call, done in self._queue
                    if not done.done() or done.cancelled()
                ]
                self._queue = []
                if not group:
                    continue
                outcomes: list[R | Exception]
                try:
                    outcomes = await self._commit([call for call, _ in group])
                except Exception as exc:  # the transaction itself failed: so did every call
                    outcomes = [exc] * len(group)
                for (_, done), outcome in zip(group, outcomes, strict=True):
                    if done.done():
                        continue  # its caller stopped waiting
                    if isinstance(outcome, Exception):
                        done.set_exception(outcome)
                    else:
                        done.set_result(outcome)
                group = []
        finally:
            self._task = None
            for _, done in [*group, *self._queue]:
                done.cancel()  # only when this task itself was cancelled
            self._queue = []


async def within(deadline: Deadline | None, work: Awaitable[R]) -> R:
    """`await work`, for at most the deadline's seconds, then its `error()`; the
    work itself goes on in a task of its own (what it commits stays committed) and
    its outcome is dropped."""
    if deadline is None:
        return await work
    seconds, error = deadline
    task = asyncio.ensure_future(work)
    outcome: asyncio.Future[R] = asyncio.get_running_loop().create_future()
    task.add_done_callback(functools.partial(_settle, outcome))
    timer = asyncio.get_running_loop().call_later(seconds, _expire, outcome, error)
    try:
        return await outcome
    finally:
        timer.cancel()


def _expire(done: asyncio.Future[Any], error: Callable[[], Exception]) -> None:
    if not done.done():
        done.set_exception(error())


def _settle(outcome: asyncio.Future[Any], task: asyncio.Future[Any]) -> None:
    """The work's outcome, unless the caller was answered already (its deadline passed,
    or it stopped waiting): then only retrieved, so that it is not logged again."""
    if task.cancelled():
        if not outcome.done():
            outcome.cancel()
    elif task.exception() is not None:
        if not outcome.done():
            outcome.set_exception(task.exception())  # type: ignore[arg-type]
    elif not outcome.done():
        outcome.set_result(task.result())


class Arrivals:
    """How many write requests are in progress: `with arrivals:` counts one from
    entry to exit. Re-entrant, and cheap (it is entered on every write request).
    A backend that can commit a lone call inline (on the event loop's thread) may do
    so only while this is at most one: with other requests in progress, an inline
    commit keeps the loop from reading them while its fsync runs (the SQLite outbox
    accepts that while its commits are quick, and gathers them first instead)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> None:
        self.count += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.count -= 1
