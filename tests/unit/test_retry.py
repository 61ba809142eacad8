"""Retry waits and the quarantine policy: pure functions, checked without a clock."""

from __future__ import annotations

import math
import random

import pytest

from publisher.errors import DeliveryError, NotAcknowledged, Rejected, TargetNotAllowed
from publisher.retry import (
    RetryPolicy,
    exponential_backoff_s,
    is_permanent,
    retry_delay_s,
    should_quarantine,
)

BASE_S = 0.5
CAP_S = 30.0
POLICY = RetryPolicy(base_s=BASE_S, cap_s=CAP_S)
# The largest value random.random() can return: [0, 1) never reaches 1.0 itself.
ALMOST_ONE = math.nextafter(1.0, 0.0)

TRANSIENT: list[BaseException] = [
    DeliveryError("order-1: ClientConnectorError: connection refused"),
    DeliveryError("order-1: no reply in time (TimeoutError)"),
    NotAcknowledged("order-1: sink answered 503", status=503),
    NotAcknowledged("order-1: ACK digest does not match", status=200),
    ConnectionError("database thread gone"),
]
PERMANENT: list[BaseException] = [
    Rejected("order-1: sink rejected it with 400", status=400),
    Rejected("order-1: sink rejected it with 409", status=409),
    Rejected("order-1: sink rejected it with 413", status=413),
    Rejected("order-1: sink rejected it with 422", status=422),
    TargetNotAllowed("host 'example.org' is not loopback"),
]


def zero() -> float:
    return 0.0


def one() -> float:
    return 1.0


def ceiling(failures: int, base_s: float = BASE_S, cap_s: float = CAP_S) -> float:
    return min(cap_s, base_s * 2 ** (failures - 1))


# ---------------------------------------------------------------- exponential backoff


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (6, 16.0), (7, 30.0), (8, 30.0), (60, 30.0)],
)
def test_upper_bound_doubles_per_failure_until_the_cap(failures: int, expected: float) -> None:
    assert exponential_backoff_s(failures, BASE_S, CAP_S, one) == pytest.approx(expected)


@pytest.mark.parametrize("failures", [1, 2, 5, 10, 100])
def test_full_jitter_starts_at_zero(failures: int) -> None:
    assert exponential_backoff_s(failures, BASE_S, CAP_S, zero) == 0.0


def test_random_half_gives_half_the_ceiling() -> None:
    assert exponential_backoff_s(3, BASE_S, CAP_S, lambda: 0.5) == pytest.approx(1.0)


@pytest.mark.parametrize("failures", [63, 64, 1_000, 10**6])
def test_huge_failure_counts_stay_at_the_cap_without_overflow(failures: int) -> None:
    wait = exponential_backoff_s(failures, BASE_S, CAP_S, one)
    assert wait == CAP_S
    assert math.isfinite(wait)


@pytest.mark.parametrize("failures", [0, -1, -100])
def test_failures_below_one_are_refused(failures: int) -> None:
    with pytest.raises(ValueError, match="failures"):
        exponential_backoff_s(failures, BASE_S, CAP_S, one)


@pytest.mark.parametrize("failures", [1, 2, 4, 7, 20])
def test_jittered_waits_spread_over_the_whole_range(failures: int) -> None:
    rng = random.Random(failures)
    top = ceiling(failures)
    waits = [exponential_backoff_s(failures, BASE_S, CAP_S, rng.random) for _ in range(2_000)]

    assert all(0.0 <= wait <= top for wait in waits)
    # Full jitter: the waits cover [0, ceiling], not only a band near the ceiling.
    assert min(waits) < 0.05 * top
    assert max(waits) > 0.95 * top
    assert 0.4 * top < sum(waits) / len(waits) < 0.6 * top


def test_default_random_source_stays_in_bounds() -> None:
    for failures in range(1, 12):
        for _ in range(50):
            assert 0.0 <= exponential_backoff_s(failures, 0.1, 2.0) <= ceiling(failures, 0.1, 2.0)


def test_a_small_cap_caps_from_the_first_failure() -> None:
    assert exponential_backoff_s(1, 0.5, 0.5, one) == 0.5
    assert exponential_backoff_s(5, 0.05, 0.5, one) == 0.5
    assert exponential_backoff_s(4, 0.05, 0.5, one) == pytest.approx(0.4)


# ---------------------------------------------------------------- permanent or not


@pytest.mark.parametrize("error", PERMANENT, ids=repr)
def test_rejections_and_refused_targets_are_permanent(error: BaseException) -> None:
    assert is_permanent(error) is True


@pytest.mark.parametrize("error", TRANSIENT, ids=repr)
def test_connection_timeouts_5xx_and_bad_acks_are_transient(error: BaseException) -> None:
    assert is_permanent(error) is False


