"""The head-failure policy's pure parts: the failure streak of a head."""

from __future__ import annotations

from publisher.errors import DeliveryError, Rejected
from publisher.head_policy import Streak

TRANSIENT = DeliveryError("503")
PERMANENT = Rejected("409", status=409)


def test_a_first_failure_starts_a_streak_of_one() -> None:
    assert Streak().after("a", TRANSIENT) == Streak("a", 1, 0)
    assert Streak().after("a", PERMANENT) == Streak("a", 1, 1)


def test_failures_of_the_same_head_add_up_and_permanent_ones_count_in_a_row() -> None:
    streak = Streak()
    for error in (PERMANENT, PERMANENT, TRANSIENT, PERMANENT):
        streak = streak.after("a", error)
    assert streak == Streak("a", 4, 1)  # the transient one broke the permanent run


def test_another_head_starts_counting_afresh() -> None:
    streak = Streak().after("a", PERMANENT).after("a", PERMANENT)
    assert streak.after("b", PERMANENT) == Streak("b", 1, 1)


def test_a_streak_is_a_value() -> None:
    before = Streak("a", 2, 2)
    before.after("a", PERMANENT)
    assert before == Streak("a", 2, 2)
