"""How a relay delivers: `RelaySettings`, the one settings type of the delivery path.

`publisher serve` builds it from its options, the library's `dispatch` from its
arguments, and it is passed down as it is: the relay, the lanes supervisor, the line
runner and the delivery driver each read the fields they need from the same object,
the head-failure policy gets its `retry` part and the lease keeper its `worker` part.
It is checked once, here, when it is made.

`WorkerSettings` (who this worker is, how long its leases last) is the part a
one-shot `publisher dispatch` needs on its own; the defaults are those of
`publisher serve`.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from plumbing.logs import REPEAT_INTERVAL_S
from plumbing.storage import parse_location
from publisher.retry import RetryPolicy
from publisher.store import check_limit
from shared import MAX_BATCH

POLL_INTERVAL_S: Final = 1.0
DEFAULT_DEPTH: Final = 8  # requests in flight per line, once the sink checks predecessors
MAX_DEPTH: Final = 16
MAX_LANES: Final = 8

DEFAULT_LEASE_TTL_S: Final = 10.0
MIN_LEASE_TTL_S: Final = 0.1  # below this a renewal could not keep up with its ttl
MAX_LEASE_TTL_S: Final = 3600.0  # a killed worker's lines would wait longer than this
RENEWALS_PER_TTL: Final = 3
MARGIN_SHARE: Final = 0.2  # of the ttl: the worker's view ends this much before the outbox's
_WORKER_ID: Final = re.compile(r"[A-Za-z0-9._:@-]{1,128}")

Ordering = Literal["global", "key", "sku"]  # "sku": the name "key" had for orders


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
    """Who this worker is and how long its leases last.

    `worker_id` None: not given, so the default one. The intake service names it
    from its database (`worker_id_for`); a relay made on its own is HOST:PID.
    """

    worker_id: str | None = None
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S

    def __post_init__(self) -> None:
        if self.worker_id is not None:
            check_worker_id(self.worker_id)
        check_lease_ttl(self.lease_ttl_s)

    @property
    def name(self) -> str:
        """The worker ID to hold leases under."""
        return default_worker_id() if self.worker_id is None else self.worker_id

    @property
    def renew_interval_s(self) -> float:
        return self.lease_ttl_s / RENEWALS_PER_TTL

    @property
    def good_for_s(self) -> float:
        """How long after a renewal starts the worker trusts the lease."""
        return self.lease_ttl_s * (1 - MARGIN_SHARE)


@dataclass(frozen=True)
class RelaySettings:
    """How a relay delivers; the defaults are those of `publisher serve`.

    `limit`: entries per read, and per request with `batch` (1 to 16). `batch`: one
    request (POST /events/batch) carries up to `limit` entries; otherwise one entry
    per request (POST /events). `pipeline`: requests in flight per line (1 to 16);
    above 1 each names the one before for the sink's predecessor check, and more
    than one is in flight only once the sink's replies say it enforces that check.
    `ordering`: one line for every entry (global), or one lane per event key with up
    to `max_lanes` in flight ("key"; events without a key share the lane "*"; "sku"
    is taken as "key"). `poll_interval_s`: how often to look for entries written
    by other processes (at once instead where the outbox signals intake:
    PostgreSQL's NOTIFY), and for a blocked head that an operator took out of the
    line. `retry`: the waits after a failure, and the opt-in quarantine after N
    permanent failures. `log_repeat_interval_s`: a failure that repeats (a broken
    database, a sink that keeps failing) is logged once per this interval, with a
    count. `worker`: this worker's ID and lease ttl; None delivers without leases,
    only for an outbox that this relay is known to deliver alone.
    """

    limit: int = MAX_BATCH
    batch: bool = True
    pipeline: int = DEFAULT_DEPTH
    ordering: Ordering = "global"
    max_lanes: int = MAX_LANES
    poll_interval_s: float = POLL_INTERVAL_S
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    log_repeat_interval_s: float = REPEAT_INTERVAL_S
    worker: WorkerSettings | None = field(default_factory=WorkerSettings)

    def __post_init__(self) -> None:
        check_limit(self.limit)
        if self.ordering == "sku":
            object.__setattr__(self, "ordering", "key")
        if self.ordering not in ("global", "key") or self.max_lanes < 1:
            raise ValueError(f"bad ordering {self.ordering!r} or max_lanes {self.max_lanes}")
        if not 1 <= self.pipeline <= MAX_DEPTH:
            raise ValueError(f"pipeline depth {self.pipeline} is not between 1 and {MAX_DEPTH}")
        if not self.poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be above 0, got {self.poll_interval_s}")
        if not self.log_repeat_interval_s >= 0:
            raise ValueError(
                f"log_repeat_interval_s must be 0 or more, got {self.log_repeat_interval_s}"
            )

    @property
    def per_request(self) -> int:
        """Entries in one request: up to `limit` with `batch`, else one."""
        return self.limit if self.batch else 1


def for_location(settings: RelaySettings, location: str) -> RelaySettings:
    """`settings` with the worker ID, if not given, that a relay on the outbox at
    `location` takes by default (`worker_id_for`)."""
    worker = settings.worker
    if worker is None or worker.worker_id is not None:
        return settings
    return replace(settings, worker=replace(worker, worker_id=worker_id_for(location, None)))
