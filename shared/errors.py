"""Errors of the wire contract, shared by both sides: one root, `ContractError`."""

from __future__ import annotations


class ContractError(Exception):
    """The wire contract between publisher and sink was not followed."""


class InvalidEvent(ContractError, ValueError):
    """The event does not follow the contract."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class Conflict(ContractError):
    """The same ID was already recorded with a different payload."""

    def __init__(self, event_id: str) -> None:
        super().__init__(f"event {event_id!r} was already recorded with a different payload")
        self.event_id = event_id


class PredecessorMissing(ContractError):
    """The predecessor check failed: a pipelined request named a predecessor the sink
    has not applied, so nothing of the request was applied (the sink never applies
    events out of the sender's order)."""

    def __init__(self, after: str) -> None:
        super().__init__(f"event {after!r}, named as the one before, is not in the inbox")
        self.after = after


class StaleLease(ContractError):
    """A request's lease epoch is below one the sink has already seen for its source
    and line: a worker that lost the line (paused past its lease, cut off) sent it.
    Nothing of the request was applied (the sink's 409 names both epochs)."""

    def __init__(self, source: str, line: str, epoch: int, seen: int) -> None:
        super().__init__(
            f"lease epoch {epoch} of line {line!r} from {source!r} is stale:"
            f" epoch {seen} has been seen"
        )
        self.source = source
        self.line = line
        self.epoch = epoch
        self.seen = seen


class InvalidAck(ContractError, ValueError):
    """The reply is not an ACK for the event that was sent."""
