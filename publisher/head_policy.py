"""What a line does when its head fails: record the attempt, count the streak, say
the head is blocked, quarantine it when the opt-in policy says so, and back off.

Nothing behind a failing head moves, so the wait after a failure is long (the full
retry cap, 15 to 30 s by default, after a permanent one). An operator who takes the
head out of the line (quarantine) or puts an earlier entry back in it (redrive),
from any process, ends that wait: `moved` tells which blocked lines have a new head.
"""

from __future__ import annotations

import random
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

from plumbing.cli import utc_text
from plumbing.logs import Throttled
from plumbing.storage import StorageError
from publisher.delivery_log import RELAY_LOG
from publisher.errors import DeliveryError, InvalidTransition
from publisher.retry import Random, RetryPolicy, is_permanent, retry_delay_s, should_quarantine
from publisher.store import Outbox, Pending
from shared import Lease

AUTO_QUARANTINE_BY: Final = "relay (quarantine-after policy)"
K = TypeVar("K", str, str | None)


@dataclass(frozen=True)
class Blocked:
    """The head entry of a line is failing: nothing behind it in that line moves."""

    event_id: str
    reason: str
    since: float
    permanent: bool


@dataclass(frozen=True)
class Streak:
    """Consecutive failed attempts at one head, and how many of the last in a row
    were permanent (the sink refused the entry itself)."""

    head: str = ""
    failures: int = 0
    permanent: int = 0

    def after(self, event_id: str, error: BaseException) -> Streak:
        """The streak once `event_id` has failed with `error` once more."""
        same = self if self.head == event_id else Streak(event_id)
        permanent = same.permanent + 1 if is_permanent(error) else 0
        return Streak(event_id, same.failures + 1, permanent)


@dataclass
class HeadState:
    """What the policy keeps of one line's head between attempts."""

    streak: Streak = field(default_factory=Streak)
    blocked: Blocked | None = None
    failing: Hashable | None = None  # the log key of a failure not of the head's own


class HeadPolicy:
    """The head-failure policy of every line of a relay."""

    def __init__(
        self,
        outbox: Outbox,
        retry: RetryPolicy,
        rand: Random = random.random,
        *,
        log: Throttled | None = None,
    ) -> None:
        self._outbox = outbox
        self.retry = retry
        self._rand = rand
        # A broken database fails every step the same way, several times a second:
        # one line (and one traceback) per interval, with a count, not one per step.
        self.log = Throttled(RELAY_LOG) if log is None else log

    def succeeded(self, state: HeadState, lane: str | None, marked: int) -> None:
        """A step of the line ran without failing, and delivered `marked` entries: a
        failure before it is over (its log summary is written now), and once it has
        delivered something its head is no longer blocked."""
        if state.failing is not None:
            self.log.resolved(state.failing)
            state.failing = None
        if marked and state.blocked is not None:
            self.log.resolved(_blocked_key(lane, state.blocked.event_id, state.blocked.reason))
            state.blocked = None

    async def failed(
        self,
        state: HeadState,
        lane: str | None,
        entry: Pending | None,
        error: Exception,
        lease: Lease | None = None,
    ) -> float:
        """Record a failed run of the line and return how long it waits. With the
        line's `lease`, the record (and a quarantine) is fenced by it: LeaseLost."""
        if entry is None:
            # Not a delivery failure (the database, say): back off and read again. A
            # delivery or storage error says what is wrong in its message; anything
            # else is a bug, logged with its traceback.
            exc_info = not isinstance(error, DeliveryError | StorageError)
            state.failing = ("relay step failed", type(error), str(error))
            self.log.error(state.failing, "relay step failed: %s", error, exc_info=exc_info)
            return retry_delay_s(error, 1, self.retry, self._rand)
        event_id = entry.id
        await self._outbox.record_failure(event_id, str(error), lease)
        state.streak = state.streak.after(event_id, error)
        state.blocked = _blocked(state.blocked, event_id, error)
        fields = {"event_id": event_id, "lane": lane, "failures": state.streak.failures}
        self.log.warning(
            _blocked_key(lane, event_id, str(error)),
            "head blocked",
            extra={**fields, "since": utc_text(state.blocked.since), "reason": str(error)},
        )
        if should_quarantine(error, state.streak.permanent, self.retry):
            await self._quarantine(
                event_id, f"rejected {state.streak.permanent} times in a row: {error}", lease
            )
            state.blocked, state.streak = None, Streak()  # a redriven entry starts afresh
            return 0.0
        return retry_delay_s(error, state.streak.failures, self.retry, self._rand)

    async def _quarantine(self, event_id: str, reason: str, lease: Lease | None) -> None:
        try:
            await self._outbox.quarantine(event_id, reason, AUTO_QUARANTINE_BY, lease)
        except InvalidTransition as done:  # an operator got there first
            RELAY_LOG.info("head left the line already: %s", done, extra={"event_id": event_id})
        else:
            RELAY_LOG.warning(
                "quarantined the head", extra={"event_id": event_id, "reason": reason}
            )

    async def moved(self, blocked: Mapping[K, Blocked]) -> list[K]:
        """The lines among `blocked` whose head is no longer the entry that failed:
        it was quarantined, or an entry before it was redriven. Their wait is over."""
        if not blocked:
            return []
        heads = await self._outbox.head_ids(list(blocked))
        return [key for key, head in blocked.items() if heads.get(key) != head.event_id]


def _blocked_key(lane: str | None, event_id: str, reason: str) -> Hashable:
    """What makes two "head blocked" lines the same: the line, its head, the error."""
    return ("head blocked", lane, event_id, reason)


def _blocked(before: Blocked | None, event_id: str, error: BaseException) -> Blocked:
    """The head is blocked since its first failure in this streak of the same head."""
    since = before.since if before is not None and before.event_id == event_id else time.time()
    return Blocked(event_id, str(error), since, is_permanent(error))
