"""The lease keeper: which lines this relay worker may deliver, and for how long.

Several `publisher serve` processes (workers) share one outbox. A worker delivers
a line (the global line `shared.GLOBAL_LINE`, or one SKU's lane) only while it
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
the fences: the outbox refuses the writes of an old epoch, the sink its requests.

Fair share: at each renewal a worker that holds more than ceil(leased lines / live
workers) + 1 lines gives up the excess (it stops sending on them at once, and
releases each once its requests in flight are settled), and it takes no new line
beyond that share. Live workers are those seen within one ttl.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from plumbing.logs import REPEAT_INTERVAL_S, Throttled
from plumbing.storage import parse_location
from publisher.errors import FencedBySink, LeaseLost
from publisher.store import LineLease, Outbox, RelayWorker
from shared import GLOBAL_LINE, Lease

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL_S: Final = 10.0
MIN_LEASE_TTL_S: Final = 0.1  # below this a renewal could not keep up with its ttl
MAX_LEASE_TTL_S: Final = 3600.0  # a killed worker's lines would wait longer than this
RENEWALS_PER_TTL: Final = 3
MARGIN_SHARE: Final = 0.2  # of the ttl: the worker's view ends this much before the outbox's
LINES_SHOWN: Final = 8  # of a worker's lines, named in its status line
_WORKER_ID: Final = re.compile(r"[A-Za-z0-9._:@-]{1,128}")


def default_worker_id() -> str:
    """HOST:PID, with any character a worker ID may not hold replaced by '-'."""
    host = re.sub(r"[^A-Za-z0-9._:@-]", "-", socket.gethostname())[:100] or "host"
    return f"{host}:{os.getpid()}"


def worker_id_for(location: str, given: str | None, *, dispatch: bool = False) -> str:
    """The worker ID to use on the outbox at `location` when --worker-id gave `given`
    (None: not given). Where a relay lock lets one process deliver at a time, every
    such process takes the same ID, so that one started after another was killed
    takes that one's leases at once (a take by the same ID) instead of waiting out
    the ttl: on SQLite every relay of the host (serve and dispatch), on PostgreSQL
    every `publisher dispatch` (they take the database's relay lock). A PostgreSQL
    worker is HOST:PID."""
    if given is not None:
        return given
    if parse_location(location).backend != "postgres":
        return f"{default_worker_id().rpartition(':')[0]}:relay-lock"
    return "dispatch:relay-lock" if dispatch else default_worker_id()


def check_worker_id(worker_id: str) -> str:
    """`worker_id` if it is 1-128 of A-Z a-z 0-9 . _ : @ -, else ValueError."""
    if not _WORKER_ID.fullmatch(worker_id):
        raise ValueError(f"worker ID {worker_id[:40]!r} is not 1-128 of A-Z a-z 0-9 . _ : @ -")
    return worker_id


def check_lease_ttl(ttl_s: float) -> float:
    """`ttl_s` if it is between MIN_LEASE_TTL_S and MAX_LEASE_TTL_S, else ValueError."""
    if not MIN_LEASE_TTL_S <= ttl_s <= MAX_LEASE_TTL_S:
        raise ValueError(
            f"lease ttl must be from {MIN_LEASE_TTL_S} to {MAX_LEASE_TTL_S:.0f} s, got {ttl_s}"
        )
    return ttl_s


@dataclass(frozen=True)
class WorkerSettings:
    """Who this worker is and how long its leases last."""

    worker_id: str = field(default_factory=default_worker_id)
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S

    def __post_init__(self) -> None:
        check_worker_id(self.worker_id)
        check_lease_ttl(self.lease_ttl_s)

    @property
    def renew_interval_s(self) -> float:
        return self.lease_ttl_s / RENEWALS_PER_TTL

    @property
    def good_for_s(self) -> float:
        """How long after a renewal starts the worker trusts the lease."""
        return self.lease_ttl_s * (1 - MARGIN_SHARE)


class LeaseObserver(Protocol):
    """Told about leases (metrics)."""

    def lines_owned(self, count: int) -> None: ...

    def workers_live(self, count: int) -> None: ...

    def takeover(self) -> None: ...

    def fenced_write(self) -> None: ...

    def fenced_request(self) -> None: ...


@dataclass
class Held:
    """A lease this worker holds: its epoch, until when (monotonic) it trusts it, and
    whether it is being given up (fair share)."""

    epoch: int
    good_until: float
    giving_up: bool = False


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
        self.worker = settings.worker_id
        self._observer = observer
        self._clock = clock
        self._held: dict[str, Held] = {}
        self._owners: dict[str, str | None] = {}  # each line's owner as last read
        self._expires: dict[str, float] = {}  # ... and when that lease ran out (monotonic)
        self.share = Share()
        self._log = Throttled(log, log_repeat_interval_s)
        self._heartbeat: asyncio.Task[None] | None = None
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
        return await self._outbox.worker_seen(self.worker, self.settings.lease_ttl_s)

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


@dataclass(frozen=True)
class LinesView:
    """Who delivers what (status, list, trace, GET /status): every line's lease, the
    workers holding one now, and (for status) every relay worker's heartbeat, the
    standby ones included."""

    leases: list[LineLease]
    relay_workers: list[RelayWorker] = field(default_factory=list)

    @property
    def held(self) -> list[LineLease]:
        return [lease for lease in self.leases if lease.held]

    @property
    def workers(self) -> list[str]:
        """Workers holding at least one unexpired lease (a standby worker holds none)."""
        return sorted({lease.owner for lease in self.held if lease.owner is not None})

    def of(self, line: str) -> LineLease | None:
        return next((lease for lease in self.leases if lease.line == line), None)

    def lines_of(self, worker: str) -> list[str]:
        """The lines whose unexpired lease `worker` holds, in line order."""
        return [lease.line for lease in self.held if lease.owner == worker]

    def to_dict(self) -> dict[str, Any]:
        return {
            "lines": [lease.to_dict() for lease in self.leases],
            "workers": self.workers,
            "relay_workers": [
                {**w.to_dict(), "lines": self.lines_of(w.worker)} for w in self.relay_workers
            ],
        }


async def lines_view(outbox: Outbox, workers_ttl_s: float | None = None) -> LinesView:
    """The leases; with `workers_ttl_s`, the relay workers too, live when seen within
    that many seconds (the workers' --lease-ttl)."""
    leases = await outbox.leases()
    if workers_ttl_s is None:
        return LinesView(leases)
    return LinesView(leases, await outbox.workers(workers_ttl_s))


def describe_worker(worker: RelayWorker, lines: Sequence[str], ttl_s: float) -> str:
    """One line for a person: whether a worker beats, since when, and what it holds."""
    up_s = worker.seen_ago_s + worker.seen_at - worker.started_at
    shown = ", ".join(lines[:LINES_SHOWN]) + (", ..." if len(lines) > LINES_SHOWN else "")
    holding = f"holds {len(lines)} line(s): {shown}" if lines else "holds no line"
    if worker.live:
        standby = "" if lines else " (standing by)"
        return f"live, up {up_s:.1f} s, seen {worker.seen_ago_s:.1f} s ago, {holding}{standby}"
    # Not stopped cleanly (that forgets the worker): killed, paused or cut off.
    return f"gone, not seen for {worker.seen_ago_s:.1f} s (ttl {ttl_s:g} s), {holding}"


def describe_lease(lease: LineLease | None) -> str:
    """One line for a person: who holds the line, under which epoch, for how long."""
    if lease is None:
        return "never leased"
    if lease.owner is None:
        return f"free (released), epoch {lease.epoch}"
    if lease.expires_in_s < 0:
        return (
            f"expired {-lease.expires_in_s:.1f} s ago, was {lease.owner}, epoch {lease.epoch}"
            " (any worker may take it over)"
        )
    return f"held by {lease.owner}, epoch {lease.epoch}, expires in {lease.expires_in_s:.1f} s"
