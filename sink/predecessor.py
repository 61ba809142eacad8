"""The predecessor check's wait: a pipelined request names the event sent just before it.

The publisher may send the next request before the ACK of the previous one is back.
Both arrive on different connections, in either order. The inbox applies a request
only if the event it names is there (checked in the same transaction), so order at
the sink never depends on arrival. `PredecessorWaits` keeps an early request from failing for
nothing: it waits, bounded, until a request in progress in this process has
committed (or given up on) the event it names, or until the inbox knows that event:
several sink processes may share one inbox (PostgreSQL), and the predecessor may be
applied by another one, of which this process hears nothing. So the wait also asks
the inbox (`known`, one indexed read) every few milliseconds, more seldom as it goes
on (POLL_FIRST_S doubling up to POLL_MAX_S).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Final

PREDECESSOR_WAIT_S: Final = 5.0
POLL_FIRST_S: Final = 0.005  # the first look at the inbox after the one on arrival
POLL_MAX_S: Final = 0.05  # the longest pause between two looks
RECENT: Final = 4096  # IDs whose request is done or under way: a late request needs no wait


class PredecessorWaits:
    """Which events were just handed to the inbox here, and who waits for which."""

    def __init__(self, recent: int = RECENT) -> None:
        self._recent: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._keep = recent
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        """How many requests are waiting."""
        return sum(len(waiting) for waiting in self._waiters.values())

    async def wait(
        self,
        after: str,
        known: Callable[[str], Awaitable[bool]],
        timeout_s: float = PREDECESSOR_WAIT_S,
    ) -> None:
        """Return once `after` was handed to the inbox here, is `known` to it (asked
        on arrival, then every POLL_FIRST_S to POLL_MAX_S: another process may apply
        it), or its request ended without it, or when `timeout_s` has passed.

        Says nothing about the outcome: the transaction makes the check itself. Writes
        are committed in the order they are handed over, so a request that goes on as
        soon as its predecessor was handed over finds it applied, or finds it missing
        because its transaction failed.
        """
        if after in self._recent:
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.setdefault(after, []).append(waiter)
        deadline = loop.time() + timeout_s
        pause = POLL_FIRST_S
        try:
            while not await known(after):
                left = deadline - loop.time()
                if left <= 0:
                    return
                done, _ = await asyncio.wait((waiter,), timeout=min(pause, left))
                if done:
                    return
                pause = min(pause * 2, POLL_MAX_S)
        finally:
            waiting = self._waiters.get(after, [])
            if waiter in waiting:
                waiting.remove(waiter)
            if not waiting:
                self._waiters.pop(after, None)

    def handed(self, event_ids: Iterable[str]) -> None:
        """These events go to the inbox now, in this order: remember them, and wake
        whoever waits for one of them."""
        event_ids = list(event_ids)  # read twice: a generator would be spent by the first
        self.wake(event_ids)

    def _remember(self, event_ids: list[str]) -> None:
        for event_id in event_ids:
            self._recent[event_id] = None
            self._recent.move_to_end(event_id)
            if len(self._recent) > self._keep:
                self._recent.popitem(last=False)

    def wake(self, event_ids: Iterable[str]) -> None:
        """Their request is over: wake whoever waits for one of these events, and let
        a request naming one later go straight to the transaction, which decides."""
        event_ids = list(event_ids)
        self._remember(event_ids)
        if not self._waiters:
            return
        for event_id in event_ids:
            for waiter in self._waiters.pop(event_id, ()):
                if not waiter.done():
                    waiter.set_result(None)

    @contextmanager
    def waking(self, event_ids: Iterable[str]) -> Iterator[None]:
        """`with waits.waking(ids):` wakes the waiters of these IDs on the way out,
        however the block is left."""
        try:
            yield
        finally:
            self.wake(event_ids)
