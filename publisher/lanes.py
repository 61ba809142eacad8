"""The lanes supervisor: order by key (one lane per key), up to `max_lanes` lanes in flight.

Entries of one key go in seq order with stop-on-first-failure inside that lane, so
a blocked head stalls only its own key. Each lane in flight runs in a task of its
own; a lane that is drained or backing off frees its slot for the lane with the
oldest pending head.

With a lease keeper (several workers on one outbox), a lane is started only once
its lease is taken, and lanes whose lease another worker holds are not listed. A
lane that drains releases its lease; one backing off keeps it (renewed). A lane
whose lease is lost stops at once and is forgotten; one given up for fair share
stops sending and is released once its requests in flight are settled.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Final

from publisher.head_policy import Blocked, HeadPolicy
from publisher.leases import LeaseKeeper
from publisher.line import Line, LineRunner, Signals
from publisher.settings import RelaySettings
from publisher.store import Outbox

LANE_CANDIDATES: Final = 64  # lanes listed per query of pending lanes


class LanesSupervisor:
    """Keeps up to `settings.max_lanes` lanes in flight until the relay stops."""

    def __init__(
        self,
        outbox: Outbox,
        runner: LineRunner,
        policy: HeadPolicy,
        signals: Signals,
        settings: RelaySettings,
        keeper: LeaseKeeper | None = None,
    ) -> None:
        max_lanes, poll_interval_s = settings.max_lanes, settings.poll_interval_s
        self._outbox = outbox
        self._keeper = keeper
        self._runner = runner
        self._policy = policy
        self._log = policy.log
        self._signals = signals
        self._max_lanes = max_lanes
        self._poll_interval_s = poll_interval_s
        self._lanes: dict[str, Line] = {}  # in flight, blocked, or backing off
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._candidates: list[str] = []  # lanes to start next, oldest head first
        self._listed_at = -math.inf  # monotonic time of the query that listed them
        self._listed_all = False  # ... which found fewer lanes than it asked for
        self._heads_read_at = -math.inf  # ... and of the last look at blocked heads
        # Lanes in flight when intake was signalled: the listing it caused left them
        # out, and each may have read before the new entries committed. Such a lane
        # reads once more before it ends drained.
        self._signalled_in_flight: set[str] = set()

    @property
    def blocked(self) -> dict[str, Blocked]:
        """Each lane whose head is failing."""
        return {k: lane.head.blocked for k, lane in self._lanes.items() if lane.head.blocked}

    async def run(self) -> None:
        try:
            while not self._signals.stopping:
                self._signals.wake.clear()
                await self._start_ready_lanes()
                await self._signals.sleep(self._next_check_s(), wakeable=True)
        finally:
            if self._tasks:
                await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _start_ready_lanes(self) -> None:
        """Fill free slots with the lanes whose pending heads are oldest.

        One query reads up to LANE_CANDIDATES lanes, and slots that free up later take
        the next of them, so with thousands of keys a query is not paid per lane. The
        list is read again when it runs short, when a lane's backoff has ended since
        (it may now go first), and at least every poll interval (other writers, a
        redrive). New intake needs none of these: its entries are the youngest, so
        every lane listed goes before a lane they start.
        """
        await self._release_given_up()
        free = self._max_lanes - len(self._tasks)
        if free <= 0:
            return
        now = time.monotonic()
        await self._end_waits_of_moved_heads(now)
        # Lanes already in flight or backing off are left out of the query, so any
        # number of blocked lanes cannot crowd a healthy one out of the list.
        busy = {*self._tasks, *(k for k, lane in self._lanes.items() if lane.waiting(now))}
        keeper = self._keeper
        worker = None if keeper is None else keeper.worker
        keys = [key for key in self._candidates if key not in busy]
        resumed = any(self._listed_at < lane.not_before <= now for lane in self._lanes.values())
        for key in [
            k for k, lane in self._lanes.items() if k not in busy and not lane.head.blocked
        ]:
            del self._lanes[key]  # its wait is over: nothing left to remember
        short = len(keys) < free and not self._listed_all
        news, self._signals.news = self._signals.news, False
        if news:
            self._signalled_in_flight.update(self._tasks)
        if short or news or resumed or now - self._listed_at >= self._poll_interval_s:
            asked = max(free, LANE_CANDIDATES)
            try:
                keys = await self._outbox.pending_lanes(asked, sorted(busy), worker)
            except Exception as exc:
                self._log.error(
                    ("could not read the pending lanes", str(exc)),
                    "could not read the pending lanes: %s",
                    exc,
                )
                self._signals.news = self._signals.news or news  # list again next time
                return
            self._listed_at = now
            self._listed_all = len(keys) < asked
        starting, self._candidates = self._within_share(keys, free)
        for key in starting:
            lane = self._lanes.get(key) or self._new_lane(key)
            self._tasks[key] = asyncio.create_task(self._run_lane(lane), name=f"lane {key}")

    def _within_share(self, keys: list[str], free: int) -> tuple[list[str], list[str]]:
        """The lanes to start now (those this worker holds, and new ones within its
        fair share), and the candidates left for later."""
        keeper = self._keeper
        if keeper is None:
            return keys[:free], keys[free:]
        room = keeper.room(free)
        starting: list[str] = []
        later: list[str] = []
        for key in keys:
            if keeper.giving_up(key):
                continue
            if len(starting) == free or (room <= 0 and not keeper.held(key)):
                later.append(key)  # beyond the share: left to the others, or for later
                continue
            if not keeper.held(key):
                room -= 1
            starting.append(key)
        return starting, later

    async def _release_given_up(self) -> None:
        """Lanes given up for fair share that are not in flight: release them now
        (those in flight are released when their task ends)."""
        if self._keeper is None:
            return
        for key in list(self._keeper.giving_up_lines()):
            if key not in self._tasks:
                self._lanes.pop(key, None)
                await self._keeper.release(key)

    async def _end_waits_of_moved_heads(self, now: float) -> None:
        """Once per poll interval: a lane backing off on a head that has left it (an
        operator quarantined it, or redrove an entry before it, from any process) may
        go again at once."""
        if now - self._heads_read_at < self._poll_interval_s:
            return
        self._heads_read_at = now
        waiting = {
            key: lane.head.blocked
            for key, lane in self._lanes.items()
            if lane.waiting(now) and lane.head.blocked is not None and key not in self._tasks
        }
        try:
            moved = await self._policy.moved(waiting)
        except Exception as exc:
            self._log.error(
                ("could not read the heads of blocked lanes", str(exc)),
                "could not read the heads of blocked lanes: %s",
                exc,
            )
            return
        for key in moved:
            self._lanes[key].not_before = 0.0
        if moved:
            self._listed_at = -math.inf  # list again: those lanes may go first

    def _new_lane(self, key: str) -> Line:
        self._lanes[key] = lane = self._runner.line(key)
        return lane

    async def _run_lane(self, lane: Line) -> None:
        """Deliver one lane until it is drained or must back off; then free the slot."""
        assert lane.key is not None
        try:
            if not await self._hold(lane):
                return
            while not self._signals.stopping:
                step = await self._runner.step(lane)
                if step.lost or not self._may_go_on(lane):
                    return  # another worker delivers it now, or will
                if step.delay_s > 0:
                    if step.backoff:  # back off without holding a slot
                        lane.not_before = time.monotonic() + step.delay_s
                    elif lane.key in self._signalled_in_flight:
                        self._signalled_in_flight.discard(lane.key)
                        continue  # drained as of its read: read again
                    return  # drained, or backing off
        finally:
            self._signalled_in_flight.discard(lane.key)
            del self._tasks[lane.key]
            waiting = lane.waiting(time.monotonic())
            if not lane.head.blocked and not waiting:
                # Forget drained lanes, memory stays bounded; a lane backing off (after
                # a failure that is not its head's, the database say) is kept until
                # its wait is over, so it is left out of the lanes to start till then.
                self._lanes.pop(lane.key, None)
            await self._let_go(lane, waiting)
            self._signals.wake.set()  # a slot is free

    async def _hold(self, lane: Line) -> bool:
        """Whether this worker may deliver the lane: it holds the lease, or takes it."""
        keeper = self._keeper
        if keeper is None:
            return True
        key = lane.name
        try:
            lease = keeper.lease(key) if keeper.held(key) else await keeper.take(key)
        except Exception as exc:  # the database: try the lane again after a poll interval
            self._log.error(("could not take a lane's lease", str(exc)), "take: %s", exc)
            lane.not_before = time.monotonic() + self._poll_interval_s
            return False
        if lease is None and keeper.held(key):  # not renewed in time: wait for it
            lane.not_before = time.monotonic() + self._poll_interval_s
        lane.lease = lease
        return lease is not None

    def _may_go_on(self, lane: Line) -> bool:
        return self._keeper is None or self._keeper.holds(lane.lease)

    async def _let_go(self, lane: Line, waiting: bool) -> None:
        """A drained lane, or one given up, releases its lease; one backing off keeps
        it; at a stop the keeper releases them all together."""
        keeper = self._keeper
        if keeper is None or self._signals.stopping or not keeper.held(lane.name):
            return
        if keeper.giving_up(lane.name) or not (waiting or lane.head.blocked):
            self._lanes.pop(lane.name, None)
            lane.lease = None
            await keeper.release(lane.name)

    def _next_check_s(self) -> float:
        now = time.monotonic()
        waits = [lane.not_before - now for lane in self._lanes.values() if lane.waiting(now)]
        return min([self._poll_interval_s, *waits])
