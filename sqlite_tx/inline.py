"""When a write may commit inline, on the event loop's thread: InlineWrites.

An inline commit saves two hand-offs to the database thread but holds the loop while
it runs, so whether to run one is judged by how long the last ones took.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from .transactions import is_busy

T = TypeVar("T")

# A write run inline that takes longer than this (or finds the write lock held
# elsewhere) sends the writes of the next INLINE_BACKOFF_S seconds to the database
# thread (see InlineWrites).
INLINE_SLOW_S = 0.005
INLINE_BACKOFF_S = 1.0


class InlineWrites:
    """Whether a write may commit inline now (Database.run_inline), judged by how long
    the last ones took: `allowed`, and `timed(fn)` to run a write so that it counts.

    Inline, a commit saves the two hand-offs to the database thread, and on a quick
    disk they cost more than the commit: on the thread each statement gives the GIL
    up, and while the loop runs Python it waits to take it back. But an inline commit
    holds the loop for as long as it runs. One that takes longer than `slow_s` (a slow
    disk, a WAL checkpoint), or that finds the write lock held by another connection,
    sends the writes of the next `backoff_s` seconds to the database thread; the first
    write after that tries inline again. Only a run on the thread that wrapped it (the
    loop's) counts: where run_inline hands the write to the database thread instead,
    its time there includes waits for the GIL that held nobody up. The time kept is one
    float, written whole.
    """

    def __init__(
        self,
        slow_s: float = INLINE_SLOW_S,
        backoff_s: float = INLINE_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slow_s = slow_s
        self._backoff_s = backoff_s
        self._clock = clock
        self._thread_until = -math.inf

    @property
    def allowed(self) -> bool:
        """False while backing off after a slow write."""
        return self._clock() >= self._thread_until

    def timed(self, fn: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
        """`fn`, timed if it runs on this thread: if it took longer than slow_s (its
        failure included) or failed with SQLITE_BUSY, writes go to the database thread
        for backoff_s from its end. Called on the event loop's thread."""
        here = threading.get_ident()

        def run(conn: sqlite3.Connection) -> T:
            if threading.get_ident() != here:
                return fn(conn)
            started = self._clock()
            busy = False
            try:
                return fn(conn)
            except sqlite3.OperationalError as exc:
                busy = is_busy(exc)
                raise
            finally:
                ended = self._clock()
                if busy or ended - started > self._slow_s:
                    self._thread_until = ended + self._backoff_s

        return run
