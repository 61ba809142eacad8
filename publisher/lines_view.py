"""Who delivers what, as operators see it: every line's lease and every relay
worker's heartbeat (`publisher status`, `list`, `trace`, the console, GET /status),
and the sentences that describe them to a person."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from publisher.store import LineLease, Outbox, RelayWorker

LINES_SHOWN: Final = 8  # of a worker's lines, named in its status line


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
