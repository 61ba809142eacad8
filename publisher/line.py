"""The line runner: one ordering line delivered by the driver, its failures handed
to the head-failure policy.

A line is the global order (key None: every pending entry) or one key's lane. Each
step runs the driver until the line is drained, the relay stops, or a request
fails, and says how long the line waits before the next step.

A line is delivered under its lease (publisher.leases): each request carries it,
each write for the line is fenced by it, and the driver sends nothing more once
the worker no longer holds it. A write the outbox refuses under it (LeaseLost) is
not a delivery failure: nothing is recorded against the entry, the line stops at
once and its lease is forgotten.

A request the sink refuses under it (FencedBySink, nothing applied) is an attempt
like any failure, recorded under the lease. If the outbox refuses that record,
another worker took the line: the line stops as above. If not, the outbox is behind
the sink (restored from an older backup, say): the line takes its lease again past
the epoch the sink has seen and goes on at once (LeaseKeeper.cross). A fence that
cannot be crossed (the reply names no later epoch, or the lease was taken past one
already: a sink that fences every epoch) is backed off as any failure, so a sink
that always answers "fenced" gets one request per backoff.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from plumbing.logs import Throttled
from publisher.delivery_log import DeliveryLog
from publisher.driver import AfterDelivery, Driver, OutboxLine, Sender
from publisher.driver import log as driver_log
from publisher.errors import FencedBySink, LeaseLost
from publisher.head_policy import HeadPolicy, HeadState
from publisher.leases import LeaseKeeper
from publisher.settings import RelaySettings
from publisher.store import Outbox
from shared import GLOBAL_LINE, Lease


class Step(NamedTuple):
    """How long a line waits after a step, whether that wait is a backoff after a
    failure (new intake does not cut a backoff short), and whether the worker lost
    the line's lease in it (it must not go on)."""

    delay_s: float
    backoff: bool
    lost: bool = False


@dataclass
class Line:
    """One ordering line: its driver, what the policy keeps of its head, and when a
    line backing off may go again."""

    key: str | None
    driver: Driver
    head: HeadState = field(default_factory=HeadState)
    not_before: float = 0.0  # monotonic time before which a backing-off line waits
    lease: Lease | None = None  # what the line is delivered under (None: not leased)

    @property
    def name(self) -> str:
        """The line's name in its lease: GLOBAL_LINE, or the lane's key."""
        return GLOBAL_LINE if self.key is None else self.key

    def waiting(self, now: float) -> bool:
        return self.not_before > now


