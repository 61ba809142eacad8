"""What the inbox backends use to share one commit among concurrent requests: the
count of write requests in progress, a call waiting for a shared commit, and (for a
backend whose driver is async) the group commit itself."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Generic, NamedTuple, TypeVar

from shared import Event


class Arrivals:
    """How many write requests are in progress: `with arrivals:` counts one from
    entry to exit. Re-entrant, and cheap (it is entered on every write request)."""

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


class Call(NamedTuple):
    """One receive_batch call waiting for a group commit."""

    events: list[Event]
    after: str | None  # the fence: the event the sender delivered before these


C = TypeVar("C")
R = TypeVar("R")


class GroupCommit(Generic[C, R]):
    """Group commit on the event loop: calls submitted while a transaction runs
    wait, and are then run together in the next one, so they share one commit.

    `commit(calls)` makes one transaction of all the calls and returns one outcome
    per call: its result or the exception it alone failed with. If it raises, every
    call of the group fails with that error. A caller that stops waiting does not
    take its call back: what commits stays committed.
    """

    def __init__(self, commit: Callable[[list[C]], Awaitable[list[R | Exception]]]) -> None:
        self._commit = commit
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
        return await done

    async def _run(self) -> None:
        group: list[tuple[C, asyncio.Future[R]]] = []
        try:
            while self._queue:
                group, self._queue = self._queue, []
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
