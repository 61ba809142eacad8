"""Throttled logging: a repeated key once per interval, with a count. A fake clock."""

from __future__ import annotations

import logging

import pytest
from support import ManualClock

from plumbing.logs import Throttled

LOGGER = logging.getLogger("tests.throttled")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER.name]


def test_the_first_occurrence_is_logged_at_once_with_its_traceback(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    throttled = Throttled(LOGGER, 10.0, clock=clock)
    try:
        raise OSError("disk I/O error")
    except OSError as exc:
        assert throttled.error("step", "step failed: %s", exc, exc_info=True)
    [line] = records(caplog)
    assert line.levelno == logging.ERROR
    assert line.getMessage() == "step failed: disk I/O error"
    assert line.exc_info and line.exc_info[0] is OSError


def test_repeats_within_the_interval_are_counted_and_the_next_line_says_how_many(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    throttled = Throttled(LOGGER, 10.0, clock=clock)
    for _ in range(363):
        try:
            raise OSError("database or disk is full")
        except OSError as exc:
            throttled.error("full", "step failed: %s", exc, exc_info=True)
        clock.now += 0.02  # 363 tries in 7.26 s
    assert len(records(caplog)) == 1
    assert throttled.suppressed("full") == 362
    clock.now = 1010.0
    assert throttled.error("full", "step failed: %s", "database or disk is full", exc_info=True)
    first, summary = records(caplog)
    assert first.exc_info and first.exc_info[0] is OSError
    assert summary.getMessage() == (
        "step failed: database or disk is full (repeated 362 times in the last 10 s)"
    )
    assert not summary.exc_info  # the traceback is not repeated
    assert summary.__dict__["repeated"] == 362
    assert throttled.suppressed("full") == 0  # a new interval starts


def test_the_interval_is_exact_and_a_quiet_key_is_logged_afresh_with_its_traceback(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    throttled = Throttled(LOGGER, 10.0, clock=clock)
    assert throttled.warning("k", "one")
    clock.now += 9.999
    assert not throttled.warning("k", "two")
    clock.now += 0.001
    assert throttled.warning("k", "three")  # 10 s after the line before: a summary
    clock.now += 30
    assert throttled.warning("k", "four", exc_info=True)  # nothing left out since
    lines = records(caplog)
    assert [r.getMessage() for r in lines] == [
        "one",
        "three (repeated 1 times in the last 10 s)",
        "four",
    ]
    assert [r.levelno for r in lines] == [logging.WARNING] * 3


def test_distinct_keys_are_throttled_apart(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    throttled = Throttled(LOGGER, 10.0, clock=clock)
    for _ in range(5):
        throttled.error("a", "a failed")
        throttled.error("b", "b failed")
    assert [r.getMessage() for r in records(caplog)] == ["a failed", "b failed"]
    assert (throttled.suppressed("a"), throttled.suppressed("b")) == (4, 4)


def test_memory_is_bounded_the_oldest_key_is_forgotten(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    throttled = Throttled(LOGGER, 10.0, max_keys=3, clock=clock)
    for n in range(1000):
        throttled.error(n, "error %d", n)
    assert throttled.remembered == 3
    assert len(records(caplog)) == 1000  # each a first occurrence
    caplog.clear()
    throttled.error(999, "error 999")  # remembered: counted
    throttled.error(0, "error 0")  # forgotten: logged as new
    assert [r.getMessage() for r in records(caplog)] == ["error 0"]


def test_extra_fields_reach_the_record_and_the_interval_is_a_setting(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    throttled = Throttled(LOGGER, 0.5, clock=clock)
    throttled.error("k", "x", extra={"event_id": "a"})
    throttled.error("k", "x", extra={"event_id": "a"})
    clock.now += 0.5
    throttled.error("k", "x", extra={"event_id": "a"})
    first, summary = records(caplog)
    assert first.__dict__["event_id"] == summary.__dict__["event_id"] == "a"
    assert summary.getMessage() == "x (repeated 1 times in the last 0.5 s)"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Throttled(LOGGER, -1.0)
    with pytest.raises(ValueError):
        Throttled(LOGGER, max_keys=0)


def test_resolved_writes_the_summary_now_and_a_new_occurrence_is_logged_at_once(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    throttled = Throttled(LOGGER, 10.0, clock=clock)
    throttled.error("k", "step failed: %s", "disk full", exc_info=True, extra={"lane": "x"})
    for _ in range(5):
        clock.now += 0.5
        throttled.error("k", "step failed: %s", "disk full", exc_info=True, extra={"lane": "x"})
    assert throttled.resolved("k")
    assert not throttled.resolved("k")  # nothing left to say
    assert not throttled.resolved("never seen")
    throttled.error("k", "step failed: %s", "disk full again")  # a new failure: at once
    first, summary, again = records(caplog)
    assert first.exc_info
    assert summary.getMessage() == "step failed: disk full (repeated 5 times in the last 2.5 s)"
    assert summary.levelno == logging.ERROR and not summary.exc_info
    assert summary.__dict__["lane"] == "x"
    assert again.getMessage() == "step failed: disk full again"


def test_resolved_after_a_single_occurrence_writes_nothing(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    throttled = Throttled(LOGGER, 10.0, clock=clock)
    throttled.warning("k", "once")
    assert not throttled.resolved("k")
    assert [r.getMessage() for r in records(caplog)] == ["once"]
