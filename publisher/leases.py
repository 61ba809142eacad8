"""The lease keeper: which lines this relay worker may deliver, and for how long.

Several `publisher serve` processes (workers) share one outbox. A worker delivers
a line (the global line `shared.GLOBAL_LINE`, or one key's lane) only while it
holds that line's lease in the outbox: taken atomically, every take raising the
line's epoch (the fencing token), renewed by a heartbeat every ttl/3, released
when the line is drained, given away, or the worker stops.

The worker's own view is deliberately the shorter one: a lease is good until the
start of its last successful renewal (or take) plus ttl minus a margin, on the
monotonic clock. Past that the worker sends nothing new on the line, even while the
database cannot be reached to say whether the lease still holds; the outbox's
expiry is later (it counts from when the statement ran), so no other worker can
have taken the line while this one still thinks it holds it. Whatever slips past
that (a pause longer than the lease between the check and the send) is stopped by
fencing: the outbox refuses the writes of an old epoch, the sink its requests.

Fair share: at each renewal a worker that holds more than ceil(leased lines / live
workers) + 1 lines gives up the excess (it stops sending on them at once, and
releases each once its requests in flight are settled), and it takes no new line
beyond that share. Live workers are those seen within one ttl.

A fenced gap: a sink that fences a request of a line this worker still holds in
the outbox (the outbox is behind the sink: restored from an older backup, say) has
seen a higher epoch of it than the outbox has. `cross` takes the line's lease again
past the epoch the sink names, in one step, however wide the gap. A lease so taken
is not taken past another: a sink that fences it too has seen epochs that no take
of this outbox made (a forged reply, or a second outbox sending as this one), and
the line backs off instead, as after any failed attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from plumbing.logs import REPEAT_INTERVAL_S, Throttled
from publisher.errors import FencedBySink, LeaseLost
from publisher.settings import WorkerSettings
from publisher.store import Outbox
from shared import GLOBAL_LINE, Lease

# The name operators have filtered lease and worker lines on since workers came.
log = logging.getLogger("publisher.workers")

# The widest fenced gap crossed in one step. No restore or takeover history makes a
# wider one (a lane taken once a second for a century is about 2**31 epochs), and a
# reply that names one anyway would spend the epoch space: it is backed off instead.
MAX_EPOCH_GAP: Final = 2**32


class LeaseObserver(Protocol):
    """Told about leases (metrics)."""

    def lines_owned(self, count: int) -> None: ...

    def workers_live(self, count: int) -> None: ...

    def takeover(self) -> None: ...

    def fenced_write(self) -> None: ...

    def fenced_request(self) -> None: ...

    def fenced_gap_crossed(self) -> None: ...


@dataclass
class Held:
    """A lease this worker holds: its epoch, until when (monotonic) it trusts it,
    whether it is being given up (fair share), and whether it was taken past an
    epoch a sink had seen (a fenced gap is crossed once per lease)."""

    epoch: int
    good_until: float
    giving_up: bool = False
    crossed: bool = False


@dataclass(frozen=True)
class Share:
    """What the last renewal saw: lines other workers held, and live workers."""

    others: int = 0
    live: int = 1

    def most(self, mine: int) -> int:
        """The most lines one worker should hold while it holds `mine`: ceil(leased
        lines / live workers) + 1 (its own count is current, the others' as read)."""
        return math.ceil((self.others + mine) / max(self.live, 1)) + 1


class LeaseKeeper:
    """Takes, renews and releases this worker's leases in the outbox.

    `start` notes the worker and starts the heartbeat; `stop` releases every lease
    and forgets the worker. `lease(line)` is the lease to send under, or None when
    the worker must not send on that line now.
    """

    def __init__(
        self,
        outbox: Outbox,
        settings: WorkerSettings,
        observer: LeaseObserver | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        log_repeat_interval_s: float = REPEAT_INTERVAL_S,
    ) -> None:
        self._outbox = outbox
        self.settings = settings
        self.worker = settings.name
        self._observer = observer
        self._clock = clock
        self._held: dict[str, Held] = {}
        self._owners: dict[str, str | None] = {}  # each line's owner as last read
        self._expires: dict[str, float] = {}  # ... and when that lease ran out (monotonic)
        self.share = Share()
        self._log = Throttled(log, log_repeat_interval_s)
        self._heartbeat: asyncio.Task[None] | None = None
        self._noted = False  # this worker noted as live since it started
        self._renewed = asyncio.Event()

    # ------------------------------------------------------------ the worker's view

    def lease(self, line: str) -> Lease | None:
        """The lease to send under on `line`, or None: not held, being given up, or
        not renewed in time (the database unreachable, say)."""
        held = self._held.get(line)
        if held is None or held.giving_up or self._clock() >= held.good_until:
            return None
        return Lease(self._outbox.source, line, held.epoch)

    def holds(self, lease: Lease | None) -> bool:
        """Whether `lease` is still good to send under (a driver's `may_send`, asked
        before every send: no Lease is made here)."""
        if lease is None:
            return False
        held = self._held.get(lease.line)
        return (
            held is not None
            and held.epoch == lease.epoch
            and not held.giving_up
            and self._clock() < held.good_until
        )

    def held(self, line: str) -> bool:
        """Whether the worker holds `line`'s lease at all (good or not)."""
        return line in self._held

    @property
    def lines(self) -> list[str]:
        return sorted(self._held)

    def giving_up(self, line: str) -> bool:
        held = self._held.get(line)
        return held is not None and held.giving_up

    def room(self, wanted: int) -> int:
        """How many more lines, up to `wanted`, this worker may take within its fair
        share (a worker alone may take any number)."""
        mine, more = len(self._held), 0
        while more < wanted and mine + more + 1 <= self.share.most(mine + more + 1):
            more += 1
        return more

    # ------------------------------------------------------------ takes and releases

    async def take(self, line: str) -> Lease | None:
        """Take `line`'s lease: the new lease, or None when another owner holds it.
        A line this worker holds already is not taken again (that would fence its
        own requests in flight): its current lease is returned, if good."""
        if line in self._held:
            return self.lease(line)
        before = await self._other_owner(line)
        started = self._clock()
        epoch = await self._outbox.take_lease(line, self.worker, self.settings.lease_ttl_s)
        if epoch is None:
            return None
        self._held[line] = Held(epoch, started + self.settings.good_for_s)
        self._owners[line] = self.worker
        if before is not None:
            if self._observer is not None:
                self._observer.takeover()
            log.info(
                "took over a line",
                extra={"line": line, "epoch": epoch, "from": before, "worker": self.worker},
            )
        self._owned()
        return Lease(self._outbox.source, line, epoch)

    async def _other_owner(self, line: str) -> str | None:
        """The other worker whose lease of `line` a take now would take over (its
        lease ran out unreleased), or None. Read only for a line that another worker
        held when the lines were last read and whose lease has run out since, so a
        take costs one statement otherwise: a take of a lease that was still good
        succeeds only if its owner released it (lanes that drain do, all the time)."""
        cached = self._owners.get(line)
        if cached is None or cached == self.worker:
            return None
        if self._clock() < self._expires.get(line, -math.inf):
            return None
        row = await self._outbox.lease_of(line)
        if row is None or row.owner is None or row.owner == self.worker:
            return None
        return row.owner

    async def release(self, line: str) -> None:
        """Give `line`'s lease up (drained, given away): another worker may take it
        at once. A release that fails is logged; the lease then expires by itself."""
        held = self._held.pop(line, None)
        if held is None:
            return
        self._owners[line] = None
        self._owned()
        try:
            await self._outbox.release_leases(self.worker, {line: held.epoch})
        except Exception as exc:  # the database: the lease runs out within one ttl
            self._log.error(("could not release a lease", str(exc)), "could not release: %s", exc)

    def lost(self, line: str, error: LeaseLost) -> None:
        """A write or request under `line`'s lease was refused: forget the lease (if
        it is still the one refused), count it, say so once."""
        held = self._held.get(line)
        if held is not None and held.epoch == error.epoch:
            del self._held[line]
            self._owned()
        by_sink = isinstance(error, FencedBySink)
        if self._observer is not None:
            if by_sink:
                self._observer.fenced_request()
            else:
                self._observer.fenced_write()
        log.warning(
            "line stopped: lease lost",
            extra={
                "line": line,
                "epoch": error.epoch,
                "worker": self.worker,
                "refused_by": "sink" if by_sink else "outbox",
                "reason": str(error),
            },
        )

    async def cross(self, line: str, fenced: FencedBySink) -> Lease | None:
        """The sink fenced a request of `line` (nothing of it applied) that the outbox
        did not (the attempt's record under the lease was written): count it, and take
        the line's lease again past the epoch the sink has seen, in one statement. The
        new lease; None when the gap is not crossed: the reply names no epoch above the
        one refused, or one more than MAX_EPOCH_GAP beyond it, the lease refused was
        taken past a sink's epoch already, or is no longer the one held, or the take
        failed (another worker took the line meanwhile: the lease is forgotten)."""
        if self._observer is not None:
            self._observer.fenced_request()
        held, seen = self._held.get(line), fenced.seen
        if held is None or held.epoch != fenced.epoch:
            return None
        if held.crossed or seen is None or not held.epoch < seen <= held.epoch + MAX_EPOCH_GAP:
            self._log.warning(
                ("fenced gap not crossed", line),
                "the sink fences line %r and names no epoch to take its lease past (%s):"
                " backing off",
                line,
                fenced,
                extra={"line": line, "epoch": held.epoch, "seen": seen, "worker": self.worker},
            )
            return None
        return await self._take_past(line, held, seen)

    async def _take_past(self, line: str, held: Held, seen: int) -> Lease | None:
        started = self._clock()
        try:
            epoch = await self._outbox.take_lease_past(
                line, self.worker, self.settings.lease_ttl_s, seen
            )
        except Exception as exc:  # the database: the line backs off and is fenced again
            self._log.error(("could not cross a fenced gap", str(exc)), "cross: %s", exc)
            return None
        if epoch is None:  # another worker took it: its lease had run out meanwhile
            del self._held[line]
            self._owned()
            return None
        self._held[line] = Held(epoch, started + self.settings.good_for_s, held.giving_up, True)
        if self._observer is not None:
            self._observer.fenced_gap_crossed()
        log.warning(
            "crossed a fenced gap: the sink had seen a later epoch of the line",
            extra={"line": line, "from": held.epoch, "seen": seen, "epoch": epoch},
        )
        return Lease(self._outbox.source, line, epoch)

    # ------------------------------------------------------------ the heartbeat

    async def start(self) -> None:
        """Note this worker as live, read the lines and the live workers (so that
        its first takes stay within its fair share and a takeover is known as one),
        and start the heartbeat. A database that cannot be reached is not fatal: the
        heartbeat keeps trying, nothing is sent meanwhile (no lease is held)."""
        try:
            await self._read_share(await self._seen())
        except Exception as exc:
            self._log.error(("could not note the worker", str(exc)), "worker: %s", exc)
        self._heartbeat = asyncio.create_task(self._beat(), name="lease heartbeat")

    async def stop(self) -> None:
        """Stop the heartbeat, release every lease, forget the worker."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        held, self._held = {k: h.epoch for k, h in self._held.items()}, {}
        self._owned()
        try:
            if held:
                await self._outbox.release_leases(self.worker, held)
            await self._outbox.worker_gone(self.worker)
        except Exception as exc:  # the leases run out within one ttl by themselves
            log.error("could not release the leases at stop: %s", exc, extra={"lines": len(held)})

    async def renewed(self) -> None:
        """Wait for the next renewal (a standby worker tries again after each)."""
        self._renewed.clear()
        await self._renewed.wait()

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.renew_interval_s)
            try:
                await self.renew()
            except Exception as exc:  # the database: the worker's view runs out alone
                self._log.error(("could not renew leases", str(exc)), "renewal: %s", exc)
            finally:
                self._renewed.set()

    async def renew(self) -> None:
        """One heartbeat: note the worker, extend the leases still held, stop the
        lost ones, and give up lines beyond the fair share."""
        started = self._clock()
        live = await self._seen()
        held = {line: h.epoch for line, h in self._held.items()}
        kept = (
            await self._outbox.renew_leases(self.worker, held, self.settings.lease_ttl_s)
            if held
            else set()
        )
        for line, epoch in held.items():
            now = self._held.get(line)
            if now is None or now.epoch != epoch:
                continue  # released or taken again meanwhile
            if line in kept:
                now.good_until = started + self.settings.good_for_s
            else:
                del self._held[line]
                log.warning(
                    "line stopped: lease lost at renewal",
                    extra={"line": line, "epoch": epoch, "worker": self.worker},
                )
        await self._read_share(live)
        self._give_up_excess()
        self._owned()

    async def _seen(self) -> int:
        first = not self._noted  # up since now: a restart under the same ID as well
        live = await self._outbox.worker_seen(self.worker, self.settings.lease_ttl_s, first=first)
        self._noted = True
        return live

    async def _read_share(self, live: int) -> None:
        read_at = self._clock()  # before the read: no expiry noted is later than the outbox's
        rows = await self._outbox.leases()
        self._owners = {row.line: row.owner for row in rows}  # expired ones too: takeovers
        self._expires = {row.line: read_at + row.expires_in_s for row in rows}
        others = sum(1 for row in rows if row.held and row.owner != self.worker)
        self.share = Share(others, live)
        if self._observer is not None:
            self._observer.workers_live(live)

    def _give_up_excess(self) -> None:
        """Beyond the fair share: the lanes given up first are those not marked
        yet, taken last (the newest leases, highest line name on a tie)."""
        mine = [line for line, h in self._held.items() if not h.giving_up]
        keep = self.share.most(len(mine))
        excess = len(mine) - keep
        if excess <= 0 or GLOBAL_LINE in mine:
            return
        for line in sorted(mine, reverse=True)[:excess]:
            self._held[line].giving_up = True
            log.info(
                "giving a line up (fair share)",
                extra={"line": line, "worker": self.worker, "share": keep},
            )

    def giving_up_lines(self) -> Iterable[str]:
        return [line for line, h in self._held.items() if h.giving_up]

    def _owned(self) -> None:
        if self._observer is not None:
            self._observer.lines_owned(len(self._held))