# ---------------------------------------------------------------- retry delay


@pytest.mark.parametrize("error", TRANSIENT, ids=repr)
@pytest.mark.parametrize("failures", [1, 3, 9])
def test_transient_failures_back_off_exponentially(error: BaseException, failures: int) -> None:
    assert retry_delay_s(error, failures, POLICY, zero) == 0.0
    assert retry_delay_s(error, failures, POLICY, one) == pytest.approx(ceiling(failures))


@pytest.mark.parametrize("error", PERMANENT, ids=repr)
@pytest.mark.parametrize("failures", [1, 2, 50])
def test_permanent_failures_wait_near_the_cap_from_the_first_one(
    error: BaseException, failures: int
) -> None:
    # Jittered in the upper half of the cap: never a hot loop, even at failure 1.
    assert retry_delay_s(error, failures, POLICY, zero) == pytest.approx(CAP_S / 2)
    assert retry_delay_s(error, failures, POLICY, one) == pytest.approx(CAP_S)
    assert CAP_S / 2 <= retry_delay_s(error, failures, POLICY, lambda: ALMOST_ONE) <= CAP_S


def test_permanent_waits_spread_over_the_upper_half_of_the_cap() -> None:
    rng = random.Random(7)
    error = Rejected("order-1: 409", status=409)
    waits = [retry_delay_s(error, 1, POLICY, rng.random) for _ in range(2_000)]
    assert all(CAP_S / 2 <= wait <= CAP_S for wait in waits)
    assert min(waits) < 0.55 * CAP_S
    assert max(waits) > 0.95 * CAP_S


def test_a_permanent_wait_is_never_shorter_than_a_transient_first_wait() -> None:
    policy = RetryPolicy(base_s=0.05, cap_s=0.5)
    permanent = retry_delay_s(Rejected("409", status=409), 1, policy, zero)
    transient = retry_delay_s(DeliveryError("refused"), 1, policy, one)
    assert permanent == pytest.approx(0.25)
    assert transient == pytest.approx(0.05)
    assert permanent > transient


# ---------------------------------------------------------------- quarantine policy


def test_without_quarantine_after_nothing_is_quarantined() -> None:
    rejected = Rejected("409", status=409)
    assert RetryPolicy().quarantine_after is None
    assert not any(should_quarantine(rejected, streak, POLICY) for streak in range(1, 1_000))


def test_quarantine_after_n_consecutive_permanent_failures() -> None:
    policy = RetryPolicy(base_s=0.05, cap_s=0.5, quarantine_after=3)
    rejected = Rejected("409", status=409)
    assert [should_quarantine(rejected, streak, policy) for streak in range(5)] == [
        False,
        False,
        False,
        True,
        True,
    ]


@pytest.mark.parametrize("error", TRANSIENT, ids=repr)
def test_transient_failures_never_quarantine(error: BaseException) -> None:
    policy = RetryPolicy(base_s=0.05, cap_s=0.5, quarantine_after=1)
    assert not any(should_quarantine(error, streak, policy) for streak in range(0, 100))


def test_quarantine_after_one_quarantines_on_the_first_rejection() -> None:
    policy = RetryPolicy(quarantine_after=1)
    assert should_quarantine(Rejected("400", status=400), 1, policy) is True
    assert should_quarantine(Rejected("400", status=400), 0, policy) is False


# ---------------------------------------------------------------- policy validation


def test_defaults() -> None:
    policy = RetryPolicy()
    assert (policy.base_s, policy.cap_s, policy.quarantine_after) == (0.5, 30.0, None)


@pytest.mark.parametrize(
    ("base_s", "cap_s"),
    [(0.0, 1.0), (-0.1, 1.0), (2.0, 1.0), (1.0, 0.0), (math.nan, 1.0), (0.5, math.nan)],
)
def test_base_must_be_positive_and_at_most_the_cap(base_s: float, cap_s: float) -> None:
    with pytest.raises(ValueError, match="base_s"):
        RetryPolicy(base_s=base_s, cap_s=cap_s)


def test_base_equal_to_cap_is_allowed() -> None:
    assert RetryPolicy(base_s=1.0, cap_s=1.0).cap_s == 1.0


@pytest.mark.parametrize("quarantine_after", [0, -1, -10])
def test_quarantine_after_must_be_at_least_one(quarantine_after: int) -> None:
    with pytest.raises(ValueError, match="quarantine_after"):
        RetryPolicy(quarantine_after=quarantine_after)


def test_policy_is_immutable() -> None:
    policy = RetryPolicy()
    with pytest.raises(AttributeError):
        policy.cap_s = 1.0  # type: ignore[misc]
