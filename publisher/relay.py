"""The relay: deliver the outbox to the sink until stopped, in global order or by key.

The parts, each in a module of its own: the delivery driver (`driver`, the
send-verify-hook-mark contract), the line runner (`line`, one ordering line), the
head-failure policy (`head_policy`), the lanes supervisor (`lanes`, order by key),
the lease keeper (`leases`: which lines this worker may deliver) and the delivery
log (`delivery_log`). `Relay` puts them together from one `RelaySettings`
(`settings`), which it passes down as it is.

Several relays (workers) may run on one outbox: each line is delivered only under
its lease. In global order one worker holds the global line and the others stand
by, trying again at each renewal; in order by key each lane is a line of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator

from plumbing.logs import Throttled
from publisher.delivery_log import RELAY_LOG, DeliveryLog, Observer
from publisher.driver import AfterDelivery, Sender
from publisher.head_policy import Blocked, HeadPolicy
from publisher.lanes import LanesSupervisor
from publisher.leases import LeaseKeeper, LeaseObserver
from publisher.line import LineRunner, Signals
from publisher.retry import Random
from publisher.settings import RelaySettings
from publisher.store import Outbox

log = logging.getLogger(__name__)


class Relay:
    """Delivers until stopped, backing off while a head fails.

    Global order (the default): one line, stop-on-first-failure across all entries.
    Order by key: stop-on-first-failure inside each key's lane, lanes in parallel.
    Requests go through `sender` (HttpSender), one batch or one event each as the
    settings say.
    """

    def __init__(
        self,
        outbox: Outbox,
        sender: Sender,
        settings: RelaySettings | None = None,
        *,
        observer: Observer | None = None,
        after_delivery: AfterDelivery | None = None,
        rand: Random = random.random,
        lease_observer: LeaseObserver | None = None,
    ) -> None:
        """`settings` None: those of `publisher serve` (RelaySettings())."""
        settings = RelaySettings() if settings is None else settings
        self._settings = settings
        self._outbox = outbox
        self._signals = Signals()
        repeat_s = settings.log_repeat_interval_s
        self.keeper = (
            None
            if settings.worker is None
            else LeaseKeeper(
                outbox, settings.worker, lease_observer, log_repeat_interval_s=repeat_s
            )
        )
        policy = HeadPolicy(outbox, settings.retry, rand, log=Throttled(RELAY_LOG, repeat_s))
        self._log = policy.log
        self._runner = LineRunner(
            outbox,
            sender,
            settings,
            policy,
            DeliveryLog(observer, settings.batch),
            self._signals,
            self.keeper,
            after_delivery,
        )
        self._global = self._runner.line(None)
        self._lanes = (
            LanesSupervisor(outbox, self._runner, policy, self._signals, settings, self.keeper)
            if settings.ordering == "key"
            else None
        )

    @property
    def blocked(self) -> Blocked | None:
        """The blocked head (global order), or the oldest blocked lane head (by key)."""
        if self._lanes is None:
            return self._global.head.blocked
        return min(self._lanes.blocked.values(), key=lambda b: b.since, default=None)

    @property
    def blocked_lanes(self) -> dict[str, Blocked]:
        """Order by key: each lane whose head is failing."""
        return {} if self._lanes is None else self._lanes.blocked

    def wake(self) -> None:
        """New work arrived: start delivering now instead of at the next poll."""
        self._signals.intake()

    def stop(self) -> None:
        """Finish the sends in flight (or let them time out), start no other, then return."""
        self._signals.stop.set()

    async def run(self) -> None:
        """Deliver until stopped; then settle what is in flight and give up the
        leases."""
        settings = self._settings
        worker = None if self.keeper is None else self.keeper.worker
        log.info(
            "relay started",
            extra={"limit": settings.limit, "ordering": settings.ordering, "worker": worker},
        )
        changes = self._outbox.changes()
        follower = None if changes is None else asyncio.create_task(self._follow(changes))
        if self.keeper is not None:
            await self.keeper.start()
        try:
            if self._lanes is not None:
                await self._lanes.run()
            else:
                await self._run_global()
        finally:
            if follower is not None:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
            if self.keeper is not None:
                await self.keeper.stop()
        log.info("relay stopped")

    async def _run_global(self) -> None:
        line = self._global
        while not self._signals.stopping:
            self._signals.wake.clear()
            if not await self._hold_global():
                continue
            step = await self._runner.step(line)
            if not step.lost:
                await self._runner.wait_out(line, step)

    async def _hold_global(self) -> bool:
        """Whether this worker may deliver the global line now: it holds its lease,
        or has just taken it. Otherwise it stands by until the next renewal."""
        keeper, line = self.keeper, self._global
        if keeper is None:
            return True
        lease = keeper.lease(line.name)
        if lease is None and not keeper.held(line.name):
            try:
                lease = await keeper.take(line.name)
            except Exception as exc:  # the database: stand by, try again
                self._log.error(("could not take the lease", str(exc)), "take: %s", exc)
        if lease is None:
            await self._stand_by(keeper)
            return False
        if line.lease != lease:
            log.info(
                "delivering the global line",
                extra={"worker": keeper.worker, "epoch": lease.epoch},
            )
        line.lease = lease
        return True

    async def _stand_by(self, keeper: LeaseKeeper) -> None:
        """Until the next renewal (at most one renewal interval), or a stop."""
        waits = [
            asyncio.ensure_future(self._signals.stop.wait()),
            asyncio.ensure_future(keeper.renewed()),
        ]
        try:
            await asyncio.wait(
                waits,
                timeout=keeper.settings.renew_interval_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for waiter in waits:
                waiter.cancel()

    async def _follow(self, changes: AsyncIterator[None]) -> None:
        """Wake the relay at each signal of intake (from any process); polling goes
        on beside it, so a signal lost costs one poll interval, no more."""
        try:
            async for _ in changes:
                self._signals.intake()
        except Exception as exc:  # the signal is a shortcut: polling carries on alone
            log.warning("no more intake signals, polling only: %s", exc)
        finally:
            closing = getattr(changes, "aclose", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing()
