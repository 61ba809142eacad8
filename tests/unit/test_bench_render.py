"""The benchmark's target table: a missed ratio says when its goal is out of reach."""

from __future__ import annotations

from bench.report import render
from bench.targets import Target

MACHINE = {
    "cpus_usable": 2,
    "python": "3",
    "sqlite": "3",
    "load_average_start": [0.0],
    "load_average_end": [0.0],
}


def row(target: Target) -> str:
    report = {"mode": "quick", "duration_s": 1.0, "machine": MACHINE, "cases": {}}
    [line] = [line for line in render(report, [target]).splitlines() if line.startswith("g")]
    return line


def ratio(measured: float, reach: float | None) -> Target:
    return Target("goal", "detail", measured, 0.35, ">=", "x", ("e2e_single",), reach=reach)


def test_a_miss_under_a_reach_below_the_goal_says_it_is_out_of_reach() -> None:
    assert row(ratio(0.18, 0.25)).endswith(
        "missed: out of reach, its CPU per event allows 0.25x here"
    )


def test_a_miss_within_reach_and_a_target_met_say_no_more() -> None:
    assert row(ratio(0.21, 0.52)).endswith("  missed")
    assert row(ratio(0.37, 0.25)).endswith("  met")  # a noisy reach does not undo a result
    assert row(ratio(0.18, None)).endswith("  missed")
