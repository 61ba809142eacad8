"""How fast one client may guess the operator token: a few free failures, then a wait
that doubles with each further failure, up to a cap.

Without it one connection tried about 1,750 tokens a second. A client is its
address (an IPv6 client its /64, which one host is usually given whole); a success
forgets its failures, and so does a quiet spell of FORGET_S. The clients remembered
are bounded: past CLIENTS_KEPT the one that failed longest ago is forgotten first.
Pure: the clock is a parameter, nothing here does I/O.
"""

from __future__ import annotations

import collections
import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

FREE_FAILURES: Final = 5  # a mistyped token or two never makes an operator wait
FIRST_WAIT_S: Final = 1.0
MAX_WAIT_S: Final = 60.0  # past the free failures: about one guess a minute
FORGET_S: Final = 15 * 60.0
CLIENTS_KEPT: Final = 4096


@dataclass(frozen=True)
class _Failures:
    count: int
    last_at: float
    retry_at: float  # on the monotonic clock; no earlier try is looked at


def client_of(remote: str | None) -> str:
    """The throttle's name for a peer address: the address itself, an IPv6 address's
    /64, or "local" when there is none (a Unix socket)."""
    if not remote:
        return "local"
    try:
        address = ipaddress.ip_address(remote.split("%")[0])
    except ValueError:
        return remote
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class SignInThrottle:
    """The failed sign-ins of each client, and how long each must wait before its next."""

    def __init__(
        self,
        first_wait_s: float = FIRST_WAIT_S,
        max_wait_s: float = MAX_WAIT_S,
        free_failures: int = FREE_FAILURES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._first_wait_s = first_wait_s
        self._max_wait_s = max_wait_s
        self._free = free_failures
        self._clock = clock
        self._failures: collections.OrderedDict[str, _Failures] = collections.OrderedDict()

    def wait_s(self, client: str) -> float:
        """Seconds `client` must still wait before a sign-in is looked at (0: now)."""
        failures = self._current(client)
        return 0.0 if failures is None else max(0.0, failures.retry_at - self._clock())

    def failed(self, client: str) -> None:
        """Count a wrong token from `client`; past the free ones, it waits."""
        now = self._clock()
        failures = self._current(client)
        count = 1 if failures is None else failures.count + 1
        over = min(count - self._free, 32)  # 2**32 waits are past any cap: no overflow
        wait_s = 0.0 if over <= 0 else min(self._max_wait_s, self._first_wait_s * 2 ** (over - 1))
        self._failures.pop(client, None)
        self._failures[client] = _Failures(count, now, now + wait_s)
        while len(self._failures) > CLIENTS_KEPT:
            self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)

    def _current(self, client: str) -> _Failures | None:
        failures = self._failures.get(client)
        if failures is not None and self._clock() - failures.last_at >= FORGET_S:
            del self._failures[client]
            return None
        return failures
