"""The status lines of relay workers (publisher.lines_view.describe_worker): pure."""

from __future__ import annotations

from publisher.lines_view import LINES_SHOWN, describe_worker
from publisher.store import RelayWorker


def worker(live: bool, seen_ago_s: float = 0.25) -> RelayWorker:
    return RelayWorker("w1", started_at=1000.0, seen_at=1060.0, seen_ago_s=seen_ago_s, live=live)


def test_a_live_worker_says_since_when_and_what_it_holds() -> None:
    assert describe_worker(worker(True), ["snack", "tea"], 10) == (
        "live, up 60.2 s, seen 0.2 s ago, holds 2 line(s): snack, tea"
    )


def test_a_live_worker_holding_nothing_is_standing_by() -> None:
    assert describe_worker(worker(True), [], 10).endswith("holds no line (standing by)")


def test_a_gone_worker_says_how_long_it_has_been_silent_against_which_ttl() -> None:
    assert describe_worker(worker(False, 42.0), [], 2.5) == (
        "gone, not seen for 42.0 s (ttl 2.5 s), holds no line"
    )


def test_a_worker_with_many_lines_names_the_first_few() -> None:
    lines = [f"sku-{n:02d}" for n in range(LINES_SHOWN + 3)]
    said = describe_worker(worker(True), lines, 10)
    assert f"holds {LINES_SHOWN + 3} line(s): sku-00, " in said
    assert said.endswith(f"sku-{LINES_SHOWN - 1:02d}, ...")
