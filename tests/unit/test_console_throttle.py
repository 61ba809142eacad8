"""The console's sign-in throttle, pure: free failures, then a wait that doubles to a
cap, per client; a success or a quiet spell forgets; an IPv6 client is its /64."""

from __future__ import annotations

import pytest
from support import ManualClock

from publisher.console.throttle import (
    CLIENTS_KEPT,
    FORGET_S,
    FREE_FAILURES,
    SignInThrottle,
    client_of,
)


def fail(throttle: SignInThrottle, client: str, times: int) -> None:
    for _ in range(times):
        throttle.failed(client)


def test_past_the_free_failures_each_wait_doubles_up_to_the_cap() -> None:
    clock = ManualClock()
    throttle = SignInThrottle(first_wait_s=1.0, max_wait_s=8.0, clock=clock)
    fail(throttle, "a", FREE_FAILURES)
    assert throttle.wait_s("a") == 0.0
    waits = []
    for _ in range(6):
        throttle.failed("a")
        waits.append(throttle.wait_s("a"))
        clock.now += waits[-1]
        assert throttle.wait_s("a") == 0.0
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_the_wait_is_per_client_and_a_success_forgets_it() -> None:
    throttle = SignInThrottle(clock=ManualClock())
    fail(throttle, "a", FREE_FAILURES + 1)
    assert throttle.wait_s("a") > 0 and throttle.wait_s("b") == 0.0
    throttle.succeeded("a")
    assert throttle.wait_s("a") == 0.0
    fail(throttle, "a", FREE_FAILURES)  # free again
    assert throttle.wait_s("a") == 0.0


def test_a_quiet_spell_forgets_the_failures() -> None:
    clock = ManualClock()
    throttle = SignInThrottle(clock=clock)
    fail(throttle, "a", FREE_FAILURES + 1)
    clock.now += FORGET_S
    throttle.failed("a")  # counted from one again: free
    assert throttle.wait_s("a") == 0.0


def test_years_of_failures_neither_overflow_nor_pass_the_cap() -> None:
    clock = ManualClock()
    throttle = SignInThrottle(first_wait_s=1.0, max_wait_s=60.0, clock=clock)
    fail(throttle, "a", 5000)
    assert throttle.wait_s("a") == 60.0


def test_the_clients_remembered_are_bounded_oldest_first() -> None:
    throttle = SignInThrottle(clock=ManualClock())
    fail(throttle, "first", FREE_FAILURES + 1)
    for n in range(CLIENTS_KEPT):
        throttle.failed(f"10.0.{n // 256}.{n % 256}")
    assert throttle.wait_s("first") == 0.0


@pytest.mark.parametrize(
    ("remote", "client"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("fe80::1%eth0", "fe80::/64"),
        (None, "local"),
        ("", "local"),
    ],
)
def test_a_client_is_its_address_or_its_ipv6_64(remote: str | None, client: str) -> None:
    assert client_of(remote) == client