class Signals:
    """The relay's stop and wake signals, and a sleep that they end early."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.wake = asyncio.Event()
        self.news = False  # intake arrived since the lanes were last listed

    def intake(self) -> None:
        """New entries were committed (here or in another process): wake, and let the
        lanes supervisor know that its list of pending lanes may be out of date."""
        self.news = True
        self.wake.set()

    @property
    def stopping(self) -> bool:
        return self.stop.is_set()

    async def sleep(self, delay_s: float, wakeable: bool) -> None:
        """Sleep up to `delay_s`; a stop ends it, and so does a wake if `wakeable`."""
        if delay_s <= 0 or self.stopping:
            return
        waits = [asyncio.ensure_future(self.stop.wait())]
        if wakeable:
            waits.append(asyncio.ensure_future(self.wake.wait()))
        try:
            await asyncio.wait(waits, timeout=delay_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()


class LineRunner:
    """Makes the lines of one relay and runs their steps."""

    def __init__(
        self,
        outbox: Outbox,
        sender: Sender,
        settings: RelaySettings,
        policy: HeadPolicy,
        report: DeliveryLog,
        signals: Signals,
        keeper: LeaseKeeper | None = None,
        after_delivery: AfterDelivery | None = None,
    ) -> None:
        self._outbox = outbox
        self.keeper = keeper
        self._sender = sender
        self._settings = settings
        self._policy = policy
        self._report = report
        self._signals = signals
        self._after_delivery = after_delivery
        self._log = policy.log
        self._driver_log = Throttled(driver_log, settings.log_repeat_interval_s)

    def line(self, key: str | None) -> Line:
        keeper = self.keeper
        line: Line

        def may_send() -> bool:
            if self._signals.stopping:
                return False
            return keeper is None or keeper.holds(line.lease)

        driver = Driver(
            OutboxLine(self._outbox, key),
            self._sender,
            self._settings,
            after_delivery=self._after_delivery,
            may_send=may_send,
            report=self._report,
            log=self._driver_log,
        )
        line = Line(key, driver)
        return line

    async def step(self, line: Line) -> Step:
        """Deliver the line until it is drained or fails; the wait that follows."""
        try:
            marked = await line.driver.run(line.lease)
        except FencedBySink as fenced:
            return await self._fenced(line, fenced)
        except LeaseLost as lost:
            return self._lost(line, lost)
        except Exception as exc:  # the loop outlives any one failure; each is recorded
            return await self._failed(line, exc)
        self._policy.succeeded(line.head, line.key, marked)
        return Step(self._settings.poll_interval_s, False)

    async def _failed(self, line: Line, exc: Exception) -> Step:
        """Record the failed attempt (under the line's lease); the backoff after it."""
        entry = line.driver.failed_entry
        try:
            delay_s = await self._policy.failed(line.head, line.key, entry, exc, line.lease)
        except LeaseLost as lost:  # the record was refused: another worker has the line
            return self._lost(line, exc if isinstance(exc, FencedBySink) else lost)
        except Exception as unrecorded:  # recording it failed too (the database, say)
            key = ("could not record a failed attempt", str(unrecorded))
            self._log.error(key, "could not record a failed attempt: %s", unrecorded)
            return Step(self._policy.retry.cap_s, True)
        return Step(delay_s, True)

    async def _fenced(self, line: Line, fenced: FencedBySink) -> Step:
        """The sink refused a request for its lease epoch: an attempt, recorded; then
        the fenced gap crossed and the line goes on at once, or, when it cannot be,
        the line backs off (or stops: its lease is gone)."""
        step = await self._failed(line, fenced)
        keeper = self.keeper
        if step.lost or keeper is None:
            return step
        lease = await keeper.cross(line.name, fenced)
        if lease is not None:
            line.lease = lease
            return Step(0.0, False)
        if not keeper.held(line.name):  # another worker took the line meanwhile
            return self._stop(line)
        return step

    def _lost(self, line: Line, lost: LeaseLost) -> Step:
        """A write or request under the line's lease was refused: stop the line."""
        if self.keeper is not None:
            self.keeper.lost(line.name, lost)
        return self._stop(line)

    def _stop(self, line: Line) -> Step:
        line.lease = None
        line.head = HeadState()  # another worker delivers it now
        return Step(0.0, False, lost=True)

    async def wait_out(self, line: Line, step: Step) -> None:
        """Wait after a step of the global line. A backoff is cut short, within one
        poll interval, when the blocked head left the line (an operator quarantined
        it, or redrove an entry before it, from any process); other waits end when
        new intake arrives."""
        if not step.backoff:
            await self._signals.sleep(step.delay_s, wakeable=True)
            return
        deadline = time.monotonic() + step.delay_s
        while not self._signals.stopping and (left_s := deadline - time.monotonic()) > 0:
            await self._signals.sleep(min(left_s, self._settings.poll_interval_s), wakeable=False)
            if await self.head_moved(line):
                return

    async def head_moved(self, line: Line) -> bool:
        blocked = line.head.blocked
        if blocked is None:
            return False
        try:
            return bool(await self._policy.moved({line.key: blocked}))
        except Exception as exc:  # the database, say: keep waiting
            self._log.error(
                ("could not read the head of the line", str(exc)),
                "could not read the head of the line: %s",
                exc,
            )
            return False
