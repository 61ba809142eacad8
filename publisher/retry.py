"""When to try the head entry again. Pure functions: no clock, no I/O."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from publisher.errors import DeliveryError

Random = Callable[[], float]


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff settings for a failing head entry.

    `quarantine_after`: move the head to quarantine after this many consecutive
    permanent failures (the sink rejected the entry itself). None: never automatically.
    """

    base_s: float = 0.5
    cap_s: float = 30.0
    quarantine_after: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {self.base_s} and {self.cap_s}")
        if self.quarantine_after is not None and self.quarantine_after < 1:
            raise ValueError(f"quarantine_after must be at least 1, got {self.quarantine_after}")


def exponential_backoff_s(
    failures: int, base_s: float, cap_s: float, rand: Random = random.random
) -> float:
    """Full jitter: a uniform wait in [0, min(cap, base * 2^(failures-1))]."""
    if failures < 1:
        raise ValueError(f"failures must be at least 1, got {failures}")
    ceiling = min(cap_s, base_s * 2.0 ** min(failures - 1, 62))
    return ceiling * rand()


def is_permanent(error: BaseException) -> bool:
    """True when resending the entry unchanged cannot succeed (400, 409, 413, 422)."""
    return isinstance(error, DeliveryError) and not error.retryable


def retry_delay_s(
    error: BaseException, failures: int, policy: RetryPolicy, rand: Random = random.random
) -> float:
    """How long to wait before the next attempt at the same head entry.

    A permanent failure waits the full cap, jittered in its upper half: never a hot
    loop, and an operator has time to quarantine or fix. Anything else backs off
    exponentially with full jitter.
    """
    if is_permanent(error):
        return policy.cap_s * (0.5 + rand() / 2)
    return exponential_backoff_s(failures, policy.base_s, policy.cap_s, rand)


def should_quarantine(error: BaseException, permanent_streak: int, policy: RetryPolicy) -> bool:
    """The opt-in policy: quarantine after N consecutive permanent failures."""
    limit = policy.quarantine_after
    return limit is not None and is_permanent(error) and permanent_streak >= limit
