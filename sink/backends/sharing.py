"""What the inbox backends use to share one commit among concurrent requests: the
count of write requests in progress and a call waiting for a shared commit (the group
commit itself is plumbing.group_commit)."""

from __future__ import annotations

from types import TracebackType
from typing import NamedTuple

from shared import Event, Lease


class Arrivals:
    """How many write requests are in progress: `with arrivals:` counts one from
    entry to exit. Re-entrant, and cheap (it is entered on every write request)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> None:
        self.count += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.count -= 1


class Call(NamedTuple):
    """One receive_batch call waiting for a group commit."""

    events: list[Event]
    after: str | None  # the fence: the event the sender delivered before these
    lease: Lease | None = None  # the sender's line and epoch, checked before anything
