"""Logging that does not explode when the same thing keeps failing.

A broken database or sink makes a retrying service fail the same way many times a
second; a line (and a traceback) per attempt buries everything else in the log and
costs more than the attempt. `Throttled` logs the first occurrence of a key at
once, with its traceback if asked, only counts the same key again within an
interval, and says how many were left out on the next line after the interval:

    relay step failed: disk I/O error (repeated 362 times in the last 10 s)

That line carries no traceback (the first one did). When the caller knows the
failure is over, `resolved(key)` writes the summary at once instead of with a next
occurrence that will not come. The logic is pure apart from the logger and a
clock, which tests replace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

# The services' HTTP side (listening, connections, error replies, the access log) logs
# under one name, whichever plumbing module writes the line: the name operators filter
# on, kept when that code was split into modules of their own.
HTTP_LOG: Final = logging.getLogger("plumbing.web")

REPEAT_INTERVAL_S: Final = 10.0  # the default interval in which a key is logged once
MAX_KEYS: Final = 1024  # distinct keys remembered; the oldest is forgotten beyond it

Clock = Callable[[], float]


class _Line(NamedTuple):
    """An occurrence left out: what a summary written without a next one says."""

    level: int
    msg: str
    args: tuple[object, ...]
    extra: Mapping[str, object] | None


@dataclass
class _Window:
    """One key's interval: when its last line was written, and what was left out since."""

    logged_at: float
    suppressed: int = 0
    last: _Line | None = None


class Throttled:
    """A logger that writes a repeated key once per interval, with a count.

    `key` names what is "the same failure": a message and the error's text, say. The
    first occurrence (or the first after a quiet interval) is logged as given; later
    ones within `interval_s` are counted only; the first after the interval is logged
    with " (repeated N times in the last T s)" and without a traceback, and starts a
    new interval. At most `max_keys` keys are remembered (the oldest interval goes
    first), so a stream of distinct errors cannot grow memory.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = REPEAT_INTERVAL_S,
        *,
        max_keys: int = MAX_KEYS,
        clock: Clock = time.monotonic,
    ) -> None:
        if not interval_s >= 0 or max_keys < 1:
            raise ValueError(
                f"need interval_s >= 0 and max_keys >= 1, got {interval_s}, {max_keys}"
            )
        self.logger = logger
        self.interval_s = interval_s
        self._max_keys = max_keys
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}  # insertion order: oldest interval first

    def log(
        self,
        level: int,
        key: Hashable,
        msg: str,
        *args: object,
        exc_info: bool | BaseException = False,
        extra: Mapping[str, object] | None = None,
    ) -> bool:
        """Log `msg % args` unless `key` was logged less than `interval_s` ago.

        Returns whether a line was written. `exc_info` (True: the exception being
        handled; or an exception) applies to a first occurrence only: the summary
        after an interval never repeats the traceback.
        """
        now = self._clock()
        window = self._windows.get(key)
        if window is not None and now - window.logged_at < self.interval_s:
            window.suppressed += 1
            window.last = _Line(level, msg, args, extra)
            return False
        self._remember(key, now)
        if window is not None and window.suppressed:
            self._summary(_Line(level, msg, args, extra), window, now)
        else:
            self.logger.log(level, msg, *args, exc_info=exc_info, extra=extra)
        return True

    def resolved(self, key: Hashable) -> bool:
        """The failure `key` names is over (the step it failed has succeeded): write
        the summary of the occurrences left out since its last line now, if any, and
        forget it, so that a new occurrence is logged at once. Returns whether a line
        was written."""
        window = self._windows.pop(key, None)
        if window is None or window.last is None or not window.suppressed:
            return False
        self._summary(window.last, window, self._clock())
        return True

    def _summary(self, line: _Line, window: _Window, now: float) -> None:
        fields: dict[str, Any] = {**(line.extra or {}), "repeated": window.suppressed}
        since = _seconds(now - window.logged_at)
        msg = f"{line.msg} (repeated {window.suppressed} times in the last {since})"
        self.logger.log(line.level, msg, *line.args, extra=fields)

    def error(
        self,
        key: Hashable,
        msg: str,
        *args: object,
        exc_info: bool = False,
        extra: Mapping[str, object] | None = None,
    ) -> bool:
        return self.log(logging.ERROR, key, msg, *args, exc_info=exc_info, extra=extra)

    def warning(
        self,
        key: Hashable,
        msg: str,
        *args: object,
        exc_info: bool = False,
        extra: Mapping[str, object] | None = None,
    ) -> bool:
        return self.log(logging.WARNING, key, msg, *args, exc_info=exc_info, extra=extra)

    def suppressed(self, key: Hashable) -> int:
        """How many occurrences of `key` were left out since its last line."""
        window = self._windows.get(key)
        return 0 if window is None else window.suppressed

    @property
    def remembered(self) -> int:
        """How many keys are remembered now (at most `max_keys`)."""
        return len(self._windows)

    def _remember(self, key: Hashable, now: float) -> None:
        self._windows.pop(key, None)  # re-inserted last: its interval is now the newest
        while len(self._windows) >= self._max_keys:
            del self._windows[next(iter(self._windows))]
        self._windows[key] = _Window(now)


def _seconds(elapsed_s: float) -> str:
    return f"{elapsed_s:.0f} s" if elapsed_s >= 10 else f"{elapsed_s:.1f} s"


__all__ = ["HTTP_LOG", "MAX_KEYS", "REPEAT_INTERVAL_S", "Throttled"]
