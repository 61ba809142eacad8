"""How long a connection may take and how many there may be: the limits both
services serve with, and the connection cap they come to under the descriptor limit."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Final

from aiohttp import web

BODY_TIMEOUT_S: Final = 10.0  # a body still arriving after this is refused with 408

# Descriptors kept free under the process limit for the database files, logs and
# pipes. Besides, twice the backlog: asyncio's loop accepts up to `backlog`
# connections per turn before any of them reaches the cap check (uvloop, as many as
# are waiting), and the idle connections closed to make room for them release their
# descriptors only a turn later. Out of descriptors all the same, asyncio's loop
# leaves new connections waiting in the backlog and retries a second later (logged
# by quiet_accept_errors); uvloop (libuv) accepts and closes each at once, and logs
# nothing. Either way the service serves again once descriptors are free.
RESERVED_FDS: Final = 64


@dataclass(frozen=True)
class HttpLimits:
    """How long a connection may take and how many there may be (see serve_app)."""

    idle_timeout_s: float = 30.0  # no request under way (idle, or its headers still coming)
    body_timeout_s: float = BODY_TIMEOUT_S
    max_connections: int = 1000  # lowered to fit the descriptor limit, see connection_cap
    backlog: int = 128


# Set by serve_app on the app it serves; read where a body is read.
LIMITS: Final = web.AppKey("http_limits", HttpLimits)


def connection_cap(limits: HttpLimits) -> int:
    """The connections a service keeps open at once: `max_connections`, lowered to
    fit the soft descriptor limit less twice the backlog and a reserve (704 under a
    limit of 1,024 with the default backlog of 128)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections
    room = soft - 2 * limits.backlog - RESERVED_FDS
    return max(1, min(limits.max_connections, room))
