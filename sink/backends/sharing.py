"""What the inbox backends use to share one commit among concurrent requests: the
count of write requests in progress (plumbing.group_commit.Arrivals) and a call waiting
for a shared commit (the group commit itself is plumbing.group_commit)."""

from __future__ import annotations

from typing import NamedTuple

from plumbing.group_commit import Arrivals as Arrivals  # re-exported: the backends use it
from shared import Lease
from sink.store import Incoming


class Call(NamedTuple):
    """One receive_batch call waiting for a group commit."""

    items: list[Incoming]
    after: str | None  # the predecessor: the event the sender delivered before these
    lease: Lease | None = None  # the sender's line and epoch, checked before anything
